"""End-to-end smoke test on a tiny model: data -> train (both arms) -> eval under every test
setting -> Table 2 files; plus the CLI contract of `ratune data build`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_pipeline_writes_valid_table2(tmp_path, apibench, tiny_model_dir, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset
    from ratune.eval.report import make_cell, write_table2
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.registry import DEFAULT_SETTINGS as SETTINGS  # what eval runs without --settings
    from ratune.train.config import TrainConfig
    from ratune.models import load_model
    from ratune.train.sft import train

    data = tmp_path / "data"
    manifest = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=data, tokenizer=smol_tokenizer,
                             tokenizer_name="tiny", modes=["none", "oracle"], progress=False,
                             settings=BuildSettings(max_length=512, max_document_tokens=96))
    assert manifest["splits"] == {"train": 837, "eval": 186}
    assert manifest["counts"]["train"]["oracle"]["rows"] == 837
    assert (data / ".complete").exists()

    cells = []
    for arm in ("none", "oracle"):
        run = tmp_path / f"train_{arm}"
        cfg = TrainConfig(model=str(tiny_model_dir), data_dir=str(data), train_retriever=arm, output_dir=str(run),
                          max_length=512, global_batch_size=4, per_device_batch_size=2, max_steps=2,
                          max_examples=8, learning_rate=1e-3, lora={"enabled": arm == "oracle", "r": 4, "alpha": 8})
        final = train(cfg)
        reloaded = load_model(final)  # the checkpoint loads back with from_pretrained
        assert reloaded.config.num_hidden_layers == 2
        run_manifest = json.loads((run / "manifest.json").read_text())
        assert run_manifest["steps"] == 2 and run_manifest["gradient_accumulation_steps"] == 2
        assert run_manifest["prompt"] == {"max_document_tokens": 96, "chat_template": None}
        assert run_manifest["versions"]["transformers"] and run_manifest["versions"]["trl"]
        results = evaluate_checkpoint(run, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / f"eval_{arm}",
                                      progress=False,
                                      settings=EvalSettings(n_questions=3, batch_size=3, max_new_tokens=8))
        assert list(results) == list(SETTINGS)
        # the eval folder has its manifest, as every stage's folder does
        ev_manifest = json.loads((tmp_path / f"eval_{arm}" / "manifest.json").read_text())
        assert ev_manifest["command"] == "eval run" and sorted(ev_manifest["cells"]) == sorted(SETTINGS)
        assert ev_manifest["versions"]["transformers"] and ev_manifest["generation"]["max_new_tokens"] == 8
        for setting, m in results.items():
            assert m["n"] == 3
            assert m["accuracy"] + m["hallucination"] + m["error"] == pytest.approx(1.0)
            lines = (tmp_path / f"eval_{arm}" / setting / "responses.jsonl").read_text().splitlines()
            assert [json.loads(x)["question_id"] for x in lines] == [1, 2, 3]
        cells += [make_cell(arm, s, m) for s, m in results.items()]

    write_table2(cells, hub="torchhub", model="tiny", out_dir=tmp_path)
    table = json.loads((tmp_path / "table2.json").read_text())
    assert table["hub"] == "torchhub" and table["model"] == "tiny"
    assert {(c["train_retriever"], c["test_retriever"]) for c in table["cells"]} == {
        (a, s) for a in ("none", "oracle") for s in SETTINGS}
    for c in table["cells"]:
        assert set(c) >= {"train_retriever", "test_retriever", "n", "accuracy", "hallucination", "error"}
        assert isinstance(c["n"], int)
    assert (tmp_path / "table2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "table2.md").read_text()
    assert "| none |" in md and "| oracle |" in md
    assert (tmp_path / "table2.csv").read_text().count("\n") == 1 + 10

    # The verdicts are real, not a constant (a scorer that answered "error" for everything would
    # pass the checks above): the same scorer counts gold answers of questions 1-3 correct on both
    # metrics and tells hallucinations from errors; and re-scoring each cell's saved responses
    # gives its metrics.json counts.
    from ratune.sources.apibench import load_examples
    from ratune.sources.prompt import format_answer
    from ratune.eval.scoring import Scorer

    scorer = Scorer.from_apibench("torchhub", apibench)
    gold = [{"question_id": e.line, "text": format_answer(e.answer)} for e in load_examples(apibench, "torchhub", "eval")[:3]]
    assert [e["question_id"] for e in gold] == [1, 2, 3]
    result = scorer.score(gold)
    assert (result["gorilla"]["correct_n"], result["strict"]["correct_n"]) == (3, 3)
    # a call of no database API is a hallucination; text with no call at all is an error (the
    # official scripts' semantics, docs/official_semantics.md)
    result = scorer.score([{"question_id": 1, "text": "<<<api_call>>>: foo.bar(1)"},
                           {"question_id": 2, "text": "<<<api_call>>>: torch.hub.load('x/y', 'zzz')"},
                           {"question_id": 3, "text": "I do not know."}])
    assert [q["gorilla"] for q in result["per_question"]] == ["hallucination", "hallucination", "error"]
    assert [q["strict"] for q in result["per_question"]] == ["hallucination", "hallucination", "error"]
    for arm in ("none", "oracle"):
        for setting in SETTINGS:
            cell = tmp_path / f"eval_{arm}" / setting
            saved = [json.loads(x) for x in (cell / "responses.jsonl").read_text().splitlines()]
            rescored = scorer.score(saved)
            metrics = json.loads((cell / "metrics.json").read_text())
            assert rescored["gorilla"]["correct_n"] == round(metrics["accuracy"] * metrics["n"]), (arm, setting)
            assert rescored["gorilla"]["hallucination_n"] == round(metrics["hallucination"] * metrics["n"])


def test_data_build_cli_json_and_bad_input(tmp_path, apibench, smol_tokenizer_dir):
    out = tmp_path / "built"
    proc = subprocess.run([sys.executable, "-m", "ratune.cli", "data", "build", "--apibench", str(apibench),
                           "--hub", "huggingface", "--out", str(out), "--tokenizer", str(smol_tokenizer_dir),
                           "--modes", "none", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["splits"] == {"eval": 911}
    assert summary["counts"]["eval"]["none"]["rows"] + summary["counts"]["eval"]["none"]["dropped"] == 911

    bad = tmp_path / "bad"
    (bad / "api").mkdir(parents=True)
    (bad / "apibench").mkdir()
    (bad / "api" / "torchhub_api.jsonl").write_text('{"domain": "D", "api_call": "f()"}\n')
    (bad / "apibench" / "torchhub_eval.json").write_text('{"code": "###Instruction: x", "api_call": "f()"}\n')
    proc = subprocess.run([sys.executable, "-m", "ratune.cli", "data", "build", "--apibench", str(bad),
                           "--hub", "torchhub", "--out", str(tmp_path / "o"), "--tokenizer", str(smol_tokenizer_dir),
                           "--modes", "none"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert f"{bad}/apibench/torchhub_eval.json:1: field 'api_data': required field is missing" in proc.stderr
    assert "Traceback" not in proc.stderr
