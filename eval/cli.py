"""The ``ratune eval run`` and ``ratune report --eval`` commands: argument handling over the eval
modules (ratune/cli.py declares the flags and calls these), kept here so that run, curve, report
and robustness import one another in one direction only."""

from __future__ import annotations

import json
from pathlib import Path

from ratune.data.apibench import HUBS, resolve_apibench_dir
from ratune.data.hubs import resolve_hub
from ratune.errors import RatuneError
from ratune.eval.curve import curve_markdown, evaluate_curve
from ratune.eval.report import make_cell, own_report_folder, read_metrics, table2_markdown, write_table2
from ratune.eval.robustness import experiment_rows, experiments_markdown
from ratune.eval.run import evaluate_checkpoint
from ratune.eval.settings import EVAL_OPTIONS, EvalSettings
from ratune.io import write_json, write_text
from ratune.manifest import is_complete
from ratune.options import values_from_args
from ratune.registry import CATALOG_DEFAULT_SETTINGS, DEFAULT_SETTINGS, EXPERIMENT_SETTINGS


def cli_run(args) -> int:
    """``ratune eval run``: evaluate a checkpoint (or, with ``--all-checkpoints``, every checkpoint of
    a run: a learning curve) under the test settings (``args`` from its parser, ratune/cli.py);
    prints each setting's rates (or the curve). Returns 0."""
    values = values_from_args(args, EVAL_OPTIONS)
    values["settings"] = args.settings or list(DEFAULT_SETTINGS if args.hub in HUBS else CATALOG_DEFAULT_SETTINGS)
    settings = EvalSettings(**values)
    apibench = resolve_apibench_dir(args.apibench) if args.hub in HUBS else None  # a catalog needs no APIBench
    if args.all_checkpoints:
        rows = evaluate_curve(args.checkpoint, hub=args.hub, apibench_dir=apibench, out_dir=args.out,
                              settings=settings, model_name=args.model_name)
        print(curve_markdown(rows), end="")
        return 0
    results = evaluate_checkpoint(args.checkpoint, hub=args.hub, apibench_dir=apibench, out_dir=args.out,
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
        for cell in sorted(Path(folder).iterdir()):
            if cell.is_dir() and is_complete(cell):
                metrics = read_metrics(cell / "metrics.json")
                if isinstance(metrics.get("hub"), str):
                    hubs.setdefault(metrics["hub"], cell)
                if cell.name in EXPERIMENT_SETTINGS:
                    experiments.append({"cell": train_retriever, "axes": {}, "setting": cell.name,
                                        "train_retriever": train_retriever, "metrics": metrics})
                else:
                    cells.append(make_cell(train_retriever, cell.name, metrics))
                    if cell.name == "oracle" and metrics.get("abstention"):
                        false_abstention[train_retriever] = metrics["abstention"]
    if not cells:
        raise RatuneError("no complete eval cells (SETTING/ folders with .complete) in the --eval folders: "
                          + ", ".join(spec.split("=", 1)[1] for spec in args.eval))
    if len(hubs) > 1:  # one table, one hub: the cells' own metrics.json say which
        raise RatuneError("the --eval cells are of different hubs: " + "; ".join(
            f"{cell}: {hub}" for hub, cell in sorted(hubs.items())))
    given = None
    if args.hub is not None:
        given = args.hub if args.hub in HUBS else resolve_hub(args.hub).name
    if not hubs and given is None:
        raise RatuneError("the --eval cells do not record their hub (made by hand?): give --hub")
    hub, first = next(iter(hubs.items())) if hubs else (given, None)
    if given is not None and given != hub:
        raise RatuneError(f"--hub {args.hub}: the cells were evaluated on {hub} ({first / 'metrics.json'})")
    own_report_folder(args.out)  # a folder ratune did not make is refused before anything is written
    table = write_table2(cells, hub=hub, model=args.model, out_dir=args.out)
    print(table2_markdown(table))
    if experiments:
        rows = experiment_rows(experiments, false_abstention)
        write_json(Path(args.out) / "experiments.json", {"experiments": rows})
        write_text(Path(args.out) / "experiments.md", experiments_markdown(rows))
        print("Experiments (beside Table 2, not in it):\n")
        print(experiments_markdown(rows))
    return 0
