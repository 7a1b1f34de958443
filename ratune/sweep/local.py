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


#: Seconds an interrupted command is given to unwind (save its state, drop its lock) before it is killed.
CHILD_GRACE_S = 60


def run_command(cmd: list[str], log_path: Path) -> None:
    """Run one command in its own process group, stdout and stderr appended to ``log_path``; when
    interrupted, pass the signal to the whole group (docs/sweeps.md#cells-reruns-and-interruptions).

    Raises:
        RatuneError: non-zero exit, with ratune's error lines of this run, else the log's last 20 lines.
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
    """Send ``sig`` to ``proc``'s process group, wait up to CHILD_GRACE_S for it to end, SIGKILL the rest."""
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
    """Run the sweep on this machine: shared data build per hub (planned for ``data_cells``, default
    ``cells``), then train and evaluate each unfinished cell; a failing cell's error goes to its
    ``error.txt`` and the sweep goes on. Returns 0 when every cell finished, else 1.

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
    current = ["data"]  # what runs now, named if the sweep is interrupted
    try:
        data_errors = _build_data(sweep, cells, plan, runner, out, current)
        for number, cell in enumerate(cells, start=1):
            current[0] = cell.name
            status[cell.name], error = _run_cell(sweep, cell, runner, f"({number}/{len(cells)})", out, data_errors)
            if error is not None:
                errors[cell.name] = error
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal is gone: writing fails with EIO
            print(f"[stop] interrupted during {current[0]}; rerun the same command to continue", file=out, flush=True)
        raise
    done = sum(1 for s in status.values() if s != "failed")
    print(f"sweep {sweep.out_dir}: {done}/{len(cells)} cells finished, {len(errors)} failed", file=out)
    for name, err in errors.items():
        print(f"  FAILED {name}: {err}", file=out)
    return 1 if errors else 0


def _build_data(sweep: Sweep, cells: list[Cell], plan: dict, runner, out, current: list[str]) -> dict[str, str]:
    """Run the shared data build of each hub with an unfinished cell; return ``{hub: error}`` of those
    that failed. ``current[0]`` names the build running."""
    data_errors: dict[str, str] = {}
    for hub, entry in plan.items():
        if not any(not is_finished(sweep, c) for c in cells if c.hub == hub):
            continue  # else the build reuses a folder made with the same request (--reuse-if-same)
        current[0] = f"data {hub}"
        print(f"[data] {hub}: {_fmt(data_command(sweep, hub, entry))}", file=out)
        try:
            runner(data_command(sweep, hub, entry), sweep.out_dir / "logs" / f"data_{hub}.log")
        except RatuneError as exc:
            data_errors[hub] = str(exc)
    return data_errors


def _run_cell(sweep: Sweep, cell: Cell, runner, progress: str, out,
              data_errors: dict[str, str]) -> tuple[str, str | None]:
    """Run what ``cell`` still needs; return its status and, if it failed, the error's first line."""
    if is_finished(sweep, cell):
        print(f"[skip] {cell.name}: finished", file=out)
        return "skipped (finished)", None
    cell.dir.mkdir(parents=True, exist_ok=True)
    write_json(cell.dir / "cell.json", cell_record(sweep, cell))
    write_text(cell.dir / "train.yaml", _yaml(cell.config))
    error_file = cell.dir / "error.txt"
    try:
        if cell.hub in data_errors:
            raise RatuneError(f"shared data build for {cell.hub} failed: {data_errors[cell.hub]}")
        _run_cell_steps(sweep, cell, runner, progress, out)
    except RatuneError as exc:
        write_text(error_file, f"{exc}\n")
        error = str(exc).splitlines()[0]
        print(f"[fail] {cell.name}: {error} (see {error_file})", file=out)
        return "failed", error
    error_file.unlink(missing_ok=True)
    return "finished", None


def _run_cell_steps(sweep: Sweep, cell: Cell, runner, progress: str, out) -> None:
    """Train, evaluate, draw the curve, select and score BFCL, each step only if not done yet.

    Raises:
        RatuneError: a step failed, or the cell is still not finished after its steps.
    """
    if not is_complete(cell.dir / "train"):  # an unfinished run: resumed or restarted by training
        _run_step(runner, "train", cell, train_command(sweep, cell), progress, out)
    e = sweep.config.eval
    if e.selection_rule is None and e.settings:
        _run_step(runner, "eval", cell, eval_command(sweep, cell), progress, out)
    if not is_curve_finished(sweep, cell):
        _run_step(runner, "curve", cell, eval_command(sweep, cell, curve=True), progress, out)
    chosen = None
    if e.selection_rule is not None:  # the test questions of the chosen checkpoint
        _run_step(runner, "select", cell, select_command(sweep, cell), progress, out)
        chosen = read_json_object(selection_path(cell))["checkpoint"]
        if e.settings:
            _run_step(runner, "eval", cell, eval_command(sweep, cell, checkpoint=chosen), progress, out)
    if not is_bfcl_finished(sweep, cell):
        _run_step(runner, "bfcl", cell, bfcl_command(sweep, cell, checkpoint=chosen), progress, out)
    if not is_finished(sweep, cell):
        raise RatuneError("commands succeeded but the cell's train/eval .complete markers are missing")


def sweep_output(folder: Path) -> StageOutput:
    """A sweep folder (a ``demo`` output is one too) as a :class:`ratune.output.StageOutput`."""
    return StageOutput(folder, SWEEP_STAGE, also=SWEEP_FOLDER_STAGES, claim=False)


def prepare_sweep_folder(sweep: Sweep, cells: list[Cell], *, rerun_changed: bool, out) -> Path:
    """What both launchers do first: refuse a folder ratune did not make, refuse or (``rerun_changed``)
    delete changed cells, mark the folder and save the sweep file. Returns the folder.

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
    """Write the validated sweep file, its ``base`` inline, to ``SWEEP_DIR/sweep.yaml``; return its path."""
    path = sweep.out_dir / SAVED_SWEEP_FILE
    config = {**sweep.config.model_dump(mode="json"), "base": sweep.base}
    write_text(path, _yaml({SAVED_SWEEP_SOURCE_KEY: sweep.source, **config}))
    return path


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True)


def dry_run(sweep: Sweep, cells: list[Cell], out=None, data_cells: list[Cell] | None = None) -> int:
    """Print the cells (with their status) and the exact commands, running nothing; returns 0."""
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
        chosen = None
        if sweep.config.eval.selection_rule is not None:
            chosen = "CHOSEN_CHECKPOINT"
            print(f"  select: {_fmt(select_command(sweep, cell))}", file=out)
        if sweep.config.eval.settings:
            print(f"  eval:  {_fmt(eval_command(sweep, cell, checkpoint=chosen))}", file=out)
        if sweep.config.bfcl is not None:
            print(f"  bfcl:  {_fmt(bfcl_command(sweep, cell, checkpoint=chosen))}", file=out)
    return 0
