"""File I/O shared by every stage: line-numbered JSONL reading, atomic file writes and folder
swaps (docs/reliability.md#what-ratune-deletes-or-overwrites)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ratune.errors import InputError


def iter_jsonl(path: str | os.PathLike, *, lenient: bool = False, skipped: list | None = None
               ) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file; ``lenient`` skips
    bad lines instead of raising, appending ``(line, reason)`` to ``skipped``.

    Raises:
        InputError: naming the file and 1-based line: not UTF-8, not JSON, or not an object.
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


def current_umask() -> int:
    """The process's umask, from ``/proc/self/status`` (Linux 4.7+), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """Open a temporary file beside ``path``; on success fsync and rename it onto ``path``
    (if the body raises, ``path`` keeps its previous content)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the file the mode open() would
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


#: Temporary siblings of an output folder: ``.ratune-tmp.XXXXXXXX.NAME`` (being built) and
#: ``.ratune-old.XXXXXXXX.NAME`` (the previous folder, during a swap).
_TEMP_KINDS = ("tmp", "old")


def temp_folder(out: str | os.PathLike, *, kind: str = "tmp", token: str | None = None,
                create: bool = True) -> Path:
    """A new folder ``.ratune-{kind}.XXXXXXXX.{out.name}`` beside ``out`` (``kind``: ``tmp`` or ``old``);
    ``token``: 8 characters of ``[a-z0-9_]`` for processes that must agree on the name, and with it
    ``create=False`` returns the path without creating it.

    Raises:
        FileExistsError: ``token`` given and that folder exists.
        ValueError: a malformed ``token``, or ``create=False`` without one.
    """
    out = Path(out)
    if token is None:
        if not create:
            raise ValueError("temp_folder(create=False) needs the token of a folder another process made")
        out.parent.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f".ratune-{kind}.", suffix=f".{out.name}", dir=out.parent))
        os.chmod(path, 0o777 & ~current_umask())  # mkdtemp makes 0700; the swapped-in folder gets mkdir's mode
        return path
    if not re.fullmatch(r"[a-z0-9_]{8}", token):
        raise ValueError(f"temporary folder token {token!r}: expected 8 characters from [a-z0-9_]")
    path = out.parent / f".ratune-{kind}.{token}.{out.name}"
    if create:
        out.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    return path


def stale_temp_folders(out: str | os.PathLike) -> list[Path]:
    """The temporary siblings (:func:`temp_folder`) of ``out`` that exist; call it only while
    holding ``out``'s lock, when none of them can belong to a live writer."""
    out = Path(out)
    pattern = re.compile(rf"\.ratune-({'|'.join(_TEMP_KINDS)})\.[a-z0-9_]{{8}}\.{re.escape(out.name)}")
    if not out.parent.is_dir():
        return []
    return sorted(p for p in out.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


#: The temporary files :func:`atomic_write` makes: ``.NAME.XXXXXXXX.tmp`` beside ``NAME``.
_TEMP_FILE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """The temporary files of :func:`atomic_write` anywhere under ``folder``; call it only while
    holding ``folder``'s lock, when none of them can belong to a live writer."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.tmp") if _TEMP_FILE.fullmatch(p.name) and p.is_file() and not p.is_symlink())


def open_file_modes(folder: str | os.PathLike) -> None:
    """Give every file under ``folder`` the mode ``open()`` would, ``0o666 & ~umask`` (safetensors
    0.8 writes 0600); each writer of weights calls it before its folder is put in place."""
    umask = current_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o666 & ~umask)


def swap_folder(tmp: str | os.PathLike, out: str | os.PathLike) -> None:
    """Put the finished folder ``tmp`` in place of ``out`` (missing or old): old ``out`` renamed
    aside, ``tmp`` renamed in (or the old one back on failure), old deleted. Callers check
    ownership first (:func:`ratune.manifest.require_owned`).
    """
    import shutil

    tmp, out = Path(tmp), Path(out)
    if not out.exists():
        os.replace(tmp, out)
        return
    old = temp_folder(out, kind="old")
    os.replace(out, old)  # onto the empty folder mkdtemp made (rename(2) allows that)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


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


def read_json_object(path: str | os.PathLike) -> dict:
    """:func:`read_json` of a file that must hold a JSON object (a manifest, metrics, a config).

    Raises:
        InputError: naming the file: malformed, truncated, or not an object.
    """
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise InputError(str(path), None, None, f"expected a JSON object, got {type(obj).__name__}")
    return obj
