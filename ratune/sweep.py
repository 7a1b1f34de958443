"""Ablation sweeps: a YAML file names a base training config and axes; each cell is trained with
``accelerate launch`` and evaluated with ``ratune eval run``; ``report_sweep`` collects the
finished cells into Table 2 per hub.

Sweep file (validated with ``extra="forbid"``)::

    name: table2_torchhub
    out_dir: runs/sweeps/table2_torchhub    # default runs/sweeps/{file stem}
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

    sweep.yaml                  the validated sweep file as it was last run (the report reads ``compare``)

    data/{hub}/                 the shared ``ratune data build`` output (once per hub)
    cells/{name}/cell.json      axis values, resolved training config, data and eval settings
    cells/{name}/train.yaml     the resolved TrainConfig
    cells/{name}/train/         the training run folder (``.complete`` when done)
    cells/{name}/eval/{setting}/metrics.json (+ ``.complete``)
    cells/{name}/curve/         with ``eval.curve_settings``: every Trainer checkpoint evaluated under
                                those settings, curve.{json,csv,md,png} (eval/curve.py)
    cells/{name}/error.txt      the error of the last failed attempt (removed on success)
    cells/{name}/logs/          stdout/stderr of each command
    slurm/submit.sh, cells/{name}/slurm/*.sbatch   (``--launcher slurm``)
    report/                     ``report_sweep``: table2 per hub (and per other axis values), sweep.csv,
                                learning_curve.{md,csv,png} when cells have curves
                                (a ``seed`` axis: replicates averaged per cell, replicates.csv),
                                comparisons.{md,csv,json} for the chosen pairs (ratune/sweep_pairs.py)

A cell's name is its axis values as a slug plus a short hash of those values: stable across
reruns and across edits of the base config, so that an edited config is *detected* (the stored
``cell.json`` differs) instead of silently starting a new folder next to stale results.
"""

from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import io
import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ratune.config import (SCHEMA_CONFIG, BM25BackendName, Count, MaxLength, Port, Seed, TestSettingName,
                           Top1RetrieverName, load_yaml, validate)
from ratune.data.apibench import HUBS
from ratune.data.validate import LEAKAGE_POLICIES
from ratune.errors import RatuneError
from ratune.eval.report import headline_metric, metric_block
from ratune.eval.settings import EVAL_OPTIONS, EvalSettings
from ratune.options import command_arguments, config_model
from ratune.registry import DEFAULT_BM25_BACKEND, EXPERIMENT_SETTINGS, TABLE_SETTINGS, TEST_SETTINGS
from ratune.sweep_pairs import ComparePair

#: Keys the sweep owns in every cell's training config (folders inside the sweep folder).
OWNED_KEYS = ("data_dir", "output_dir")


class SweepData(BaseModel):
    """Settings of the shared ``ratune data build`` (one build per hub).

    ``max_length`` defaults to the cells' ``max_length`` (which must then agree within a hub);
    ``tokenizer`` defaults to the cells' ``model``.
    """

    model_config = SCHEMA_CONFIG
    max_length: MaxLength | None = None
    max_document_tokens: Count | None = None
    top_k: Count = 1
    tokenizer: str | None = None
    leakage: Literal[LEAKAGE_POLICIES] = "error"
    mixtures: list[str] = Field(default_factory=list,
                                description="mixture specs NAME:component=p,... (data/mixture.py); a cell "
                                            "trains on one with train_retriever: mix-NAME")
    mixture_seed: Seed = 0
    distractors: Count = 3
    top1_retriever: Top1RetrieverName = "bm25"
    dense_model: str | None = Field(None, description="finetuned retriever folder for train_retriever dense_ft "
                                                      "(and top1_retriever dense_ft)")
    bm25_backend: BM25BackendName = DEFAULT_BM25_BACKEND


#: A sweep file's ``eval:`` section: every eval option (eval/settings.py EVAL_OPTIONS) under its
#: flag's name, plus the learning curve's settings.
SweepEval = config_model(
    "SweepEval", EvalSettings, EVAL_OPTIONS, doc="Arguments of ``ratune eval run`` for every cell.",
    extra={"curve_settings": (list[TestSettingName], Field(
        default_factory=list,
        description="a learning curve: after training, every Trainer checkpoint of a cell is evaluated under "
                    "these settings (cells/NAME/curve/); the base config must save checkpoints (save_strategy: "
                    "epoch or save_steps) and keep them all (no save_total_limit)"))})


class SlurmSettings(BaseModel):
    """Resources of each training job (eval jobs take one node and one GPU)."""

    model_config = SCHEMA_CONFIG
    nodes: Count = 1
    gpus_per_node: Count = 1
    time: str = "24:00:00"
    partition: str | None = None
    eval_time: str | None = None
    main_process_port: Port = 29500
    setup: list[str] = Field(default_factory=list, description="shell lines run first (module load, venv)")
    extra_sbatch: list[str] = Field(default_factory=list, description="extra #SBATCH options, e.g. --account=x")


class SweepConfig(BaseModel):
    """A sweep file (see the module docstring)."""

    model_config = SCHEMA_CONFIG
    name: str | None = None
    out_dir: str | None = None
    apibench: str | None = None
    base: str | dict
    data: SweepData = SweepData()
    eval: SweepEval = SweepEval()
    axes: dict[str, list] = Field(default_factory=dict)
    groups: list[dict[str, list]] = Field(default_factory=list)
    accelerate_config: str | None = None
    on_unfinished: Literal["resume", "restart"] = "resume"
    slurm: SlurmSettings = SlurmSettings()
    compare: list[ComparePair] = Field(default_factory=list)


@dataclass
class Cell:
    """One point of the sweep grid.

    Attributes:
        name: stable folder name (axis slug + hash of the axis values).
        axes: ``{dotted key: value}`` of this cell.
        config: the resolved TrainConfig as a dict (``data_dir`` and ``output_dir`` inside the sweep folder).
    """

    name: str
    axes: dict
    config: dict
    dir: Path = field(default=Path("."))

    @property
    def hub(self) -> str:
        """The cell's hub."""
        return self.config["hub"]


@dataclass
class Sweep:
    """A loaded sweep: the validated file, where it came from and its output folder."""

    config: SweepConfig
    source: str
    out_dir: Path
    base: dict


