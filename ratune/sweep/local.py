"""The local launcher: run a sweep's commands on this machine (:func:`run_local`), or print them
(:func:`dry_run`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ratune.errors import RatuneError, Terminated
from ratune.io import read_json_object, write_json, write_text
from ratune.manifest import SWEEP_FOLDER_STAGES, SWEEP_STAGE, is_complete
from ratune.output import StageOutput
from ratune.sweep.cells import Cell, data_plan, selection_path
from ratune.sweep.commands import _fmt, bfcl_command, data_command, eval_command, select_command, train_command
from ratune.sweep.schema import SAVED_SWEEP_FILE, SAVED_SWEEP_SOURCE_KEY, Sweep
from ratune.sweep.state import (cell_record, changed_keys, check_changed, is_bfcl_finished, is_curve_finished,
                                is_finished)


#: Seconds a command is given to unwind (save its state, remove its lock file) after the sweep is
#: interrupted, before it is killed.
CHILD_GRACE_S = 60


def run_command(cmd: list[str], log_path: Path) -> None:
    """Run one command, its stdout and stderr appended to ``log_path`` (tests replace this function).

    The command runs in its own process group, so that the sweep can signal all of it: ``accelerate
    launch``'s single-process launcher dies on SIGTERM without passing it on, which left the
    training running (and holding its lock) after the sweep had stopped. Interrupted (Ctrl-C:
    SIGINT; SIGTERM or SIGHUP: :class:`ratune.errors.Terminated`), the sweep sends the same signal
    to the command's whole group, waits up to :data:`CHILD_GRACE_S` for every process of it to end
    (a second Ctrl-C stops the wait; a second SIGTERM or SIGHUP is ignored, ratune/cli.py
    ``terminate_like_ctrl_c``), kills what is left, and re-raises. A sweep killed with
    SIGKILL cannot do this: its running command is left to finish on its own.

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
        proc = None
        try:
            proc = subprocess.Popen([exe, *cmd[1:]], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            rc = proc.wait()
        except OSError as exc:
            raise RatuneError(f"cannot run {cmd[0]!r}: {exc}") from None
        except KeyboardInterrupt as exc:
            if proc is not None:
                _stop_group(proc, exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
            raise
    if rc != 0:
        with open(log_path, "rb") as log:
            log.seek(start)
            lines = log.read().decode("utf-8", errors="replace").splitlines(True)
        errors = list(dict.fromkeys(line.strip() for line in lines if line.startswith("ratune: error:")))
        shown = "\n".join(errors) + "\n" if errors else "".join(lines[-20:])
        raise RatuneError(f"`{_fmt(cmd)}` exited with status {rc}; log {log_path}:\n{shown}")


def _stop_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads, wait up to :data:`CHILD_GRACE_S` until no
    process of the group is left (a Ctrl-C ends the wait), then SIGKILL what is."""
    import time

    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + CHILD_GRACE_S
    try:
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or the group is never empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: stop waiting
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


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
              runner: Callable[[list[str], Path], None] | None = None, out=None,
              data_cells: list[Cell] | None = None) -> int:
    """Run the sweep on this machine: shared data build per hub, then train and evaluate each cell.

    ``data_cells`` (default ``cells``) are the cells the shared data build is planned for: the whole
    sweep when ``cells`` is a selection (``ratune sweep --only``), so a data folder built for one
    selection holds every mode the others need and is never rebuilt with fewer.

    Finished cells are skipped; a cell whose stored config differs is refused (before anything
    runs) unless ``rerun_changed``, which deletes its results first; a failing cell's error goes to
    ``cell/error.txt`` and the sweep continues. Returns 0 when every cell finished, else 1.

    Raises:
        RatuneError: as :func:`prepare_sweep_folder`.
        KeyboardInterrupt: after printing where it stopped (a rerun continues).
    """
    out = out or sys.stdout
    runner = runner or run_command
    prepare_sweep_folder(sweep, cells, rerun_changed=rerun_changed, out=out)

    plan = data_plan(sweep, data_cells or cells)
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    data_errors: dict[str, str] = {}
    current = "data"
    try:
        for hub, entry in plan.items():
            if not any(not is_finished(sweep, c) for c in cells if c.hub == hub):
                continue  # else the build reuses a folder made with the same request (--reuse-if-same)
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
                if not is_complete(cell.dir / "train"):  # an unfinished run: resumed or restarted by training
                    _run_step(runner, "train", cell, train_command(sweep, cell), progress, out)
                if sweep.config.eval.selection_rule is None:
                    _run_step(runner, "eval", cell, eval_command(sweep, cell), progress, out)
                if not is_curve_finished(sweep, cell):
                    _run_step(runner, "curve", cell, eval_command(sweep, cell, curve=True), progress, out)
                if sweep.config.eval.selection_rule is not None:  # the test questions of the chosen checkpoint
                    _run_step(runner, "select", cell, select_command(sweep, cell), progress, out)
                    chosen = read_json_object(selection_path(cell))["checkpoint"]
                    _run_step(runner, "eval", cell, eval_command(sweep, cell, checkpoint=chosen), progress, out)
                if not is_bfcl_finished(sweep, cell):
                    _run_step(runner, "bfcl", cell, bfcl_command(sweep, cell), progress, out)
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
        with contextlib.suppress(OSError):  # after SIGHUP the terminal is gone: writing fails with EIO
            print(f"[stop] interrupted during {current}; rerun the same command to continue", file=out, flush=True)
        raise
    done = sum(1 for s in status.values() if s != "failed")
    print(f"sweep {sweep.out_dir}: {done}/{len(cells)} cells finished, {len(errors)} failed", file=out)
    for name, err in errors.items():
        print(f"  FAILED {name}: {err}", file=out)
    return 1 if errors else 0


def sweep_output(folder: Path) -> StageOutput:
    """A sweep folder as an output (:class:`ratune.output.StageOutput`): a ``demo`` output is a
    sweep folder too (ratune/demo.py runs its sweep file into one). Its ``check()`` refuses a
    file, or a non-empty folder that is no sweep or demo output, and writes nothing."""
    return StageOutput(folder, SWEEP_STAGE, also=SWEEP_FOLDER_STAGES, claim=False)


def prepare_sweep_folder(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool, out) -> Path:
    """What both launchers do before their first command: refuse a folder ratune did not make
    (:func:`sweep_output`, before :func:`check_changed` may delete anything), refuse or
    (``rerun_changed``) delete changed cells, create and mark the folder and save the sweep file
    (:func:`save_sweep_file`).
    Returns the folder.

    Raises:
        RatuneError: as :func:`sweep_output`; changed cells without ``rerun_changed``.
    """
    output = sweep_output(sweep.out_dir)
    output.check()
    check_changed(sweep, cells, rerun_changed=rerun_changed, out=out)
    output.claim()
    save_sweep_file(sweep)
    return sweep.out_dir


def save_sweep_file(sweep: Sweep) -> Path:
    """Write the validated sweep file to ``SWEEP_DIR/sweep.yaml`` with its ``base`` config inline
    (the run's record even if the base file changes later) and ``source``, the file the run started
    from; :func:`ratune.sweep.schema.load_saved_sweep` reads it back (``report_sweep`` takes its
    ``compare`` pairs and ``apibench`` folder from it). Returns its path."""
    path = sweep.out_dir / SAVED_SWEEP_FILE
    config = {**sweep.config.model_dump(mode="json"), "base": sweep.base}
    write_text(path, _yaml({SAVED_SWEEP_SOURCE_KEY: sweep.source, **config}))
    return path


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True)


def dry_run(sweep: Sweep, cells: list[Cell], out=None, data_cells: list[Cell] | None = None) -> int:
    """Print the cells (with their status) and the exact commands, running nothing; returns 0.
    ``data_cells``: as for :func:`run_local`."""
    out = out or sys.stdout
    plan = data_plan(sweep, data_cells or cells)
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
        if sweep.config.eval.curve_settings:
            print(f"  curve: {_fmt(eval_command(sweep, cell, curve=True))}", file=out)
        if sweep.config.eval.selection_rule is not None:
            print(f"  select: {_fmt(select_command(sweep, cell))}", file=out)
            print(f"  eval:  {_fmt(eval_command(sweep, cell, checkpoint='CHOSEN_CHECKPOINT'))}", file=out)
        else:
            print(f"  eval:  {_fmt(eval_command(sweep, cell))}", file=out)
        if sweep.config.bfcl is not None:
            print(f"  bfcl:  {_fmt(bfcl_command(sweep, cell))}", file=out)
    return 0
