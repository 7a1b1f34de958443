"""Build a retriever by name (:func:`make_retriever`); re-exports the names of the modules that
implement each kind (docs/pipeline.md#retrieval, names in ratune/registry.py RETRIEVERS)."""

from __future__ import annotations

from pathlib import Path

from ratune.hubs import Hub, resolve_hub
from ratune.errors import RatuneError
from ratune.registry import BM25_BACKENDS, DEFAULT_BM25_BACKEND, RETRIEVERS, unknown_name
from ratune.retrieval.base import NoRetriever, OracleRetriever, Query, Retriever, dedup_corpus
from ratune.retrieval.bm25 import (BM25_B, BM25_EPSILON, BM25_INDEX_FORMAT, BM25_INDEX_METADATA, BM25_K1,
                                   BM25_VARIANTS, SCORE_DECIMALS, BM25Retriever, bm25_tokenize, okapi_idf,
                                   rank_scores, saved_index_metadata)
from ratune.retrieval.dense import (RETRIEVER_METADATA_FILE, DenseRetriever, check_retriever_hub,
                                    default_dense_model, dense_document_text, read_retriever_metadata,
                                    require_finetuned_retriever)
from ratune.retrieval.fusion import FusionRetriever
from ratune.retrieval.precomputed import PrecomputedRetriever

__all__ = [
    "Query", "Retriever", "dedup_corpus", "NoRetriever", "OracleRetriever",
    "bm25_tokenize", "BM25_VARIANTS", "BM25_K1", "BM25_B", "BM25_EPSILON", "SCORE_DECIMALS", "BM25_INDEX_FORMAT",
    "BM25_INDEX_METADATA", "okapi_idf", "rank_scores", "BM25Retriever", "saved_index_metadata",
    "RETRIEVER_METADATA_FILE", "default_dense_model", "dense_document_text", "read_retriever_metadata",
    "check_retriever_hub", "require_finetuned_retriever", "DenseRetriever",
    "PrecomputedRetriever",
    "FusionRetriever",
    "make_retriever",
]


def make_retriever(name: str, *, hub: str | Hub, apibench_dir=None, dense_model: str | Path | None = None,
                   bm25_backend: str = DEFAULT_BM25_BACKEND, bm25_index: str | Path | None = None) -> Retriever:
    """Build retriever ``name`` (a key of RETRIEVERS) over the hub's API database.

    Args:
        hub: an APIBench hub name, a catalog folder or a :class:`~ratune.hubs.Hub`.
        apibench_dir: the APIBench folder, for an APIBench hub name.
        dense_model: sentence-transformers folder for ``dense`` (optional) and ``dense_ft`` (required).
        bm25_backend: one of BM25_BACKENDS; bm25_index: a saved index folder to load instead.
    Raises:
        RatuneError: unknown name, backend or hub; ``dense_ft`` without a finetuned model; an index or
            model made for another hub; a precomputed retriever on a hub without released documents.
    """
    if bm25_backend not in BM25_BACKENDS:
        raise RatuneError(unknown_name("BM25 backend", bm25_backend, BM25_BACKENDS))
    if name not in RETRIEVERS:
        raise RatuneError(unknown_name("retriever", name, tuple(RETRIEVERS)))
    spec = RETRIEVERS[name]
    source = resolve_hub(hub, apibench_dir, locate=False)
    hub_name, hub_ref = source.name, source.ref
    if spec.needs_model:
        if dense_model is None:
            raise RatuneError(f"the {name} retriever needs the finetuned model folder (dense_model); "
                              f"make one with `ratune retrieval train --hub {hub_ref} --out DIR`")
        if read_retriever_metadata(dense_model) is None:
            raise RatuneError(f"{dense_model}: not a ratune finetuned retriever (no {RETRIEVER_METADATA_FILE}); "
                              f"use the dense retriever for a plain sentence-transformers folder")
        check_retriever_hub(dense_model, hub_name)
    if spec.kind == "precomputed" and not source.has_precomputed:
        raise RatuneError(f"the {name} retriever is APIBench only: it replays the paper's released documents "
                          f"(questions_{{hub}}_{spec.source}.jsonl), and {source.kind} {hub_name} has none; use bm25, "
                          "dense or oracle")
    if spec.kind == "none":
        return NoRetriever()
    if spec.kind == "oracle":
        return OracleRetriever()
    corpus = source.load_api_database()
    if spec.kind == "bm25":
        if bm25_index is not None:
            return BM25Retriever.load(bm25_index, corpus, hub=hub_name, variant=name)
        return BM25Retriever(corpus, hub=hub_name, variant=name, backend=bm25_backend)
    if spec.kind == "dense":
        return DenseRetriever(corpus, hub=hub_name, model=dense_model)
    if spec.kind == "fusion":
        return FusionRetriever(name, [make_retriever(c, hub=source, dense_model=dense_model,
                                                     bm25_backend=bm25_backend) for c in spec.components])
    return PrecomputedRetriever(corpus, hub=hub_name, apibench_dir=source.root, name=name)
