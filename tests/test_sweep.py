"""Sweeps (ratune.sweep): expansion, dry run, slurm scripts, the local runner's skip / refuse /
failure / interrupt behaviour with a fake command runner, and the report of a sweep folder."""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import subprocess
from functools import partial
from pathlib import Path

import pytest
import yaml
from sweep_cells import rate_metrics

from ratune import sweep as sw
from ratune.errors import RatuneError

REPO = Path(__file__).resolve().parent.parent

BASE = {"model": "tiny-model", "hub": "torchhub", "train_retriever": "none", "global_batch_size": 4,
        "max_steps": 2, "lora": {"enabled": True, "r": 16}}


def write_sweep(tmp_path: Path, **over) -> Path:
    data = {"name": "t", "out_dir": str(tmp_path / "sweep"), "base": BASE,
            "data": {"max_length": 256}, "eval": {"settings": ["0_shot", "oracle"], "n_questions": 5},
            "axes": {"train_retriever": ["none", "oracle"]}, "accelerate_config": "configs/accelerate/cpu_2proc.yaml"}
    data.update(over)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def args(path, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sw.add_sweep_arguments(parser)
    argv = [str(path)]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return parser.parse_args(argv)


# ------------------------------------------------------------------ expansion


def test_expand_grid_times_groups(tmp_path):
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "oracle"], "lora.r": [8, 16]},
                       groups=[{"learning_rate": [1e-4, 2e-4], "max_steps": [10, 20]}])
    cells = sw.expand(sw.load_sweep(path))
    assert len(cells) == 2 * 2 * 2
    assert len({c.name for c in cells}) == 8
    for c in cells:
        assert c.config["lora"]["r"] == c.axes["lora.r"]
        assert {1e-4: 10, 2e-4: 20}[c.config["learning_rate"]] == c.config["max_steps"]  # paired, not crossed
        assert c.config["output_dir"] == str(c.dir / "train")
        assert c.config["data_dir"] == str(tmp_path / "sweep" / "data" / "torchhub")
        assert c.config["max_length"] == 256
        assert c.config["lora"]["enabled"] is True  # base keys next to a dotted axis key survive
    # names are stable across loads and independent of the base config (so edits are detected)
    again = sw.expand(sw.load_sweep(write_sweep(tmp_path, axes={"train_retriever": ["none", "oracle"],
                                                                "lora.r": [8, 16]},
                                                groups=[{"learning_rate": [1e-4, 2e-4], "max_steps": [10, 20]}],
                                                base={**BASE, "seed": 7})))
    assert [c.name for c in again] == [c.name for c in cells]
    assert cells[0].name.startswith("learning_rate-0.0001__lora-r-8__max_steps-10__train_retriever-none-")


def test_expand_errors(tmp_path):
    with pytest.raises(RatuneError, match="lora.rr"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, axes={"lora.rr": [8]})))
    with pytest.raises(RatuneError, match="same .*number"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, groups=[{"learning_rate": [1e-4, 2e-4], "max_steps": [1]}])))
    with pytest.raises(RatuneError, match="output_dir"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, axes={"output_dir": ["a"]})))
    with pytest.raises(RatuneError, match="more than one"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, groups=[{"train_retriever": ["none"]}])))
    with pytest.raises(RatuneError, match="learning_rate"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, axes={"learning_rate": ["fast"]})))
    with pytest.raises(RatuneError, match="did you mean 'axes'"):
        sw.load_sweep(write_sweep(tmp_path, axis={"x": [1]}))


def test_shipped_sweeps_load_and_expand(monkeypatch):
    monkeypatch.chdir(REPO)
    torch_cells = sw.expand(sw.load_sweep("configs/sweeps/table2_torchhub.yaml"))
    assert sorted(c.config["train_retriever"] for c in torch_cells) == ["none", "oracle"]
    s = sw.load_sweep("configs/sweeps/table2_torchhub.yaml")
    assert s.config.eval.settings == ["0_shot", "bm25", "dense", "gpt_index", "oracle"]
    paper = sw.load_sweep("configs/sweeps/table2_paper.yaml")
    cells = sw.expand(paper)
    assert len(cells) == 6
    assert {c.hub for c in cells} == {"torchhub", "huggingface", "tensorflowhub"}
    assert all(c.config["learning_rate"] == 2e-5 and c.config["max_length"] == 2048 for c in cells)
    assert set(sw.data_plan(paper, cells)) == {"torchhub", "huggingface", "tensorflowhub"}
    robust = sw.load_sweep("configs/sweeps/robust_rat_torchhub.yaml")
    assert [c.config["train_retriever"] for c in sw.expand(robust)] == ["mix-uniform", "mix-retrieved", "none",
                                                                        "oracle"]
    assert robust.config.eval.settings == ["0_shot", "bm25", "dense", "gpt_index", "oracle", "swap", "irrelevant",
                                           "constraints_oracle"]
    assert len(sw.expand(sw.load_sweep("configs/sweeps/abstain_torchhub.yaml"))) == 1


# ------------------------------------------------------------------ dry run and slurm


def test_dry_run_prints_commands_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ratune.sweep.local.run_command", lambda *a: pytest.fail("dry run ran a command"))
    assert sw.cli_sweep(args(write_sweep(tmp_path), dry_run=True)) == 0
    out = capsys.readouterr().out
    cells = sw.expand(sw.load_sweep(tmp_path / "sweep.yaml"))
    for c in cells:
        assert (f"accelerate launch -q --config_file configs/accelerate/cpu_2proc.yaml -m ratune.train "
                f"--config {c.dir / 'train.yaml'}") in out
        assert (f"ratune eval run --checkpoint {c.dir / 'train'} --hub torchhub --out {c.dir / 'eval'} "
                "--settings 0_shot oracle") in out
        assert f"cell {c.name} [new]" in out
    assert "ratune data build --hub torchhub" in out and "--modes none oracle" in out
    assert not (tmp_path / "sweep").exists()


