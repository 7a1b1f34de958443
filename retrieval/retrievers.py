"""Retrievers: query text in, ranked API documents out; :func:`make_retriever` builds one by name.

All retrievers share one interface, :meth:`Retriever.retrieve`, that takes a batch of
:class:`Query` and returns, per query, up to ``top_k`` API documents (dicts from the hub's API
database) best first. The corpus is the hub's API database with duplicate APIs removed (same
:func:`~ratune.sources.apibench.api_identity`; the first occurrence in file order is kept), so a
top-k list never repeats an API.

The names and what each is live in one registry, :mod:`ratune.registry` (RETRIEVERS); this
module builds each kind (:func:`make_retriever`) and re-exports the names of the modules that
implement them:

- retrieval/base.py: the interface (:class:`Query`, :class:`Retriever`), :func:`dedup_corpus`,
  ``none`` (:class:`NoRetriever`, 0-shot) and ``oracle`` (:class:`OracleRetriever`, the gold
  document);
- retrieval/bm25.py: the BM25 variants ``bm25`` and ``bm25_replica`` (rank-bm25 or bm25s; see
  BM25_VARIANTS), :class:`BM25Retriever` and its saved index;
- retrieval/dense.py: ``dense`` (sentence-transformers, all-MiniLM-L6-v2 offline) and ``dense_ft``
  (a bi-encoder finetuned on one hub's training split by :mod:`ratune.retrieval.finetune`; needs
  the model folder, and refuses a folder trained for another hub), :class:`DenseRetriever`;
- retrieval/precomputed.py: ``gpt_index`` and ``released_bm25`` (the paper's own retrieved
  documents, read from the released question files and mapped back to database records, so our
  serializer renders them), :class:`PrecomputedRetriever`;
- retrieval/fusion.py: the hybrid retrievers, :class:`FusionRetriever`.
"""

from __future__ import annotations

from pathlib import Path

from ratune.hubs import Hub, resolve_hub
from ratune.errors import RatuneError
from ratune.registry import BM25_BACKENDS, DEFAULT_BM25_BACKEND, RETRIEVERS, unknown_name
from ratune.retrieval.base import NoRetriever, OracleRetriever, Query, Retriever, dedup_corpus
from ratune.retrieval.bm25 import (BM25_B, BM25_EPSILON, BM25_INDEX_FORMAT, BM25_INDEX_METADATA, BM25_K1,
                                   BM25_VARIANTS, SCORE_DECIMALS, BM25Retriever, _BM25SIndex, _RankBM25Index,
                                   bm25_tokenize, okapi_idf, rank_scores, saved_index_metadata)
from ratune.retrieval.dense import (RETRIEVER_METADATA_FILE, DenseRetriever, check_retriever_hub,
                                    default_dense_model, dense_document_text, read_retriever_metadata,
                                    require_finetuned_retriever)
from ratune.retrieval.fusion import FusionRetriever
from ratune.retrieval.precomputed import PrecomputedRetriever

__all__ = [
    # retrieval/base.py
    "Query", "Retriever", "dedup_corpus", "NoRetriever", "OracleRetriever",
    # retrieval/bm25.py (the two index classes are private; tests/test_bm25_backends.py imports them here)
    "bm25_tokenize", "BM25_VARIANTS", "BM25_K1", "BM25_B", "BM25_EPSILON", "SCORE_DECIMALS", "BM25_INDEX_FORMAT",
    "BM25_INDEX_METADATA", "okapi_idf", "rank_scores", "BM25Retriever", "saved_index_metadata", "_RankBM25Index",
    "_BM25SIndex",
    # retrieval/dense.py
    "RETRIEVER_METADATA_FILE", "default_dense_model", "dense_document_text", "read_retriever_metadata",
    "check_retriever_hub", "require_finetuned_retriever", "DenseRetriever",
    # retrieval/precomputed.py
    "PrecomputedRetriever",
    # retrieval/fusion.py
    "FusionRetriever",
    # this module
    "make_retriever",
]


def make_retriever(name: str, *, hub: str | Hub, apibench_dir=None, dense_model: str | Path | None = None,
                   bm25_backend: str = DEFAULT_BM25_BACKEND, bm25_index: str | Path | None = None) -> Retriever:
    """Build a retriever by name (a key of ratune/registry.py RETRIEVERS) over the hub's API
    database, by the kind its registry entry names.

    Args:
        hub: an APIBench hub name (documents from ``apibench_dir``), a catalog folder, or a
            :class:`~ratune.hubs.Hub` (:func:`ratune.hubs.resolve_hub`); its name
            is the ``hub`` of the retriever's metadata.
        apibench_dir: the APIBench folder, for an APIBench hub name.
        dense_model: the sentence-transformers folder for ``dense`` (default all-MiniLM-L6-v2) and
            ``dense_ft`` (required: a folder written by ``ratune retrieval train``).
        bm25_backend: for the BM25 variants, one of BM25_BACKENDS (same rankings).
        bm25_index: for the BM25 variants, a folder written by ``ratune retrieval index`` to load
            instead of indexing (implies the bm25s backend).

    Raises:
        RatuneError: for an unknown name (a renamed one names its new spelling) or backend;
            ``dense_ft`` without ``dense_model`` or with a folder that is not a finetuned
            retriever; a finetuned folder or saved BM25 index made for another hub (or, for the
            index, another variant or corpus); a precomputed retriever (``gpt_index``,
            ``released_bm25``) on a catalog, which has no released documents (APIBench only);
            an unknown hub or a folder that is not a catalog (:func:`~ratune.hubs.resolve_hub`).
    """
    if bm25_backend not in BM25_BACKENDS:
        raise RatuneError(unknown_name("BM25 backend", bm25_backend, BM25_BACKENDS))
    if name not in RETRIEVERS:
        raise RatuneError(unknown_name("retriever", name, tuple(RETRIEVERS)))
    spec = RETRIEVERS[name]
    # the hub's folder is looked for only when its documents are read (none and oracle need none)
    source = resolve_hub(hub, apibench_dir, locate=False)
    hub_name, hub_ref = source.name, source.ref
    if spec.needs_model:
        if dense_model is None:
            raise RatuneError(f"the {name} retriever needs the finetuned model folder (dense_model); "
                              f"make one with `ratune retrieval train --hub {hub_ref} --out DIR`")
        if read_retriever_metadata(dense_model) is None:
            raise RatuneError(f"{dense_model}: not a ratune finetuned retriever (no {RETRIEVER_METADATA_FILE}); "
                              f"use the dense retriever for a plain sentence-transformers folder")
        check_retriever_hub(dense_model, hub_name)  # fail before reading the corpus
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
