"""A cell's state: its stored ``cell.json``, what changed since it ran, whether it is finished."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratune.errors import InputError, RatuneError
from ratune.eval.curve import read_curve
from ratune.io import read_json_object
from ratune.manifest import is_complete
from ratune.eval.settings import needs_finetuned_retriever
from ratune.retrieval.retrievers import require_finetuned_retriever
from ratune.sweep.cells import Cell, cell_hub_name, config_hash, selection_path
from ratune.sweep.schema import Sweep, SweepData, SweepEval
from ratune.train.config import TrainConfig


def _read_cell_record(path: Path) -> dict:
    """A cell's stored ``cell.json``, checked to hold what is read from it.

    Raises:
        InputError: not JSON (a torn write), or not a cell record.
    """
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
    """Keys of the stored ``cell.json`` that differ from the cell's current resolution ([] when new or
    equal), except the eval and curve settings lists (each setting folder checks its own identity); a
    key the record lacks, now at its schema default (a setting added later), is no change."""
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
    """Whether a cell's training run, every eval setting of the sweep, its learning curve and its
    BFCL categories (if the sweep asks for them) are complete."""
    chosen = sweep.config.eval.selection_rule is None or selection_path(cell).is_file()
    return is_complete(cell.dir / "train") and all(
        is_complete(cell.dir / "eval" / s) and (cell.dir / "eval" / s / "metrics.json").exists()
        for s in sweep.config.eval.settings) and is_curve_finished(sweep, cell) and is_bfcl_finished(sweep, cell) \
        and chosen


def require_finetuned_retrievers(sweep: Sweep, cells: list[Cell]) -> None:
    """Refuse, before anything runs, unfinished ``cells`` whose ``eval.settings`` or
    ``eval.curve_settings`` retrieve with the finetuned retriever while ``eval.dense_model`` is no
    retriever folder for the cell's hub (otherwise found only once training is over).

    Raises:
        RatuneError: naming the sweep file, the key, the setting and the cell, as
            :func:`ratune.retrieval.retrievers.require_finetuned_retriever` words it.
    """
    e = sweep.config.eval
    needs = [(key, s) for key, settings in (("eval.settings", e.settings), ("eval.curve_settings", e.curve_settings))
             for s in settings or () if needs_finetuned_retriever(s)]
    if not needs:
        return
    key, setting = needs[0]
    checked: set[str] = set()  # hubs whose retriever folder passed
    for cell in cells:
        if cell.hub in checked or is_finished(sweep, cell):
            continue
        where = f"{sweep.source}: cell {cell.name}"
        require_finetuned_retriever(e.dense_model, cell_hub_name(cell.hub, where), f"{where}: {key} {setting}")
        checked.add(cell.hub)


def is_bfcl_finished(sweep: Sweep, cell: Cell) -> bool:
    """Whether every BFCL category of the sweep's ``bfcl:`` section is complete in CELL/bfcl (True
    without one)."""
    from ratune.eval.bfcl import CATEGORIES

    b = sweep.config.bfcl
    return b is None or all(is_complete(cell.dir / "bfcl" / c) for c in (b.categories or CATEGORIES))


def is_curve_finished(sweep: Sweep, cell: Cell) -> bool:
    """Whether the cell's learning curve holds every ``eval.curve_settings`` (True when none is asked)."""
    wanted = set(sweep.config.eval.curve_settings)
    if not wanted:
        return True
    path = cell.dir / "curve" / "curve.json"
    if not path.is_file():
        return False
    return wanted <= {r.get("setting") for r in read_curve(cell.dir / "curve") if isinstance(r, dict)}


#: The folders of what a cell read from its trained checkpoints with its ``eval`` settings, which
#: ``--rerun-changed`` deletes (with the choice and ``error.txt``) when those alone changed; ``bfcl/``
#: follows them only under a selection rule (it reads the checkpoint chosen on the curve, else the
#: last one, by the ``bfcl:`` settings, which each category checks itself).
EVALUATION_RESULTS = ("eval", "curve")


def check_changed(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool, out=None) -> list[str]:
    """Refuse cells whose stored config differs from their current resolution, or (``rerun_changed``)
    delete their results so they run again; returns the changed cells' names. A cell whose ``eval``
    settings alone changed loses its :data:`EVALUATION_RESULTS`, choice and ``error.txt`` (and
    ``bfcl/`` where a selection rule was or is set) and keeps its training; any other change deletes
    everything it ran.

    Raises:
        RatuneError: listing each changed cell and its differing keys, when not ``rerun_changed``.
    """
    out = out or sys.stdout
    changed = {c.name: k for c in cells if (k := changed_keys(sweep, c))}
    if changed and not rerun_changed:
        lines = [f"  {name}: {', '.join(keys)}" for name, keys in changed.items()]
        raise RatuneError(f"{sweep.source}: {len(changed)} cell(s) ran with a different resolved config:\n"
                          + "\n".join(lines) + "\npass --rerun-changed to delete their results and rerun them "
                          "(a change of eval settings alone keeps the training)")
    for cell in cells:
        if cell.name in changed:
            keys = changed[cell.name]
            retrain = any(not k.startswith("eval.") for k in keys)
            chosen = "eval.selection_rule" in keys or sweep.config.eval.selection_rule is not None
            subs = (("train",) if retrain else ()) + EVALUATION_RESULTS + (("bfcl",) if retrain or chosen else ())
            for sub in subs + (selection_path(cell).name, "error.txt"):
                path = cell.dir / sub
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            (cell.dir / "cell.json").unlink(missing_ok=True)
            done = "results deleted" if retrain else "evaluations deleted, training kept"
            print(f"[rerun] {cell.name}: config changed ({', '.join(keys)}); {done}", file=out)
    return list(changed)
