"""ratune's one error boundary (:func:`run_guarded`), shared by every ``ratune`` command
(ratune/cli.py) and ``python -m ratune.train`` (train/__main__.py, what ``accelerate launch`` runs)."""

from __future__ import annotations

import contextlib
import errno
import re
import sys
from typing import Callable


#: Set to 1 to see the traceback of an error the boundary reports in one line.
TRACEBACK_ENV = "RATUNE_TRACEBACK"

#: The operating system's refusals of a write that are the machine's state, not a bug, and what
#: the line calls each.
WRITE_FAULTS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EMFILE: "too many open files"}


#: Free space below which a native writer's error without an errno counts as a full disk (bytes).
FULL_DISK_BYTES = 1 << 20


def write_fault(exc: BaseException | None) -> int | None:
    """The errno of a :data:`WRITE_FAULTS` fault that ``exc``, or an exception it was raised from,
    carries: an OSError's errno, or the ``(os error N)`` that the Rust libraries (tokenizers,
    safetensors) put in their messages; else, for a RuntimeError raised while writing an output
    (``torch.save``'s ``iostream error`` carries no errno), the state of that output's file system:
    read-only, or less than :data:`FULL_DISK_BYTES` free. None for anything else."""
    first, seen = exc, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in WRITE_FAULTS:
            return exc.errno
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found and int(found.group(1)) in WRITE_FAULTS:
            return int(found.group(1))
        exc = exc.__cause__ or exc.__context__
    output = getattr(first, "ratune_output", None)
    return _disk_fault(output) if output and isinstance(first, RuntimeError) else None


def _disk_fault(output: str) -> int | None:
    """EROFS or ENOSPC when the file system of ``output`` (its nearest existing folder) is read-only
    or (almost) full; None otherwise."""
    import os
    from pathlib import Path

    folder = Path(output)
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    return errno.ENOSPC if st.f_bavail * st.f_frsize < FULL_DISK_BYTES else None


def _fault_line(exc: BaseException, code: int) -> str:
    """The one line of a write fault without a file name: the output being written (the innermost
    lock's target, :func:`ratune.locks.output_lock` records it on the exception) and how to go on."""
    where = getattr(exc, "ratune_output", None)
    return (f"ratune: error: {WRITE_FAULTS[code]} (errno {errno.errorcode[code]}) while writing "
            f"{where or 'an output'}: what was complete before is kept and nothing partial is marked complete; "
            "free space (or fix the file system) and rerun the same command to continue")


