"""The one way a command writes its output folder: :class:`StageOutput`, which owns the ownership
check, the lock, the marker, the swap and ``.complete`` (docs/development.md#where-a-change-goes)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from ratune.io import open_file_modes, stale_temp_files, stale_temp_folders, swap_folder, temp_folder
from ratune.locks import output_lock
from ratune.manifest import OWNER_MARKER, claim_folder, mark_complete, require_owned


class StageOutput:
    """The output folder ``out`` (need not exist) of ``stage`` (the name its OWNER_MARKER holds).

    ``replace``: build a new sibling and swap it in when the body ends without an error, else write
    into ``out``; ``action``: the verb of the ownership refusal; ``also``: other stages whose folders
    this one may write into; ``known``: skip the ownership check; ``command``: for the lock file;
    ``lock=False``: no lock (non-zero ranks); ``claim=False``: leave creating and marking ``out`` to
    :meth:`claim`; ``marker=False``: the folder carries its own record (an export).
    """

    def __init__(self, out: str | os.PathLike, stage: str, *, replace: bool = False, action: str | None = None,
                 also: tuple[str, ...] = (), known: bool = False, resolve: bool = False, command: str | None = None,
                 lock: bool = True, claim: bool = True, marker: bool = True):
        self.out = Path(out).resolve() if resolve or replace else Path(out)
        self.stage, self.replace, self.also, self.known = stage, replace, also, known
        self.action = action or ("replace" if replace else "write into")
        self.command, self.lock, self.claim_on_enter, self.marker = command, lock, claim, marker
        self.folder: Path | None = None  # where the body writes, once entered

    def check(self, action: str | None = None) -> None:
        """Refuse a folder this stage may not write (:func:`ratune.manifest.require_owned`); writes nothing."""
        require_owned(self.out, self.stage, action=action or self.action, also=self.also)

    def _recheck(self) -> None:
        if not self.known:
            self.check()

    def claim(self) -> Path:
        """Create ``out`` and mark it as this stage's output unless it carries a marker; returns it."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.marker and not (self.out / OWNER_MARKER).exists():
            claim_folder(self.out, self.stage)
        return self.out

    def complete(self, folder: str | os.PathLike | None = None) -> None:
        """Mark ``folder`` (default: the folder being written) finished; call it after its last file."""
        mark_complete(self.folder if folder is None else folder)

    @contextlib.contextmanager
    def writing(self) -> Iterator[Path]:
        """Hold the lock and yield the folder to write: ``out``, or its new sibling with ``replace``.

        Raises:
            RatuneError: the ownership refusal; LockHeld when another live process writes ``out``.
        """
        self._recheck()
        with output_lock(self.out, command=self.command, enabled=self.lock):
            self._recheck()
            if not self.replace:
                for stale in stale_temp_files(self.out) if self.lock else []:  # a killed writer's (under the lock)
                    stale.unlink(missing_ok=True)
                self.folder = self.claim() if self.claim_on_enter else self.out
                yield self.folder
                return
            for stale in stale_temp_folders(self.out):  # under the lock: no live writer's
                shutil.rmtree(stale, ignore_errors=True)
            self.folder = temp_folder(self.out)
            try:
                if self.marker:
                    claim_folder(self.folder, self.stage)
                yield self.folder
                self._recheck()
                open_file_modes(self.folder)  # safetensors writes 0600; every file gets open()'s mode
                swap_folder(self.folder, self.out)
            except BaseException:
                shutil.rmtree(self.folder, ignore_errors=True)
                raise


def reserve_sibling(final: str | os.PathLike) -> str:
    """Create a new temporary sibling of the sub-folder ``final`` and return its token, for
    :func:`built_beside` on every process of a distributed run (call it on the lock holder)."""
    import secrets

    for stale in stale_temp_folders(final):
        shutil.rmtree(stale, ignore_errors=True)
    while True:
        token = f"{secrets.randbits(32):08x}"
        try:
            temp_folder(final, token=token)
            return token
        except FileExistsError:
            continue


@contextlib.contextmanager
def built_beside(final: str | os.PathLike, token: str, *, writer: bool = True) -> Iterator[Path]:
    """Yield the sibling :func:`reserve_sibling` made for ``final``; the ``writer`` process swaps it
    in on success and removes it on an error."""
    tmp = temp_folder(final, token=token, create=False)
    try:
        yield tmp
        if writer:
            open_file_modes(tmp)
            swap_folder(tmp, final)
    except BaseException:
        if writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
