"""Tests for claims of docs/reliability.md that had no test ("Not yet backed by a test").

- every manifest (data build, training run, the model's copy of it, eval run) records the git
  commit of the code, as ``git rev-parse HEAD`` gives it, marked ``-dirty`` exactly when tracked
  files differ from that commit;
- the sha256s a data manifest, a run manifest, an eval cell's ``metrics.json`` and an eval
  manifest record are those of the files they name, recomputed here;
- ``sweep.json``'s ``sources`` hold the real sha256 of every ``metrics.json`` the report read;
- ``atomic_write`` writes through unique temporary names, never a fixed one that could be yours;
- under ``accelerate launch`` with two processes ratune's error reaches the output as its one line,
  without a traceback of ratune's code (how many copies appear: see the test);
- ``ratune sweep --rerun-changed`` deletes exactly the changed cells' ``train/``, ``eval/``,
  ``error.txt`` and ``cell.json``, and keeps ``train/`` when only ``eval:`` settings changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sweep_cells import finished_cell, rate_metrics
from test_replicates import three_seed_sweep
from test_sweep import BASE, FakeRunner, args, write_sweep
from test_train_correctness import _config

from ratune import sweep as sw
from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _git(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30)


# ------------------------------------------------------------------ a real data build, run and eval


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, apibench, smol_tokenizer, tiny_model_dir):
    """A data build of the real TorchHub files (mode none), a 1-step run of the tiny model on it and
    a 2-question 0_shot eval of the run's model: ``{"data", "run", "eval"}`` folders."""
    from ratune.data.build import BuildSettings, build_dataset
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.train.sft import train

    root = tmp_path_factory.mktemp("pipeline")
    data, run, ev = root / "data", root / "run", root / "eval"
    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=data, tokenizer=smol_tokenizer, tokenizer_name="t",
                  modes=["none"], progress=False, settings=BuildSettings(max_length=512))
    train(_config(tiny_model_dir, data, run, global_batch_size=2, per_device_batch_size=1, max_steps=1,
                  max_examples=4))
    evaluate_checkpoint(run / "model", hub="torchhub", apibench_dir=apibench, out_dir=ev,
                        settings=EvalSettings(settings=["0_shot"], n_questions=2, batch_size=2, max_new_tokens=4,
                                              torch_threads=1), progress=False)
    return {"data": data, "run": run, "eval": ev}


def test_every_manifest_records_the_git_commit(pipeline):
    """The data build's, the run's (and the copy in its model folder) and the eval run's
    manifest.json record ``git_commit``: ``git rev-parse HEAD`` of this repository, with
    ``-dirty`` exactly when ``git diff --quiet HEAD`` says tracked files differ from it."""
    head = _git("rev-parse", "HEAD")
    if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", head.stdout.strip()):
        pytest.skip(f"{ROOT} is not a git checkout: git_commit is None by design")
    dirty = _git("diff", "--quiet", "HEAD")
    assert dirty.returncode in (0, 1), dirty.stderr
    expected = head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
    manifests = {"data build": pipeline["data"] / "manifest.json", "train": pipeline["run"] / "manifest.json",
                 "train (model copy)": pipeline["run"] / "model" / "ratune_manifest.json",
                 "eval run": pipeline["eval"] / "manifest.json"}
    for stage, path in manifests.items():
        manifest = json.loads(path.read_text())
        assert manifest["command"] == stage.split(" (")[0], path
        assert manifest["git_commit"] == expected, (stage, path)


