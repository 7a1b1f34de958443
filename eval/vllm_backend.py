"""vLLM generation backend (optional extra ``vllm``; CUDA GPUs only), answer-for-answer like HF.

Same prompts: the prompt token ids of :func:`ratune.data.prompt.encode_prompt` are passed to vLLM
as token ids (``{"prompt_token_ids": ids}``), never re-tokenized from text. Same decoding: greedy
(``temperature=0``), at most ``max_new_tokens`` new tokens, stop at the tokenizer's EOS (vLLM is
started with ``generation_config="vllm"`` so the model folder's generation config adds no other
stop ids, as HF ``generate`` is given ``eos_token_id`` explicitly in
:mod:`ratune.eval.generate`). Same post-processing: the generated ids are decoded with the
checkpoint's tokenizer and passed through :func:`ratune.eval.generate.decode_answer`, which also
applies the ``stop_after_api_call`` cut. vLLM does not stop early at the api_provider line (its
stop strings cannot express "the first line end after a marker"); it runs on and the text is cut
at the same offset HF's stopping criterion cuts at, so the stored answers are the same.

Numerics: vLLM's kernels differ from HF's, so greedy answers agree exactly only where no two
candidate tokens are near-tied; both default to float32 weights here (ratune's
:func:`ratune.train.model.load_model` default) to keep that rare.
"""

from __future__ import annotations

import importlib.util
from typing import Iterator, Sequence

from ratune.errors import RatuneError

INSTALL_HINT = ("pip install -e '.[vllm]' (or pip install vllm) on a Linux machine with a CUDA GPU, "
                "or use the HF backend (backend: hf)")


def require_vllm() -> None:
    """Check that the vLLM backend can run here.

    Raises:
        RatuneError: vllm is not installed, or no CUDA GPU is visible; the message says how to
            install it or to use the HF backend.
    """
    if importlib.util.find_spec("vllm") is None:
        raise RatuneError(f"the vLLM backend needs the vllm package, which is not installed: {INSTALL_HINT}")
    import torch

    if not torch.cuda.is_available():
        raise RatuneError(f"the vLLM backend needs a CUDA GPU and none is available here: {INSTALL_HINT}")


def load_llm(model_path, *, dtype: str = "float32", gpu_memory_utilization: float = 0.9, seed: int = 0):
    """A ``vllm.LLM`` for a model folder (checked with :func:`require_vllm` first).

    Args:
        model_path: a folder with config.json, safetensors and tokenizer (a ratune model folder).
        dtype: weight dtype (``float32`` as HF evaluation uses by default; ``bfloat16`` is faster).
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache).
        seed: vLLM's seed (greedy decoding does not sample; kept fixed anyway).
    Raises:
        RatuneError: see :func:`require_vllm`.
    """
    require_vllm()
    from vllm import LLM

    return LLM(model=str(model_path), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
               generation_config="vllm")


def sampling_params(tokenizer, *, max_new_tokens: int):
    """Greedy vLLM sampling parameters matching :func:`ratune.eval.generate.generate_batches`:
    ``temperature=0``, ``max_tokens=max_new_tokens``, stop at the tokenizer's EOS only."""
    from vllm import SamplingParams

    eos = tokenizer.eos_token_id
    return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=[] if eos is None else [eos],
                          skip_special_tokens=True)


def vllm_generate_batches(llm, tokenizer, prompts: Sequence[list[int]], *, max_new_tokens: int = 256,
                          stop_after_api_call: bool = False, chunk_size: int = 256
                          ) -> Iterator[list[tuple[int, str]]]:
    """Generate with vLLM, yielding ``[(prompt index, answer), ...]`` per chunk of prompts, in the
    shape of :func:`ratune.eval.generate.generate_batches` (so eval/run.py appends and resumes
    the same way).

    Args:
        llm: from :func:`load_llm` (anything with vLLM's ``generate(prompts, params, use_tqdm=)``).
        tokenizer: the checkpoint's tokenizer (decodes the generated ids).
        prompts: token ids per prompt (from :func:`ratune.data.prompt.encode_prompt`).
        max_new_tokens: the generation limit per answer.
        stop_after_api_call: cut the answer after the api_provider line (as the HF backend).
        chunk_size: prompts per ``llm.generate`` call (vLLM batches within a call; chunks only
            bound how much is lost when a run is killed).
    Yields:
        Lists of ``(index into prompts, answer)``; answers are
        :func:`ratune.eval.generate.decode_answer` of vLLM's generated token ids.
    """
    from ratune.eval.generate import decode_answer

    params = sampling_params(tokenizer, max_new_tokens=max_new_tokens)
    for start in range(0, len(prompts), chunk_size):
        idx = list(range(start, min(start + chunk_size, len(prompts))))
        outputs = llm.generate([{"prompt_token_ids": list(prompts[i])} for i in idx], params, use_tqdm=False)
        yield [(i, decode_answer(tokenizer, out.outputs[0].token_ids, stop_after_api_call=stop_after_api_call))
               for i, out in zip(idx, outputs)]


def vllm_generate_all(llm, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers in prompt order (arguments as :func:`vllm_generate_batches`)."""
    texts = [""] * len(prompts)
    for batch in vllm_generate_batches(llm, tokenizer, prompts, **kwargs):
        for i, text in batch:
            texts[i] = text
    return texts
