"""Save-time checks: every saved model or adapter folder must reload and reproduce the model.

After each save (a Trainer checkpoint, the final ``model/``, the LoRA ``adapter/``) the folder
is checked before the run goes on:

1. every ``*.safetensors`` file in it holds only non-empty tensors (a ZeRO-3 run that saves its
   partitioned parameters writes tensors of shape ``[0]``);
2. it loads with ``from_pretrained`` (adapter folders: ``peft.PeftModel.from_pretrained`` on a
   freshly loaded base) with no missing, unexpected or mismatched weights (a partial save would
   otherwise be filled with random weights and only noticed at export or eval);
3. every weight of the reloaded model equals the in-memory model's BIT FOR BIT (the in-memory
   tensor cast to the saved dtype; adapters: the trainable adapter weights; under ZeRO-3 each
   parameter is gathered in turn on every rank), so an empty, partial or wrong tensor always
   fails, whatever the dtype (:func:`compare_weights`);
4. the reloaded model's logits on two fixed short prompts (:data:`PROMPTS`) match the in-memory
   model's, both computed on the SAME device, with the same attention kernel and the same
   autocast, within :func:`logit_tolerance` of the compute dtype. This catches what the weights
   alone do not (a config that does not reload as trained) and never fails on a mere change of
   floating-point order (a LoRA adapter merged into its base, bf16 kernels).

A failure raises :class:`~ratune.errors.RatuneError` naming the folder and the tensor or prompt.
When the check itself cannot run (for example a forward pass that fails on this device), the
error says so and that the save was not judged: a check's own failure never reads as a corrupt
save.

Distributed runs: the in-memory logits and the weight comparison are computed on EVERY rank
(under ZeRO-3 the forward pass and the parameter gathering are collective); only rank 0 reloads
and compares; its verdict is then broadcast, so every rank raises the same error and no rank
waits forever at the next collective.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

from ratune.errors import RatuneError

#: Two fixed short prompts (a few tokens each): the check costs two forward passes per model.
PROMPTS = ("Load a pretrained image classifier", "api_call: torch.hub.load(")


def logit_tolerance(dtype, reference: list) -> float:
    """Absolute logit tolerance for a comparison computed in ``dtype`` (a torch dtype).

    ``sqrt(eps(dtype)) x max(1, max |reference|)``: the two sides must agree to half the
    mantissa bits of the compute dtype, relative to the largest logit. float32 (eps 1.2e-7) at
    logits of size 30 gives 0.010; bfloat16 (eps 7.8e-3) 2.65; float16 (eps 9.8e-4) 0.94. A
    change of floating-point order (a merged LoRA adapter: about 3e-6 relative in float32;
    bf16 kernels: about 4e-3 relative) stays far below it; a wrong weight is caught bit for bit
    by :func:`compare_weights` before logits are compared.

    Args:
        dtype: the lowest precision the forward passes ran in (weights or autocast).
        reference: the in-memory logits (:func:`prompt_logits`).
    """
    import math

    import torch

    scale = max([1.0] + [float(r.abs().max()) for r in reference if r.numel()])
    return math.sqrt(torch.finfo(dtype).eps) * scale


def compute_dtype(*dtypes):
    """The lowest precision among ``dtypes`` (torch floating dtypes; None entries are skipped)."""
    import torch

    return max((d for d in dtypes if d is not None), key=lambda d: torch.finfo(d).eps)


def weights_dtype_of(model):
    """The dtype of ``model``'s first floating-point parameter."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1


def model_device(model):
    """The device of ``model``'s first parameter."""
    return next(model.parameters()).device


def prompt_logits(model, tokenizer, device=None, prompts=PROMPTS, autocast_dtype=None) -> list:
    """Logits of ``model`` on each prompt, in float32 on the CPU.

    The model is put in eval mode (no dropout) for the forward passes and given back in the mode
    it was in. Under DeepSpeed ZeRO-3 all ranks must call this together.

    Args:
        model: a causal LM (or a peft model) taking ``input_ids``.
        tokenizer: turns each prompt into ids (no special tokens added).
        device: where the inputs go; default: the device of the model's first parameter.
        prompts: the texts.
        autocast_dtype: run the forward passes under ``torch.autocast`` in this dtype (the run's
            mixed precision: accelerate wraps the trained model's forward in it, so the reloaded
            model must run under it too); None: autocast off.
    Returns:
        One tensor per prompt, shape ``[n_tokens, vocab_size]``, float32, on the CPU.
    """
    import torch

    device = torch.device(device) if device is not None else model_device(model)
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=autocast_dtype or torch.bfloat16,
                                             enabled=autocast_dtype is not None):
            for text in prompts:
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
                out.append(model(input_ids=ids).logits[0].detach().float().cpu())
    finally:
        model.train(was_training)
    return out


