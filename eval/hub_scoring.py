"""Scoring by hub: what eval, ``eval score`` and ``compare`` do with a hub's answers, one class per
scorer a hub names (:attr:`ratune.hubs.Hub.scorer`, the key of :data:`HUB_SCORINGS`). A scorer may
run in another process: callers use only :meth:`HubScoring.score` and the fields it returns.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from functools import cached_property
from typing import ClassVar

from ratune.hubs import Hub
from ratune.errors import InputError, RatuneError
from ratune.eval.catalog_scorer import CATALOG_METRIC, GORILLA_APIBENCH_ONLY, CatalogEvalScorer
from ratune.eval.scoring.cli import format_table, outcome_lines
from ratune.eval.scoring.responses import check_hub_matches, check_question_ids, load_responses
from ratune.eval.scoring.scorer import Scorer
from ratune.eval.stats import count_rates
from ratune.eval.tool_scorer import TOOL_SET_METRIC, ToolSetScorer
from ratune.io import read_json_object
from ratune.sources.apibench import load_api_database
from ratune.sources.formats import answer_format_of, get_answer_format


class HubScoring(ABC):
    """A hub's scorer (``self.scorer``: ``score``, ``n_questions``, ``names_api``, ``hub``) and what
    its metric set decides; ``answer_format``: the one the answers are written in (None: the hub's own)."""

    #: The metrics with correct / hallucination / error blocks, the headline metric first.
    metrics: ClassVar[tuple[str, ...]]

    def __init__(self, hub: Hub, examples=None, answer_format=None):
        self.hub = hub
        self._examples = examples
        self.answer_format = answer_format or get_answer_format(hub.answer_format)

    @cached_property
    def scorer(self):
        """The scorer, built when first used (so a refused metric reads no file)."""
        return self._make_scorer(self.hub, self._examples)

    @abstractmethod
    def _make_scorer(self, hub: Hub, examples):
        """The scorer object."""

    @property
    def main_metric(self) -> str:
        """The metric of a cell's top-level rates and of ``compare`` by default."""
        return self.metrics[0]

    def require_metric(self, metric: str, fix: str = "use") -> None:
        """Refuse a metric the hub is not scored by (``fix``: the verb of the way out)."""
        if metric not in self.metrics:
            raise RatuneError(f"--metric {metric}: not a metric of hub {self.hub.name} (its metrics: "
                              f"{', '.join(self.metrics)})")

    @abstractmethod
    def load_responses(self, path: str | os.PathLike, *, hub_check: bool = True) -> list[dict]:
        """A response file's lines, checked against the hub's questions (and, where the kind can
        tell, that they were written for this hub).

        Raises:
            RatuneError, InputError: naming the file and line.
        """

    def score(self, responses: list[dict]) -> dict:
        """The scorer's result (``n``, a block per metric, ``parser``, ``per_question``, ...)."""
        return self.scorer.score(responses)

    def cell_fields(self, scored: dict) -> dict:
        """The fields a cell's metrics.json adds for this kind of scoring."""
        return {}

    def summary(self, result: dict, metric: str = "both") -> dict:
        """``result`` without ``per_question`` and, for one ``metric``, without the other metrics' blocks."""
        out = {k: v for k, v in result.items() if k != "per_question"}
        if metric in self.metrics:
            for other in self.metrics:
                if other != metric:
                    out.pop(other, None)
        return out

    @abstractmethod
    def format_table(self, result: dict, metric: str, source: str) -> str:
        """``ratune eval score``'s text: counts and percentages per metric."""


def _lines_of(scorer, path, questions: str) -> list[dict]:
    """A response file whose every question_id is a line of ``questions`` (1..n of ``scorer``).

    Raises:
        InputError: naming the file, the line and the question_id.
    """
    responses = load_responses(path)
    for r in responses:
        if not scorer.has_question(r["question_id"]):
            raise InputError(os.fspath(path), r["line"], "question_id",
                             f"question_id {r['question_id']} is not a line of {questions} (1..{scorer.n_questions})")
    return responses


class APIBenchScoring(HubScoring):
    """The official ``gorilla`` metric (headline) and ``strict`` (docs/scoring.md)."""

    metrics = ("gorilla", "strict")

    def _make_scorer(self, hub, examples):
        if examples and examples[0].split != "eval":  # held-out training questions, numbered 1..n
            return Scorer(hub.name, load_api_database(hub.api_database_file), [e.api for e in examples])
        return Scorer.from_apibench(hub.name, hub.root)

    def load_responses(self, path, *, hub_check=True):
        responses = load_responses(path)
        if hub_check:
            check_hub_matches(self.scorer.hub, responses, self.scorer, path=path)
        check_question_ids(responses, self.scorer.n_questions, path=path)
        return responses

    def format_table(self, result, metric, source):
        return format_table(result, metric, source=source)


class CatalogScoring(HubScoring):
    """A catalog's ``strict`` metric and argument score (docs/catalog_scoring.md); no ``gorilla``."""

    metrics = (CATALOG_METRIC,)

    def _make_scorer(self, hub, examples):
        if examples is None:
            return CatalogEvalScorer.from_source(hub)
        return CatalogEvalScorer(hub.name, hub.load_api_database(), examples)

    def require_metric(self, metric, fix="use"):
        if metric == "gorilla":
            raise RatuneError(f"--metric gorilla: {GORILLA_APIBENCH_ONLY}; {fix} --metric strict")
        super().require_metric(metric, fix)

    def load_responses(self, path, *, hub_check=True):
        return _lines_of(self.scorer, path, f"catalog {self.scorer.hub}'s eval pairs")

    def cell_fields(self, scored):
        args_n = {k: scored["arguments"][f"{k}_n"] for k in ("required_present", "values_equal")}
        return {"metric": CATALOG_METRIC, "hub_kind": self.hub.kind, "catalog": self.hub.manifest_record(),
                "arguments": count_rates(args_n, scored["n"]), "gorilla_unavailable": GORILLA_APIBENCH_ONLY}

    def format_table(self, result, metric, source):
        n, arguments = result["n"], result["arguments"]
        return "\n".join([
            f"catalog {result['hub']}, {n} responses ({source})", *outcome_lines(result, ["strict"]),
            f"arguments: required present {arguments['required_present_n']} ({100 * arguments['required_present']:.2f}%), "
            f"values equal {arguments['values_equal_n']} ({100 * arguments['values_equal']:.2f}%) of {n}",
            "(no gorilla metric: it is APIBench's)"])


class ToolSetScoring(HubScoring):
    """A tool set's ``strict`` call match and its call-format rates (eval/tool_scorer.py); no ``gorilla``."""

    metrics = (TOOL_SET_METRIC,)

    def _make_scorer(self, hub, examples):
        examples = hub.load_examples("eval") if examples is None else examples
        return ToolSetScorer(hub.name, [t["name"] for t in hub.load_api_database()], examples, self.answer_format)

    def require_metric(self, metric, fix="use"):
        if metric == "gorilla":
            raise RatuneError(f"--metric gorilla: the gorilla metric is APIBench's; a tool set is scored by its call "
                              f"match; {fix} --metric strict")
        super().require_metric(metric, fix)

    def load_responses(self, path, *, hub_check=True):
        return _lines_of(self.scorer, path, f"tool set {self.scorer.hub}'s eval rows")

    def cell_fields(self, scored):
        return {"metric": TOOL_SET_METRIC, "hub_kind": self.hub.kind, "tool_set": self.hub.manifest_record(),
                "calls": scored["calls"]}

    def format_table(self, result, metric, source):
        calls = result["calls"]
        return "\n".join([
            f"tool set {result['hub']}, {result['n']} responses ({source})", *outcome_lines(result, ["strict"]),
            f"call format: decoded {calls['decoded_n']} ({100 * calls['format_adherence']:.2f}%), at least one call "
            f"{calls['calling_n']} ({100 * calls['call_rate']:.2f}%) of {result['n']}"])


#: The scorers a hub can name (:attr:`ratune.hubs.Hub.scorer`).
HUB_SCORINGS: dict[str, type[HubScoring]] = {"apibench": APIBenchScoring, "catalog": CatalogScoring,
                                             "tool_set": ToolSetScoring}


def recorded_answer_format(responses_path: str | os.PathLike, hub: Hub):
    """The answer format a cell's answers were written in, by the ``identity.json`` beside its
    responses (a response file or its cell folder; ``ratune eval run``'s generation record), when
    it is not the hub's own; else None.

    Raises:
        InputError: a torn identity.json.
    """
    path = Path(responses_path)
    identity = (path if path.is_dir() else path.parent) / "identity.json"
    if not identity.is_file():
        return None
    generation = read_json_object(identity).get("generation")
    if not isinstance(generation, dict) or generation.get("answer_format", hub.answer_format) == hub.answer_format:
        return None
    return answer_format_of(generation, hub.answer_format)


def scoring_for(hub: Hub, examples=None, answer_format=None) -> HubScoring:
    """The :class:`HubScoring` of ``hub`` (``examples``: its eval examples, when loaded already;
    ``answer_format``: see :class:`HubScoring`).

    Raises:
        RatuneError: the hub names a scorer that is not registered; the scorer's own errors.
    """
    if hub.scorer not in HUB_SCORINGS:
        raise RatuneError(f"hub {hub.name}: scorer {hub.scorer!r} is not one of {', '.join(HUB_SCORINGS)}")
    return HUB_SCORINGS[hub.scorer](hub, examples, answer_format)