def test_slurm_scripts(tmp_path, capsys):
    path = write_sweep(tmp_path, slurm={"nodes": 2, "gpus_per_node": 4, "time": "12:00:00", "partition": "gpu",
                                        "setup": ["source .venv/bin/activate"]})
    assert sw.cli_sweep(args(path, launcher="slurm")) == 0
    cells = sw.expand(sw.load_sweep(path))
    submit = (tmp_path / "sweep" / "slurm" / "submit.sh").read_text()
    for c in cells:
        train = (c.dir / "slurm" / "train.sbatch").read_text()
        for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --time=12:00:00",
                     "#SBATCH --partition=gpu", "#SBATCH --ntasks-per-node=1", "source .venv/bin/activate"):
            assert line in train
        assert 'MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in train
        launch = next(line for line in train.splitlines() if line.startswith("srun "))
        for part in ("accelerate launch -q --config_file configs/accelerate/cpu_2proc.yaml",
                     "--num_machines $SLURM_NNODES", "--machine_rank $SLURM_NODEID", "--main_process_ip $MAIN_IP", "--num_processes 8",
                     f"-m ratune.train --config {c.dir / 'train.yaml'}"):
            assert part in launch
        assert launch.startswith("srun --ntasks-per-node=1 bash -c '")  # node rank expands on each node
        # an unfinished run is resumed or restarted by ratune.train under its lock: the script deletes nothing
        assert launch.rstrip().endswith(" --on-unfinished resume'") and "rm " not in train and "RESUME" not in train
        assert yaml.safe_load((c.dir / "train.yaml").read_text()) == c.config
        ev = (c.dir / "slurm" / "eval.sbatch").read_text()
        assert "#SBATCH --nodes=1" in ev and "#SBATCH --gpus-per-node=1" in ev and "ratune eval run" in ev
        assert f"jid=$(sbatch --parsable --dependency=afterok:$data_torchhub_jid {c.dir / 'slurm' / 'train.sbatch'})" \
            in submit
        assert f"sbatch --parsable --dependency=afterok:$jid {c.dir / 'slurm' / 'eval.sbatch'}" in submit
    assert submit.count("--dependency=afterok:$jid") == 2
    assert "data_torchhub_jid=$(sbatch --parsable" in submit
    for script in [tmp_path / "sweep" / "slurm" / "submit.sh", *(tmp_path / "sweep").rglob("*.sbatch")]:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script


# ------------------------------------------------------------------ local runner (fake commands)


metrics = partial(rate_metrics, n=10, correct=5, halluc=3)


def finish_eval(eval_dir: Path, setting: str, m: dict) -> None:
    d = eval_dir / setting
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.json").write_text(json.dumps(m))
    (d / ".complete").write_text("complete\n")