def check_tensors_non_empty(folder: str | os.PathLike) -> int:
    """Check that ``folder`` holds at least one ``*.safetensors`` file and no empty tensor.

    Returns:
        The number of tensors checked.
    Raises:
        RatuneError: no safetensors file, or a tensor with zero elements (named with its file).
    """
    from safetensors import safe_open

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise RatuneError(f"{folder}: saved folder holds no *.safetensors file")
    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                shape = fh.get_slice(name).get_shape()
                if 0 in shape or (len(shape) and _prod(shape) == 0):
                    raise RatuneError(f"{folder}: tensor {name!r} in {f.name} is empty (shape {list(shape)}); "
                                      "a ZeRO-3 save without gathered weights? (stage3_gather_16bit_weights_on_model_save)")
                n += 1
    return n


def _prod(shape) -> int:
    p = 1
    for s in shape:
        p *= int(s)
    return p


@contextlib.contextmanager
def plain_loading():
    """Load models on this process alone, even inside a DeepSpeed ZeRO-3 run.

    The HF Trainer registers its ZeRO-3 config globally, and ``from_pretrained`` then builds
    every model under ``deepspeed.zero.Init``, partitioning it with collectives that the other
    ranks never join (a deadlock or a gloo size mismatch). The registration is lifted for the
    duration of the block and restored after it.
    """
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # pragma: no cover - transformers always has it
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


def load_saved(folder: str | os.PathLike, *, adapter: bool, load_base: Callable[[], object] | None, dtype=None,
               attn_implementation: str | None = None):
    """Reload a saved folder the way a user would.

    Args:
        folder: a model folder (``config.json`` + safetensors) or, with ``adapter=True``, a peft
            adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).
        adapter: whether ``folder`` is an adapter.
        load_base: returns a fresh base model (adapters only).
        dtype: torch dtype to load a full model in (default float32).
        attn_implementation: attention kernel of the reloaded full model (None: transformers'
            default); adapters take the base's from ``load_base``.
    Returns:
        The model in eval mode, on the CPU (a 4-bit base: on its GPU).
    Raises:
        RatuneError: the folder does not load, or loads with missing, unexpected or mismatched
            weights (named).
    """
    import torch

    folder = Path(folder)
    try:
        with plain_loading():
            return _load(folder, adapter=adapter, load_base=load_base, dtype=dtype or torch.float32,
                         attn_implementation=attn_implementation).eval()
    except RatuneError:
        raise
    except Exception as exc:  # noqa: BLE001 - any load failure is a bad save, reported with its folder
        raise RatuneError(f"{folder}: saved folder does not reload ({type(exc).__name__}: {exc})") from exc


def _load(folder: Path, *, adapter: bool, load_base, dtype, attn_implementation):
    if adapter:
        from peft import PeftModel

        try:
            base = load_base()
        except Exception as exc:  # noqa: BLE001 - the fresh base is not part of the save
            raise _check_could_not_run(folder, "load a fresh base model for the adapter", exc) from exc
        return PeftModel.from_pretrained(base, str(folder), is_trainable=False)
    from transformers import AutoModelForCausalLM

    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model, info = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, use_safetensors=True,
                                                       output_loading_info=True, **extra)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        bad = sorted(str(k) for k in info.get(kind) or [])
        if bad:
            raise RatuneError(f"{folder}: reload with from_pretrained reports {kind.replace('_', ' ')}: "
                              f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} (partial save?)")
    return model


def attn_implementation_of(model) -> str | None:
    """The attention kernel ``model`` (or a peft model's base) runs with, as from_pretrained names it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(base, "config", None), "_attn_implementation", None)


def saved_weights(model, *, adapter: bool):
    """``(name, parameter)`` of what a save of ``model`` holds: every parameter of a full model,
    the trainable ones of a peft model (the adapter; the base is not saved), in module order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad or not adapter]


