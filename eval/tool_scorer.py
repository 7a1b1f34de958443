"""The eval stage's scorer for a tool set's eval rows: the answer's calls (read by its answer
format's ``parse_calls``) against the row's calls; verdicts: docs/function_calling.md#scoring-a-tool-set."""

from __future__ import annotations

import json
from typing import Sequence

from ratune.errors import RatuneError
from ratune.sources.formats import PythonCallsFormat

#: The metric a tool-set cell reports.
TOOL_SET_METRIC = "strict"
#: The kinds of reference answer a tool-set cell counts apart: one call or more, and none (``[]``).
ANSWER_KINDS = ("call", "no_call")


def _canonical(value):
    """``value`` with integral floats as ints, for comparing arguments."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def call_key(call: dict) -> str:
    """A call as comparable text: its name and canonical arguments as sorted JSON."""
    return json.dumps([call["name"], _canonical(call["arguments"])], sort_keys=True, ensure_ascii=False)


class ToolSetScorer:
    """Scores a tool set's eval responses by question_id (the row's line in ``eval.jsonl``);
    ``tool_names``: every tool of the set; ``answer_format`` None: ``python_calls``."""

    def __init__(self, hub: str, tool_names: Sequence[str], examples: Sequence, answer_format=None):
        self.hub, self.tool_names = hub, set(tool_names)
        self._gold = {e.line: sorted(call_key(c) for c in e.calls) for e in examples}
        self._format = answer_format or PythonCallsFormat()

    @property
    def n_questions(self) -> int:
        return len(self._gold)

    def has_question(self, question_id) -> bool:
        return not isinstance(question_id, bool) and question_id in self._gold

    def verdict(self, text, question_id: int) -> tuple[str, list[dict] | None]:
        """``(correct | hallucination | error, the decoded calls or None)``.

        Raises:
            RatuneError: a question_id that is not a line of the eval rows.
        """
        if not self.has_question(question_id):
            raise RatuneError(f"question_id {question_id!r} is not a line of tool set {self.hub}'s eval rows")
        calls = self._format.parse_calls(text) if isinstance(text, str) else None
        if calls is not None and sorted(call_key(c) for c in calls) == self._gold[question_id]:
            return "correct", calls
        if calls is not None and any(c["name"] not in self.tool_names for c in calls):
            return "hallucination", calls
        return "error", calls

    def score(self, responses: Sequence[dict]) -> dict:
        """Score responses (``question_id``, ``text``): ``{"hub", "n", "strict", "calls", "parser",
        "per_question"}``; fractions of n (0.0 when n is 0). ``calls["by_answer"]`` splits the
        questions by their reference answer: ``call`` (one call or more) and ``no_call`` (``[]``),
        each ``{"n", "correct_n"}``."""
        counts = {"correct": 0, "hallucination": 0, "error": 0}
        by_answer = {kind: {"n": 0, "correct_n": 0} for kind in ANSWER_KINDS}
        decoded = calling = 0
        per_question = []
        for response in responses:
            verdict, calls = self.verdict(response.get("text"), response.get("question_id"))
            counts[verdict] += 1
            kind = by_answer["call" if self._gold[response["question_id"]] else "no_call"]
            kind["n"] += 1
            kind["correct_n"] += verdict == "correct"
            decoded += calls is not None
            calling += bool(calls)
            per_question.append({"question_id": response.get("question_id"), "strict": verdict,
                                 "calls": None if calls is None else len(calls)})
        n = len(responses)

        def rate(k: int) -> float:
            return k / n if n else 0.0

        strict = {"accuracy": rate(counts["correct"]), "hallucination": rate(counts["hallucination"]),
                  "error": rate(counts["error"]), **{f"{k}_n": v for k, v in counts.items()}}
        return {"hub": self.hub, "n": n, "strict": strict,
                "calls": {"format_adherence": rate(decoded), "call_rate": rate(calling), "decoded_n": decoded,
                          "calling_n": calling, "by_answer": by_answer},
                "parser": self._format.parser_record(), "per_question": per_question}