def test_recorded_input_sha256s_are_the_files_hashes(pipeline, apibench):
    """Every sha256 a manifest records, recomputed from the file it names: the data manifest's
    inputs (API database, train and eval files), the run manifest's data manifest, the eval
    cell's inputs (API database, eval file, the checkpoint's run manifest) and the eval
    manifest's per-cell metrics.json."""
    data = json.loads((pipeline["data"] / "manifest.json").read_text())
    files = {"torchhub_api.jsonl": apibench / "api" / "torchhub_api.jsonl",
             "torchhub_train.json": apibench / "apibench" / "torchhub_train.json",
             "torchhub_eval.json": apibench / "apibench" / "torchhub_eval.json"}
    assert set(data["inputs"]) == set(files)
    for name, path in files.items():
        assert data["inputs"][name] == _sha256(path), name
    assert len(set(data["inputs"].values())) == 3  # three different files, three different hashes

    run = json.loads((pipeline["run"] / "manifest.json").read_text())
    assert run["data_manifest_sha256"] == _sha256(pipeline["data"] / "manifest.json")

    cell = pipeline["eval"] / "0_shot"
    metrics = json.loads((cell / "metrics.json").read_text())
    named = {"torchhub_api.jsonl": files["torchhub_api.jsonl"], "torchhub_eval.json": files["torchhub_eval.json"],
             "checkpoint ratune_manifest.json": pipeline["run"] / "model" / "ratune_manifest.json"}
    assert set(metrics["inputs"]) == set(named)
    for name, path in named.items():
        assert metrics["inputs"][name] == _sha256(path), name

    manifest = json.loads((pipeline["eval"] / "manifest.json").read_text())
    assert manifest["inputs"] == metrics["inputs"]
    assert manifest["cells"] == {"0_shot": _sha256(cell / "metrics.json")}


# ------------------------------------------------------------------ sweep.json sources


def test_sweep_sources_hold_the_sha256_of_every_metrics_json_read(tmp_path, monkeypatch):
    """For a three-seed sweep (replicates) and a single-seed one with an experiment cell
    (``irrelevant``, reported beside Table 2): ``sources`` names exactly the metrics.json files
    the report read (spied on read_metrics, in ratune.eval.report and where the sweep report
    calls it) and finished
    (those with .complete; an unfinished cell's metrics.json is neither read nor listed), each
    with the sha256 of its bytes."""
    import ratune.eval.report as report
    import ratune.eval.results as results  # the one reader of finished eval folders

    metrics = lambda correct: rate_metrics(n=60, correct=correct, halluc=6)  # noqa: E731
    single = tmp_path / "single" / "sweep"
    finished_cell(single, "a", {"train_retriever": "none", "seed": 1}, {"0_shot": metrics(44), "oracle": metrics(50),
                                                                         "irrelevant": metrics(0)})
    finished_cell(single, "b", {"train_retriever": "oracle", "seed": 1}, {"0_shot": metrics(30)})
    sweeps = [three_seed_sweep(tmp_path / "three"), single]

    for sweep_dir in sweeps:
        read: list[Path] = []
        real = report.read_metrics

        def spy(path, real=real, read=read):
            read.append(Path(path))
            return real(path)

        monkeypatch.setattr(report, "read_metrics", spy)
        monkeypatch.setattr(results, "read_metrics", spy)
        sw.report_sweep(sweep_dir)
        monkeypatch.setattr(report, "read_metrics", real)
        monkeypatch.setattr(results, "read_metrics", real)
        sources = json.loads((sweep_dir / "report" / "sweep.json").read_text())["sources"]
        finished = {str(p.relative_to(sweep_dir)) for p in sweep_dir.glob("cells/*/eval/*/metrics.json")
                    if (p.parent / ".complete").exists()}
        unfinished = {str(p.relative_to(sweep_dir)) for p in sweep_dir.glob("cells/*/eval/*/metrics.json")} - finished
        assert read and set(sources) == {str(p.relative_to(sweep_dir)) for p in read} == finished
        assert not unfinished & set(sources)
        for rel, digest in sources.items():
            assert digest == _sha256(sweep_dir / rel), rel
    # three seeds of none (0_shot, oracle) and the two finished seeds of oracle (0_shot); not oracle-3
    three = json.loads((sweeps[0] / "report" / "sweep.json").read_text())["sources"]
    assert len(three) == 8 and "cells/oracle-3/eval/0_shot/metrics.json" not in three
    assert {"cells/none-3/eval/oracle/metrics.json", "cells/oracle-2/eval/0_shot/metrics.json"} <= set(three)
    single_sources = json.loads((single / "report" / "sweep.json").read_text())["sources"]
    assert "cells/a/eval/irrelevant/metrics.json" in single_sources and len(single_sources) == 4


# ------------------------------------------------------------------ atomic_write


