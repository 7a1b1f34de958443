"""Precomputed retrieval: the paper's own retrieved documents (``gpt_index``, ``released_bm25``),
read from APIBench's released question files (docs/pipeline.md#retrieval)."""

from __future__ import annotations

import json
import re
from typing import Sequence

from ratune.sources.apibench import api_identity, questions_path
from ratune.errors import RatuneError
from ratune.io import iter_jsonl
from ratune.registry import RETRIEVERS
from ratune.retrieval.base import Retriever


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
    """The paper's top-1 documents from questions_{hub}_{source}.jsonl, each mapped back to the
    database record with its api_call identity, else with its api_name when one API has it (an
    older HuggingFace database); ``mapped_by_name`` and ``unmapped`` list those question ids."""

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
