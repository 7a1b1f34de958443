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
    with pytest.raises(RatuneError, match=r"train_retriever: Value error, expected one of none, oracle, bm25, bm25_replica, dense, dense_ft, hybrid, hybrid_ft or mix-NAME"):
        validate(TrainConfig, {**BASE, "train_retriever": "gold"}, "t")


def test_demo_config_validates():
    from ratune.config import load_yaml
    from ratune.demo import DemoConfig

    cfg = validate(DemoConfig, load_yaml(ROOT / "configs" / "demo.yaml"), "demo")
    assert cfg.arms == ["none", "oracle"]
    train = validate(TrainConfig, {**BASE, **cfg.train}, "demo train")
    assert train.resolve_batch(1) == (1, 8)


def test_cpu_starter_configs_load_resolve_and_match_the_demo():
    """configs/train/cpu_*.yaml: one file per CPU scenario a user copies (issue 21 item 6); each
    loads, resolves its batch for its launcher, and its header commands parse; the LoRA one is
    the demo's training arm, key for key."""
    import shlex

    import yaml as pyyaml

    from ratune.cli import build_parser
    from ratune.config import load_config
    from ratune.train.config import TrainConfig

    root = Path(__file__).resolve().parent.parent
    expected = {"cpu_lora_smollm2.yaml": (1, (1, 8)), "cpu_full_smollm2.yaml": (1, (1, 8)),
                "cpu_zero2_2proc.yaml": (2, (1, 4))}
    assert sorted(p.name for p in (root / "configs/train").glob("cpu_*.yaml")) == sorted(expected)
    parser = build_parser()
    for name, (processes, batch) in expected.items():
        path = root / "configs/train" / name
        config = load_config(TrainConfig, path)
        assert config.resolve_batch(processes) == batch, name
        assert config.model == "smollm2-135m-instruct" and config.data_dir == "runs/data/torchhub"
        text = path.read_text().replace("\\\n#", "")
        for line in text.splitlines():
            command = line.lstrip("# ").strip()
            if command.startswith("ratune data build"):  # the others name folders made later
                parser.parse_args(shlex.split(command)[1:])  # exits (SystemExit) on a stale flag
    demo_train = pyyaml.safe_load((root / "configs/demo.yaml").read_text())["train"]
    lora = load_config(TrainConfig, root / "configs/train/cpu_lora_smollm2.yaml").model_dump()
    assert {k: lora[k] for k in demo_train if k != "lora"} == {k: v for k, v in demo_train.items() if k != "lora"}
    assert lora["lora"] == {**demo_train["lora"], "enabled": True}


def test_demo_takes_apibench_from_the_command_line(tmp_path, capsys):
    """`ratune demo --apibench DIR` reaches the demo (README and issue 21 item 6): a folder that is
    not APIBench is named in the one-line error, before any model or data work."""
    from ratune.cli import main

    empty = tmp_path / "not_apibench"
    empty.mkdir()
    assert main(["demo", "--out", str(tmp_path / "demo"), "--apibench", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ratune: error: APIBench folder not found (tried ") and str(empty) in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "demo" / "data").exists()
