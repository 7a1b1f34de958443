"""Faults injected into every writer that goes through ratune/output.py: a full disk (ENOSPC) at a
chosen file write, and a SIGKILL at a chosen file write in a child process. After each, what was
complete before is byte-identical, nothing partial is marked complete, nothing temporary is left
behind, and the plain rerun ends with the bytes of an uninterrupted run.

A write is a temporary file ratune's atomic writes make (``tempfile.mkstemp``, ratune/io.py
``atomic_write``): the suite counts them in an uninterrupted run and injects at the first, the
middle and the last. The killed children are forked by multiprocessing's fork server, which imports
the heavy libraries once (:data:`PRELOAD`). Native writers (pyarrow, safetensors, tokenizers,
torch.save) are reached by a real small disk instead (tests/test_faults.py). :data:`WRITERS` x :data:`FAULTS` is the table in
docs/reliability.md ("Faults injected into every writer"), which
:func:`test_the_docs_table_is_this_suite` keeps equal to this file."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLBOX = ROOT / "examples" / "catalogs" / "hand-written" / "toolbox.jsonl"
TOOL_ROWS = ROOT / "tests" / "fixtures" / "tools" / "xlam_rows.jsonl"


@dataclass(frozen=True)
class Writer:
    """A command that writes one output: ``argv(work)`` and its output folder ``out(work)``;
    ``prepare(work, fixtures)`` makes its inputs and, for a rewrite, the previous output."""

    name: str
    kind: str  # "replace" (built beside, swapped in) or "in place" (finished parts marked .complete)
    argv: Callable
    out: Callable
    prepare: Callable | None = None
    skip: tuple = ()  # sub-folders or files not compared (the Trainer's checkpoints: pickled RNG and optimizer
    #                   state; sentence-transformers' model card README.md, which states the training time)
    resumed: tuple = ()  # JSON keys not compared: what this invocation did (a resumed run generates less), or a
    #                      hash of paths inside the work folder (a sweep cell's config_hash of its output_dir)
    only: tuple = ()  # when set, the files compared: a resumed training records its resume (resumed_from, its
    #                   own log history and loss), so its weights, config and tokenizer are what must be equal
    fresh: bool = False  # writes a new folder only (export refuses an existing one): no previous output
    fakes: Callable | None = None  # fakes(setattr) installs stand-ins for what cannot run here (the hub, a
    #                                sweep's commands), in this process and in the killed child
    also: Callable | None = None  # another folder the command writes (the fake hub's), compared as out is


def _data_argv(work, fx):
    return ["data", "build", "--apibench", str(fx["apibench_tiny"]), "--hub", "torchhub", "--out",
            str(work / "data"), "--tokenizer", str(fx["smol_tokenizer_dir"]), "--modes", "none", "oracle",
            "--overwrite"]


def _catalog(work, fx):
    from ratune.cli import main

    assert main(["catalog", "import", "--from", "jsonl", str(TOOLBOX), "--out", str(work / "catalog")]) == 0


def _pairs_file(work, apis: int | None = None, verbs=("work", "run", "help")) -> Path:
    """Pairs of the catalog's first ``apis`` APIs (default: all), one per verb."""
    from ratune.catalog.schema import load_catalog

    docs = load_catalog(work / "catalog")[:apis]
    lines = [json.dumps({"instruction": f"please {verb} with {doc['api_name']}", "api_name": doc["api_name"],
                         "api_call": doc["api_call"]})
             for doc in docs for verb in verbs]
    path = work / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _report_sweep(work, fx):
    from sweep_cells import finished_cell, rate_metrics

    from ratune.manifest import claim_folder

    sweep = work / "sweep"
    for arm, correct in (("none", 4), ("oracle", 7)):
        finished_cell(sweep, f"train_retriever-{arm}", {"train_retriever": arm},
                      {s: {**rate_metrics(10, correct, 1), "hub": "torchhub"} for s in ("0_shot", "oracle")})
    claim_folder(sweep, "sweep")


def _eval_first(work, fx):
    from ratune.cli import main

    assert main(_eval_argv(work, fx, "0_shot")) == 0  # the cell that was complete before


