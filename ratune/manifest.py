"""Run manifests and completion markers.

Every command writes ``manifest.json`` into its output folder: the command, the package
versions that change results (transformers, trl, peft, accelerate, datasets, torch, tree-sitter
and its grammar, ...), and the git commit of the code. A folder's ``.complete`` marker is written
last; a folder without it is never read as complete.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

#: Packages whose versions are recorded in every manifest and results file.
TRACKED_PACKAGES = ("ratune", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed",
                    "sentence-transformers", "rank-bm25", "bm25s", "tree-sitter", "tree-sitter-languages", "tokenizers")

COMPLETE_MARKER = ".complete"


def package_versions() -> dict:
    """``{package: version}`` for TRACKED_PACKAGES that are installed."""
    out = {}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    """The git commit of the ratune source tree (with ``-dirty`` when modified), or None."""
    here = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def base_manifest(command: str) -> dict:
    """The fields every manifest starts with: command, package versions, git commit."""
    return {"command": command, "versions": package_versions(), "git_commit": git_commit()}


def mark_complete(folder: str | Path) -> None:
    """Write the completion marker (call it after everything else in the folder is written)."""
    Path(folder, COMPLETE_MARKER).write_text("complete\n")


def is_complete(folder: str | Path) -> bool:
    """Whether a folder carries the completion marker."""
    return Path(folder, COMPLETE_MARKER).exists()
