"""The demo path with the real SmolLM2-135M-Instruct, shrunk to a few steps (make test-slow)."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.apibench_data]  # the demo reads the real APIBench


def test_demo_with_real_model_small_budget(tmp_path, capsys):
    from ratune.demo import run_demo

    cfg = {
        "name": "demo", "out_dir": str(tmp_path / "demo"),
        "base": {"model": "smollm2-135m-instruct", "hub": "torchhub", "max_length": 768, "torch_threads": 1,
                 "global_batch_size": 2, "per_device_batch_size": 1, "max_steps": 2, "max_examples": 4,
                 "learning_rate": 2e-4, "lr_scheduler": "constant", "warmup_ratio": 0.0,
                 "lora": {"enabled": True, "r": 8, "alpha": 16}},
        "data": {"max_document_tokens": 192},
        "eval": {"settings": ["0_shot", "oracle"], "n_questions": 4, "batch_size": 4, "max_new_tokens": 32,
                 "stop_after_api_call": True, "threads": 1},
        "axes": {"train_retriever": ["none", "oracle"]},
        "accelerate_config": "configs/accelerate/cpu_1proc.yaml",
    }
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_demo(str(path)) == 0
    table = json.loads((tmp_path / "demo" / "report" / "torchhub" / "table2.json").read_text())
    assert len(table["cells"]) == 4 and all(c["n"] == 4 for c in table["cells"])
    out = capsys.readouterr().out
    assert "Wall time per stage" in out and "| none |" in out
    for stage in ("convert model", "build data", "train none", "eval none", "train oracle", "eval oracle", "report"):
        assert f"  {stage} " in out, stage
    # a rerun finds every step complete and does no work
    assert run_demo(str(path)) == 0
    rerun = capsys.readouterr().out
    assert rerun.count(": finished") == 2 and "build data" not in rerun and "train none" not in rerun
