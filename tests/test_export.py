"""`ratune export`: a tiny LoRA run (1 step) exported, reloaded with from_pretrained and compared
greedy answer by greedy answer with the checkpoint; model card metadata; the hub push intercepted
(no network); the token never written; the vocabulary check."""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
from pathlib import Path

import pytest

from ratune.errors import RatuneError

BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAKE_TOKEN = "hf_FAKE_SECRET_123"


@pytest.fixture(scope="module")
def run(tmp_path_factory, apibench, tiny_model_dir, smol_tokenizer):
    """A complete `ratune train` run folder: tiny Llama, oracle mode, LoRA r=4, one step."""
    from ratune.data.build import BuildSettings, build_dataset
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    root = tmp_path_factory.mktemp("export_run")
    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=root / "data", tokenizer=smol_tokenizer,
                  tokenizer_name="tiny", modes=["oracle"], progress=False,
                  settings=BuildSettings(max_length=512, max_document_tokens=64))
    cfg = TrainConfig(model=str(tiny_model_dir), data_dir=str(root / "data"), train_retriever="oracle",
                      output_dir=str(root / "run"), max_length=512, global_batch_size=2, per_device_batch_size=2,
                      max_steps=1, max_examples=4, learning_rate=5e-2, warmup_ratio=0.0,
                      lr_scheduler="constant",  # the one step must move the weights
                      lora={"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    train(cfg)
    return root


def _prompts(root: Path, tokenizer, n: int = 3) -> list[list[int]]:
    from datasets import load_from_disk

    from ratune.sources.prompt import encode_prompt

    rows = load_from_disk(str(root / "data" / "oracle"))["eval"].select(range(n))
    return [encode_prompt(tokenizer, r["user_turn"]) for r in rows]


def _answers(folder: Path, prompts) -> list[str]:
    from all_answers import generate_all
    from ratune.models import load_model, load_tokenizer

    return generate_all(load_model(folder), load_tokenizer(folder), prompts, batch_size=3, max_new_tokens=12)


def _table2(path: Path) -> Path:
    from ratune.eval.report import make_cell, write_table2

    cells = [make_cell("oracle", "0_shot", {"n": 4, "accuracy": 0.25, "hallucination": 0.5, "error": 0.25}),
             make_cell("oracle", "bm25", {"n": 4, "accuracy": 0.75, "hallucination": 0.0, "error": 0.25}),
             make_cell("none", "0_shot", {"n": 4, "accuracy": 0.0, "hallucination": 1.0, "error": 0.0})]
    write_table2(cells, hub="torchhub", model="tiny", out_dir=path)
    return path / "table2.json"


def _listing(folder: Path) -> set[str]:
    """The names directly inside ``folder``, hidden ones included (temporary siblings start with '.')."""
    return {p.name for p in folder.iterdir()}


def _bound(real, *args, **kwargs):
    """Bind a fake's call to the real third-party function's signature: a keyword (or argument
    count) the real API does not accept raises TypeError here, as it would there."""
    return inspect.signature(real).bind(*args, **kwargs).arguments


def _all_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_export_reloads_same_answers_and_card(run, tmp_path, smol_tokenizer):
    from huggingface_hub import ModelCard
    from transformers import GenerationConfig

    from ratune.export.checkpoint import export_checkpoint

    table2 = _table2(tmp_path / "report")
    before = _listing(tmp_path)
    out = export_checkpoint(run / "run", tmp_path / "exported", table2=table2, base_model=BASE_ID)
    assert out == tmp_path / "exported"
    # only the export itself is new beside it: no temporary sibling (export/checkpoint.py writes into
    # ratune.io.temp_folder's unique ".ratune-tmp.XXXXXXXX.exported") and no lock file is left
    assert before == {"report"} and _listing(tmp_path) == {"report", "exported"}
    files = set(_all_bytes(out))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md",
            "ratune_export.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    assert "ratune_manifest.json" not in files and "manifest.json" not in files  # local paths stay home

    prompts = _prompts(run, smol_tokenizer)
    expected = _answers(run / "run" / "model", prompts)
    assert _answers(out, prompts) == expected
    assert any(expected), "the tiny model should generate something"

    gen = GenerationConfig.from_pretrained(out)
    assert gen.eos_token_id == smol_tokenizer.eos_token_id and gen.pad_token_id is not None
    assert gen.do_sample is False

    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    assert data["base_model"] == BASE_ID and data["license"] == "apache-2.0"
    assert data["library_name"] == "transformers" and data["datasets"] == ["gorilla-llm/APIBench"]
    assert {"ratune", "gorilla", "api-calling", "retriever-aware-training", "train-retriever-oracle"} <= set(
        data["tags"])
    assert [r.metric_value for r in card.data.eval_results] == [0.25, 0.75]
    text = card.text
    assert "train-time retrieval `oracle`" in text and "| learning rate | 0.05" in text
    assert "| global batch | 2 = 2 per device x 1 accumulation x 1 processes |" in text
    assert "1 optimizer step (max_steps 1)" in text and "rank 4, alpha 8" in text
    assert "| max length | 512 tokens (documents cut to 64) |" in text
    data_inputs = json.loads((run / "data" / "manifest.json").read_text())["inputs"]
    for name, sha in data_inputs.items():
        assert f"| {name} | `{sha}` |" in text
    assert "| 0_shot | 25.0 [" in text and "| bm25 | 75.0 [" in text and "| 4 |" in text
    assert "100.0" not in text.split("## Results")[1].split("## Export")[0]  # the `none` row is not this run's
    meta = json.loads((out / "ratune_export.json").read_text())
    assert meta["vocabulary"] == {"embedding_rows": len(smol_tokenizer), "tokenizer_length": len(smol_tokenizer)}

    # the folder is refused as a target once it holds something
    with pytest.raises(RatuneError, match="exists and is not empty"):
        export_checkpoint(run / "run", out)


def test_merge_lora_from_adapter_gives_same_answers(run, tmp_path, smol_tokenizer, tiny_model_dir):
    from ratune.export.checkpoint import export_checkpoint

    assert (run / "run" / "adapter" / "adapter_config.json").exists()
    out = export_checkpoint(run / "run", tmp_path / "merged", merge_lora=True)
    prompts = _prompts(run, smol_tokenizer, n=2)
    trained = _answers(run / "run" / "model", prompts)
    assert _answers(out, prompts) == trained
    assert _answers(tiny_model_dir, prompts) != trained  # the adapter did change the model: merging mattered
    meta = json.loads((out / "ratune_export.json").read_text())
    assert meta["source"]["merged_lora_at_export"] is True
    assert meta["base_model"] is None  # a local base folder is not a hub id


def test_push_is_intercepted_and_token_never_written(run, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    from ratune.export.checkpoint import export_checkpoint

    sent = {}
    # the real methods (huggingface_hub's validate_hf_hub_args wrapper keeps their signatures)
    real_create, real_upload = HfApi.create_repo, HfApi.upload_folder

    def fake_create_repo(self, *args, **kw):
        call = _bound(real_create, self, *args, **kw)  # TypeError on a keyword create_repo lacks
        call.pop("self")
        sent["create"] = {"call": call, "api_token": self.token}
        return f"https://huggingface.co/{call['repo_id']}"

    def fake_upload_folder(self, *args, **kw):
        call = _bound(real_upload, self, *args, **kw)  # upload_folder's arguments are keyword-only
        call.pop("self")
        folder = Path(call["folder_path"])
        sent["upload"] = {"call": call, "api_token": self.token,
                          "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))}

    monkeypatch.setattr(HfApi, "create_repo", fake_create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", fake_upload_folder)
    # the fakes refuse what the real API refuses
    with pytest.raises(TypeError, match="privat"):
        HfApi(token="x").create_repo("a/b", privat=True)
    with pytest.raises(TypeError):
        HfApi(token="x").upload_folder("a/b", folder_path=str(tmp_path))  # repo_id is keyword-only
    assert sent == {}
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    out = export_checkpoint(run / "run", tmp_path / "pushed", push_to_hub="someone/ratune-tiny-oracle",
                            private=True, base_model=BASE_ID)
    # exactly the arguments export/checkpoint.py push_folder passes (defaults left out by bind)
    assert sent["create"]["call"] == {"repo_id": "someone/ratune-tiny-oracle", "private": True, "exist_ok": True,
                                      "repo_type": "model"}
    # the folder being built, before it is swapped in: a push cut short leaves no export to refuse the rerun
    uploaded = Path(sent["upload"]["call"].pop("folder_path"))
    assert uploaded.parent == out.parent and uploaded.name.startswith(".ratune-tmp.") and not uploaded.exists()
    assert sent["upload"]["call"] == {"repo_id": "someone/ratune-tiny-oracle", "repo_type": "model",
                                      "commit_message": "Upload model exported by ratune"}
    # the token reaches the hub through HfApi(token=...) only
    assert sent["create"]["api_token"] == FAKE_TOKEN and sent["upload"]["api_token"] == FAKE_TOKEN
    assert {"README.md", "model.safetensors", "config.json", "generation_config.json",
            "tokenizer.json"} <= set(sent["upload"]["files"])
    for name, content in _all_bytes(out).items():
        assert FAKE_TOKEN.encode() not in content, name



def test_a_refused_push_keeps_the_export_and_an_interrupted_one_leaves_none(tiny_model_dir, tmp_path, monkeypatch,
                                                                           capsys):
    from huggingface_hub import HfApi

    from ratune.cli import main

    def upload(error):
        def upload_folder(self, **kw):
            raise error
        return upload_folder

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: f"https://huggingface.co/{repo_id}")
    argv = ["export", str(tiny_model_dir), "--push-to-hub", "someone/tiny", "--base-model", BASE_ID, "--out"]
    monkeypatch.setattr(HfApi, "upload_folder", upload(RuntimeError("503 Service Unavailable")))
    assert main([*argv, str(tmp_path / "refused")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ratune")]
    assert err == [f"ratune: error: push to someone/tiny failed (RuntimeError: 503 Service Unavailable); the export "
                   f"is kept in {tmp_path / 'refused'}"]
    assert (tmp_path / "refused" / "model.safetensors").is_file()
    monkeypatch.setattr(HfApi, "upload_folder", upload(KeyboardInterrupt()))
    assert main([*argv, str(tmp_path / "interrupted")]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refused"]  # no export, no temporary sibling, no lock

def test_push_without_token_fails_before_any_work(run, tmp_path, monkeypatch, capsys):
    import huggingface_hub
    from huggingface_hub import HfApi

    from ratune.boundary import run_guarded
    from ratune.export.checkpoint import add_export_arguments, cli_export

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    assert huggingface_hub.get_token() is None

    def boom(*a, **k):
        raise AssertionError("the hub must not be called")

    monkeypatch.setattr(HfApi, "create_repo", boom)
    monkeypatch.setattr(HfApi, "upload_folder", boom)
    import ratune.models as model_module

    monkeypatch.setattr(model_module, "load_model", boom)  # nothing may be loaded either
    monkeypatch.setattr("ratune.export.merge.load_model", boom)  # (export calls it by this name)

    parser = add_export_arguments(argparse.ArgumentParser())
    args = parser.parse_args([str(run / "run"), "--out", str(tmp_path / "x"), "--push-to-hub", "someone/m",
                              "--private"])
    before = _listing(tmp_path)
    assert run_guarded(lambda: cli_export(args)) == 2
    assert "no Hugging Face token" in capsys.readouterr().err
    # nothing was written beside --out: no x, no temporary sibling of any name, no lock file
    assert _listing(tmp_path) == before and "x" not in before

    args = parser.parse_args([str(run / "run"), "--out", str(tmp_path / "y"), "--private"])
    assert run_guarded(lambda: cli_export(args)) == 2
    assert "--private only applies with --push-to-hub" in capsys.readouterr().err


def test_vocabulary_added_without_resize_is_refused(tiny_model_dir, tmp_path, smol_tokenizer):
    from transformers import AutoTokenizer

    from ratune.export.checkpoint import export_checkpoint
    from ratune.export.checks import check_vocabulary

    folder = tmp_path / "grown"
    shutil.copytree(tiny_model_dir, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"pad_token": "<|new_pad|>"})
    tok.save_pretrained(folder)
    n = len(smol_tokenizer)
    before = _listing(tmp_path)
    with pytest.raises(RatuneError, match=rf"has {n} embedding rows but the tokenizer has {n + 1} tokens"):
        export_checkpoint(folder, tmp_path / "out")
    # refused before anything was saved: no out, no temporary sibling of any name, the lock released
    assert _listing(tmp_path) == before == {"grown"}

    # padding rows are fine only when the base model had them (not resized during training)
    class Fake:
        def __init__(self, rows):
            import torch

            self.emb = torch.nn.Embedding(rows, 2)

        def get_input_embeddings(self):
            return self.emb

        def get_output_embeddings(self):
            return None

    assert check_vocabulary(Fake(n + 64), smol_tokenizer, base_rows=n + 64)["embedding_rows"] == n + 64
    with pytest.raises(RatuneError, match=rf"{n + 64} embedding rows .* {n} tokens, and the base model had {n}"):
        check_vocabulary(Fake(n + 64), smol_tokenizer, base_rows=n)


def test_eval_dirs_give_the_row_and_foreign_cells_are_refused(tmp_path):
    from ratune.io import write_json
    from ratune.export.checkpoint import _table2_cells

    model = tmp_path / "run" / "model"
    model.mkdir(parents=True)
    cell = tmp_path / "eval" / "oracle"
    write_json(cell / "metrics.json", {"n": 5, "accuracy": 0.4, "hallucination": 0.4, "error": 0.2})
    write_json(cell / "identity.json", {"checkpoint": str(model.resolve()), "hub": "torchhub"})
    (cell / ".complete").write_text("complete\n")
    (tmp_path / "eval" / "bm25").mkdir()  # unfinished: skipped, never shown as zero
    cells, hub = _table2_cells("none", None, [tmp_path / "eval"], model)
    assert hub == "torchhub" and [(c["test_retriever"], c["n"], c["correct_n"]) for c in cells] == [("oracle", 5, 2)]
    with pytest.raises(RatuneError, match="measured on"):
        _table2_cells("none", None, [tmp_path / "eval"], tmp_path / "other")


@pytest.mark.parametrize("table, line", [
    ({"hub": "torchhub", "cells": [{"train_retriever": "none", "test_retriever": "oracle", "n": 10, "accuracy": 2.0}]},
     "field 'cells[0]': not a Table 2 cell (k = 20 exceeds n = 10)"),
    ({"hub": "torchhub", "cells": [{"train_retriever": "none", "test_retriever": "oracle", "n": "10"}]},
     "field 'cells[0].n': expected the number of questions"),
    ({"hub": "torchhub", "cells": [{"train_retriever": "none", "n": 10}]},
     "field 'cells[0].test_retriever': missing or not a string"),
    ({"hub": "torchhub", "cells": [3]}, "field 'cells[0]': expected a JSON object, got int"),
    ([1], "expected a JSON object, got list"),
])
def test_export_refuses_a_hand_edited_table2_in_one_line(tmp_path, capsys, table, line):
    """A --table2 file whose cells give no interval is refused before any model loads, naming the cell."""
    from ratune.cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "ratune_manifest.json").write_text(json.dumps({"config": {"train_retriever": "none"}}))
    table2 = tmp_path / "table2.json"
    table2.write_text(json.dumps(table))
    assert main(["export", str(model), "--out", str(tmp_path / "exported"), "--table2", str(table2)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ratune: error: {table2}: {line}") and len(err.splitlines()) == 1
