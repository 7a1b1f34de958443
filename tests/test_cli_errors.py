"""A user's mistake is one line naming the file, line, field or flag, exit status 2, never a
traceback; every number is checked before work starts; an empty artifact is refused.

The walk test derives every sub-command and every argument from the argparse parser itself
(:func:`ratune.cli.build_parser`), so a new command or flag is covered without editing this file:
each value-taking argument must have choices, a checked type of :mod:`ratune.args` (whose
``bad_examples`` the walk feeds it) or an entry in FREE_TEXT saying where it is checked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import ratune.cli as cli
from ratune.args import PATH_KINDS
from ratune.boundary import TRACEBACK_ENV, run_guarded
from ratune.cli import main
from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent

#: Value-taking arguments with free text, and where each is checked.
FREE_TEXT = {
    ("report", "--model"): "a label printed in the table; any text",
    ("report", "--against"): "a --bfcl name; one not given is refused by eval/bfcl_report.py, naming those given",
    ("eval run", "--model-name"): "a label written into each response line and metrics.json; any text",
    ("export", "--push-to-hub"): "a hub repo id; the hub refuses a bad one (RatuneError naming it)",
    ("export", "--base-model"): "a hub id written into the model card; any text",
    ("export", "--license"): "a license name written into the model card; any text",
}


def _yaml_file(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _leaves(parser: argparse.ArgumentParser, path: tuple = ()):
    """``(command words, parser)`` of every leaf sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, path + (name,))
            return
    yield path, parser


def _value_actions(parser: argparse.ArgumentParser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.nargs != 0]


