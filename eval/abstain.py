"""Abstention (BFCL's irrelevance category): given only documents that cannot answer, a model
should say that no API fits (docs/experiments.md#abstention).
"""

from __future__ import annotations

from typing import Sequence

from ratune.sources.prompt import answer_field, is_abstention
from ratune.eval.stats import wilson_interval


def abstention(responses: Sequence[dict]) -> dict:
    """``{"n", "abstained_n", "rate", "rate_ci"}`` of a setting's responses (fractions; 95 % Wilson).

    An answer abstains when its ``<<<api_call>>>:`` line holds the abstention
    (:func:`ratune.sources.prompt.answer_field`, not the official api_call extraction, which keeps
    trailing marker characters when a call has no parenthesis).
    """
    n = len(responses)
    k = sum(is_abstention(answer_field(r.get("text"), "api_call")) for r in responses)
    return {"n": n, "abstained_n": k, "rate": k / n if n else 0.0,
            "rate_ci": list(wilson_interval(k, n)) if n else None}
