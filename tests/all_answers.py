"""Every answer of ratune's batch generators in prompt order, for tests to compare and benches to
time (bench/eval_throughput.py loads this file by path)."""

from __future__ import annotations

from typing import Iterable, Sequence


def in_prompt_order(batches: Iterable[list[tuple[int, str]]], n: int) -> list[str]:
    """The texts of ``(prompt index, text)`` batches, in prompt order."""
    texts = [""] * n
    for batch in batches:
        for i, text in batch:
            texts[i] = text
    return texts


def generate_all(model, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers of :func:`ratune.eval.generate.generate_batches` (its arguments), in prompt order."""
    from ratune.eval.generate import generate_batches

    return in_prompt_order(generate_batches(model, tokenizer, prompts, **kwargs), len(prompts))


def vllm_generate_all(llm, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers of :func:`ratune.eval.vllm_backend.vllm_generate_batches` (its arguments), in prompt order."""
    from ratune.eval.vllm_backend import vllm_generate_batches

    return in_prompt_order(vllm_generate_batches(llm, tokenizer, prompts, **kwargs), len(prompts))