class FakeRunner:
    """Does what the real commands leave behind (folders and .complete markers)."""

    def __init__(self, fail_on=(), interrupt_on=()):
        self.calls: list[list[str]] = []
        self.fail_on, self.interrupt_on = fail_on, interrupt_on

    def __call__(self, cmd, log_path):
        self.calls.append(cmd)
        text = " ".join(cmd)
        if any(s in text for s in self.interrupt_on):
            raise KeyboardInterrupt
        if any(s in text for s in self.fail_on):
            raise RatuneError(f"`{text}` exited with status 1")
        if cmd[:3] == ["ratune", "data", "build"]:
            out = Path(cmd[cmd.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            i = cmd.index("--modes") + 1
            modes = []
            while i < len(cmd) and not cmd[i].startswith("--"):
                modes.append(cmd[i])
                i += 1
            (out / "manifest.json").write_text(json.dumps({"modes": modes}))
            (out / ".complete").write_text("complete\n")
        elif cmd[0] == "accelerate":
            run = Path(cmd[cmd.index("--config") + 1]).parent / "train"
            run.mkdir(parents=True, exist_ok=True)
            (run / ".complete").write_text("complete\n")
        elif cmd[:3] == ["ratune", "eval", "run"]:
            out = Path(cmd[cmd.index("--out") + 1])
            for s in ("0_shot", "oracle"):
                finish_eval(out, s, metrics())


def test_local_run_skip_fail_refuse_rerun(tmp_path, capsys, monkeypatch):
    path = write_sweep(tmp_path)
    runner = FakeRunner(fail_on=("train_retriever-oracle",))
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 1  # one cell failed, the other finished
    out = capsys.readouterr().out
    cells = {c.axes["train_retriever"]: c for c in sw.expand(sw.load_sweep(path))}
    assert "FAILED " + cells["oracle"].name in out and "1/2 cells finished, 1 failed" in out
    assert "exited with status 1" in (cells["oracle"].dir / "error.txt").read_text()
    assert sw.is_finished(sw.load_sweep(path), cells["none"])
    assert not (cells["none"].dir / "error.txt").exists()
    assert sum(c[:3] == ["ratune", "data", "build"] for c in runner.calls) == 1  # data shared once

    # rerun: the finished cell is skipped, the failed one retried; data is not rebuilt
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    out = capsys.readouterr().out
    assert f"[skip] {cells['none'].name}: finished" in out
    # progress per cell (which of how many), where its log is, and when each step is done
    oracle = cells["oracle"]
    order = [c.name for c in sw.expand(sw.load_sweep(path))]
    progress = f"({order.index(oracle.name) + 1}/2)"
    assert f"[train] {oracle.name} {progress}: accelerate launch" in out
    assert f"  log: {oracle.dir / 'logs' / 'train.log'} (follow it with: tail -f " in out
    assert re.search(rf"\[eval\] {re.escape(oracle.name)} {re.escape(progress)}: done in \d+ s", out)
    assert all(cells["none"].name not in " ".join(c) for c in runner.calls)
    # the data build runs again for the unfinished cell, and reuses a folder built with the same request
    # itself (data/build.py; tests/test_data_reuse.py)
    [build] = [c for c in runner.calls if c[:3] == ["ratune", "data", "build"]]
    assert "--reuse-if-same" in build and "--overwrite" not in build
    assert not (cells["oracle"].dir / "error.txt").exists()

    # a third run does nothing
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0 and runner.calls == []

    # the resolved config changed: refused before anything runs, unless --rerun-changed
    write_sweep(tmp_path, base={**BASE, "learning_rate": 1e-3})
    with pytest.raises(RatuneError, match="config.learning_rate"):
        sw.cli_sweep(args(path))
    assert runner.calls == []
    assert sw.cli_sweep(args(path, rerun_changed=True)) == 0
    assert sum(c[0] == "accelerate" for c in runner.calls) == 2
    stored = json.loads((cells["none"].dir / "cell.json").read_text())
    assert stored["config"]["learning_rate"] == 1e-3



@pytest.mark.parametrize("written", ["train.yaml", "error.txt"])
def test_a_full_disk_while_a_cell_file_is_rewritten_leaves_the_previous_file_whole(tmp_path, monkeypatch, written):
    """A cell's train.yaml and error.txt are written beside and renamed (ratune/io.py atomic_write): the
    disk filling up during a rerun's write leaves the previous file byte-identical."""
    import errno
    import tempfile

    path = write_sweep(tmp_path)
    monkeypatch.setattr("ratune.sweep.local.run_command", FakeRunner(fail_on=("train_retriever-oracle",)))
    assert sw.cli_sweep(args(path)) == 1  # oracle failed: its train.yaml and error.txt exist
    oracle = next(c for c in sw.expand(sw.load_sweep(path)) if c.axes["train_retriever"] == "oracle")
    before = (oracle.dir / written).read_bytes()
    real = tempfile.mkstemp

    def mkstemp(*a, prefix=None, **kw):
        if prefix == f".{written}.":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, prefix=prefix, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr("ratune.sweep.local.run_command", FakeRunner(fail_on=("train_retriever-oracle",)))
    with pytest.raises(OSError, match="No space left"):
        sw.cli_sweep(args(path))
    assert (oracle.dir / written).read_bytes() == before and before
    assert not list(oracle.dir.glob(f".{written}.*"))

def test_interrupt_then_resume(tmp_path, capsys, monkeypatch):
    path = write_sweep(tmp_path)
    cells = {c.axes["train_retriever"]: c for c in sw.expand(sw.load_sweep(path))}
    monkeypatch.setattr("ratune.sweep.local.run_command",
                        FakeRunner(interrupt_on=(f"{cells['oracle'].name}/train.yaml",)))
    with pytest.raises(KeyboardInterrupt):
        sw.cli_sweep(args(path))
    assert f"interrupted during {cells['oracle'].name}" in capsys.readouterr().out
    # the unfinished cell's training is run again with the sweep's on_unfinished (ratune.train resumes
    # from its checkpoint: tests/test_train_correctness.py); the finished cell is not
    (cells["oracle"].dir / "train" / "trainer" / "checkpoint-1").mkdir(parents=True)
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    train_cmds = [c for c in runner.calls if c[0] == "accelerate"]
    assert len(train_cmds) == 1 and train_cmds[0][-2:] == ["--on-unfinished", "resume"]
    assert train_cmds[0][train_cmds[0].index("--config") + 1] == str(cells["oracle"].dir / "train.yaml")
    assert (cells["oracle"].dir / "train" / "trainer" / "checkpoint-1").is_dir()  # the launcher deleted nothing


def test_a_hangup_that_took_the_terminal_with_it_still_stops_the_sweep_by_the_signal(tmp_path, monkeypatch):
    """The terminal closed (SIGHUP): writing the `[stop]` line fails with EIO, and that OSError must
    not replace the Terminated that gives the exit status 129 (before, it did: a traceback, exit 1)."""
    import errno
    import io
    import signal

    from ratune.errors import Terminated

    class Terminal(io.StringIO):
        gone = False

        def write(self, text):
            if self.gone:
                raise OSError(errno.EIO, "Input/output error")
            return super().write(text)

    terminal = Terminal()

    class HangUp(FakeRunner):
        def __call__(self, cmd, log_path):
            if cmd[0] == "accelerate":
                terminal.gone = True
                raise Terminated(signal.SIGHUP)
            return super().__call__(cmd, log_path)

    path = write_sweep(tmp_path)
    monkeypatch.setattr("ratune.sweep.local.run_command", HangUp())
    monkeypatch.setattr("sys.stdout", terminal)
    with pytest.raises(Terminated) as stopped:
        sw.cli_sweep(args(path))
    assert stopped.value.signum == signal.SIGHUP
    assert "[train]" in terminal.getvalue() and "[stop]" not in terminal.getvalue()


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_second_sweep_into_a_running_sweeps_folder_is_refused(tmp_path, monkeypatch, launcher):
    """A sweep holds its folder's lock while it runs (or writes its Slurm scripts): a second one
    into the same folder is refused before it writes anything, naming the holder's pid; the lock
    is gone after a run, so the next one runs."""
    import os

    from ratune.locks import LockHeld, lock_path, output_lock

    path = write_sweep(tmp_path)
    out = tmp_path / "sweep"
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    with output_lock(out, command="ratune sweep (the first)"):  # what a running sweep holds
        with pytest.raises(LockHeld) as err:
            sw.cli_sweep(args(path, launcher=launcher))
    assert f"{out} is being written by pid {os.getpid()}" in str(err.value)
    assert "(ratune sweep (the first))" in str(err.value)
    assert runner.calls == [] and not out.exists()  # refused before anything ran or was written
    assert sw.cli_sweep(args(path, launcher=launcher)) == 0
    assert not lock_path(out).exists()  # released after the run
    assert (out / "slurm" / "submit.sh").is_file() if launcher == "slurm" else len(runner.calls) == 5


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_the_sweep_files_on_unfinished_reaches_every_training_command(tmp_path, monkeypatch, launcher):
    path = write_sweep(tmp_path, on_unfinished="restart")
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path, launcher=launcher)) == 0
    cells = sw.expand(sw.load_sweep(path))
    if launcher == "local":
        commands = [c for c in runner.calls if c[0] == "accelerate"]
    else:
        commands = [next(line for line in (c.dir / "slurm" / "train.sbatch").read_text().splitlines()
                         if line.startswith("srun ")).rstrip("'").split() for c in cells]
    assert len(commands) == 2 and all(c[-2:] == ["--on-unfinished", "restart"] for c in commands)


