"""One definition per eval setting (ratune/options.py, eval/settings.py): the flags of ``ratune eval
run``, a sweep file's ``eval:`` section (the demo's too: configs/demo.yaml is a sweep file) and the
commands a sweep runs all come from EVAL_OPTIONS over EvalSettings."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from ratune.cli import build_parser
from ratune.eval.settings import EVAL_OPTIONS, EvalSettings
from ratune.options import Option, add_arguments, command_arguments, config_model, config_values, values_from_args
from ratune.sweep import SweepEval, load_sweep

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def test_every_eval_setting_has_one_option_and_every_section_the_same_keys():
    fields = [f.name for f in dataclasses.fields(EvalSettings) if f.name != "retriever_cache"]
    assert sorted(o.field for o in EVAL_OPTIONS) == sorted(fields)
    config_keys = [o.key for o in EVAL_OPTIONS if o.config]
    assert list(SweepEval.model_fields) == [*config_keys, "curve_settings", "selection_rule", "selection_metric"]
    assert "threads" in config_keys and "trust_remote_code" not in config_keys  # --threads fills torch_threads
    flags = {a.dest: a for a in next(a for a in build_parser()._subparsers._group_actions)
             .choices["eval"]._subparsers._group_actions[0].choices["run"]._actions}
    assert {o.key for o in EVAL_OPTIONS} <= set(flags)
    assert flags["batch_size"].default == 8 and flags["max_new_tokens"].default == 256
    assert flags["settings"].default is None and flags["settings"].nargs == "+"
    assert flags["device"].choices == ("auto", "cpu", "cuda")


def test_the_demo_file_sets_its_own_budget_and_a_sweep_defaults_to_the_stages():
    demo = load_sweep(DEMO).config.eval
    assert (demo.n_questions, demo.max_new_tokens, demo.stop_after_api_call, demo.threads) == (50, 80, True, 2)
    assert (SweepEval().n_questions, SweepEval().max_new_tokens, SweepEval().stop_after_api_call) == (None, 256, False)
    assert demo.batch_size == SweepEval().batch_size == EvalSettings().batch_size == 8


def test_a_sweep_section_written_as_a_command_parses_back_to_the_same_settings(tmp_path):
    section = SweepEval(settings=["0_shot", "oracle"], n_questions=7, batch_size=3, max_new_tokens=33,
                        stop_after_api_call=True, max_document_tokens=64, threads=2, backend="vllm",
                        dense_model=str(tmp_path), bm25_backend="bm25s", device="cuda", dtype="bfloat16")
    always = command_arguments(section, EvalSettings, EVAL_OPTIONS, policy="always")
    changed = command_arguments(section, EvalSettings, EVAL_OPTIONS, policy="changed")
    assert always == ["--settings", "0_shot", "oracle", "--batch-size", "3", "--max-new-tokens", "33"]
    assert changed == ["--n-questions", "7", "--stop-after-api-call", "--max-document-tokens", "64", "--threads", "2",
                       "--backend", "vllm", "--dense-model", str(tmp_path), "--bm25-backend", "bm25s",
                       "--device", "cuda", "--dtype", "bfloat16"]
    args = build_parser().parse_args(["eval", "run", "--checkpoint", str(tmp_path), "--hub", "torchhub",
                                      "--out", str(tmp_path / "e"), *always, *changed])
    parsed = EvalSettings(**values_from_args(args, EVAL_OPTIONS))
    assert parsed == EvalSettings(**config_values(section, EVAL_OPTIONS))
    assert parsed.torch_threads == 2 and parsed.settings == ["0_shot", "oracle"]
    # at the defaults only the always-written options appear
    assert command_arguments(SweepEval(), EvalSettings, EVAL_OPTIONS, policy="changed") == []


def test_a_new_option_is_one_field_and_one_option():
    @dataclasses.dataclass
    class Settings:
        top_p: float | None = None
        greedy: bool = True
        settings: tuple = ("a",)

    options = (Option("top_p", "--top-p", cli={"type": float}, help="nucleus sampling"),
               Option("greedy", "--greedy"), Option("settings", "--settings", cli={"choices": ("a", "b")},
                                                    command="always"))
    model = config_model("Section", Settings, options, doc="A section.", defaults={"top_p": 0.9})
    assert model().top_p == 0.9 and model().settings == ["a"]
    assert model.model_fields["top_p"].description == "nucleus sampling"
    assert command_arguments(model(settings=["b"]), Settings, options, policy="always") == ["--settings", "b"]
    assert command_arguments(model(), Settings, options, policy="changed") == ["--top-p", "0.9"]
    assert values_from_args(SimpleNamespace(top_p=0.5, greedy=False, settings=["a"]), options) == \
        {"top_p": 0.5, "greedy": False, "settings": ["a"]}
    import argparse

    with pytest.raises(ValueError, match="Settings.greedy: a flag's setting defaults to False"):
        add_arguments(argparse.ArgumentParser(), Settings, options)
    with pytest.raises(KeyError, match="no option temperature"):
        config_model("Section", Settings, options, doc="A section.", defaults={"temperature": 1.0})


def test_every_data_build_option_is_defined_once_for_the_flags_and_the_sweep(tmp_path):
    from ratune.data.build import BUILD_OPTIONS, BuildSettings
    from ratune.data.mixture import MIXTURE_OPTIONS, Mixture
    from ratune.sweep import SweepData, data_plan, expand
    from ratune.sweep.commands import data_command

    assert sorted(o.field for o in BUILD_OPTIONS) == sorted(f.name for f in dataclasses.fields(BuildSettings))
    build_keys, mixture_keys = [o.key for o in BUILD_OPTIONS], [o.key for o in MIXTURE_OPTIONS]
    assert list(SweepData.model_fields) == [*build_keys, *mixture_keys, "tokenizer", "leakage", "mixtures"]
    demo = load_sweep(DEMO)
    assert (data_plan(demo, expand(demo))["torchhub"]["max_length"], demo.config.data.max_document_tokens) == \
        (768, 128)  # the demo's cells' max_length
    assert SweepData().max_length is None and SweepData(max_length=None).max_length is None  # the cells' own
    assert (SweepData().top_k, SweepData().force_gold, SweepData().distractors) == (1, False, 3)

    data = SweepData(max_document_tokens=64, top_k=2, dense_model=str(tmp_path), bm25_backend="bm25s",
                     force_gold=True, mixture_seed=5, distractors=2, top1_retriever="dense_ft",
                     mixtures=["m:none=0.5,top1=0.5"])
    sweep = SimpleNamespace(config=SimpleNamespace(data=data, apibench=None))
    entry = {"dir": str(tmp_path / "d"), "tokenizer": "smollm2-135m-instruct", "modes": ["none", "mix-m"],
             "max_length": 512}
    cmd = data_command(sweep, "torchhub", entry)
    assert cmd[cmd.index("--max-length") + 1] == "512" and cmd[cmd.index("--top-k") + 1] == "2"
    assert cmd[cmd.index("--modes") + 1:cmd.index("--max-length")] == ["none"]
    args = build_parser().parse_args([*cmd[1:], "--out", str(tmp_path / "d")])
    assert BuildSettings(**values_from_args(args, BUILD_OPTIONS)) == BuildSettings(
        max_length=512, max_document_tokens=64, top_k=2, dense_model=str(tmp_path), bm25_backend="bm25s",
        force_gold=True)
    mixture = Mixture.parse(args.mixture[0], **values_from_args(args, MIXTURE_OPTIONS))
    assert (mixture.seed, mixture.distractors, mixture.top1_retriever) == (5, 2, "dense_ft")
