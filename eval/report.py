"""The Table 2 report: train-time retrieval (rows) x test-time retrieval (columns). Files and
fields: docs/pipeline.md#report; a catalog's table: docs/catalogs.md; seed replicates:
docs/sweeps.md#seeds-and-chosen-pairs.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

from ratune.errors import InputError
from ratune.eval.stats import wilson_interval
from ratune.io import atomic_write, read_json_object, write_json, write_text
from ratune.manifest import REPORT_STAGE, package_versions
from ratune.output import StageOutput
from ratune.registry import TABLE_SETTINGS, TRAIN_MODES



def report_output(out_dir: str | Path, *, inside_ratune_folder: bool = False) -> StageOutput:
    """The report folder ``out_dir`` as a :class:`ratune.output.StageOutput`;
    ``inside_ratune_folder``: it is the default ``report/`` of a ratune sweep or demo folder."""
    return StageOutput(out_dir, REPORT_STAGE, known=inside_ratune_folder)


#: The reported fractions, with the count field each is computed from.
RATES = (("accuracy", "correct_n"), ("hallucination", "hallucination_n"), ("error", "error_n"))

#: What the ``*_ci`` fields are (recorded in table2.json and printed under table2.md).
INTERVAL = "95 % Wilson score interval"


def _counts_from_per_question(per_question: list, metric: str) -> dict | None:
    outcomes = [q.get(metric) for q in per_question if isinstance(q, dict)]
    if not outcomes or any(o not in ("correct", "hallucination", "error") for o in outcomes):
        return None
    return {f"{o}_n": outcomes.count(o) for o in ("correct", "hallucination", "error")}


def _block(fractions: dict, counts: dict | None, n: int) -> dict:
    """Fractions, counts and Wilson intervals of one metric. Counts missing from ``counts`` are
    recovered as round(fraction * n) (the fractions are k / n, so this is exact)."""
    out = {}
    for rate, count in RATES:
        if rate not in fractions and not (counts and count in counts):
            continue
        k = counts.get(count) if counts else None
        if k is None:
            k = round(fractions[rate] * n)
        k = int(k)
        out[rate] = fractions[rate] if rate in fractions else (k / n if n else 0.0)
        out[f"{rate}_ci"] = list(wilson_interval(k, n))
        out[count] = k
    return out


#: Keys every eval cell's metrics.json has (what :func:`make_cell` reads).
METRICS_KEYS = ("n", "accuracy", "hallucination", "error")


def read_metrics(path: str | Path) -> dict:
    """An eval cell's ``metrics.json``, checked to hold :data:`METRICS_KEYS` and sound numbers (rates
    in [0, 1], counts and ``per_question`` at most ``n``).

    Raises:
        InputError: naming the file and the field: not JSON (a torn write), not an object, not a
            metrics file, or a number out of place (a hand-edited file).
    """
    metrics = read_json_object(path)
    for key in METRICS_KEYS:
        if key not in metrics:
            raise InputError(str(path), None, key, "missing: not an eval cell's metrics (delete the cell's folder "
                             "to evaluate it again)")
    n = metrics["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(str(path), None, "n", f"expected the number of questions (an integer >= 0), got {n!r}")
    _check_rates(path, metrics, "", n)
    for name in METRIC_TITLES:
        block = metrics.get(name)
        if block is not None and not isinstance(block, dict):
            raise InputError(str(path), None, name,
                             f"expected an object of rates and counts, got {type(block).__name__}")
        _check_rates(path, block or {}, f"{name}.", n)
    per_question = metrics.get("per_question")
    if isinstance(per_question, list) and len(per_question) > n:
        raise InputError(str(path), None, "per_question", f"{len(per_question)} entries for n = {n} questions")
    return metrics


def _check_rates(path, block: dict, prefix: str, n: int) -> None:
    """Refuse a rate of ``block`` that is not a fraction in [0, 1] or a count not in 0..n."""
    for rate, count in RATES:
        value = block.get(rate, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise InputError(str(path), None, prefix + rate, f"expected a fraction in [0, 1], got {value!r}")
        k = block.get(count, 0)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
            raise InputError(str(path), None, prefix + count, f"expected a count from 0 to n = {n}, got {k!r}")


def make_cell(train_retriever: str, test_retriever: str, metrics: dict) -> dict:
    """A table cell (fields: docs/pipeline.md#report) from a metrics.json object of
    :mod:`ratune.eval.run`. Counts come from the ``gorilla`` / ``strict`` blocks, else from
    ``per_question``, else from fraction * n. A catalog's cell (``"metric": "strict"``) gets no
    gorilla rates, and keeps its ``"arguments"``.
    """
    n = int(metrics["n"])
    per_question = metrics.get("per_question") or []
    cell = {"train_retriever": train_retriever, "test_retriever": test_retriever, "n": n}
    if metrics.get("metric", "gorilla") == "gorilla":
        gorilla_counts = metrics.get("gorilla") or _counts_from_per_question(per_question, "gorilla")
        cell.update(_block({k: metrics[k] for k in ("accuracy", "hallucination", "error")}, gorilla_counts, n))
    if isinstance(metrics.get("arguments"), dict):
        cell["arguments"] = metrics["arguments"]
    strict = metrics.get("strict") or {}
    strict_counts = strict if "correct_n" in strict else _counts_from_per_question(per_question, "strict")
    cell["strict"] = _block({k: strict[k] for k in ("accuracy", "hallucination", "error") if k in strict},
                            strict_counts, n)
    if metrics.get("split", "eval") != "eval":  # validation questions (ratune eval run --split validation)
        cell["split"] = metrics["split"]
    return cell


#: What the spread of a replicate cell is (recorded in table2.json's ``"replicates"``).
SPREAD = "sample standard deviation (n - 1 denominator) and min-max of the per-seed fractions"

#: Decoding of the eval (recorded with replicates): nothing random at generation time.
GENERATION = "greedy (do_sample=False): no sampling seed; the seeds vary training only"


def _seed_order(seed) -> tuple:
    return (0, seed, "") if isinstance(seed, (int, float)) and not isinstance(seed, bool) else (1, 0, str(seed))


def _spread_block(blocks: Sequence[dict]) -> dict:
    """Mean, spread and per-run values of each rate present in every block (else left out)."""
    import statistics

    out: dict = {}
    for rate, _ in RATES:
        if not blocks or not all(rate in b for b in blocks):
            continue
        values = [float(b[rate]) for b in blocks]
        out[rate] = statistics.fmean(values)
        out[f"{rate}_ci"] = None
        out[f"{rate}_sd"] = statistics.stdev(values) if len(values) > 1 else None
        out[f"{rate}_min"] = min(values)
        out[f"{rate}_max"] = max(values)
        out[f"{rate}_runs"] = values
        out[f"{rate}_run_ci"] = [b.get(f"{rate}_ci") for b in blocks]
    return out


def aggregate_replicates(runs: Sequence[dict], seeds: Sequence) -> dict:
    """One table cell from replicate runs (cells of :func:`make_cell` that differ only in seed;
    fields: docs/sweeps.md#seeds-and-chosen-pairs). ``n`` is the smallest run's; a rate missing
    from any run is left out.

    Raises:
        ValueError: no runs, runs and seeds of different lengths, or runs of different
            (train_retriever, test_retriever).
    """
    if not runs or len(runs) != len(seeds):
        raise ValueError(f"need one seed per run; got {len(runs)} runs and {len(seeds)} seeds")
    pairs = sorted(zip(seeds, [with_intervals(r) for r in runs]), key=lambda p: _seed_order(p[0]))
    seeds = [s for s, _ in pairs]
    runs = [r for _, r in pairs]
    where = {(r["train_retriever"], r["test_retriever"]) for r in runs}
    if len(where) > 1:
        raise ValueError(f"replicates must share train and test retrieval; got {sorted(where)}")
    ns = [int(r["n"]) for r in runs]
    cell = {"train_retriever": runs[0]["train_retriever"], "test_retriever": runs[0]["test_retriever"],
            "n": min(ns), "n_runs": ns, "seeds": seeds, "n_seeds": len(runs)}
    cell.update(_spread_block(runs))
    cell["strict"] = _spread_block([r.get("strict") or {} for r in runs])
    return cell


def format_replicates(value: float, sd: float | None, n_seeds: int) -> str:
    """``51.3 ±4.2 sd (3 seeds)``: the mean over seeds in percent (one decimal), the sample
    standard deviation across seeds in points (left out for one seed), and the number of seeds."""
    text = f"{100 * value:.1f}"
    if sd is not None:
        text += f" ±{100 * sd:.1f} sd"
    return text + f" ({n_seeds} seed{'' if n_seeds == 1 else 's'})"


def with_intervals(cell: dict) -> dict:
    """A cell with interval fields filled in where missing (hand-made or older cells)."""
    n = int(cell["n"])
    out = dict(cell)
    for rate, count in RATES:
        if rate in out and f"{rate}_ci" not in out:
            k = int(out.get(count, round(out[rate] * n)))
            out[f"{rate}_ci"] = list(wilson_interval(k, n))
    strict = out.get("strict")
    if strict:
        out["strict"] = with_intervals({**strict, "n": n})
        out["strict"].pop("n")
    return out


def table_axes(cells: Sequence[dict]) -> tuple[list[str], list[str]]:
    """Rows and columns in registry order (ratune/registry.py), then any other name (mixtures) sorted."""
    rows = [r for r in TRAIN_MODES if any(c["train_retriever"] == r for c in cells)]
    rows += sorted({c["train_retriever"] for c in cells} - set(rows))
    cols = [s for s in TABLE_SETTINGS if any(c["test_retriever"] == s for c in cells)]
    cols += sorted({c["test_retriever"] for c in cells} - set(cols))
    return rows, cols


def has_result(cell: dict | None) -> bool:
    """Whether a table cell holds a result: it exists and scored at least one question (a cell
    of n = 0 has no rate; it shows as missing, never as 0.0)."""
    return bool(cell) and int(cell.get("n", 0)) > 0


def format_rate(value: float, ci: Sequence[float] | None = None) -> str:
    """``73.3 [61-83]``: a fraction in percent (one decimal) with its interval in whole percent."""
    text = f"{100 * value:.1f}"
    if ci:
        text += f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}]"
    return text


def _metric_tables(cells: list[dict], accuracy_text) -> list[str]:
    """Markdown lines of the gorilla and strict tables (rows: train retrieval, columns: test
    retrieval). ``accuracy_text(cell, metric_block)`` renders the accuracy; the hallucination %
    follows it, and a cell that did not run is "-"."""
    rows, cols = table_axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}
    out = []
    for name in cell_metrics(cells):
        out += [f"## {METRIC_TITLES[name]}", "", "| train \\ test | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for r in rows:
            line = [r]
            for s in cols:
                c = index.get((r, s))
                m = metric_block(c, name) if has_result(c) else None
                if m and "accuracy" in m:
                    text = accuracy_text(c, m)
                    if "hallucination" in m:
                        text += f" (h {100 * m['hallucination']:.1f})"
                    line.append(text)
                else:
                    line.append("-")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    return out


#: The metrics a table cell can hold, headline first, with their table titles.
METRIC_TITLES = {"gorilla": "gorilla (official)", "strict": "strict (exact API)"}


def metric_block(cell: dict | None, metric: str) -> dict:
    """A cell's block of one metric (``accuracy``, counts, intervals): ``gorilla`` its top-level
    rates, ``strict`` its ``"strict"`` block; {} when the cell has none (no cell, or a catalog's
    cell and ``gorilla``).

    Raises:
        KeyError: ``metric`` is not one of :data:`METRIC_TITLES` (the message lists them).
    """
    if metric not in METRIC_TITLES:
        raise KeyError(f"unknown metric {metric!r}: expected one of {', '.join(METRIC_TITLES)}")
    if not cell:
        return {}
    if metric == "gorilla":
        return cell if "accuracy" in cell else {}
    return cell.get("strict") or {}


def cell_metrics(cells: Sequence[dict]) -> tuple[str, ...]:
    """The metrics some scored cell holds, headline first; the strict metric alone when none holds
    either."""
    present = tuple(m for m in METRIC_TITLES if any(has_result(c) and "accuracy" in metric_block(c, m) for c in cells))
    return present or ("strict",)


def headline_metric(cells: Sequence[dict]) -> str:
    """The metric a choice among ``cells`` is made by (the best cell to export, a model card's
    table): the gorilla metric when every cell holds it (APIBench), else the strict one."""
    return "gorilla" if cells and all("accuracy" in metric_block(c, "gorilla") for c in cells) else "strict"


def _arguments_table(cells: Sequence[dict]) -> list[str]:
    """Markdown lines of the argument score table of a catalog's cells (``required %`` / ``values %``
    of all n answers: :mod:`ratune.eval.catalog_scorer`); [] when no cell has one."""
    if not any(has_result(c) and c.get("arguments") for c in cells):
        return []
    rows, cols = table_axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}
    out = ["## arguments (right API with every required argument / with the gold call's values)", "",
           "| train \\ test | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        line = [r]
        for s in cols:
            a = (index.get((r, s)) or {}).get("arguments")
            line.append(f"{100 * a['required_present']:.1f} / {100 * a['values_equal']:.1f}"
                        if has_result(index.get((r, s))) and a else "-")
        out.append("| " + " | ".join(line) + " |")
    return out + [""]


def table2_markdown(table: dict) -> str:
    """Markdown: one table per metric, cells as ``73.3 [61-83] (h 10.0)``; "-" for a cell that did
    not run or has n = 0."""
    cells = [with_intervals(c) for c in table["cells"]]
    if any("n_seeds" in c for c in cells):
        return _replicates_markdown(table, cells)
    n = sorted({c["n"] for c in cells if has_result(c)})
    splits = sorted({c["split"] for c in cells if "split" in c})
    questions = (f"{' and '.join(splits)} questions (held out of training, not the test questions)" if splits
                 else "questions")
    out = [f"# Table 2: {table['hub']}, {table['model']}", "",
           f"Accuracy % [95 % interval] (h hallucination %) by train-time retrieval (rows) and test-time "
           f"retrieval (columns); n = {', '.join(map(str, n))} {questions} per cell.", ""]
    out += _metric_tables(cells, lambda c, m: format_rate(m["accuracy"], m.get("accuracy_ci")))
    out += _arguments_table(cells)
    out += _chosen_table(table.get("chosen") or {}, cells)
    out += [f"Intervals in brackets are {INTERVAL}s for the accuracy (whole percent; Wilson 1927). "
            "Two cells whose intervals overlap may still differ: compare them on the same questions "
            "with `ratune compare` (paired exact McNemar test and bootstrap interval of the difference).", ""]
    return "\n".join(out)


def selection_counts(block: dict) -> str:
    """One side of a chosen checkpoint's counts, ``{setting: {"n", "strict", "gorilla"?, "by_answer"?}}``,
    as ``oracle 131/217 (calls 22/96, [] 109/121); ...``: the strict count of n, then the gorilla
    count where the hub has one, or a tool set's calling and ``[]`` rows apart
    (:func:`ratune.eval.curve.curve_row`'s ``by_answer``)."""
    def detail(c: dict) -> str:
        if c.get("gorilla") is not None:
            return f" (gorilla {c['gorilla']})"
        if "by_answer" in c:
            calls, none = c["by_answer"]["call"], c["by_answer"]["no_call"]
            return f" (calls {calls['correct_n']}/{calls['n']}, [] {none['correct_n']}/{none['n']})"
        return ""

    return "; ".join(f"{s} {c['strict']}/{c['n']}{detail(c)}" for s, c in block.items())


def _chosen_table(chosen: dict, cells: list[dict]) -> list[str]:
    """Markdown lines of the rows' checkpoints chosen on validation (``chosen``: row -> the
    selection record of ``ratune eval select``, with ``validation`` counts), their validation counts
    beside the row's test counts; [] when nothing was chosen."""
    if not chosen:
        return []
    rows, cols = table_axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}

    out = ["## checkpoints chosen on validation", "",
           "Each row is the checkpoint its rule chose on the validation questions; the test questions were read "
           "once, for it. Correct answers of n, strict metric (gorilla where the hub has it).", "",
           "| train | rule | step | epoch | validation | test |", "|---|---|---|---|---|---|"]
    for r in (r for r in rows if r in chosen):
        c = chosen[r]
        test = {s: {"strict": cell["strict"]["correct_n"], "n": cell["n"],
                    **({"gorilla": cell["correct_n"]} if "correct_n" in cell else {})}
                for s in cols if has_result(cell := index.get((r, s))) and "correct_n" in cell.get("strict", {})}
        epoch = "" if c.get("epoch") is None else f"{c['epoch']:g}"
        out.append(f"| {r} | {c['rule']} ({c['metric']}) | {c['step']} | {epoch} | {selection_counts(c['validation'])} "
                   f"| {selection_counts(test)} |")
    return out + [""]


def _replicates_markdown(table: dict, cells: list[dict]) -> str:
    """table2_markdown of a table whose cells aggregate seeds: ``51.3 ±4.2 sd (3 seeds) (h 10.0)``."""
    n = sorted({k for c in cells for k in c.get("n_runs", [c["n"]])})
    seeds = (table.get("replicates") or {}).get("seeds") or sorted(
        {s for c in cells for s in c.get("seeds", [])}, key=_seed_order)
    out = [f"# Table 2: {table['hub']}, {table['model']}", "",
           f"Mean accuracy % over seeds ±sample standard deviation across seeds (number of seeds) "
           f"(h mean hallucination %) by train-time retrieval (rows) and test-time retrieval (columns); "
           f"n = {', '.join(map(str, n))} questions per run; seeds {', '.join(map(str, seeds))}.", ""]
    half = []

    def cell_text(c: dict, m: dict) -> str:
        if "n_seeds" not in c:
            return format_rate(m["accuracy"], m.get("accuracy_ci"))
        half.extend((ci[1] - ci[0]) / 2 for ci in m.get("accuracy_run_ci") or [] if ci)
        return format_replicates(m["accuracy"], m.get("accuracy_sd"), c["n_seeds"])

    out += _metric_tables(cells, cell_text)
    widest = f" (widest here: ±{100 * max(half):.1f} points)" if half else ""
    out += [f"Each run's own accuracy has a {INTERVAL}{widest}: listed per seed in table2.json "
            "(`accuracy_run_ci`) and replicates.csv. A spread across seeds well inside the per-run interval "
            f"means the seed matters less than the question sample. Generation is {GENERATION}.", ""]
    return "\n".join(out)


#: CSV columns per metric: each fraction followed by its interval bounds.
_CSV_RATE_COLUMNS = tuple(x for rate, _ in RATES for x in (rate, f"{rate}_low", f"{rate}_high"))


def _csv_values(m: dict) -> list[str]:
    values = []
    for rate, _ in RATES:
        ci = m.get(f"{rate}_ci")
        values.append(f"{m[rate]:.6f}" if rate in m else "")
        values += [f"{ci[0]:.6f}", f"{ci[1]:.6f}"] if ci else ["", ""]
    return values


def table2_csv(table: dict) -> str:
    """CSV: one row per cell, each fraction followed by its interval bounds (columns:
    docs/pipeline.md#report; replicate tables: docs/sweeps.md#seeds-and-chosen-pairs)."""
    replicate = any("n_seeds" in c for c in table["cells"])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["hub", "model", "train_retriever", "test_retriever", "n", *_CSV_RATE_COLUMNS,
                     *(f"strict_{c}" for c in _CSV_RATE_COLUMNS)]
                    + (["n_seeds", "seeds", *_CSV_SPREAD_COLUMNS, *(f"strict_{c}" for c in _CSV_SPREAD_COLUMNS)]
                       if replicate else []))
    for c in table["cells"]:
        c = with_intervals(c)
        empty = not has_result(c)  # n = 0: no rates (blank), never 0.0
        row = [table["hub"], table["model"], c["train_retriever"], c["test_retriever"], c["n"],
               *_csv_values({} if empty else c), *_csv_values({} if empty else c.get("strict") or {})]
        if replicate:
            row += [c.get("n_seeds", 1), " ".join(map(str, c.get("seeds", []))),
                    *_csv_spread(c), *_csv_spread(c.get("strict") or {})]
        writer.writerow(row)
    return buf.getvalue()


