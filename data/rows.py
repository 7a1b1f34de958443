"""One train-time mode's rows: documents per example, the prompt and answer in the hub's answer
format, the token length and the over-length policy (docs/pipeline.md#data)."""

from __future__ import annotations

import json
from typing import Sequence

from ratune.data.labels import AnswerMerge, tokenize_row
from ratune.data.settings import BuildSettings
from ratune.errors import RatuneError
from ratune.hubs import Hub
from ratune.registry import DEFAULT_BM25_BACKEND, RETRIEVERS
from ratune.retrieval.retrievers import Query, make_retriever
from ratune.sources.apibench import Example, api_identity, document_name
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, Prompt, get_answer_format
from ratune.sources.prompt import build_user_turn, join_documents, shorten_document

#: A document cut below this many tokens is useless; the row is dropped instead.
MIN_DOCUMENT_TOKENS = 32


def build_rows(examples: Sequence[Example], docs_per_example: Sequence[Sequence[dict]], *, mode: str,
               tokenizer, settings: BuildSettings, components: Sequence[str] | None = None,
               answer_format: str = DEFAULT_ANSWER_FORMAT) -> tuple[list[dict], dict]:
    """Render, measure and apply the over-length policy to one mode's rows.

    Args:
        components: for a mixture mode, each example's drawn component (``doc_component``);
            an ``irrelevant`` row's answer calls nothing.
    Returns:
        ``(rows, counts)``; ``counts`` has ``rows``, ``shortened`` and ``dropped``.
    """
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    fmt = get_answer_format(answer_format)
    fmt.check_tokenizer(tokenizer)
    rows, shortened_n, dropped = [], 0, []
    for i, (ex, docs) in enumerate(zip(examples, docs_per_example)):
        prompt = fmt.prompt(ex, docs, max_document_tokens=settings.max_document_tokens, count_tokens=count)
        completion = fmt.completion(ex, abstain=components is not None and components[i] == "irrelevant",
                                    tokenizer=tokenizer, prompt=prompt)
        try:
            row = tokenize_row(tokenizer, prompt.user_turn, completion, system=prompt.system, tools=prompt.tools,
                               answer_tokenization=settings.answer_tokenization)
        except AnswerMerge as exc:
            raise AnswerMerge(f"{ex.hub} {ex.split} example line {ex.line}: {exc}") from None
        if len(row.input_ids) > settings.max_length:
            fitted = _fit_documents(ex, docs, completion, tokenizer, settings, count) if fmt.shortens_documents else None
            if fitted is None:
                dropped.append(ex.line)
                continue
            prompt, row = fitted
        shortened_n += prompt.shortened
        rows.append({
            "hub": ex.hub, "split": ex.split, "line": ex.line, "train_retriever": mode,
            "instruction": ex.instruction, "user_turn": prompt.user_turn, "completion": completion,
            **({"system": prompt.system} if prompt.system is not None else {}),
            **({"tools": json.dumps(prompt.tools, ensure_ascii=False)} if prompt.tools is not None else {}),
            "gold_api_call": document_name(ex.api), "document_api_calls": [document_name(d) for d in docs],
            "shortened": bool(prompt.shortened), "n_prompt_tokens": row.n_prompt_tokens,
            "n_completion_tokens": row.n_completion_tokens,
            **({"doc_component": components[i]} if components is not None else {}),
        })
    return rows, {"rows": len(rows), "shortened": shortened_n, "dropped": len(dropped), "dropped_lines": dropped}


def _fit_documents(ex: Example, docs: Sequence[dict], completion: str, tokenizer, settings: BuildSettings, count
                   ) -> tuple[Prompt, object] | None:
    """An over-long APIBench row with its documents cut to the room left, ``(prompt, tokenized row)``;
    None when it cannot fit (no documents, or under :data:`MIN_DOCUMENT_TOKENS` each)."""
    if not docs:
        return None
    base = len(tokenize_row(tokenizer, build_user_turn(ex.instruction, ""), completion,
                           answer_tokenization=settings.answer_tokenization).input_ids)
    room = (settings.max_length - base) // len(docs)
    # shorten each document to the room left, then re-check (tokenization is not additive)
    while room >= MIN_DOCUMENT_TOKENS:
        parts = [shorten_document(d, room, count)[0] for d in docs]
        user_turn = build_user_turn(ex.instruction, join_documents(parts))
        row = tokenize_row(tokenizer, user_turn, completion, answer_tokenization=settings.answer_tokenization)
        if len(row.input_ids) <= settings.max_length:
            return Prompt(user_turn=user_turn, shortened=True), row
        room -= 8
    return None


def require_rows(counts: dict, *, split: str, mode: str, settings: BuildSettings) -> None:
    """Refuse a split and mode whose every row the over-length policy dropped.

    Raises:
        RatuneError: naming the split, the mode, the counts and the setting to raise.
    """
    if counts["rows"] == 0:
        raise RatuneError(f"{split} split, mode {mode}: all {counts['dropped']} rows are longer than --max-length "
                          f"{settings.max_length} tokens even with their documents shortened (over-length policy); "
                          "raise --max-length (or lower --max-document-tokens)")


def retrieve_for_mode(mode: str, examples: Sequence[Example], *, hub: str | Hub, apibench_dir, top_k: int,
                      retriever_cache: dict, dense_model: str | None = None,
                      bm25_backend: str = DEFAULT_BM25_BACKEND, exclude: frozenset[str] = frozenset()
                      ) -> list[list[dict]]:
    """Documents per example for a train-time mode (none -> [], oracle -> [gold], else top_k);
    ``hub`` is a hub name or a :class:`~ratune.hubs.Hub` (:func:`make_retriever`); a retrieved
    document whose API identity is in ``exclude`` is passed over (the next one takes its place)."""
    if mode not in retriever_cache:
        retriever_cache[mode] = make_retriever(mode, hub=hub, apibench_dir=apibench_dir, bm25_backend=bm25_backend,
                                               dense_model=dense_model if RETRIEVERS[mode].needs_model else None)
    queries = [Query.of(e) for e in examples]
    if mode == "oracle":
        return retriever_cache[mode].retrieve(queries, top_k=1)
    if not exclude:
        return retriever_cache[mode].retrieve(queries, top_k=top_k)
    ranked = retriever_cache[mode].retrieve(queries, top_k=top_k + len(exclude))
    return [[d for d in docs if api_identity(d) not in exclude][:top_k] for docs in ranked]


def force_gold_documents(examples: Sequence[Example], docs_per_example: Sequence[Sequence[dict]]
                         ) -> tuple[list[list[dict]], int]:
    """Put each example's gold document in place of its lowest-ranked retrieved one when the
    retrieval missed it (compared by API identity); returns ``(docs, how many were replaced)``."""
    out, forced = [], 0
    for ex, docs in zip(examples, docs_per_example):
        docs = list(docs)
        if docs and api_identity(ex.api) not in {api_identity(d) for d in docs}:
            docs[-1] = ex.api
            forced += 1
        out.append(docs)
    return out, forced


def percentiles(values: list[int]) -> dict:
    import numpy as np

    if not values:
        return {}
    arr = np.asarray(values)
    return {f"p{p}": int(np.percentile(arr, p, method="nearest")) for p in (50, 90, 95, 99, 100)}