# ------------------------------------------------------------------ report


def test_report_sweep(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"

    def make(name, axes, retriever, finished):
        d = sweep_dir / "cells" / name
        d.mkdir(parents=True)
        (d / "cell.json").write_text(json.dumps({"name": name, "axes": axes, "config": {
            "hub": "torchhub", "model": "/models/tiny", "train_retriever": retriever}}))
        for s in finished:
            finish_eval(d / "eval", s, metrics(correct=7 if retriever == "oracle" else 4))
        return d

    make("a", {"train_retriever": "none", "lora.r": 8}, "none", ["0_shot", "oracle"])
    b = make("b", {"train_retriever": "oracle", "lora.r": 8}, "oracle", ["0_shot"])
    (b / "eval" / "oracle").mkdir(parents=True)  # started, not finished: missing, never zero
    (b / "eval" / "oracle" / "metrics.json").write_text(json.dumps(metrics(correct=0)))
    make("c", {"train_retriever": "none", "lora.r": 16}, "none", [])  # not evaluated at all

    assert sw.cli_report_sweep(str(sweep_dir)) == 0
    out = capsys.readouterr().out
    tables = json.loads((sweep_dir / "report" / "sweep.json").read_text())["tables"]
    assert list(tables) == ["torchhub__lora-r-8"]
    cells = {(c["train_retriever"], c["test_retriever"]): c for c in tables["torchhub__lora-r-8"]["cells"]}
    assert set(cells) == {("none", "0_shot"), ("none", "oracle"), ("oracle", "0_shot")}
    assert cells[("oracle", "0_shot")]["accuracy"] == 0.7 and cells[("oracle", "0_shot")]["correct_n"] == 7
    assert cells[("none", "0_shot")]["strict"]["correct_n"] == 3
    md = (sweep_dir / "report" / "torchhub__lora-r-8" / "table2.md").read_text()
    oracle_row = next(line for line in md.splitlines() if line.startswith("| oracle |"))
    assert oracle_row.rstrip().endswith("| - |")  # the unfinished cell shows as missing
    assert "| oracle |" in out
    rows = list(csv.DictReader((sweep_dir / "report" / "sweep.csv").open()))
    assert len(rows) == 3
    header = (sweep_dir / "report" / "sweep.csv").read_text().splitlines()[0].split(",")
    assert header.count("train_retriever") == 1  # an axis that is also a fixed column appears once
    assert {"cell", "train_retriever", "lora.r", "test_retriever", "accuracy", "strict_accuracy"} <= set(rows[0])
    assert {r["lora.r"] for r in rows} == {"8"}
    assert (sweep_dir / "report" / "torchhub__lora-r-8" / "table2.png").exists()
    best = json.loads((sweep_dir / "report" / "sweep.json").read_text())["best"]["torchhub__lora-r-8"]
    assert (best["cell"], best["test_retriever"], best["accuracy"]) == ("b", "0_shot", 0.7)
    assert best["export"] == f"ratune export {b / 'train'} --out exports/b --eval {b / 'eval'}"
    assert "best in torchhub__lora-r-8: b (train oracle, test 0_shot, accuracy 70.0 %, n = 10)" in out


def test_report_without_finished_cells(tmp_path):
    (tmp_path / "cells").mkdir()
    with pytest.raises(RatuneError, match="no finished eval cells"):
        sw.report_sweep(tmp_path)


def test_run_command_logs_and_raises(tmp_path):
    log = tmp_path / "logs" / "x.log"
    cmd = [sys.executable, "-c", "print('hello')"]
    sw.run_command(cmd, log)
    assert log.read_text() == f"$ {sw._fmt(cmd)}\nhello\n"
    with pytest.raises(RatuneError, match="exited with status 3"):
        sw.run_command([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], log)



def test_failed_step_names_ratunes_error_not_the_launchers_traceback(tmp_path):
    """A failing step whose launcher prints 30 lines of traceback after ratune's error: the
    sweep's message carries ratune's line (once, as two processes print it) and not the
    traceback; an earlier run's error in the same log is not repeated."""
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text("$ earlier\nratune: error: an earlier run's error\n")
    script = ("import sys\n"
              "print('ratune: error: runs/x/train.yaml: line 3: learning_rate: expected a positive number')\n"
              "print('ratune: error: runs/x/train.yaml: line 3: learning_rate: expected a positive number')\n"
              "for i in range(30): print(f'  File \"launch.py\", line {i}, in simple_launcher')\n"
              "print('subprocess.CalledProcessError: Command returned non-zero exit status 2.')\n"
              "sys.exit(1)\n")
    (tmp_path / "launch.py").write_text(script)
    with pytest.raises(RatuneError) as info:
        sw.run_command([sys.executable, str(tmp_path / "launch.py")], log)
    message = str(info.value)
    assert message.endswith("exited with status 1; log " + str(log) + ":\n"
                            "ratune: error: runs/x/train.yaml: line 3: learning_rate: expected a positive number\n")
    assert "CalledProcessError" not in message and "earlier" not in message

def test_settings_added_later_at_their_default_are_not_changes(tmp_path):
    """A cell.json written before a setting existed: the setting at its default is no change;
    any other value is."""
    path = write_sweep(tmp_path)
    sweep = sw.load_sweep(path)
    cell = sw.expand(sweep)[0]
    cell.dir.mkdir(parents=True)
    record = sw.cell_record(sweep, cell)
    del record["config"]["seed"]          # TrainConfig default 42
    del record["data"]["top_k"]           # SweepData default 1
    del record["eval"]["batch_size"]      # SweepEval default 8
    (cell.dir / "cell.json").write_text(json.dumps(record))
    assert sw.changed_keys(sweep, cell) == []
    write_sweep(tmp_path, base={**BASE, "seed": 7}, data={"max_length": 256, "top_k": 2})
    sweep = sw.load_sweep(path)
    assert sw.changed_keys(sweep, sw.expand(sweep)[0]) == ["config.seed", "data.top_k"]


def test_mixture_modes_in_the_shared_data_build(tmp_path):
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "mix-rat"]},
                       data={"max_length": 256, "mixtures": ["rat:none=0.5,distractors=0.5", "unused:oracle=1"],
                             "mixture_seed": 4, "distractors": 2})
    sweep = sw.load_sweep(path)
    cells = sw.expand(sweep)
    (entry,) = sw.data_plan(sweep, cells).values()
    cmd = sw.data_command(sweep, "torchhub", entry)
    assert cmd[cmd.index("--modes") + 1] == "none" and cmd[cmd.index("--modes") + 2] == "--max-length"
    assert cmd[cmd.index("--mixture") + 1] == "rat:none=0.5,distractors=0.5" and cmd.count("--mixture") == 1
    assert cmd[-6:] == ["--mixture-seed", "4", "--distractors", "2", "--top1-retriever", "bm25"]

    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "mix-other"]},
                       data={"max_length": 256, "mixtures": ["rat:none=1"]})
    sweep = sw.load_sweep(path)
    with pytest.raises(RatuneError, match="train_retriever mix-other names a mixture that data.mixtures does not "
                                          "define \\(defined: mix-rat\\)"):
        sw.data_plan(sweep, sw.expand(sweep))
    path = write_sweep(tmp_path, data={"max_length": 256, "mixtures": ["rat:none=0.5"]})
    sweep = sw.load_sweep(path)
    with pytest.raises(RatuneError, match="data.mixtures: mixture rat: probabilities sum to 0.5"):
        sw.data_command(sweep, "torchhub", sw.data_plan(sweep, sw.expand(sweep))["torchhub"])


