"""``ratune train --on-unfinished resume|restart`` (train/resume.py ``prepare_unfinished``): what a
sweep passes for every cell it trains, so that an unfinished run is resumed or restarted by the
training itself, under its run folder's lock, and never deleted by a launcher script."""

from __future__ import annotations

import re

import pytest

from ratune.errors import RatuneError
from ratune.manifest import COMPLETE_MARKER, claim_folder
from ratune.train.resume import prepare_unfinished


def _run(tmp_path, *, checkpoint: bool, complete: bool = False, ratune: bool = True):
    out = tmp_path / "run"
    (out / "trainer").mkdir(parents=True)
    if ratune:
        claim_folder(out, "train")
    if checkpoint:
        (out / "trainer" / "checkpoint-3").mkdir()
        (out / "trainer" / "checkpoint-3" / "model.safetensors").write_bytes(b"x")
        (out / "trainer" / "checkpoint-3" / "trainer_state.json").write_text('{"global_step": 3}')  # written last
    (out / "log.txt").write_text("step 1\n")
    if complete:
        (out / COMPLETE_MARKER).write_text("complete\n")
    return out


@pytest.mark.parametrize("policy", ["resume", "restart"])
def test_a_new_or_empty_folder_is_a_fresh_run(tmp_path, policy):
    assert prepare_unfinished(tmp_path / "absent", policy) is None
    (tmp_path / "empty").mkdir()
    assert prepare_unfinished(tmp_path / "empty", policy) is None and (tmp_path / "empty").is_dir()


def test_resume_takes_the_latest_checkpoint_and_deletes_nothing(tmp_path):
    out = _run(tmp_path, checkpoint=True)
    assert prepare_unfinished(out, "resume") == "latest"
    assert (out / "trainer" / "checkpoint-3" / "model.safetensors").read_bytes() == b"x"
    assert (out / "log.txt").read_text() == "step 1\n"


@pytest.mark.parametrize("policy, checkpoint", [("resume", False), ("restart", False), ("restart", True)])
def test_an_unfinished_run_without_a_checkpoint_or_under_restart_starts_over(tmp_path, policy, checkpoint):
    out = _run(tmp_path, checkpoint=checkpoint)
    assert prepare_unfinished(out, policy) is None
    assert not out.exists()  # train() then makes it afresh


@pytest.mark.parametrize("policy", ["resume", "restart"])
@pytest.mark.parametrize("complete, ratune, refusal", [
    (True, True, r"a finished training run \(\.complete\); --on-unfinished {policy} acts on unfinished runs only"),
    (False, False, r"not a ratune train output \(it has no \.ratune-output marker\); ratune does not resume or restart folders"),
])
def test_a_finished_run_or_a_folder_ratune_did_not_make_is_refused_and_kept(tmp_path, policy, complete, ratune,
                                                                            refusal):
    out = _run(tmp_path, checkpoint=True, complete=complete, ratune=ratune)
    with pytest.raises(RatuneError, match=rf"^{re.escape(str(out))}: " + refusal.format(policy=policy)):
        prepare_unfinished(out, policy)
    assert (out / "log.txt").read_text() == "step 1\n" and (out / "trainer" / "checkpoint-3").is_dir()


@pytest.mark.parametrize("policy", ["resume", "restart"])
@pytest.mark.parametrize("checkpoint", [True, False])
def test_every_rank_reaches_the_main_process_answer_and_only_it_deletes(tmp_path, monkeypatch, policy, checkpoint):
    """Every rank calls it; the others answer from the checkpoints alone (before or after the main
    process deleted the run: the same answer) and never delete."""
    out = _run(tmp_path, checkpoint=checkpoint)
    monkeypatch.setenv("RANK", "1")
    before = prepare_unfinished(out, policy)  # rank 1 before the main process acts
    assert (out / "log.txt").exists()  # rank 1 deleted nothing
    monkeypatch.setenv("RANK", "0")
    main_answer = prepare_unfinished(out, policy)
    monkeypatch.setenv("RANK", "1")
    after = prepare_unfinished(out, policy)  # rank 1 after it
    assert before == main_answer == after == ("latest" if policy == "resume" and checkpoint else None)


def test_the_run_is_deleted_only_under_its_lock(tmp_path):
    """While another process holds the run folder's lock (a training of it is running), train()
    with --on-unfinished restart is refused before anything is deleted."""
    from ratune.locks import LockHeld, output_lock
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    out = _run(tmp_path, checkpoint=False)
    config = TrainConfig(model="m", data_dir=str(tmp_path / "data"), train_retriever="none", output_dir=str(out))
    with output_lock(out, command="the running training"):
        with pytest.raises(LockHeld, match="the running training"):
            train(config, on_unfinished="restart")
    assert (out / "log.txt").read_text() == "step 1\n"