def test_atomic_write_uses_unique_temporary_names(tmp_path):
    """Two atomic_write contexts open on one target at once: two new, distinct temporary files in
    the target's folder, none of them a fixed name; your files named like fixed temporaries
    (``TARGET.tmp``, ``.TARGET.tmp``) keep their bytes; afterwards no temporary is left and the
    target holds what the last context to close wrote. A failed write leaves the same listing."""
    from ratune.io import atomic_write

    target = tmp_path / "metrics.json"
    target.write_text("old\n")
    yours = {tmp_path / "metrics.json.tmp": b"your file\n", tmp_path / ".metrics.json.tmp": b"yours too\n",
             tmp_path / "metrics.json~": b"and a backup\n"}
    for path, data in yours.items():
        path.write_bytes(data)
    before = set(os.listdir(tmp_path))

    with atomic_write(target) as outer:
        outer.write("outer\n")
        with atomic_write(target) as inner:
            inner.write("inner\n")
            temporaries = set(os.listdir(tmp_path)) - before
            assert len(temporaries) == 2, temporaries  # two writers, two names
            assert set(os.listdir(tmp_path)) >= before  # nothing of yours replaced by a temporary
            assert target.read_text() == "old\n"
        assert target.read_text() == "inner\n"
        left = set(os.listdir(tmp_path)) - before
        assert len(left) == 1 and left < temporaries  # the inner one renamed onto the target, the outer's left
    assert target.read_text() == "outer\n"
    assert set(os.listdir(tmp_path)) == before
    for path, data in yours.items():
        assert path.read_bytes() == data, path

    with pytest.raises(RuntimeError, match="killed midway"):
        with atomic_write(target) as fh:
            fh.write("half")
            assert len(set(os.listdir(tmp_path)) - before) == 1
            raise RuntimeError("killed midway")
    assert set(os.listdir(tmp_path)) == before and target.read_text() == "outer\n"
    for path, data in yours.items():
        assert path.read_bytes() == data, path


# ------------------------------------------------------------------ accelerate launch, two processes


def test_two_process_accelerate_launch_shows_ratunes_line_not_its_traceback(tmp_path):
    """``accelerate launch --config_file configs/accelerate/cpu_2proc_deepspeed.yaml -m ratune.train``
    (torchrun, 2 processes) with a config holding a misspelt key: each process fails in
    ratune.train's own config validation (exit 2, the torchrun summary's root cause); the output
    holds ratune's one line naming the file and the key, and no traceback frame of ratune's code
    (only the launcher's frames, from the venv); no output folder is made.

    How many copies of the line appear is not fixed: torchrun sends SIGTERM to the other process as
    soon as the first one exits, so the second prints its line only when it reached the error
    within torchrun's monitor interval (observed: 1 line in 2 of 6 launches). Hence 1 or 2
    identical lines, never more and never another one."""
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({
        "model": "no-such-model", "data_dir": str(tmp_path / "no_data"), "train_retriever": "none",
        "output_dir": str(tmp_path / "run"), "global_batch_size": 2, "per_device_batch_size": 1,
        "learning_rte": 1e-3}))
    accelerate = Path(sys.executable).with_name("accelerate")
    accelerate = str(accelerate if accelerate.exists() else shutil.which("accelerate"))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run([accelerate, "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc_deepspeed.yaml"),
                           "-m", "ratune.train", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "ChildFailedError" in output and re.search(r"exitcode\s*:\s*2 ", output), output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("ratune: error:")]
    expected = f"ratune: error: {config}: unknown key 'learning_rte'; did you mean 'learning_rate'?"
    assert 1 <= len(lines) <= 2 and set(lines) == {expected}, output[-3000:]
    assert not [line for line in output.splitlines() if "ratune: error:" in line and not line.startswith("ratune:")]
    venv = Path(sys.executable).parent.parent.resolve()
    frames = [Path(f).resolve() for f in re.findall(r'^\s*File "([^"]+)"', output, flags=re.M)]
    assert frames  # torchrun's own ChildFailedError traceback (documented)
    ours = [f for f in frames if f.is_relative_to(ROOT) and not f.is_relative_to(venv)]
    assert ours == [], ours
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ sweep --rerun-changed


