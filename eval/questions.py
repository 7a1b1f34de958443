"""The questions an eval asks (``--split``): the hub's test questions, or the validation questions
held out of the data build a checkpoint was trained on (docs/pipeline.md, "Validation split")."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import NamedTuple

from ratune.errors import RatuneError
from ratune.hubs import Hub
from ratune.io import read_json_object
from ratune.registry import RETRIEVERS, setting_retriever
from ratune.train.layout import trained_data_dir

class Questions(NamedTuple):
    """An eval's questions: ``examples``; for ``validation`` questions, ``record``, what the cells'
    identity records of them (the data build and the held-out lines), and ``held_out``, the data
    build's ``validation_split`` record (None for the test questions)."""

    examples: list
    record: dict | None
    held_out: dict | None


def questions(hub: Hub, split: str, checkpoint: str | os.PathLike) -> Questions:
    """The questions of ``split`` (:class:`Questions`).

    ``validation``: the hub's training examples whose lines the data manifest of
    ``checkpoint``'s run records as held out (``validation_split.lines``), in that order, with
    ``split`` ``validation`` and numbered 1..n (their question_ids).

    Raises:
        RatuneError: no run manifest naming the data, a data build without a validation split or
            of another hub, or a held-out line the hub's training file does not have.
    """
    if split == "eval":
        return Questions(hub.load_examples("eval"), None, None)
    data_dir = trained_data_dir(checkpoint)
    if data_dir is None:
        raise RatuneError(f"--split validation: {checkpoint} has no run manifest naming the data it was trained on; "
                          "validation questions are those its data build held out")
    manifest_path = Path(data_dir) / "manifest.json"
    if not manifest_path.is_file():
        raise RatuneError(f"--split validation: {manifest_path}: not found (the data {checkpoint} was trained on)")
    manifest = read_json_object(manifest_path)
    held = manifest.get("validation_split")
    if not isinstance(held, dict) or not isinstance(held.get("lines"), list):
        raise RatuneError(f"--split validation: {data_dir} holds no validation split; build it with "
                          "ratune data build --validation-fraction F")
    if manifest.get("hub") != hub.name:
        raise RatuneError(f"--split validation: {data_dir} was built from hub {manifest.get('hub')}, not {hub.name}")
    by_line = {e.line: e for e in hub.load_examples("train")}
    missing = [line for line in held["lines"] if line not in by_line]
    if missing:
        raise RatuneError(f"--split validation: line {missing[0]} of {hub.name}'s training examples, held out by "
                          f"{manifest_path}, is not there (the hub's files changed since the build)")
    examples = [dataclasses.replace(by_line[line], split="validation", line=number)
                for number, line in enumerate(held["lines"], start=1)]
    return Questions(examples, {"split": "validation", "data": str(Path(data_dir).resolve()), "lines": held["lines"]},
                     held)


def split_refusal(setting: str, split: str) -> str | None:
    """Why ``setting`` cannot be evaluated on ``split``'s questions, or None: the paper's documents
    (a precomputed retriever, ``constraints_`` experiments included) exist for eval questions only."""
    try:
        precomputed = RETRIEVERS[setting_retriever(setting)].precomputed
    except KeyError:  # swap, irrelevant: their own retrievers over the API database
        precomputed = False
    if split != "eval" and precomputed:
        return (f"test setting {setting}: the paper's documents exist for its eval questions only, not for "
                f"{split} questions")
    return None
