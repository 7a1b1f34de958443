"""vLLM generation backend (optional extra ``vllm``; CUDA GPUs only), answer-for-answer like HF:
the same prompt token ids, greedy, the same stop ids, length limits and answer cut (all from
:mod:`ratune.eval.generate`). Why each setting, and the supported versions: docs/training.md#vllm.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Iterator, Sequence

from ratune.errors import RatuneError
from ratune.eval.settings import resolve_placement

#: The vLLM releases whose torch and transformers pins co-install with ratune's (docs/training.md#vllm);
#: pyproject.toml's ``vllm`` extra pins the same range.
SUPPORTED_VLLM = ">=0.27.0,<0.31"
INSTALL_HINT = ("pip install -e '.[vllm]' (vllm" + SUPPORTED_VLLM + ") on a Linux machine with a CUDA GPU, "
                "or use the HF backend (backend: hf)")


def require_vllm() -> None:
    """Check that the vLLM backend can run here.

    Raises:
        RatuneError: vllm is not installed, no CUDA GPU is visible, or the installed vllm is
            outside :data:`SUPPORTED_VLLM` (naming its version and the range); the message says
            how to install a supported one or to use the HF backend.
    """
    if importlib.util.find_spec("vllm") is None:
        raise RatuneError(f"the vLLM backend needs the vllm package, which is not installed: {INSTALL_HINT}")
    import torch

    if not torch.cuda.is_available():
        raise RatuneError(f"the vLLM backend needs a CUDA GPU and none is available here: {INSTALL_HINT}")
    from packaging.specifiers import SpecifierSet

    try:
        installed = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is None or not SpecifierSet(SUPPORTED_VLLM).contains(installed, prereleases=True):
        raise RatuneError(f"vllm {installed or '(version unknown)'} is installed, but the vLLM backend is written "
                          f"against vllm{SUPPORTED_VLLM} (eval/vllm_backend.py: the releases whose torch and "
                          f"transformers pins co-install with ratune's); {INSTALL_HINT}")


def load_llm(model_path, *, dtype: str = "auto", max_positions: int | None = None, trust_remote_code: bool = False,
             gpu_memory_utilization: float = 0.9, seed: int = 0):
    """A ``vllm.LLM`` for a model folder (checked with :func:`require_vllm` first).

    ``dtype`` as eval's ``--dtype``; ``max_positions`` is vLLM's ``max_model_len`` (None: the folder
    config's, :func:`ratune.eval.generate.max_positions_of`); ``gpu_memory_utilization`` is the share
    of GPU memory vLLM may take (weights + KV cache).

    Raises:
        RatuneError: see :func:`require_vllm` and :func:`ratune.eval.settings.resolve_placement`.
    """
    require_vllm()

    _, dtype = resolve_placement("cuda", dtype, backend="vllm")
    if max_positions is None:
        from transformers import AutoConfig

        from ratune.eval.generate import max_positions_of

        max_positions = max_positions_of(AutoConfig.from_pretrained(str(model_path),
                                                                    trust_remote_code=trust_remote_code))
    from vllm import LLM

    # generation_config and max_model_len are engine arguments (LLM passes them on to EngineArgs)
    engine = {"generation_config": "vllm"}
    if max_positions is not None:
        engine["max_model_len"] = max_positions
    return LLM(model=str(model_path), dtype=dtype, seed=seed, trust_remote_code=trust_remote_code,
               gpu_memory_utilization=gpu_memory_utilization, **engine)


def sampling_params(tokenizer, *, max_new_tokens: int):
    """Greedy vLLM sampling parameters stopping at exactly :func:`ratune.eval.generate.stop_token_ids`.

    Raises:
        RatuneError: see :func:`ratune.eval.generate.stop_token_ids`.
    """
    from vllm import SamplingParams

    from ratune.eval.generate import stop_token_ids

    return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=stop_token_ids(tokenizer),
                          ignore_eos=True, skip_special_tokens=True)


def vllm_generate_batches(llm, tokenizer, prompts: Sequence[list[int]], *, max_positions: int | None,
                          max_new_tokens: int = 256, stop_after_api_call: bool = False, chunk_size: int = 256,
                          answer_format: str = "apibench") -> Iterator[list[tuple[int, str]]]:
    """Generate with vLLM, yielding ``[(prompt index, answer), ...]`` per chunk of ``chunk_size``
    prompts, as :func:`ratune.eval.generate.generate_batches` does (arguments as there; ``llm`` from
    :func:`load_llm`).

    Raises:
        RatuneError: a prompt that leaves no room for an answer, before anything is generated
            (:func:`ratune.eval.generate.generation_limits`).
    """
    from ratune.eval.generate import decode_answer, generation_limits

    limits = generation_limits([len(p) for p in prompts], max_new_tokens=max_new_tokens, max_positions=max_positions)
    params = {}  # one SamplingParams per distinct limit
    for start in range(0, len(prompts), chunk_size):
        idx = list(range(start, min(start + chunk_size, len(prompts))))
        for i in idx:
            if limits[i] not in params:
                params[limits[i]] = sampling_params(tokenizer, max_new_tokens=limits[i])
        outputs = llm.generate([{"prompt_token_ids": list(prompts[i])} for i in idx],
                               [params[limits[i]] for i in idx], use_tqdm=False)
        yield [(i, decode_answer(tokenizer, out.outputs[0].token_ids, stop_after_api_call=stop_after_api_call,
                                 answer_format=answer_format))
               for i, out in zip(idx, outputs)]
