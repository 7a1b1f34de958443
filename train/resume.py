"""The run folder of a training run before it trains (:mod:`ratune.train.sft`): the output folder
made and claimed (:func:`prepare_output_dir`; a folder from an earlier run is refused), the
``--on-unfinished`` policy applied (:func:`prepare_unfinished`), a resume refused when the training
rows changed since the run began (:func:`check_same_data`, :func:`train_rows_sha256`), and the
checkpoint it resumes from (:func:`resolve_resume`). The run folder is locked by the main process
only (:func:`run_output`, :func:`is_main_process`).
"""

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
    """The run folder ``config.output_dir``, made, and claimed as a ratune train output on a fresh
    run. Only the main process checks it: a fresh run (``resume_from`` None) refuses a folder
    holding anything (naming it when ratune did not make it).

    Raises:
        RatuneError: the folder holds an earlier run or files ratune did not write.
    """
    output = run_output(config)
    out = output.out
    # only the main process checks: the others would see the folder it has just started writing
    if resume_from is None and is_main_process() and out.exists() and any(out.iterdir()):
        output.check(action="write into")  # a folder ratune did not make: say so, not "resume"
        raise RatuneError(f"{out}: output folder exists from an earlier run; pass --resume-from latest to "
                          "continue it, or choose another output_dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # another rank: the main process removed the folder meanwhile and remakes it
        if is_main_process():
            raise
    if resume_from is None and is_main_process():
        output.claim()  # from here on a ratune train output (ratune.manifest.output_stage)
    return out


def prepare_unfinished(out: Path, policy: str) -> str | None:
    """Apply ``--on-unfinished`` (ratune/config.py OnUnfinished) to the output folder ``out``;
    returns the ``--resume-from`` value the run then takes: ``latest`` to resume, None to start
    fresh. Called under the output folder's lock (:func:`ratune.train.sft.train`), so a running training of the
    same folder is never deleted under it.

    - no folder, or an empty one: a fresh run (None);
    - a folder ratune did not make, or a finished run (``.complete``): refused;
    - ``resume`` and the run saved a Trainer checkpoint: ``latest``;
    - otherwise (``restart``, or ``resume`` with no checkpoint to resume): the unfinished run is
      deleted (by the main process, and only when it is a ratune train output) and None returned.
    Only the main process checks and deletes; the others answer from the checkpoints alone, which
    gives the same answer: the main process deletes only a run without the checkpoints they look
    for, or under ``restart``, whose answer is None whatever they see.

    Raises:
        RatuneError: a finished run; a folder ratune did not make (:meth:`ratune.output.StageOutput.check`).
    """
    try:
        resumable = policy == "resume" and bool(complete_checkpoint_folders(out, say=False))
    except OSError:  # another rank, while the main process deletes a run without checkpoints
        resumable = False
    if not is_main_process():  # the main process checks and deletes (a folder it deletes has no checkpoint
        return "latest" if resumable else None  # the others look for, or the answer is None anyway)
    if not out.exists() or not any(out.iterdir()):
        return None
    StageOutput(out, TRAIN_STAGE).check(action="resume or restart")  # never a folder ratune did not make
    if is_complete(out):
        raise RatuneError(f"{out}: a finished training run (.complete); --on-unfinished {policy} acts on unfinished "
                          "runs only: choose another output_dir")
    if resumable:
        return "latest"
    why = "--on-unfinished restart" if policy == "restart" else "it saved no complete checkpoint to resume"
    print(f"ratune: note: {out}: starting the unfinished run over ({why}); its files are deleted", file=sys.stderr)
    shutil.rmtree(out)  # an unfinished ratune training run (checked above), under its lock
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
    """Refuse to resume a run whose training rows changed since the run began: its
    ``manifest.json`` (written at the start, :func:`ratune.train.sft.train`) records :func:`train_rows_sha256`, and a
    rebuild with another setting or input file (data/build.py ``build_request``) writes other rows,
    so the remaining steps would train on other rows than the checkpoint's (and a sweep's table
    would mix builds). A rebuild to the same rows passes; so do runs from before it was recorded.

    Returns:
        The rows' sha256 now (what the run's manifest records next), so they are hashed once.
    Raises:
        RatuneError: the two sha256 differ, naming the folder, the run's manifest and how to start over.
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
    """The checkpoint folder a run resumes from: None for a fresh run, the highest complete
    checkpoint for ``latest`` (partial ones passed over), else ``resume_from`` checked to be a
    complete checkpoint.

    Raises:
        RatuneError: ``latest`` with no complete checkpoint, a path that does not exist or a
            partial checkpoint.
    """
    if resume_from is None:
        return None
    if resume_from == "latest":
        ckpts = complete_checkpoint_folders(out, say=is_main_process())  # a partial one is passed over
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
