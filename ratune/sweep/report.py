"""The report of a sweep folder (``ratune report SWEEP_DIR``): Table 2 per hub, sweep.csv, replicates,
learning curves, chosen-pair comparisons and the best cell to export."""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratune.sources.apibench import resolve_apibench_dir
from ratune.hubs import recorded_hub_kind
from ratune.errors import RatuneError
from ratune.eval.compare import released_comparisons, released_markdown
from ratune.eval.report import (GENERATION, INTERVAL, SPREAD, aggregate_replicates, headline_metric, make_cell,
                                metric_block, report_output, selection_counts, table2_markdown, write_table2)
from ratune.eval.results import finished_cells
from ratune.eval.robustness import worst_case, worst_case_markdown
from ratune.io import read_json_object, sha256_file, write_json, write_text
from ratune.manifest import SWEEP_FOLDER_STAGES, output_stage
from ratune.registry import EXPERIMENT_SETTINGS, TABLE_SETTINGS, TEST_SETTINGS
from ratune.sweep.cells import _slug_value, cell_hub_name
from ratune.sweep.commands import _fmt
from ratune.sweep.pairs import ComparePair, compare_pairs, comparisons_csv_rows, comparisons_markdown, parse_selector
from ratune.sweep.schema import load_saved_sweep
from ratune.sweep.state import _read_cell_record