def compare_weights(folder, reloaded, expected, *, adapter: bool) -> tuple[int, str | None]:
    """Compare the reloaded model's weights with the in-memory model's, bit for bit.

    Every rank calls it with the same ``expected`` model (under ZeRO-3 each parameter is gathered
    in turn, a collective); only the rank holding ``reloaded`` (rank 0; None elsewhere) compares.
    The in-memory tensor is cast to the saved tensor's dtype first (a bf16 save of float32
    weights must equal their rounding; a float32 reload of a bf16 save is exact).

    Returns:
        ``(tensors compared, first error or None)``; no exception inside the loop, so every rank
        finishes its collectives.
    """
    import torch

    own = dict(reloaded.named_parameters()) if reloaded is not None else {}
    n, error = 0, None
    for name, param in saved_weights(expected, adapter=adapter):
        with _gathered(param):
            if reloaded is None or error is not None:
                continue
            got = own.get(name)
            if got is None:
                error = f"{folder}: weight {name!r} of the trained model is not in the reloaded one (partial save?)"
                continue
            want = param.detach()
            if tuple(want.shape) != tuple(got.shape):
                error = (f"{folder}: weight {name!r} has shape {list(got.shape)} after reload, "
                         f"{list(want.shape)} in memory")
            elif not torch.equal(want.to(device=got.device, dtype=got.dtype), got.detach()):
                diff = float((want.to(device=got.device, dtype=torch.float32) - got.detach().float()).abs().max())
                error = (f"{folder}: weight {name!r} differs from the in-memory model's (max abs difference "
                         f"{diff:.3g}; a corrupt or partial save)")
            n += 1
    return n, error


