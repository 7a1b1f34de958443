"""Config validation and batch arithmetic."""

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


def test_demo_config_is_a_sweep_with_one_cell_per_arm():
    from ratune.sweep import expand, load_sweep

    sweep = load_sweep(ROOT / "configs" / "demo.yaml")
    cells = expand(sweep)
    assert sorted(c.axes["train_retriever"] for c in cells) == ["none", "oracle"]
    assert sweep.out_dir == Path("runs/demo")
    for cell in cells:
        train = validate(TrainConfig, cell.config, "demo cell")
        assert train.resolve_batch(1) == (1, 8) and train.max_length == 768 and train.max_steps == 25
    assert (sweep.config.eval.n_questions, sweep.config.eval.settings) == (50, ["0_shot", "bm25", "dense", "oracle"])


def test_the_demo_finds_its_accelerate_config_from_any_working_directory(tmp_path, monkeypatch):
    """A sweep file's relative paths: from the working directory first (unchanged), else from the
    nearest folder above the file that holds them (ratune/sweep/schema.py find_path)."""
    from ratune.sweep import load_sweep, train_command, expand

    monkeypatch.chdir(ROOT)
    assert load_sweep("configs/demo.yaml").config.accelerate_config == "configs/accelerate/cpu_1proc.yaml"
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(ROOT / "configs" / "demo.yaml")
    assert sweep.config.accelerate_config == str(ROOT / "configs" / "accelerate" / "cpu_1proc.yaml")
    cmd = train_command(sweep, expand(sweep)[0])
    assert cmd[cmd.index("--config_file") + 1] == str(ROOT / "configs" / "accelerate" / "cpu_1proc.yaml")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "base.yaml").write_text("model: m\n")  # base: next to the file, as before
    (tmp_path / "s" / "sweep.yaml").write_text("base: base.yaml\naccelerate_config: nowhere.yaml\n")
    sweep = load_sweep(tmp_path / "s" / "sweep.yaml")
    assert sweep.base == {"model": "m"} and sweep.config.accelerate_config == "nowhere.yaml"  # not found: as given


def test_a_relative_apibench_is_found_from_any_working_directory(tmp_path, monkeypatch):
    """A sweep file's relative ``apibench:`` is found as its other paths are, when the sweep runs
    and when its report reads the copy in SWEEP_DIR/sweep.yaml from another directory."""
    from ratune.sweep import load_sweep
    from ratune.sweep.schema import load_saved_sweep

    project = tmp_path / "project"
    (project / "data" / "apibench").mkdir(parents=True)
    (project / "runs" / "s").mkdir(parents=True)
    text = "base: {model: m}\napibench: data/apibench\n"
    (project / "runs" / "s" / "sweep.yaml").write_text(text)  # as a sweep saves its file
    monkeypatch.chdir(project)  # from the project root: as given (the commands keep it)
    assert load_sweep(project / "runs" / "s" / "sweep.yaml").config.apibench == "data/apibench"
    assert load_saved_sweep(Path("runs/s")).config.apibench == "data/apibench"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # from elsewhere: the nearest folder above the file that holds it
    assert load_sweep(project / "runs" / "s" / "sweep.yaml").config.apibench == str(project / "data" / "apibench")
    assert load_saved_sweep(project / "runs" / "s").config.apibench == str(project / "data" / "apibench")
    (project / "runs" / "s" / "sweep.yaml").write_text("base: {model: m}\n")
    assert load_saved_sweep(project / "runs" / "s").config.apibench is None  # none named: the default
    assert load_saved_sweep(elsewhere) is None  # not a sweep folder


def test_cpu_starter_configs_load_resolve_and_match_the_demo():
    """configs/train/cpu_*.yaml: one file per CPU scenario a user copies; each loads,
    resolves its batch for its launcher, and its header commands parse; the LoRA one is the demo's
    training arm, key for key."""
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
    demo_train = pyyaml.safe_load((root / "configs/demo.yaml").read_text())["base"]
    demo_train.pop("train_retriever")  # the demo's axis; the starter config trains the oracle arm
    lora = load_config(TrainConfig, root / "configs/train/cpu_lora_smollm2.yaml").model_dump()
    assert {k: lora[k] for k in demo_train if k != "lora"} == {k: v for k, v in demo_train.items() if k != "lora"}
    assert lora["lora"] == {**demo_train["lora"], "enabled": True}


def test_demo_takes_apibench_from_the_command_line(tmp_path, capsys):
    """`ratune demo --apibench DIR` reaches the demo, as the README says: a folder that is
    not APIBench is named in the one-line error, before any model or data work."""
    from ratune.cli import main

    empty = tmp_path / "not_apibench"
    empty.mkdir()
    assert main(["demo", "--out", str(tmp_path / "demo"), "--apibench", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ratune: error: APIBench folder not found (tried ") and str(empty) in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "demo").exists()


def test_a_demo_config_that_is_no_sweep_file_is_refused_naming_each_key(tmp_path, capsys):
    from ratune.cli import main

    old = tmp_path / "demo.yaml"
    old.write_text("hub: torchhub\narms: [none]\ntrain: {max_steps: 2}\n")
    assert main(["demo", "--config", str(old), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"ratune: error: {old}: base: Field required")
    assert all(f"{old}: unknown key {key!r}; valid keys: name, out_dir" in err for key in ("hub", "arms", "train"))
    assert not (tmp_path / "out").exists()


def test_the_demo_refuses_a_changed_arm_before_converting_the_model_and_writes_into_a_sweep_s_folder(
        tmp_path, capsys, monkeypatch, apibench_tiny):
    """A folder made by `ratune sweep configs/demo.yaml` (marked as a sweep's) is one the demo writes
    into; an arm whose stored config differs is refused, naming --rerun-changed, before anything runs."""
    import json

    import ratune.demo as demo
    from ratune.cli import main
    from ratune.manifest import claim_folder, require_owned
    from ratune.sweep import cell_record, expand, load_sweep

    out = tmp_path / "demo"
    sweep = load_sweep(ROOT / "configs" / "demo.yaml", out)
    cell = expand(sweep)[0]
    cell.dir.mkdir(parents=True)
    claim_folder(out, "sweep")
    require_owned(out, "demo", action="write into", also=("sweep",))  # passes: a sweep folder
    record = cell_record(sweep, cell)
    record["config"] = {**record["config"], "max_steps": 99}
    (cell.dir / "cell.json").write_text(json.dumps(record))
    monkeypatch.setattr(demo, "resolve_model_path", lambda *a: pytest.fail("converted before the refusal"))
    assert main(["demo", "--out", str(out), "--apibench", str(apibench_tiny)]) == 2
    err = capsys.readouterr().err
    assert f"{cell.name}: config.max_steps" in err and "pass --rerun-changed" in err


def test_every_training_option_has_one_row_in_docs_configs():
    """docs/configs.md's TrainConfig table lists exactly TrainConfig's fields (nested keys such as
    ``lora.r`` count as their section), so a new training option fails here until it is documented."""
    import re

    text = (ROOT / "docs" / "configs.md").read_text()
    section = text.split("## Training configs (TrainConfig)", 1)[1].split("\n## ", 1)[0]
    section = section.split("| key | default | meaning |", 1)[1]  # the keys' table
    documented = {re.match(r"\| `([a-z0-9_]+)", line).group(1) for line in section.splitlines()
                  if re.match(r"\| `[a-z0-9_]+[`.]", line)}
    assert documented == set(TrainConfig.model_fields)