class _PartialEval(FakeRunner):
    """FakeRunner that writes each step's log, and whose eval step leaves a half-written
    eval/0_shot/responses.jsonl and fails (so the cell gets error.txt) when ``fail_eval``."""

    def __init__(self, fail_eval: bool = False):
        super().__init__()
        self.fail_eval = fail_eval

    def __call__(self, cmd, log_path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n")
        if self.fail_eval and cmd[:3] == ["ratune", "eval", "run"]:
            out = Path(cmd[cmd.index("--out") + 1]) / "0_shot"
            out.mkdir(parents=True, exist_ok=True)
            (out / "responses.jsonl").write_text('{"question_id": 1, "text": "x"}\n')
            raise RatuneError(f"`{' '.join(cmd)}` exited with status 1")
        return super().__call__(cmd, log_path)


def _listing(root: Path) -> dict[str, str | None]:
    """``{relative path: sha256 of the bytes, or None for a folder}`` of everything under root."""
    return {str(p.relative_to(root)): None if p.is_dir() else _sha256(p) for p in root.rglob("*")}


def _look_after_the_check(monkeypatch, sweep_dir: Path) -> dict:
    """The dict that, once the sweep has run, holds :func:`_listing` of ``sweep_dir`` right after
    the sweep's check of changed cells (what ``--rerun-changed`` deleted, before anything ran)."""
    after_check = {}
    real_check = sw.check_changed

    def check_then_look(*a, **kw):
        names = real_check(*a, **kw)
        after_check.update(_listing(sweep_dir))
        return names

    monkeypatch.setattr("ratune.sweep.local.check_changed", check_then_look)
    return after_check


def test_rerun_changed_deletes_exactly_the_changed_cells_results(tmp_path, capsys, monkeypatch):
    """Cell ``none`` ran (train done, eval failed halfway: error.txt, a partial eval/) before
    learning_rate changed; cell ``oracle`` finished with the new value. ``ratune sweep
    --rerun-changed``: right after its check, the sweep folder is the one before minus exactly
    none's train/, eval/, curve/ (with everything inside), error.txt and cell.json; none's logs/,
    train.yaml and your file stay byte-identical, and so does everything of oracle (your file
    included) and the shared data. Then only none runs again, and oracle is still untouched."""
    monkeypatch.setattr("ratune.sweep.local.run_command", _PartialEval(fail_eval=True))
    assert sw.cli_sweep(args(write_sweep(tmp_path, axes={"train_retriever": ["none"]}))) == 1
    new_base = {**BASE, "learning_rate": 1e-3}
    monkeypatch.setattr("ratune.sweep.local.run_command", _PartialEval())
    assert sw.cli_sweep(args(write_sweep(tmp_path, axes={"train_retriever": ["oracle"]}, base=new_base))) == 0
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "oracle"]}, base=new_base)
    cells = {c.axes["train_retriever"]: c for c in sw.expand(sw.load_sweep(path))}
    sweep_dir = tmp_path / "sweep"
    changed = f"cells/{cells['none'].name}"
    kept = f"cells/{cells['oracle'].name}"
    for cell in (changed, kept):
        (sweep_dir / cell / "my_notes.txt").write_text(f"notes on {cell}\n")
        # a learning-curve cell of an earlier checkpoint (eval run --all-checkpoints writes them there)
        (sweep_dir / cell / "curve" / "checkpoint-1" / "0_shot").mkdir(parents=True)
        (sweep_dir / cell / "curve" / "checkpoint-1" / "0_shot" / "metrics.json").write_text("{}\n")
    capsys.readouterr()

    before = _listing(sweep_dir)
    deleted = {k for k in before
               if k in (f"{changed}/error.txt", f"{changed}/cell.json")
               or any(k == f"{changed}/{d}" or k.startswith(f"{changed}/{d}/") for d in ("train", "eval", "curve"))}
    assert {f"{changed}/train/.complete", f"{changed}/eval/0_shot/responses.jsonl", f"{changed}/error.txt",
            f"{changed}/cell.json", f"{changed}/curve/checkpoint-1/0_shot/metrics.json"} <= deleted
    assert {f"{changed}/my_notes.txt", f"{changed}/train.yaml", f"{changed}/logs/train.log",
            f"{kept}/my_notes.txt", f"{kept}/eval/oracle/metrics.json", "data/torchhub/manifest.json"} <= set(before)

    after_check = _look_after_the_check(monkeypatch, sweep_dir)
    runner = _PartialEval()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path, rerun_changed=True)) == 0
    assert after_check == {k: v for k, v in before.items() if k not in deleted}
    out = capsys.readouterr().out
    assert f"[rerun] {cells['none'].name}: config changed (config.learning_rate); results deleted" in out
    assert out.count("[rerun]") == 1
    assert f"[skip] {cells['oracle'].name}: finished" in out
    assert not any(cells["oracle"].name in " ".join(c) for c in runner.calls)

    after = _listing(sweep_dir)
    assert {k: v for k, v in after.items() if k.startswith(f"{kept}/")} == \
        {k: v for k, v in before.items() if k.startswith(f"{kept}/")}
    assert after[f"{changed}/my_notes.txt"] == before[f"{changed}/my_notes.txt"]
    assert json.loads((sweep_dir / changed / "cell.json").read_text())["config"]["learning_rate"] == 1e-3
    assert sw.is_finished(sw.load_sweep(path), cells["none"]) and f"{changed}/error.txt" not in after


