"""vLLM generation backend (optional extra ``vllm``; CUDA GPUs only), answer-for-answer like HF.

Same prompts: the prompt token ids of :func:`ratune.sources.prompt.encode_prompt` are passed to vLLM
as token ids (``{"prompt_token_ids": ids}``), never re-tokenized from text. Same decoding: greedy
(``temperature=0``); per prompt at most :func:`ratune.eval.generate.generation_limits` new tokens
(``max_new_tokens``, fewer where prompt plus answer would pass the model's positions; vLLM's
``max_model_len`` is set to the same ``max_position_embeddings``, so vLLM never cuts an answer the
HF backend would not); and stop at exactly :func:`ratune.eval.generate.stop_token_ids`, the ids
the HF backend stops at. Left alone, vLLM would also stop at every ``eos_token_id`` of the model
folder's generation_config.json, which it reads even with ``generation_config="vllm"`` (vllm
0.30.0 ``SamplingParams.update_from_generation_config``); ``ignore_eos=True`` with those
``stop_token_ids`` makes the list exact. ``generation_config="vllm"`` keeps vLLM's neutral
sampling defaults (no temperature or repetition penalty taken from the folder). Same
post-processing: the generated ids are decoded with the checkpoint's tokenizer and passed
through :func:`ratune.eval.generate.decode_answer`, which also applies the ``stop_after_api_call``
cut. vLLM does not stop early at the api_provider line (its stop strings cannot express "the
first line end after a marker"); it runs on and the text is cut at the same offset HF's stopping
criterion cuts at, so the stored answers are the same.

Numerics: the weights' dtype is eval's (:func:`ratune.eval.settings.resolve_placement`: bfloat16 on
CUDA unless ``--dtype`` says otherwise), the one the HF backend uses on the same GPU. vLLM's
kernels differ from HF's, so greedy answers agree exactly only where no two candidate tokens are
near-tied.

Versions (:data:`SUPPORTED_VLLM`, the ``vllm`` extra of pyproject.toml): every vLLM release pins
torch exactly and bounds transformers. By their wheels' metadata, vllm 0.27.0-0.30.0 require
torch==2.13.0 (inside ratune's torch>=2.4, and the Makefile's CPU pin) and transformers>=5.5.3
(0.29, 0.30: >=5.10.4) with no upper bound, so they co-install with transformers==5.24.0;
``pip install --dry-run -c <ratune's pins> vllm==V`` resolved 0.27.1, 0.28.0, 0.29.0 and 0.30.0
changing no pinned package (numpy 2.4 -> 2.3.5 only). 0.31.0, 0.32.0 and 0.33.0 cap transformers
below 5.18, 5.20 and 5.21 (0.33.0 also pins torch 2.14.0); 0.19-0.26 pin torch 2.10 or 2.11;
0.11-0.18 require transformers<5; 0.7-0.10 set no transformers bound but pin torch 2.5.1-2.8.0
and predate transformers 5 (the old extra, ``vllm>=0.7``, resolved to 0.33.0). The arguments
used here (``LLM(model, dtype, seed, trust_remote_code, gpu_memory_utilization)`` plus the engine
arguments ``generation_config`` and ``max_model_len``, ``LLM.generate(prompts, sampling_params,
use_tqdm=)``, and the ``SamplingParams`` fields) read the same in the 0.27.0 and 0.30.0 sources. vLLM has not run
against ratune on a GPU yet; :func:`require_vllm` refuses a vllm outside this range.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Iterator, Sequence

from ratune.errors import RatuneError
from ratune.eval.settings import resolve_placement

#: The vLLM releases this backend is written against (module docstring); pyproject.toml's ``vllm``
#: extra pins the same range.
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

    Args:
        model_path: a folder with config.json, safetensors and tokenizer (a ratune model folder).
        dtype: weight dtype, as eval's ``--dtype`` (``auto``: bfloat16, the CUDA default of
            :func:`ratune.eval.settings.resolve_placement`).
        max_positions: vLLM's ``max_model_len``; None: :func:`ratune.eval.generate.max_positions_of`
            the folder's config.json (vLLM's own default when that names none).
        trust_remote_code: let the folder's own modeling code run.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache).
        seed: vLLM's seed (greedy decoding does not sample; kept fixed anyway).
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
    """Greedy vLLM sampling parameters matching :func:`ratune.eval.generate.generate_batches`:
    ``temperature=0``, ``max_tokens=max_new_tokens``, and stop at exactly
    :func:`ratune.eval.generate.stop_token_ids` (``ignore_eos=True`` turns off vLLM's own EOS and
    generation-config stops; the list holds the EOS itself).

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
    """Generate with vLLM, yielding ``[(prompt index, answer), ...]`` per chunk of prompts, in the
    shape of :func:`ratune.eval.generate.generate_batches` (so eval/run.py appends and resumes
    the same way).

    Args:
        llm: from :func:`load_llm` (anything with vLLM's ``generate(prompts, params, use_tqdm=)``).
        tokenizer: the checkpoint's tokenizer (decodes the generated ids).
        prompts: token ids per prompt (from :func:`ratune.sources.prompt.encode_prompt`).
        max_positions: the model's positions (the ``max_model_len`` given to :func:`load_llm`);
            with ``max_new_tokens`` they give each prompt its limit
            (:func:`ratune.eval.generate.generation_limits`, as the HF backend).
        max_new_tokens: the generation limit per answer.
        stop_after_api_call: cut the answer where it is complete in ``answer_format`` (as the HF backend).
        chunk_size: prompts per ``llm.generate`` call (vLLM batches within a call; chunks only
            bound how much is lost when a run is killed).
    Yields:
        Lists of ``(index into prompts, answer)``; answers are
        :func:`ratune.eval.generate.decode_answer` of vLLM's generated token ids.
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


def vllm_generate_all(llm, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers in prompt order (arguments as :func:`vllm_generate_batches`)."""
    texts = [""] * len(prompts)
    for batch in vllm_generate_batches(llm, tokenizer, prompts, **kwargs):
        for i, text in batch:
            texts[i] = text
    return texts