def load_sweep(path: str | Path, out_dir: str | Path | None = None) -> Sweep:
    """Read and validate a sweep file; ``out_dir`` overrides the file's ``out_dir``.

    Raises:
        RatuneError: unknown keys, bad values, a missing base config.
    """
    path = Path(path)
    cfg = validate(SweepConfig, load_yaml(path), str(path))
    if isinstance(cfg.base, str):
        base_path = Path(cfg.base)
        if not base_path.exists() and (path.parent / cfg.base).exists():
            base_path = path.parent / cfg.base
        base = load_yaml(base_path)
    else:
        base = dict(cfg.base)
    out = Path(out_dir or cfg.out_dir or Path("runs") / "sweeps" / (cfg.name or path.stem))
    return Sweep(config=cfg, source=str(path), out_dir=out, base=base)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def _slug_value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def cell_name(axes: dict) -> str:
    """``key-value__key-value-HASH``: sorted axis values (at most 80 characters) plus the first 8 hex
    digits of the sha256 of the axis values, so truncated or sanitised slugs stay unique."""
    digest = hashlib.sha256(json.dumps(axes, sort_keys=True, default=str).encode()).hexdigest()[:8]
    slug = "__".join(f"{k.replace('.', '-')}-{_slug_value(v)}" for k, v in sorted(axes.items())) or "base"
    return f"{slug[:80]}-{digest}"


def config_hash(config: dict) -> str:
    """Short sha256 of a resolved config (sorted JSON)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _check_axes(cfg: SweepConfig, source: str) -> list[list[dict]]:
    """The sweep's dimensions: per axis and per group, the list of ``{key: value}`` choices."""
    dims: list[list[dict]] = []
    seen: set[str] = set()

    def claim(key: str, where: str) -> None:
        if key in OWNED_KEYS:
            raise RatuneError(f"{source}: {where}: {key!r} is set by the sweep (inside its out_dir); it cannot vary")
        if key in seen:
            raise RatuneError(f"{source}: {where}: key {key!r} appears in more than one axis or group")
        seen.add(key)

    for key, values in cfg.axes.items():
        claim(key, f"axes.{key}")
        if not values:
            raise RatuneError(f"{source}: axes.{key}: needs at least one value")
        dims.append([{key: v} for v in values])
    for i, group in enumerate(cfg.groups):
        if not group:
            raise RatuneError(f"{source}: groups[{i}]: empty group")
        lengths = {k: len(v) for k, v in group.items()}
        for key in group:
            claim(key, f"groups[{i}].{key}")
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            raise RatuneError(f"{source}: groups[{i}]: keys that vary together need the same (non-zero) number "
                              f"of values; got {', '.join(f'{k}: {n}' for k, n in lengths.items())}")
        keys = list(group)
        dims.append([dict(zip(keys, values)) for values in zip(*(group[k] for k in keys))])
    return dims


def expand(sweep: Sweep) -> list[Cell]:
    """The sweep's cells: the Cartesian product of the axes and the groups (a group's keys take
    their i-th values together), each with its stable name and validated TrainConfig dict.

    Raises:
        RatuneError: a key that is not a TrainConfig field, a value of the wrong type (naming the
            cell), duplicate keys, groups of unequal length.
    """
    from ratune.train.config import TrainConfig

    cfg = sweep.config
    dims = _check_axes(cfg, sweep.source)
    cells = []
    for combo in itertools.product(*dims):
        axes: dict = {}
        for part in combo:
            axes.update(part)
        name = cell_name(axes)
        cell_dir = sweep.out_dir / "cells" / name
        data = copy.deepcopy(sweep.base)
        for key, value in axes.items():
            _set_dotted(data, key, value)
        hub = data.get("hub", "torchhub")
        # named by the hub's name: a catalog's folder path would not make a folder name
        data["data_dir"] = str(sweep.out_dir / "data" / _hub_name(hub, f"{sweep.source}: cell {name}"))
        data["output_dir"] = str(cell_dir / "train")
        data.setdefault("train_retriever", "none")
        if cfg.data.max_length is not None and "max_length" not in axes:
            data["max_length"] = cfg.data.max_length
        resolved = validate(TrainConfig, data, f"{sweep.source}: cell {name}").model_dump(mode="json")
        if resolved["hub"] not in HUBS:
            _check_catalog_settings(cfg.eval, f"{sweep.source}: cell {name} (catalog {hub})")
        if cfg.eval.curve_settings:
            _check_curve_saves(resolved, f"{sweep.source}: cell {name}")
        cells.append(Cell(name=name, axes=axes, config=resolved, dir=cell_dir))
    return cells


def _hub_name(hub: str, where: str) -> str:
    """:func:`ratune.data.hubs.hub_name` of a cell's ``hub`` (an APIBench name or a catalog folder).

    Raises:
        RatuneError: naming ``where``: a folder that is not (or is no longer) a catalog.
    """
    from ratune.data.hubs import hub_name

    try:
        return hub_name(hub)
    except RatuneError as exc:
        raise RatuneError(f"{where}: {exc}") from None


def _check_catalog_settings(evaluation, where: str) -> None:
    """A catalog cell's eval settings must exist for a catalog: no precomputed documents
    (``gpt_index``, ``released_bm25``: APIBench only) and no ``constraints_*`` (TorchHub only).

    Raises:
        RatuneError: naming ``where`` and the settings, with the ones a catalog has.
    """
    from ratune.registry import CATALOG_DEFAULT_SETTINGS, CONSTRAINTS_PREFIX, RETRIEVERS, setting_retriever

    asked = [*evaluation.settings, *(evaluation.curve_settings or [])]
    bad = [s for s in dict.fromkeys(asked) if s.startswith(CONSTRAINTS_PREFIX)
           or (s in TEST_SETTINGS and RETRIEVERS[setting_retriever(s)].precomputed)]
    if bad:
        raise RatuneError(f"{where}: eval settings {', '.join(bad)} exist for the APIBench hubs only (the paper's "
                          "precomputed documents, the constrained TorchHub questions); set eval.settings, e.g. "
                          f"[{', '.join(CATALOG_DEFAULT_SETTINGS)}]")


def _check_curve_saves(config: dict, where: str) -> None:
    """A cell with a learning curve must keep a Trainer checkpoint per save (``eval.curve_settings``).

    Raises:
        RatuneError: naming ``where``: the config saves no checkpoints, or deletes old ones.
    """
    strategy = config.get("save_strategy") or ("steps" if config.get("save_steps") else "no")
    if strategy == "no":
        raise RatuneError(f"{where}: eval.curve_settings evaluates the cell's Trainer checkpoints, but its training "
                          "config saves none: set save_strategy: epoch (or save_steps: N) in base")
    if config.get("save_total_limit") is not None:
        raise RatuneError(f"{where}: eval.curve_settings needs every Trainer checkpoint, but save_total_limit: "
                          f"{config['save_total_limit']} deletes older ones: remove it")


# ---------------------------------------------------------------- commands


