"""Okapi BM25 over API documents with rank-bm25's BM25Okapi scores, two backends with the same
rankings, and saved indexes (docs/retrieval.md#bm25-backends-and-saved-indexes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ratune.sources.prompt import serialize_document
from ratune.errors import RatuneError
from ratune.io import read_json, write_json
from ratune.manifest import BM25_INDEX_STAGE, package_versions
from ratune.output import StageOutput
from ratune.registry import BM25_BACKENDS, DEFAULT_BM25_BACKEND, unknown_name
from ratune.retrieval.base import Query, Retriever, dedup_corpus


_TOKEN = re.compile(r"\w+")


def bm25_tokenize(text: str) -> list[str]:
    """BM25 tokenisation: lower-case word characters (``\\w+``). Recorded in index metadata."""
    return _TOKEN.findall(text.lower())


#: Per variant: the text indexed, the tokenizer, deduplication (docs/retrieval.md#bm25-variants).
BM25_VARIANTS = {
    "bm25": {"text": "json", "tokenizer": "lowercase \\w+", "dedup": True},
    "bm25_replica": {"text": "python_repr", "tokenizer": "whitespace", "dedup": False},
}
#: Okapi k1, b and idf floor epsilon: rank-bm25's BM25Okapi defaults, as the paper's LangChain retriever.
BM25_K1, BM25_B, BM25_EPSILON = 1.5, 0.75, 0.25

#: BM25 scores are compared at this many decimal places when ranking (:func:`rank_scores`).
SCORE_DECIMALS = 9

#: Format tag of a saved BM25 index folder (:meth:`BM25Retriever.save`).
BM25_INDEX_FORMAT = "ratune-bm25-index/1"
BM25_INDEX_METADATA = "ratune_bm25_index.json"


def okapi_idf(document_frequencies: dict[str, int], n_documents: int) -> dict[str, float]:
    """Okapi idf per term as rank-bm25 0.2.2's BM25Okapi: ``log(N - df + 0.5) - log(df + 0.5)``, a
    negative one replaced by ``BM25_EPSILON x mean idf``; ``document_frequencies`` in first-occurrence order."""
    import math

    idf, negative, total = {}, [], 0.0
    for term, df in document_frequencies.items():
        value = math.log(n_documents - df + 0.5) - math.log(df + 0.5)
        idf[term] = value
        total += value
        if value < 0:
            negative.append(term)
    floor = BM25_EPSILON * total / max(len(idf), 1)
    for term in negative:
        idf[term] = floor
    return idf


def _bm25_corpus(corpus: Sequence[dict], variant: str) -> list[dict]:
    """The documents a BM25 variant indexes (deduplicated or not), in database order."""
    return dedup_corpus(corpus) if BM25_VARIANTS[variant]["dedup"] else list(corpus)


def _bm25_texts(docs: Sequence[dict], variant: str) -> list[str]:
    """The text a BM25 variant indexes per document: compact JSON or Python ``str(dict)``."""
    render = serialize_document if BM25_VARIANTS[variant]["text"] == "json" else str
    return [render(d) for d in docs]


def _texts_sha256(texts: Sequence[str]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def rank_scores(scores, top_k: int) -> list[list[int]]:
    """Document indices of the ``top_k`` best scores per row of ``scores`` (queries x docs); scores
    equal to SCORE_DECIMALS places are ties, kept in database order."""
    import numpy as np

    return [[int(i) for i in np.argsort(-np.round(row, SCORE_DECIMALS), kind="stable")[:top_k]] for row in scores]


class _RankBM25Index:
    """rank-bm25's BM25Okapi: the reference implementation, one query at a time."""

    name = "rank_bm25"

    def __init__(self, documents: list[list[str]]):
        from rank_bm25 import BM25Okapi

        self._bm25 = BM25Okapi(documents, k1=BM25_K1, b=BM25_B, epsilon=BM25_EPSILON)

    def scores(self, queries: list[list[str]]):
        import numpy as np

        return np.stack([self._bm25.get_scores(q) for q in queries]) if queries else np.zeros((0, 0))


