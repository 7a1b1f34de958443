"""`ratune plan`, the scale-out configs and the QLoRA error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ratune.config import load_config, validate
from ratune.errors import RatuneError
from ratune.train.config import TrainConfig
from ratune.train.plan import GIB, _format, add_plan_arguments, cli_plan, model_size, plan

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "configs" / "train" / "llama7b_rat_paper.yaml"
P7B, EMBED7B = 6_738_415_616, 32000 * 4096  # LLaMA-7B parameters; its largest tensor (embedding / lm_head)


def _paper(tmp_path, **changes) -> TrainConfig:
    data = dict(load_config(TrainConfig, PAPER).model_dump(), data_dir=str(tmp_path / "no_data"))
    data.update(changes)
    return TrainConfig(**data)


def test_7b_zero3_8gpu_model_states_match_deepspeed_estimator_and_published_figure(tmp_path):
    result = plan(_paper(tmp_path), 8)
    assert result["params"] == P7B and result["largest_layer_params"] == EMBED7B
    assert result["zero_stage"] == 3 and not result["offload_optimizer"]
    # DeepSpeed estimate_zero3_model_states_mem_needs, no offload: 4 x largest layer + 18 x P / GPUs
    by_hand = (4 * EMBED7B + 18 * P7B / 8) / GIB
    assert result["model_states_gib"] == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(14.608, abs=1e-3)
    assert result["model_states_gib"] == pytest.approx(14.6, rel=0.15)  # the published ~14.6 GiB
    g = result["per_gpu_gib"]
    assert g["weights"] == pytest.approx((4 * EMBED7B + 2 * P7B / 8) / GIB)
    assert g["gradients"] == pytest.approx(4 * P7B / 8 / GIB)
    assert g["optimizer"] == pytest.approx(12 * P7B / 8 / GIB)  # fp32 master + two Adam moments
    # activations with checkpointing (Korthikanti et al. 2022): L x 2sbh + 34sbh, plus fp32 logits + grad 8sbV
    s, b, h, L, V = 2048, 4, 4096, 32, 32000
    assert g["activations"] == pytest.approx((L * 2 * s * b * h + 34 * s * b * h + 8 * s * b * V) / GIB)
    assert g["total"] == pytest.approx(g["weights"] + g["gradients"] + g["optimizer"] + g["activations"])
    # ideal time: 6 P tokens / (8 GPUs x 312 TFLOP/s x 0.4); no built data here, so tokens/example = max_length
    assert result["tokens_source"] == "max_length"
    tokens = 837 * 5 * 2048
    assert result["ideal_hours"] == pytest.approx(6 * P7B * tokens / (8 * 312e12 * 0.4) / 3600)


def test_model_states_equal_deepspeed_s_own_estimators(tmp_path):
    """ratune/plan keeps DeepSpeed's formulas as its own arithmetic (DeepSpeed is an optional extra,
    and ``ratune plan`` runs without it); here they are checked against DeepSpeed's functions, which
    return (cpu bytes, gpu bytes) per GPU."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cases = [  # (config changes, GPUs, DeepSpeed's GPU bytes)
        ({}, 8, estimate_zero3_model_states_mem_needs(P7B, EMBED7B, 8, 1, cpu_offload=False,
                                                      cpu_offload_params=False)[1]),
        ({}, 2, estimate_zero3_model_states_mem_needs(P7B, EMBED7B, 2, 1, cpu_offload=False,
                                                      cpu_offload_params=False)[1]),
        ({"deepspeed": str(ROOT / "configs/deepspeed/zero3_offload.json")}, 8,
         estimate_zero3_model_states_mem_needs(P7B, EMBED7B, 8, 1, cpu_offload=True, cpu_offload_params=False)[1]),
        ({"deepspeed": str(ROOT / "configs/deepspeed/zero2.json")}, 8,
         estimate_zero2_model_states_mem_needs(P7B, 8, 1, cpu_offload=False)[1]),
    ]
    for changes, gpus, deepspeed_bytes in cases:
        # DeepSpeed rounds its per-GPU share down to whole bytes
        assert plan(_paper(tmp_path, **changes), gpus)["model_states_gib"] * GIB == pytest.approx(deepspeed_bytes,
                                                                                                   abs=1.0)


def test_zero2_ddp_offload_and_lora_accounting(tmp_path):
    zero2 = plan(_paper(tmp_path, deepspeed=str(ROOT / "configs/deepspeed/zero2.json")), 8)
    assert zero2["model_states_gib"] == pytest.approx((2 * P7B + 18 * P7B / 8) / GIB)  # DeepSpeed's ZeRO-2 estimate
    offload = plan(_paper(tmp_path, deepspeed=str(ROOT / "configs/deepspeed/zero3_offload.json")), 8)
    assert offload["offload_optimizer"]
    assert offload["model_states_gib"] == pytest.approx((4 * EMBED7B + 2 * P7B / 8) / GIB)
    # a full finetune without DeepSpeed keeps fp32 weights (bf16 weights alone are refused: TrainConfig)
    ddp = plan(_paper(tmp_path, deepspeed=None, dtype="float32", per_device_batch_size=1,
                      gradient_accumulation_steps=8), 8)
    assert ddp["zero_stage"] == 0 and ddp["model_states_gib"] == pytest.approx(16 * P7B / GIB)  # fp32 w, g, 2 moments
    lora = plan(load_config(TrainConfig, ROOT / "configs/train/llama7b_rat_paper_lora.yaml"), 1)
    r, h, i = 16, 4096, 11008
    trainable = 32 * r * (8 * h + 3 * (h + i))
    assert lora["trainable_params"] == trainable
    assert lora["model_states_gib"] == pytest.approx((2 * P7B + 16 * trainable) / GIB)
    qlora = plan(load_config(TrainConfig, ROOT / "configs/train/llama7b_rat_paper_qlora.yaml"), 1)
    assert qlora["per_gpu_gib"]["weights"] < lora["per_gpu_gib"]["weights"] / 3
    assert qlora["per_gpu_gib"]["total"] < 24