def test_eval_command_passes_backend_and_trust_remote_code(tmp_path):
    path = write_sweep(tmp_path, base={**BASE, "trust_remote_code": True},
                       eval={"settings": ["oracle", "swap"], "backend": "vllm"})
    sweep = sw.load_sweep(path)
    cell = sw.expand(sweep)[0]
    cmd = sw.eval_command(sweep, cell)
    assert cmd[cmd.index("--settings") + 1:cmd.index("--settings") + 3] == ["oracle", "swap"]
    # responses name the cell's model by the cell, not by its run folder (always "train")
    assert cmd[cmd.index("--model-name") + 1] == cell.name and cell.name.startswith("train_retriever-none-")
    assert cmd[cmd.index("--backend") + 1] == "vllm" and "--trust-remote-code" in cmd
    plain = sw.load_sweep(write_sweep(tmp_path))
    cmd = sw.eval_command(plain, sw.expand(plain)[0])
    assert "--backend" not in cmd and "--trust-remote-code" not in cmd


def test_finetuned_retriever_rows_and_columns_reach_the_commands(tmp_path):
    """A Table 2 grid with train-time bm25 / dense_ft rows and a dense_ft test column."""
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "bm25", "dense_ft"]},
                       data={"max_length": 256, "top_k": 3, "dense_model": "runs/retrievers/ft",
                             "bm25_backend": "bm25s"},
                       eval={"settings": ["bm25", "dense_ft"], "dense_model": "runs/retrievers/ft",
                             "bm25_backend": "bm25s"})
    sweep = sw.load_sweep(path)
    cells = sw.expand(sweep)
    assert [c.config["train_retriever"] for c in cells] == ["none", "bm25", "dense_ft"]
    (entry,) = sw.data_plan(sweep, cells).values()
    cmd = sw.data_command(sweep, "torchhub", entry)
    assert cmd[cmd.index("--modes") + 1:cmd.index("--modes") + 4] == ["none", "bm25", "dense_ft"]
    assert cmd[cmd.index("--dense-model") + 1] == "runs/retrievers/ft"
    assert cmd[cmd.index("--bm25-backend") + 1] == "bm25s" and cmd[cmd.index("--top-k") + 1] == "3"
    cmd = sw.eval_command(sweep, cells[0])
    assert cmd[cmd.index("--settings") + 1:cmd.index("--settings") + 3] == ["bm25", "dense_ft"]
    assert cmd[cmd.index("--dense-model") + 1] == "runs/retrievers/ft"
    assert cmd[cmd.index("--bm25-backend") + 1] == "bm25s"
    plain = sw.load_sweep(write_sweep(tmp_path))
    assert "--dense-model" not in sw.eval_command(plain, sw.expand(plain)[0])
    with pytest.raises(RatuneError, match="dense_fine"):
        sw.load_sweep(write_sweep(tmp_path, eval={"settings": ["dense_fine"]}))


def test_only_the_commands_whose_settings_retrieve_with_it_get_the_finetuned_retriever(tmp_path):
    """A curve of 0_shot and oracle never reads eval.dense_model, so its command does not name it
    (``--dense-model`` checks that its folder exists); the test settings with dense_ft do."""
    base = {**BASE, "save_strategy": "epoch"}
    path = write_sweep(tmp_path, base=base, eval={"settings": ["0_shot", "dense_ft"], "curve_settings": ["0_shot", "oracle"],
                                                  "dense_model": "runs/retrievers/ft"})
    sweep = sw.load_sweep(path)
    cell = sw.expand(sweep)[0]
    curve = sw.eval_command(sweep, cell, curve=True)
    assert curve[curve.index("--settings") + 1:curve.index("--settings") + 3] == ["0_shot", "oracle"]
    assert "--dense-model" not in curve
    test = sw.eval_command(sweep, cell)
    assert test[test.index("--dense-model") + 1] == "runs/retrievers/ft"
    path = write_sweep(tmp_path, base=base, eval={"settings": ["0_shot"], "curve_settings": ["0_shot", "dense_ft"],
                                                  "dense_model": "runs/retrievers/ft"})
    sweep = sw.load_sweep(path)
    cell = sw.expand(sweep)[0]
    curve = sw.eval_command(sweep, cell, curve=True)
    assert curve[curve.index("--dense-model") + 1] == "runs/retrievers/ft"
    assert "--dense-model" not in sw.eval_command(sweep, cell)