class _BM25SIndex:
    """bm25s's sparse index with rank-bm25's Okapi scores, queries scored as one sparse product: built
    with ATIRE term frequencies (BM25Okapi's) and the always-positive Lucene idf, each term's column
    then rescaled to :func:`okapi_idf`."""

    name = "bm25s"

    def __init__(self, documents: list[list[str]] | None = None, *, state: dict | None = None):
        import numpy as np

        if state is not None:
            self.vocab = {t: i for i, t in enumerate(state["vocab"])}
            self.data, self.indices, self.indptr = state["data"], state["indices"], state["indptr"]
            self.n_documents = int(state["n_documents"])
            return
        import itertools
        import math

        import bm25s

        index = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="atire", idf_method="lucene", dtype="float64",
                           int_dtype="int64")
        index.index(documents, create_empty_token=False, show_progress=False)
        self.n_documents = len(documents)
        data, indptr = np.array(index.scores["data"], dtype=np.float64), np.asarray(index.scores["indptr"])
        # a column's length is the term's document frequency; okapi_idf wants first-occurrence order
        column_lengths = np.diff(indptr)
        first_occurrence = dict.fromkeys(itertools.chain.from_iterable(documents))
        df = {term: int(column_lengths[index.vocab_dict[term]]) for term in first_occurrence}
        idf = okapi_idf(df, self.n_documents)
        ids = np.fromiter(index.vocab_dict.values(), dtype=np.int64)
        terms = list(index.vocab_dict)
        factor = np.empty(len(terms))
        for term, i in zip(terms, ids):
            lucene = math.log(1 + (self.n_documents - df[term] + 0.5) / (df[term] + 0.5))
            factor[i] = idf[term] / lucene
        data *= np.repeat(factor, np.diff(indptr))
        self.vocab = {t: int(i) for t, i in zip(terms, ids)}
        self.data, self.indices, self.indptr = data, np.asarray(index.scores["indices"]), indptr

    def state(self) -> dict:
        """Arrays and vocabulary to save (no pickles: numpy arrays and a list of strings)."""
        vocab = [""] * len(self.vocab)
        for term, i in self.vocab.items():
            vocab[i] = term
        return {"vocab": vocab, "data": self.data, "indices": self.indices, "indptr": self.indptr,
                "n_documents": self.n_documents}

    def scores(self, queries: list[list[str]], chunk: int = 256):
        import numpy as np
        from scipy.sparse import csc_matrix, csr_matrix

        matrix = csc_matrix((self.data, self.indices, self.indptr), shape=(self.n_documents, len(self.vocab)))
        out = np.zeros((len(queries), self.n_documents))
        for start in range(0, len(queries), chunk):
            rows, cols, counts = [], [], []
            for r, query in enumerate(queries[start:start + chunk]):
                for term in query:  # a repeated query term counts once per occurrence, as in rank-bm25
                    if term in self.vocab:
                        rows.append(r)
                        cols.append(self.vocab[term])
                        counts.append(1.0)
            n = min(chunk, len(queries) - start)
            q = csr_matrix((counts, (rows, cols)), shape=(n, len(self.vocab)))  # duplicates are summed
            out[start:start + n] = (q @ matrix.T).toarray()
        return out


