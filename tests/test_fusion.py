"""The hybrid retrievers: reciprocal-rank fusion (retrieval/fusion.py), usable wherever a
retriever is."""

from __future__ import annotations

import pytest

from ratune.retrieval.base import Query, Retriever
from ratune.retrieval.fusion import FusionRetriever


def _doc(name: str) -> dict:
    return {"api_call": f"lib.{name}()", "api_name": name}


class Ranked(Retriever):
    """A stand-in component returning a fixed ranking for every query."""

    def __init__(self, name: str, ranking: list[str]):
        self.name, self.ranking, self.asked = name, ranking, []

    def retrieve(self, queries, top_k=1):
        self.asked.append(top_k)
        return [[_doc(n) for n in self.ranking[:top_k]] for _ in queries]


def _names(docs):
    return [d["api_name"] for d in docs]


def test_scores_are_summed_reciprocal_ranks():
    """Worked by hand with k = 60: d1 = 1/61 + 1/62, d3 = 1/63 + 1/61, d2 = 1/62, d4 = 1/63."""
    a, b = Ranked("a", ["d1", "d2", "d3"]), Ranked("b", ["d3", "d1", "d4"])
    fused = FusionRetriever("hybrid", [a, b])
    assert _names(fused.retrieve([Query("q")], top_k=4)[0]) == ["d1", "d3", "d2", "d4"]
    assert _names(fused.retrieve([Query("q")], top_k=2)[0]) == ["d1", "d3"]
    assert a.asked == [100, 100]  # each component is read RRF_DEPTH deep, whatever top_k is
    assert fused.metadata() == {"name": "hybrid", "fusion": "reciprocal rank", "k": 60, "depth": 100,
                                "components": [{"name": "a"}, {"name": "b"}]}


def test_ties_go_to_the_first_appearance():
    """x = 1/61 + 1/62 and y = 1/62 + 1/61 are the same float (fsum); x is seen first in a's
    ranking, so it wins; with the components swapped, y does."""
    a, b = Ranked("a", ["x", "y"]), Ranked("b", ["y", "x"])
    assert _names(FusionRetriever("h", [a, b]).retrieve([Query("q")], top_k=2)[0]) == ["x", "y"]
    assert _names(FusionRetriever("h", [b, a]).retrieve([Query("q")], top_k=2)[0]) == ["y", "x"]


def test_depth_and_k_bound_what_counts():
    """depth 1: only each component's first document scores (1/(k+1) each, a tie: a's first
    wins); a document below the depth never scores. k = 0: ranks 1 and 2 weigh 1 and 1/2."""
    a, b = Ranked("a", ["d1", "d2"]), Ranked("b", ["d3", "d2"])
    assert _names(FusionRetriever("h", [a, b], depth=1).retrieve([Query("q")])[0]) == ["d1"]
    # top_k 3 reads 3 deep: d2 = 1/2 + 1/2 = 1 ties d1 = 1 (first seen wins), d3 = 1
    assert _names(FusionRetriever("h", [a, b], k=0, depth=1).retrieve([Query("q")], top_k=3)[0]) == ["d1", "d2", "d3"]
    with pytest.raises(ValueError, match="two or more components"):
        FusionRetriever("h", [a])
    with pytest.raises(ValueError, match="depth >= 1"):
        FusionRetriever("h", [a, b], depth=0)


def test_the_same_api_from_two_components_is_one_document():
    """Components return their own dict objects; one API (same api_call identity) is fused once."""
    a, b = Ranked("a", ["d1"]), Ranked("b", ["d1"])
    out = FusionRetriever("h", [a, b]).retrieve([Query("q"), Query("r")], top_k=5)
    assert [_names(docs) for docs in out] == [["d1"], ["d1"]]


def test_hybrid_is_a_retriever_a_train_mode_and_a_test_setting(apibench):
    """Through the registry only: make_retriever builds it from its components, the data builder
    and the eval stage take its name, and on TorchHub it ranks the gold API first more often
    than the weaker of its components (measured: docs/retrieval/retrieval_torchhub.md)."""
    from ratune.sources.apibench import load_examples
    from ratune.registry import RETRIEVED_MODES, TABLE_SETTINGS, TRAIN_MODES
    from ratune.retrieval.metrics import evaluate_retriever
    from ratune.retrieval.retrievers import make_retriever
    from ratune.train.config import TrainConfig

    assert "hybrid" in TRAIN_MODES and "hybrid" in RETRIEVED_MODES and "hybrid" in TABLE_SETTINGS
    assert TrainConfig(model="m", data_dir="d", train_retriever="hybrid", output_dir="o").train_retriever == "hybrid"
    hybrid = make_retriever("hybrid", hub="torchhub", apibench_dir=apibench)
    assert isinstance(hybrid, FusionRetriever)
    assert [c["name"] for c in hybrid.metadata()["components"]] == ["bm25", "dense"]
    examples = load_examples(apibench, "torchhub", "eval")
    top1 = {name: evaluate_retriever(make_retriever(name, hub="torchhub", apibench_dir=apibench), examples)["top1"]
            for name in ("bm25", "dense")}
    fused = evaluate_retriever(hybrid, examples)
    assert fused["n"] == 186 and fused["top1"] > min(top1.values())
    with pytest.raises(Exception, match="hybrid_ft retriever needs the finetuned model folder"):
        make_retriever("hybrid_ft", hub="torchhub", apibench_dir=apibench)
