"""A Trainer checkpoint whose save was cut short (a kill, a full disk) is recognised by its missing
or torn trainer_state.json (the file the Trainer writes last) and never blocks a rerun: resuming
takes the newest complete checkpoint and says which partial one it passed over, a named partial
checkpoint is refused with what it lacks, learning curves skip it and eval refuses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from ratune.errors import RatuneError
from test_train_correctness import _config, _make_data, _weights

#: Kill the process (SIGKILL, as the OOM killer or a preempted node does) inside the save of
#: checkpoint-4: after its weights, before its optimizer, scheduler, RNG and trainer state.
_KILL_IN_SAVE = '''
import os, signal
import transformers.trainer as t
_orig = t.Trainer._save_optimizer_and_scheduler
def save(self, output_dir):
    if output_dir.endswith("checkpoint-4"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _orig(self, output_dir)
t.Trainer._save_optimizer_and_scheduler = save
'''

COMMON = dict(global_batch_size=2, per_device_batch_size=1, gradient_accumulation_steps=2, max_steps=6,
              max_examples=8, save_steps=2, lr_scheduler="linear", warmup_ratio=0.25)


@pytest.fixture(scope="module")
def killed_in_save(tmp_path_factory, tiny_model_dir):
    """``(straight run, killed run, config)``: an uninterrupted 6-step run, and the same run killed
    inside checkpoint-4's save (checkpoint-2 complete, checkpoint-4 partial)."""
    from ratune.train.sft import train

    tmp = tmp_path_factory.mktemp("partial")
    data = _make_data(tmp / "data")
    train(_config(tiny_model_dir, data, tmp / "straight", **COMMON))
    cfg = _config(tiny_model_dir, data, tmp / "killed", **COMMON)
    (tmp / "killed.yaml").write_text(yaml.safe_dump(cfg.model_dump()))
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(_KILL_IN_SAVE)
    env = {**os.environ, "PYTHONPATH": f"{tmp / 'hook'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(tmp / "killed.yaml")], env=env,
                          capture_output=True, cwd=tmp, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    return tmp / "straight", tmp / "killed", cfg


def test_the_kill_left_a_partial_checkpoint_beside_a_complete_one(killed_in_save):
    from ratune.train.layout import checkpoint_gap

    _, killed, _ = killed_in_save
    partial = killed / "trainer" / "checkpoint-4"
    assert (partial / "model.safetensors").is_file() and not (partial / "optimizer.pt").exists()
    assert checkpoint_gap(partial) == "no trainer_state.json: its save was cut short"
    assert checkpoint_gap(killed / "trainer" / "checkpoint-2") is None


def test_a_torn_trainer_state_is_partial_too(tmp_path):
    from ratune.train.layout import checkpoint_gap

    (tmp_path / "trainer_state.json").write_text('{"global_step": 4, "log_hist')
    assert checkpoint_gap(tmp_path) == "trainer_state.json is cut short: its save was interrupted"


def test_eval_refuses_a_partial_checkpoint_and_curves_pass_it_over(killed_in_save, capsys):
    from ratune.train.layout import resolve_checkpoint, trainer_checkpoints

    _, killed, _ = killed_in_save
    with pytest.raises(RatuneError, match=r"checkpoint-4: a partial Trainer checkpoint \(no trainer_state\.json"):
        resolve_checkpoint(killed / "trainer" / "checkpoint-4")  # ratune eval run --checkpoint, export
    capsys.readouterr()
    assert [c.step for c in trainer_checkpoints(killed)] == [2]
    assert "passing over the partial checkpoint" in capsys.readouterr().err


def test_a_named_partial_checkpoint_is_refused_with_what_it_lacks(killed_in_save):
    from ratune.train.resume import resolve_resume

    _, killed, _ = killed_in_save
    with pytest.raises(RatuneError, match=r"checkpoint-4: a partial Trainer checkpoint \(no trainer_state\.json: "
                                          r"its save was cut short\)"):
        resolve_resume(killed, str(killed / "trainer" / "checkpoint-4"))


def test_resume_passes_over_the_partial_checkpoint_to_the_same_weights(killed_in_save, tmp_path, capsys):
    """The rerun a sweep makes (--on-unfinished resume) resumes from checkpoint-2, says so, and ends
    bit-identical to the uninterrupted run (before: `trainer_state.json: No such file` on every rerun)."""
    import shutil

    import torch

    from ratune.train.sft import train

    straight, killed, cfg = killed_in_save
    run = tmp_path / "rerun"
    shutil.copytree(killed, run)  # the module's other tests read the killed run as it was left
    capsys.readouterr()
    train(cfg.model_copy(update={"output_dir": str(run)}), on_unfinished="resume")
    err = capsys.readouterr().err
    assert f"passing over the partial checkpoint {run / 'trainer' / 'checkpoint-4'} (no trainer_state.json" in err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["resumed_from"] == str(run / "trainer" / "checkpoint-2") and manifest["steps"] == 6
    a, b = _weights(straight / "model"), _weights(run / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_only_partial_checkpoints_restart_the_run(tmp_path, capsys):
    from ratune.manifest import claim_folder
    from ratune.train.resume import prepare_unfinished, resolve_resume

    run = tmp_path / "run"
    (run / "trainer" / "checkpoint-2").mkdir(parents=True)
    (run / "trainer" / "checkpoint-2" / "model.safetensors").write_bytes(b"x")
    claim_folder(run, "train")
    with pytest.raises(RatuneError, match=r"--resume-from latest, but there is no checkpoint to resume \(1 partial\)"):
        resolve_resume(run, "latest")
    assert prepare_unfinished(run, "resume") is None and not run.exists()
    assert "it saved no complete checkpoint to resume" in capsys.readouterr().err


def test_save_total_limit_keeps_a_complete_checkpoint_beside_a_partial_one(tmp_path, tiny_model_dir):
    """With save_total_limit 1, a partial checkpoint-3 left by a crash does not make the Trainer's
    rotation delete the last complete one: the resumed run saves checkpoint-3 over it before rotating."""
    import shutil

    from ratune.train.layout import checkpoint_folders, checkpoint_gap
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data", n=4)
    run = tmp_path / "run"
    cfg = _config(tiny_model_dir, data, run, global_batch_size=1, max_steps=2, save_steps=1, save_total_limit=1)
    train(cfg)
    (run / ".complete").unlink()  # as if the run had been cut short after checkpoint-2 and a partial checkpoint-3
    (run / "trainer" / "checkpoint-3").mkdir()
    (run / "trainer" / "checkpoint-3" / "model.safetensors").write_bytes(b"torn")
    shutil.rmtree(run / "model")
    train(cfg.model_copy(update={"max_steps": 4}), resume_from="latest")
    assert [p.name for p in checkpoint_folders(run)] == ["checkpoint-4"]
    assert checkpoint_gap(run / "trainer" / "checkpoint-4") is None

