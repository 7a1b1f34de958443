"""The APIBench scorer: both metrics (docs/scoring.md) for every response of one hub, from the same
extracted ``api_call`` and the same parse (nothing is executed or eval'd)."""

from __future__ import annotations

from dataclasses import dataclass

from ratune.sources.apibench import api_database_path, examples_path, load_api_database, resolve_apibench_dir
from ratune.errors import InputError, RatuneError
from ratune.eval.scoring.gorilla import GorillaIndex, extract_api_call
from ratune.eval.scoring.hub_rules import rules_for
from ratune.eval.scoring.parse import parse, parser_versions
from ratune.eval.scoring.strict import StrictIndex
from ratune.io import iter_jsonl

#: The three outcomes of a response, in report order. "error" is the paper's name for the
#: official scripts' "neither" (semantics §1).
OUTCOMES = ("correct", "hallucination", "error")

#: Metrics computed by :class:`Scorer` (``--metric`` chooses which the CLI prints).
METRICS = ("gorilla", "strict")


@dataclass(frozen=True)
class ResponseScore:
    """The outcome of one response under both metrics (each one of OUTCOMES): ``api_call`` as
    extracted (semantics §2; None when nothing was) and ``matched_index``, the 0-based database line
    the gorilla metric matched, or None.
    """

    api_call: str | None
    gorilla: str
    strict: str
    matched_index: int | None


