"""Hybrid retrieval: reciprocal-rank fusion (RRF) of several retrievers' rankings
(docs/retrieval.md#hybrid-retrievers)."""

from __future__ import annotations

import math
from typing import Sequence

from ratune.sources.apibench import api_identity
from ratune.retrieval.base import Query, Retriever

#: RRF's k (Cormack et al. 2009, who found 60 near-optimal across collections).
RRF_K = 60
#: How deep each component ranking is read; a document below all of them gets no score.
RRF_DEPTH = 100


class FusionRetriever(Retriever):
    """Reciprocal-rank fusion of ``components`` (two or more): a document (by API identity) scores
    ``fsum(1 / (k + rank))`` over the components whose top ``depth`` holds it; ties go to the one
    seen first, in component order.

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
