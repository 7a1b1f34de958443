"""Fingerprints of ratune's observable behaviour, to prove a refactor changed nothing.

What it records (each a sha256 of the bytes a user would read):
- ``data/<mode>/<split>``: the rows of ``ratune data build --hub torchhub`` for every train-time
  mode that needs no trained model (none, oracle, our two BM25 variants, dense), with the
  demo model's tokenizer measuring lengths;
- ``scores/<file>``: ``ratune eval score --json`` of every released TorchHub response file
  (both metrics' counts), i.e. the released responses' Table 2;
- ``eval/<setting>``: ``responses.jsonl`` of a demo-model eval cell on the first N TorchHub
  questions under 0_shot, bm25, gpt_index and oracle (greedy, CPU, float32);
- ``sweep_dry_run/<file>``: the commands ``ratune sweep FILE --dry-run`` prints for every sweep
  file under configs/sweeps/.

Usage::

    python bench/behaviour_hashes.py --out /tmp/before.json          # record
    python bench/behaviour_hashes.py --check /tmp/before.json        # compare, exit 1 on a change
    python bench/behaviour_hashes.py --out r.json --model DIR        # another model folder (tests: a tiny one)

Model outputs depend on the CPU's float kernels, so compare two records made on one machine.
Takes about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATUNE = [sys.executable, "-m", "ratune.cli"]
MODES = ("none", "oracle", "bm25", "bm25_replica", "dense")
EVAL_SETTINGS = ("0_shot", "bm25", "gpt_index", "oracle")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run(args: list[str], cwd: Path = ROOT) -> bytes:
    proc = subprocess.run([*RATUNE, *args], cwd=cwd, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        raise SystemExit(f"behaviour_hashes: `ratune {' '.join(args)}` failed ({proc.returncode}):\n"
                         f"{proc.stderr.decode(errors='replace')[-3000:]}")
    return proc.stdout


def _row_files(folder: Path) -> dict[str, str]:
    """sha256 of each split's rows, read back as JSON lines (storage-format independent)."""
    from datasets import load_from_disk

    out = {}
    for split_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        if (split_dir / "dataset_info.json").exists():
            rows = load_from_disk(str(split_dir))
            text = "\n".join(json.dumps(r, sort_keys=True, ensure_ascii=False) for r in rows)
            out[split_dir.name] = _sha(text.encode())
        elif list(split_dir.glob("*.jsonl")):
            for f in sorted(split_dir.glob("*.jsonl")):
                out[f"{split_dir.name}/{f.name}"] = _sha(f.read_bytes())
    for f in sorted(folder.glob("*.jsonl")):
        out[f.name] = _sha(f.read_bytes())
    return out


def record(apibench: str, n_questions: int, work: Path, model: str | None = None) -> dict[str, str]:
    """Run every probe in ``work`` and return {probe name: sha256}; ``model`` is a model folder
    (default: the demo model, converted once, ratune/models.py ensure_demo_model)."""
    from ratune.models import ensure_demo_model

    hashes: dict[str, str] = {}
    model = model or str(ensure_demo_model())
    data = work / "data"
    _run(["data", "build", "--apibench", apibench, "--hub", "torchhub", "--out", str(data),
          "--tokenizer", model, "--modes", *MODES])
    for mode in MODES:
        for name, digest in _row_files(data / mode).items():
            hashes[f"data/{mode}/{name}"] = digest
    responses = Path(apibench) / "responses"
    for f in sorted(responses.glob("response_torchhub_*.jsonl")):
        out = json.loads(_run(["eval", "score", "--hub", "torchhub", "--responses", str(f), "--json"]))
        hashes[f"scores/{f.name}"] = _sha(json.dumps(out, sort_keys=True).encode())
    ev = work / "eval"
    _run(["eval", "run", "--apibench", apibench, "--checkpoint", model, "--hub", "torchhub", "--out", str(ev),
          "--settings", *EVAL_SETTINGS, "--n-questions", str(n_questions), "--max-new-tokens", "64",
          "--device", "cpu", "--threads", "2"])
    for setting in EVAL_SETTINGS:
        hashes[f"eval/{setting}"] = _sha((ev / setting / "responses.jsonl").read_bytes())
    for sweep in sorted((ROOT / "configs" / "sweeps").glob("*.yaml")):
        text = _run(["sweep", str(sweep), "--dry-run", "--out", str(work / "sweeps" / sweep.stem)])
        text = text.replace(str(work).encode(), b"WORK")
        hashes[f"sweep_dry_run/{sweep.name}"] = _sha(text)
    return hashes


def renamed(record_: dict[str, str]) -> dict[str, str]:
    """A record with its keys in today's names: one made before a rename (ratune/registry.py
    RENAMED) names the mode's old folder."""
    from ratune.registry import RENAMED

    return {"/".join(RENAMED.get(part, part) for part in k.split("/")): v for k, v in record_.items()}


def compare(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The probes whose hashes differ (or that only one record has), sorted; ``before`` is read
    with today's names (:func:`renamed`)."""
    before = renamed(before)
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apibench", default=os.environ.get("RATUNE_APIBENCH", str(ROOT.parent / "shared" / "apibench")))
    p.add_argument("--n-questions", type=int, default=6)
    p.add_argument("--model", default=None, help="model folder for the data build and eval probes (default: the demo model)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the record (JSON) here")
    g.add_argument("--check", help="compare with this record; exit 1 and list the probes that differ")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ratune-behaviour-") as tmp:
        hashes = record(args.apibench, args.n_questions, Path(tmp), args.model)
    if args.out:
        Path(args.out).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"{len(hashes)} probes recorded in {args.out}")
        return 0
    before = json.loads(Path(args.check).read_text())
    changed = compare(before, hashes)
    before = renamed(before)  # printed in today's names, as compared
    for k in changed:
        print(f"CHANGED {k}: {before.get(k, 'missing')} -> {hashes.get(k, 'missing')}")
    print(f"{len(set(hashes) - set(changed))} of {len(set(hashes) | set(changed))} probes identical")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
