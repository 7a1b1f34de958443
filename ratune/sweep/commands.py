"""The commands a sweep runs: the shared ``ratune data build``, each cell's ``accelerate launch``
training, ``ratune eval run`` and, with a ``bfcl:`` section, ``ratune eval bfcl``."""

from __future__ import annotations

import shlex

from ratune.eval.settings import BFCL_OPTIONS, EVAL_OPTIONS, BfclSettings, EvalSettings, needs_finetuned_retriever
from ratune.options import command_arguments
from ratune.data.build import BUILD_OPTIONS, BuildSettings
from ratune.data.mixture import MIXTURE_OPTIONS, Mixture
from ratune.sweep.cells import Cell, selection_path, selection_rule_of, sweep_mixtures
from ratune.sweep.schema import Sweep


def data_command(sweep: Sweep, hub: str, entry: dict) -> list[str]:
    """The ``ratune data build`` command of one hub's shared data folder, with ``--reuse-if-same``: the
    build itself keeps a complete folder made with the same request and rebuilds one that differs
    (data/build.py ``build_request``), so the launchers run it whenever a cell of the hub is not
    finished."""
    d = sweep.config.data
    mixtures = {m.mode: spec for m, spec in zip(sweep_mixtures(sweep), d.mixtures)}
    plain = [m for m in entry["modes"] if m not in mixtures]
    build = d.model_copy(update={"max_length": entry["max_length"]})  # the cells' when the file gives none
    cmd = ["ratune", "data", "build", "--hub", hub, "--out", entry["dir"], "--tokenizer", entry["tokenizer"],
           "--modes", *plain, *command_arguments(build, BuildSettings, BUILD_OPTIONS, policy="always"),
           "--leakage", d.leakage, "--reuse-if-same"]
    needed = [spec for mode, spec in mixtures.items() if mode in entry["modes"]]
    for spec in needed:
        cmd += ["--mixture", spec]
    if needed:
        cmd += command_arguments(d, Mixture, MIXTURE_OPTIONS, policy="always")
    cmd += command_arguments(d, BuildSettings, BUILD_OPTIONS, policy="changed")
    if entry.get("chat_template") is not None:
        cmd += ["--chat-template", entry["chat_template"]]
    if sweep.config.apibench:
        cmd += ["--apibench", sweep.config.apibench]
    return cmd


def train_command(sweep: Sweep, cell: Cell, *, launch_args: list[str] | None = None) -> list[str]:
    """``accelerate launch -q ... -m ratune.train --config CELL/train.yaml --on-unfinished X``: the same
    command starts, resumes and restarts a cell. ``-q`` keeps accelerate's traceback out after
    ratune's one-line error (accelerate 1.15)."""
    cmd = ["accelerate", "launch", "-q"]
    if sweep.config.accelerate_config:
        cmd += ["--config_file", sweep.config.accelerate_config]
    return cmd + list(launch_args or []) + ["-m", "ratune.train", "--config", str(cell.dir / "train.yaml"),
                                            "--on-unfinished", sweep.config.on_unfinished]


def eval_command(sweep: Sweep, cell: Cell, *, curve: bool = False, checkpoint: str | None = None) -> list[str]:
    """``ratune eval run --checkpoint CELL/train --out CELL/eval ...`` with the sweep's eval settings
    (``checkpoint``: another one, the chosen checkpoint of ``eval.selection_rule``); with ``curve``,
    the learning curve's ``--all-checkpoints --out CELL/curve --settings CURVE_SETTINGS`` (same
    generation settings; ``--split validation`` under a selection rule); ``--model-name CELL`` last.
    ``--dense-model`` only where one of the command's settings retrieves with it."""
    e = sweep.config.eval
    out, settings = (cell.dir / "curve", e.curve_settings) if curve else (cell.dir / "eval", e.settings)
    if not any(needs_finetuned_retriever(s) for s in settings):  # a folder these settings never read
        e = e.model_copy(update={"dense_model": None})
    cmd = ["ratune", "eval", "run", "--checkpoint", checkpoint or str(cell.dir / "train"), "--hub", cell.hub,
           "--out", str(out),
           *command_arguments(e.model_copy(update={"settings": settings}), EvalSettings, EVAL_OPTIONS, policy="always")]
    if curve:
        cmd += ["--all-checkpoints"]
        if e.selection_rule is not None:
            cmd += ["--split", "validation"]
    cmd += command_arguments(e, EvalSettings, EVAL_OPTIONS, policy="changed")
    if cell.config.get("trust_remote_code"):
        cmd += ["--trust-remote-code"]
    if sweep.config.apibench:
        cmd += ["--apibench", sweep.config.apibench]
    return cmd + ["--model-name", cell.name]  # responses name the cell, not its run folder (always "train")


def select_command(sweep: Sweep, cell: Cell) -> list[str]:
    """``ratune eval select CELL/curve --rule R --metric M --out CELL/selection.json --checkpoint-only``
    (R: :func:`ratune.sweep.cells.selection_rule_of`)."""
    e = sweep.config.eval
    return ["ratune", "eval", "select", str(cell.dir / "curve"), "--rule", selection_rule_of(sweep, cell),
            "--metric", e.selection_metric, "--out", str(selection_path(cell)), "--checkpoint-only"]


def bfcl_command(sweep: Sweep, cell: Cell, *, checkpoint: str | None = None) -> list[str]:
    """``ratune eval bfcl --checkpoint CELL/train --out CELL/bfcl ...`` with the sweep's ``bfcl:`` settings
    (``checkpoint``: another one, the chosen checkpoint of ``eval.selection_rule``)."""
    b = sweep.config.bfcl
    cmd = ["ratune", "eval", "bfcl", "--checkpoint", checkpoint or str(cell.dir / "train"), "--out", str(cell.dir / "bfcl"),
           *command_arguments(b, BfclSettings, BFCL_OPTIONS, policy="always")]
    if b.categories:
        cmd += ["--categories", *b.categories]
    if b.limit is not None:
        cmd += ["--limit", str(b.limit)]
    if b.unseen_by is not None:
        cmd += ["--unseen-by", b.unseen_by]
    cmd += command_arguments(b, BfclSettings, BFCL_OPTIONS, policy="changed")
    if cell.config.get("trust_remote_code"):
        cmd += ["--trust-remote-code"]
    return cmd


def _fmt(cmd: list[str]) -> str:
    return shlex.join(cmd)
