"""Ablation sweeps: axes over a base training config, each cell trained and evaluated, the finished
cells reported as Table 2 per hub (docs/sweeps.md). ``run_local`` calls ``run_command`` and
``check_changed`` as names of ``ratune.sweep.local``: patch them there."""

from __future__ import annotations

from ratune.sweep.pairs import ComparePair
from ratune.sweep.schema import (SlurmSettings, Sweep, SweepConfig, SweepData, SweepEval, load_saved_sweep, load_sweep,
                                 sweep_from_data)
from ratune.sweep.cells import (OWNED_KEYS, Cell, cell_name, config_hash, data_plan, expand, parse_only, select_cells,
                                sweep_mixtures)
from ratune.sweep.commands import _fmt, data_command, eval_command, train_command
from ratune.sweep.state import cell_record, changed_keys, check_changed, is_curve_finished, is_finished
from ratune.sweep.local import dry_run, run_command, run_local, save_sweep_file
from ratune.sweep.slurm import write_slurm
from ratune.sweep.report import best_cells, cli_report_sweep, load_compare_pairs, report_sweep
from ratune.sweep.cli import add_sweep_arguments, cli_sweep

__all__ = [
    "ComparePair",
    "SlurmSettings", "Sweep", "SweepConfig", "SweepData", "SweepEval", "load_saved_sweep", "load_sweep",
    "sweep_from_data",
    "OWNED_KEYS", "Cell", "cell_name", "config_hash", "data_plan", "expand", "parse_only", "select_cells",
    "sweep_mixtures",
    "data_command", "eval_command", "train_command",
    "cell_record", "changed_keys", "check_changed", "is_curve_finished", "is_finished",
    "dry_run", "run_command", "run_local", "save_sweep_file",
    "write_slurm",
    "best_cells", "cli_report_sweep", "load_compare_pairs", "report_sweep",
    "add_sweep_arguments", "cli_sweep",
]
