"""The eval stage's scorer for a catalog hub: the catalog's strict metric and argument score
(:class:`ratune.catalog.scoring.CatalogScorer`, docs/catalog_scoring.md), in the shape the eval
stage writes for every hub (docs/catalogs.md#evaluation). A catalog has no ``gorilla`` metric.
"""

from __future__ import annotations

import platform
from typing import Sequence

from ratune.catalog.scoring import CatalogScorer, extract_call_text, parse_call, parse_response_calls
from ratune.errors import RatuneError

#: The metric a catalog cell reports (its top-level rates are this metric's).
CATALOG_METRIC = "strict"

#: Why a catalog cell has no ``gorilla`` block (recorded in its metrics.json and said when asked).
GORILLA_APIBENCH_ONLY = ("the gorilla metric (AST sub-tree matching, the official Gorilla metric) is defined for "
                         "the APIBench hubs only; a catalog is scored by its strict metric and argument score "
                         "(docs/catalog_scoring.md)")


class CatalogEvalScorer:
    """Scores a catalog's eval responses by question_id (the ``line`` of its eval examples).

    Raises:
        RatuneError: as :class:`ratune.catalog.scoring.CatalogScorer` (documents it cannot index).
    """

    def __init__(self, hub: str, documents: Sequence[dict], examples: Sequence):
        self.hub = hub
        self.api_database = list(documents)
        self.catalog = CatalogScorer(self.api_database)
        self._gold = {e.line: (e.api["api_name"], e.answer.api_call) for e in examples}

    @classmethod
    def from_source(cls, source) -> "CatalogEvalScorer":
        """Build it from a catalog :class:`~ratune.hubs.Hub`.

        Raises:
            RatuneError, InputError: as the source's loaders (missing or changed files, bad lines).
        """
        return cls(source.name, source.load_api_database(), source.load_examples("eval"))

    @property
    def n_questions(self) -> int:
        """Number of eval questions."""
        return len(self._gold)

    def has_question(self, question_id) -> bool:
        """Whether question_id is a line of the eval pairs (an int; bool is not one)."""
        return not isinstance(question_id, bool) and question_id in self._gold

    def check_question_id(self, question_id) -> None:
        """Raise RatuneError unless question_id is a line of the eval pairs."""
        if not self.has_question(question_id):
            raise RatuneError(f"question_id {question_id!r} is not a line of catalog {self.hub}'s eval pairs")

    def gold_api_call(self, question_id: int) -> str:
        """The gold api_call of a question (the pair's)."""
        self.check_question_id(question_id)
        return self._gold[question_id][1]

    def score_text(self, text, question_id: int):
        """The :class:`ratune.catalog.scoring.CatalogScore` of one response."""
        self.check_question_id(question_id)
        api_name, api_call = self._gold[question_id]
        return self.catalog.score_text(text, api_name, api_call)

    def names_api(self, text, api_call: str) -> bool:
        """Whether a response names the API of ``api_call`` (a catalog document's or a gold call):
        some call of the response identifies one of the documents that ``api_call`` identifies.
        Used by the document-swap experiment (:mod:`ratune.eval.swap`). No call: False."""
        try:
            wanted = set(self.catalog.index.identify(parse_call(api_call)))
        except ValueError:
            return False
        call_text = extract_call_text(text)
        calls = parse_response_calls(call_text) if call_text is not None else None
        return bool(wanted) and any(wanted & set(self.catalog.index.identify(c)) for c in calls or ())

    def score(self, responses: Sequence[dict]) -> dict:
        """Score responses (``question_id``, ``text``): ``{"hub", "n", "strict", "arguments", "parser",
        "per_question"}`` (fields: docs/catalogs.md#evaluation); fractions of n (0.0 when n is 0).

        Raises:
            RatuneError: a question_id that is not a line of the eval pairs.
        """
        counts = {"correct": 0, "hallucination": 0, "error": 0}
        args = {"required_present": 0, "values_equal": 0}
        per_question = []
        for response in responses:
            qid = response.get("question_id")
            result = self.score_text(response.get("text"), qid)
            counts[result.verdict] += 1
            args["required_present"] += result.required_present
            args["values_equal"] += result.values_equal
            per_question.append({"question_id": qid, "strict": result.verdict,
                                 "required_present": result.required_present,
                                 "values_equal": result.values_equal, "named": list(result.named)})
        n = len(responses)

        def rate(k: int) -> float:
            return k / n if n else 0.0

        strict = {"accuracy": rate(counts["correct"]), "hallucination": rate(counts["hallucination"]),
                  "error": rate(counts["error"]), "correct_n": counts["correct"],
                  "hallucination_n": counts["hallucination"], "error_n": counts["error"]}
        arguments = {**{k: rate(v) for k, v in args.items()}, **{f"{k}_n": v for k, v in args.items()}}
        return {"hub": self.hub, "n": n, "strict": strict, "arguments": arguments,
                "parser": {"python_ast": platform.python_version()}, "per_question": per_question}
