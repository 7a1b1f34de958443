"""The summary table of BFCL categories (``ratune eval bfcl``'s summary.*, ``ratune report --bfcl``'s
bfcl.*): rows, markdown, CSV and the bar chart."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

from ratune.eval.bfcl import BFCL_MODEL
from ratune.eval.report import format_replicates
from ratune.io import atomic_write

#: Columns of summary.csv, in order.
SUMMARY_COLUMNS = ("category", "n", "correct", "accuracy", "accuracy_low", "accuracy_high", "call_rate",
                   "format_adherence", "model", "bfcl_version")


def summary_rows(finished: dict[str, dict]) -> list[dict]:
    """One row of :data:`SUMMARY_COLUMNS` per finished category."""
    return [{"category": c, "n": m["n"], "correct": m["correct"], "accuracy": m["accuracy"],
             "accuracy_low": m["accuracy_ci"][0], "accuracy_high": m["accuracy_ci"][1], "call_rate": m["call_rate"],
             "format_adherence": m["format_adherence"], "model": m["model"], "bfcl_version": m["bfcl_version"]}
            for c, m in finished.items()]


def summary_markdown(rows: list[dict]) -> str:
    """The summary table (percentages, one decimal)."""
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    def accuracy(r: dict) -> str:
        seeds = r.get("seeds", 1)
        return pct(r["accuracy"]) if seeds == 1 else format_replicates(r["accuracy"], r["accuracy_sd"], seeds)

    lines = ["| category | model | n | accuracy % | 95 % interval | call rate % | format adherence % |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['category']} | {r['model']} | {r['n']} | {accuracy(r)} | {pct(r['accuracy_low'])}-"
              f"{pct(r['accuracy_high'])} | {pct(r['call_rate'])} | {pct(r['format_adherence'])} |" for r in rows]
    versions = sorted({r["bfcl_version"] for r in rows})
    seeds = ("; a model of several seeds: the mean over seeds ±sd, its interval the 95 % bootstrap interval over "
             "entries of each entry's share of seeds right, call rate and format adherence averaged"
             if any(r.get("seeds", 1) > 1 for r in rows) else "")
    return (f"BFCL (bfcl-eval {', '.join(versions)}, checker model key {BFCL_MODEL}), scored by BFCL's own checker; "
            f"accuracy with its 95 % Wilson interval{seeds}.\n\n" + "\n".join(lines) + "\n")


def summary_csv(rows: list[dict], columns: Sequence[str] = SUMMARY_COLUMNS) -> str:
    """The summary rows as CSV text (``columns``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def summary_chart(rows: list[dict], path: Path) -> None:
    """A bar per row (a category of a model) with its 95 % interval, grouped by category, one colour
    per model, written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = list(dict.fromkeys(r["category"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(categories) * max(1, len(models) / 2), 3.5))
    for k, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        x = [categories.index(r["category"]) + (k - (len(models) - 1) / 2) * width for r in mine]
        heights = [100 * r["accuracy"] for r in mine]
        errors = [[h - 100 * r["accuracy_low"] for h, r in zip(heights, mine)],
                  [100 * r["accuracy_high"] - h for h, r in zip(heights, mine)]]
        ax.bar(x, heights, width=width, yerr=errors, capsize=3, label=model)
    ax.set_xticks(range(len(categories)), categories, rotation=45, ha="right")
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy % (95 % Wilson interval)")
    ax.set_title(f"BFCL - {', '.join(models)}")
    if len(models) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