def _flag(action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest


def _path_of(kind: str, tmp: Path) -> str:
    return str({"missing": tmp / "missing" / "nothing-here", "file": tmp / "a-file.txt", "folder": tmp / "a-folder",
                "new": tmp / "new-output"}[kind])


def _example(action, example: str, tmp: Path) -> str:
    if action.type is not None and example in PATH_KINDS:
        return getattr(action.type, "template", "{}").format(_path_of(example, tmp))
    return example


def _good(action, tmp: Path) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    return _example(action, action.type.good_example, tmp)


def _bad_values(action, tmp: Path) -> list[str]:
    if action.choices:
        return ["no-such-choice"]
    return [_example(action, bad, tmp) for bad in getattr(action.type, "bad_examples", ())]


def _argv(path: tuple, parser, tmp: Path, bad_action=None, bad_value=None) -> list[str]:
    """The command with every required argument given a good value, and ``bad_action`` a bad one."""
    argv = list(path)
    nvalues = {"+": 1, "*": 1, "?": 1, None: 1}
    for action in _value_actions(parser):
        n = action.nargs if isinstance(action.nargs, int) else nvalues.get(action.nargs, 1)
        if action is bad_action:
            values = [bad_value] + [_good(action, tmp)] * (n - 1)
        elif action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            values = [_good(action, tmp)] * n
        else:
            continue
        argv += ([action.option_strings[0]] if action.option_strings else []) + values
    return argv


@pytest.fixture()
def walk(tmp_path, monkeypatch):
    """The real parser with every handler replaced by one that records it was reached."""
    (tmp_path / "a-file.txt").write_text("x\n")
    (tmp_path / "a-folder").mkdir()
    parser = cli.build_parser()
    reached = []

    def handler(args):
        reached.append(args)
        return 0

    leaves = list(_leaves(parser))
    for _, leaf in leaves:
        leaf.set_defaults(func=handler)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return leaves, reached, tmp_path


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def _one_line_error(rc: int, err: str, argv) -> None:
    assert rc == 2, (argv, rc, err)
    assert err.count("\n") == 1 and err.startswith("ratune: error: "), (argv, err)
    assert "Traceback" not in err, (argv, err)


def test_every_argument_of_every_command_is_checked_at_the_edge(walk):
    leaves, _, _ = walk
    assert len(leaves) >= 14  # data build/utility, retrieval eval/index/train, plan, train, eval run/score, ...
    unchecked = []
    for path, parser in leaves:
        for action in _value_actions(parser):
            key = (" ".join(path), _flag(action))
            if action.type in (int, float):
                unchecked.append(f"{key}: plain {action.type.__name__}; derive the type from the schema field "
                                 "(ratune.args.setting) or a bounded type (ratune.args.bounded)")
            elif not action.choices and not hasattr(action.type, "bad_examples") and key not in FREE_TEXT:
                unchecked.append(f"{key}: no choices and no checked type (ratune.args); or list it in FREE_TEXT")
    assert not unchecked, "\n".join(unchecked)


def test_every_command_with_its_required_arguments_reaches_its_handler(walk, capsys):
    """The good values the walk fills in are good, so the bad-value cases below fail on the bad one."""
    leaves, reached, tmp = walk
    for path, parser in leaves:
        argv = _argv(path, parser, tmp)
        rc, err = _run(argv, capsys)
        assert rc == 0 and err == "", (argv, err)
    assert len(reached) == len(leaves)


def test_every_command_refuses_every_bad_argument_in_one_line(walk, capsys):
    leaves, reached, tmp = walk
    cases = 0
    for path, parser in leaves:
        refused_here = 0
        for action in _value_actions(parser):
            for bad in _bad_values(action, tmp):
                argv = _argv(path, parser, tmp, action, bad)
                rc, err = _run(argv, capsys)
                _one_line_error(rc, err, argv)
                assert " ".join(path) in err and (_flag(action) in err or action.dest in err
                                                  or str(action.metavar) in err), (argv, err)
                refused_here += 1
        assert refused_here, f"{' '.join(path)}: no argument to give a bad value"
        cases += refused_here
    assert not reached, "a bad value reached a handler"
    assert cases > 100


def test_every_command_without_its_required_arguments_is_one_line(walk, capsys):
    leaves, reached, _ = walk
    for path, parser in leaves:
        if not any(a.required for a in _value_actions(parser)):
            continue
        rc, err = _run(list(path), capsys)
        _one_line_error(rc, err, path)
        assert "required" in err
    rc, err = _run([], capsys)
    _one_line_error(rc, err, [])
    rc, err = _run(["no-such-command"], capsys)
    _one_line_error(rc, err, ["no-such-command"])
    assert not reached


def test_the_console_entry_points_print_one_line(tmp_path):
    """The real processes: ``python -m ratune.cli`` and ``python -m ratune.train`` (what
    ``accelerate launch -m ratune.train`` runs in each process)."""
    for argv in (["-m", "ratune.cli", "train", "--config", str(tmp_path)],
                 ["-m", "ratune.train", "--config", str(tmp_path)],
                 ["-m", "ratune.cli", "eval", "run", "--checkpoint", str(tmp_path), "--hub", "torchhub", "--out",
                  str(tmp_path / "o"), "--batch-size", "0"]):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ratune: error: "), proc.stderr
        assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- the boundary's policy


def test_boundary_policy_user_errors_one_line_bugs_keep_their_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def raise_(exc):
        def fn():
            raise exc
        return fn

    assert run_guarded(raise_(RatuneError("x.yaml:3: field 'lr': bad"))) == 2
    assert capsys.readouterr().err == "ratune: error: x.yaml:3: field 'lr': bad\n"
    missing = tmp_path / "gone.json"
    assert run_guarded(lambda: open(missing).read()) == 2  # the OS names the path
    assert capsys.readouterr().err == f"ratune: error: {missing}: No such file or directory\n"
    assert run_guarded(lambda: open(tmp_path).read()) == 2
    assert capsys.readouterr().err == f"ratune: error: {tmp_path}: Is a directory\n"
    for bug in (ValueError("a bug"), KeyError("k"), ZeroDivisionError(), OSError("no file name"),
                UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), json.JSONDecodeError("x", "{", 1)):
        with pytest.raises(type(bug)):
            run_guarded(raise_(bug))
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(RatuneError):
        run_guarded(raise_(RatuneError("shown with its traceback")))


# ---------------------------------------------------------------- known mistakes, one line each


def _train_config(tmp_path, **values) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"model": str(tmp_path / "model"), "data_dir": str(tmp_path / "data"),
                                    "train_retriever": "none", "output_dir": str(tmp_path / "run"), **values}))
    return path


