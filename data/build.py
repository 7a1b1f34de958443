"""The training-set builder: APIBench examples -> single-turn chats, per train-time retrieval mode.

For every example and mode (none, oracle, bm25, dense) the builder retrieves the documents,
renders the user turn with :func:`ratune.data.prompt.render_user_turn` (the evaluator calls the
same function) and the answer with :func:`ratune.data.prompt.format_answer`, and checks the
token length of the whole row against ``max_length``.

Over-length policy (explicit; never truncates the answer): documents are first shortened to
``max_document_tokens``; a row still longer than ``max_length`` gets its document shortened to the
room left; a row whose instruction and answer alone do not fit (or that would keep fewer than
``MIN_DOCUMENT_TOKENS`` of its document) is dropped. Both are counted per mode and split.

Output: ``OUT/{mode}/`` is a ``datasets.DatasetDict`` (splits ``train`` and/or ``eval``) saved
with ``save_to_disk``; ``OUT/manifest.json`` holds counts per split and mode, token-length
percentiles, the over-length counts, the settings and the input files' sha256.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ratune.data.apibench import (Example, api_database_path, check_hub, examples_path, input_hashes,
                                  load_examples)
from ratune.data.prompt import format_answer, render_user_turn, shorten_document, build_user_turn
from ratune.errors import RatuneError

#: Train-time retrieval modes (Gorilla trains with none or oracle; bm25 and dense are ours).
TRAIN_MODES = ("none", "oracle", "bm25", "dense")

#: A document cut below this many tokens is useless; the row is dropped instead.
MIN_DOCUMENT_TOKENS = 32


@dataclass(frozen=True)
class BuildSettings:
    """Settings that change the built rows (all recorded in the manifest).

    Attributes:
        max_length: maximum tokens per row, prompt (chat template included) + answer + EOS.
            The paper uses 2048 (appendix); the CPU demo uses less.
        max_document_tokens: budget per document before the length check; None = no budget.
        top_k: documents per prompt for the bm25 and dense modes (the paper uses top-1).
    """

    max_length: int = 2048
    max_document_tokens: int | None = None
    top_k: int = 1


def build_rows(examples: Sequence[Example], docs_per_example: Sequence[Sequence[dict]], *, mode: str,
               tokenizer, settings: BuildSettings) -> tuple[list[dict], dict]:
    """Render, measure and apply the over-length policy to one mode's rows.

    Returns:
        ``(rows, counts)``; ``counts`` has ``rows``, ``shortened`` and ``dropped``.
    """
    from ratune.train.labels import tokenize_row

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    rows, shortened_n, dropped = [], 0, []
    for ex, docs in zip(examples, docs_per_example):
        completion = format_answer(ex.answer)
        user_turn, shortened = render_user_turn(ex.instruction, docs, max_document_tokens=settings.max_document_tokens,
                                                count_tokens=count)
        row = tokenize_row(tokenizer, user_turn, completion)
        if len(row.input_ids) > settings.max_length:
            if not docs:
                dropped.append(ex.line)
                continue
            base = len(tokenize_row(tokenizer, build_user_turn(ex.instruction, ""), completion).input_ids)
            room = (settings.max_length - base) // len(docs)
            if room < MIN_DOCUMENT_TOKENS:
                dropped.append(ex.line)
                continue
            # shorten each document to the room left, then re-check (tokenization is not additive)
            while room >= MIN_DOCUMENT_TOKENS:
                parts = [shorten_document(d, room, count)[0] for d in docs]
                user_turn = build_user_turn(ex.instruction, "\n".join(parts))
                row = tokenize_row(tokenizer, user_turn, completion)
                if len(row.input_ids) <= settings.max_length:
                    break
                room -= 8
            if len(row.input_ids) > settings.max_length:
                dropped.append(ex.line)
                continue
            shortened = True
        shortened_n += shortened
        rows.append({
            "hub": ex.hub, "split": ex.split, "line": ex.line, "train_retriever": mode,
            "instruction": ex.instruction, "user_turn": user_turn, "completion": completion,
            "gold_api_call": ex.api["api_call"], "document_api_calls": [d["api_call"] for d in docs],
            "shortened": bool(shortened), "n_prompt_tokens": row.n_prompt_tokens,
            "n_completion_tokens": row.n_completion_tokens,
        })
    return rows, {"rows": len(rows), "shortened": shortened_n, "dropped": len(dropped), "dropped_lines": dropped}


def retrieve_for_mode(mode: str, examples: Sequence[Example], *, hub: str, apibench_dir, top_k: int,
                      retriever_cache: dict) -> list[list[dict]]:
    """Documents per example for a train-time mode (none -> [], oracle -> [gold], else top_k)."""
    from ratune.retrieval.retrievers import Query, make_retriever

    if mode not in retriever_cache:
        retriever_cache[mode] = make_retriever(mode, hub=hub, apibench_dir=apibench_dir)
    queries = [Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples]
    return retriever_cache[mode].retrieve(queries, top_k=1 if mode == "oracle" else top_k)


def _percentiles(values: list[int]) -> dict:
    import numpy as np

    if not values:
        return {}
    arr = np.asarray(values)
    return {f"p{p}": int(np.percentile(arr, p, method="nearest")) for p in (50, 90, 95, 99, 100)}


def build_dataset(*, apibench_dir, hub: str, out_dir, tokenizer, tokenizer_name: str,
                  modes: Sequence[str] = TRAIN_MODES, settings: BuildSettings = BuildSettings(),
                  lenient: bool = False, overwrite: bool = False, progress: bool = True,
                  leakage: str = "error") -> dict:
    """Build the chats for every split the hub has and every mode; write datasets and manifest.

    Args:
        apibench_dir: the APIBench folder.
        hub: torchhub, huggingface or tensorflowhub (only TorchHub has a train split here).
        out_dir: output folder; refused when it holds a previous build unless ``overwrite``.
        tokenizer: the tokenizer used to measure lengths (the training model's).
        tokenizer_name: recorded in the manifest.
        modes: train-time retrieval modes to build.
        settings: see :class:`BuildSettings`.
        lenient: write unparseable rows to ``rejects.jsonl`` and count them instead of failing.
        leakage: what to do with eval instructions found in the training data
            (:func:`ratune.data.validate.validate_splits`): ``error`` (default), ``drop`` the
            leaked training rows, or ``allow``. Duplicate training examples are always removed.
    Returns:
        The manifest (also written to ``out_dir/manifest.json``).
    Raises:
        InputError: on a bad input row (file:line field), unless lenient.
        RatuneError: unknown mode, or an existing output folder without ``overwrite``.
    """
    from datasets import Dataset, DatasetDict
    from tqdm.auto import tqdm

    from ratune.data.apibench import ParseReport, load_api_database
    from ratune.data.validate import validate_splits
    from ratune.io import write_json
    from ratune.manifest import base_manifest, mark_complete

    check_hub(hub)
    for mode in modes:
        if mode not in TRAIN_MODES:
            raise RatuneError(f"unknown train-time retrieval mode {mode!r}: expected one of {', '.join(TRAIN_MODES)}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise RatuneError(f"{out}: output folder exists and is not empty (pass --overwrite to rebuild it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    report = ParseReport()
    splits = {}
    for split in ("train", "eval"):
        if examples_path(apibench_dir, hub, split).exists():
            splits[split] = load_examples(apibench_dir, hub, split, lenient=lenient, report=report)
    if not splits:
        raise RatuneError(f"{apibench_dir}: no example files for hub {hub}")
    read_counts = {s: len(e) for s, e in splits.items()}
    splits, validation = validate_splits(
        splits, load_api_database(api_database_path(apibench_dir, hub)),
        train_path=examples_path(apibench_dir, hub, "train"), eval_path=examples_path(apibench_dir, hub, "eval"),
        leakage=leakage)
    if progress:
        print(validation.summary())

    cache: dict = {}
    counts: dict = {}
    lengths: dict = {}
    for mode in tqdm(modes, desc=f"build {hub}", disable=not progress):
        dd = {}
        for split, examples in splits.items():
            docs = retrieve_for_mode(mode, examples, hub=hub, apibench_dir=apibench_dir, top_k=settings.top_k,
                                     retriever_cache=cache)
            rows, c = build_rows(examples, docs, mode=mode, tokenizer=tokenizer, settings=settings)
            counts.setdefault(split, {})[mode] = c
            lengths.setdefault(split, {})[mode] = _percentiles(
                [r["n_prompt_tokens"] + r["n_completion_tokens"] for r in rows])
            dd[split] = Dataset.from_list(rows)
        DatasetDict(dd).save_to_disk(str(out / mode))

    if report.rejects:
        from ratune.io import atomic_write
        import json

        with atomic_write(out / "rejects.jsonl") as fh:
            for path, line, fieldname, reason in report.rejects:
                fh.write(json.dumps({"file": path, "line": line, "field": fieldname, "reason": reason}) + "\n")
    inputs = [api_database_path(apibench_dir, hub)] + [examples_path(apibench_dir, hub, s) for s in splits]
    manifest = base_manifest("data build")
    manifest.update({
        "hub": hub, "modes": list(modes), "splits": {s: len(e) for s, e in splits.items()},
        "rows_read": read_counts, "validation": validation.to_manifest(),
        "counts": counts, "token_lengths": lengths, "rejects": len(report.rejects),
        "settings": {"max_length": settings.max_length, "max_document_tokens": settings.max_document_tokens,
                     "top_k": settings.top_k, "min_document_tokens": MIN_DOCUMENT_TOKENS},
        "tokenizer": tokenizer_name, "inputs": input_hashes(inputs),
        "retrievers": {m: r.metadata() for m, r in cache.items()},
    })
    write_json(out / "manifest.json", manifest)
    mark_complete(out)
    return manifest
