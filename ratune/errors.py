"""Error types shared by every stage."""

from __future__ import annotations


class RatuneError(Exception):
    """A user-facing error: the CLI prints its message (no traceback) and exits with status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``signum``; exit status ``128 + signum``) arrived: the process unwinds as
    after Ctrl-C (:func:`ratune.boundary.terminate_like_ctrl_c`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class InputError(RatuneError):
    """Bad input data, located by file ``path``, 1-based ``line`` and JSON ``field`` (either may be None)."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.reason = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {message}")