def _say(line: str) -> None:
    """One line on stderr in one write: the ranks of a launch share stderr, and print's separate
    write of the newline let two ranks' lines run together on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _say_if_possible(line: str) -> None:
    """:func:`_say` for the last line of an interrupted command: after SIGHUP (the terminal closed)
    writing to the terminal fails with EIO, and that OSError must not replace the exit status."""
    with contextlib.suppress(OSError):
        _say(line)


def run_guarded(fn: Callable[[], int]) -> int:
    """Run ``fn`` behind ratune's one error boundary (every ``ratune`` command and
    ``python -m ratune.train``, under accelerate or not).

    Policy: a user's mistake is reported where it is found, as a :class:`~ratune.errors.RatuneError`
    naming the file, line, field or flag (readers of JSON, JSONL and YAML name the file and line;
    argparse types name the flag, :mod:`ratune.args`). The boundary prints ``ratune: error:
    MESSAGE`` on stderr and returns 2 for:

    * a RatuneError (InputError included);
    * an OSError that carries a file name (missing, a folder where a file is expected, permission
      denied, disk full, ...): the operating system refused an operation on a named path, which no
      traceback would explain better: ``ratune: error: PATH: reason``;
    * a write fault without a file name (:data:`WRITE_FAULTS`: a full disk or quota, a read-only
      file system, permission, too many open files), from ratune or a library it calls (an OSError
      raised by ``close()``, tokenizers' ``Exception(... (os error 28))``): ``ratune: error: no
      space left on device (errno ENOSPC) while writing OUTPUT: ...`` naming the output being written.

    Everything else is a bug (in ratune or a library) and keeps its traceback (exit status 1);
    in particular a UnicodeDecodeError, JSON or YAML error that reaches the boundary is a reader
    that forgot to name its file. With RATUNE_TRACEBACK=1 the two cases above re-raise too.
    Ctrl-C returns 130, SIGTERM 143 and SIGHUP 129 (:class:`~ratune.errors.Terminated`: they
    unwind as Ctrl-C does, so lock files and temporary folders are cleaned up), a closed stdout
    (``| head``) 0.
    The third-party messages of :mod:`ratune.noise` are silenced first.
    """
    import os

    from ratune.errors import RatuneError, Terminated
    from ratune.noise import quiet_known_noise

    quiet_known_noise()  # third-party lines that are noise here, named in ratune/noise.py
    debug = os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    try:
        with terminate_like_ctrl_c():
            return fn() or 0
    except RatuneError as exc:
        if debug:
            raise
        _say(f"ratune: error: {exc}")
        return 2
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if debug or not (exc.filename or write_fault(exc)):
            raise
        if not exc.filename:
            _say(_fault_line(exc, write_fault(exc)))
            return 2
        where = exc.filename if not exc.filename2 else f"{exc.filename} -> {exc.filename2}"
        _say(f"ratune: error: {where}: {exc.strerror or exc}")
        return 2
    except Terminated as exc:
        import signal

        name = signal.Signals(exc.signum).name
        _say_if_possible(f"ratune: terminated ({name}); rerun the same command to continue where it stopped")
        return 128 + exc.signum
    except KeyboardInterrupt:
        _say_if_possible("ratune: interrupted; rerun the same command to continue where it stopped")
        return 130
    except Exception as exc:  # a library's own exception carrying a write fault (tokenizers, safetensors, torch)
        code = write_fault(exc)
        if debug or code is None:
            raise
        _say(_fault_line(exc, code))
        return 2


@contextlib.contextmanager
def terminate_like_ctrl_c():
    """For the body, SIGTERM and SIGHUP raise :class:`~ratune.errors.Terminated` in the main
    thread, each unless something (a launcher, a test runner, ``nohup``) has set its own handler;
    the default handlers are put back after. Used by :func:`run_guarded`.

    Only the first signal raises; later ones are ignored while the process unwinds. Supervisors
    often send SIGTERM twice within microseconds (Slurm signals every process of a step and torch's
    launcher passes its own SIGTERM on to its workers; a local sweep forwards to a command that a
    job's end also signalled), and a second signal that ended the process at once would skip the
    ``finally`` blocks and leave the lock file behind. The hard stop stays SIGKILL, which each
    supervisor sends after its grace period (Slurm's KillWait, the sweep's
    :data:`ratune.sweep.local.CHILD_GRACE_S`). The ignoring handler is Python's own, so a program
    started while unwinding gets the default handlers back.

    A library that catches everything (multiprocess's ``__init__`` has a bare ``except:`` around an
    import) can swallow the Terminated and fail differently; any exception that leaves the body
    after a signal is re-raised as the Terminated it hid, so the exit stays 128 + signal."""
    import signal
    import threading

    from ratune.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]

    def again(signum, frame):
        pass  # already unwinding (see above): SIGKILL is the hard stop

    received = []

    def terminated(signum, frame):
        received.append(signum)
        for s in ours:
            signal.signal(s, again)
        raise Terminated(signum)

    for s in ours:
        signal.signal(s, terminated)
    try:
        yield
    except Terminated:
        raise
    except BaseException as exc:
        if received:
            raise Terminated(received[0]) from exc
        raise
    finally:
        for s in ours:
            signal.signal(s, signal.SIG_DFL)
