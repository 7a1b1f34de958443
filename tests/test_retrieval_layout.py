"""The retriever kinds live in their own modules (retrieval/base.py, bm25.py, dense.py,
precomputed.py, fusion.py) and ratune.retrieval.retrievers re-exports each name, so importers of
the old module keep working and get the very same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ratune.retrieval.retrievers as retrievers

#: Where each name now lives (written out by hand, not derived from the modules under test).
HOMES = {
    "ratune.retrieval.base": ("Query", "Retriever", "dedup_corpus", "NoRetriever", "OracleRetriever"),
    "ratune.retrieval.bm25": ("bm25_tokenize", "BM25_VARIANTS", "BM25_K1", "BM25_B", "BM25_EPSILON",
                              "SCORE_DECIMALS", "BM25_INDEX_FORMAT", "BM25_INDEX_METADATA", "okapi_idf",
                              "rank_scores", "BM25Retriever", "saved_index_metadata"),
    "ratune.retrieval.dense": ("RETRIEVER_METADATA_FILE", "default_dense_model", "dense_document_text",
                               "read_retriever_metadata", "check_retriever_hub", "require_finetuned_retriever",
                               "DenseRetriever"),
    "ratune.retrieval.precomputed": ("PrecomputedRetriever",),
    "ratune.retrieval.fusion": ("FusionRetriever",),
}
PAIRS = [(module, name) for module, names in HOMES.items() for name in names]


@pytest.mark.parametrize("module,name", PAIRS)
def test_name_is_reexported_as_the_same_object(module, name):
    home = importlib.import_module(module)
    assert getattr(retrievers, name) is getattr(home, name)
    assert name in retrievers.__all__


def test_all_lists_exactly_the_moved_names_and_the_factory():
    assert sorted(retrievers.__all__) == sorted([name for _, name in PAIRS] + ["make_retriever"])
    assert len(retrievers.__all__) == 27  # 5 + 12 + 7 + 1 + 1 moved, plus make_retriever
    assert not [name for name in retrievers.__all__ if name.startswith("_")]


def test_moved_names_are_defined_in_their_new_module():
    for module, names in HOMES.items():
        for name in names:
            value = getattr(importlib.import_module(module), name)
            if hasattr(value, "__module__") and callable(value):
                assert value.__module__ == module, name


def test_bm25_does_not_import_sentence_transformers():
    code = ("import sys, ratune.retrieval.bm25; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sentence_transformers', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
