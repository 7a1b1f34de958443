"""Document swap (Gorilla, section 4.4 and Figure 6): does the model follow the document it is
given, or the API it memorised?

For each eval question whose gold API shares its domain with at least one other API of the hub,
the test-time document is *another* API's document of the same domain, drawn deterministically
by :class:`ratune.retrieval.perturbed.SwapRetriever`.
Questions whose domain has a single API are left out (counted). The model's answer is then
classified with the strict metric's API keys (:meth:`ratune.eval.scoring.Scorer.names_api`; for a catalog,
its identity rules: :meth:`ratune.eval.catalog_scorer.CatalogEvalScorer.names_api`):

``follows_document``
    the call names the swapped-in API (the model adapted to the document);
``follows_memory``
    the call names the question's gold API (the model ignored the document);
``neither``
    any other call, or no call.

The rates are fractions of the swapped questions, each with a 95 % Wilson interval. The paper's
claim is that a RAT model follows the document; a model finetuned without documents follows its
memory. ``ratune eval run --settings swap`` runs it as a test setting (its own folder, never a
Table 2 column).
"""

from __future__ import annotations

from typing import Sequence

from ratune.eval.stats import count_rates


def follow_rates(scorer, responses: Sequence[dict], swapped: dict[int, dict]) -> dict:
    """Classify answers to swapped prompts (see the module docstring).

    Args:
        scorer: the hub's scorer (:class:`ratune.eval.scoring.Scorer`, or
            :class:`ratune.eval.catalog_scorer.CatalogEvalScorer` for a catalog): its
            ``gold_api_call`` and ``names_api``.
        responses: ``[{"question_id", "text"}]``.
        swapped: ``{question_id: swapped-in document}``; questions not in it are left out.

    Returns:
        ``{"n", "left_out", "follows_document", "follows_memory", "neither"}`` (fractions of n),
        the counts as ``*_n`` and 95 % Wilson intervals as ``*_ci``, plus ``per_question``
        ``[{"question_id", "outcome", "swapped_api_call"}]``.
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