def data_plan(sweep: Sweep, cells: list[Cell]) -> dict[str, dict]:
    """``{hub: {"dir", "modes", "tokenizer", "max_length", "chat_template"}}``: one shared data
    build per hub (built with the cells' ``chat_template``, which training checks).

    Raises:
        RatuneError: cells of one hub with different models (set data.tokenizer), max_length
            (set data.max_length) or chat_template.
    """
    plan: dict[str, dict] = {}
    for cell in cells:
        c = cell.config
        entry = plan.setdefault(c["hub"], {"dir": c["data_dir"], "modes": [], "tokenizer": set(), "max_length": set(),
                                           "chat_template": set()})
        if c["train_retriever"] not in entry["modes"]:
            entry["modes"].append(c["train_retriever"])
        entry["tokenizer"].add(sweep.config.data.tokenizer or c["model"])
        entry["max_length"].add(c["max_length"])
        entry["chat_template"].add(c.get("chat_template"))
    defined = {m.mode for m in sweep_mixtures(sweep)}
    for hub, entry in plan.items():
        undefined = [m for m in entry["modes"] if m.startswith("mix-") and m not in defined]
        if undefined:
            raise RatuneError(f"{sweep.source}: train_retriever {', '.join(undefined)} names a mixture that "
                              f"data.mixtures does not define (defined: {', '.join(sorted(defined)) or 'none'})")
        for key, hint in (("tokenizer", "data.tokenizer"), ("max_length", "data.max_length"),
                          ("chat_template", "one chat_template for the hub's cells")):
            if len(entry[key]) > 1:
                values = sorted(map(str, entry[key]))
                raise RatuneError(f"{sweep.source}: cells of hub {hub} differ in {key} ({values}); "
                                  f"the shared data build needs one: set {hint}")
            entry[key] = entry[key].pop()
    return plan


def sweep_mixtures(sweep: Sweep) -> list:
    """The sweep's ``data.mixtures`` as :class:`ratune.data.mixture.Mixture` objects.

    Raises:
        RatuneError: a malformed or invalid mixture spec (naming the sweep file).
    """
    from ratune.data.mixture import Mixture

    d = sweep.config.data
    try:
        return [Mixture.parse(spec, top1_retriever=d.top1_retriever, distractors=d.distractors,
                              seed=d.mixture_seed) for spec in d.mixtures]
    except RatuneError as err:
        raise RatuneError(f"{sweep.source}: data.mixtures: {err}") from None


def data_command(sweep: Sweep, hub: str, entry: dict) -> list[str]:
    """The ``ratune data build`` command of one hub's shared data folder."""
    d = sweep.config.data
    mixtures = {m.mode: spec for m, spec in zip(sweep_mixtures(sweep), d.mixtures)}
    plain = [m for m in entry["modes"] if m not in mixtures]
    cmd = ["ratune", "data", "build", "--hub", hub, "--out", entry["dir"], "--tokenizer", entry["tokenizer"],
           "--modes", *plain, "--max-length", str(entry["max_length"]), "--top-k", str(d.top_k),
           "--leakage", d.leakage, "--overwrite"]
    needed = [spec for mode, spec in mixtures.items() if mode in entry["modes"]]
    for spec in needed:
        cmd += ["--mixture", spec]
    if needed:
        cmd += ["--mixture-seed", str(d.mixture_seed), "--distractors", str(d.distractors),
                "--top1-retriever", d.top1_retriever]
    if d.max_document_tokens is not None:
        cmd += ["--max-document-tokens", str(d.max_document_tokens)]
    if entry.get("chat_template") is not None:
        cmd += ["--chat-template", entry["chat_template"]]
    if d.dense_model:
        cmd += ["--dense-model", d.dense_model]
    if d.bm25_backend != DEFAULT_BM25_BACKEND:
        cmd += ["--bm25-backend", d.bm25_backend]
    if sweep.config.apibench:
        cmd += ["--apibench", sweep.config.apibench]
    return cmd


def train_command(sweep: Sweep, cell: Cell, *, resume: bool = False, launch_args: list[str] | None = None) -> list[str]:
    """``accelerate launch -q [--config_file ACC] [launch_args] -m ratune.train --config CELL/train.yaml``.

    ``-q``: a failed single process ends with ratune's one-line error, without accelerate's
    ``CalledProcessError`` traceback after it (accelerate 1.15 simple and DeepSpeed launchers).
    """
    cmd = ["accelerate", "launch", "-q"]
    if sweep.config.accelerate_config:
        cmd += ["--config_file", sweep.config.accelerate_config]
    cmd += list(launch_args or []) + ["-m", "ratune.train", "--config", str(cell.dir / "train.yaml")]
    if resume:
        cmd += ["--resume-from", "latest"]
    return cmd


def eval_command(sweep: Sweep, cell: Cell, *, curve: bool = False) -> list[str]:
    """``ratune eval run --checkpoint CELL/train --out CELL/eval ...`` with the sweep's eval settings;
    with ``curve``, the learning curve's ``--all-checkpoints --out CELL/curve --settings
    CURVE_SETTINGS`` (same generation settings)."""
    e = sweep.config.eval
    out, settings = (cell.dir / "curve", e.curve_settings) if curve else (cell.dir / "eval", e.settings)
    cmd = ["ratune", "eval", "run", "--checkpoint", str(cell.dir / "train"), "--hub", cell.hub, "--out", str(out),
           *command_arguments(e.model_copy(update={"settings": settings}), EvalSettings, EVAL_OPTIONS, policy="always")]
    if curve:
        cmd += ["--all-checkpoints"]
    cmd += command_arguments(e, EvalSettings, EVAL_OPTIONS, policy="changed")
    if cell.config.get("trust_remote_code"):
        cmd += ["--trust-remote-code"]
    if sweep.config.apibench:
        cmd += ["--apibench", sweep.config.apibench]
    return cmd


def _read_cell_record(path: Path) -> dict:
    """A cell's stored ``cell.json`` (written by the sweep), checked to hold what is read from it.

    Raises:
        InputError: naming the file (and the field): not JSON (a torn write), or not a cell record.
    """
    from ratune.errors import InputError
    from ratune.io import read_json_object

    record = read_json_object(path)
    config = record.get("config")
    if not isinstance(record.get("name"), str) or not isinstance(config, dict):
        raise InputError(str(path), None, "name" if not isinstance(record.get("name"), str) else "config",
                         "missing: not a sweep cell record (delete the cell's folder to run it again)")
    for key in ("hub", "train_retriever", "model"):
        if key not in config:
            raise InputError(str(path), None, f"config.{key}", "missing: not a sweep cell record (delete the cell's "
                             "folder to run it again)")
    return record


def cell_record(sweep: Sweep, cell: Cell) -> dict:
    """What ``cell.json`` stores, and what a rerun compares: axes, resolved config, data and eval settings."""
    record = {"name": cell.name, "axes": cell.axes, "config": cell.config,
              "data": sweep.config.data.model_dump(mode="json"), "eval": sweep.config.eval.model_dump(mode="json")}
    record["config_hash"] = config_hash({k: record[k] for k in ("config", "data", "eval")})
    return record


