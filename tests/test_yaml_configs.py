"""Bounded work on hostile YAML: one loader for every config, which refuses
alias bombs, deep nesting and duplicate keys in one line, and still loads every shipped config."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from source_tree import source_files

from ratune.cli import main
from ratune.config import MAX_CONFIG_DEPTH, MAX_CONFIG_VALUES, load_yaml
from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "configs").rglob("*.yaml"))


def alias_bomb(path: Path, levels: int = 9, width: int = 9) -> Path:
    """The "billion laughs" document: 9 levels of 9 aliases each, 9^9 = 387 million leaves, 2 KB."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 2048
    return path


def _cli_error(argv, capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ratune: error: ") and "Traceback" not in err, err
    return err


def test_alias_bomb_is_refused_in_well_under_a_second(tmp_path, capsys):
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    start = time.perf_counter()
    with pytest.raises(RatuneError) as info:
        load_yaml(bomb)
    assert time.perf_counter() - start < 0.5
    assert str(info.value).startswith(f"{bomb}:")
    assert f"aliases expand the config to more than {MAX_CONFIG_VALUES} values" in str(info.value)
    assert "\n" not in str(info.value)
    for argv in (["train", "--config", str(bomb)], ["sweep", str(bomb)], ["sweep", str(bomb), "--dry-run"],
                 ["plan", "--config", str(bomb), "--gpus", "1"], ["demo", "--config", str(bomb)]):
        start = time.perf_counter()
        assert "alias bomb" in _cli_error(argv, capsys)
        assert time.perf_counter() - start < 2


def test_a_sweep_whose_base_config_is_a_bomb(tmp_path, capsys):
    alias_bomb(tmp_path / "base.yaml")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: base.yaml\naxes: {train_retriever: [none]}\n")
    assert "base.yaml" in _cli_error(["sweep", str(sweep), "--dry-run"], capsys)


def test_small_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("common: &common {batch_size: 8, n_questions: 50}\n"
                    "eval:\n  <<: *common\n  n_questions: 10\n"
                    "settings: &s [0_shot, oracle]\nagain: *s\n")
    assert load_yaml(path) == {"common": {"batch_size": 8, "n_questions": 50},
                               "eval": {"batch_size": 8, "n_questions": 10},
                               "settings": ["0_shot", "oracle"], "again": ["0_shot", "oracle"]}


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: &x\n  b: *x\n")
    with pytest.raises(RatuneError, match=r"c\.yaml:1: an alias refers to the mapping or list that contains it"):
        load_yaml(path)


@pytest.mark.parametrize("text", ["a: " + "[" * 200_000 + "\n", "a: " + "{x: " * 1000 + "\n",
                                  "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n"])
def test_deep_nesting_is_refused_quickly(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(RatuneError, match=f"nested more than {MAX_CONFIG_DEPTH} levels deep"):
        load_yaml(path)
    assert time.perf_counter() - start < 1


def test_a_huge_config_is_refused_without_reading_it_all(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * (2 << 20) + "\n")
    with pytest.raises(RatuneError, match="larger than"):
        load_yaml(path)


def test_duplicate_keys_name_both_lines(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("model: m\ndata_dir: d\nlearning_rate: 1.0e-5\ntrain_retriever: none\n"
                    "output_dir: o\nlearning_rate: 2.0e-5\n")
    with pytest.raises(RatuneError) as info:
        load_yaml(path)
    assert str(info.value) == f"{path}:6: duplicate key 'learning_rate' (first given on line 3)"
    assert "duplicate key 'learning_rate' (first given on line 3)" in _cli_error(["train", "--config", str(path)],
                                                                                  capsys)
    nested = tmp_path / "sweep.yaml"
    nested.write_text("base: b.yaml\neval:\n  n_questions: 5\n  batch_size: 2\n  n_questions: 6\n")
    with pytest.raises(RatuneError, match=r"sweep\.yaml:5: duplicate key 'n_questions' \(first given on line 3\)"):
        load_yaml(nested)


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_every_shipped_config_loads(path):
    data = load_yaml(path)
    assert isinstance(data, dict) and data
    rel = path.relative_to(ROOT / "configs")
    if rel.parts[0] == "train":
        from ratune.config import load_config
        from ratune.train.config import TrainConfig

        load_config(TrainConfig, path)
    elif rel.parts[0] == "sweeps":
        from ratune.sweep import expand, load_sweep

        assert expand(load_sweep(path))
    elif rel.name == "demo.yaml":  # a sweep file (ratune/demo.py)
        from ratune.sweep import expand, load_sweep

        assert len(expand(load_sweep(path))) == 2


def test_one_loader_reads_every_yaml():
    """No module but ratune/config.py parses YAML (yaml.load, safe_load, full_load, a Loader class)."""
    parsing = {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "full_load_all",
               "unsafe_load_all", "compose", "parse", "scan"}
    found = []
    for file in source_files(bench=True):
        if file == ROOT / "ratune" / "config.py":
            continue
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "yaml"
                    and (node.attr in parsing or node.attr.endswith("Loader"))):
                found.append(f"{file.relative_to(ROOT)}:{node.lineno}: yaml.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "yaml":
                found += [f"{file.relative_to(ROOT)}:{node.lineno}: from yaml import {a.name}"
                          for a in node.names if a.name in parsing or a.name.endswith("Loader")]
    assert not found, "load YAML with ratune.config.load_yaml:\n" + "\n".join(found)
