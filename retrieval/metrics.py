"""Retrieval quality: top-1, recall@k and NDCG@k, one relevant API per query (the gold one, by
:func:`~ratune.sources.apibench.api_identity`) at 1-based rank r: NDCG@k = 1 / log2(r + 1) if r <= k."""

from __future__ import annotations

import math
from typing import Sequence

from ratune.sources.apibench import Example, api_identity
from ratune.retrieval.base import Query, Retriever

#: The cut-offs reported (recall@k, NDCG@k).
KS = (1, 3, 5, 10)


def gold_rank(ranked: Sequence[dict], gold: dict) -> int | None:
    """1-based rank of the gold API in a ranked list, or None when absent."""
    key = api_identity(gold)
    for i, doc in enumerate(ranked, start=1):
        if api_identity(doc) == key:
            return i
    return None


def ndcg_at_k(rank: int | None, k: int) -> float:
    """NDCG@k for one query with a single relevant item at ``rank`` (None = not retrieved)."""
    return 1.0 / math.log2(rank + 1) if rank is not None and rank <= k else 0.0


def evaluate_retriever(retriever: Retriever, examples: Sequence[Example], *, ks: Sequence[int] = KS) -> dict:
    """Measure a retriever on eval examples: ``{"retriever", "n", "top1", "recall@k"..., "ndcg@k"...,
    "misses", "metadata"}``, rates as fractions in [0, 1]."""
    queries = [Query.of(e) for e in examples]
    ranked = retriever.retrieve(queries, top_k=max(ks))
    ranks = [gold_rank(r, e.api) for r, e in zip(ranked, examples)]
    n = len(examples)
    out = {"retriever": retriever.name, "n": n, "metadata": retriever.metadata()}
    out["top1"] = sum(r == 1 for r in ranks) / n if n else 0.0
    for k in ks:
        out[f"recall@{k}"] = sum(r is not None and r <= k for r in ranks) / n if n else 0.0
        out[f"ndcg@{k}"] = sum(ndcg_at_k(r, k) for r in ranks) / n if n else 0.0
    out["misses"] = [
        {"question_id": e.line, "gold": e.api["api_call"], "retrieved": r[0]["api_call"] if r else None}
        for e, r, rank in zip(examples, ranked, ranks) if rank != 1
    ]
    return out


def retrieval_markdown(results: Sequence[dict], *, hub: str, ks: Sequence[int] = KS) -> str:
    """A markdown table, one row per retriever: n, top-1, recall@k, NDCG@k (percent)."""
    head = ["retriever", "n", "top-1"] + [f"R@{k}" for k in ks if k > 1] + [f"NDCG@{k}" for k in ks if k > 1]
    lines = [f"Retrieval on the {hub} eval set (gold API identity; percent)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["retriever"], str(r["n"]), f"{100 * r['top1']:.1f}"]
        cells += [f"{100 * r[f'recall@{k}']:.1f}" for k in ks if k > 1]
        cells += [f"{100 * r[f'ndcg@{k}']:.1f}" for k in ks if k > 1]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def top1_agreement(a: Retriever, b: Retriever, examples: Sequence[Example]) -> dict:
    """How often two retrievers put the same API first: ``{"a", "b", "n", "agree", "rate"}``, over the
    ``n`` queries where both return one."""
    queries = [Query.of(e) for e in examples]
    pairs = [(x[0], y[0]) for x, y in zip(a.retrieve(queries, top_k=1), b.retrieve(queries, top_k=1)) if x and y]
    agree = sum(api_identity(x) == api_identity(y) for x, y in pairs)
    return {"a": a.name, "b": b.name, "n": len(pairs), "agree": agree, "rate": agree / len(pairs) if pairs else 0.0}


#: The measures drawn by :func:`retrieval_chart`, one bar group per retriever.
CHART_MEASURES = ("top1", "recall@5", "ndcg@10")


def retrieval_chart(results_by_hub: dict[str, Sequence[dict]], path) -> None:
    """Write to PNG ``path`` a bar chart of CHART_MEASURES (percent) per retriever, one panel per hub of
    ``results_by_hub`` (``{hub: [evaluate_retriever result, ...]}``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    hubs = list(results_by_hub)
    fig, axes = plt.subplots(1, len(hubs), figsize=(5.5 * len(hubs), 4.2), squeeze=False, sharey=True)
    width = 0.8 / len(CHART_MEASURES)
    for ax, hub in zip(axes[0], hubs):
        results = results_by_hub[hub]
        x = np.arange(len(results))
        for j, measure in enumerate(CHART_MEASURES):
            values = [100 * r[measure] for r in results]
            bars = ax.bar(x + (j - (len(CHART_MEASURES) - 1) / 2) * width, values, width, label=measure)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(x, [r["retriever"] for r in results], rotation=30, ha="right")
        ax.set_title(f"{hub} (n = {results[0]['n'] if results else 0})")
        ax.set_ylim(0, 105)
    axes[0][0].set_ylabel("percent of eval questions")
    axes[0][-1].legend(loc="upper right", fontsize=8)
    fig.suptitle("Retrieval quality: gold API identity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
