"""Hand-made finished sweep cells for the report tests (test_sweep, test_replicates,
test_sweep_pairs, test_robustness, test_determinism): one owner for their shape."""

from __future__ import annotations

import json
from pathlib import Path


def rate_metrics(n: int, correct: int, halluc: int) -> dict:
    """metrics.json rates for ``n`` questions with ``correct`` right and ``halluc`` hallucinated
    (the rest errors); the strict block has one correct answer fewer (one error more), none fewer
    than zero."""
    err = n - correct - halluc
    block = {"accuracy": correct / n, "hallucination": halluc / n, "error": err / n,
             "correct_n": correct, "hallucination_n": halluc, "error_n": err}
    strict = max(correct - 1, 0)
    return {"n": n, "accuracy": correct / n, "hallucination": halluc / n, "error": err / n,
            "gorilla": dict(block), "strict": {**block, "accuracy": strict / n, "correct_n": strict,
                                               "error": (n - strict - halluc) / n, "error_n": n - strict - halluc}}


def finished_cell(sweep_dir: Path, name: str, axes: dict, results: dict, **config) -> Path:
    """A finished sweep cell folder: cell.json (hub torchhub, the axes' train_retriever, plus
    ``config``) and eval/{setting}/metrics.json with its .complete marker per entry of ``results``."""
    d = sweep_dir / "cells" / name
    d.mkdir(parents=True)
    config = {"hub": "torchhub", "model": "/models/tiny", "train_retriever": axes["train_retriever"], **config}
    (d / "cell.json").write_text(json.dumps({"name": name, "axes": axes, "config": config}))
    for setting, m in results.items():
        e = d / "eval" / setting
        e.mkdir(parents=True)
        (e / "metrics.json").write_text(json.dumps(m))
        (e / ".complete").write_text("complete\n")
    return d
