"""Response files: reading them, checking their question ids, and telling which hub they are for."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ratune.sources.apibench import HUBS
from ratune.errors import InputError, RatuneError
from ratune.eval.scoring.hub_rules import HUB_RULES
from ratune.io import iter_jsonl

if TYPE_CHECKING:  # pragma: no cover
    from ratune.eval.scoring.scorer import Scorer


def load_responses(path, n_questions: int | None = None) -> list[dict]:
    """Read a response JSONL file into ``[{"question_id", "text", "line"}]`` in file order; a
    non-string ``text`` becomes None. ``n_questions``: ids must lie in 1..n_questions (rules:
    docs/scoring.md#inputs-and-refusals).

    Raises:
        RatuneError: the file does not exist.
        InputError: naming file and line, for bytes that are not UTF-8, a line that is not a JSON
            object, and a question_id that is missing, not an int, duplicated or out of range; a
            file without any response.
    """
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: response file not found")
    out, seen = [], {}
    for number, obj in iter_jsonl(path):
        qid = obj.get("question_id")
        if "question_id" not in obj:
            raise InputError(str(path), number, "question_id", "missing")
        if isinstance(qid, bool) or not isinstance(qid, int):
            raise InputError(str(path), number, "question_id", f"expected an integer, got {qid!r}")
        if qid in seen:
            raise InputError(str(path), number, "question_id",
                             f"duplicate question_id {qid} (first on line {seen[qid]})")
        seen[qid] = number
        if n_questions is not None and not 1 <= qid <= n_questions:
            raise InputError(str(path), number, "question_id",
                             f"question_id {qid} out of range 1..{n_questions}")
        text = obj.get("text")
        out.append({"question_id": qid, "text": text if isinstance(text, str) else None,
                    "line": number})
    if not out:  # scoring nothing would report n = 0 with 0.0 rates
        raise InputError(str(path), None, None, "no responses (the file is empty)")
    return out


def check_question_ids(responses: list[dict], n_questions: int, path="<responses>") -> None:
    """Raise InputError (naming the line) for the first question_id outside 1..n_questions."""
    for response in responses:
        qid = response.get("question_id")
        if isinstance(qid, bool) or not isinstance(qid, int) or not 1 <= qid <= n_questions:
            raise InputError(str(path), response.get("line"), "question_id",
                             f"question_id {qid!r} out of range 1..{n_questions}")


#: Each hub's characteristic loader calls, as written in response texts
#: (:attr:`~ratune.eval.scoring.hub_rules.HubRules.evidence`).
HUB_LOADERS = {hub: rules.evidence for hub, rules in HUB_RULES.items()}

#: Minimum number of responses naming another hub's loader before a file can be refused.
HUB_CHECK_MIN = 3


def hub_evidence(responses: list[dict]) -> dict:
    """``{hub: number of responses whose text calls that hub's loader}`` (see HUB_LOADERS)."""
    counts = dict.fromkeys(HUBS, 0)
    for response in responses:
        text = response.get("text")
        if isinstance(text, str):
            for hub, pattern in HUB_LOADERS.items():
                if pattern.search(text):
                    counts[hub] += 1
    return counts


def check_hub_matches(hub: str, responses: list[dict], scorer: "Scorer | None" = None,
                      path="<responses>") -> dict:
    """Refuse to score a response file that was written for another hub, by how many responses
    call each hub's loader (:data:`HUB_LOADERS`, :data:`HUB_CHECK_MIN`; docs/scoring.md#inputs-and-refusals).
    Returns the evidence counts.

    Raises:
        RatuneError: with the counts, the likely hub and what to pass instead.
    """
    counts = hub_evidence(responses)
    own = counts[hub]
    other, other_n = max(((h, c) for h, c in counts.items() if h != hub), key=lambda hc: hc[1])
    any_n = sum(1 for r in responses if isinstance(r.get("text"), str)
                and any(p.search(r["text"]) for p in HUB_LOADERS.values()))
    if other_n >= HUB_CHECK_MIN and other_n > own and 2 * other_n > any_n:
        extra = ""
        if scorer is not None:
            ids = [r.get("question_id") for r in responses if isinstance(r.get("question_id"), int)]
            if ids and max(ids) > scorer.n_questions:
                extra = (f"; its question_ids go up to {max(ids)} while {hub} has "
                         f"{scorer.n_questions} questions")
        raise RatuneError(
            f"{path}: this looks like a {other} response file, not {hub}: {other_n} of "
            f"{len(responses)} responses call {other}'s loader, {own} call {hub}'s{extra}. "
            f"Pass --hub {other} (or --no-hub-check to score it as {hub} anyway)")
    return counts