def test_a_restart_says_what_it_deletes(tmp_path, capsys):
    out = _run(tmp_path, checkpoint=True)
    assert prepare_unfinished(out, "restart") is None
    assert capsys.readouterr().err == (f"ratune: note: {out}: starting the unfinished run over (--on-unfinished "
                                       "restart); its files are deleted\n")


def test_resume_from_and_on_unfinished_exclude_each_other(tmp_path, capsys):
    from ratune.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("model: x\n")
    assert main(["train", "--config", str(config), "--resume-from", "latest", "--on-unfinished", "resume"]) == 2
    assert capsys.readouterr().err == ("ratune: error: train: argument --on-unfinished: not allowed with argument "
                                       "--resume-from (see ratune train --help)\n")
    assert main(["train", "--config", str(config), "--on-unfinished", "later"]) == 2
    err = capsys.readouterr().err
    assert "argument --on-unfinished: invalid choice: 'later'" in err and "resume" in err and "restart" in err


@pytest.mark.parametrize("sig, status", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_unwinds_like_ctrl_c_and_removes_the_lock_file(tmp_path, tiny_model_dir, sig, status):
    """A Slurm time limit sends SIGTERM, a closed terminal SIGHUP: `python -m ratune.train` exits
    128 + the signal with one line, and its lock file is gone (a requeued job on another host could
    not take over a lock file that names this host), so the rerun the line asks for can start anywhere."""
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from datasets import Dataset, DatasetDict

    from ratune.locks import lock_path
    from ratune.manifest import mark_complete

    data = tmp_path / "data"
    DatasetDict({"train": Dataset.from_dict({"user_turn": [f"Question {i}?" for i in range(8)],
                                             "completion": [f"answer {i}" for i in range(8)],
                                             "line": list(range(1, 9))})}).save_to_disk(str(data / "none"))
    mark_complete(data)
    out = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none",
                                      "output_dir": str(out), "max_length": 256, "global_batch_size": 1,
                                      "max_steps": 100000, "torch_threads": 1, "save_strategy": "no"}))
    lock = lock_path(out)
    proc = subprocess.Popen([sys.executable, "-m", "ratune.train", "--config", str(config), "--on-unfinished", "resume"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: under `nohup make test` SIGHUP is ignored, and ratune
                            # leaves a signal that something set alone (ratune/boundary.py terminate_like_ctrl_c)
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out / ".ratune-output").exists():  # made after the lock was taken: training has begun
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the training never made its run folder"
            time.sleep(0.05)
        assert lock.exists()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, err
    assert err.rstrip().endswith(f"ratune: terminated ({sig}); rerun the same command to continue where it stopped")
    assert not lock.exists() and not (out / ".complete").exists()


def test_a_second_signal_while_unwinding_does_not_cut_the_unwinding_short(tmp_path):
    """Slurm sends SIGTERM to every process of a step and torch's launcher passes its own on to its
    workers, so a training often gets SIGTERM twice within microseconds. Only the first raises; the
    second (and a SIGHUP) while the `finally` blocks run is ignored, so they finish (before, the
    second ended the process at once: exit -15 and the lock file left). SIGKILL stays the hard stop."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "twice.py"
    script.write_text("import os, signal, sys, time\n"
                      "from ratune.boundary import run_guarded\n"
                      "def body():\n"
                      "    try:\n"
                      "        os.kill(os.getpid(), signal.SIGTERM)\n"
                      "        time.sleep(30)\n"
                      "    finally:\n"
                      "        os.kill(os.getpid(), signal.SIGTERM)\n"
                      "        os.kill(os.getpid(), signal.SIGHUP)\n"
                      "        time.sleep(0.2)\n"
                      "        print('unwound', flush=True)\n"
                      "sys.exit(run_guarded(body))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)])
    assert (proc.returncode, proc.stdout) == (128 + signal.SIGTERM, "unwound\n"), proc.stderr
    assert proc.stderr.rstrip().endswith("ratune: terminated (SIGTERM); rerun the same command to continue where it stopped")


def test_a_signal_a_library_swallowed_still_ends_the_run_as_terminated(tmp_path):
    """multiprocess's __init__ wraps an import in a bare `except:`; a SIGHUP that lands inside it is
    swallowed and the fallback fails with ModuleNotFoundError. The run still exits 128 + signal with
    the terminated line, not a traceback and status 1."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "swallowed.py"
    script.write_text("import os, signal, sys, time\n"
                      "from ratune.boundary import run_guarded\n"
                      "def body():\n"
                      "    try:\n"
                      "        os.kill(os.getpid(), signal.SIGHUP)\n"
                      "        time.sleep(30)\n"
                      "    except:\n"
                      "        from version import __version__\n"
                      "sys.exit(run_guarded(body))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)])
    assert proc.returncode == 128 + signal.SIGHUP, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == ("ratune: terminated (SIGHUP); rerun the same command to "
                                                     "continue where it stopped")


@pytest.mark.parametrize("raised, status", [("SIGHUP", 129), ("SIGINT", 130)])
def test_the_last_line_cannot_replace_the_exit_status_when_the_terminal_is_gone(monkeypatch, raised, status):
    """After SIGHUP writing to the closed terminal fails with EIO; the exit status stays 128 + signal."""
    import errno
    import signal

    from ratune.boundary import run_guarded
    from ratune.errors import Terminated

    class Gone:
        def write(self, text):
            raise OSError(errno.EIO, "Input/output error")

        def flush(self):
            raise OSError(errno.EIO, "Input/output error")

    def body():
        raise Terminated(signal.SIGHUP) if raised == "SIGHUP" else KeyboardInterrupt

    monkeypatch.setattr("sys.stderr", Gone())
    assert run_guarded(body) == status


def test_resuming_after_the_data_build_changed_is_refused(tmp_path):
    """The run's manifest.json (written when it began) records one sha256 of the Arrow files it
    trains on; a rebuild with other rows since then is refused (the remaining steps would train on
    other rows), a rebuild to the same rows is not."""
    import hashlib
    import json

    from ratune.train.resume import check_same_data, train_rows_sha256

    data, run = tmp_path / "data", tmp_path / "run"
    (data / "none" / "train").mkdir(parents=True)
    run.mkdir()
    arrow = data / "none" / "train" / "data-00000-of-00001.arrow"
    arrow.write_bytes(b"rows as built first")
    began = hashlib.sha256(("data-00000-of-00001.arrow " + hashlib.sha256(b"rows as built first").hexdigest()
                            + "\n").encode()).hexdigest()
    assert train_rows_sha256(data, "none") == began
    (run / "manifest.json").write_text(json.dumps({"train_rows_sha256": began}))
    check_same_data(run, data, "none")  # the same rows: resumed
    (data / "manifest.json").write_text("{}")  # rebuilt, same rows (e.g. a request recorded with more fields)
    check_same_data(run, data, "none")
    arrow.write_bytes(b"rows built again with another setting")
    now = train_rows_sha256(data, "none")
    with pytest.raises(RatuneError) as err:
        check_same_data(run, data, "none")
    assert str(err.value).startswith(f"{data / 'none' / 'train'}: the training rows changed since the run in {run} "
                                     f"began (sha256 {now[:12]}; {run / 'manifest.json'} records "
                                     f"train_rows_sha256 {began[:12]})")
    assert f"delete {run} and rerun the sweep" in str(err.value)
    (run / "manifest.json").write_text(json.dumps({"data_manifest_sha256": "0" * 64}))  # a run from before
    check_same_data(run, data, "none")


def test_resume_latest_takes_the_highest_step_and_ignores_other_names(tmp_path):
    """checkpoint-105 after checkpoint-21 (numeric, not text order); a stray checkpoint-old is no
    checkpoint (before, its name failed int() with a traceback)."""
    from ratune.train.layout import checkpoint_folders
    from ratune.train.resume import resolve_resume

    run = tmp_path / "run"
    for name in ("checkpoint-21", "checkpoint-105", "checkpoint-old", "checkpoint-7"):
        (run / "trainer" / name).mkdir(parents=True)
        (run / "trainer" / name / "trainer_state.json").write_text("{}")  # complete saves
    (run / "trainer" / "checkpoint-9").write_text("a file, not a checkpoint")
    assert [p.name for p in checkpoint_folders(run)] == ["checkpoint-7", "checkpoint-21", "checkpoint-105"]
    assert resolve_resume(run, "latest") == str(run / "trainer" / "checkpoint-105")
    assert checkpoint_folders(tmp_path / "none") == []
    with pytest.raises(RatuneError, match="--resume-from latest, but there is no checkpoint to resume"):
        resolve_resume(tmp_path / "empty", "latest")
