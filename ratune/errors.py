"""Error types shared by every stage."""

from __future__ import annotations


class RatuneError(Exception):
    """A user-facing error: the CLI prints its message (no traceback) and exits with status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (raised by :func:`ratune.boundary.terminate_like_ctrl_c`), so the
    process unwinds as after Ctrl-C and removes its lock files.

    Attributes:
        signum: the signal's number; the exit status is ``128 + signum``.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class InputError(RatuneError):
    """Bad input data, located by file, line (1-based) and field.

    Attributes:
        path: the file that holds the bad input.
        line: 1-based line number, or None when the problem is not tied to a line.
        field: the JSON field (or config key) at fault, or None.
    """

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.reason = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
