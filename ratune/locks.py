"""One writer per output: an exclusive flock on the sibling ``PARENT/.NAME.ratune.lock`` (a sibling
outlives a folder swap) that names its holder (docs/reliability.md#one-writer-per-output). Writers take it through
:class:`ratune.output.StageOutput`, never directly."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from ratune.errors import RatuneError


class LockHeld(RatuneError):
    """Another process holds the lock of an output; ``holder`` is what its lock file says."""

    def __init__(self, lock_path: Path, target: Path, holder: dict):
        self.lock_path, self.target, self.holder = lock_path, target, holder
        pid, host = holder.get("pid", "?"), holder.get("host", "?")
        cmd = f" ({holder['command']})" if holder.get("command") else ""
        remote = holder.get("host") not in (None, socket.gethostname())
        super().__init__(f"{target} is being written by pid {pid} on {host}{cmd}; lock file {lock_path}: "
                         + ("if that process is gone, delete the lock file and rerun" if remote else
                            "wait for that process to finish (or stop it) and rerun"))


def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of an output path: ``PARENT/.NAME.ratune.lock`` (the path resolved first)."""
    target = Path(target).resolve()
    return target.parent / f".{target.name}.ratune.lock"


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _acquire(path: Path, target: Path, command: str) -> int:
    """Open, flock and fill the lock file; returns its descriptor. Retries when the file was
    removed or replaced by a releasing holder between our open and our flock."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RatuneError(f"{path}: cannot create the lock file of {target} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd) if exc.errno in (errno.EAGAIN, errno.EACCES) else None
            os.close(fd)
            if holder is None:
                raise RatuneError(f"{path}: cannot lock {target} ({exc.strerror})") from None
            raise LockHeld(path, target, holder) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # we locked a file its holder had just unlinked: try the current one
            os.close(fd)
            continue
        previous = _read_holder(fd)
        if previous.get("pid") is not None:
            if previous.get("host") != socket.gethostname():  # its pid cannot be checked from here
                os.close(fd)
                raise LockHeld(path, target, previous)
            state = "no longer running" if not _pid_alive(previous["pid"]) else "running, but not holding the lock"
            print(f"ratune: note: took over the stale lock {path} of pid {previous['pid']} ({state})",
                  file=sys.stderr)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode("utf-8"), 0)
        os.fsync(fd)
        return fd


def _record_output(exc: BaseException, target) -> None:
    """Name on ``exc`` the output being written when it was raised (``ratune_output``; the innermost
    lock's), for the error boundary's line of a write fault (:func:`ratune.boundary.run_guarded`)."""
    with contextlib.suppress(AttributeError, TypeError):  # an exception type that refuses attributes
        if getattr(exc, "ratune_output", None) is None:
            exc.ratune_output = str(Path(target))


@contextlib.contextmanager
def output_lock(target: str | os.PathLike, *, command: str | None = None, enabled: bool = True) -> Iterator[Path]:
    """Hold the lock of the output ``target`` (need not exist) for the body; yields the lock file.
    ``command`` is recorded in it (default: argv); ``enabled=False`` does not lock (ranks other than 0).

    Raises:
        LockHeld: another live process holds the lock (naming the lock file, pid and host).
        RatuneError: the lock file cannot be created.
    """
    path = lock_path(target)
    try:
        if not enabled:
            yield path
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, Path(target), command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # while still holding it: a waiting opener then retries (see _acquire)
            os.close(fd)
    except BaseException as exc:  # the body's, or the lock file's own write on a full disk
        _record_output(exc, target)
        raise
