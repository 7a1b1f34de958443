"""BFCL cells in a report (``ratune report --bfcl NAME=DIR ...``): one row per model (or arm of
several seeds) and category from ``ratune eval bfcl`` outputs, and each model compared with the
references (the first, or ``--against``), paired by entry id (:func:`ratune.eval.compare.compare_read_bfcl_arms`),
Holm-adjusted over the categories of each pair. Each arm's verdicts are read once."""

from __future__ import annotations

import os
from pathlib import Path
from statistics import fmean, stdev
from typing import Sequence

from ratune.errors import RatuneError
from ratune.eval.bfcl import CATEGORIES
from ratune.eval.bfcl_run import finished_categories
from ratune.eval.bfcl_summary import SUMMARY_COLUMNS, summary_chart, summary_csv, summary_markdown, summary_rows
from ratune.eval.compare import BfclArm, compare_read_bfcl_arms, read_bfcl_arm
from ratune.eval.report import report_output
from ratune.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, holm, mean_bootstrap
from ratune.io import write_json, write_text
from ratune.manifest import package_versions

#: The report's CSV columns: the summary's, and the seeds behind each row.
REPORT_COLUMNS = (*SUMMARY_COLUMNS, "seeds", "accuracy_sd")


def bfcl_report(outputs: Sequence[tuple[str, str | os.PathLike]], out_dir: str | os.PathLike, *,
                against: Sequence[str] = (), resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """Write ``bfcl.{md,csv,json,png}`` into ``out_dir`` for ``(name, eval bfcl output folder)`` pairs;
    a name given several times is one arm of several seeds (its rows: means over seeds, each
    interval a bootstrap over entries of their shares of seeds right).

    Args:
        against: the names every other one is compared with (default: the first name).
    Returns:
        ``{"rows": [row per model and category], "comparisons": [{"a", "b", "category", "n",
        "contingency", "mcnemar_p", "holm_p", "difference", ...}], "versions"}``, as ``bfcl.json``.
    Raises:
        RatuneError: a folder with no complete category, seeds of one arm with different entry
            counts, an ``against`` name not given; a folder ratune did not make as ``out_dir``
            (before anything is written).
    """
    output = report_output(out_dir)
    output.check()
    arms: dict[str, list[Path]] = {}
    for name, folder in outputs:
        arms.setdefault(name, []).append(Path(folder))
    unknown = [a for a in against if a not in arms]
    if unknown:
        raise RatuneError(f"--against {', '.join(unknown)}: not a --bfcl name (given: {', '.join(arms)})")
    finished, read = {}, {}
    for name, folders in arms.items():
        finished[name] = [finished_categories(f) for f in folders]
        for folder, done in zip(folders, finished[name]):
            if not done:
                raise RatuneError(f"--bfcl {name}={folder}: no complete category; give a `ratune eval bfcl` output "
                                  "folder")
        read[name] = {}
        for category in CATEGORIES:
            if all(category in run for run in finished[name]):
                counts = sorted({run[category]["n"] for run in finished[name]})
                if len(counts) > 1:
                    raise RatuneError(f"--bfcl {name}: its seeds scored {category} on {counts} entries; give seeds "
                                      "that answered the same entries")
                read[name][category] = read_bfcl_arm([f / category for f in folders])
    rows = [row for name, runs in finished.items()
            for row in _arm_rows(name, runs, read[name], resamples=resamples, seed=seed)]
    comparisons = []
    for reference in against or [next(iter(arms))]:
        for name in arms:
            if name == reference:
                continue
            block = []
            for category in (c for c in read[name] if c in read[reference]):
                result = compare_read_bfcl_arms(read[name][category], read[reference][category],
                                                resamples=resamples, seed=seed)
                block.append({**result, "a": {**result["a"], "model": name}, "b": {**result["b"], "model": reference},
                              "category": category})
            for c, p in zip(block, holm([c["mcnemar_p"] for c in block])):
                c["holm_p"] = p
            comparisons += block
    report = {"rows": rows, "comparisons": comparisons, "versions": package_versions()}
    with output.writing() as folder:
        write_json(folder / "bfcl.json", report)
        write_text(folder / "bfcl.md", summary_markdown(rows) + comparisons_markdown(comparisons))
        write_text(folder / "bfcl.csv", summary_csv(rows, REPORT_COLUMNS))
        summary_chart(rows, folder / "bfcl.png")
    return report


def _arm_rows(name: str, runs: list[dict[str, dict]], read: dict[str, BfclArm], *, resamples: int,
             seed: int) -> list[dict]:
    """The summary rows of one arm: one run's as they are; several seeds' as means over seeds
    (``correct`` the mean count; the interval the bootstrap interval, over entries, of the mean of
    each entry's share of seeds right); ``read`` holds the arm's :class:`BfclArm` per category that
    all its seeds finished."""
    if len(runs) == 1:
        return [{**row, "model": name, "seeds": 1, "accuracy_sd": None} for row in summary_rows(runs[0])]
    rows = []
    for category, arm in read.items():
        ms = [run[category] for run in runs]
        accuracy, low, high = mean_bootstrap([share for _, share in sorted(arm.shares.items())],
                                           resamples=resamples, seed=seed)
        rows.append({"category": category, "n": ms[0]["n"], "correct": fmean(m["correct"] for m in ms),
                     "accuracy": accuracy, "accuracy_low": low, "accuracy_high": high,
                     "call_rate": fmean(m["call_rate"] for m in ms),
                     "format_adherence": fmean(m["format_adherence"] for m in ms), "model": name,
                     "bfcl_version": ms[0]["bfcl_version"], "seeds": len(ms),
                     "accuracy_sd": stdev(m["accuracy"] for m in ms)})
    return rows


def comparisons_markdown(comparisons: list[dict]) -> str:
    """The paired comparisons as a markdown table ('' when there are none)."""
    if not comparisons:
        return ""
    lines = ["", "Each model against the reference, paired by entry id: the exact McNemar test (with several seeds, "
                 "the sign test on each entry's share of seeds answered right: only A = entries where A's share is "
                 "higher), its p Holm-adjusted over the categories of the pair, and the difference in points with "
                 "its 95 % paired bootstrap interval:", "",
             "| category | A | B | n | A correct | B correct | only A | only B | p | Holm p | difference [95 % CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        t, d = c["contingency"], c["difference"]
        lines.append(f"| {c['category']} | {c['a']['model']} | {c['b']['model']} | {c['n']} | {_count(c['a'])} | "
                     f"{_count(c['b'])} | {t['only_a']} | {t['only_b']} | {c['mcnemar_p']:.3g} | {c['holm_p']:.3g} | "
                     f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
    return "\n".join(lines) + "\n"


def _count(side: dict) -> str:
    """A side's correct count: an integer, or with several seeds the mean over them."""
    return f"{side['correct_n']:.1f}" if side.get("seeds", 1) > 1 else str(side["correct_n"])


def cli_bfcl_report(args) -> int:
    """``ratune report --bfcl NAME=DIR ... [--against NAME ...] --out DIR``: write and print the BFCL
    report; returns 0."""
    outputs = []
    for spec in args.bfcl:
        name, _, folder = spec.partition("=")
        outputs.append((name, folder))
    report = bfcl_report(outputs, args.out, against=args.against or ())
    print(summary_markdown(report["rows"]) + comparisons_markdown(report["comparisons"]))
    print(f"wrote {args.out} (bfcl.md, bfcl.csv, bfcl.json, bfcl.png)")
    return 0