def _eval_argv(work, fx, settings="0_shot oracle"):
    return ["eval", "run", "--checkpoint", str(fx["tiny_model_dir"]), "--hub", "torchhub", "--apibench",
            str(fx["apibench_tiny"]), "--out", str(work / "eval"), "--settings", *settings.split(),
            "--n-questions", "2", "--max-new-tokens", "4", "--batch-size", "2"]


def _bfcl_outputs(work, fx):
    """Two ``ratune eval bfcl --responses`` outputs of hand-written answers to 2 simple_python entries."""
    from ratune.cli import main
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text

    entries = load_bfcl(bfcl_data_dir(), "simple_python")[:2]
    for name in ("keys", "empty"):
        given = work / f"given_{name}" / "simple_python"
        given.mkdir(parents=True)
        given.joinpath("responses.jsonl").write_text("".join(
            json.dumps({"id": e.id, "text": possible_answer_text(e.possible_answer, e.functions) if name == "keys"
                        else "[]"}) + "\n" for e in entries))
        assert main(["eval", "bfcl", "--responses", str(given.parent), "--out", str(work / name)]) == 0


def _train_config(work, fx):
    from test_train_correctness import _config, _make_data

    data = _make_data(work / "rows", n=4)
    cfg = _config(fx["tiny_model_dir"], data, work / "run", global_batch_size=1, max_steps=4, save_steps=2,
                  lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})
    (work / "train.json").write_text(json.dumps(cfg.model_dump()))


def _catalog_with_pairs(work, fx):
    """The catalog with 2 training and 2 eval pairs of 2 APIs: one training step of the retriever."""
    from ratune.cli import main

    _catalog(work, fx)
    assert main(["catalog", "pairs", "--catalog", str(work / "catalog"), "--pairs",
                 str(_pairs_file(work, apis=2, verbs=("work", "run"))), "--eval-fraction", "0.5", "--seed", "0"]) == 0


def _checkpoints_run(fx) -> Path:
    """A LoRA run with the Trainer checkpoints of steps 1 and 2, trained once for the module."""
    if "checkpoints_run" not in fx:
        from test_train_correctness import _config, _make_data

        from ratune.cli import main

        folder = fx["tmp_path_factory"].mktemp("curve")
        cfg = _config(fx["tiny_model_dir"], _make_data(folder / "rows", n=4), folder / "run", global_batch_size=2,
                      max_steps=2, save_steps=1, lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})
        (folder / "train.json").write_text(json.dumps(cfg.model_dump()))
        assert main(["train", "--config", str(folder / "train.json")]) == 0
        fx["checkpoints_run"] = folder / "run"
    return fx["checkpoints_run"]


def _fake_hub(setattr):
    """The hub (no network here): a token, and an upload that records the sha256 of every file it
    sends in ``hub/OWNER--NAME.json`` beside the uploaded folder, in one write (a hub commit)."""
    import huggingface_hub
    from huggingface_hub import HfApi

    from ratune.io import sha256_file, write_json

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, commit_message=None):
        folder = Path(folder_path)
        write_json(folder.parent / "hub" / f"{repo_id.replace('/', '--')}.json",
                   {"repo_type": repo_type, "commit_message": commit_message,
                    "files": {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*"))
                              if p.is_file()}})

    setattr(huggingface_hub, "get_token", lambda: "hf_fake_token_for_the_fault_suite")
    setattr(HfApi, "create_repo", lambda self, repo_id, **kw: f"https://huggingface.co/{repo_id}")
    setattr(HfApi, "upload_folder", upload_folder)


def _instruct_argv(work, fx, *extra):
    """``catalog instruct`` with the tiny model, whose seed examples are tests/test_catalog_instruct.py's."""
    from test_catalog_instruct import SEEDS

    seeds = work / "seeds.jsonl"
    if not seeds.exists():
        seeds.write_text("".join(json.dumps(seed) + "\n" for seed in SEEDS))
    return ["catalog", "instruct", "--catalog", str(work / "catalog"), "--model", str(fx["tiny_model_dir"]),
            "--seeds", str(seeds), "--out", str(work / "gen" / "pairs.jsonl"), "--per-api", "2",
            "--max-new-tokens", "8", "--batch-size", "3", *extra]


def _instructed_before(work, fx):
    """The catalog, and the pairs an earlier ``catalog instruct`` (another seed) wrote to replace."""
    from ratune.cli import main

    _catalog(work, fx)
    assert main(_instruct_argv(work, fx, "--seed", "1")) == 0


