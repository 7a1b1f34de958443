"""One writer per output: a lock file beside each output folder ratune writes.

``output_lock(OUT)`` holds an exclusive :func:`fcntl.flock` on ``PARENT/.NAME.ratune.lock`` (a
sibling, so it outlives the swap of a folder that is rebuilt under a temporary name) for as long
as the command writes ``OUT``. The file holds the holder's pid, host and command, so a second
process is refused with one line naming the lock file and the holder. The kernel drops a flock when
its holder dies, however it dies; a lock file left by a dead holder on this host is therefore taken
over, and the takeover is noted on stderr with the pid it names. A lock file naming another host is
refused (its pid cannot be checked from here): delete it by hand once that process is gone. The
file is removed on release.

A command that writes one output for the whole of a function's call is decorated with
:func:`locked_output`, which takes the lock of the output one of its arguments names (train/sft.py
``train``, eval/run.py ``evaluate_checkpoint``, export/checkpoint.py ``export_checkpoint``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from ratune.errors import RatuneError
from ratune.io import stale_temp_folders, swap_folder, temp_folder
from ratune.manifest import claim_folder, require_owned

#: A function :func:`locked_output` decorates.
F = TypeVar("F", bound=Callable)


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
    """Hold the lock of the output ``target`` for the body (see the module docstring).

    Args:
        target: the output folder (or file) about to be written; it need not exist yet.
        command: recorded in the lock file and shown to a refused process (default: argv).
        enabled: False yields without locking (a distributed run locks on rank 0 only).
    Yields:
        The lock file's path.
    Raises:
        LockHeld: another live process holds the lock (the message names the lock file and the
            holder's pid and host).
        RatuneError: the lock file cannot be created (e.g. the parent folder is read-only).
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


def locked_output(arg: str, *, command: str, enabled: Callable[[], bool] | None = None, resolve: bool = False,
                  owned_by: str | None = None, check: Callable[..., None] | None = None) -> Callable[[F], F]:
    """Decorate a function that writes one output so that every call holds that output's lock
    (:func:`output_lock`) from start to end; the function is written once, with its own signature.

    A call runs, in this order: ``check``, the ownership check, taking the lock, the ownership
    check again, the function. The first two write nothing (not even the lock file or its parent
    folder), so a refusal there leaves no trace.

    Args:
        arg: the parameter that names the output (``"out_dir"``), or a parameter and an attribute
            of its value (``"config.output_dir"``); read from each call's arguments, defaults applied.
        command: recorded in the lock file and shown to a refused process.
        enabled: called at each call; False runs the function without the lock (a distributed run
            locks on rank 0 only). None: always locked.
        resolve: lock ``Path(output).resolve()`` (the path messages name) instead of the output as given.
        owned_by: a stage name: the output must be new, empty or a ratune output of that stage
            (:func:`ratune.manifest.require_owned`, action "write into"), checked before the lock
            (a quick refusal) and again once it is held (another writer may have made it meanwhile).
        check: called with the call's arguments as keywords (defaults applied) before anything else:
            argument checks that must refuse before anything is written.
    Returns:
        The decorator. The decorated function keeps its name, docstring and signature
        (:func:`functools.wraps`); a call that does not bind to the signature raises the
        function's own TypeError, before any check or lock.
    Raises:
        TypeError: at decoration, when ``arg`` names no parameter of the function.
        At a call: what ``check`` and :func:`ratune.manifest.require_owned` raise; LockHeld
        (another live process holds the lock); RatuneError (the lock file cannot be created);
        what the function raises.
    """
    name, *attributes = arg.split(".")

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        if name not in signature.parameters:
            raise TypeError(f"locked_output({arg!r}): {function.__qualname__} has no parameter {name!r}")

        @functools.wraps(function)
        def locked(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return function(*args, **kwargs)  # raises the call's own TypeError
            bound.apply_defaults()
            if check is not None:
                check(**bound.arguments)
            target = bound.arguments[name]
            for attribute in attributes:
                target = getattr(target, attribute)
            if resolve:
                target = Path(target).resolve()
            if owned_by is not None:
                require_owned(target, owned_by, action="write into")
            with output_lock(target, command=command, enabled=True if enabled is None else enabled()):
                if owned_by is not None:
                    require_owned(target, owned_by, action="write into")
                return function(*args, **kwargs)

        return locked  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def replacing_folder(out: str | Path, stage: str):
    """Build the output ``out`` of ``stage`` in a new temporary sibling and swap it in on success.

    ``out`` is resolved first (``..`` and symlinks followed: a symlinked output keeps its link and
    gets a new target folder beside the old one). Holds ``out``'s lock
    (:func:`output_lock`) throughout; checks ``out`` with
    :func:`ratune.manifest.require_owned` before and again just before the swap; removes temporary siblings that
    a killed earlier writer of ``out`` left (:func:`ratune.io.stale_temp_folders`). The body
    writes into the yielded folder, which already carries :data:`ratune.manifest.OWNER_MARKER`. If the body raises
    (or is interrupted), the temporary folder is removed and ``out`` keeps its previous content.
    Callers decide beforehand whether an existing ``out`` may be replaced at all (their
    ``--overwrite``).

    Yields:
        The temporary folder.
    Raises:
        RatuneError: from :func:`ratune.manifest.require_owned`; LockHeld when another process writes ``out``.
    """
    out = Path(out).resolve()
    with output_lock(out):
        require_owned(out, stage)
        for stale in stale_temp_folders(out):  # under the lock: no live writer of out owns them
            shutil.rmtree(stale, ignore_errors=True)
        tmp = temp_folder(out)
        try:
            claim_folder(tmp, stage)
            yield tmp
            require_owned(out, stage)
            swap_folder(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
