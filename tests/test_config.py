"""Config validation and batch arithmetic (issue 2 item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratune.config import load_config, validate
from ratune.errors import RatuneError
from ratune.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
BASE = {"model": "m", "data_dir": "d", "train_retriever": "none", "output_dir": "o"}


def test_paper_recipe_loads_and_resolves():
    cfg = load_config(TrainConfig, ROOT / "configs" / "train" / "llama7b_rat_paper.yaml")
    assert (cfg.learning_rate, cfg.global_batch_size, cfg.num_epochs, cfg.max_length, cfg.warmup_ratio) == (
        2e-5, 64, 5, 2048, 0.03)
    assert cfg.bf16 and cfg.gradient_checkpointing
    assert cfg.resolve_batch(8) == (4, 2)  # 4 x 2 x 8 = 64
    assert cfg.gradient_accumulation_steps is None and cfg.resolve_batch(4) == (4, 4)  # derived for any count
    assert (ROOT / cfg.deepspeed).exists()
    fixed = TrainConfig(**{**cfg.model_dump(), "gradient_accumulation_steps": 2})  # a given value is checked
    with pytest.raises(RatuneError, match=r"global_batch_size 64 != per_device_batch_size 4 x "
                                          r"gradient_accumulation_steps 2 x 4 processes = 32"):
        fixed.resolve_batch(4)


def test_accumulation_derived_from_global_batch():
    cfg = validate(TrainConfig, {**BASE, "global_batch_size": 64, "per_device_batch_size": 2}, "t")
    assert cfg.resolve_batch(8) == (2, 4)
    assert cfg.resolve_batch(1) == (2, 32)
    with pytest.raises(RatuneError, match="global_batch_size 64 is not divisible by per_device_batch_size 2 x 3 "
                                          "processes = 6"):
        cfg.resolve_batch(3)


def test_unknown_key_suggests_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: m\ndata_dir: d\ntrain_retriever: none\noutput_dir: o\nlearning_rte: 0.1\n")
    with pytest.raises(RatuneError) as err:
        load_config(TrainConfig, path)
    assert str(err.value) == f"{path}: unknown key 'learning_rte'; did you mean 'learning_rate'?"


def test_nested_unknown_key_and_wrong_type():
    with pytest.raises(RatuneError, match=r"unknown key 'lora.alpah'; did you mean 'alpha'\?"):
        validate(TrainConfig, {**BASE, "lora": {"alpah": 8}}, "t")
    with pytest.raises(RatuneError, match=r"unknown key 'lora.rank'; valid keys: enabled, r, alpha, dropout, "
                                          r"target_modules"):
        validate(TrainConfig, {**BASE, "lora": {"rank": 8}}, "t")
    with pytest.raises(RatuneError, match=r"t: learning_rate: Input should be a valid number"):
        validate(TrainConfig, {**BASE, "learning_rate": "fast"}, "t")
    with pytest.raises(RatuneError, match=r"train_retriever: Value error, expected one of none, oracle, bm25, bm25_paper, dense, dense_ft or mix-NAME"):
        validate(TrainConfig, {**BASE, "train_retriever": "gold"}, "t")


def test_demo_config_validates():
    from ratune.config import load_yaml
    from ratune.demo import DemoConfig

    cfg = validate(DemoConfig, load_yaml(ROOT / "configs" / "demo.yaml"), "demo")
    assert cfg.arms == ["none", "oracle"]
    train = validate(TrainConfig, {**BASE, **cfg.train}, "demo train")
    assert train.resolve_batch(1) == (1, 8)
