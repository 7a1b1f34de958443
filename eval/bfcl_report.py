"""BFCL cells in a report (``ratune report --bfcl NAME=DIR ...``): one row per model and category
from ``ratune eval bfcl`` outputs, and each model after the first compared with the first,
paired by entry id (:func:`ratune.eval.compare.compare_bfcl_cells`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ratune.errors import RatuneError
from ratune.eval.bfcl import CATEGORIES
from ratune.eval.bfcl_run import finished_categories, summary_chart, summary_csv, summary_markdown, summary_rows
from ratune.eval.compare import compare_bfcl_cells
from ratune.eval.report import report_output
from ratune.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from ratune.io import write_json, write_text
from ratune.manifest import package_versions


def bfcl_report(outputs: Sequence[tuple[str, str | os.PathLike]], out_dir: str | os.PathLike, *,
                resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """Write ``bfcl.{md,csv,json,png}`` into ``out_dir`` for ``(name, eval bfcl output folder)`` pairs.

    Returns:
        ``{"rows": [summary row per model and category], "comparisons": [{"a", "b", "category",
        "n", "contingency", "mcnemar_p", "difference", ...}], "versions"}``, as ``bfcl.json``.
    Raises:
        RatuneError: a repeated name, a folder with no complete category; a folder ratune did not make
            as ``out_dir`` (before anything is written).
    """
    output = report_output(out_dir)
    output.check()
    names = [name for name, _ in outputs]
    if len(set(names)) != len(names):
        raise RatuneError(f"--bfcl: each name once (got {', '.join(names)})")
    rows, finished = [], {}
    for name, folder in outputs:
        finished[name] = finished_categories(folder)
        if not finished[name]:
            raise RatuneError(f"--bfcl {name}={folder}: no complete category; give a `ratune eval bfcl` output folder")
        rows += [{**row, "model": name} for row in summary_rows(finished[name])]
    comparisons = []
    (first, base), others = outputs[0], outputs[1:]
    for name, folder in others:
        for category in CATEGORIES:
            if category in finished[first] and category in finished[name]:
                result = compare_bfcl_cells(Path(folder) / category, Path(base) / category, resamples=resamples,
                                            seed=seed)
                comparisons.append({**result, "a": {**result["a"], "model": name},
                                    "b": {**result["b"], "model": first}, "category": category})
    report = {"rows": rows, "comparisons": comparisons, "versions": package_versions()}
    with output.writing() as folder:
        write_json(folder / "bfcl.json", report)
        write_text(folder / "bfcl.md", summary_markdown(rows) + comparisons_markdown(comparisons))
        write_text(folder / "bfcl.csv", summary_csv(rows))
        summary_chart(rows, folder / "bfcl.png")
    return report


def comparisons_markdown(comparisons: list[dict]) -> str:
    """The paired comparisons as a markdown table ('' when there are none)."""
    if not comparisons:
        return ""
    lines = ["", "Each model against the first, paired by entry id (exact McNemar test; difference in points with "
                 "its 95 % paired bootstrap interval):", "",
             "| category | A | B | n | A correct | B correct | only A | only B | McNemar p | difference [95 % CI] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        t, d = c["contingency"], c["difference"]
        lines.append(f"| {c['category']} | {c['a']['model']} | {c['b']['model']} | {c['n']} | {c['a']['correct_n']} | "
                     f"{c['b']['correct_n']} | {t['only_a']} | {t['only_b']} | {c['mcnemar_p']:.3g} | "
                     f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
    return "\n".join(lines) + "\n"


def cli_bfcl_report(args) -> int:
    """``ratune report --bfcl NAME=DIR ... --out DIR``: write and print the BFCL report; returns 0."""
    outputs = []
    for spec in args.bfcl:
        name, _, folder = spec.partition("=")
        outputs.append((name, folder))
    report = bfcl_report(outputs, args.out)
    print(summary_markdown(report["rows"]) + comparisons_markdown(report["comparisons"]))
    print(f"wrote {args.out} (bfcl.md, bfcl.csv, bfcl.json, bfcl.png)")
    return 0
