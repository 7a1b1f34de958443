"""``ratune sweep FILE [--dry-run] [--launcher local|slurm] [--out DIR] [--rerun-changed] [--only KEY=VALUE ...]
[--set KEY=VALUE ...]``."""

from __future__ import annotations

import argparse

from ratune.args import checked, input_file, output_dir
from ratune.sweep.cells import expand, select_cells
from ratune.sweep.local import dry_run, run_local, sweep_output
from ratune.sweep.schema import SET_EXAMPLE, check_files, load_sweep, parse_only, parse_set
from ratune.sweep.slurm import write_slurm
from ratune.sweep.state import require_finetuned_retrievers


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``ratune sweep``: FILE, --dry-run, --launcher, --out, --rerun-changed, --only, --set."""
    parser.add_argument("file", type=input_file, help="sweep file (YAML)")
    parser.add_argument("--dry-run", action="store_true", help="print the cells and commands; run nothing")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="local: run the commands here; slurm: write sbatch scripts and submit.sh")
    parser.add_argument("--out", default=None, type=output_dir, help="sweep folder (default: the file's out_dir)")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="delete and rerun cells whose resolved config changed since they ran (only their "
                             "evaluations when eval: settings alone changed: the training is kept)")
    parser.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                        type=checked(parse_only, "cell choice", good="train_retriever=oracle",
                                     bad=("oracle", "=oracle")),
                        help="run only the cells with this axis value (repeat it: values of one key are "
                             "alternatives, different keys must all match), e.g. --only train_retriever=oracle; "
                             "the other cells are left as they are")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        type=checked(parse_set, "setting", good=SET_EXAMPLE,
                                     bad=("accelerate_config", "base..lr=1")),
                        help="set a key of the sweep file for this run (repeat it; VALUE is YAML; base.KEY sets a "
                             f"key of the base training config), e.g. --set {SET_EXAMPLE} --set "
                             "base.learning_rate=2.0e-4; the saved SWEEP_DIR/sweep.yaml holds the values set, and "
                             "cells whose config it changes are refused as changed (--rerun-changed)")


def cli_sweep(args: argparse.Namespace) -> int:
    """Run ``ratune sweep`` from parsed arguments, holding the sweep folder's lock; returns the exit status.

    Raises:
        RatuneError: as :func:`ratune.sweep.local.run_local` and :func:`ratune.sweep.slurm.write_slurm`;
            :class:`ratune.locks.LockHeld` while another process runs a sweep into the same folder.
    """
    sweep = load_sweep(args.file, args.out, overrides=args.overrides)
    check_files(sweep)
    every = expand(sweep)
    cells = select_cells(every, args.only, sweep.source)  # the shared data build stays the whole sweep's
    if args.dry_run:
        return dry_run(sweep, cells, data_cells=every)
    require_finetuned_retrievers(sweep, cells)  # a missing retriever folder, before hours of training
    with sweep_output(sweep.out_dir).writing():  # one sweep per folder: a second one is refused, naming its pid
        if args.launcher == "slurm":
            write_slurm(sweep, cells, rerun_changed=args.rerun_changed, data_cells=every)
            return 0
        return run_local(sweep, cells, rerun_changed=args.rerun_changed, data_cells=every)
