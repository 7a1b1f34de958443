"""File I/O shared by every stage: line-numbered JSONL reading and atomic writes.

Every artifact ratune writes goes through :func:`atomic_write` (temporary name in the same
folder, fsync, then ``os.replace``), so a killed job leaves either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ratune.errors import InputError


def iter_jsonl(path: str | os.PathLike, *, lenient: bool = False, skipped: list | None = None
               ) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file.

    Args:
        path: the file to read.
        lenient: when True, lines that are not UTF-8 or not a JSON object are skipped and
            recorded in ``skipped`` as ``(line, reason)`` instead of raising.
        skipped: list that receives the skipped lines in lenient mode.

    Raises:
        InputError: naming the file and 1-based line, for bytes that are not UTF-8, a line that
            is not JSON (a truncated last line included) or a JSON value that is not an object.
        FileNotFoundError: when ``path`` does not exist.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue  # blank lines are ignored (documented in docs/reliability.md)
            try:
                text = raw.decode("utf-8")
                obj = json.loads(text)
                if not isinstance(obj, dict):
                    raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            except (UnicodeDecodeError, ValueError) as exc:
                reason = ("not UTF-8" if isinstance(exc, UnicodeDecodeError)
                          else f"not a JSON object ({exc})")
                if lenient:
                    if skipped is not None:
                        skipped.append((number, reason))
                    continue
                raise InputError(str(path), number, None, reason) from None
            yield number, obj


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temporary file beside ``path``; on success fsync and rename it onto ``path``.

    If the body raises, the temporary file is removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode open() would
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically (byte-identical for equal input)."""
    with atomic_write(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file atomically."""
    with atomic_write(path) as fh:
        fh.write(text)


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file, raising InputError naming the file on malformed content."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(str(path), None, None, f"not valid JSON ({exc})") from None
