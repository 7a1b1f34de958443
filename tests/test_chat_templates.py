"""Chat templates for tokenizers without one.

A LLaMA-1-shaped tokenizer (huggyllama/llama-7b: BPE with byte fallback, ``<unk>`` 0, ``<s>`` 1,
``</s>`` 2, BOS added, no pad token, no chat template) is built by tests/conftest.py
(``build_llama1_tokenizer``, fixture ``llama1_dir``; the GPU rehearsal trains with it too) from a
vocabulary small enough to read: each line of one TorchHub row is one token (ids 259, 260, ... in
conftest's ``PIECES``), so the expected ids of the row under ``chatml`` and ``gorilla_v0`` are
written out by hand below.
"""

from __future__ import annotations

import json
import typing

import pytest

from ratune.sources.apibench import load_examples
from ratune.sources.prompt import (CHAT_TEMPLATE_NAMES, CHAT_TEMPLATES, GORILLA_V0_SYSTEM, encode_prompt,
                                format_answer, prompt_text, template_name, with_bos)
from ratune.errors import RatuneError
from ratune.data.labels import tokenize_row

from conftest import ANSWER, BOS, INSTRUCTION, NL  # the row and its tokenizer's ids (tests/conftest.py)

ANSWER_IDS = [263, NL, 264, NL, 265, NL, 266, NL, 267, NL, 268]


def _load(folder, chat_template=None):
    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_tokenizer

    return use_chat_template(load_tokenizer(folder), chat_template)