#: Extra CSV columns per metric of a replicate table: spread across seeds.
_CSV_SPREAD_COLUMNS = tuple(x for rate, _ in RATES for x in (f"{rate}_sd", f"{rate}_min", f"{rate}_max"))


def _csv_spread(m: dict) -> list[str]:
    return [f"{m[k]:.6f}" if m.get(k) is not None else "" for k in
            (x for rate, _ in RATES for x in (f"{rate}_sd", f"{rate}_min", f"{rate}_max"))]


def table2_heatmap(table: dict, path: str | Path) -> None:
    """Write a heatmap PNG of gorilla and strict accuracy (percent), missing cells blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = table["cells"]
    rows, cols = table_axes(cells)
    index = {(c["train_retriever"], c["test_retriever"]): c for c in cells}
    panels = [(f"{name} accuracy %", name) for name in cell_metrics(cells)]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.0 + 1.3 * len(cols) * len(panels), 1.5 + 0.7 * len(rows)),
                             squeeze=False)
    for ax, (title, name) in zip(axes[0], panels):
        grid = np.full((len(rows), len(cols)), np.nan)
        for i, r in enumerate(rows):
            for j, s in enumerate(cols):
                c = index.get((r, s))
                m = metric_block(c, name) if has_result(c) else None
                if m and "accuracy" in m:
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
    with atomic_write(path, "wb") as fh:  # a unique temporary name, never a fixed one beside the user's files
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


def write_table2(cells: Sequence[dict], *, hub: str, model: str, out_dir: str | Path,
                 replicates: dict | None = None, chosen: dict | None = None) -> dict:
    """Write table2.{json,csv,md,png} into ``out_dir`` and return the table object; ``replicates``
    and ``chosen`` (row -> its checkpoint chosen on validation) are stored as its fields."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = {"hub": hub, "model": model, "metric": cell_metrics(cells)[0], "interval": INTERVAL,
             "cells": [with_intervals(c) for c in cells], "versions": package_versions()}
    if replicates is not None:
        table["replicates"] = replicates
    if chosen:
        table["chosen"] = chosen
    write_json(out / "table2.json", table)
    write_text(out / "table2.csv", table2_csv(table))
    write_text(out / "table2.md", table2_markdown(table))
    table2_heatmap(table, out / "table2.png")
    return table
