"""Document utility (data/utility.py): batched answer losses equal one-at-a-time
ones, utility = loss without - loss with the document, the summary by hand, and the mixture filter."""

from __future__ import annotations

import json

import pytest

from ratune.data.mixture import Mixture, apply_utility_filter
from ratune.data.utility import answer_losses, load_utility, summarize


def direct_loss(model, tokenizer, user_turn, completion):
    """The mean answer-token cross-entropy of one unpadded row, computed independently."""
    import torch

    from ratune.data.labels import tokenize_row

    row = tokenize_row(tokenizer, user_turn, completion)
    ids = torch.tensor([row.input_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    nll = [-float(logp[t - 1, row.input_ids[t]]) for t in range(1, len(row.input_ids)) if row.completion_mask[t]]
    return sum(nll) / len(nll)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from ratune.models import load_model, load_tokenizer

    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def test_batched_losses_equal_one_at_a_time(tiny):
    model, tokenizer = tiny
    pairs = [("short?", "<<<domain>>>: a"),
             ("a much longer instruction " * 12, "<<<domain>>>: Classification\n<<<api_call>>>: x(y)"),
             ("mid " * 5, "answer " * 9)]
    batched = answer_losses(model, tokenizer, pairs, batch_size=3)
    for got, (u, c) in zip(batched, pairs):
        assert got == pytest.approx(direct_loss(model, tokenizer, u, c), abs=1e-4)


def test_summary_by_hand():
    recs = [{"mode": "bm25", "utility": u, "gold_api_call": "g", "document_api_calls": [d]}
            for u, d in [(-1.0, "x"), (0.5, "g"), (2.0, "g"), (0.0, "y"), (1.0, "g")]]
    s = summarize(recs)["bm25"]
    assert s["n"] == 5 and s["mean"] == pytest.approx(0.5) and s["share_positive"] == 0.6
    # sorted [-1, 0, 0.5, 1, 2]; nearest rank at q/100 * (5 - 1): 0.4 -> 0, 2 -> 2, 3.6 -> 4
    assert (s["p10"], s["p50"], s["p90"]) == (-1.0, 0.5, 2.0)
    assert s["right_document"] == {"n": 3, "mean": pytest.approx(3.5 / 3)}
    assert s["wrong_document"] == {"n": 2, "mean": -0.5}


def test_filter_by_hand(tmp_path):
    m = Mixture.parse("m:oracle=0.5,top1=0.25,distractors=0.25", top1_retriever="bm25")
    keep = {(1, "oracle"): False, (2, "oracle"): True, (3, "bm25"): False}
    docs = [[{"api_call": "a"}], [{"api_call": "b"}], [{"api_call": "c"}], [{"api_call": "d"}, {"api_call": "e"}],
            [{"api_call": "f"}]]
    new_docs, comps, stats = apply_utility_filter(m, [1, 2, 3, 4, 5], docs,
                                                  ["oracle", "oracle", "top1", "distractors", "oracle"], keep)
    assert comps == ["none_low_utility", "oracle", "none_low_utility", "distractors", "oracle"]
    assert new_docs[0] == [] and new_docs[2] == [] and new_docs[1] == docs[1] and new_docs[3] == docs[3]
    assert stats == {"filtered": 2, "unmeasured": 1}  # line 5 was not measured

    bad = tmp_path / "u.jsonl"
    bad.write_text('{"line": 1, "mode": "oracle", "utility": 0.2}\n{"line": 2, "mode": "oracle"}\n')
    from ratune.errors import InputError

    with pytest.raises(InputError, match=r"u.jsonl:2: field 'utility'"):
        load_utility(bad, min_utility=0.0)


def test_cli_utility_then_filtered_mixture(tmp_path, apibench, tiny_model_dir, tiny, capsys):
    from datasets import load_from_disk

    from ratune.cli import main

    model, tokenizer = tiny
    data = tmp_path / "data"
    common = ["--apibench", str(apibench), "--hub", "torchhub", "--tokenizer", str(tiny_model_dir),
              "--max-length", "1024", "--max-document-tokens", "48"]
    assert main(["data", "build", *common, "--out", str(data), "--modes", "none", "oracle"]) == 0
    out = tmp_path / "utility"
    assert main(["data", "utility", "--data", str(data), "--modes", "oracle", "--model", str(tiny_model_dir),
                 "--out", str(out), "--max-examples", "6", "--threads", "1"]) == 0
    assert "oracle   n    6" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "utility.jsonl").open()]
    assert len(records) == 6 and {r["mode"] for r in records} == {"oracle"}
    none_rows = {r["line"]: r for r in load_from_disk(str(data / "none"))["train"]}
    oracle_rows = {r["line"]: r for r in load_from_disk(str(data / "oracle"))["train"]}
    first = records[0]
    assert first["utility"] == pytest.approx(first["loss_without"] - first["loss_with"])
    row, row_doc = none_rows[first["line"]], oracle_rows[first["line"]]
    assert first["loss_without"] == pytest.approx(direct_loss(model, tokenizer, row["user_turn"], row["completion"]),
                                                  abs=1e-4)
    assert first["loss_with"] == pytest.approx(direct_loss(model, tokenizer, row_doc["user_turn"],
                                                           row_doc["completion"]), abs=1e-4)
    summary = json.loads((out / "utility.json").read_text())
    assert summary["modes"]["oracle"]["n"] == 6 and (out / "utility.png").stat().st_size > 0

    # a threshold above every measured utility: each measured oracle draw loses its document
    threshold = max(r["utility"] for r in records) + 1.0
    mixed = tmp_path / "mixed"
    assert main(["data", "build", *common, "--out", str(mixed), "--modes", "--mixture", "gold:oracle=1",
                 "--utility-file", str(out / "utility.jsonl"), "--min-utility", str(threshold)]) == 0
    manifest = json.loads((mixed / "manifest.json").read_text())
    filt = manifest["mixtures"]["mix-gold"]["utility_filter"]
    assert filt["filtered"] == 6 and filt["min_utility"] == threshold
    assert filt["unmeasured"] == manifest["counts"]["train"]["mix-gold"]["rows"] - 6
    rows = {r["line"]: r for r in load_from_disk(str(mixed / "mix-gold"))["train"]}
    for r in records:
        assert rows[r["line"]]["doc_component"] == "none_low_utility"
        assert rows[r["line"]]["user_turn"] == none_rows[r["line"]]["user_turn"]
    assert main(["data", "build", *common, "--out", str(tmp_path / "x"), "--utility-file",
                 str(out / "utility.jsonl")]) == 2
    assert "--utility-file filters a --mixture's documents and needs --min-utility" in capsys.readouterr().err
    assert main(["data", "build", *common, "--out", str(tmp_path / "y"), "--mixture", "gold:oracle=1",
                 "--min-utility", "0.1"]) == 2  # was silently ignored
    assert ("--min-utility is a threshold on --utility-file's measurements; give --utility-file too"
            in capsys.readouterr().err)
    assert not (tmp_path / "y").exists()