def _diff_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _diff_keys(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


def changed_keys(sweep: Sweep, cell: Cell) -> list[str]:
    """Keys of the stored ``cell.json`` that differ from the cell's current resolution ([] when new or equal).

    The lists of eval settings and curve settings are not compared: each eval setting folder checks
    its own identity (:func:`ratune.eval.run.evaluate_checkpoint`), and a new setting simply runs. A top-level key
    that the stored record lacks and whose new value is the schema's default (a setting added to
    ratune after the cell ran, at the value that keeps the old behaviour) is not a change.
    """
    from ratune.train.config import TrainConfig

    path = cell.dir / "cell.json"
    if not path.exists():
        return []
    old = _read_cell_record(path)
    new = cell_record(sweep, cell)
    keys = []
    for part, schema in (("config", TrainConfig), ("data", SweepData), ("eval", SweepEval)):
        before, after = old.get(part) or {}, dict(new.get(part) or {})
        for key, field_info in schema.model_fields.items():
            if key not in before and key in after and not field_info.is_required() \
                    and after[key] == _json_default(field_info):
                del after[key]
        keys += [f"{part}.{k}" for k in _diff_keys(before, after)]
    return [k for k in keys if k not in ("eval.settings", "eval.curve_settings")]


def _json_default(field_info) -> Any:
    """A pydantic field's default as it appears in a JSON dump."""
    default = field_info.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else default


def is_finished(sweep: Sweep, cell: Cell) -> bool:
    """Whether a cell's training run, every eval setting of the sweep and its learning curve (if
    the sweep asks for one) are complete."""
    from ratune.manifest import is_complete

    return is_complete(cell.dir / "train") and all(
        is_complete(cell.dir / "eval" / s) and (cell.dir / "eval" / s / "metrics.json").exists()
        for s in sweep.config.eval.settings) and is_curve_finished(sweep, cell)


def is_curve_finished(sweep: Sweep, cell: Cell) -> bool:
    """Whether the cell's learning curve holds every ``eval.curve_settings`` (True when none is asked)."""
    wanted = set(sweep.config.eval.curve_settings)
    if not wanted:
        return True
    path = cell.dir / "curve" / "curve.json"
    if not path.is_file():
        return False
    from ratune.eval.curve import read_curve

    return wanted <= {r.get("setting") for r in read_curve(cell.dir / "curve") if isinstance(r, dict)}


def _fmt(cmd: list[str]) -> str:
    return shlex.join(cmd)


# ---------------------------------------------------------------- local launcher


def check_changed(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool, out=None) -> list[str]:
    """Refuse cells whose stored config differs from their current resolution, or (``rerun_changed``)
    delete their train and eval results so they run again. Returns the changed cells' names.

    Raises:
        RatuneError: listing each changed cell and its differing keys, when not ``rerun_changed``.
    """
    out = out or sys.stdout
    changed = {c.name: k for c in cells if (k := changed_keys(sweep, c))}
    if changed and not rerun_changed:
        lines = [f"  {name}: {', '.join(keys)}" for name, keys in changed.items()]
        raise RatuneError(f"{sweep.source}: {len(changed)} cell(s) ran with a different resolved config:\n"
                          + "\n".join(lines) + "\npass --rerun-changed to delete their results and rerun them")
    for cell in cells:
        if cell.name in changed:
            for sub in ("train", "eval", "error.txt"):
                path = cell.dir / sub
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            (cell.dir / "cell.json").unlink(missing_ok=True)
            print(f"[rerun] {cell.name}: config changed ({', '.join(changed[cell.name])}); results deleted", file=out)
    return list(changed)


def run_command(cmd: list[str], log_path: Path) -> None:
    """Run one command, its stdout and stderr appended to ``log_path`` (tests replace this function).

    Raises:
        RatuneError: non-zero exit: ratune's own error lines of this run when the command printed
            any (a launcher's report of the failed process comes after them in the log), else the
            last 20 lines of its log.
    """
    sibling = Path(sys.executable).parent / cmd[0]  # the same environment's ratune / accelerate first
    exe = str(sibling) if sibling.exists() else (shutil.which(cmd[0]) or cmd[0])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {_fmt(cmd)}\n")
        log.flush()
        start = log.tell()
        try:
            rc = subprocess.run([exe, *cmd[1:]], stdout=log, stderr=subprocess.STDOUT).returncode
        except OSError as exc:
            raise RatuneError(f"cannot run {cmd[0]!r}: {exc}") from None
    if rc != 0:
        with open(log_path, "rb") as log:
            log.seek(start)
            lines = log.read().decode("utf-8", errors="replace").splitlines(True)
        errors = list(dict.fromkeys(line.strip() for line in lines if line.startswith("ratune: error:")))
        shown = "\n".join(errors) + "\n" if errors else "".join(lines[-20:])
        raise RatuneError(f"`{_fmt(cmd)}` exited with status {rc}; log {log_path}:\n{shown}")


def _prepare_training(sweep: Sweep, cell: Cell) -> bool:
    """Make the run folder ready; returns whether training resumes from the latest checkpoint."""
    run_dir = cell.dir / "train"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return False
    if sweep.config.on_unfinished == "resume" and any((run_dir / "trainer").glob("checkpoint-*")):
        return True
    from ratune.manifest import require_owned

    require_owned(run_dir, "train", action="delete")  # only an unfinished ratune training run is restarted
    shutil.rmtree(run_dir)
    return False


def _run_step(runner, step: str, cell: "Cell", cmd: list[str], progress: str, out) -> None:
    """Run one step of a cell, saying which cell of how many, where its log goes, and how long it took."""
    import time

    log = cell.dir / "logs" / f"{step}.log"
    print(f"[{step}] {cell.name} {progress}: {_fmt(cmd)}\n  log: {log} (follow it with: tail -f {log})",
          file=out, flush=True)
    start = time.monotonic()
    runner(cmd, log)
    print(f"[{step}] {cell.name} {progress}: done in {time.monotonic() - start:.0f} s", file=out, flush=True)


def run_local(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool = False,
              runner: Callable[[list[str], Path], None] | None = None, out=None) -> int:
    """Run the sweep on this machine: shared data build per hub, then train and evaluate each cell.

    Finished cells are skipped; a cell whose stored config differs is refused (before anything
    runs) unless ``rerun_changed``, which deletes its results first; a failing cell's error goes to
    ``cell/error.txt`` and the sweep continues. Returns 0 when every cell finished, else 1.

    Raises:
        RatuneError: changed cells without ``rerun_changed``.
        KeyboardInterrupt: after printing where it stopped (a rerun continues).
    """
    out = out or sys.stdout
    from ratune.io import read_json_object, write_json
    from ratune.manifest import is_complete

    runner = runner or run_command
    check_changed(sweep, cells, rerun_changed=rerun_changed, out=out)
    save_sweep_file(sweep)

    plan = data_plan(sweep, cells)
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    data_errors: dict[str, str] = {}
    current = "data"
    try:
        for hub, entry in plan.items():
            if not any(not is_finished(sweep, c) for c in cells if c.hub == hub):
                continue
            manifest = Path(entry["dir"]) / "manifest.json"
            have = set(read_json_object(manifest).get("modes", [])) if manifest.exists() else set()
            if is_complete(entry["dir"]) and set(entry["modes"]) <= have:
                continue
            current = f"data {hub}"
            print(f"[data] {hub}: {_fmt(data_command(sweep, hub, entry))}", file=out)
            try:
                runner(data_command(sweep, hub, entry), sweep.out_dir / "logs" / f"data_{hub}.log")
            except RatuneError as exc:
                data_errors[hub] = str(exc)
        for number, cell in enumerate(cells, start=1):
            current = cell.name
            progress = f"({number}/{len(cells)})"
            if is_finished(sweep, cell):
                status[cell.name] = "skipped (finished)"
                print(f"[skip] {cell.name}: finished", file=out)
                continue
            cell.dir.mkdir(parents=True, exist_ok=True)
            write_json(cell.dir / "cell.json", cell_record(sweep, cell))
            (cell.dir / "train.yaml").write_text(_yaml(cell.config), encoding="utf-8")
            error_file = cell.dir / "error.txt"
            try:
                if cell.hub in data_errors:
                    raise RatuneError(f"shared data build for {cell.hub} failed: {data_errors[cell.hub]}")
                if not is_complete(cell.dir / "train"):
                    resume = _prepare_training(sweep, cell)
                    cmd = train_command(sweep, cell, resume=resume)
                    _run_step(runner, "train", cell, cmd, progress, out)
                cmd = eval_command(sweep, cell)
                _run_step(runner, "eval", cell, cmd, progress, out)
                if not is_curve_finished(sweep, cell):
                    _run_step(runner, "curve", cell, eval_command(sweep, cell, curve=True), progress, out)
                if not is_finished(sweep, cell):
                    raise RatuneError("commands succeeded but the cell's train/eval .complete markers are missing")
            except RatuneError as exc:
                error_file.write_text(f"{exc}\n", encoding="utf-8")
                status[cell.name] = "failed"
                errors[cell.name] = str(exc).splitlines()[0]
                print(f"[fail] {cell.name}: {errors[cell.name]} (see {error_file})", file=out)
                continue
            error_file.unlink(missing_ok=True)
            status[cell.name] = "finished"
    except KeyboardInterrupt:
        print(f"[stop] interrupted during {current}; rerun the same command to continue", file=out)
        raise
    done = sum(1 for s in status.values() if s != "failed")
    print(f"sweep {sweep.out_dir}: {done}/{len(cells)} cells finished, {len(errors)} failed", file=out)
    for name, err in errors.items():
        print(f"  FAILED {name}: {err}", file=out)
    return 1 if errors else 0


def save_sweep_file(sweep: Sweep) -> Path:
    """Write the validated sweep file to ``SWEEP_DIR/sweep.yaml`` (what ``report_sweep`` reads its
    chosen ``compare`` pairs from); returns its path."""
    from ratune.io import write_text

    path = sweep.out_dir / "sweep.yaml"
    write_text(path, _yaml({"source": sweep.source, **sweep.config.model_dump(mode="json")}))
    return path


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True)


