"""Document swap (Gorilla, section 4.4 and Figure 6): does the model follow the document it is
given, or the API it memorised? Outcomes ``follows_document``, ``follows_memory``, ``neither``:
docs/experiments.md#document-swap.
"""

from __future__ import annotations

from typing import Sequence

from ratune.eval.stats import count_rates


def follow_rates(scorer, responses: Sequence[dict], swapped: dict[int, dict]) -> dict:
    """Rates ``follows_document``, ``follows_memory``, ``neither`` (as
    :func:`ratune.eval.stats.count_rates`), ``n``, ``left_out`` and ``per_question`` of answers to
    swapped prompts; ``swapped`` is ``{question_id: swapped-in document}`` (others are left out) and
    ``scorer`` the hub's (``gold_api_call``, ``names_api``).
    """
    counts = {"follows_document": 0, "follows_memory": 0, "neither": 0}
    per_question, left_out = [], 0
    for r in responses:
        doc = swapped.get(r["question_id"])
        if doc is None:
            left_out += 1
            continue
        gold = scorer.gold_api_call(r["question_id"])
        if scorer.names_api(r.get("text"), doc["api_call"]):
            outcome = "follows_document"
        elif scorer.names_api(r.get("text"), gold):
            outcome = "follows_memory"
        else:
            outcome = "neither"
        counts[outcome] += 1
        per_question.append({"question_id": r["question_id"], "outcome": outcome,
                             "swapped_api_call": doc["api_call"]})
    n = sum(counts.values())
    return {"n": n, "left_out": left_out, **count_rates(counts, n), "per_question": per_question}
