"""Hybrid retrieval: reciprocal-rank fusion of several retrievers' rankings.

Reciprocal-rank fusion (RRF; Cormack, Clarke and Buettcher, SIGIR 2009) scores a document by
the sum over the component rankings of ``1 / (k + rank)``, rank counted from 1, and ranks by that
score. It needs no score normalisation, so a sparse (BM25) and a dense ranking fuse without
calibration; k = 60 is the constant of that paper. The registry (ratune/registry.py) names the
fused retrievers: ``hybrid`` (bm25 + dense) and ``hybrid_ft`` (bm25 + dense_ft).
"""

from __future__ import annotations

import math
from typing import Sequence

from ratune.sources.apibench import api_identity
from ratune.retrieval.base import Query, Retriever

#: RRF's k (Cormack et al. 2009, who found 60 near-optimal across collections).
RRF_K = 60
#: How deep each component ranking is read: a document below every component's top RRF_DEPTH
#: gets no score (and is never returned ahead of one that has a score).
RRF_DEPTH = 100


class FusionRetriever(Retriever):
    """Reciprocal-rank fusion of ``components`` (see the module docstring).

    A document's score is ``sum(1 / (k + rank))`` over the components whose top ``depth`` holds
    it (summed with :func:`math.fsum`, so the order of the components never changes a score in
    its last bit). Documents are the same API when their :func:`ratune.sources.apibench.api_identity`
    is; equal scores are ordered by first appearance, reading the first component's ranking, then
    the second's, and so on, so the ranking is defined on any machine.

    Args:
        name: the registry name (``hybrid``, ``hybrid_ft``).
        components: the retrievers to fuse (at least two).
        k: RRF's constant (default RRF_K).
        depth: how many documents of each component ranking count (default RRF_DEPTH).
    Raises:
        ValueError: fewer than two components, ``k < 0`` or ``depth < 1``.
    """

    def __init__(self, name: str, components: Sequence[Retriever], *, k: int = RRF_K, depth: int = RRF_DEPTH):
        if len(components) < 2 or k < 0 or depth < 1:
            raise ValueError(f"{name}: reciprocal-rank fusion needs two or more components, k >= 0 and depth >= 1")
        self.name, self.components, self.k, self.depth = name, list(components), k, depth

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """For each query, the ``top_k`` documents of the fused ranking, best first."""
        depth = max(self.depth, top_k)
        rankings = [c.retrieve(queries, top_k=depth) for c in self.components]  # [component][query][rank]
        out = []
        for i in range(len(queries)):
            terms: dict[str, list[float]] = {}
            docs: dict[str, dict] = {}  # insertion order = first appearance
            for ranking in rankings:
                for rank, doc in enumerate(ranking[i], start=1):
                    key = api_identity(doc)
                    docs.setdefault(key, doc)
                    terms.setdefault(key, []).append(1.0 / (self.k + rank))
            order = sorted(enumerate(docs), key=lambda item: (-math.fsum(terms[item[1]]), item[0]))
            out.append([docs[key] for _, key in order[:top_k]])
        return out

    def metadata(self) -> dict:
        return {"name": self.name, "fusion": "reciprocal rank", "k": self.k, "depth": self.depth,
                "components": [c.metadata() for c in self.components]}