# ---------------------------------------------------------------- dry run and slurm


def dry_run(sweep: Sweep, cells: list[Cell], out=None) -> int:
    """Print the cells (with their status) and the exact commands, running nothing; returns 0."""
    out = out or sys.stdout
    plan = data_plan(sweep, cells)
    print(f"sweep {sweep.source}: {len(cells)} cells -> {sweep.out_dir}", file=out)
    for hub, entry in plan.items():
        print(f"[data] {hub}: {_fmt(data_command(sweep, hub, entry))}", file=out)
    for cell in cells:
        keys = changed_keys(sweep, cell)
        state = ("finished" if is_finished(sweep, cell) else "changed: " + ", ".join(keys) if keys
                 else "partial" if cell.dir.exists() else "new")
        axes = " ".join(f"{k}={v}" for k, v in cell.axes.items())
        print(f"cell {cell.name} [{state}] {axes}", file=out)
        print(f"  train: {_fmt(train_command(sweep, cell))}", file=out)
        print(f"  eval:  {_fmt(eval_command(sweep, cell))}", file=out)
        if sweep.config.eval.curve_settings:
            print(f"  curve: {_fmt(eval_command(sweep, cell, curve=True))}", file=out)
    return 0


def _sbatch_header(job: str, log: Path, *, nodes: int, gpus: int, time: str, s: SlurmSettings) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={gpus}", f"#SBATCH --time={time}", f"#SBATCH --output={log}"]
    if s.partition:
        lines.append(f"#SBATCH --partition={s.partition}")
    lines += [f"#SBATCH {opt}" for opt in s.extra_sbatch]
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(Path.cwd()))}", *s.setup]
    return lines