def test_the_tokenizer_is_llama1_shaped(llama1_dir):
    tok = _load(llama1_dir)
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert not tok.chat_template
    assert tok.pad_token == "</s>"  # none of its own; load_tokenizer pads with EOS
    assert json.loads((llama1_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == "LlamaTokenizerFast"
    assert tok("")["input_ids"] == [BOS]  # BOS added to plain text, no EOS
    assert tok("<<<domain>>>: Classification")["input_ids"] == [BOS, 263]  # the text's start gets "▁"
    assert tok("ASSISTANT:\n", add_special_tokens=False)["input_ids"][-1] == NL  # byte fallback, as LLaMA's 13


def test_the_row_is_torchhub_line_132(apibench):
    (example,) = [e for e in load_examples(apibench, "torchhub", "train") if e.line == 132]
    assert example.instruction == INSTRUCTION and format_answer(example.answer) == ANSWER


def test_gorilla_v0_row_token_ids(llama1_dir):
    tok = _load(llama1_dir, "gorilla_v0")
    assert prompt_text(tok, INSTRUCTION) == f"{GORILLA_V0_SYSTEM}\nUSER: {INSTRUCTION}\nASSISTANT:"
    # <s> {system} \n USER: {" Design me ... model."} \n ASSISTANT:
    assert encode_prompt(tok, INSTRUCTION) == [1, 259, 13, 260, 261, 13, 262]
    row = tokenize_row(tok, INSTRUCTION, ANSWER)
    # the answer as it comes after "ASSISTANT:": " <<<domain>>>: Classification" (the FastChat space
    # is the "▁" of 263), one token per line, then </s>
    assert row.input_ids == [1, 259, 13, 260, 261, 13, 262, 263, 13, 264, 13, 265, 13, 266, 13, 267, 13, 268, 2]
    assert row.completion_mask == [0] * 7 + [1] * 12
    assert tok.decode(row.input_ids) == f"<s> {GORILLA_V0_SYSTEM}\nUSER: {INSTRUCTION}\nASSISTANT: {ANSWER}</s>"


def test_chatml_row_token_ids(llama1_dir):
    tok = _load(llama1_dir, "chatml")
    assert prompt_text(tok, INSTRUCTION) == f"<|im_start|>user\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    # <s> <|im_start|>user \n {"Design me ... model."} <|im_end|> \n <|im_start|>assistant \n: BOS
    # leads the ChatML prompt too, before <|im_start|> (269)
    assert encode_prompt(tok, INSTRUCTION) == [1, 269, 13, 270, 271, 13, 272, 13]
    row = tokenize_row(tok, INSTRUCTION, ANSWER)
    assert row.input_ids == [1, 269, 13, 270, 271, 13, 272, 13, 263, 13, 264, 13, 265, 13, 266, 13, 267, 13, 268, 2]
    assert row.completion_mask == [0] * 8 + [1] * 12


def test_exactly_one_bos_when_a_template_writes_its_own(llama1_dir):
    tok = _load(llama1_dir)
    tok.chat_template = "{{ bos_token }}" + CHAT_TEMPLATES["chatml"].jinja
    ids = encode_prompt(tok, INSTRUCTION)
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert with_bos(tok, [1, 1, 7]) == [1, 7] and with_bos(tok, [7]) == [1, 7] and with_bos(tok, [1, 7]) == [1, 7]


def test_tokenizers_with_their_own_template_are_unchanged(smol_tokenizer):
    """SmolLM2 adds no BOS to plain text: its prompt ids are its template's, untouched, and its
    answer ids are the answer's tokens + EOS."""
    tok = smol_tokenizer
    assert template_name(tok) is None
    direct = tok.apply_chat_template([{"role": "user", "content": INSTRUCTION}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    assert encode_prompt(tok, INSTRUCTION) == list(direct)
    row = tokenize_row(tok, INSTRUCTION, ANSWER)
    assert row.input_ids == list(direct) + tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_template_names_have_one_owner():
    from ratune.cli import build_parser
    from ratune.train.config import TrainConfig

    assert CHAT_TEMPLATE_NAMES == ("chatml", "gorilla_v0", "chatml_tools")
    literal, none = typing.get_args(TrainConfig.model_fields["chat_template"].annotation)
    assert typing.get_args(literal) == CHAT_TEMPLATE_NAMES and none is type(None)
    parser = build_parser()
    sub = {a.dest: a for a in parser._subparsers._group_actions}["stage"].choices
    for stage, action in (("data", "build"), ("eval", "run")):
        actions = {a.dest: a for a in sub[stage]._subparsers._group_actions[0].choices[action]._actions}
        assert tuple(actions["chat_template"].choices) == CHAT_TEMPLATE_NAMES


def test_a_saved_tokenizer_keeps_the_template_name(llama1_dir, tmp_path):
    _load(llama1_dir, "gorilla_v0").save_pretrained(tmp_path)
    assert template_name(_load(tmp_path)) == "gorilla_v0"


def test_paper_configs_use_gorilla_v0_and_the_sweep_builds_with_it(monkeypatch):
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.config import load_config
    from ratune.train.config import TrainConfig

    root = Path(__file__).resolve().parent.parent
    for name in ("llama7b_rat_paper", "llama7b_rat_paper_lora", "llama7b_rat_paper_qlora"):
        assert load_config(TrainConfig, root / "configs" / "train" / f"{name}.yaml").chat_template == "gorilla_v0"
    monkeypatch.chdir(root)
    paper = sw.load_sweep("configs/sweeps/table2_paper.yaml")
    plan = sw.data_plan(paper, sw.expand(paper))
    cmd = sw.data_command(paper, "torchhub", plan["torchhub"])
    assert cmd[cmd.index("--chat-template") + 1] == "gorilla_v0"


# ------------------------------------------------------------------ data build, train, eval


def _build(apibench, out, tokenizer_dir, *extra):
    from ratune.cli import main

    return main(["data", "build", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(out),
                 "--tokenizer", str(tokenizer_dir), "--modes", "none", "--max-length", "4096", "--json", *extra])


def test_data_build_without_a_template_is_one_line_naming_the_flag(apibench, llama1_dir, tmp_path, capsys):
    assert _build(apibench, tmp_path / "d", llama1_dir) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ratune: error: {llama1_dir}: the tokenizer has no chat template")
    assert "give --chat-template" in err and "chatml or gorilla_v0 or chatml_tools" in err
    assert not (tmp_path / "d").exists()  # refused before the output folder is made


@pytest.fixture(scope="module")
def gorilla_data(apibench, llama1_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gorilla_data") / "data"
    assert _build(apibench, out, llama1_dir, "--chat-template", "gorilla_v0") == 0
    return out


def test_data_build_with_gorilla_v0_records_it(gorilla_data, llama1_dir):
    from datasets import load_from_disk

    manifest = json.loads((gorilla_data / "manifest.json").read_text())
    assert manifest["settings"]["chat_template"] == "gorilla_v0"
    assert manifest["counts"]["train"]["none"]["rows"] == 837
    (row,) = [r for r in load_from_disk(str(gorilla_data / "none"))["train"] if r["line"] == 132]
    assert (row["user_turn"], row["completion"]) == (INSTRUCTION, ANSWER)
    assert (row["n_prompt_tokens"], row["n_completion_tokens"]) == (7, 12)  # the ids of test_gorilla_v0_row_token_ids


def _refuse_model_loads(monkeypatch):
    import ratune.models as model

    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr("ratune.train.sft.load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("configured", ["chatml", None])
def test_training_refuses_another_template_than_the_data_before_any_model_load(
        gorilla_data, llama1_dir, tmp_path, monkeypatch, configured):
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    _refuse_model_loads(monkeypatch)
    cfg = TrainConfig(model=str(llama1_dir), data_dir=str(gorilla_data), train_retriever="none",
                      output_dir=str(tmp_path / "run"), chat_template=configured, global_batch_size=1)
    with pytest.raises(RatuneError) as err:
        train(cfg)
    shown = "chatml" if configured else "null (the tokenizer's own)"
    assert str(err.value) == (f"chat_template: {shown} in the training config, but {gorilla_data} was built with "
                              f"chat template gorilla_v0; set chat_template: gorilla_v0 or rebuild the data with "
                              f"{'--chat-template chatml' if configured else 'no --chat-template'}")
    assert not (tmp_path / "run").exists()


def test_training_cli_refusal_is_one_line(gorilla_data, llama1_dir, tmp_path, monkeypatch, capsys):
    import yaml

    from ratune.cli import main

    _refuse_model_loads(monkeypatch)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"model": str(llama1_dir), "data_dir": str(gorilla_data),
                                      "train_retriever": "none", "output_dir": str(tmp_path / "run"),
                                      "chat_template": "chatml", "global_batch_size": 1}))
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "gorilla_v0" in err and "chatml" in err


def test_training_without_any_template_names_the_config_field(llama1_dir, tmp_path, monkeypatch):
    from ratune.manifest import mark_complete
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    _refuse_model_loads(monkeypatch)
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"settings": {"max_document_tokens": None,
                                                                 "chat_template": None}}))
    mark_complete(data)
    cfg = TrainConfig(model=str(llama1_dir), data_dir=str(data), train_retriever="none",
                      output_dir=str(tmp_path / "run"), global_batch_size=1)
    with pytest.raises(RatuneError, match=r"the tokenizer has no chat template .*; set chat_template: in the "
                                          r"training config") as err:
        train(cfg)
    assert "\n" not in str(err.value)


