"""`ratune eval run` on a run's Trainer checkpoints: the points of a learning
curve. A checkpoint is evaluated with its run's prompt settings and records its step; the last
checkpoint of a run answers exactly as the run's final model/ does."""

from __future__ import annotations

import json
import shutil

import pytest

from ratune.errors import RatuneError
from test_train_correctness import _config, _make_data


def _eval(checkpoint, apibench, out, **kw):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    settings = EvalSettings(settings=("0_shot", "oracle"), n_questions=3, batch_size=3, max_new_tokens=6,
                            torch_threads=1, **kw)
    return evaluate_checkpoint(checkpoint, hub="torchhub", apibench_dir=apibench, out_dir=out, settings=settings,
                               progress=False)


def _cell(out, setting="oracle"):
    identity = json.loads((out / setting / "identity.json").read_text())
    metrics = json.loads((out / setting / "metrics.json").read_text())
    texts = [json.loads(line)["text"] for line in (out / setting / "responses.jsonl").read_text().splitlines()]
    models = {json.loads(line)["model"] for line in (out / setting / "responses.jsonl").read_text().splitlines()}
    return identity, metrics, texts, models


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_trainer_checkpoints_evaluate_with_their_step(tmp_path, tiny_model_dir, apibench, lora):
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data", n=4)
    run = tmp_path / "run"
    extra = {"lora": {"enabled": True, "r": 4, "alpha": 8}} if lora else {}
    train(_config(tiny_model_dir, data, run, global_batch_size=2, max_steps=2, save_steps=1,
                  chat_template="gorilla_v0", **extra))
    for step in (1, 2):
        _eval(run / "trainer" / f"checkpoint-{step}", apibench, tmp_path / f"eval_step{step}")
    _eval(run, apibench, tmp_path / "eval_final")

    first, last, final = (_cell(tmp_path / name) for name in ("eval_step1", "eval_step2", "eval_final"))
    assert first[0]["step"] == 1 and first[1]["train_step"] == 1
    assert last[0]["step"] == 2 and last[1]["train_step"] == 2
    assert "step" not in final[0] and "train_step" not in final[1]
    assert first[3] == {"run-step1"} and final[3] == {"run"}
    # the run's prompt settings, read from RUN/manifest.json, not from the checkpoint folder
    assert first[0]["generation"]["chat_template"] == final[0]["generation"]["chat_template"] == "gorilla_v0"
    if lora:  # the adapter is put on the run's base
        assert first[0]["adapter_base"] == str(tiny_model_dir.resolve()) and "adapter_base" not in final[0]
    # step 2 is the last optimizer step: the same weights as model/, so the same greedy answers
    assert last[2] == final[2]


def test_a_checkpoint_without_weights_is_refused(tmp_path, tiny_model_dir, apibench):
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data", n=4)
    run = tmp_path / "run"
    train(_config(tiny_model_dir, data, run, global_batch_size=2, max_steps=1, save_steps=1))
    ckpt = run / "trainer" / "checkpoint-1"
    for name in ("config.json", "model.safetensors"):
        (ckpt / name).unlink()
    with pytest.raises(RatuneError, match=r"checkpoint-1: this Trainer checkpoint holds no model weights"):
        _eval(ckpt, apibench, tmp_path / "eval")
    assert not (tmp_path / "eval").exists()
    # a folder named like a checkpoint outside a run is an ordinary model folder
    loose = tmp_path / "trainer" / "checkpoint-7"
    shutil.copytree(run / "model", loose)
    _eval(loose, apibench, tmp_path / "eval_loose")
    identity, metrics, _, models = _cell(tmp_path / "eval_loose")
    assert "step" not in identity and models == {"checkpoint-7"}