def test_a_missing_finetuned_retriever_is_refused_before_any_cell_trains(tmp_path, monkeypatch):
    """A dense_ft test setting whose eval.dense_model is not a retriever folder for the hub stops the
    sweep before the data build (it used to fail once training was over); a dry run still plans it,
    a finished cell is not refused, and with the folder the cells run."""
    from ratune.retrieval.retrievers import RETRIEVER_METADATA_FILE

    folder = tmp_path / "ft"
    path = write_sweep(tmp_path, eval={"settings": ["0_shot", "dense_ft"], "n_questions": 5,
                                       "dense_model": str(folder)})

    class Runner(FakeRunner):  # finishes the dense_ft cell too
        def __call__(self, cmd, log_path):
            super().__call__(cmd, log_path)
            if cmd[:3] == ["ratune", "eval", "run"]:
                finish_eval(Path(cmd[cmd.index("--out") + 1]), "dense_ft", metrics())

    runner = Runner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    with pytest.raises(RatuneError, match=r"sweep.yaml: cell train_retriever-none-\w+: eval.settings dense_ft needs "
                                          r"the finetuned retriever folder \(--dense-model DIR, written by `ratune "
                                          r"retrieval train`\); got '.*ft'"):
        sw.cli_sweep(args(path))
    assert runner.calls == []
    assert sw.cli_sweep(args(path, dry_run=True)) == 0
    folder.mkdir()
    (folder / RETRIEVER_METADATA_FILE).write_text(json.dumps({"hub": "bigcode"}))
    with pytest.raises(RatuneError, match=r"this retriever was finetuned for hub 'bigcode', not 'torchhub'"):
        sw.cli_sweep(args(path))
    assert runner.calls == []
    (folder / RETRIEVER_METADATA_FILE).write_text(json.dumps({"hub": "torchhub"}))
    assert sw.cli_sweep(args(path)) == 0
    evals = [c for c in runner.calls if c[:3] == ["ratune", "eval", "run"]]
    assert len(evals) == 2 and all(c[c.index("--dense-model") + 1] == str(folder) for c in evals)
    (folder / RETRIEVER_METADATA_FILE).unlink()  # gone after the cells finished: nothing left needs it
    assert sw.cli_sweep(args(path)) == 0


# ------------------------------------------------------------------ --only


def only_args(path, *only, dry_run=False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sw.add_sweep_arguments(parser)
    flags = [a for o in only for a in ("--only", o)] + (["--dry-run"] if dry_run else [])
    return parser.parse_args([str(path), *flags])


def test_only_runs_the_chosen_arm_and_leaves_the_rest(tmp_path, capsys, monkeypatch):
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "oracle"], "lora.r": [8, 16]})
    cells = sw.expand(sw.load_sweep(path))
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(only_args(path, "train_retriever=oracle", "lora.r=16")) == 0
    out = capsys.readouterr().out
    [chosen] = [c for c in cells if c.axes == {"train_retriever": "oracle", "lora.r": 16}]
    assert "1/1 cells finished, 0 failed" in out
    trained = [Path(c[c.index("--config") + 1]).parent.name for c in runner.calls if c[0] == "accelerate"]
    assert trained == [chosen.name]
    assert sorted(p.name for p in (tmp_path / "sweep" / "cells").iterdir()) == [chosen.name]
    # the shared data build is the whole sweep's, so the other cells later find every mode they need
    build = next(c for c in runner.calls if c[:3] == ["ratune", "data", "build"])
    assert build[build.index("--modes") + 1:build.index("--max-length")] == ["none", "oracle"]
    # values of one key are alternatives; the full sweep later runs only what is left
    sw.cli_sweep(only_args(path, "lora.r=16", dry_run=True))
    out = capsys.readouterr().out
    assert out.count("\ncell ") == 2 and f"cell {chosen.name} [finished]" in out
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(only_args(path)) == 0
    assert sum(c[0] == "accelerate" for c in runner.calls) == 3
    assert sum(c[:3] == ["ratune", "data", "build"] for c in runner.calls) == 1  # the build decides to reuse
    assert chosen.name not in " ".join(" ".join(c) for c in runner.calls)


def test_only_selects_by_text_or_value_and_names_what_it_cannot_match(tmp_path):
    path = write_sweep(tmp_path, axes={"train_retriever": ["none", "oracle"], "lora.r": [8, 16]})
    sweep = sw.load_sweep(path)
    cells = sw.expand(sweep)
    picked = sw.select_cells(cells, ["lora.r=8", "train_retriever=none", "train_retriever=oracle"], str(path))
    assert sorted((c.axes["train_retriever"], c.axes["lora.r"]) for c in picked) == [("none", 8), ("oracle", 8)]
    assert sw.select_cells(cells, [], str(path)) == cells
    with pytest.raises(RatuneError, match=r"--only learning_rate: not an axis or group key of this sweep "
                                          r"\(its keys: lora\.r, train_retriever\)"):
        sw.select_cells(cells, ["learning_rate=1e-4"], str(path))
    with pytest.raises(RatuneError,
                       match=r"--only train_retriever=bm25: no cell has it \(train_retriever takes none, oracle\)"):
        sw.select_cells(cells, ["train_retriever=bm25"], str(path))
    with pytest.raises(RatuneError, match=r"--only 'oracle': expected KEY=VALUE"):
        sw.select_cells(cells, ["oracle"], str(path))


def test_only_lists_a_list_valued_axis_as_json_and_selects_by_that_text(tmp_path):
    path = write_sweep(tmp_path, axes={"lora.target_modules": [["q_proj", "v_proj"], "all-linear"]})
    cells = sw.expand(sw.load_sweep(path))
    with pytest.raises(RatuneError) as err:
        sw.select_cells(cells, ["lora.target_modules=k_proj"], str(path))
    listed = str(err.value).split("(lora.target_modules takes ")[1].rstrip(")")
    assert listed == '["q_proj", "v_proj"], all-linear'
    # the value as the error lists it selects that cell (the text a cell name is slugged from)
    [picked] = sw.select_cells(cells, ['lora.target_modules=["q_proj", "v_proj"]'], str(path))
    assert picked.axes == {"lora.target_modules": ["q_proj", "v_proj"]}
    assert picked.name.startswith("lora-target_modules-q-proj-v-proj-")


