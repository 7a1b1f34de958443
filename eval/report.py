"""The Table 2 report: train-time retrieval (rows) x test-time retrieval (columns).

Gorilla's Table 2 tests a model finetuned without retrieval and one finetuned with oracle
retrieval under 0-shot, BM25, GPT-Index and Oracle retrieval. ``table2.json`` is
``{"hub", "model", "metric", "cells": [{"train_retriever", "test_retriever", "n", "accuracy",
"hallucination", "error", "strict": {...}}], "versions"}``; ``table2.csv`` has one row per cell;
``table2.md`` shows accuracy (and hallucination) in percent; ``table2.png`` is a heatmap of
accuracy. A cell that did not run shows as missing ("-"), never as zero.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

from ratune.eval.run import SETTINGS

#: Row order of train-time retrieval modes.
TRAIN_ORDER = ("none", "oracle", "bm25", "dense")


def make_cell(train_retriever: str, test_retriever: str, metrics: dict) -> dict:
    """A table cell from a metrics.json object (gorilla metric in the top-level fields)."""
    strict = metrics.get("strict", {})
    return {"train_retriever": train_retriever, "test_retriever": test_retriever, "n": metrics["n"],
            "accuracy": metrics["accuracy"], "hallucination": metrics["hallucination"], "error": metrics["error"],
            "strict": {k: strict[k] for k in ("accuracy", "hallucination", "error") if k in strict}}


def _axes(cells: Sequence[dict]) -> tuple[list[str], list[str]]:
    rows = [r for r in TRAIN_ORDER if any(c["train_retriever"] == r for c in cells)]
    rows += sorted({c["train_retriever"] for c in cells} - set(rows))
    cols = [s for s in SETTINGS if any(c["test_retriever"] == s for c in cells)]
    cols += sorted({c["test_retriever"] for c in cells} - set(cols))
    return rows, cols


def table2_markdown(table: dict) -> str:
    """Markdown: one table for the gorilla metric and one for the strict metric (percent;
    accuracy with hallucination in brackets)."""
    cells = table["cells"]
    rows, cols = _axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}
    n = sorted({c["n"] for c in cells})
    out = [f"# Table 2: {table['hub']}, {table['model']}", "",
           f"Accuracy % (hallucination %) by train-time retrieval (rows) and test-time retrieval (columns); "
           f"n = {', '.join(map(str, n))} questions per cell.", ""]
    for metric, pick in (("gorilla (official)", lambda c: c), ("strict (exact API)", lambda c: c.get("strict", {}))):
        out += [f"## {metric}", "", "| train \\ test | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for r in rows:
            line = [r]
            for s in cols:
                c = index.get((r, s))
                m = pick(c) if c else None
                line.append(f"{100 * m['accuracy']:.1f} ({100 * m['hallucination']:.1f})" if m else "-")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    return "\n".join(out)


def table2_csv(table: dict) -> str:
    """CSV: one row per cell, gorilla and strict fractions in separate columns."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["hub", "model", "train_retriever", "test_retriever", "n", "accuracy", "hallucination", "error",
                     "strict_accuracy", "strict_hallucination", "strict_error"])
    for c in table["cells"]:
        s = c.get("strict", {})
        writer.writerow([table["hub"], table["model"], c["train_retriever"], c["test_retriever"], c["n"],
                         f"{c['accuracy']:.6f}", f"{c['hallucination']:.6f}", f"{c['error']:.6f}",
                         *(f"{s[k]:.6f}" if k in s else "" for k in ("accuracy", "hallucination", "error"))])
    return buf.getvalue()


def table2_heatmap(table: dict, path: str | Path) -> None:
    """Write a heatmap PNG of gorilla and strict accuracy (percent), missing cells blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = table["cells"]
    rows, cols = _axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}
    fig, axes = plt.subplots(1, 2, figsize=(2.0 + 1.3 * len(cols) * 2, 1.5 + 0.7 * len(rows)), squeeze=False)
    for ax, (title, pick) in zip(axes[0], (("gorilla accuracy %", lambda c: c),
                                           ("strict accuracy %", lambda c: c.get("strict") or None))):
        grid = np.full((len(rows), len(cols)), np.nan)
        for i, r in enumerate(rows):
            for j, s in enumerate(cols):
                c = index.get((r, s))
                m = pick(c) if c else None
                if m:
                    grid[i, j] = 100 * m["accuracy"]
        ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=100, cmap="viridis")
        for i in range(len(rows)):
            for j in range(len(cols)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center",
                            color="white" if grid[i, j] < 60 else "black")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("test-time retrieval")
        ax.set_ylabel("train-time retrieval")
        ax.set_title(title)
    fig.suptitle(f"Table 2 - {table['hub']} - {table['model']}")
    fig.tight_layout()
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_table2(cells: Sequence[dict], *, hub: str, model: str, out_dir: str | Path) -> dict:
    """Write table2.{json,csv,md,png} into ``out_dir`` and return the table object."""
    from ratune.io import write_json, write_text
    from ratune.manifest import package_versions

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = {"hub": hub, "model": model, "metric": "gorilla", "cells": list(cells), "versions": package_versions()}
    write_json(out / "table2.json", table)
    write_text(out / "table2.csv", table2_csv(table))
    write_text(out / "table2.md", table2_markdown(table))
    table2_heatmap(table, out / "table2.png")
    return table
