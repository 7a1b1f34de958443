"""A sweep's cells: the grid of axes and groups expanded into named, validated training configs,
and the shared data build per hub they need (:func:`data_plan`)."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ratune.config import parse_yaml, validate
from ratune.hubs import resolve_hub
from ratune.data.mixture import Mixture
from ratune.errors import RatuneError
from ratune.eval.questions import split_refusal
from ratune.eval.settings import needs_finetuned_retriever
from ratune.eval.selection import get_selection_rule
from ratune.retrieval.dense import require_held_out
from ratune.retrieval.finetune import retriever_examples
from ratune.retrieval.retrievers import require_finetuned_retriever
from ratune.sources.validate import HoldoutSettings
from ratune.sweep.schema import Sweep, SweepConfig, parse_only
from ratune.train.config import TrainConfig


#: Keys the sweep owns in every cell's training config (folders inside the sweep folder).
OWNED_KEYS = ("data_dir", "output_dir")


@dataclass
class Cell:
    """One point of the sweep grid: its stable folder name, ``{dotted key: value}`` axes and resolved
    TrainConfig dict."""

    name: str
    axes: dict
    config: dict
    dir: Path = field(default=Path("."))

    @property
    def hub(self) -> str:
        """The cell's hub."""
        return self.config["hub"]


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


def _value_text(value: Any) -> str:
    """An axis value as text (sorted JSON for a dict or list), as cell names and ``--only`` use it."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def _slug_value(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", _value_text(value)).strip("-") or "x"


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
    """The sweep's cells: the product of the axes and the groups (a group's keys vary together).

    Raises:
        RatuneError: a key that is not a TrainConfig field, a value of the wrong type (naming the
            cell), duplicate keys, groups of unequal length, a rule mapping without the cell's arm.
    """
    cfg = sweep.config
    dims = _check_axes(cfg, sweep.source)
    _check_selection(sweep)
    cells, checked_hubs = [], set()
    for combo in itertools.product(*dims):
        axes: dict = {}
        for part in combo:
            axes.update(part)
        name = cell_name(axes)
        cell_dir = sweep.out_dir / "cells" / name
        data = copy.deepcopy(sweep.base)
        for key, value in axes.items():
            _set_dotted(data, key, value)
        hub = _cell_hub(data.get("hub", "torchhub"), f"{sweep.source}: cell {name}")
        if hub.ref not in checked_hubs:
            _check_validation_retriever(sweep, hub)
            checked_hubs.add(hub.ref)
        # named by the hub's name: a catalog's folder path would not make a folder name
        data["data_dir"] = str(sweep.out_dir / "data" / hub.name)
        data["output_dir"] = str(cell_dir / "train")
        data.setdefault("train_retriever", "none")
        if cfg.data.max_length is not None and "max_length" not in axes:
            data["max_length"] = cfg.data.max_length
        resolved = validate(TrainConfig, data, f"{sweep.source}: cell {name}").model_dump(mode="json")
        hub.check_settings([*cfg.eval.settings, *(cfg.eval.curve_settings or [])], f"{sweep.source}: cell {name}")
        if cfg.eval.curve_settings:
            _check_curve_saves(resolved, f"{sweep.source}: cell {name}")
        cells.append(Cell(name=name, axes=axes, config=resolved, dir=cell_dir))
        rule = selection_rule_of(sweep, cells[-1])
        if cfg.eval.selection_rule is not None and rule is None:
            raise RatuneError(f"{sweep.source}: eval.selection_rule names no rule for train_retriever "
                              f"{resolved['train_retriever']} (cell {name}); give one for every arm")
        if rule is not None:
            get_selection_rule(rule).check_hub(hub, cfg.eval.selection_metric, f"{sweep.source}: cell {name}")
    if isinstance(cfg.eval.selection_rule, dict):
        unused = sorted(set(cfg.eval.selection_rule) - {c.config["train_retriever"] for c in cells})
        if unused:
            raise RatuneError(f"{sweep.source}: eval.selection_rule names {', '.join(unused)}, which no cell trains "
                              "with (a train_retriever of the axes or base)")
    return cells


def select_cells(cells: list[Cell], only: list[str], source: str) -> list[Cell]:
    """The cells, in order, whose axis values match ``only`` (``--only KEY=VALUE``: one key's values
    are alternatives, keys must all match; a value matches as YAML or as text).

    Raises:
        RatuneError: an entry without ``=``, a key that is no axis or group key, or a value no cell has.
    """
    def reading(text: str) -> Any:  # the YAML value of a choice, or its text when it is not YAML
        try:
            return parse_yaml(text, "--only", what="an axis value")
        except RatuneError:
            return text

    wanted: dict[str, list[tuple[str, Any]]] = {}  # key -> its choices as (text, YAML reading), read once
    for entry in only:
        try:
            key, text = parse_only(entry)
        except RatuneError as exc:
            raise RatuneError(f"--only {exc}") from None
        wanted.setdefault(key, []).append((text, reading(text)))
    keys = sorted({k for c in cells for k in c.axes})

    def matches(value: Any, choice: tuple[str, Any]) -> bool:
        return choice[1] == value or choice[0] == _value_text(value)

    for key, choices in wanted.items():
        if key not in keys:
            raise RatuneError(f"{source}: --only {key}: not an axis or group key of this sweep "
                              f"(its keys: {', '.join(keys) or 'none, it has one cell'})")
        for choice in choices:
            if not any(matches(c.axes[key], choice) for c in cells):
                values = dict.fromkeys(_value_text(c.axes[key]) for c in cells)
                raise RatuneError(f"{source}: --only {key}={choice[0]}: no cell has it "
                                  f"({key} takes {', '.join(values)})")
    return [c for c in cells if all(any(matches(c.axes[key], ch) for ch in choices) for key, choices in wanted.items())]


def _cell_hub(hub: str, where: str):
    """The hub a cell's ``hub`` names (its folder looked for when first read).

    Raises:
        RatuneError: naming ``where``: a folder that is not (or is no longer) a catalog.
    """
    try:
        return resolve_hub(hub, locate=False)
    except RatuneError as exc:
        raise RatuneError(f"{where}: {exc}") from None


def cell_hub_name(hub: str, where: str) -> str:
    """The name of a cell's hub (what report folders and sweep data folders are called).

    Raises:
        RatuneError: as :func:`_cell_hub`.
    """
    return _cell_hub(hub, where).name


def selection_rule_of(sweep: Sweep, cell: Cell) -> str | None:
    """The rule that chooses ``cell``'s checkpoint: ``eval.selection_rule``, or its entry for the
    cell's train_retriever when it is a mapping (None: no selection)."""
    rule = sweep.config.eval.selection_rule
    return rule.get(cell.config["train_retriever"]) if isinstance(rule, dict) else rule


