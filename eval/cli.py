"""The ``ratune eval run``, ``ratune eval score`` and ``ratune report --eval`` commands: argument handling over the eval
modules (ratune/cli.py declares the flags and calls these), kept here so that run, curve, report
and robustness import one another in one direction only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ratune.hubs import hub_name, resolve_hub
from ratune.errors import RatuneError
from ratune.eval.curve import curve_markdown, evaluate_curve
from ratune.eval.hub_scoring import recorded_answer_format, scoring_for
from ratune.eval.report import make_cell, report_output, table2_markdown, write_table2
from ratune.eval.results import finished_cells
from ratune.eval.robustness import experiment_rows, experiments_markdown
from ratune.eval.run import evaluate_checkpoint
from ratune.eval.scoring.cli import METRIC_CHOICES, add_score_arguments
from ratune.eval.settings import EVAL_OPTIONS, EvalSettings
from ratune.io import write_json, write_text
from ratune.options import values_from_args
from ratune.registry import EXPERIMENT_SETTINGS


def cli_run(args) -> int:
    """``ratune eval run``: evaluate a checkpoint (or, with ``--all-checkpoints``, every checkpoint of
    a run: a learning curve) under the test settings (``args`` from its parser, ratune/cli.py);
    prints each setting's rates (or the curve). Returns 0."""
    hub = resolve_hub(args.hub, args.apibench)
    values = values_from_args(args, EVAL_OPTIONS)
    values["settings"] = args.settings or list(hub.default_settings)
    settings = EvalSettings(**values)
    if args.all_checkpoints:
        rows = evaluate_curve(args.checkpoint, hub=hub, apibench_dir=args.apibench, out_dir=args.out,
                              settings=settings, model_name=args.model_name)
        print(curve_markdown(rows), end="")
        return 0
    results = evaluate_checkpoint(args.checkpoint, hub=hub, apibench_dir=args.apibench, out_dir=args.out,
                                  settings=settings, model_name=args.model_name)
    print(json.dumps({s: {k: m[k] for k in ("n", "accuracy", "hallucination", "error")}
                      for s, m in results.items()}, sort_keys=True))
    return 0


def cli_report(args) -> int:
    """``ratune report --eval TRAIN=DIR ... --model NAME --out DIR [--hub HUB]``: Table 2 from eval folders
    (``args`` from its parser, ratune/cli.py; a sweep folder is ratune/sweep/report.py's); the experiment
    settings' cells go beside it in ``experiments.{json,md}``. Prints the table. Returns 0.

    Raises:
        RatuneError: ``--pair`` (sweeps only), missing ``--eval``/``--model``/``--out``, a bad ``--eval`` spec or
            folder, no complete cell, cells of several hubs, or a ``--hub`` they were not evaluated on.
    """
    if args.pair:
        raise RatuneError("--pair compares cells of a sweep: give SWEEP_DIR (for two response files use "
                          "`ratune compare`)")
    if not (args.eval and args.model and args.out):
        raise RatuneError("ratune report needs SWEEP_DIR, or --eval TRAIN=DIR (repeatable) with --model and --out")
    cells, experiments = [], []  # experiment settings (swap, irrelevant, constraints_*) go beside Table 2
    hubs = {}  # the hub each cell records -> one cell of it, for the message when they differ
    false_abstention = {}  # abstaining under oracle, where the document answers (as in sweep reports)
    for spec in args.eval:
        if "=" not in spec:
            raise RatuneError(f"--eval {spec!r}: expected TRAIN_RETRIEVER=EVAL_DIR")
        train_retriever, folder = spec.split("=", 1)
        if not Path(folder).is_dir():
            raise RatuneError(f"--eval {spec!r}: {folder}: no such eval folder")
        for cell in finished_cells(folder):
            metrics = cell.metrics
            if isinstance(metrics.get("hub"), str):
                hubs.setdefault(metrics["hub"], cell.folder)
            if cell.setting in EXPERIMENT_SETTINGS:
                experiments.append({"cell": train_retriever, "axes": {}, "setting": cell.setting,
                                    "train_retriever": train_retriever, "metrics": metrics})
            else:
                cells.append(make_cell(train_retriever, cell.setting, metrics))
                if cell.setting == "oracle" and metrics.get("abstention"):
                    false_abstention[train_retriever] = metrics["abstention"]
    if not cells:
        raise RatuneError("no complete eval cells (SETTING/ folders with .complete) in the --eval folders: "
                          + ", ".join(spec.split("=", 1)[1] for spec in args.eval))
    if len(hubs) > 1:  # one table, one hub: the cells' own metrics.json say which
        raise RatuneError("the --eval cells are of different hubs: " + "; ".join(
            f"{cell}: {hub}" for hub, cell in sorted(hubs.items())))
    given = None
    if args.hub is not None:
        given = hub_name(args.hub)
    if not hubs and given is None:
        raise RatuneError("the --eval cells do not record their hub (made by hand?): give --hub")
    hub, first = next(iter(hubs.items())) if hubs else (given, None)
    if given is not None and given != hub:
        raise RatuneError(f"--hub {args.hub}: the cells were evaluated on {hub} ({first / 'metrics.json'})")
    with report_output(args.out).writing():  # a folder ratune did not make is refused before anything is written
        table = write_table2(cells, hub=hub, model=args.model, out_dir=args.out)
        if experiments:
            rows = experiment_rows(experiments, false_abstention)
            write_json(Path(args.out) / "experiments.json", {"experiments": rows})
            write_text(Path(args.out) / "experiments.md", experiments_markdown(rows))
    print(table2_markdown(table))
    if experiments:
        print("Experiments (beside Table 2, not in it):\n")
        print(experiments_markdown(rows))
    return 0


def cli_score(args) -> int:
    """``ratune eval score``: score one response file by the hub's scorer and print a table, or with
    ``--json`` one JSON object (the result without ``per_question``). Returns 0.

    Raises:
        RatuneError / InputError: unknown hub, a metric the hub is not scored by, missing files,
            malformed response lines, a file for another hub, question ids that are not the hub's.
    """
    metric = getattr(args, "metric", None) or "both"
    if metric not in METRIC_CHOICES:
        raise RatuneError(f"unknown metric {metric!r}: expected gorilla, strict or both")
    hub = resolve_hub(args.hub, getattr(args, "apibench", None))
    scoring = scoring_for(hub, answer_format=recorded_answer_format(args.responses, hub))
    if metric != "both":
        scoring.require_metric(metric)
    responses = scoring.load_responses(args.responses, hub_check=not getattr(args, "no_hub_check", False))
    result = scoring.score(responses)
    if getattr(args, "json", False):
        print(json.dumps(scoring.summary(result, metric), sort_keys=True))
    else:
        print(scoring.format_table(result, metric, source=os.fspath(args.responses)))
    return 0


def score_main(argv=None) -> int:  # pragma: no cover - convenience entry point
    """``python -m ratune.eval.scoring --hub ... --responses ...`` (same as cli_score)."""
    parser = add_score_arguments(argparse.ArgumentParser(prog="ratune eval score"))
    args = parser.parse_args(argv)
    try:
        return cli_score(args)
    except RatuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
