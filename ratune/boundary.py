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
    """The errno of a :data:`WRITE_FAULTS` fault that ``exc`` or its causes carry (an OSError's
    errno, a Rust library's ``(os error N)``), or, for a RuntimeError while writing an output, its
    file system's state (:func:`_disk_fault`); else None."""
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
    """The one line of a write fault without a file name, naming the output being written."""
    where = getattr(exc, "ratune_output", None)
    return (f"ratune: error: {WRITE_FAULTS[code]} (errno {errno.errorcode[code]}) while writing "
            f"{where or 'an output'}: what was complete before is kept and nothing partial is marked complete; "
            "free space (or fix the file system) and rerun the same command to continue")


def _say(line: str) -> None:
    """One line on stderr in one write (ranks share stderr; print's separate newline interleaves)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _say_if_possible(line: str) -> None:
    """:func:`_say`, dropping the line when the terminal is gone (EIO after SIGHUP)."""
    with contextlib.suppress(OSError):
        _say(line)


def run_guarded(fn: Callable[[], int]) -> int:
    """Run ``fn`` behind ratune's one error boundary (policy: docs/reliability.md#user-errors).

    Returns:
        ``fn``'s status; 2 after one ``ratune: error:`` line for a RatuneError, an OSError naming a
        path or a :data:`WRITE_FAULTS` fault; 130 for Ctrl-C, 128 + signal for SIGTERM/SIGHUP; 0
        for a closed stdout. Anything else re-raises (as do all with RATUNE_TRACEBACK=1).
    """
    import os

    from ratune.errors import RatuneError, Terminated
    from ratune.noise import quiet_known_noise

    quiet_known_noise()
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
    """For the body, SIGTERM and SIGHUP (where no one else set a handler) raise
    :class:`~ratune.errors.Terminated` in the main thread; only the first signal raises, later ones
    are ignored while unwinding, and any exception leaving the body after a signal is re-raised as
    that Terminated (docs/reliability.md#user-errors)."""
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