def test_only_lists_a_dict_valued_axis_with_sorted_keys_as_in_its_cell_name(tmp_path):
    path = write_sweep(tmp_path, axes={"lora": [{"r": 8, "alpha": 16, "enabled": True},
                                                {"r": 16, "alpha": 32, "enabled": True}]})
    cells = sw.expand(sw.load_sweep(path))
    # keys sorted, as the cell names are slugged (written r, alpha, enabled in the sweep file)
    assert sorted(c.name.rsplit("-", 1)[0] for c in cells) == ["lora-alpha-16-enabled-true-r-8",
                                                               "lora-alpha-32-enabled-true-r-16"]
    with pytest.raises(RatuneError) as err:
        sw.select_cells(cells, ["lora=x"], str(path))
    listed = str(err.value).split("(lora takes ")[1].rstrip(")")
    assert sorted(listed.split(", {")) == ['"alpha": 32, "enabled": true, "r": 16}',
                                           '{"alpha": 16, "enabled": true, "r": 8}']
    [picked] = sw.select_cells(cells, ['lora={"alpha": 32, "enabled": true, "r": 16}'], str(path))
    assert picked.axes["lora"]["r"] == 16


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_an_interrupted_sweep_signals_its_whole_command_and_waits_for_it(tmp_path, sig):
    """`kill SWEEP_PID` (SIGTERM to the sweep alone), Ctrl-C, or the terminal closing (SIGHUP; the
    command is in its own process group, so only the sweep gets it): the running command, launched as
    the sweep launches training (`accelerate launch`, whose single-process launcher dies on SIGTERM
    without passing it on), gets the signal in every process and is waited for, so the training
    itself can unwind (and remove its lock file) before the sweep stops."""
    import os
    import signal
    import threading

    from ratune.boundary import terminate_like_ctrl_c
    from ratune.errors import Terminated

    marker, started, script = tmp_path / "unwound", tmp_path / "started", tmp_path / "child.py"
    script.write_text("import pathlib, signal, sys, time\n"
                      f"def stop(signum, frame):\n    time.sleep(1)\n    pathlib.Path({str(marker)!r}).write_text("
                      "signal.Signals(signum).name)\n    sys.exit(1)\n"
                      "signal.signal(signal.SIGTERM, stop)\nsignal.signal(signal.SIGINT, stop)\n"
                      "signal.signal(signal.SIGHUP, stop)\n"
                      f"pathlib.Path({str(started)!r}).write_text('')\n"
                      "time.sleep(120)\n")

    over = threading.Event()  # set when the test ends: a late signal would stop pytest or a later test

    def signal_when_started():
        while not started.exists():
            if over.wait(0.05):
                return
        os.kill(os.getpid(), getattr(signal, sig))

    threading.Thread(target=signal_when_started, daemon=True).start()
    # the signal's handler as in a terminal: `nohup make test` ignores SIGHUP, and a shell without job
    # control starts a background `make test` with SIGINT ignored (Python then installs no Ctrl-C handler)
    signum = getattr(signal, sig)
    before = signal.signal(signum, signal.default_int_handler if sig == "SIGINT" else signal.SIG_DFL)
    try:
        with pytest.raises(KeyboardInterrupt if sig == "SIGINT" else Terminated), terminate_like_ctrl_c():
            sw.run_command(["accelerate", "launch", "-q", "--config_file",
                            str(REPO / "configs" / "accelerate" / "cpu_1proc.yaml"), str(script)], tmp_path / "cmd.log")
    finally:
        over.set()
        signal.signal(signum, before)
    assert marker.read_text() == sig  # the training process itself got the signal and had its second to unwind


def test_set_overrides_keys_of_the_file_and_of_its_base_for_one_run(tmp_path, monkeypatch):
    """`ratune sweep FILE --set KEY=VALUE`: a sweep key, a nested one, a YAML list, a key of the
    inline base config, and one of a base config file; the saved sweep.yaml and the cells hold the
    values set; a later run without them finds the cells changed."""
    path = write_sweep(tmp_path)
    sets = ["accelerate_config=configs/accelerate/1gpu.yaml", "eval.settings=[0_shot]", "eval.n_questions=null",
            "base.learning_rate=3.0e-4", "base.lora.r=8"]
    sweep = sw.load_sweep(path, overrides=sets)
    assert sweep.config.accelerate_config == "configs/accelerate/1gpu.yaml"
    assert sweep.config.eval.settings == ["0_shot"] and sweep.config.eval.n_questions is None
    assert sweep.base["learning_rate"] == 3.0e-4 and sweep.base["lora"] == {"enabled": True, "r": 8}
    assert BASE["lora"] == {"enabled": True, "r": 16}  # the file's data is not changed in place
    runner = FakeRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path, set="base.learning_rate=3.0e-4")) == 0  # not ratune's default (2e-5)
    saved = yaml.safe_load((tmp_path / "sweep" / "sweep.yaml").read_text())
    assert saved["base"]["learning_rate"] == 3.0e-4 and saved["source"] == str(path)
    assert all(json.loads((c.dir / "cell.json").read_text())["config"]["learning_rate"] == 3.0e-4
               for c in sw.expand(sw.load_sweep(path)))
    with pytest.raises(RatuneError, match="config.learning_rate"):  # without --set: the cells changed
        sw.cli_sweep(args(path))

    # an axis over a nested key keeps its dots, as --only names it
    assert sw.load_sweep(path, overrides=["axes.lora.r=[8, 16]"]).config.axes["lora.r"] == [8, 16]

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))  # a base given by file name
    by_file = write_sweep(tmp_path, base="base.yaml")
    assert sw.load_sweep(by_file, overrides=["base.max_steps=7"]).base["max_steps"] == 7