def _fake_data(tmp_path, modes=("none",), splits=("train",)) -> Path:
    """A data folder that passes check_training_data (complete, the modes' dataset_dict.json)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"modes": list(modes), "settings": {}}))
    for mode in modes:
        (data / mode).mkdir()
        (data / mode / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    (data / ".complete").write_text("complete\n")
    return data


def _main_error(argv, capsys) -> str:
    rc, err = _run(argv, capsys)
    _one_line_error(rc, err, argv)
    return err


@pytest.mark.parametrize("content,what", [
    (b"model: \xff\n", ":1: not UTF-8"),
    (b"model: m\nlr: 1\n\nseed: [1, 2\n", ":5: not valid YAML"),
    (b"- a\n- b\n", "expected a mapping"),
    (b"", "expected a mapping"),
])
def test_config_file_errors_are_one_line(tmp_path, capsys, content, what):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    for argv in (["train", "--config", str(path)], ["sweep", str(path)], ["plan", "--config", str(path), "--gpus", "1"],
                 ["demo", "--config", str(path)]):
        err = _main_error(argv, capsys)
        assert f"{path}" in err and what in err


def test_config_that_is_a_folder_is_refused_by_the_loader_too(tmp_path):
    from ratune.config import load_yaml
    from ratune.sweep import load_sweep

    with pytest.raises(RatuneError, match="is a folder, expected a YAML config file"):
        load_yaml(tmp_path)
    sweep = tmp_path / "s.yaml"
    (tmp_path / "base").mkdir()
    sweep.write_text("base: base\naxes: {train_retriever: [none]}\n")
    with pytest.raises(RatuneError, match=r"base: is a folder"):
        load_sweep(sweep)


@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_a_model_that_does_not_exist_is_one_line_before_any_folder(tmp_path, capsys):
    _fake_data(tmp_path)
    for model, what in ((str(tmp_path / "no" / "model"), "no such model folder"),
                        ("nobody/no-such-model", "not a local folder, and loading it as a hub id failed")):
        err = _main_error(["train", "--config", str(_train_config(tmp_path, model=model))], capsys)
        assert model in err and what in err
        assert not (tmp_path / "run").exists()
    err = _main_error(["data", "build", "--hub", "torchhub", "--out", str(tmp_path / "d"), "--tokenizer",
                       "nobody/no-such-model"], capsys)
    assert "nobody/no-such-model: not a local folder" in err
    err = _main_error(["data", "build", "--hub", "torchhub", "--out", str(tmp_path / "d"), "--tokenizer",
                       str(tmp_path / "none")], capsys)
    assert "no such file or folder" in err


def test_a_train_mode_that_was_not_built(tmp_path, tiny_model_dir, capsys):
    _fake_data(tmp_path, modes=("none",))
    config = _train_config(tmp_path, model=str(tiny_model_dir), train_retriever="oracle")
    err = _main_error(["train", "--config", str(config)], capsys)
    assert "train_retriever: oracle" in err and "has no such mode (built: none)" in err
    assert not (tmp_path / "run").exists()


def test_a_mode_without_a_train_split(tmp_path, tiny_model_dir, capsys):
    _fake_data(tmp_path, modes=("none",), splits=("eval",))
    err = _main_error(["train", "--config", str(_train_config(tmp_path, model=str(tiny_model_dir)))], capsys)
    assert "no train split" in err


@pytest.mark.parametrize("content,what", [
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"zero_optimization": {"stage": "3"}}', "field 'zero_optimization.stage': expected one of 0, 1, 2, 3"),
    ('{"zero_optimization": {"stage": 2.5}}', "zero_optimization.stage"),
    ('{"zero_optimization": {"stage": true}}', "zero_optimization.stage"),
    ('{"zero_optimization": [3]}', "field 'zero_optimization': expected an object"),
    ('{"zero_optimization": {"stage": 3', "not valid JSON"),
])
def test_deepspeed_json_that_is_not_a_config(tmp_path, capsys, content, what):
    from ratune.train.launch import deepspeed_settings

    ds = tmp_path / "ds.json"
    ds.write_text(content)
    with pytest.raises(RatuneError, match="ds.json") as info:
        deepspeed_settings(str(ds))
    assert what in str(info.value) and "\n" not in str(info.value)
    _fake_data(tmp_path)
    err = _main_error(["train", "--config", str(_train_config(tmp_path, deepspeed=str(ds)))], capsys)
    assert what in err
    config = tmp_path / "plan.yaml"
    config.write_text(yaml.safe_dump({"model": "huggyllama/llama-7b", "data_dir": "d", "train_retriever": "none",
                                      "output_dir": "o", "deepspeed": str(ds)}))
    assert what in _main_error(["plan", "--config", str(config), "--gpus", "8"], capsys)


@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_a_tokenizer_without_eos(tmp_path, smol_tokenizer_dir, capsys):
    from ratune.models import load_tokenizer

    folder = tmp_path / "no_eos"
    shutil.copytree(smol_tokenizer_dir, folder)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.exists():
            data = json.loads(path.read_text())
            data.pop("eos_token", None)
            data["eos_token"] = None
            path.write_text(json.dumps(data))
    with pytest.raises(RatuneError, match="the tokenizer has no EOS token"):
        load_tokenizer(folder)
    err = _main_error(["data", "build", "--hub", "torchhub", "--out", str(tmp_path / "d"), "--tokenizer",
                       str(folder)], capsys)
    assert f"{folder}: the tokenizer has no EOS token" in err


def test_a_tokenizer_without_a_chat_template_in_data_utility(tmp_path, llama1_dir, capsys):
    data = _fake_data(tmp_path, modes=("none", "oracle"))
    err = _main_error(["data", "utility", "--data", str(data), "--model", str(llama1_dir), "--out",
                       str(tmp_path / "u")], capsys)
    assert "the tokenizer has no chat template" in err


@pytest.fixture()
def small_apibench(apibench, tmp_path):
    """A copy of APIBench's TorchHub files with 8 train and 8 eval rows (fast builds)."""
    root = tmp_path / "apibench"
    (root / "api").mkdir(parents=True)
    (root / "apibench").mkdir()
    shutil.copy(apibench / "api" / "torchhub_api.jsonl", root / "api")
    for split in ("train", "eval"):
        lines = (apibench / "apibench" / f"torchhub_{split}.json").read_text(encoding="utf-8").splitlines(True)
        (root / "apibench" / f"torchhub_{split}.json").write_text("".join(lines[:8]), encoding="utf-8")
    return root


