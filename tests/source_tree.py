"""ratune's source folders, read from pyproject.toml's ``[tool.setuptools] package-dir`` (the one
place that maps each ``ratune.*`` package to its folder), for the tests that audit every source
file: a new stage folder is audited without editing them."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: ``{folder: package}`` of the ``ratune`` import name (``data`` -> ``ratune.data``, ...), in file order.
PACKAGES = {folder: package for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
            ["tool"]["setuptools"]["package-dir"].items()}
#: The folders of the ``ratune`` import name's packages (ratune/, data/, catalog/, ...), in file order.
PACKAGE_DIRS = tuple(PACKAGES)


def source_files(*, bench: bool = False) -> list[Path]:
    """Every .py file of the package folders (and bench/ with ``bench``), sorted per folder."""
    folders = [*PACKAGE_DIRS, *(["bench"] if bench else [])]
    return [p for d in folders for p in sorted((ROOT / d).rglob("*.py"))]