def test_params_from_local_config_json_and_tokens_from_data_manifest(tmp_path, tiny_model_dir):
    from ratune.models import load_model

    model = load_model(tiny_model_dir)
    real = sum(dict((p.data_ptr(), p.numel()) for p in model.parameters()).values())  # tied counted once
    size = model_size(str(tiny_model_dir))
    assert size["params"] == real and size["source"].endswith("config.json")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({
        "counts": {"train": {"oracle": {"rows": 800}}}, "token_lengths": {"train": {"oracle": {"p50": 600}}}}))
    cfg = TrainConfig(model=str(tiny_model_dir), data_dir=str(data), train_retriever="oracle",
                      output_dir=str(tmp_path / "o"), global_batch_size=8, num_epochs=2)
    result = plan(cfg, 1)
    assert "token_lengths p50" in result["tokens_source"]
    assert result["tokens"] == 800 * 2 * 600 and result["zero_stage"] == 0
    with pytest.raises(RatuneError, match="not divisible"):
        plan(cfg, 3)

    # max_steps, not epochs, then sets the tokens, and the text says so (it printed "2 epochs" before)
    steps = plan(cfg.model_copy(update={"max_steps": 10}), 1)
    assert steps["tokens"] == 10 * 8 * 600 and steps["max_steps"] == 10
    text = _format(steps)
    assert "10 steps x 8 examples x 600 tokens (" in text and "epochs" not in text.splitlines()[-1]
    assert "800 examples x 2 epochs x 600 tokens (" in _format(result)


def test_cli_json(capsys):
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    assert cli_plan(parser.parse_args(["--config", str(PAPER), "--gpus", "8", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_gpu_gib"]) == {"weights", "gradients", "optimizer", "activations", "total"}
    assert out["model_states_gib"] == pytest.approx(14.61, abs=0.01) and out["ideal_hours"] > 0
    assert cli_plan(parser.parse_args(["--config", str(PAPER), "--gpus", "8"])) == 0
    assert "total" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["llama7b_rat_paper", "llama7b_rat_paper_lora", "llama7b_rat_paper_qlora"])
def test_paper_configs_resolve_global_batch_64_on_1_2_8_16_gpus(name, capsys):
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    config = ROOT / "configs" / "train" / f"{name}.yaml"
    for gpus, accumulation in ((1, 16), (2, 8), (8, 2), (16, 1)):
        assert cli_plan(parser.parse_args(["--config", str(config), "--gpus", str(gpus), "--json"])) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["per_device_batch_size"], out["gradient_accumulation_steps"], out["gpus"],
                out["global_batch_size"]) == (4, accumulation, gpus, 64), (name, gpus)


def test_scale_out_configs_load():
    import yaml

    for name in ("llama7b_rat_paper_lora", "llama7b_rat_paper_qlora"):
        cfg = load_config(TrainConfig, ROOT / "configs" / "train" / f"{name}.yaml")
        assert (cfg.global_batch_size, cfg.num_epochs, cfg.max_length) == (64, 5, 2048) and cfg.lora.enabled
        assert cfg.resolve_batch(8) == (4, 2) and cfg.resolve_batch(1) == (4, 16)
    assert load_config(TrainConfig, ROOT / "configs/train/llama7b_rat_paper_qlora.yaml").load_in_4bit
    multi = yaml.safe_load((ROOT / "configs/accelerate/multinode_zero3.yaml").read_text())
    assert {"machine_rank", "main_process_ip", "main_process_port", "num_machines"} <= set(multi)
    assert multi["num_processes"] == 8 * multi["num_machines"]
    cpu = yaml.safe_load((ROOT / "configs/accelerate/cpu_2proc.yaml").read_text())
    assert (cpu["distributed_type"], cpu["num_processes"], cpu["use_cpu"]) == ("MULTI_CPU", 2, True)
    off = json.loads((ROOT / "configs/deepspeed/zero3_offload.json").read_text())["zero_optimization"]
    assert off["stage"] == 3 and off["offload_optimizer"]["device"] == "cpu"


def test_qlora_needs_lora_and_says_what_is_missing(tmp_path, monkeypatch):
    import importlib.util

    import torch

    from ratune.train.sft import train

    base = {"model": "m", "data_dir": "d", "train_retriever": "none", "output_dir": str(tmp_path / "o")}
    with pytest.raises(RatuneError, match="load_in_4bit.*needs lora.enabled"):
        validate(TrainConfig, {**base, "load_in_4bit": True}, "t")
    cfg = TrainConfig(**base, load_in_4bit=True, lora={"enabled": True})
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(RatuneError, match=r"needs bitsandbytes, which is not installed: pip install -e '\.\[qlora\]'"):
            train(cfg)
    # with bitsandbytes present but no GPU, the message names CUDA
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "bitsandbytes" else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RatuneError, match="needs a CUDA GPU"):
        train(cfg)
    assert not (tmp_path / "o").exists()  # checked before anything is written


def test_parameter_counts_print_in_the_units_of_their_size():
    from ratune.train.plan import format_count

    # LLaMA-7B, SmolLM2-135M (134,515,008 parameters), a LoRA r 8 adapter, a tiny test model
    assert [format_count(n) for n in (P7B, 134_515_008, 1_261_568, 20_480, 12)] == \
        ["6.74B", "135M", "1.26M", "20.5k", "12"]