class Scorer:
    """Scores responses for one hub with the ``gorilla`` and ``strict`` metrics (built by
    :meth:`from_apibench`, or from loaded data). ``eval_api_data``: the eval file's ``api_data``
    objects in file order; question_id k is element k-1 (semantics §6).

    Raises:
        RatuneError: unknown hub.
    """

    def __init__(self, hub: str, api_database: list[dict], eval_api_data: list[dict]):
        self.rules = rules_for(hub)
        self.hub = self.rules.name
        self.api_database = api_database
        self.eval_api_data = eval_api_data
        self._gorilla = GorillaIndex(api_database, self.rules)
        self._domains = [doc.get("domain") for doc in api_database]
        self._strict = StrictIndex(api_database, self.rules)
        self._gold = [self._strict.api_key(api.get("api_call") or "") if isinstance(api, dict) else None
                      for api in eval_api_data]
        self._primary_keys = None

    @classmethod
    def from_apibench(cls, hub: str, apibench_dir=None) -> "Scorer":
        """Build a scorer from an APIBench folder (None: ``resolve_apibench_dir``).

        Raises:
            RatuneError: unknown hub, or missing folder/files.
            InputError: malformed database or eval lines (file and line named).
        """
        rules_for(hub)
        apibench_dir = resolve_apibench_dir(apibench_dir)
        db_path = api_database_path(apibench_dir, hub)
        eval_path = examples_path(apibench_dir, hub, "eval")
        for path in (db_path, eval_path):
            if not path.exists():
                raise RatuneError(f"{path}: not found (APIBench folder {apibench_dir})")
        database = load_api_database(db_path)
        eval_api_data = []
        for number, row in iter_jsonl(eval_path):
            api = row.get("api_data")
            if not isinstance(api, dict) or not isinstance(api.get("domain"), str):
                raise InputError(str(eval_path), number, "api_data.domain",
                                 "missing or not a string")
            eval_api_data.append(api)
        return cls(hub, database, eval_api_data)

    @property
    def n_questions(self) -> int:
        """Number of eval questions (valid question_ids are 1..n_questions)."""
        return len(self.eval_api_data)

    @property
    def skipped_entries(self) -> list[int]:
        """0-based database lines the gorilla metric skips (semantics §4)."""
        return self._gorilla.skipped_entries

    def api_key(self, api_call: str) -> tuple:
        """The strict metric's primary key of a database or gold api_call (the API it names)."""
        return self._strict.api_key(api_call)

    def strict_keys(self, api_call: str, parsed=None) -> set:
        """The API keys a response's extracted api_call names (strict metric;
        :meth:`ratune.eval.scoring.strict.StrictIndex.keys`)."""
        return self._strict.keys(api_call, parsed)

    def gorilla_match(self, api_call: str) -> tuple[int | None, bool]:
        """``(matched_index, fell_through)`` of an extracted api_call under the gorilla metric
        (:meth:`ratune.eval.scoring.gorilla.GorillaIndex.match`)."""
        root, src = parse(api_call)
        return self._gorilla.match(root, src)

    def check_question_id(self, question_id) -> None:
        """Raise RatuneError unless question_id is an int in 1..n_questions (the official scripts
        would read 0 as the last line and crash above n: semantics §6)."""
        if isinstance(question_id, bool) or not isinstance(question_id, int) or not (
                1 <= question_id <= self.n_questions):
            raise RatuneError(f"question_id {question_id!r} out of range 1..{self.n_questions} "
                              f"for hub {self.hub}")

    def gold_api_call(self, question_id: int) -> str:
        """The gold api_call of a question (its eval line's ``api_data``; "" when it has none).

        Raises:
            RatuneError: question_id is not an int in 1..n_questions.
        """
        self.check_question_id(question_id)
        return self.eval_api_data[question_id - 1].get("api_call") or ""

    def score_text(self, text, question_id: int) -> ResponseScore:
        """Score one response text for question ``question_id`` (1-based eval line; semantics §2 and §6).

        Raises:
            RatuneError: question_id is not an int in 1..n_questions.
        """
        self.check_question_id(question_id)
        api_call = extract_api_call(text, self.hub)
        if api_call is None:
            return ResponseScore(None, "error", "error", None)
        root, src = parse(api_call)
        index, _ = self._gorilla.match(root, src)
        if index is None:
            gorilla = "hallucination"
        elif self._domains[index] == self.eval_api_data[question_id - 1].get("domain"):
            gorilla = "correct"
        else:
            gorilla = "error"
        strict = self._strict.outcome(self._strict.keys(api_call, (root, src)), self._gold[question_id - 1])
        return ResponseScore(api_call, gorilla, strict, index)

    def names_api(self, text, api_call: str) -> bool:
        """Whether a response's extracted call carries the strict primary key of ``api_call`` (a
        database or gold api_call); False when no call is extracted."""
        extracted = extract_api_call(text, self.hub)
        if extracted is None:
            return False
        return self._strict.api_key(api_call) in self._strict.keys(extracted)

    def named_documents(self, text) -> list[int]:
        """0-based database lines whose API the response's call names (strict metric keys);
        [] when no call is extracted or it names no database API."""
        extracted = extract_api_call(text, self.hub)
        if extracted is None:
            return []
        if self._primary_keys is None:
            self._primary_keys = [self._strict.api_key(d["api_call"]) for d in self.api_database]
        keys = self._strict.keys(extracted)
        return [i for i, key in enumerate(self._primary_keys) if key in keys]

    def score(self, responses: list[dict]) -> dict:
        """Score responses (``question_id``, ``text``): ``{"hub", "n", "gorilla", "strict", "parser",
        "per_question"}``, each metric block with ``accuracy``, ``hallucination``, ``error`` (fractions
        of n: semantics §1) and their ``*_n`` counts.

        Raises:
            RatuneError: a question_id that is not an int in 1..n_questions.
        """
        counts = {m: dict.fromkeys(OUTCOMES, 0) for m in METRICS}
        per_question = []
        for response in responses:
            qid = response.get("question_id")
            result = self.score_text(response.get("text"), qid)
            counts["gorilla"][result.gorilla] += 1
            counts["strict"][result.strict] += 1
            per_question.append({"question_id": qid, "gorilla": result.gorilla,
                                 "strict": result.strict})
        n = len(responses)
        out = {"hub": self.hub, "n": n}
        for metric in METRICS:
            c = counts[metric]
            out[metric] = {
                "accuracy": c["correct"] / n if n else 0.0,
                "hallucination": c["hallucination"] / n if n else 0.0,
                "error": c["error"] / n if n else 0.0,
                "correct_n": c["correct"],
                "hallucination_n": c["hallucination"],
                "error_n": c["error"],
            }
        out["parser"] = parser_versions()
        out["per_question"] = per_question
        return out
