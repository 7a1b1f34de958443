"""Run manifests, completion markers and the owner marker that says which stage made a folder
(docs/reliability.md#manifests-and-input-hashes, #what-ratune-deletes-or-overwrites)."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

#: Packages whose versions are recorded in every manifest and results file.
TRACKED_PACKAGES = ("ratune", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed",
                    "sentence-transformers", "rank-bm25", "bm25s", "tree-sitter", "tree-sitter-languages", "tokenizers")

COMPLETE_MARKER = ".complete"
#: Written into every output folder ratune makes, holding ``{"stage": COMMAND}``.
OWNER_MARKER = ".ratune-output"
#: Stage names, typed once (owner markers, manifests' ``command``, lock files); a stage only its
#: own package reads keeps its name there (e.g. catalog/pairs.py PAIRS_STAGE).
DATA_BUILD_STAGE = "data build"
TRAIN_STAGE = "train"
EVAL_RUN_STAGE = "eval run"
EXPORT_STAGE = "export"
RETRIEVER_TRAIN_STAGE = "retrieval train"
BM25_INDEX_STAGE = "retrieval index"
REPORT_STAGE = "report"
SWEEP_STAGE = "sweep"
DEMO_STAGE = "demo"
#: The outputs a sweep runs in (a demo is a sweep).
SWEEP_FOLDER_STAGES = (SWEEP_STAGE, DEMO_STAGE)
#: Outputs that carry their own record file instead of :data:`OWNER_MARKER` (exports are pushed as they are).
RECORD_FILES = {EXPORT_STAGE: "ratune_export.json"}


def package_versions() -> dict:
    """``{package: version}`` for TRACKED_PACKAGES that are installed."""
    out = {}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def host_facts(cpuinfo: str | Path = "/proc/cpuinfo", cpu_sysfs: str | Path = "/sys/devices/system/cpu/cpu0") -> dict:
    """The processor a run computes on (layout: docs/training.md#a-gpu-launch-never-trains-on-the-cpu),
    read from ``cpuinfo`` and the first CPU's sysfs folder; a missing file or field gives None."""
    import hashlib
    import os
    import platform

    import torch

    fields = {}
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block ends at its blank line
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    ident = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if fields.get(k)]
    flags = " ".join(sorted(fields.get("flags", "").split()))
    caches = {}
    for index in sorted(Path(cpu_sysfs, "cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        caches[f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")] = size
    return {"cpu": fields.get("model name") or platform.processor() or None, "cpu_id": ", ".join(ident) or None,
            "microcode": fields.get("microcode"), "bogomips": fields.get("bogomips"),
            "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16] if flags else None,
            "caches": caches or None, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


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


def claim_folder(folder: str | Path, stage: str) -> None:
    """Mark ``folder`` (created by ratune) as an output of ``stage`` (:data:`OWNER_MARKER`)."""
    from ratune.io import write_json

    write_json(Path(folder, OWNER_MARKER), {"stage": stage})


def output_stage(folder: str | Path) -> str | None:
    """The stage whose output ``folder`` is (its :data:`OWNER_MARKER`, or a :data:`RECORD_FILES`
    file), or None when ratune did not make it. A marker that cannot be read counts as not ratune's."""
    import json

    folder = Path(folder)
    if not folder.is_dir():
        return None
    if (folder / OWNER_MARKER).exists():
        try:
            stage = json.loads((folder / OWNER_MARKER).read_text(encoding="utf-8")).get("stage")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            return None
        return stage if isinstance(stage, str) else None
    return next((stage for stage, name in RECORD_FILES.items() if (folder / name).is_file()), None)


def require_owned(folder: str | Path, stage: str, *, action: str = "replace", also: tuple[str, ...] = ()) -> None:
    """Refuse to ``action`` an existing non-empty ``folder`` unless it is a ratune output of
    ``stage`` or of a stage in ``also``.

    Raises:
        RatuneError: it is a file, or not a ratune output of ``stage`` (naming what made it).
    """
    from ratune.errors import RatuneError

    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir():
        raise RatuneError(f"{folder}: exists and is not a folder; choose another output path")
    if not any(folder.iterdir()):
        return
    found = output_stage(folder)
    if found == stage or found in also:
        return
    what = f"it is a ratune {found} output" if found else f"it has no {OWNER_MARKER} marker"
    raise RatuneError(f"{folder}: not a ratune {stage} output ({what}); ratune does not {action} folders it did "
                      "not make: choose another output folder, or move this one away yourself")