def test_rerun_changed_after_an_eval_change_deletes_the_evaluations_and_keeps_the_training(tmp_path, capsys,
                                                                                            monkeypatch):
    """A finished cell whose eval settings alone changed (n_questions 5 -> 4): ``--rerun-changed``
    deletes its eval/ (with everything inside) and cell.json, nothing else (train/ stays
    byte-identical, your file too, and bfcl/: no selection rule chose its checkpoint), and the
    rerun evaluates without training again."""
    sweep_yaml = dict(axes={"train_retriever": ["none"]})
    monkeypatch.setattr("ratune.sweep.local.run_command", _PartialEval())
    assert sw.cli_sweep(args(write_sweep(tmp_path, **sweep_yaml))) == 0
    path = write_sweep(tmp_path, **sweep_yaml, eval={"settings": ["0_shot", "oracle"], "n_questions": 4})
    cell = sw.expand(sw.load_sweep(path))[0]
    sweep_dir = tmp_path / "sweep"
    (cell.dir / "my_notes.txt").write_text("notes\n")
    # BFCL answers of the last checkpoint: without a selection rule they do not follow eval:, so they stay
    (cell.dir / "bfcl" / "multiple").mkdir(parents=True)
    (cell.dir / "bfcl" / "multiple" / "responses.jsonl").write_text('{"id": "multiple_0", "result": "[]"}\n')
    capsys.readouterr()
    before = _listing(sweep_dir)
    name = f"cells/{cell.name}"
    deleted = {k for k in before if k == f"{name}/cell.json" or k == f"{name}/eval" or k.startswith(f"{name}/eval/")}
    assert {f"{name}/eval/0_shot/metrics.json", f"{name}/cell.json"} <= deleted
    assert f"{name}/train/.complete" in before

    after_check = _look_after_the_check(monkeypatch, sweep_dir)
    runner = _PartialEval()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    with pytest.raises(RatuneError, match=r"a change of eval settings alone keeps the training"):
        sw.cli_sweep(args(path))
    assert sw.cli_sweep(args(path, rerun_changed=True)) == 0
    assert after_check == {k: v for k, v in before.items() if k not in deleted}
    assert (f"[rerun] {cell.name}: config changed (eval.n_questions); evaluations deleted, training kept"
            in capsys.readouterr().out)
    # the shared data build (reused: the same request), then the eval; no training
    assert [c[:3] for c in runner.calls] == [["ratune", "data", "build"], ["ratune", "eval", "run"]]
    after = _listing(sweep_dir)
    assert {k: v for k, v in after.items() if k.startswith(f"{name}/train/")} == \
        {k: v for k, v in before.items() if k.startswith(f"{name}/train/")}
    assert json.loads((cell.dir / "cell.json").read_text())["eval"]["n_questions"] == 4
    assert sw.is_finished(sw.load_sweep(path), cell)