def test_an_empty_api_database(small_apibench, capsys):
    (small_apibench / "api" / "torchhub_api.jsonl").write_text("\n")
    err = _main_error(["retrieval", "eval", "--apibench", str(small_apibench), "--hub", "torchhub",
                       "--retriever", "bm25"], capsys)
    assert "torchhub_api.jsonl: no API documents" in err
    from ratune.retrieval.retrievers import BM25Retriever

    with pytest.raises(RatuneError, match="empty API database"):
        BM25Retriever([], hub="torchhub")


def _checkpoint(tiny_model_dir, tmp_path, name) -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_model_dir, folder)
    return folder


@pytest.mark.parametrize("damage,what", [
    ("no_tokenizer", "no tokenizer"),
    ("no_weights", "no model weights"),
    ("pickle", "holds pickled weights (pytorch_model.bin) and no model.safetensors"),
    ("pickle_as_safetensors", "model.safetensors: not a safetensors file"),
    ("missing_shard", "missing weight shard(s) model-00002-of-00002.safetensors"),
])
@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_checkpoints_that_cannot_load_safely(tiny_model_dir, tmp_path, capsys, damage, what):
    import pickle

    folder = _checkpoint(tiny_model_dir, tmp_path, damage)
    if damage == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
            (folder / name).unlink(missing_ok=True)
    elif damage == "no_weights":
        (folder / "model.safetensors").unlink()
    elif damage == "pickle":
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"w": [1.0]}))
    elif damage == "pickle_as_safetensors":
        (folder / "model.safetensors").write_bytes(pickle.dumps({"w": [1.0]}))
    else:
        (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    out = tmp_path / "eval"
    err = _main_error(["eval", "run", "--checkpoint", str(folder), "--hub", "torchhub", "--out", str(out),
                       "--settings", "0_shot", "--n-questions", "1", "--device", "cpu"], capsys)
    assert what in err and str(folder) in err
    assert not (out / "0_shot").exists()


@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_a_truncated_run_manifest(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run / "model")
    (run / "manifest.json").write_text('{"prompt": {"max_document_tok')
    err = _main_error(["eval", "run", "--checkpoint", str(run), "--hub", "torchhub", "--out", str(tmp_path / "e"),
                       "--settings", "0_shot", "--n-questions", "1", "--device", "cpu"], capsys)
    assert f"{run / 'manifest.json'}: not valid JSON" in err


def test_a_torn_metrics_json_in_a_sweep_report(tmp_path, capsys):
    from sweep_cells import finished_cell, rate_metrics

    sweep = tmp_path / "sweep"
    finished_cell(sweep, "a", {"train_retriever": "none"}, {"0_shot": rate_metrics(10, 5, 2)})
    cell = finished_cell(sweep, "b", {"train_retriever": "oracle"}, {"0_shot": rate_metrics(10, 6, 1)})
    metrics = cell / "eval" / "0_shot" / "metrics.json"
    metrics.write_text(metrics.read_text()[:40])
    err = _main_error(["report", str(sweep)], capsys)
    assert f"{metrics}: not valid JSON" in err
    metrics.write_text("[]")
    assert "expected a JSON object, got list" in _main_error(["report", str(sweep)], capsys)
    metrics.write_text("{}")
    assert "field 'n': missing" in _main_error(["report", str(sweep)], capsys)
    (cell / "cell.json").write_text('{"name": "b", "axes"')
    assert f"{cell / 'cell.json'}: not valid JSON" in _main_error(["report", str(sweep)], capsys)


def test_report_of_a_folder_that_does_not_exist(tmp_path, capsys):
    from ratune.sweep import report_sweep

    missing = tmp_path / "no-sweep"
    assert f"{missing}: no such file or folder" in _main_error(["report", str(missing)], capsys)
    with pytest.raises(RatuneError, match="no such sweep folder"):
        report_sweep(missing)
    err = _main_error(["report", "--eval", f"none={missing}", "--hub", "torchhub", "--model", "m", "--out",
                       str(tmp_path / "r")], capsys)
    assert f"{missing}: no such file or folder" in err


def test_retrieval_index_out_an_existing_file(tmp_path, capsys):
    target = tmp_path / "index"
    target.write_text("a user's file\n")
    err = _main_error(["retrieval", "index", "--hub", "torchhub", "--out", str(target)], capsys)
    assert f"{target}: exists and is not a folder" in err
    assert target.read_text() == "a user's file\n"


# ---------------------------------------------------------------- numbers checked before work starts


@pytest.mark.parametrize("argv,flag", [
    (["data", "build", "--hub", "torchhub", "--out", "{tmp}/d", "--top-k", "0"], "--top-k"),
    (["data", "build", "--hub", "torchhub", "--out", "{tmp}/d", "--top-k", "-1"], "--top-k"),
    (["data", "build", "--hub", "torchhub", "--out", "{tmp}/d", "--mixture-seed", "-1"], "--mixture-seed"),
    (["eval", "run", "--checkpoint", "{tmp}", "--hub", "torchhub", "--out", "{tmp}/e", "--n-questions", "-3"],
     "--n-questions"),
    (["eval", "run", "--checkpoint", "{tmp}", "--hub", "torchhub", "--out", "{tmp}/e", "--n-questions", "0"],
     "--n-questions"),
    (["eval", "run", "--checkpoint", "{tmp}", "--hub", "torchhub", "--out", "{tmp}/e", "--batch-size", "0"],
     "--batch-size"),
    (["eval", "run", "--checkpoint", "{tmp}", "--hub", "torchhub", "--out", "{tmp}/e", "--max-new-tokens", "0"],
     "--max-new-tokens"),
    (["eval", "run", "--checkpoint", "{tmp}", "--hub", "torchhub", "--out", "{tmp}/e", "--threads", "-2"],
     "--threads"),
    (["retrieval", "train", "--hub", "torchhub", "--out", "{tmp}/r", "--seed", "-1"], "--seed"),
    (["retrieval", "train", "--hub", "torchhub", "--out", "{tmp}/r", "--lr", "inf"], "--lr"),
    (["compare", "{tmp}", "{tmp}", "--hub", "torchhub", "--seed", "-5"], "--seed"),
    (["plan", "--config", "{cfg}", "--gpus", "0"], "--gpus"),
    (["plan", "--config", "{cfg}", "--gpus", "8", "--mfu", "nan"], "--mfu"),
])
def test_numbers_on_the_command_line_are_checked_before_work(tmp_path, capsys, argv, flag):
    cfg = ROOT / "configs" / "train" / "llama7b_rat_paper.yaml"
    argv = [a.format(tmp=tmp_path, cfg=cfg) for a in argv]
    err = _main_error(argv, capsys)
    assert f"argument {flag}:" in err


@pytest.mark.parametrize("values,what", [
    ({"learning_rate": float("inf")}, "learning_rate: Input should be a finite number"),
    ({"learning_rate": float("nan")}, "learning_rate: Input should be a finite number"),
    ({"num_epochs": float("inf")}, "num_epochs: Input should be a finite number"),
    ({"weight_decay": float("nan")}, "weight_decay"),
    ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
    ({"seed": 2**32}, "seed: Input should be less than or equal to 4294967295"),
    ({"torch_threads": 0}, "torch_threads: Input should be greater than or equal to 1"),
    ({"lora": {"enabled": True, "dropout": float("nan")}}, "lora.dropout"),
])
def test_numbers_in_a_train_config_are_checked_before_work(tmp_path, capsys, values, what):
    path = _train_config(tmp_path, **values)
    err = _main_error(["train", "--config", str(path)], capsys)
    assert what in err
    assert not (tmp_path / "run").exists()


def test_settings_check_themselves_wherever_they_are_made(tmp_path):
    from ratune.config import validate
    from ratune.data.build import BuildSettings
    from ratune.demo import run_demo
    from ratune.eval.run import EvalSettings
    from ratune.retrieval.finetune import FinetuneSettings
    from ratune.sweep import SweepConfig

    for make, what in ((lambda: EvalSettings(n_questions=0), "EvalSettings.n_questions"),
                       (lambda: EvalSettings(batch_size=-1), "EvalSettings.batch_size"),
                       (lambda: EvalSettings(max_new_tokens=0), "EvalSettings.max_new_tokens"),
                       (lambda: EvalSettings(torch_threads=-1), "EvalSettings.torch_threads"),
                       (lambda: BuildSettings(top_k=0), "BuildSettings.top_k"),
                       (lambda: BuildSettings(max_length=8), "BuildSettings.max_length"),
                       (lambda: FinetuneSettings(batch_size=1), "FinetuneSettings.batch_size"),
                       (lambda: FinetuneSettings(learning_rate=float("inf")), "FinetuneSettings.learning_rate"),
                       (lambda: run_demo(_yaml_file(tmp_path / "d1.yaml", {"base": {}, "eval": {"batch_size": 0}})),
                        "eval.batch_size"),
                       (lambda: run_demo(_yaml_file(tmp_path / "d2.yaml", {"base": {}, "eval": {"threads": -2}})),
                        "eval.threads"),
                       (lambda: validate(SweepConfig, {"base": {}, "data": {"mixture_seed": -1}}, "s.yaml"),
                        "data.mixture_seed"),
                       (lambda: validate(SweepConfig, {"base": {}, "eval": {"n_questions": 0}}, "s.yaml"),
                        "eval.n_questions")):
        with pytest.raises(RatuneError, match=what.replace(".", r"\.")):
            make()
    assert EvalSettings(settings=("0_shot",), n_questions=3).n_questions == 3  # good values pass unchanged


def test_the_flag_and_the_schema_field_share_one_rule(capsys, tmp_path):
    """``--batch-size 0`` is refused with the words EvalSettings(batch_size=0) is refused with."""
    from ratune.eval.run import EvalSettings

    with pytest.raises(RatuneError) as info:
        EvalSettings(batch_size=0)
    reason = str(info.value).split(": ", 1)[1].split(" (got")[0]
    err = _main_error(["eval", "run", "--checkpoint", str(tmp_path), "--hub", "torchhub", "--out",
                       str(tmp_path / "e"), "--batch-size", "0"], capsys)
    assert reason in err


# ---------------------------------------------------------------- empty artifacts refused, not marked complete


def test_a_build_whose_rows_are_all_dropped_is_refused_not_marked_complete(small_apibench, smol_tokenizer_dir,
                                                                          tmp_path, capsys):
    out = tmp_path / "d"
    err = _main_error(["data", "build", "--apibench", str(small_apibench), "--hub", "torchhub", "--out", str(out),
                       "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", "--max-length", "16", "--json"],
                      capsys)  # --json: no progress bar on stderr
    assert "mode none: all 8 rows are longer than --max-length 16" in err
    assert not (out / ".complete").exists()


@pytest.mark.parametrize("split", ["train", "eval"])
def test_an_empty_example_file_is_refused(small_apibench, smol_tokenizer_dir, tmp_path, capsys, split):
    path = small_apibench / "apibench" / f"torchhub_{split}.json"
    path.write_text("\n\n")
    out = tmp_path / "d"
    err = _main_error(["data", "build", "--apibench", str(small_apibench), "--hub", "torchhub", "--out", str(out),
                       "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", "--json"], capsys)
    assert f"{path}: no {split} examples: the file has no rows" in err
    assert not (out / ".complete").exists()


def test_a_missing_eval_file_does_not_skip_the_leakage_check(small_apibench, smol_tokenizer_dir, tmp_path, capsys):
    eval_file = small_apibench / "apibench" / "torchhub_eval.json"
    eval_file.unlink()
    argv = ["data", "build", "--apibench", str(small_apibench), "--hub", "torchhub", "--tokenizer",
            str(smol_tokenizer_dir), "--modes", "none", "--max-length", "4096", "--json"]
    err = _main_error([*argv, "--out", str(tmp_path / "d")], capsys)
    assert f"{eval_file}: missing, and the training data's leakage check needs the eval questions" in err
    assert "--leakage allow" in err
    assert not (tmp_path / "d" / ".complete").exists()
    assert _run([*argv, "--out", str(tmp_path / "d2"), "--leakage", "allow"], capsys)[0] == 0
    manifest = json.loads((tmp_path / "d2" / "manifest.json").read_text())
    assert manifest["validation"]["leakage"]["policy"] == "allow (not checked: no eval split)"


@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_an_empty_response_file_is_refused(tmp_path, capsys):
    path = tmp_path / "responses.jsonl"
    path.write_text("\n")
    err = _main_error(["eval", "score", "--hub", "torchhub", "--responses", str(path)], capsys)
    assert f"{path}: no responses (the file is empty)" in err
    err = _main_error(["compare", str(path), str(path), "--hub", "torchhub"], capsys)
    assert "no responses" in err


def test_an_eval_setting_without_questions_writes_no_cell(tiny_model_dir, apibench, tmp_path, monkeypatch):
    import ratune.eval.run as run

    monkeypatch.setattr(run, "_setting_plan", lambda setting, examples, **kwargs: ([], None, {}))
    with pytest.raises(RatuneError, match="test setting swap: none of the 2 eval questions qualifies"):
        run.evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "e",
                                settings=run.EvalSettings(settings=["swap"], n_questions=2, device="cpu"),
                                progress=False)
    assert not (tmp_path / "e" / "swap").exists()


@pytest.mark.parametrize("offline", [False, True])
def test_an_unreachable_hub_says_how_to_fail_at_once(monkeypatch, offline):
    """Where the hub cannot be reached, from_pretrained retries for about 25 s; the one-line error
    then says to use a local folder and HF_HUB_OFFLINE=1. Offline mode already fails at once, so
    the hint is left out there."""
    import huggingface_hub
    import transformers

    from ratune.models import HUB_UNREACHABLE_HINT, load_tokenizer

    def unreachable(*args, **kwargs):  # transformers 5's message when no connection is made
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.\nCheck your internet connection or see how to run the library in "
                      "offline mode.")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(RatuneError) as err:
        load_tokenizer("nobody/no-such-model")
    assert str(err.value).startswith("nobody/no-such-model: not a local folder, and loading it as a hub id failed "
                                     "(We couldn't connect to 'https://huggingface.co' to load the files")
    assert str(err.value).endswith("; " + HUB_UNREACHABLE_HINT) is not offline
    assert "\n" not in str(err.value)
