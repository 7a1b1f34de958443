"""The one reader of finished eval folders (what ``ratune report --eval``, the sweep report and
export's model card read): each complete cell ``{setting}/`` with its metrics and identity."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ratune.eval.report import read_metrics
from ratune.io import read_json_object
from ratune.manifest import is_complete


@dataclass(frozen=True)
class FinishedCell:
    """A complete eval cell: its test ``setting`` (the folder's name), ``folder`` and ``metrics``
    (:func:`ratune.eval.report.read_metrics` of its metrics.json)."""

    setting: str
    folder: Path
    metrics: dict

    @property
    def metrics_path(self) -> Path:
        return self.folder / "metrics.json"

    def identity(self) -> dict | None:
        """The cell's identity.json (what it was computed from), or None when it has none.

        Raises:
            InputError: a torn file, naming it.
        """
        path = self.folder / "identity.json"
        return read_json_object(path) if path.is_file() else None


def finished_cells(eval_dir: str | os.PathLike) -> list[FinishedCell]:
    """The finished cells of an eval folder (sub-folders with ``.complete``), by setting name; [] for
    a folder that does not exist.

    Raises:
        InputError: a complete cell whose metrics.json is missing, torn or not metrics, naming it.
    """
    folder = Path(eval_dir)
    cells = sorted(p for p in folder.iterdir() if p.is_dir() and is_complete(p)) if folder.is_dir() else []
    return [FinishedCell(setting=c.name, folder=c, metrics=read_metrics(c / "metrics.json")) for c in cells]