@contextlib.contextmanager
def _gathered(param):
    """Gather one ZeRO-3 partitioned parameter on every rank for the block (a no-op for others)."""
    if hasattr(param, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            yield
    else:
        yield


def compare_logits(folder, reference: list, reloaded: list, atol: float, prompts=PROMPTS) -> float:
    """Compare two lists of prompt logits.

    Returns:
        The largest absolute difference.
    Raises:
        RatuneError: a shape differs, a value is not finite, or a difference exceeds ``atol``
            (naming the folder, the prompt and the difference).
    """
    import torch

    worst = 0.0
    for text, ref, got in zip(prompts, reference, reloaded):
        if ref.shape != got.shape:
            raise RatuneError(f"{folder}: logits on {text!r} have shape {list(got.shape)} after reload, "
                              f"{list(ref.shape)} in memory")
        if not torch.isfinite(got).all():
            raise RatuneError(f"{folder}: reloaded model gives non-finite logits on {text!r}")
        diff = float((ref - got).abs().max())
        worst = max(worst, diff)
        if not diff <= atol:
            raise RatuneError(f"{folder}: reloaded model's logits on {text!r} differ from the in-memory model's "
                              f"by {diff:.3g} > tolerance {atol:.3g} (same device and kernels; a save that does "
                              "not reload as trained)")
    return worst


def _check_could_not_run(folder, what: str, exc: Exception) -> RatuneError:
    return RatuneError(f"{folder}: the save check could not {what} ({type(exc).__name__}: {exc}); the save itself "
                       "was not judged (fix the cause, or set verify_saves: false to skip the check)")


def verify_saved(folder: str | os.PathLike, model, tokenizer, *, adapter: bool,
                 load_base: Callable[[], object] | None = None, dtype=None, device=None, autocast_dtype=None,
                 reference: list | None = None, expected=None, expected_on_rank0_only: bool = False) -> dict | None:
    """The save-time check of one folder (the module docstring's four steps); every rank calls it.

    Args:
        folder: the saved folder.
        model: the in-memory model (a peft model for adapters); its logits are the reference
            unless ``reference`` is given, and its weights are what the folder must hold unless
            ``expected`` is given.
        tokenizer: the run's tokenizer.
        adapter: ``folder`` is a peft adapter (reloaded on ``load_base()``).
        load_base: returns a fresh base model (adapters only).
        dtype: the torch dtype to reload a full model in (default: the dtype of the weights it
            must hold, ``expected`` or ``model``).
        device: where the in-memory model computes; the reloaded model is moved there (default:
            the device of ``model``'s first parameter).
        autocast_dtype: the run's mixed precision (both sides run under it); None: off.
        reference: precomputed in-memory logits (:func:`prompt_logits` with the same device and
            autocast).
        expected: the model whose weights the folder holds when it is not ``model`` (the LoRA
            ``model/`` is the adapter merged into its base: its weights are the merged model's
            while its logits must stay the adapter model's).
        expected_on_rank0_only: ``expected`` is a model rank 0 built alone (no ZeRO-3
            partitions; None on the other ranks, which then skip the weight comparison).
    Returns:
        ``{"folder", "tensors", "weights_compared", "max_abs_logit_diff", "tolerance"}`` on
        rank 0, None on the other ranks.
    Raises:
        RatuneError: on every rank: an empty tensor, a load failure, missing/unexpected weights, a
            weight that is not bit-identical, or logits out of tolerance (naming the folder and the
            tensor or prompt), or the check itself failing (saying the save was not judged).
    """
    import torch

    holds = expected if expected is not None else model
    dtype = dtype or (weights_dtype_of(holds) if holds is not None else None)
    device = torch.device(device) if device is not None else model_device(model)
    rank, world = _world()
    if reference is None:
        try:
            reference = prompt_logits(model, tokenizer, device=device, autocast_dtype=autocast_dtype)
        except Exception as exc:  # noqa: BLE001 - the check's own failure, not the save's
            raise _check_could_not_run(folder, "run the in-memory model", exc) from exc
    reloaded, n_tensors, error = None, 0, None
    if rank == 0:
        try:
            n_tensors = check_tensors_non_empty(folder)
            reloaded = load_saved(folder, adapter=adapter, load_base=load_base, dtype=dtype,
                                  attn_implementation=None if adapter else attn_implementation_of(model))
        except RatuneError as exc:
            error = str(exc)
    error = _broadcast(error, world)
    if error is None:
        n_weights = 0
        if rank == 0 or not expected_on_rank0_only:
            n_weights, error = compare_weights(folder, reloaded, holds, adapter=adapter)
        error = _broadcast(error, world)
    summary = None
    if rank == 0 and error is None:
        try:
            summary = _compare_reloaded_logits(folder, reloaded, reference, tokenizer, device=device,
                                               compute=compute_dtype(dtype, weights_dtype_of(model), autocast_dtype),
                                               autocast_dtype=autocast_dtype)
            summary.update({"tensors": n_tensors, "weights_compared": n_weights})
        except RatuneError as exc:
            error = str(exc)
    del reloaded
    error = _broadcast(error, world)
    if error is not None:
        raise RatuneError(error if rank == 0 else f"rank {rank}: rank 0's save check failed: {error}")
    return summary


def _compare_reloaded_logits(folder, reloaded, reference, tokenizer, *, device, compute, autocast_dtype) -> dict:
    try:
        if model_device(reloaded) != device and not getattr(reloaded, "is_loaded_in_4bit", False):
            reloaded.to(device)
        got = prompt_logits(reloaded, tokenizer, device=device, autocast_dtype=autocast_dtype)
    except Exception as exc:  # noqa: BLE001 - the check's own failure, not the save's
        raise _check_could_not_run(folder, f"run the reloaded model on {device}", exc) from exc
    atol = logit_tolerance(compute, reference)
    worst = compare_logits(folder, reference, got, atol)
    return {"folder": str(folder), "max_abs_logit_diff": worst, "tolerance": atol, "compute_dtype": str(compute)}


def _broadcast(error: str | None, world: int) -> str | None:
    """Rank 0's ``error`` on every rank (a no-op on one process)."""
    if world == 1:
        return error
    import torch.distributed as dist

    box = [error]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def make_save_callback(tokenizer, *, adapter: bool, load_base: Callable[[], object] | None, dtype=None,
                       autocast_dtype=None, record: list | None = None):
    """A ``transformers.TrainerCallback`` whose ``on_save`` checks each Trainer checkpoint folder
    (``args.output_dir/checkpoint-<global_step>``) with :func:`verify_saved`.

    Args:
        record: when given, each rank-0 summary is appended to it.
    """
    from transformers import TrainerCallback

    class VerifySaves(TrainerCallback):
        """Check every Trainer checkpoint as soon as it is written (ratune.train.checks)."""

        def on_save(self, args, state, control, model=None, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            summary = verify_saved(folder, model, tokenizer, adapter=adapter, load_base=load_base, dtype=dtype,
                                   device=args.device, autocast_dtype=autocast_dtype)
            if summary is not None and record is not None:
                record.append(summary)
            return control

    return VerifySaves()
