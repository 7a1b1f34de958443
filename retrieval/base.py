"""The retriever interface every retriever implements: :class:`Query` in, ranked API documents
out (retrieval/retrievers.py and retrieval/fusion.py implement it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Query:
    """A retrieval query.

    Attributes:
        text: the instruction.
        gold: the gold API document (needed by ``oracle``; used by metrics).
        question_id: the paper's question id (line in the eval file; needed by precomputed
            retrievers).
    """

    text: str
    gold: dict | None = None
    question_id: int | None = None


class Retriever:
    """Base class: subclasses implement :meth:`retrieve`."""

    name = "base"

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """Return, for each query, up to ``top_k`` documents, best first."""
        raise NotImplementedError

    def metadata(self) -> dict:
        """What identifies this retriever's index (recorded in manifests)."""
        return {"name": self.name}