def _sweep_file(work) -> Path:
    """tests/test_sweep.py's sweep file (into ``work/sweep``) with three cells."""
    from test_sweep import write_sweep

    path = work / "sweep.yaml"
    if not path.exists():
        write_sweep(work, axes={"train_retriever": ["none", "oracle", "bm25"]},
                    accelerate_config=str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"))
    return path


def _fake_commands(setattr):
    """A sweep's commands leave what the real ones leave (tests/test_sweep.py FakeRunner)."""
    from test_sweep import FakeRunner

    import ratune.sweep.local

    setattr(ratune.sweep.local, "run_command", FakeRunner())


WRITERS = [
    Writer("data build --overwrite", "replace", _data_argv, lambda w: w / "data"),
    Writer("catalog import", "in place",
           lambda w, fx: ["catalog", "import", "--from", "jsonl", str(TOOLBOX), "--out", str(w / "catalog")],
           lambda w: w / "catalog"),
    Writer("catalog pairs", "replace",
           lambda w, fx: ["catalog", "pairs", "--catalog", str(w / "catalog"), "--pairs", str(_pairs_file(w)),
                          "--eval-fraction", "0.34", "--seed", "0"],
           lambda w: w / "catalog" / "pairs", prepare=_catalog),
    Writer("retrieval index", "replace",
           lambda w, fx: ["retrieval", "index", "--hub", "torchhub", "--apibench", str(fx["apibench_tiny"]),
                          "--retriever", "bm25", "--out", str(w / "index")],
           lambda w: w / "index"),
    Writer("report", "in place", lambda w, fx: ["report", str(w / "sweep")], lambda w: w / "sweep" / "report",
           prepare=_report_sweep),
    Writer("eval run", "in place", _eval_argv, lambda w: w / "eval", prepare=_eval_first),
    Writer("train (LoRA, merged model)", "in place",
           lambda w, fx: ["train", "--config", str(w / "train.json"), "--on-unfinished", "resume"],
           lambda w: w / "run", prepare=_train_config, skip=("trainer", "logs"),
           only=("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "model/model.safetensors",
                 "model/config.json", "model/tokenizer.json", "model/generation_config.json", ".ratune-output",
                 ".complete")),
    Writer("eval bfcl", "in place",
           lambda w, fx: ["eval", "bfcl", "--checkpoint", str(fx["tiny_model_dir"]), "--categories", "simple_python",
                          "irrelevance", "--limit", "2", "--max-new-tokens", "4", "--batch-size", "2",
                          "--out", str(w / "bfcl")],
           lambda w: w / "bfcl", resumed=("timing",)),
    Writer("report --bfcl", "in place",
           lambda w, fx: ["report", "--bfcl", f"keys={w / 'keys'}", "--bfcl", f"empty={w / 'empty'}", "--out",
                          str(w / "bfcl_report")],
           lambda w: w / "bfcl_report", prepare=_bfcl_outputs),
    Writer("tools import", "replace",
           lambda w, fx: ["tools", "import", "--from", "rows", str(TOOL_ROWS), "--out", str(w / "tools")],
           lambda w: w / "tools"),
    Writer("export", "replace",
           lambda w, fx: ["export", str(fx["tiny_model_dir"]), "--out", str(w / "export")], lambda w: w / "export",
           fresh=True),
    Writer("retrieval train --overwrite", "replace",
           lambda w, fx: ["retrieval", "train", "--hub", str(w / "catalog"), "--out", str(w / "ft"), "--epochs", "1",
                          "--batch-size", "2", "--threads", "1", "--overwrite"],
           lambda w: w / "ft", prepare=_catalog_with_pairs, skip=("README.md",)),
    Writer("eval run --all-checkpoints", "in place",
           lambda w, fx: ["eval", "run", "--checkpoint", str(_checkpoints_run(fx)), "--all-checkpoints", "--hub",
                          "torchhub", "--apibench", str(fx["apibench_tiny"]), "--out", str(w / "curve"), "--settings",
                          "0_shot", "--n-questions", "2", "--max-new-tokens", "4", "--batch-size", "2"],
           lambda w: w / "curve"),
    Writer("export --push-to-hub", "replace",
           lambda w, fx: ["export", str(fx["tiny_model_dir"]), "--out", str(w / "export"), "--push-to-hub",
                          "someone/tiny", "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct"],
           lambda w: w / "export", fresh=True, fakes=_fake_hub, also=lambda w: w / "hub"),
    Writer("catalog instruct --overwrite", "in place", lambda w, fx: _instruct_argv(w, fx, "--overwrite"),
           lambda w: w / "gen", prepare=_instructed_before),
    Writer("sweep", "in place", lambda w, fx: ["sweep", str(_sweep_file(w))], lambda w: w / "sweep",
           fakes=_fake_commands, resumed=("config_hash",)),
]
#: The faults, each at the first, the middle and the last write of an uninterrupted run.
FAULTS = ("ENOSPC", "SIGKILL")
#: What the suite asserts after every fault (the docs table's outcome column).
OUTCOME = ("previous output byte-identical; nothing partial marked complete; no temporary file or "
           "folder and no lock left; the rerun's bytes equal an uninterrupted run's")


def _snapshot(folder: Path, base: Path, skip: tuple = (), only: tuple = (), resumed: tuple = ()) -> dict[str, object]:
    """Every file under ``folder`` by relative path, ``base`` (the work folder) written ``<BASE>``:
    parsed JSON without volatile keys (times, versions; bench/behaviour_hashes.py strip_volatile),
    else bytes (PNG files by name only: matplotlib's bytes are not asserted)."""
    from test_bench import _load

    import hashlib

    strip = _load("behaviour_hashes").strip_volatile
    files = [p for p in sorted(folder.rglob("*")) if folder.is_dir() and p.is_file() and "tfevents" not in p.name
             and not set(skip) & set(p.relative_to(folder).parts)
             and (not only or str(p.relative_to(folder)) in only)]
    # a JSON file's sha256 recorded in another file changes with its volatile fields: named instead
    digests = {hashlib.sha256(p.read_bytes()).hexdigest(): f"sha256 of {p.relative_to(folder)}"
               for p in files if p.suffix == ".json"}

    def named(value):
        if isinstance(value, dict):
            return {k: named(v) for k, v in value.items() if k not in resumed}
        if isinstance(value, list):
            return [named(v) for v in value]
        return digests.get(value, value) if isinstance(value, str) else value

    out = {}
    for path in files:
        rel = str(path.relative_to(folder))
        data = path.read_bytes().replace(str(base).encode(), b"<BASE>")
        if path.suffix == ".json":  # BFCL's result files hold a JSON object a line
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = [json.loads(line) for line in data.splitlines() if line.strip()]
            out[rel] = strip(named(parsed))
        else:
            out[rel] = "png" if path.suffix == ".png" else data
    return out


def _differences(a, b, at: str = "") -> list[str]:
    """Dotted paths where two snapshots differ (for assertion messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{at}/{k}")]
    return [] if a == b else [f"{at}: {str(a)[:200]!r} != {str(b)[:200]!r}"]


def _leftovers(work: Path) -> list[str]:
    """Temporary siblings, temporary files and lock files anywhere under ``work``."""
    return sorted(str(p.relative_to(work)) for p in work.rglob("*")
                  if p.name.startswith((".ratune-tmp.", ".ratune-old.")) or p.name.endswith((".ratune.lock", ".tmp")))


def _completes(work: Path) -> set[str]:
    return {str(p.relative_to(work)) for p in work.rglob(".complete")}


def _inject(at: int | None, action: str, counter: list):
    """A stand-in for tempfile.mkstemp that counts calls and, at call ``at``, raises ENOSPC or kills
    the process."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        counter[0] += 1
        if counter[0] == at:
            if action == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    return mkstemp


@pytest.fixture(scope="module")
def fixtures(request):
    return {name: request.getfixturevalue(name)
            for name in ("apibench_tiny", "smol_tokenizer_dir", "tiny_model_dir", "tmp_path_factory")}


def _run(argv, monkeypatch, at=None, action="ENOSPC") -> tuple[int, int]:
    from ratune.cli import main

    counter = [0]
    with monkeypatch.context() as mp:
        mp.setattr(tempfile, "mkstemp", _inject(at, action, counter))
        return main(argv), counter[0]


#: What the killed children import once, in multiprocessing's fork server, before it forks the first of
#: them: a child then starts at once instead of importing torch, transformers and the rest anew.
PRELOAD = ["test_fault_injection", "ratune.cli", "torch", "transformers", "peft", "datasets", "sentence_transformers",
           "huggingface_hub", "test_sweep", "test_catalog_instruct"]


def _child(at: int, argv: list, fakes: str, cwd: str):
    """A killed child's body: the stand-ins (``fakes``, a function of this module), a SIGKILL at
    write ``at``, and the command."""
    os.chdir(cwd)
    if fakes:
        globals()[fakes](setattr)
    tempfile.mkstemp = _inject(at, "SIGKILL", [0])
    from ratune.cli import main

    sys.exit(main(argv))


def _killed_child(at: int, argv: list, fakes: str, cwd: Path) -> int:
    """Run the command in a child process killed at write ``at``; its exit code (-9 when killed)."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    child = context.Process(target=_child, args=(at, argv, fakes, str(cwd)))
    child.start()
    child.join()
    return child.exitcode


@pytest.mark.parametrize("writer", WRITERS, ids=[w.name for w in WRITERS])
def test_faults_at_chosen_writes_keep_the_previous_output_and_the_rerun_finishes(writer, fixtures, tmp_path,
                                                                                 monkeypatch, capsys):
    clean, work = tmp_path / "clean", tmp_path / "work"

    def snap(folder, base):
        return _snapshot(folder, base, writer.skip, writer.only, writer.resumed)

    def output(w):  # the output folder and, where there is one, the other folder written (the hub's)
        also = {f"also/{k}": v for k, v in snap(writer.also(w), w).items()} if writer.also else {}
        return {**snap(writer.out(w), w), **also}

    if writer.fakes:
        writer.fakes(monkeypatch.setattr)
    for folder in (clean, work):
        folder.mkdir()
        if writer.prepare:
            writer.prepare(folder, fixtures)
    assert _run(writer.argv(clean, fixtures), monkeypatch)[0] == 0
    expected = output(clean)
    assert expected and (not writer.also or any(k.startswith("also/") for k in expected))  # something to compare
    if writer.kind == "replace" and not writer.fresh:  # a previous output to keep
        assert _run(writer.argv(work, fixtures), monkeypatch)[0] == 0
    pristine = tmp_path / "pristine"
    shutil.copytree(work, pristine, symlinks=True)

    def restore():  # every fault starts from the same state (paths inside stay valid: same place)
        shutil.rmtree(work)
        shutil.copytree(pristine, work, symlinks=True)

    rc, writes = _run(writer.argv(work, fixtures), monkeypatch)  # how many writes this state's run makes
    assert rc == 0 and writes >= 1
    for fault in FAULTS:
        for at in sorted({1, (writes + 1) // 2, writes}):
            restore()
            before = output(work)
            complete_before = _completes(work)
            capsys.readouterr()
            if fault == "ENOSPC":
                rc, _ = _run(writer.argv(work, fixtures), monkeypatch, at=at)
                lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("ratune")]
                assert rc == 2 and len(lines) == 1, (fault, at, lines)
                assert lines[0].startswith("ratune: error: no space left on device (errno ENOSPC) while writing ")
            else:
                fakes = writer.fakes.__name__ if writer.fakes else ""
                assert _killed_child(at, writer.argv(work, fixtures), fakes, tmp_path) == -signal.SIGKILL, at
            if writer.kind == "replace":
                assert output(work) == before, (fault, at)
            for done in _completes(work):  # whatever is marked complete is finished: the clean run's bytes
                part = Path(done).parent
                assert snap(work / part, work) == snap(clean / part, clean), (fault, at, done)
            assert complete_before <= _completes(work), (fault, at)
            if fault == "ENOSPC":
                assert _leftovers(work) == [], (fault, at)
            rc, _ = _run(writer.argv(work, fixtures), monkeypatch)  # the plain rerun
            assert rc == 0, (fault, at)
            differences = _differences(output(work), expected)
            assert not differences, f"{fault} at write {at}:\n" + "\n".join(differences)
            assert _leftovers(work) == [], (fault, at)


def test_the_docs_table_is_this_suite():
    table = ["| writer | kind | faults (at the first, middle and last write) | outcome |", "|---|---|---|---|"]
    table += [f"| `ratune {w.name}` | {w.kind} | {', '.join(FAULTS)} | {OUTCOME} |" for w in WRITERS]
    assert "\n".join(table) in (ROOT / "docs" / "reliability.md").read_text()