def write_slurm(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool = False, out=None) -> Path:
    """Write one data sbatch script per hub, ``train.sbatch`` and ``eval.sbatch`` per cell, and
    ``slurm/submit.sh`` which submits them with ``--dependency=afterok`` chains (data -> train -> eval).

    The training script launches accelerate once per node (``srun``) with the rendezvous taken from
    SLURM's environment. Finished cells are left out of submit.sh (commented). Changed cells are
    refused as in :func:`run_local`. Returns the submit.sh path.
    """
    out = out or sys.stdout
    check_changed(sweep, cells, rerun_changed=rerun_changed, out=out)
    from ratune.io import write_json

    s = sweep.config.slurm
    plan = data_plan(sweep, cells)
    save_sweep_file(sweep)
    slurm_dir = sweep.out_dir / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    submit = ["#!/bin/bash", f"# ratune sweep {sweep.source}: {len(cells)} cells", "set -euo pipefail"]
    data_jobs = {}
    for hub, entry in plan.items():
        script = slurm_dir / f"data_{hub}.sbatch"
        lines = _sbatch_header(f"ratune-data-{hub}", slurm_dir / f"data_{hub}-%j.out", nodes=1, gpus=1,
                               time=s.eval_time or s.time, s=s)
        lines += [f"if [ -f {shlex.quote(entry['dir'])}/.complete ]; then echo 'data already built'; exit 0; fi",
                  _fmt(data_command(sweep, hub, entry))]
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        data_jobs[hub] = f"data_{hub}_jid"
        submit.append(f"data_{hub}_jid=$(sbatch --parsable {shlex.quote(str(script))})")
    nprocs = s.nodes * s.gpus_per_node
    for cell in cells:
        sdir = cell.dir / "slurm"
        sdir.mkdir(parents=True, exist_ok=True)
        write_json(cell.dir / "cell.json", cell_record(sweep, cell))
        (cell.dir / "train.yaml").write_text(_yaml(cell.config), encoding="utf-8")
        run_dir = shlex.quote(str(cell.dir / "train"))
        launch = train_command(sweep, cell, launch_args=[
            "--num_machines", "$SLURM_NNODES", "--machine_rank", "$SLURM_NODEID",
            "--main_process_ip", "$MAIN_IP", "--main_process_port", str(s.main_process_port),
            "--num_processes", str(nprocs)])
        launch_text = " ".join(a if a.startswith("$") else shlex.quote(a) for a in launch) + " $RESUME"
        train = _sbatch_header(f"ratune-train-{cell.name}"[:120], sdir / "train-%j.out", nodes=s.nodes,
                               gpus=s.gpus_per_node, time=s.time, s=s)
        train += [f"if [ -f {run_dir}/.complete ]; then echo 'cell already trained'; exit 0; fi",
                  'export MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                  'RESUME=""']
        if sweep.config.on_unfinished == "resume":  # as the sweep file says; the log shows the flag
            train.append(f"if ls -d {run_dir}/trainer/checkpoint-* >/dev/null 2>&1; "
                         f"then RESUME='--resume-from latest'; else rm -rf {run_dir}; fi")
        else:
            train.append(f"rm -rf {run_dir}  # on_unfinished: restart")
        train += ["export RESUME",
                  "# one accelerate launcher per node; $SLURM_NODEID is expanded on each node",
                  f"srun --ntasks-per-node=1 bash -c {shlex.quote(launch_text)}"]
        (sdir / "train.sbatch").write_text("\n".join(train) + "\n", encoding="utf-8")
        ev = _sbatch_header(f"ratune-eval-{cell.name}"[:120], sdir / "eval-%j.out", nodes=1, gpus=1,
                            time=s.eval_time or s.time, s=s)
        ev.append(_fmt(eval_command(sweep, cell)))
        if sweep.config.eval.curve_settings:
            ev.append(_fmt(eval_command(sweep, cell, curve=True)))
        (sdir / "eval.sbatch").write_text("\n".join(ev) + "\n", encoding="utf-8")
        prefix = "# finished: " if is_finished(sweep, cell) else ""
        submit += [f"# cell {cell.name}",
                   f"{prefix}jid=$(sbatch --parsable --dependency=afterok:${data_jobs[cell.hub]} "
                   f"{shlex.quote(str(sdir / 'train.sbatch'))})",
                   f"{prefix}sbatch --parsable --dependency=afterok:$jid {shlex.quote(str(sdir / 'eval.sbatch'))}"]
    path = slurm_dir / "submit.sh"
    path.write_text("\n".join(submit) + "\n", encoding="utf-8")
    path.chmod(0o755)
    print(f"wrote {len(cells)} cells' sbatch scripts; submit with: bash {path}", file=out)
    return path


# ---------------------------------------------------------------- report


def _flat(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def report_sweep(sweep_dir: str | Path, out_dir: str | Path | None = None,
                 pairs: list[ComparePair] | None = None) -> dict[str, dict]:
    """Collect every finished eval cell of a sweep folder into Table 2 per hub (and per value of
    the axes other than hub and train_retriever), written to ``out_dir`` (default SWEEP_DIR/report)
    as ``{group}/table2.{json,csv,md,png}``, plus ``sweep.csv`` (one row per cell and test setting,
    the axis values as columns) and ``sweep.json``. Unfinished cells are missing, never zero.

    Replicates: when several finished cells differ only in ``seed`` (a sweep axis ``seed: [1, 2,
    3]``, i.e. TrainConfig.seed), seed is not a table: each table's cells are
    :func:`ratune.eval.report.aggregate_replicates` of the seeds that finished (mean accuracy,
    hallucination, error and strict ones; sample sd and min-max across seeds; ``n_seeds``,
    ``seeds``; each seed's own Wilson interval in ``accuracy_run_ci``), table2.md shows
    ``51.3 ±4.2 sd (3 seeds)``, table2.json records ``"replicates": {"seeds", ...}``, and
    ``replicates.csv`` has one row per (cell, seed, test setting); ``sweep.json`` gets ``seeds``.
    Generation is greedy, so the seeds vary training only. Sweeps without such replicates
    (including a one-value seed axis) are reported exactly as without this rule.

    Chosen pairs (``pairs``, default the ``compare`` list of ``SWEEP_DIR/sweep.yaml``) are
    compared with paired tests by :func:`ratune.sweep_pairs.compare_pairs` and written as
    ``comparisons.{md,csv,json}``; ``sweep.json`` gets ``comparisons`` (the count per status).
    Per table, ``worst_case.md`` and ``sweep.json``'s ``worst_case`` give each trained model's
    lowest accuracy across its test settings (:mod:`ratune.eval.robustness`).
    Without replicates, ``sweep.json`` also names per table the ``best`` cell (highest gorilla
    accuracy over train x test settings; ties listed in ``tied_with``; a table whose cells all
    scored 0 has none, under ``no_best``) with its ``ratune export`` command (:func:`best_cells`).

    Returns:
        ``{group name: table}`` (group name: the hub, then ``__key-value`` of the other axes;
        without ``seed`` when replicates are aggregated).
    Raises:
        RatuneError: no finished cell; a chosen pair naming an unknown dimension or matching
            several cells in one context.
    """
    from ratune.eval.report import (GENERATION, INTERVAL, SPREAD, aggregate_replicates, make_cell, read_metrics,
                                    write_table2)
    from ratune.io import write_json, write_text
    from ratune.manifest import is_complete

    sweep_dir = Path(sweep_dir)
    experiments: list[dict] = []  # issue 9 settings: reported beside Table 2, never in it
    experiment_paths: list[Path] = []  # their metrics.json files (listed in sweep.json sources)
    abstention_by_cell = {}  # false abstention: abstaining under oracle, where the document answers
    out = Path(out_dir) if out_dir else sweep_dir / "report"
    rows = []
    finished = []  # dimensions and metrics.json of each finished eval cell (chosen-pair comparisons)
    axis_keys: list[str] = []
    if not sweep_dir.is_dir():
        raise RatuneError(f"{sweep_dir}: no such sweep folder")
    for cell_json in sorted((sweep_dir / "cells").glob("*/cell.json")):
        record = _read_cell_record(cell_json)
        for k in record.get("axes", {}):
            if k not in axis_keys:
                axis_keys.append(k)
        config = record["config"]
        eval_dir = cell_json.parent / "eval"
        settings = [s for s in TABLE_SETTINGS if (eval_dir / s).is_dir()]
        settings += sorted(p.name for p in eval_dir.glob("*") if p.is_dir() and p.name not in settings) \
            if eval_dir.is_dir() else []
        for setting in settings:
            folder = eval_dir / setting
            if not (is_complete(folder) and (folder / "metrics.json").exists()):
                continue
            if setting in EXPERIMENT_SETTINGS:
                experiments.append({"cell": record["name"], "axes": record.get("axes", {}), "setting": setting,
                                    "train_retriever": config["train_retriever"],
                                    "metrics": read_metrics(folder / "metrics.json")})
                experiment_paths.append(folder / "metrics.json")
                continue
            cell_metrics = read_metrics(folder / "metrics.json")
            if setting == "oracle" and cell_metrics.get("abstention"):
                abstention_by_cell[record["name"]] = cell_metrics["abstention"]
            table_cell = make_cell(config["train_retriever"], setting, cell_metrics)
            rows.append((record, table_cell))
            finished.append({"dims": {**record.get("axes", {}), "hub": _hub_name(config["hub"], record["name"]),
                                      "train_retriever": config["train_retriever"], "test_retriever": setting},
                             "cell": record["name"], "metrics_path": folder / "metrics.json", "n": cell_metrics["n"]})
    if not rows:
        raise RatuneError(f"{sweep_dir}: no finished eval cells (cells/*/eval/*/.complete) to report")


    def group_of(record: dict, drop_seed: bool) -> str:
        others = {k: v for k, v in record.get("axes", {}).items()
                  if k not in ("hub", "train_retriever") and not (drop_seed and k == "seed")}
        return _hub_name(record["config"]["hub"], record["name"]) + "".join(f"__{k.replace('.', '-')}-{_slug_value(v)}"
                                                      for k, v in sorted(others.items()))

    def seed_of(record: dict) -> Any:
        return record.get("axes", {}).get("seed", record["config"].get("seed"))

    # replicates: finished cells that land on the same table cell once seed is ignored
    buckets: dict[tuple, list] = {}
    for record, c in rows:
        buckets.setdefault((group_of(record, True), c["train_retriever"], c["test_retriever"]), []).append(
            (record, c))
    replicate = any(len(v) > 1 for v in buckets.values())

    groups: dict[str, dict] = {}
    if replicate:
        for (group, _, _), runs in buckets.items():
            g = groups.setdefault(group, {"hub": _hub_name(runs[0][0]["config"]["hub"], runs[0][0]["name"]),
                                          "cells": [], "seeds": [],
                                          "model": Path(str(runs[0][0]["config"]["model"])).name})
            seeds = [seed_of(r) for r, _ in runs]
            agg = aggregate_replicates([c for _, c in runs], seeds)
            by_seed = {json.dumps(seed_of(r), default=str): r["name"] for r, _ in runs}
            agg["run_cells"] = [by_seed.get(json.dumps(s, default=str)) for s in agg["seeds"]]
            g["cells"].append(agg)
            g["seeds"] += [s for s in agg["seeds"] if s not in g["seeds"]]
    else:
        for record, c in rows:
            config = record["config"]
            g = groups.setdefault(group_of(record, False),
                                  {"hub": _hub_name(config["hub"], record["name"]),
                                   "model": Path(str(config["model"])).name, "cells": []})
            g["cells"].append(c)

    def replicates_info(seeds: list) -> dict:
        return {"seeds": _sorted_seeds(seeds), "aggregate": "mean over seeds", "spread": SPREAD,
                "run_interval": INTERVAL, "generation": GENERATION, "runs": "replicates.csv"}

    if replicate:
        tables = {name: write_table2(g["cells"], hub=g["hub"], model=g["model"], out_dir=out / name,
                                     replicates=replicates_info(g["seeds"]))
                  for name, g in sorted(groups.items())}
    else:
        tables = {name: write_table2(g["cells"], hub=g["hub"], model=g["model"], out_dir=out / name)
                  for name, g in sorted(groups.items())}
    rates = ("accuracy", "hallucination", "error")
    rate_columns = [*(x for r in rates for x in (r, f"{r}_low", f"{r}_high")),
                    *(f"strict_{x}" for r in rates for x in (r, f"{r}_low", f"{r}_high"))]
    header = ["cell", *axis_keys, "hub", "model", "train_retriever", "test_retriever", "n", *rate_columns]

    def values(m: dict) -> list[str]:
        vals = []
        for r in rates:
            ci = m.get(f"{r}_ci")
            vals += [f"{m[r]:.6f}" if r in m else "", *([f"{ci[0]:.6f}", f"{ci[1]:.6f}"] if ci else ["", ""])]
        return vals

    def run_row(record: dict, c: dict, keys: list[str] = axis_keys) -> list:
        config = record["config"]
        return [record["name"], *(_flat(record["axes"].get(k, "")) for k in keys), config["hub"],
                config["model"], c["train_retriever"], c["test_retriever"], c["n"],
                *values(c), *values(c.get("strict") or {})]

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for record, c in rows:
        writer.writerow(run_row(record, c))
    write_text(out / "sweep.csv", buf.getvalue())
    summary: dict = {"axes": axis_keys, "tables": tables}
    from ratune.io import sha256_file

    curve_paths = sorted((sweep_dir / "cells").glob("*/curve/curve.json"))
    summary["sources"] = {str(path.relative_to(sweep_dir)): sha256_file(path)  # every metrics.json read
                          for path in [*(f["metrics_path"] for f in finished), *experiment_paths, *curve_paths]}
    if curve_paths:  # learning curves, labelled by the cell's axis values
        from ratune.eval.curve import read_curve, write_curves_report

        curves = {}
        for path in curve_paths:
            record = _read_cell_record(path.parent.parent / "cell.json")
            label = " ".join(f"{k}={_flat(v)}" for k, v in record.get("axes", {}).items()) or record["name"]
            curves[label] = read_curve(path.parent)
        write_curves_report(curves, out)
        summary["learning_curves"] = list(curves)
    if replicate:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        other_keys = [k for k in axis_keys if k != "seed"]
        writer.writerow(["group", "seed", *(k for k in header if k != "seed")])
        for record, c in sorted(rows, key=lambda rc: (group_of(rc[0], True), rc[1]["train_retriever"],
                                                      rc[1]["test_retriever"], _seed_key(seed_of(rc[0])))):
            writer.writerow([group_of(record, True), _flat(seed_of(record)), *run_row(record, c, other_keys)])
        write_text(out / "replicates.csv", buf.getvalue())
        summary["seeds"] = _sorted_seeds([seed_of(r) for r, _ in rows])
        summary["replicates"] = replicates_info(summary["seeds"])
    from ratune.eval.robustness import worst_case, worst_case_markdown

    summary["worst_case"] = {}
    for name, table in tables.items():  # each trained model's lowest accuracy across test settings
        summary["worst_case"][name] = worst_case(table["cells"])
        write_text(out / name / "worst_case.md", worst_case_markdown(summary["worst_case"][name]))
    if not replicate:  # the checkpoint to export: the highest gorilla accuracy per table
        summary["best"], summary["no_best"] = best_cells(sweep_dir, rows, lambda record: group_of(record, False))
    if experiments:
        from ratune.eval.robustness import experiments_markdown, experiment_rows

        exp_rows = experiment_rows(experiments, abstention_by_cell)
        write_json(out / "experiments.json", {"experiments": exp_rows})
        write_text(out / "experiments.md", experiments_markdown(exp_rows))
        summary["experiments"] = len(exp_rows)
    if pairs is None:
        pairs = load_compare_pairs(sweep_dir)
    if pairs:
        from ratune.sweep_pairs import comparisons_csv_rows, comparisons_markdown, compare_pairs

        results = compare_pairs(finished, pairs)
        write_json(out / "comparisons.json", {"comparisons": results})
        write_text(out / "comparisons.md", comparisons_markdown(results))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(comparisons_csv_rows(results))
        write_text(out / "comparisons.csv", buf.getvalue())
        summary["comparisons"] = {status: sum(r["status"] == status for r in results)
                                  for status in ("ok", "missing", "refused")}
    released_cells = [{"cell": " ".join(f"{k}={_flat(v)}" for k, v in f["dims"].items() if k != "test_retriever"),
                       "path": f["metrics_path"].parent, "setting": f["dims"]["test_retriever"],
                       "hub": f["dims"]["hub"], "n": f["n"]} for f in finished
                      if f["dims"]["hub"] in HUBS]  # released Gorilla-7B responses exist for APIBench only
    if any(TEST_SETTINGS[c["setting"]].released for c in released_cells if c["setting"] in TEST_SETTINGS):
        from ratune.eval.compare import released_comparisons, released_markdown

        results, skipped = released_comparisons(released_cells, _sweep_apibench(sweep_dir))
        if results:  # every cell on all questions vs the released Gorilla-7B responses, same documents
            write_json(out / "released.json", {"comparisons": results, "skipped": skipped})
            write_text(out / "released.md", released_markdown(results))
            summary["released"] = {"comparisons": len(results), "skipped": skipped}
    write_json(out / "sweep.json", summary)
    return tables


def _sweep_apibench(sweep_dir: Path) -> str | None:
    """The ``apibench`` folder the sweep file saved in SWEEP_DIR/sweep.yaml names (None: the default)."""
    path = sweep_dir / "sweep.yaml"
    return load_yaml(path).get("apibench") if path.is_file() else None


def load_compare_pairs(sweep_dir: str | Path) -> list[ComparePair]:
    """The ``compare`` pairs of ``SWEEP_DIR/sweep.yaml`` (empty when the file or the key is absent).

    Raises:
        RatuneError: the stored pairs do not validate (naming the file).
    """
    from pydantic import ValidationError

    path = Path(sweep_dir) / "sweep.yaml"
    if not path.is_file():
        return []
    data = load_yaml(path)
    try:
        return [ComparePair.model_validate(p) for p in data.get("compare") or []]
    except ValidationError as err:
        raise RatuneError(f"{path}: compare: {err}") from None


def _seed_key(seed: Any) -> tuple:
    return (0, seed, "") if isinstance(seed, (int, float)) and not isinstance(seed, bool) else (1, 0, str(seed))


def _sorted_seeds(seeds: list) -> list:
    unique: list = []
    for s in seeds:
        if s not in unique:
            unique.append(s)
    return sorted(unique, key=_seed_key)


def cli_report_sweep(sweep_dir: str, out: str | None = None, pair_args: list[list[str]] | None = None) -> int:
    """``ratune report SWEEP_DIR [--out DIR] [--pair A B ...]``: write the sweep report and print
    each table (and the chosen-pair comparisons); returns 0.

    ``pair_args``: ``[[selector A, selector B], ...]`` as ``key=value,key=value`` text; when given
    they replace the sweep file's ``compare`` list.
    """
    from ratune.eval.report import table2_markdown
    from ratune.sweep_pairs import parse_selector

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
    if pairs is not None or load_compare_pairs(sweep_dir):
        print((report_dir / "comparisons.md").read_text(encoding="utf-8"))
    from ratune.io import read_json_object

    summary = read_json_object(report_dir / "sweep.json")
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
    print(f"wrote {Path(out) if out else Path(sweep_dir) / 'report'} (sweep.csv, {len(tables)} table(s))")
    return 0


def best_cells(sweep_dir: Path, rows: list, group_of) -> tuple[dict, dict]:
    """The cell to export per table: the highest gorilla accuracy over train x test settings.

    Args:
        sweep_dir: the sweep folder (the export command names the cell's folders in it).
        rows: ``(cell record, table cell)`` of every finished Table 2 cell.
        group_of: the table a cell record belongs to.
    Returns:
        ``(best, no_best)``: ``best[table]`` is the first cell (in cell order) with the highest
        accuracy, with ``tied_with`` listing the other cells (other checkpoints) that reach
        exactly that accuracy under some test setting (a tie is reported, never broken silently); ``no_best[table]`` says why a table has none (every
        cell scored 0: there is nothing to choose).
    """
    by_group: dict[str, list] = {}
    for record, c in rows:
        by_group.setdefault(group_of(record), []).append((record, c))
    best, no_best = {}, {}
    for group, cells in by_group.items():
        metric = headline_metric([c for _, c in cells])  # gorilla on APIBench; a catalog's cells: strict

        def accuracy(c: dict) -> float:
            return metric_block(c, metric).get("accuracy", 0.0)

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


# ---------------------------------------------------------------- CLI


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``ratune sweep``: FILE, --dry-run, --launcher, --out, --rerun-changed."""
    from ratune.args import input_file, output_dir

    parser.add_argument("file", type=input_file, help="sweep file (YAML)")
    parser.add_argument("--dry-run", action="store_true", help="print the cells and commands; run nothing")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local",
                        help="local: run the commands here; slurm: write sbatch scripts and submit.sh")
    parser.add_argument("--out", default=None, type=output_dir, help="sweep folder (default: the file's out_dir)")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="delete and rerun cells whose resolved config changed since they ran")


def cli_sweep(args: argparse.Namespace) -> int:
    """Run ``ratune sweep`` from parsed arguments (see :func:`add_sweep_arguments`); returns the exit status."""
    sweep = load_sweep(args.file, args.out)
    cells = expand(sweep)
    if args.dry_run:
        return dry_run(sweep, cells)
    if args.launcher == "slurm":
        write_slurm(sweep, cells, rerun_changed=args.rerun_changed)
        return 0
    return run_local(sweep, cells, rerun_changed=args.rerun_changed)