def _checkpoint(root, llama1_dir, manifest: dict | None):
    """A run folder whose model/ holds the LLaMA-1 tokenizer (saved without a template), a
    config.json and a placeholder model.safetensors (eval checks a checkpoint has safetensors
    weights before it starts); the tests replace model loading and generation."""
    import shutil

    import torch
    from safetensors.torch import save_file

    model = root / "model"
    shutil.copytree(llama1_dir, model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"placeholder": torch.zeros(1)}, str(model / "model.safetensors"))
    if manifest is not None:
        (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _capture_prompts(monkeypatch):
    import ratune.eval.run as run

    seen = []

    def batches(backend, model, tokenizer, prompts, **kwargs):
        seen.extend(prompts)
        yield [(j, "") for j in range(len(prompts))]

    monkeypatch.setattr(run, "backend_batches", batches)
    monkeypatch.setattr(run, "load_model", lambda *a, **k: object())  # the name evaluate_checkpoint calls
    return seen


def test_eval_renders_prompts_with_the_trained_template(apibench, llama1_dir, tmp_path, monkeypatch):
    from ratune.sources.prompt import render_user_turn
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.train.layout import trained_chat_template

    run_dir = _checkpoint(tmp_path / "run", llama1_dir, {"prompt": {"max_document_tokens": None,
                                                                     "chat_template": "gorilla_v0"}})
    assert trained_chat_template(run_dir) == "gorilla_v0"
    seen = _capture_prompts(monkeypatch)
    evaluate_checkpoint(run_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                        settings=EvalSettings(settings=["0_shot"], n_questions=2, device="cpu"), progress=False)
    tok = _load(llama1_dir, "gorilla_v0")
    first = load_examples(apibench, "torchhub", "eval")[0]
    expected = encode_prompt(tok, render_user_turn(first.instruction, None, max_document_tokens=None,
                                                   count_tokens=len)[0])
    assert len(seen) == 2 and expected in seen
    for ids in seen:  # <s> {system} \n USER: ... \n ASSISTANT:
        assert ids[:4] == [BOS, 259, NL, 260] and ids[-2:] == [NL, 262] and ids.count(BOS) == 1
    identity = json.loads((tmp_path / "eval" / "0_shot" / "identity.json").read_text())
    assert identity["generation"]["chat_template"] == "gorilla_v0"


def test_eval_of_a_model_without_template_or_manifest_names_the_flag(apibench, llama1_dir, tmp_path, monkeypatch):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    run_dir = _checkpoint(tmp_path / "run", llama1_dir, None)
    seen = _capture_prompts(monkeypatch)
    with pytest.raises(RatuneError, match=r"the tokenizer has no chat template .*give --chat-template"):
        evaluate_checkpoint(run_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                            settings=EvalSettings(settings=["0_shot"], n_questions=1, device="cpu"), progress=False)
    evaluate_checkpoint(run_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                        settings=EvalSettings(settings=["0_shot"], n_questions=1, device="cpu",
                                              chat_template="chatml"), progress=False)
    assert seen[0][:3] == [BOS, 269, NL] and seen[0][-3:] == [NL, 272, NL] and seen[0].count(BOS) == 1
    identity = json.loads((tmp_path / "eval" / "0_shot" / "identity.json").read_text())
    assert identity["generation"]["chat_template"] == "chatml"
