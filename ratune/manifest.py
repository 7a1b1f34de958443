"""Run manifests and completion markers.

Every command writes ``manifest.json`` into its output folder: the command, the package
versions that change results (transformers, trl, peft, accelerate, datasets, torch, tree-sitter
and its grammar, ...), and the git commit of the code. A folder's ``.complete`` marker is written
last; a folder without it is never read as complete.

This module is also the one owner of "this folder is a ratune output of stage X"
(:func:`output_stage`): the :data:`OWNER_MARKER` file a stage writes when it makes the folder.
ratune replaces, deletes or writes into an existing non-empty folder only when it is such an output
of the same stage (:func:`require_owned`); :func:`ratune.locks.replacing_folder` builds a new output in a
temporary sibling and swaps it in at the end, under the output's lock (:mod:`ratune.locks`).
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

#: Packages whose versions are recorded in every manifest and results file.
TRACKED_PACKAGES = ("ratune", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed",
                    "sentence-transformers", "rank-bm25", "bm25s", "tree-sitter", "tree-sitter-languages", "tokenizers")

COMPLETE_MARKER = ".complete"
#: Written into every output folder ratune makes (data build, data utility, train, eval run,
#: retrieval train, retrieval index, retrieval eval, sweep, report, demo), holding
#: ``{"stage": COMMAND}``; exports carry ``ratune_export.json`` instead.
OWNER_MARKER = ".ratune-output"
#: Stage names, typed once: what an OWNER_MARKER holds (:func:`claim_folder`), the ``command`` of
#: a data build's, training's, eval's and export's manifest, and the command a lock file records.
#: Stages whose names only their own package reads keep them there (catalog/schema.py
#: IMPORT_STAGE, catalog/pairs.py PAIRS_STAGE and INSTRUCT_STAGE, data/utility.py UTILITY_STAGE,
#: retrieval/cli.py EVAL_STAGE, eval/curve.py STAGE, eval/bfcl_run.py BFCL_STAGE).
DATA_BUILD_STAGE = "data build"
TRAIN_STAGE = "train"
EVAL_RUN_STAGE = "eval run"
EXPORT_STAGE = "export"
RETRIEVER_TRAIN_STAGE = "retrieval train"
BM25_INDEX_STAGE = "retrieval index"
REPORT_STAGE = "report"
SWEEP_STAGE = "sweep"
DEMO_STAGE = "demo"
#: The outputs a sweep runs in: a demo runs its sweep file into its folder, so each writes into
#: the other's.
SWEEP_FOLDER_STAGES = (SWEEP_STAGE, DEMO_STAGE)
#: Outputs that carry their own record file instead of :data:`OWNER_MARKER` (an export is
#: pushed to the hub as it is; ``ratune_export.json`` says what made it).
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
    """The processor a run computes on, for manifests and results files: fp32 results on a CPU depend
    on it (which kernels torch and its BLAS pick, and how they block for its caches), so two runs that
    differ can be told apart.

    Equal facts do not promise equal bits: a virtual machine may show the same processor on other
    physical hosts (docs/reproduction/README.md, "make reproduce from a fresh clone").

    Args:
        cpuinfo: the file to read the first processor's block from (Linux's; a missing file is no error).
        cpu_sysfs: the first CPU's sysfs folder, whose ``cache/index*/{level,type,size}`` give the cache
            sizes (Linux's; missing files are no error).

    Returns:
        ``{"cpu": the model name from /proc/cpuinfo (``platform.processor()`` where there is none;
        None when neither says), "cpu_id": ``"cpu family F, model M, stepping S"`` from /proc/cpuinfo
        (None without it; a hypervisor may show only a family name such as "AMD EPYC", and this tells
        its generations apart), "microcode": its microcode revision, "bogomips": the kernel's BogoMIPS
        (twice the clock it calibrated against, in millions per second: a hint of the host's clock),
        "flags_sha256": the first 16 hex digits of the sha256 of its sorted feature flags joined by
        spaces (each None where /proc/cpuinfo does not say), "caches": ``{"L1d", "L1i", "L2", "L3":
        size as sysfs writes it, e.g. "32768K"}`` (None without sysfs), "cpu_capability": the vector
        ISA torch dispatches to (``"AVX2"``, ``"AVX512"``, ``"DEFAULT"``, ...), "cpu_count": logical
        CPUs, "torch_threads": ``torch.get_num_threads()`` at the time of the call}``.
    """
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
    """Refuse to ``action`` an existing non-empty ``folder`` unless it is a ratune ``stage`` output
    (or an output of one of the stages ``also`` names: a sweep writes into a demo folder).

    A folder that does not exist, or is empty, passes.

    Raises:
        RatuneError: naming the folder: it is a file, or not a ratune output of ``stage`` (and what
            made it, when it is another stage's output).
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
