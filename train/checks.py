"""Save-time checks: a saved model or adapter folder must reload and reproduce the in-memory model
(:func:`verify_saved`); the steps and tolerances: docs/scale-out.md#what-every-run-checks."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

from ratune.errors import RatuneError

#: Two fixed short prompts (a few tokens each): the check costs two forward passes per model.
PROMPTS = ("Load a pretrained image classifier", "api_call: torch.hub.load(")


def logit_tolerance(dtype, reference: list) -> float:
    """Absolute logit tolerance for forward passes run in ``dtype`` (the lowest precision, weights or
    autocast): ``sqrt(eps(dtype)) x max(1, max |reference|)`` over the in-memory logits ``reference``
    (at logits of size 30: 0.010 in float32, 2.65 in bfloat16)."""
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
    """Logits of ``model`` on each prompt, a float32 CPU tensor ``[n_tokens, vocab_size]`` each, in eval
    mode (the model's mode is restored) on ``device`` (default: the model's), under ``torch.autocast``
    in ``autocast_dtype`` (None: off). Under ZeRO-3 every rank calls it."""
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
    """The number of tensors in ``folder``'s ``*.safetensors`` files.

    Raises:
        RatuneError: no safetensors file, or an empty tensor (named with its file).
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
    """Load models on this process alone, even in a ZeRO-3 run: the HF Trainer's global ZeRO-3
    registration (``from_pretrained`` would partition with collectives no other rank joins) is lifted
    for the block."""
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
    """Reload a saved folder as a user would: a model folder in ``dtype`` (default float32), or with
    ``adapter`` a peft adapter on ``load_base()``; returns the model in eval mode.

    Raises:
        RatuneError: the folder does not load, or loads with missing, unexpected or mismatched weights.
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
    """Compare the reloaded model's weights with ``expected``'s bit for bit (the in-memory tensor cast to
    the saved dtype). Every rank calls it (ZeRO-3 gathers each parameter in turn); only the rank holding
    ``reloaded`` compares. Returns ``(tensors compared, first error or None)``, never raising, so every
    rank finishes its collectives."""
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
    """The largest absolute difference between two lists of prompt logits.

    Raises:
        RatuneError: a shape differs, a value is not finite, or a difference exceeds ``atol``.
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
    """Check one saved folder (docs/scale-out.md#what-every-run-checks); every rank calls it.

    The reload must reproduce the logits of ``model`` (or ``reference``) on ``device`` (default: the
    model's) under ``autocast_dtype``, and hold the weights of ``expected`` (default ``model``; a
    merged LoRA ``model/``'s, built by rank 0 alone with ``expected_on_rank0_only``). ``adapter``: a
    peft adapter, reloaded on ``load_base()``; ``dtype``: a full model's reload dtype (default: that
    of the weights it holds). Returns rank 0's summary; None on the other ranks.

    Raises:
        RatuneError: on every rank, naming the folder and the tensor or prompt, or saying that the
            check itself failed and the save was not judged.
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
    """A TrainerCallback checking each Trainer checkpoint with :func:`verify_saved` when it is saved;
    rank 0's summaries are appended to ``record`` when given."""
    from transformers import TrainerCallback

    class VerifySaves(TrainerCallback):

        def on_save(self, args, state, control, model=None, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            summary = verify_saved(folder, model, tokenizer, adapter=adapter, load_base=load_base, dtype=dtype,
                                   device=args.device, autocast_dtype=autocast_dtype)
            if summary is not None and record is not None:
                record.append(summary)
            return control

    return VerifySaves()
