"""Test-time retrievers that give a query a document chosen against its gold API, ``swap`` and
``irrelevant`` (docs/experiments.md), drawn with ``random.Random(f"{seed}:{question_id}")`` over
sorted API identities."""

from __future__ import annotations

import random
from typing import Sequence

from ratune.sources.apibench import api_identity
from ratune.retrieval.base import Query, Retriever


#: Seed of the swap draws (recorded in the retriever metadata and so in every swap cell).
DEFAULT_SWAP_SEED = 0


class SwapRetriever(Retriever):
    """Gives each query another API's document of its gold API's domain, from ``database`` (the hub's)."""

    name = "swap"

    def __init__(self, database: Sequence[dict], seed: int = DEFAULT_SWAP_SEED):
        self.seed = seed
        self._by_domain: dict[str, dict[str, dict]] = {}
        for doc in database:
            self._by_domain.setdefault(str(doc.get("domain")), {}).setdefault(api_identity(doc), doc)

    def swapped(self, query: Query) -> dict | None:
        """The swapped-in document for a query, or None when its domain has no other API."""
        gold = query.gold or {}
        pool = self._by_domain.get(str(gold.get("domain")), {})
        others = sorted(k for k in pool if k != api_identity(gold))
        if not others:
            return None
        return pool[random.Random(f"{self.seed}:{query.question_id}").choice(others)]

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """``[[swapped document]]`` per query, ``[]`` where none exists."""
        out = []
        for q in queries:
            doc = self.swapped(q)
            out.append([doc] if doc is not None else [])
        return out

    def metadata(self) -> dict:
        return {"name": self.name, "seed": self.seed,
                "rule": "another API of the gold API's domain, random.Random(f'{seed}:{question_id}')"}


#: Seed of the irrelevant-document draws.
DEFAULT_IRRELEVANT_SEED = 0


class IrrelevantRetriever(Retriever):
    """Gives each query one document of an API from another domain."""

    name = "irrelevant"

    def __init__(self, database: Sequence[dict], seed: int = DEFAULT_IRRELEVANT_SEED):
        self.seed = seed
        self._pool: dict[str, dict] = {}
        for doc in database:
            self._pool.setdefault(api_identity(doc), doc)
        self._ids = sorted(self._pool)

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """``[[document of another domain]]`` per query (``[]`` if the hub has one domain only)."""
        out = []
        for q in queries:
            domain = (q.gold or {}).get("domain")
            others = [i for i in self._ids if self._pool[i].get("domain") != domain]
            out.append([self._pool[random.Random(f"{self.seed}:{q.question_id}").choice(others)]] if others else [])
        return out

    def metadata(self) -> dict:
        return {"name": self.name, "seed": self.seed,
                "rule": "an API of another domain, random.Random(f'{seed}:{question_id}')"}
