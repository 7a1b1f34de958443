"""The run folder of a training run before it trains: made and claimed, ``--on-unfinished`` applied,
the resume point found, a resume on changed training rows refused (docs/reliability.md#reruns-and-resuming)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ratune.errors import RatuneError
from ratune.io import read_json_object, sha256_file
from ratune.manifest import TRAIN_STAGE, is_complete
from ratune.output import StageOutput
from ratune.train.config import TrainConfig
from ratune.train.layout import (TRAINER_DIR, checkpoint_folders, complete_checkpoint_folders,
                                 require_complete_checkpoint)


def is_main_process() -> bool:
    """Whether this process is rank 0 (``RANK``; a run without a launcher is)."""
    return int(os.environ.get("RANK", "0")) == 0


def prepare_output_dir(config: TrainConfig, resume_from: str | None) -> Path:
    """The run folder ``config.output_dir``, made, and claimed on a fresh run (``resume_from`` None),
    where the main process refuses a folder holding anything.

    Raises:
        RatuneError: the folder holds an earlier run or files ratune did not write.
    """
    output = run_output(config)
    out = output.out
    if resume_from is None and is_main_process() and out.exists() and any(out.iterdir()):
        output.check(action="write into")
        raise RatuneError(f"{out}: output folder exists from an earlier run; pass --resume-from latest to "
                          "continue it, or choose another output_dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # another rank: the main process removed the folder meanwhile and remakes it
        if is_main_process():
            raise
    if resume_from is None and is_main_process():
        output.claim()
    return out


def prepare_unfinished(out: Path, policy: str) -> str | None:
    """Apply ``--on-unfinished`` ``policy`` to the output folder ``out``, under its lock; returns the
    ``--resume-from`` value: ``latest`` to resume, None to start fresh. No folder or an empty one:
    None; ``resume`` with a complete checkpoint: ``latest``; otherwise the unfinished run is deleted
    (main process only) and None returned. The other ranks answer from the checkpoints alone, which
    gives the same answer.

    Raises:
        RatuneError: a finished run; a folder ratune did not make.
    """
    try:
        resumable = policy == "resume" and bool(complete_checkpoint_folders(out, say=False))
    except OSError:  # another rank, while the main process deletes a run without checkpoints
        resumable = False
    if not is_main_process():
        return "latest" if resumable else None
    if not out.exists() or not any(out.iterdir()):
        return None
    StageOutput(out, TRAIN_STAGE).check(action="resume or restart")
    if is_complete(out):
        raise RatuneError(f"{out}: a finished training run (.complete); --on-unfinished {policy} acts on unfinished "
                          "runs only: choose another output_dir")
    if resumable:
        return "latest"
    why = "--on-unfinished restart" if policy == "restart" else "it saved no complete checkpoint to resume"
    print(f"ratune: note: {out}: starting the unfinished run over ({why}); its files are deleted", file=sys.stderr)
    shutil.rmtree(out)
    return None


def train_rows_sha256(data_dir: Path, mode: str) -> str | None:
    """One sha256 over the Arrow files of ``DATA/MODE/train`` (the rows a run trains on; ``datasets``
    writes the same bytes for the same rows), by file name; None when there are none."""
    import hashlib

    files = sorted((data_dir / mode / "train").glob("*.arrow"))
    if not files:
        return None
    return hashlib.sha256("".join(f"{f.name} {sha256_file(f)}\n" for f in files).encode()).hexdigest()


def check_same_data(out: Path, data_dir: Path, mode: str) -> str | None:
    """Refuse to resume a run whose training rows changed since it began (its manifest's
    ``train_rows_sha256``; a run that recorded none passes). Returns :func:`train_rows_sha256` now,
    so the rows are hashed once.

    Raises:
        RatuneError: the two differ, naming the folder, the run's manifest and how to start over.
    """
    recorded = read_json_object(out / "manifest.json").get("train_rows_sha256") \
        if (out / "manifest.json").is_file() else None
    now = train_rows_sha256(data_dir, mode)
    if recorded is None or now is None or now == recorded:
        return now
    raise RatuneError(f"{data_dir / mode / 'train'}: the training rows changed since the run in {out} began (sha256 "
                      f"{now[:12]}; {out / 'manifest.json'} records train_rows_sha256 {recorded[:12]}): resuming "
                      f"would train its remaining steps on other rows. Start it over (ratune train --on-unfinished "
                      f"restart; in a sweep, delete {out} and rerun the sweep) or resume with the data it began with")


def resolve_resume(out: Path, resume_from: str | None) -> str | None:
    """The checkpoint a run resumes from: None for a fresh run, the newest complete one for ``latest``,
    else ``resume_from`` checked to be complete.

    Raises:
        RatuneError: ``latest`` with no complete checkpoint, a missing path or a partial checkpoint.
    """
    if resume_from is None:
        return None
    if resume_from == "latest":
        ckpts = complete_checkpoint_folders(out, say=is_main_process())
        if not ckpts:
            n_partial = len(checkpoint_folders(out))
            partial = f" ({n_partial} partial)" if n_partial else ""
            raise RatuneError(f"{out / TRAINER_DIR}: --resume-from latest, but there is no checkpoint to resume"
                              f"{partial}; start over with --on-unfinished restart")
        return str(ckpts[-1])
    if not Path(resume_from).is_dir():
        raise RatuneError(f"{resume_from}: --resume-from path does not exist")
    require_complete_checkpoint(resume_from)
    return resume_from


def run_output(config: TrainConfig) -> StageOutput:
    """The run folder as an output: locked by the main process only; its ownership is checked by
    :func:`prepare_output_dir` and :func:`prepare_unfinished`, which know a fresh run from a resume."""
    return StageOutput(config.output_dir, TRAIN_STAGE, command=TRAIN_STAGE, known=True, claim=False,
                       lock=is_main_process())