def selection_path(cell: Cell) -> Path:
    """``CELL/selection.json``: the checkpoint ``eval.selection_rule`` chose on the cell's curve."""
    return cell.dir / "selection.json"


def validation_settings(sweep: Sweep) -> list[str]:
    """The test settings a sweep runs on the validation questions: ``eval.curve_settings`` under a
    selection rule, and ``eval.settings`` and ``eval.curve_settings`` with ``eval.split: validation``."""
    e = sweep.config.eval
    curve = list(e.curve_settings or ()) if e.selection_rule is not None or e.split == "validation" else []
    return [*curve, *(s for s in e.settings if e.split == "validation" and s not in curve)]


def _check_selection(sweep: Sweep) -> None:
    """Refuse a sweep that tests nothing (no ``eval.settings``, no ``bfcl:``), ``eval.selection_rule``
    without a curve or with ``eval.split`` changed, and settings on the validation questions
    (:func:`validation_settings`) without a validation split or that exist for test questions only.

    Raises:
        RatuneError: naming the sweep file and the missing or refused setting.
    """
    e = sweep.config.eval
    if not e.settings and sweep.config.bfcl is None:
        raise RatuneError(f"{sweep.source}: eval.settings is empty and there is no bfcl: section, so no cell would be "
                          "tested; name eval.settings (the hub's test questions) or add a bfcl: section")
    if e.selection_rule is not None:
        where = f"{sweep.source}: eval.selection_rule {e.selection_rule}"
        if not e.curve_settings:
            raise RatuneError(f"{where}: the checkpoint is chosen on a learning curve; set eval.curve_settings")
        if e.split != "eval":
            raise RatuneError(f"{where}: eval.settings read the chosen checkpoint's test questions; leave eval.split "
                              "at eval (the curve runs on validation)")
    on_validation = validation_settings(sweep)
    if not on_validation:
        return
    why = "eval.selection_rule" if e.selection_rule is not None else "eval.split validation"
    if sweep.config.data.validation_fraction is None:
        raise RatuneError(f"{sweep.source}: {why}: {', '.join(on_validation)} run on the validation questions; "
                          "set data.validation_fraction")
    for setting in on_validation:
        refusal = split_refusal(setting, "validation")
        if refusal:
            raise RatuneError(f"{sweep.source}: {why}: {refusal}")


def _check_validation_retriever(sweep: Sweep, hub) -> None:
    """Refuse, before anything runs, settings on the validation questions (:func:`validation_settings`)
    whose ``dense_ft`` would retrieve with a finetuned retriever that trained on them: the questions
    are the ones ``data:``'s split draws from ``hub`` under ``data.leakage``
    (:func:`ratune.retrieval.finetune.retriever_examples`, as ``ratune retrieval train`` draws them).

    Raises:
        RatuneError: naming the sweep file, the setting and the command that trains a retriever without them.
    """
    e, d = sweep.config.eval, sweep.config.data
    finetuned = [s for s in validation_settings(sweep) if needs_finetuned_retriever(s)]
    if not finetuned:
        return
    where = "eval.curve_settings" if finetuned[0] in (e.curve_settings or ()) else "eval.settings"
    what = f"{sweep.source}: {where} {finetuned[0]} (the validation questions)"
    require_finetuned_retriever(e.dense_model, hub.name, what)
    split = HoldoutSettings(validation_fraction=d.validation_fraction, validation_by=d.validation_by,
                            validation_seed=d.validation_seed)
    held = retriever_examples(hub, split, leakage=d.leakage)[1]
    require_held_out(e.dense_model, held, hub=hub.ref, train_path=hub.examples_file("train"), what=what)


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


def data_plan(sweep: Sweep, cells: list[Cell]) -> dict[str, dict]:
    """``{hub: {"dir", "modes", "tokenizer", "max_length", "chat_template"}}``: one shared data build per hub.

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
    d = sweep.config.data
    try:
        return [Mixture.parse(spec, top1_retriever=d.top1_retriever, distractors=d.distractors,
                              seed=d.mixture_seed) for spec in d.mixtures]
    except RatuneError as err:
        raise RatuneError(f"{sweep.source}: data.mixtures: {err}") from None