class BM25Retriever(Retriever):
    """Okapi BM25 over the hub's API documents ``corpus``, for ``variant`` (a key of BM25_VARIANTS)
    with ``backend`` (one of BM25_BACKENDS).

    Raises:
        RatuneError: unknown variant or backend, or an empty corpus.
    """

    def __init__(self, corpus: Sequence[dict], *, hub: str, variant: str = "bm25", backend: str = DEFAULT_BM25_BACKEND,
                 _index=None):
        if variant not in BM25_VARIANTS:
            raise RatuneError(unknown_name("BM25 variant", variant, tuple(BM25_VARIANTS)))
        if backend not in BM25_BACKENDS:
            raise RatuneError(f"unknown BM25 backend {backend!r}: expected one of {', '.join(BM25_BACKENDS)}")
        self.name, self.hub, self.variant, self.backend = variant, hub, BM25_VARIANTS[variant], backend
        self.corpus = _bm25_corpus(corpus, variant)
        if not self.corpus:
            raise RatuneError(f"{hub}: an empty API database; BM25 has no document to index")
        self._tokenize = bm25_tokenize if self.variant["tokenizer"].startswith("lowercase") else str.split
        if _index is not None:
            self._index = _index
        else:
            documents = [self._tokenize(text) for text in self.document_texts()]
            self._index = _BM25SIndex(documents) if backend == "bm25s" else _RankBM25Index(documents)

    def document_texts(self) -> list[str]:
        """The text indexed per document (the variant's rendering), in corpus order."""
        return _bm25_texts(self.corpus, self.name)

    def corpus_sha256(self) -> str:
        """sha256 of the indexed texts (in order): what a saved index is checked against."""
        return _texts_sha256(self.document_texts())

    def scores(self, queries: Sequence[Query]):
        """BM25 scores, shape ``(len(queries), len(self.corpus))``, float64."""
        return self._index.scores([self._tokenize(q.text) for q in queries])

    def retrieve(self, queries, top_k=1):
        return [[self.corpus[i] for i in order] for order in rank_scores(self.scores(queries), top_k)]

    def metadata(self):
        backend = "rank_bm25.BM25Okapi" if self.backend == "rank_bm25" else "bm25s (okapi idf)"
        return {"name": self.name, "hub": self.hub, **self.variant, "backend": backend,
                "k1": BM25_K1, "b": BM25_B, "epsilon": BM25_EPSILON, "corpus_size": len(self.corpus)}

    def save(self, out_dir: str | Path) -> Path:
        """Write the bm25s index to ``out_dir`` (``arrays.npz`` and BM25_INDEX_METADATA), replacing
        only an earlier saved index.

        Raises:
            RatuneError: the rank_bm25 backend; ``out_dir`` a file or a non-empty folder not an index.
            LockHeld: another process is writing ``out_dir``.
        """
        import numpy as np

        if self.backend != "bm25s":
            raise RatuneError("only a bm25s index can be saved (rank_bm25's would need pickle); "
                              "use --bm25-backend bm25s")
        out = Path(out_dir)
        state = self._index.state()
        with StageOutput(out, BM25_INDEX_STAGE, replace=True).writing() as tmp:
            np.savez(tmp / "arrays.npz", data=state["data"], indices=state["indices"], indptr=state["indptr"])
            write_json(tmp / BM25_INDEX_METADATA, {
                "format": BM25_INDEX_FORMAT, **self.metadata(), "variant": self.name,
                "corpus_sha256": self.corpus_sha256(), "n_documents": state["n_documents"], "vocab": state["vocab"],
                "versions": package_versions()})
        return out

    @classmethod
    def load(cls, index_dir: str | Path, corpus: Sequence[dict], *, hub: str, variant: str = "bm25"
             ) -> "BM25Retriever":
        """Load an index written by :meth:`save`.

        Raises:
            RatuneError: no index there, another format, or a mismatch (naming the field and both values).
        """
        import numpy as np

        path = Path(index_dir) / BM25_INDEX_METADATA
        meta = saved_index_metadata(index_dir)
        if variant not in BM25_VARIANTS:
            raise RatuneError(unknown_name("BM25 variant", variant, tuple(BM25_VARIANTS)))
        texts = _bm25_texts(_bm25_corpus(corpus, variant), variant)
        expected = {"hub": hub, "variant": variant, **BM25_VARIANTS[variant], "k1": BM25_K1, "b": BM25_B,
                    "epsilon": BM25_EPSILON, "corpus_sha256": _texts_sha256(texts)}
        for key, value in expected.items():
            if meta.get(key) != value:
                raise RatuneError(f"{path}: this index was built for {key} {meta.get(key)!r}, not {value!r}; "
                                  "rebuild it with `ratune retrieval index`")
        with np.load(Path(index_dir) / "arrays.npz", allow_pickle=False) as arrays:
            state = {k: arrays[k] for k in ("data", "indices", "indptr")}
        index = _BM25SIndex(state={**state, "vocab": meta["vocab"], "n_documents": meta["n_documents"]})
        return cls(corpus, hub=hub, variant=variant, backend="bm25s", _index=index)


def saved_index_metadata(index_dir: str | Path) -> dict:
    """The metadata (BM25_INDEX_METADATA) of an index folder written by :meth:`BM25Retriever.save`.

    Raises:
        RatuneError: the folder holds no index metadata, or its format is not this version's.
    """
    path = Path(index_dir) / BM25_INDEX_METADATA
    if not path.exists():
        raise RatuneError(f"{index_dir}: not a saved BM25 index (no {BM25_INDEX_METADATA})")
    meta = read_json(path)
    if not isinstance(meta, dict) or meta.get("format") != BM25_INDEX_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise RatuneError(f"{path}: format {found!r}, expected {BM25_INDEX_FORMAT!r}")
    return meta
