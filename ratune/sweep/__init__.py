"""Ablation sweeps: a YAML file names a base training config and axes; each cell is trained with
``accelerate launch`` and evaluated with ``ratune eval run``; ``report_sweep`` collects the
finished cells into Table 2 per hub.

Sweep file (validated with ``extra="forbid"``)::

    name: table2_torchhub
    out_dir: runs/sweeps/table2_torchhub    # default runs/sweeps/{name}, else runs/sweeps/{file stem}
    base: configs/train/x.yaml              # or an inline mapping of TrainConfig keys
    data: {max_length: 768, max_document_tokens: 128}
    eval: {settings: [0_shot, bm25], n_questions: 50}
    axes:                                   # Cartesian grid, dotted TrainConfig keys
      train_retriever: [none, oracle]
      lora.r: [8, 16]
    groups:                                 # keys that vary together (paired, not crossed)
      - {learning_rate: [2.0e-4, 1.0e-4], max_steps: [25, 50]}
    accelerate_config: configs/accelerate/1gpu.yaml
    on_unfinished: resume                   # or restart
    slurm: {nodes: 1, gpus_per_node: 8, time: "24:00:00", partition: gpu}
    compare:                                # chosen pairs, paired tests in the report
      - {a: {train_retriever: oracle, test_retriever: oracle}, b: {train_retriever: none, test_retriever: 0_shot}}

Sweep folder::

    sweep.yaml                  the validated sweep file as it was last run, its base config inline
                                (load_saved_sweep reads it back; the report takes ``compare`` and ``apibench``)

    data/{hub}/                 the shared ``ratune data build`` output (once per hub)
    cells/{name}/cell.json      axis values, resolved training config, data and eval settings
    cells/{name}/train.yaml     the resolved TrainConfig
    cells/{name}/train/         the training run folder (``.complete`` when done)
    cells/{name}/eval/{setting}/metrics.json (+ ``.complete``)
    cells/{name}/curve/         with ``eval.curve_settings``: every Trainer checkpoint evaluated under
                                those settings, curve.{json,csv,md,png} (eval/curve.py); on the
                                validation questions with ``eval.selection_rule``
    cells/{name}/selection.json with ``eval.selection_rule``: the checkpoint chosen on the curve,
                                whose test questions eval/ holds (``ratune eval select``)
    cells/{name}/bfcl/          with a ``bfcl:`` section: ``ratune eval bfcl`` of the cell's run
    cells/{name}/error.txt      the error of the last failed attempt (removed on success)
    cells/{name}/logs/          stdout/stderr of each command
    slurm/submit.sh, cells/{name}/slurm/*.sbatch   (``--launcher slurm``)
    report/                     ``report_sweep``: table2 per hub (and per other axis values), sweep.csv,
                                learning_curve.{md,csv,png} when cells have curves, bfcl/ when
                                cells have BFCL categories
                                (a ``seed`` axis: replicates averaged per cell, replicates.csv),
                                comparisons.{md,csv,json} for the chosen pairs (ratune/sweep/pairs.py)

A cell's name is its axis values as a slug plus a short hash of those values: stable across
reruns and across edits of the base config, so that an edited config is *detected* (the stored
``cell.json`` differs) instead of silently starting a new folder next to stale results.

Modules (each imports only the ones above it; ``ratune.sweep`` re-exports their public names)::

    pairs.py      chosen-pair comparisons: ComparePair, parse_selector, compare_pairs
    schema.py     the sweep file: SweepData, SweepEval, SlurmSettings, SweepConfig, Sweep, load_sweep, sweep_from_data,
                  load_saved_sweep (a sweep folder's saved copy), parse_only and parse_set (KEY=VALUE of --only, --set)
    cells.py      the grid: Cell, cell_name, config_hash, expand, select_cells (--only), the _check_* rules,
                  data_plan, sweep_mixtures
    commands.py   data_command, train_command, eval_command
    state.py      cell.json and change detection: cell_record, changed_keys, is_finished,
                  is_curve_finished, check_changed
    local.py      the local launcher: run_command, run_local, save_sweep_file, dry_run; what both
                  launchers do first: sweep_output, prepare_sweep_folder
    slurm.py      the Slurm launcher: write_slurm
    report.py     report_sweep, best_cells, load_compare_pairs, cli_report_sweep
    cli.py        add_sweep_arguments, cli_sweep (holds the sweep folder's lock, ratune/output.py)

:func:`run_local` calls ``run_command`` and (through :func:`prepare_sweep_folder`, as do the Slurm
scripts' writer) ``check_changed`` as names of ``ratune.sweep.local``:
a test that replaces one patches it there (``monkeypatch.setattr("ratune.sweep.local.run_command", ...)``).
"""

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
    "_fmt", "data_command", "eval_command", "train_command",
    "cell_record", "changed_keys", "check_changed", "is_curve_finished", "is_finished",
    "dry_run", "run_command", "run_local", "save_sweep_file",
    "write_slurm",
    "best_cells", "cli_report_sweep", "load_compare_pairs", "report_sweep",
    "add_sweep_arguments", "cli_sweep",
]
