"""The retriever interface (:class:`Query` in, ranked API documents out), :func:`dedup_corpus`, and
the retrievers that need no index: ``none`` and ``oracle``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ratune.sources.apibench import api_identity
from ratune.errors import RatuneError


@dataclass(frozen=True)
class Query:
    """A retrieval query: the instruction, its gold API document (``oracle``, metrics), the eval
    file line (precomputed retrievers) and, for a tool set's row, its offered tools (``oracle``)."""

    text: str
    gold: dict | None = None
    question_id: int | None = None
    documents: tuple | None = None

    @classmethod
    def of(cls, example) -> "Query":
        """The query of an :class:`~ratune.sources.apibench.Example`."""
        return cls(text=example.instruction, gold=example.api, question_id=example.line,
                   documents=tuple(example.tools) or None)


class Retriever:
    """Base class: subclasses implement :meth:`retrieve`."""

    name = "base"

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """Return, for each query, up to ``top_k`` documents, best first."""
        raise NotImplementedError

    def metadata(self) -> dict:
        """What identifies this retriever's index (recorded in manifests)."""
        return {"name": self.name}


def dedup_corpus(docs: Sequence[dict]) -> list[dict]:
    """The API documents with one entry per API identity, first occurrence kept, order kept."""
    seen, out = set(), []
    for doc in docs:
        key = api_identity(doc)
        if key not in seen:
            seen.add(key)
            out.append(doc)
    return out


class NoRetriever(Retriever):
    """0-shot: no document for any query."""

    name = "none"

    def retrieve(self, queries, top_k=1):
        return [[] for _ in queries]


class OracleRetriever(Retriever):
    """The gold document of each query (Gorilla's "Oracle" setting); a tool-set row's own tools."""

    name = "oracle"

    def retrieve(self, queries, top_k=1):
        out = []
        for q in queries:
            if q.documents is not None:
                out.append(list(q.documents))
                continue
            if q.gold is None:
                raise RatuneError("the oracle retriever needs each query's gold API document")
            out.append([q.gold])
        return out