def _flat(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def report_sweep(sweep_dir: str | Path, out_dir: str | Path | None = None,
                 pairs: list[ComparePair] | None = None) -> dict[str, dict]:
    """Write the report of a sweep folder into ``out_dir`` (default SWEEP_DIR/report): Table 2 per hub
    and per value of the other axes, seeds aggregated, and the files of docs/sweeps.md#the-report;
    ``pairs`` default to the ``compare`` list of ``SWEEP_DIR/sweep.yaml``. Returns ``{group: table}``.

    Raises:
        RatuneError: no sweep folder, or neither a finished eval cell nor a finished BFCL category;
            ``out_dir`` a folder ratune did not make; a saved sweep.yaml that does not validate; a chosen pair naming an unknown dimension or matching several cells; an
            ``apibench`` folder the sweep file names that does not exist (after the tables are written).
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise RatuneError(f"{sweep_dir}: no such sweep folder")
    from ratune.eval.bfcl_run import finished_categories

    found = _finished(sweep_dir)
    if not found.rows and not any(finished_categories(d) for d in (sweep_dir / "cells").glob("*/bfcl")):
        raise RatuneError(f"{sweep_dir}: no finished eval cells (cells/*/eval/*/.complete) or BFCL categories "
                          "(cells/*/bfcl/*/.complete) to report")
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    # the default report/ of a ratune sweep (or demo) folder is ratune's, whatever an interrupted report left
    output = report_output(out, inside_ratune_folder=out_dir is None and output_stage(sweep_dir) in SWEEP_FOLDER_STAGES)
    with output.writing():
        return _write_report(sweep_dir, found, out, pairs)


def _write_report(sweep_dir: Path, found: "_Finished", out: Path, pairs: list[ComparePair] | None) -> dict[str, dict]:
    """The report of :func:`report_sweep` (its checks done), written into ``out``; returns the tables."""
    groups, replicate = _groups(found.rows)
    selections = _selections(sweep_dir, found)
    chosen = {} if replicate else _chosen_by_table(selections)
    tables = {name: write_table2(g["cells"], hub=g["hub"], model=g["model"], out_dir=out / name,
                                 **({"replicates": _replicates_info(g["seeds"])} if replicate else {}),
                                 chosen=chosen.get(name))
              for name, g in sorted(groups.items())}
    summary: dict = {"axes": found.axis_keys, "tables": tables}
    if found.rows:  # a sweep tested on BFCL alone has no Table 2 rows
        _write_sweep_csv(found, out, summary, replicate)
    curve_paths = sorted((sweep_dir / "cells").glob("*/curve/curve.json"))
    summary["sources"] = {str(path.relative_to(sweep_dir)): sha256_file(path)
                          for path in [*(f["metrics_path"] for f in found.finished), *found.experiment_paths,
                                       *curve_paths]}
    _write_curves(curve_paths, out, summary)
    _write_selections(selections, out, summary)
    summary["worst_case"] = {}
    for name, table in tables.items():
        summary["worst_case"][name] = worst_case(table["cells"])
        write_text(out / name / "worst_case.md", worst_case_markdown(summary["worst_case"][name]))
    if not replicate:
        summary["best"], summary["no_best"] = best_cells(sweep_dir, found.rows, lambda r: _group_of(r, False))
    _write_experiments(found, out, summary)
    saved = load_saved_sweep(sweep_dir)
    _write_comparisons(found.finished, saved.config.compare if pairs is None and saved else pairs or [], out, summary)
    _write_released(sweep_dir, found.finished, saved, out, summary)
    _write_bfcl(sweep_dir, out, summary)
    write_json(out / "sweep.json", summary)
    return tables


def _write_bfcl(sweep_dir: Path, out: Path, summary: dict) -> None:
    """``out/bfcl/bfcl.*`` over the cells with complete BFCL categories; ``summary["bfcl"]`` names them."""
    from ratune.eval.bfcl_report import bfcl_report
    from ratune.eval.bfcl_run import finished_categories

    cells = [(d.name, d / "bfcl") for d in sorted((sweep_dir / "cells").glob("*/")) if finished_categories(d / "bfcl")]
    if cells:
        bfcl_report(cells, out / "bfcl")
        summary["bfcl"] = {"cells": [name for name, _ in cells], "report": "bfcl/bfcl.md"}


@dataclass
class _Finished:
    """The finished eval cells of a sweep folder, as :func:`_finished` reads them."""

    rows: list = field(default_factory=list)  # (cell record, Table 2 cell)
    finished: list = field(default_factory=list)  # dimensions and metrics.json of each (chosen pairs, released)
    experiments: list = field(default_factory=list)  # experiment settings: beside Table 2, never in it
    experiment_paths: list = field(default_factory=list)  # their metrics.json files (sweep.json sources)
    abstention_by_cell: dict = field(default_factory=dict)  # abstaining under oracle, where the document answers
    axis_keys: list = field(default_factory=list)


def _finished(sweep_dir: Path) -> _Finished:
    """Every finished eval cell of ``SWEEP_DIR/cells/*/eval``, Table 2's settings first in registry order."""
    found = _Finished()
    order = {s: i for i, s in enumerate(TABLE_SETTINGS)}
    for cell_json in sorted((sweep_dir / "cells").glob("*/cell.json")):
        record = _read_cell_record(cell_json)
        found.axis_keys += [k for k in record.get("axes", {}) if k not in found.axis_keys]
        config = record["config"]
        for cell in sorted(finished_cells(cell_json.parent / "eval"),
                           key=lambda c: (order.get(c.setting, len(order)), c.setting)):
            setting, metrics = cell.setting, cell.metrics
            if setting in EXPERIMENT_SETTINGS:
                found.experiments.append({"cell": record["name"], "axes": record.get("axes", {}), "setting": setting,
                                          "train_retriever": config["train_retriever"], "metrics": metrics})
                found.experiment_paths.append(cell.metrics_path)
                continue
            if setting == "oracle" and metrics.get("abstention"):
                found.abstention_by_cell[record["name"]] = metrics["abstention"]
            found.rows.append((record, make_cell(config["train_retriever"], setting, metrics)))
            found.finished.append({"dims": {**record.get("axes", {}), "hub": cell_hub_name(config["hub"], record["name"]),
                                            "train_retriever": config["train_retriever"], "test_retriever": setting},
                                   "cell": record["name"], "metrics_path": cell.metrics_path, "n": metrics["n"]})
    return found


def _group_of(record: dict, drop_seed: bool) -> str:
    """The table a cell belongs to: its hub, then ``__key-value`` of its other axes (``seed`` dropped
    when replicates are aggregated)."""
    others = {k: v for k, v in record.get("axes", {}).items()
              if k not in ("hub", "train_retriever") and not (drop_seed and k == "seed")}
    return cell_hub_name(record["config"]["hub"], record["name"]) + "".join(
        f"__{k.replace('.', '-')}-{_slug_value(v)}" for k, v in sorted(others.items()))


def _seed_of(record: dict) -> Any:
    return record.get("axes", {}).get("seed", record["config"].get("seed"))


def _groups(rows: list) -> tuple[dict[str, dict], bool]:
    """``({table: {"hub", "model", "cells"[, "seeds"]}}, replicate)``: replicates are finished cells
    that land on the same table cell once seed is ignored; then each table cell aggregates its seeds."""
    buckets: dict[tuple, list] = {}
    for record, c in rows:
        buckets.setdefault((_group_of(record, True), c["train_retriever"], c["test_retriever"]), []).append((record, c))
    replicate = any(len(v) > 1 for v in buckets.values())
    groups: dict[str, dict] = {}
    if not replicate:
        for record, c in rows:
            config = record["config"]
            g = groups.setdefault(_group_of(record, False), {"hub": cell_hub_name(config["hub"], record["name"]),
                                                            "model": Path(str(config["model"])).name, "cells": []})
            g["cells"].append(c)
        return groups, False
    for (group, _, _), runs in buckets.items():
        first = runs[0][0]
        g = groups.setdefault(group, {"hub": cell_hub_name(first["config"]["hub"], first["name"]), "cells": [],
                                      "seeds": [], "model": Path(str(first["config"]["model"])).name})
        seeds = [_seed_of(r) for r, _ in runs]
        agg = aggregate_replicates([c for _, c in runs], seeds)
        by_seed = {json.dumps(_seed_of(r), default=str): r["name"] for r, _ in runs}
        agg["run_cells"] = [by_seed.get(json.dumps(s, default=str)) for s in agg["seeds"]]
        g["cells"].append(agg)
        g["seeds"] += [s for s in agg["seeds"] if s not in g["seeds"]]
    return groups, True


def _replicates_info(seeds: list) -> dict:
    return {"seeds": _sorted_seeds(seeds), "aggregate": "mean over seeds", "spread": SPREAD,
            "run_interval": INTERVAL, "generation": GENERATION, "runs": "replicates.csv"}


_RATES = ("accuracy", "hallucination", "error")


def _rate_values(m: dict) -> list[str]:
    vals = []
    for r in _RATES:
        ci = m.get(f"{r}_ci")
        vals += [f"{m[r]:.6f}" if r in m else "", *([f"{ci[0]:.6f}", f"{ci[1]:.6f}"] if ci else ["", ""])]
    return vals


def _write_sweep_csv(found: _Finished, out: Path, summary: dict, replicate: bool) -> None:
    """``sweep.csv`` and, with replicates, ``replicates.csv`` and ``sweep.json``'s seeds."""
    rate_columns = [*(x for r in _RATES for x in (r, f"{r}_low", f"{r}_high")),
                    *(f"strict_{x}" for r in _RATES for x in (r, f"{r}_low", f"{r}_high"))]
    # axes that are also fixed columns (hub, model, train_retriever) appear once, as the fixed column
    csv_axes = [k for k in found.axis_keys if k not in ("hub", "model", "train_retriever")]
    header = ["cell", *csv_axes, "hub", "model", "train_retriever", "test_retriever", "n", *rate_columns]

    def run_row(record: dict, c: dict, keys: list[str] = csv_axes) -> list:
        config = record["config"]
        return [record["name"], *(_flat(record["axes"].get(k, "")) for k in keys), config["hub"],
                config["model"], c["train_retriever"], c["test_retriever"], c["n"],
                *_rate_values(c), *_rate_values(c.get("strict") or {})]

    _write_csv(out / "sweep.csv", [header, *(run_row(record, c) for record, c in found.rows)])
    if not replicate:
        return
    other_keys = [k for k in csv_axes if k != "seed"]
    rows = sorted(found.rows, key=lambda rc: (_group_of(rc[0], True), rc[1]["train_retriever"],
                                              rc[1]["test_retriever"], _seed_key(_seed_of(rc[0]))))
    _write_csv(out / "replicates.csv", [["group", "seed", *(k for k in header if k != "seed")],
                                        *([_group_of(record, True), _flat(_seed_of(record)),
                                           *run_row(record, c, other_keys)] for record, c in rows)])
    summary["seeds"] = _sorted_seeds([_seed_of(r) for r, _ in found.rows])
    summary["replicates"] = _replicates_info(summary["seeds"])


def _write_csv(path: Path, rows) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    write_text(path, buf.getvalue())


def _write_curves(curve_paths: list[Path], out: Path, summary: dict) -> None:
    """The learning curves of the cells that drew one, labelled by the cell's axis values."""
    if not curve_paths:
        return
    from ratune.eval.curve import read_curve, write_curves_report

    curves = {}
    for path in curve_paths:
        record = _read_cell_record(path.parent.parent / "cell.json")
        label = " ".join(f"{k}={_flat(v)}" for k, v in record.get("axes", {}).items()) or record["name"]
        curves[label] = read_curve(path.parent)
    write_curves_report(curves, out)
    summary["learning_curves"] = list(curves)


def _selections(sweep_dir: Path, found: "_Finished") -> list[dict]:
    """Per cell with ``eval.selection_rule`` (``CELL/selection.json``): the chosen checkpoint, its
    validation counts on the cell's curve and its test counts (from ``found``; a cell without eval
    cells: its finished BFCL categories, BFCL's verdicts), the cell's table and row."""
    paths = sorted((sweep_dir / "cells").glob("*/selection.json"))
    if not paths:
        return []
    from ratune.eval.bfcl_run import finished_categories
    from ratune.eval.curve import read_curve

    tested: dict[str, list] = {}
    for record, c in found.rows:
        tested.setdefault(record["name"], []).append((record, c))
    rows = []
    for path in paths:
        cell, chosen = path.parent, read_json_object(path)
        validation = {r["setting"]: r for r in read_curve(cell / "curve") if r["step"] == chosen["step"]}
        cells = tested.get(cell.name, [])
        rows.append({"cell": cell.name, "rule": chosen["rule"], "metric": chosen["metric"], "step": chosen["step"],
                     "epoch": chosen["epoch"], "score": chosen["score"],
                     "validation": {s: {"n": r["n"], "strict": r["strict_correct"], "gorilla": r["gorilla_correct"],
                                        **({"by_answer": r["by_answer"]} if r.get("by_answer") else {})}
                                    for s, r in validation.items()},
                     "test": {c["test_retriever"]: {"n": c["n"], "strict": c["strict"]["correct_n"],
                                                    **({"gorilla": c["correct_n"]} if "correct_n" in c else {})}
                              for _, c in sorted(cells, key=lambda rc: rc[1]["test_retriever"])}
                     or {f"bfcl {k}": {"n": m["n"], "strict": m["correct"]}
                         for k, m in finished_categories(cell / "bfcl").items()},
                     **({"table": _group_of(cells[0][0], False), "row": cells[0][1]["train_retriever"]}
                        if cells else {})})
    return rows


def _chosen_by_table(selections: list[dict]) -> dict[str, dict]:
    """``{table: {row: selection}}`` of the selections whose cell reached Table 2."""
    chosen: dict[str, dict] = {}
    for r in selections:
        if "table" in r:
            chosen.setdefault(r["table"], {})[r["row"]] = {k: r[k] for k in ("rule", "metric", "step", "epoch",
                                                                              "validation")}
    return chosen


def _write_selections(rows: list[dict], out: Path, summary: dict) -> None:
    """``selection.{md,json}``: each selection's validation counts beside its test counts."""
    if not rows:
        return
    lines = ["Checkpoints chosen on the validation questions (eval.selection_rule); the test questions were read "
             "once, for the chosen checkpoint. Correct answers of n, strict metric (gorilla where the hub has it; "
             "BFCL's checker for a bfcl category).",
             "", "| cell | rule | step | epoch | validation | test |", "|---|---|---|---|---|---|"]

    for r in rows:
        epoch = "" if r["epoch"] is None else f"{r['epoch']:g}"
        lines.append(f"| {r['cell']} | {r['rule']} ({r['metric']}) | {r['step']} | {epoch} "
                     f"| {selection_counts(r['validation'])} | {selection_counts(r['test'])} |")
    write_text(out / "selection.md", "\n".join(lines) + "\n")
    write_json(out / "selection.json", {"cells": rows})
    summary["selection"] = {r["cell"]: r["step"] for r in rows}


def _write_experiments(found: _Finished, out: Path, summary: dict) -> None:
    """``experiments.{json,md}``: the experiment settings' cells (docs/experiments.md), beside Table 2."""
    if not found.experiments:
        return
    from ratune.eval.robustness import experiment_rows, experiments_markdown

    exp_rows = experiment_rows(found.experiments, found.abstention_by_cell)
    write_json(out / "experiments.json", {"experiments": exp_rows})
    write_text(out / "experiments.md", experiments_markdown(exp_rows))
    summary["experiments"] = len(exp_rows)


def _write_comparisons(finished: list, pairs: list, out: Path, summary: dict) -> None:
    """``comparisons.{json,md,csv}``: the chosen pairs' paired tests (:func:`ratune.sweep.pairs.compare_pairs`)."""
    if not pairs:
        return
    results = compare_pairs(finished, pairs)
    write_json(out / "comparisons.json", {"comparisons": results})
    write_text(out / "comparisons.md", comparisons_markdown(results))
    _write_csv(out / "comparisons.csv", comparisons_csv_rows(results))
    summary["comparisons"] = {status: sum(r["status"] == status for r in results)
                              for status in ("ok", "missing", "refused")}


def _write_released(sweep_dir: Path, finished: list, saved, out: Path, summary: dict) -> None:
    """``released.{json,md}``: the cells on all of a hub's questions against the released Gorilla-7B responses.

    Raises:
        RatuneError: the sweep file's ``apibench`` folder does not exist.
    """
    released_cells = [{"cell": " ".join(f"{k}={_flat(v)}" for k, v in f["dims"].items() if k != "test_retriever"),
                       "path": f["metrics_path"].parent, "setting": f["dims"]["test_retriever"],
                       "hub": f["dims"]["hub"], "n": f["n"]} for f in finished
                      if recorded_hub_kind(f["dims"]["hub"]).has_released_responses]
    if not any(TEST_SETTINGS[c["setting"]].released for c in released_cells if c["setting"] in TEST_SETTINGS):
        return
    named_apibench = saved.config.apibench if saved else None  # None: the default folder
    if named_apibench is not None:
        try:
            resolve_apibench_dir(named_apibench)
        except RatuneError as err:
            raise RatuneError(f"{saved.source}: apibench: {err}") from None
    try:
        apibench = resolve_apibench_dir(named_apibench)
    except RatuneError as err:
        results, skipped = [], []
        summary["released"] = {"comparisons": 0, "not_compared": str(err)}
        print(f"ratune report: {sweep_dir}: no comparisons with the released responses: {err}", file=sys.stderr)
    else:
        results, skipped = released_comparisons(released_cells, apibench)
    if results:
        write_json(out / "released.json", {"comparisons": results, "skipped": skipped})
        write_text(out / "released.md", released_markdown(results))
        summary["released"] = {"comparisons": len(results), "skipped": skipped}


def load_compare_pairs(sweep_dir: str | Path) -> list[ComparePair]:
    """The ``compare`` pairs of the saved ``SWEEP_DIR/sweep.yaml``; empty when the file or the key is absent.

    Raises:
        RatuneError: the saved file does not validate (naming it and the field).
    """
    saved = load_saved_sweep(sweep_dir)
    return saved.config.compare if saved else []


def _seed_key(seed: Any) -> tuple:
    return (0, seed, "") if isinstance(seed, (int, float)) and not isinstance(seed, bool) else (1, 0, str(seed))


def _sorted_seeds(seeds: list) -> list:
    unique: list = []
    for s in seeds:
        if s not in unique:
            unique.append(s)
    return sorted(unique, key=_seed_key)


def cli_report_sweep(sweep_dir: str, out: str | None = None, pair_args: list[list[str]] | None = None) -> int:
    """``ratune report SWEEP_DIR``: write the sweep report and print its tables; ``pair_args``
    (``[[A, B], ...]``, selectors as ``key=value,...``) replace the sweep file's ``compare`` list."""
    pairs = None
    if pair_args:
        pairs = [ComparePair(a=parse_selector(a), b=parse_selector(b)) for a, b in pair_args]
    tables = report_sweep(sweep_dir, out, pairs=pairs)
    report_dir = Path(out or Path(sweep_dir) / "report")
    for name, table in tables.items():
        print(f"<!-- {name} -->")
        print(table2_markdown(table))
        print("Worst case across test settings:\n")
        print((report_dir / name / "worst_case.md").read_text(encoding="utf-8"))
    summary = read_json_object(report_dir / "sweep.json")
    if "comparisons" in summary:
        print((report_dir / "comparisons.md").read_text(encoding="utf-8"))
    for name, b in summary.get("best", {}).items():
        where = f"(train {b['train_retriever']}, test {b['test_retriever']}, accuracy {100 * b['accuracy']:.1f} %, " \
                f"n = {b['n']})"
        if b.get("tied_with"):
            print(f"no single best in {name}: {b['cell']} {where} ties with {', '.join(b['tied_with'])}; export the "
                  f"one you want, e.g.:\n  {b['export']}")
        else:
            print(f"best in {name}: {b['cell']} {where}; export it with:\n  {b['export']}")
    for name, reason in summary.get("no_best", {}).items():
        print(f"no best cell in {name}: {reason}")
    if "selection" in summary:
        print((report_dir / "selection.md").read_text(encoding="utf-8"))
    if "bfcl" in summary:
        print((report_dir / summary["bfcl"]["report"]).read_text(encoding="utf-8"))
    written = f"sweep.csv, {len(tables)} table(s)" if tables else "no Table 2: no eval cells"
    print(f"wrote {Path(out) if out else Path(sweep_dir) / 'report'} ({written})")
    return 0


def best_cells(sweep_dir: Path, rows: list, group_of) -> tuple[dict, dict]:
    """``(best, no_best)`` per table (``group_of(record)``) of ``rows`` (``(cell record, table cell)``):
    the first cell with the highest headline accuracy, its ties in ``tied_with`` and its ``ratune
    export`` command; ``no_best[table]`` says why a table has none (every cell scored 0, or its
    cells were scored on validation questions: a model card would call them eval results)."""
    by_group: dict[str, list] = {}
    for record, c in rows:
        by_group.setdefault(group_of(record), []).append((record, c))
    best, no_best = {}, {}
    for group, cells in by_group.items():
        metric = headline_metric([c for _, c in cells])  # gorilla on APIBench; a catalog's cells: strict

        def accuracy(c: dict) -> float:
            return metric_block(c, metric).get("accuracy", 0.0)

        splits = sorted({c["split"] for _, c in cells if "split" in c})
        if splits:
            no_best[group] = (f"its cells are scored on the {' and '.join(splits)} questions (eval.split): choose one "
                              "by hand, then evaluate its test questions before exporting it")
            continue
        top = max(accuracy(c) for _, c in cells)
        if top <= 0:
            no_best[group] = f"every one of its {len(cells)} cells scored 0.0 % ({metric}); nothing to choose"
            continue
        tied = [(r, c) for r, c in cells if accuracy(c) == top]
        record, c = tied[0]
        others = list(dict.fromkeys(r["name"] for r, _ in tied if r["name"] != record["name"]))
        cell_dir = sweep_dir / "cells" / record["name"]
        best[group] = {"cell": record["name"], "train_retriever": c["train_retriever"],
                       "test_retriever": c["test_retriever"], "metric": metric, "accuracy": accuracy(c),
                       "accuracy_ci": metric_block(c, metric).get("accuracy_ci"), "n": c["n"],
                       "tied_with": others,
                       "export": _fmt(["ratune", "export", str(cell_dir / "train"), "--out",
                                       f"exports/{record['name']}", "--eval", str(cell_dir / "eval")])}
    return best, no_best
