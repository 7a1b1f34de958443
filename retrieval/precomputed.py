"""Precomputed retrieval: the paper's own retrieved documents (``gpt_index``, ``released_bm25``).

:class:`PrecomputedRetriever` reads the released question files (questions_{hub}_{source}.jsonl
of APIBench), parses the document the paper's retriever put in each question
(:func:`_paper_doc_keys`) and maps it back to the API-database record, so our serializer renders
it. APIBench only: a catalog has no released question files.
"""

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
