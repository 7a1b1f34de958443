"""Resumable eval cells (``ratune eval run``'s settings, ``ratune eval bfcl``'s categories): a cell's
recorded identity, checked on every rerun, and its ``responses.jsonl``, appended and fsynced a batch
at a time, so a killed run loses at most one batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tqdm.auto import tqdm

from ratune.errors import InputError, RatuneError
from ratune.io import atomic_write, iter_jsonl, read_json, write_json

#: What each id type is called in the refusal of a line whose id is not one.
_KIND_NAMES = {int: "an integer", str: "a string"}


def _flat(record: dict, prefix: str = "") -> dict:
    """A nested identity as ``{"generation.max_new_tokens": 80, ...}`` (dotted keys name the setting)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_cell_identity(cell: Path, identity: dict) -> None:
    """Record what a cell is computed from (``cell/identity.json``); refuse to continue or reuse a
    cell made from another checkpoint, question set or generation settings.

    Raises:
        RatuneError: naming the cell and the keys that differ.
    """
    path = cell / "identity.json"
    if path.exists():
        previous, identity = _flat(read_json(path)), _flat(identity)
        changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
        if changed:
            diffs = "; ".join(f"{k}: {previous.get(k, '(unset)')!r} then, {identity.get(k, '(unset)')!r} now"
                              for k in changed)
            raise RatuneError(f"{cell}: this eval cell was made with different settings ({diffs}); "
                              "choose another --out folder (or delete the cell to redo it)")
        return
    cell.mkdir(parents=True, exist_ok=True)
    write_json(path, identity)


def read_done(path: Path, *, key: str = "question_id", kind: type = int) -> dict:
    """The complete lines of a partly written responses file by their ``key``; a torn last line (no
    newline: cut mid-write) is dropped from the file.

    Raises:
        InputError: a line that is not JSON, or whose ``key`` is not a ``kind`` (naming file and line).
    """
    done = {}
    if not path.exists():
        return done
    with open(path, "rb") as fh:
        data = fh.read()
    keep = data[:data.rfind(b"\n") + 1]  # a line without its newline was cut mid-write
    if len(keep) != len(data):
        with open(path, "wb") as fh:
            fh.write(keep)
    for number, row in iter_jsonl(path):  # a corrupt line: InputError naming file and line
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InputError(str(path), number, key, f"expected {_KIND_NAMES[kind]}, got {value!r} (delete the "
                             "cell's folder to evaluate it again)")
        done[value] = row
    return done


def append_responses(path: Path, done: dict, ids: Sequence, prompts: Sequence, *,
                     batches: Callable[[list], Iterable[list[tuple[int, str]]]], meta: dict,
                     key: str = "question_id", order: Callable[[dict], object] | None = None, desc: str = "",
                     progress: bool = True) -> list[dict]:
    """Answer the ids that ``done`` (:func:`read_done`) lacks, appending and fsyncing each batch to
    ``path``, then rewrite the file sorted by ``order`` (default: the id), every line with ``meta``.
    ``batches`` yields ``(index into the prompts still to answer, text)``. Returns the lines
    (``{key, "text", **meta}``) in ``ids`` order.
    """
    todo = [i for i, k in enumerate(ids) if k not in done]
    if todo:
        bar = tqdm(total=len(ids), initial=len(ids) - len(todo), desc=desc, disable=not progress)
        with open(path, "a", encoding="utf-8") as fh:
            for batch in batches([prompts[i] for i in todo]):
                for j, text in batch:
                    row = {key: ids[todo[j]], "text": text, **meta}
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    done[row[key]] = row
                fh.flush()
                os.fsync(fh.fileno())
                bar.update(len(batch))
        bar.close()
        # generation wrote in batch order; lines of an interrupted earlier run take this run's meta
        done.update({k: {**row, **meta} for k, row in done.items()})
        with atomic_write(path) as fh:
            for row in sorted(done.values(), key=order or (lambda r: r[key])):
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return [done[k] for k in ids]
