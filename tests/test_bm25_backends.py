"""BM25 backends (rank_bm25 and bm25s), saved indexes, and the finetuned retriever (dense_ft) as a
train-time mode and a test-time setting.

The Okapi numbers below are worked out by hand from the formula in retrieval/bm25.py
(k1 = 1.5, b = 0.75, negative idf floored at 0.25 x the mean idf).
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from ratune.sources.apibench import api_database_path, load_api_database, load_examples
from ratune.errors import RatuneError
from ratune.retrieval.bm25 import _BM25SIndex, _RankBM25Index
from ratune.retrieval.retrievers import (BM25_INDEX_METADATA, RETRIEVER_METADATA_FILE, BM25Retriever, Query,
                                         default_dense_model, make_retriever, okapi_idf, rank_scores,
                                         saved_index_metadata)

HUBS = ("torchhub", "huggingface", "tensorflowhub")
#: three documents: "a b", "a c c", "d" (avgdl = 2)
TINY = [["a", "b"], ["a", "c", "c"], ["d"]]


def test_okapi_idf_by_hand():
    idf = okapi_idf({"a": 2, "b": 1, "c": 1, "d": 1}, 3)
    rare = math.log(2.5) - math.log(1.5)  # 0.5108
    common = math.log(1.5) - math.log(2.5)  # -0.5108 < 0: replaced by the floor
    floor = 0.25 * (common + 3 * rare) / 4  # 0.0639
    assert idf["b"] == pytest.approx(rare) and idf["c"] == pytest.approx(0.5108256)
    assert idf["a"] == pytest.approx(floor) and idf["a"] == pytest.approx(0.0638532, abs=1e-6)


@pytest.mark.parametrize("index_class", [_RankBM25Index, _BM25SIndex])
def test_okapi_scores_by_hand(index_class):
    index = index_class(TINY)
    rare = math.log(2.5) - math.log(1.5)
    # query "c": only document 2 (tf 2, length 3): idf x tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))
    c_in_d2 = rare * 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 3 / 2))  # 0.6287
    scores = index.scores([["c"], ["c", "c"], ["zzz"], [], ["a", "d"]])
    assert scores.shape == (5, 3)
    np.testing.assert_allclose(scores[0], [0.0, c_in_d2, 0.0], rtol=1e-12)
    assert c_in_d2 == pytest.approx(0.62871, abs=1e-5)  # 0.5108 x 5 / 4.0625
    np.testing.assert_allclose(scores[1], 2 * scores[0], rtol=1e-12)  # a repeated query term counts twice
    np.testing.assert_array_equal(scores[2], 0.0)  # unknown term
    np.testing.assert_array_equal(scores[3], 0.0)  # empty query
    floor = 0.25 * (-rare + 3 * rare) / 4
    a_in_d1 = floor * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / 2))
    a_in_d2 = floor * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 3 / 2))
    d_in_d3 = rare * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 1 / 2))
    np.testing.assert_allclose(scores[4], [a_in_d1, a_in_d2, d_in_d3], rtol=1e-12)


@pytest.mark.parametrize("hub", HUBS)
@pytest.mark.parametrize("variant", ["bm25", "bm25_replica"])
def test_backends_rank_every_eval_question_the_same(apibench, hub, variant):
    corpus = load_api_database(api_database_path(apibench, hub))
    queries = [Query(text=e.instruction) for e in load_examples(apibench, hub, "eval")]
    reference = BM25Retriever(corpus, hub=hub, variant=variant)
    fast = BM25Retriever(corpus, hub=hub, variant=variant, backend="bm25s")
    a, b = reference.scores(queries), fast.scores(queries)
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)
    # the retriever's ranking (ties to SCORE_DECIMALS places in database order) is the guarantee:
    # raw scores of tied documents differ in their last bits between backends and, for bm25s, with
    # PYTHONHASHSEED (its vocabulary order sets the order of additions)
    assert rank_scores(b, 10) == rank_scores(a, 10)
    # and the public path returns the same documents
    assert [[d["api_call"] for d in docs] for docs in fast.retrieve(queries, top_k=10)] == \
        [[d["api_call"] for d in docs] for docs in reference.retrieve(queries, top_k=10)]
    assert fast.metadata()["backend"] == "bm25s (okapi idf)"
    assert reference.metadata()["backend"] == "rank_bm25.BM25Okapi"


_RANK_UNDER_HASH_SEED = """
import hashlib, json, sys
from ratune.sources.apibench import api_database_path, load_api_database, load_examples
from ratune.retrieval.retrievers import BM25Retriever, Query
apibench, hub = sys.argv[1], sys.argv[2]
corpus = load_api_database(api_database_path(apibench, hub))
queries = [Query(text=e.instruction) for e in load_examples(apibench, hub, "eval")]
docs = BM25Retriever(corpus, hub=hub, backend="bm25s").retrieve(queries, top_k=10)
print(hashlib.sha256(json.dumps([[d["api_call"] for d in row] for row in docs]).encode()).hexdigest())
"""


def test_bm25s_rankings_do_not_depend_on_the_hash_seed(apibench):
    """The huggingface hub has a tie at rank 10 whose raw bm25s scores change with PYTHONHASHSEED;
    the ranking must not, and must equal rank_bm25's."""
    import hashlib
    import os
    import subprocess
    import sys

    corpus = load_api_database(api_database_path(apibench, "huggingface"))
    queries = [Query(text=e.instruction) for e in load_examples(apibench, "huggingface", "eval")]
    docs = BM25Retriever(corpus, hub="huggingface").retrieve(queries, top_k=10)
    expected = hashlib.sha256(json.dumps([[d["api_call"] for d in row] for row in docs]).encode()).hexdigest()
    for seed in ("0", "1", "2"):
        out = subprocess.run([sys.executable, "-c", _RANK_UNDER_HASH_SEED, str(apibench), "huggingface"],
                             env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected, f"PYTHONHASHSEED={seed}"


def test_float_noise_ties_keep_database_order():
    noisy = 0.1 + 0.2  # 0.30000000000000004: the same sum as 0.3, added in another order
    assert np.argsort([-0.3, -noisy], kind="stable").tolist() == [1, 0]  # raw scores: noise decides
    assert rank_scores(np.array([[0.3, noisy, 0.5], [0.0, 0.0, 0.0]]), 3) == [[2, 0, 1], [0, 1, 2]]
    assert rank_scores(np.array([[0.3, 0.3 + 1e-6]]), 1) == [[1]]  # a real difference still counts


def test_unknown_backend_and_variant_are_refused(apibench):
    with pytest.raises(RatuneError, match="unknown BM25 backend 'fast'"):
        make_retriever("bm25", hub="torchhub", apibench_dir=apibench, bm25_backend="fast")
    with pytest.raises(RatuneError, match="unknown BM25 variant 'bm26'"):
        BM25Retriever([], hub="torchhub", variant="bm26")


@pytest.fixture(scope="module")
def torchhub_corpus(apibench):
    return load_api_database(api_database_path(apibench, "torchhub"))


@pytest.fixture(scope="module")
def saved_index(torchhub_corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bm25") / "torchhub_bm25"
    BM25Retriever(torchhub_corpus, hub="torchhub", variant="bm25", backend="bm25s").save(folder)
    return folder


def test_saved_index_reloads_with_the_same_rankings(apibench, torchhub_corpus, saved_index):
    meta = json.loads((saved_index / BM25_INDEX_METADATA).read_text())
    assert meta["hub"] == "torchhub" and meta["variant"] == "bm25" and meta["format"] == "ratune-bm25-index/1"
    assert meta["tokenizer"] == "lowercase \\w+" and meta["text"] == "json" and meta["k1"] == 1.5
    assert len(meta["corpus_sha256"]) == 64 and meta["n_documents"] == 94 and "bm25s" in meta["versions"]
    with np.load(saved_index / "arrays.npz", allow_pickle=False) as arrays:  # plain arrays, no pickles
        assert set(arrays.files) == {"data", "indices", "indptr"}
    loaded = make_retriever("bm25", hub="torchhub", apibench_dir=apibench, bm25_index=saved_index)
    queries = [Query(text=e.instruction) for e in load_examples(apibench, "torchhub", "eval")]
    fresh = BM25Retriever(torchhub_corpus, hub="torchhub")
    assert [[d["api_call"] for d in docs] for docs in loaded.retrieve(queries, top_k=10)] == \
        [[d["api_call"] for d in docs] for docs in fresh.retrieve(queries, top_k=10)]


def test_saved_index_refuses_another_hub_variant_or_corpus(apibench, torchhub_corpus, saved_index, tmp_path):
    with pytest.raises(RatuneError, match="built for hub 'torchhub', not 'huggingface'"):
        make_retriever("bm25", hub="huggingface", apibench_dir=apibench, bm25_index=saved_index)
    with pytest.raises(RatuneError, match="built for variant 'bm25', not 'bm25_replica'"):
        make_retriever("bm25_replica", hub="torchhub", apibench_dir=apibench, bm25_index=saved_index)
    edited = [dict(d) for d in torchhub_corpus]
    edited[0]["description"] = edited[0]["description"] + " (edited)"
    with pytest.raises(RatuneError, match="built for corpus_sha256"):
        BM25Retriever.load(saved_index, edited, hub="torchhub", variant="bm25")
    with pytest.raises(RatuneError, match="not a saved BM25 index"):
        BM25Retriever.load(tmp_path, torchhub_corpus, hub="torchhub")
    with pytest.raises(RatuneError, match="only a bm25s index can be saved"):
        BM25Retriever(torchhub_corpus, hub="torchhub").save(tmp_path / "x")
    (tmp_path / BM25_INDEX_METADATA).write_text(json.dumps({"format": "someone-else/1", "hub": "torchhub"}))
    with pytest.raises(RatuneError, match="format 'someone-else/1', expected 'ratune-bm25-index/"):
        BM25Retriever.load(tmp_path, torchhub_corpus, hub="torchhub")
    (tmp_path / BM25_INDEX_METADATA).write_text("[1, 2]")
    with pytest.raises(RatuneError, match="format 'list', expected"):
        saved_index_metadata(tmp_path)


def test_cli_index_then_eval_with_it(apibench, tmp_path, capsys):
    from ratune.cli import main

    assert main(["retrieval", "index", "--hub", "torchhub", "--out", str(tmp_path / "idx")]) == 0
    assert "indexed 94 torchhub API documents" in capsys.readouterr().out
    assert main(["retrieval", "eval", "--hub", "torchhub", "--retriever", "bm25", "--bm25-index",
                 str(tmp_path / "idx"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metadata"]["backend"] == "bm25s (okapi idf)"
    assert round(100 * result["top1"], 1) == 13.4  # docs/retrieval/retrieval.md: bm25 top-1 on TorchHub
    assert main(["retrieval", "eval", "--hub", "tensorflowhub", "--retriever", "bm25", "--bm25-index",
                 str(tmp_path / "idx")]) == 2
    assert "built for hub 'torchhub', not 'tensorflowhub'" in capsys.readouterr().err
    assert main(["retrieval", "eval", "--hub", "torchhub", "--retriever", "dense", "--bm25-index",
                 str(tmp_path / "idx")]) == 2
    assert "--bm25-index is for the BM25 retrievers" in capsys.readouterr().err


# --- the finetuned retriever as a train-time mode and a test-time setting ---------------------------

@pytest.fixture(scope="module")
def dense_ft_folder(tmp_path_factory):
    """all-MiniLM-L6-v2 marked as a TorchHub finetuned retriever (same weights, so it must rank
    exactly as the pretrained ``dense`` retriever: that checks the plumbing, not the training)."""
    folder = tmp_path_factory.mktemp("dense_ft") / "torchhub-ft"
    shutil.copytree(default_dense_model(), folder)
    (folder / RETRIEVER_METADATA_FILE).write_text(json.dumps({"hub": "torchhub", "base_model": "all-MiniLM-L6-v2"}))
    return folder


def test_data_build_trains_with_the_finetuned_retriever(apibench, smol_tokenizer, dense_ft_folder, tmp_path):
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset

    settings = BuildSettings(max_length=768, max_document_tokens=64, top_k=2, dense_model=str(dense_ft_folder),
                             bm25_backend="bm25s", force_gold=True)
    manifest = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=tmp_path / "data", tokenizer=smol_tokenizer,
                             tokenizer_name="smol", modes=["dense", "dense_ft", "bm25_replica"], settings=settings,
                             progress=False)
    ft = load_from_disk(str(tmp_path / "data" / "dense_ft"))
    dense = load_from_disk(str(tmp_path / "data" / "dense"))
    assert ft["eval"]["document_api_calls"] == dense["eval"]["document_api_calls"]
    assert all(len(c) == 2 for c in ft["eval"]["document_api_calls"])
    # force_gold applies to every retrieved mode on the train split
    train = ft["train"]
    assert all(g in calls for g, calls in zip(train["gold_api_call"], train["document_api_calls"]))
    assert manifest["counts"]["train"]["dense_ft"]["forced_gold"] == manifest["counts"]["train"]["dense"]["forced_gold"] > 0
    assert manifest["counts"]["train"]["bm25_replica"]["forced_gold"] > 0
    assert manifest["settings"]["dense_model"] == str(dense_ft_folder.resolve())
    assert manifest["retrievers"]["bm25_replica"]["backend"] == "bm25s (okapi idf)"


def test_dense_ft_mode_needs_a_finetuned_folder_of_the_hub(apibench, smol_tokenizer, dense_ft_folder, tmp_path):
    from ratune.data.build import BuildSettings, build_dataset

    def build(settings, hub="torchhub"):
        build_dataset(apibench_dir=apibench, hub=hub, out_dir=tmp_path / "d", tokenizer=smol_tokenizer,
                      tokenizer_name="smol", modes=["dense_ft"], settings=settings, progress=False, overwrite=True)

    with pytest.raises(RatuneError, match="the dense_ft mode needs the finetuned retriever folder"):
        build(BuildSettings())
    with pytest.raises(RatuneError, match="the dense_ft mode needs the finetuned retriever folder"):
        build(BuildSettings(dense_model=str(default_dense_model())))  # pretrained, not finetuned
    with pytest.raises(RatuneError, match="finetuned for hub 'torchhub', not 'huggingface'"):
        build(BuildSettings(dense_model=str(dense_ft_folder)), hub="huggingface")


def test_train_config_accepts_every_train_mode():
    from pydantic import ValidationError

    from ratune.train.config import TrainConfig

    base = {"model": "m", "hub": "torchhub", "data_dir": "d", "output_dir": "o"}
    for mode in ("dense_ft", "bm25_replica", "mix-rat_mix"):
        assert TrainConfig(**base, train_retriever=mode).train_retriever == mode
    with pytest.raises(ValidationError, match="expected one of none, oracle, bm25, bm25_replica, dense, dense_ft, hybrid, hybrid_ft or mix-NAME"):
        TrainConfig(**base, train_retriever="gpt_index")


def test_eval_runs_the_dense_ft_setting(apibench, tiny_model_dir, dense_ft_folder, tmp_path):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    def run(dense_model, out="eval", settings=("dense_ft", "dense")):
        return evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / out,
                                   progress=False, settings=EvalSettings(
                                       settings=list(settings), n_questions=2, batch_size=2, max_new_tokens=2,
                                       dense_model=dense_model, bm25_backend="bm25s"))

    with pytest.raises(RatuneError, match="the dense_ft test setting needs the finetuned retriever folder"):
        run(None)
    results = run(str(dense_ft_folder))
    assert results["dense_ft"]["retriever"]["name"] == "dense_ft" and results["dense_ft"]["n"] == 2
    identity = json.loads((tmp_path / "eval" / "dense_ft" / "identity.json").read_text())
    assert identity["retriever_model"] == str(dense_ft_folder.resolve())
    assert "retriever_model" not in json.loads((tmp_path / "eval" / "dense" / "identity.json").read_text())
    # same weights as dense, so the same prompts, so the same greedy answers
    read = lambda s: [json.loads(x)["text"] for x in (tmp_path / "eval" / s / "responses.jsonl").read_text().splitlines()]
    assert read("dense_ft") == read("dense")
    # another retriever folder for the same cell is refused
    other = tmp_path / "other-ft"
    shutil.copytree(dense_ft_folder, other)
    with pytest.raises(RatuneError, match=r"made with different settings \(retriever_model: "):
        run(str(other), settings=("dense_ft",))


def test_cli_refuses_dense_ft_without_its_folder(apibench, smol_tokenizer_dir, tiny_model_dir, tmp_path, capsys):
    from ratune.cli import main

    assert main(["data", "build", "--hub", "torchhub", "--out", str(tmp_path / "d"), "--tokenizer",
                 str(smol_tokenizer_dir), "--modes", "dense_ft"]) == 2
    assert "the dense_ft mode needs the finetuned retriever folder (--dense-model DIR" in capsys.readouterr().err
    assert main(["eval", "run", "--checkpoint", str(tiny_model_dir), "--hub", "torchhub", "--out",
                 str(tmp_path / "e"), "--settings", "constraints_dense_ft"]) == 2
    assert "the constraints_dense_ft test setting needs the finetuned retriever folder" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()  # refused before any cell was written


def test_cli_report_for_all_hubs(apibench, tmp_path, capsys):
    import matplotlib.image

    from ratune.cli import main

    assert main(["retrieval", "eval", "--hub", "all", "--retriever", "bm25", "--bm25-backend", "bm25s",
                 "--out", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == set(HUBS)
    # docs/retrieval/retrieval.md: bm25 top-1 per hub (percent): 13.4, 8.5, 5.4
    assert [round(100 * report[h]["results"][0]["top1"], 1) for h in HUBS] == [13.4, 8.5, 5.4]
    markdown = (tmp_path / "retrieval.md").read_text()
    assert all(f"Retrieval on the {h} eval set" in markdown for h in HUBS)
    assert json.loads((tmp_path / "retrieval_huggingface.json").read_text())["results"][0]["n"] == 911
    height, width, _ = matplotlib.image.imread(tmp_path / "retrieval.png").shape
    assert width > 2 * height  # one panel per hub, side by side
    assert main(["retrieval", "eval", "--hub", "all", "--dense-model", str(tmp_path)]) == 2
    assert "serves the one hub it was trained for" in capsys.readouterr().err