@pytest.mark.parametrize("text, message", [
    ("eval.nope=1", "(with --set eval.nope=1): unknown key 'eval.nope'"),
    ("name.x=1", "--set name.x=1: name in "),
    ("base..r=1", "'base..r=1': KEY 'base..r' has an empty part"),
    ("accelerate_config", "'accelerate_config': expected KEY=VALUE, e.g. accelerate_config="),
])
def test_a_bad_set_is_refused_naming_it(tmp_path, text, message):
    with pytest.raises(RatuneError) as err:
        sw.load_sweep(write_sweep(tmp_path), overrides=[text])
    assert message in str(err.value)


def test_a_set_into_a_base_file_names_that_file(tmp_path):
    """`base.KEY` sets act on the base config; given by file, the error names that file (before, it
    named "SWEEP base", a section the sweep file does not have)."""
    inline = write_sweep(tmp_path)
    with pytest.raises(RatuneError) as err:
        sw.load_sweep(inline, overrides=["base.lora.r.x=1"])
    assert str(err.value) == f"--set base.lora.r.x=1: lora.r in {inline} base is int, not a section"
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(RatuneError) as err:
        sw.load_sweep(write_sweep(tmp_path, base="base.yaml"), overrides=["base.lora.r.x=1"])
    assert str(err.value) == f"--set base.lora.r.x=1: lora.r in {tmp_path / 'base.yaml'} is int, not a section"


# ------------------------------------------------------------------ BFCL cells


class BfclRunner(FakeRunner):
    """FakeRunner that also completes the BFCL categories ``ratune eval bfcl`` is asked for."""

    def __call__(self, cmd, log_path):
        super().__call__(cmd, log_path)
        if cmd[:3] == ["ratune", "eval", "bfcl"]:
            out = Path(cmd[cmd.index("--out") + 1])
            i = cmd.index("--categories") + 1
            while i < len(cmd) and not cmd[i].startswith("--"):
                (out / cmd[i]).mkdir(parents=True, exist_ok=True)
                (out / cmd[i] / ".complete").write_text("complete\n")
                i += 1


def test_a_bfcl_section_scores_every_cell_on_bfcl(tmp_path, capsys, monkeypatch):
    path = write_sweep(tmp_path, bfcl={"categories": ["simple_python", "irrelevance"], "limit": 3,
                                       "max_new_tokens": 64})
    sweep = sw.load_sweep(path)
    cells = sw.expand(sweep)
    expected = {c.name: ["ratune", "eval", "bfcl", "--checkpoint", str(c.dir / "train"), "--out", str(c.dir / "bfcl"),
                         "--batch-size", "8", "--max-new-tokens", "64", "--categories", "simple_python", "irrelevance",
                         "--limit", "3"]
                for c in cells}
    monkeypatch.setattr("ratune.sweep.local.run_command", lambda *a: pytest.fail("dry run ran a command"))
    assert sw.cli_sweep(args(path, dry_run=True)) == 0
    out = capsys.readouterr().out
    assert all(f"  bfcl:  {' '.join(cmd)}" in out for cmd in expected.values())
    runner = BfclRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    assert sorted(c for c in runner.calls if c[:3] == ["ratune", "eval", "bfcl"]) == sorted(expected.values())
    assert all(sw.is_finished(sweep, c) for c in cells)
    # a category missing: the cell is not finished, and only its BFCL step runs again
    (cells[0].dir / "bfcl" / "irrelevance" / ".complete").unlink()
    assert not sw.is_finished(sweep, cells[0])
    runner = BfclRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    assert [c[:3] for c in runner.calls if c[0] != "ratune" or c[1] != "data"] == [["ratune", "eval", "run"],
                                                                                 ["ratune", "eval", "bfcl"]]
    assert sw.cli_sweep(args(path, launcher="slurm")) == 0
    assert " ".join(expected[cells[0].name]) in (cells[0].dir / "slurm" / "eval.sbatch").read_text()
    with pytest.raises(RatuneError, match="bfcl.categories"):
        sw.load_sweep(write_sweep(tmp_path, bfcl={"categories": ["java"]}))


@pytest.mark.bfcl
def test_the_sweep_report_puts_the_cells_bfcl_scores_side_by_side(tmp_path, capsys, monkeypatch):
    """The BFCL step of each cell scores hand-written answers (``--responses``): the cell trained without
    documents gets the answer keys (2 of 2 right), the other ``[]`` (0 of 2)."""
    from ratune.cli import main
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text

    entries = load_bfcl(bfcl_data_dir(), "simple_python")[:2]
    given = {}
    for which in ("none", "oracle"):
        folder = tmp_path / f"given_{which}" / "simple_python"
        folder.mkdir(parents=True)
        folder.joinpath("responses.jsonl").write_text("".join(
            json.dumps({"id": e.id, "text": possible_answer_text(e.possible_answer, e.functions) if which == "none"
                        else "[]"}) + "\n" for e in entries))
        given[which] = folder.parent

    class Runner(FakeRunner):
        def __call__(self, cmd, log_path):
            if cmd[:3] == ["ratune", "eval", "bfcl"]:
                out = cmd[cmd.index("--out") + 1]
                which = "none" if "train_retriever-none" in out else "oracle"
                assert main(["eval", "bfcl", "--responses", str(given[which]), "--out", out]) == 0
                return
            super().__call__(cmd, log_path)

    monkeypatch.setattr("ratune.sweep.local.run_command", Runner())
    path = write_sweep(tmp_path, bfcl={"categories": ["simple_python"], "limit": 2})
    assert sw.cli_sweep(args(path)) == 0
    sw.report_sweep(tmp_path / "sweep")
    names = {c.axes["train_retriever"]: c.name for c in sw.expand(sw.load_sweep(path))}
    report = json.loads((tmp_path / "sweep" / "report" / "bfcl" / "bfcl.json").read_text())
    assert {(r["model"], r["correct"], r["n"]) for r in report["rows"]} == {(names["none"], 2, 2),
                                                                            (names["oracle"], 0, 2)}
    (comparison,) = report["comparisons"]
    assert comparison["contingency"]["only_a"] + comparison["contingency"]["only_b"] == 2
    summary = json.loads((tmp_path / "sweep" / "report" / "sweep.json").read_text())
    assert summary["bfcl"] == {"cells": sorted(names.values()), "report": "bfcl/bfcl.md"}
