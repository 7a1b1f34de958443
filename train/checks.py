"""Save-time checks: every saved model or adapter folder must reload and reproduce the model.

After each save (a Trainer checkpoint, the final ``model/``, the LoRA ``adapter/``) the folder
is checked before the run goes on:

1. every ``*.safetensors`` file in it holds only non-empty tensors (a ZeRO-3 run that saves its
   partitioned parameters writes tensors of shape ``[0]``);
2. it loads with ``from_pretrained`` (adapter folders: ``peft.PeftModel.from_pretrained`` on a
   freshly loaded base) with no missing, unexpected or mismatched weights (a partial save would
   otherwise be filled with random weights and only noticed at export or eval);
3. the reloaded model's logits on two fixed short prompts (:data:`PROMPTS`, a few tokens each)
   match the in-memory model's within the tolerance of its dtype (:func:`tolerance`).

A failure raises :class:`~ratune.errors.RatuneError` naming the folder and the tensor.

Distributed runs: the in-memory logits are computed on EVERY rank (under ZeRO-3 the forward
pass gathers the partitioned parameters collectively, so all ranks must take part); only rank 0
reloads and compares; its verdict is then broadcast, so every rank raises the same error and no
rank waits forever at the next collective.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

from ratune.errors import RatuneError

#: Two fixed short prompts (a few tokens each): the check costs two forward passes per model.
PROMPTS = ("Load a pretrained image classifier", "api_call: torch.hub.load(")


def tolerance(dtype) -> float:
    """Absolute logit tolerance for a model whose weights are in ``dtype`` (a torch dtype).

    float32: 1e-4 (saving and reloading is exact; the margin covers a different summation order,
    e.g. a LoRA adapter merged into the base weights). 16-bit: 5e-2 (the weights themselves are
    rounded to 8 or 11 mantissa bits).
    """
    import torch

    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1


def prompt_logits(model, tokenizer, device=None, prompts=PROMPTS) -> list:
    """Logits of ``model`` on each prompt, in float32 on the CPU.

    The model is put in eval mode (no dropout) for the forward passes and given back in the mode
    it was in. Under DeepSpeed ZeRO-3 all ranks must call this together.

    Args:
        model: a causal LM (or a peft model) taking ``input_ids``.
        tokenizer: turns each prompt into ids (no special tokens added).
        device: where the inputs go; default: the device of the model's first parameter.
        prompts: the texts.
    Returns:
        One tensor per prompt, shape ``[n_tokens, vocab_size]``, float32, on the CPU.
    """
    import torch

    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
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


def load_saved(folder: str | os.PathLike, *, adapter: bool, load_base: Callable[[], object], dtype=None):
    """Reload a saved folder the way a user would.

    Args:
        folder: a model folder (``config.json`` + safetensors) or, with ``adapter=True``, a peft
            adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).
        adapter: whether ``folder`` is an adapter.
        load_base: returns a fresh base model (adapters only).
        dtype: torch dtype to load a full model in (default float32).
    Returns:
        The model in eval mode, on the CPU.
    Raises:
        RatuneError: the folder does not load, or loads with missing, unexpected or mismatched
            weights (named).
    """
    import torch

    folder = Path(folder)
    try:
        with plain_loading():
            return _load(folder, adapter=adapter, load_base=load_base, dtype=dtype or torch.float32).eval()
    except RatuneError:
        raise
    except Exception as exc:  # noqa: BLE001 - any load failure is a bad save, reported with its folder
        raise RatuneError(f"{folder}: saved folder does not reload ({type(exc).__name__}: {exc})") from exc


def _load(folder: Path, *, adapter: bool, load_base, dtype):
    if adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(load_base(), str(folder), is_trainable=False)
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, use_safetensors=True,
                                                       output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        bad = sorted(str(k) for k in info.get(kind) or [])
        if bad:
            raise RatuneError(f"{folder}: reload with from_pretrained reports {kind.replace('_', ' ')}: "
                              f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} (partial save?)")
    return model


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
                              f"by {diff:.3g} > tolerance {atol:g} (a corrupt or partial save)")
    return worst


def verify_saved(folder: str | os.PathLike, reference: list | None, tokenizer, *, adapter: bool,
                 load_base: Callable[[], object] | None = None, dtype=None, atol: float | None = None) -> dict:
    """Check one saved folder on this process (no collectives): non-empty tensors, reload, logits.

    Args:
        folder: the saved folder.
        reference: the in-memory model's :func:`prompt_logits`.
        tokenizer: the run's tokenizer.
        adapter: ``folder`` is a peft adapter (reloaded on ``load_base()``).
        load_base: returns a fresh base model (adapters only).
        dtype: the torch dtype to reload a full model in (default float32).
        atol: absolute logit tolerance (default :func:`tolerance` of ``dtype``).
    Returns:
        ``{"folder", "tensors", "max_abs_logit_diff", "tolerance"}``.
    Raises:
        RatuneError: an empty tensor, a load failure, missing/unexpected weights, or logits
            out of tolerance; the message names the folder and the tensor or prompt.
    """
    import torch

    dtype = dtype or torch.float32
    atol = tolerance(dtype) if atol is None else atol
    n = check_tensors_non_empty(folder)
    model = load_saved(folder, adapter=adapter, load_base=load_base, dtype=dtype)
    got = prompt_logits(model, tokenizer)  # on the device it loaded to (CPU; a 4-bit base: its GPU)
    worst = compare_logits(folder, reference, got, atol)
    return {"folder": str(folder), "tensors": n, "max_abs_logit_diff": worst, "tolerance": atol}


def verify_on_rank0(folder: str | os.PathLike, model, tokenizer, *, adapter: bool,
                    load_base: Callable[[], object] | None = None, dtype=None, device=None,
                    reference: list | None = None) -> dict | None:
    """The save-time check for a (possibly distributed) run; every rank must call it.

    All ranks compute the in-memory logits (``reference`` if given, else from ``model``; ZeRO-3
    needs every rank for that), rank 0 runs :func:`verify_saved`, and its verdict is broadcast.

    Returns:
        :func:`verify_saved`'s summary on rank 0, None on the other ranks.
    Raises:
        RatuneError: on every rank when rank 0's check failed (rank 0's message).
    """
    import torch.distributed as dist

    if reference is None:
        reference = prompt_logits(model, tokenizer, device=device)
    rank, world = _world()
    summary, error = None, None
    if rank == 0:
        try:
            summary = verify_saved(folder, reference, tokenizer, adapter=adapter, load_base=load_base, dtype=dtype)
        except RatuneError as exc:
            error = str(exc)
    if world > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise RatuneError(error if rank == 0 else f"rank {rank}: rank 0's save check failed: {error}")
    return summary


def make_save_callback(tokenizer, *, adapter: bool, load_base: Callable[[], object] | None, dtype=None,
                       record: list | None = None):
    """A ``transformers.TrainerCallback`` whose ``on_save`` checks each Trainer checkpoint folder
    (``args.output_dir/checkpoint-<global_step>``) with :func:`verify_on_rank0`.

    Args:
        record: when given, each rank-0 summary is appended to it.
    """
    from transformers import TrainerCallback

    class VerifySaves(TrainerCallback):
        """Check every Trainer checkpoint as soon as it is written (ratune.train.checks)."""

        def on_save(self, args, state, control, model=None, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            summary = verify_on_rank0(folder, model, tokenizer, adapter=adapter, load_base=load_base, dtype=dtype,
                                      device=args.device)
            if summary is not None and record is not None:
                record.append(summary)
            return control

    return VerifySaves()
