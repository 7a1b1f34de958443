"""Abstention (BFCL's irrelevance category): a model given only documents that cannot
answer the request should say that no API fits instead of calling one.

The test setting ``irrelevant`` gives each eval question one document of an API from *another
domain* than its gold API (drawn deterministically by
:class:`ratune.retrieval.perturbed.IrrelevantRetriever`). An answer *abstains* when its api_call
line is :data:`ratune.sources.prompt.ABSTAIN_API_CALL` (:func:`ratune.sources.prompt.is_abstention`).

- abstention rate: the share of abstaining answers under ``irrelevant`` (higher is better);
- false-abstention rate: the share of abstaining answers under a setting whose documents can
  answer (``oracle``; lower is better).

Every eval cell's metrics.json carries ``abstention`` (rate, count, 95 % Wilson interval), so both
rates are read from the same files. Models learn the abstention from the mixture component
``irrelevant`` (:mod:`ratune.data.mixture`).
"""

from __future__ import annotations

from typing import Sequence

from ratune.sources.prompt import answer_field, is_abstention
from ratune.eval.stats import wilson_interval


def abstention(responses: Sequence[dict]) -> dict:
    """``{"n", "abstained_n", "rate", "rate_ci"}`` of a setting's responses (fractions; 95 % Wilson).

    An answer abstains when its ``<<<api_call>>>:`` line holds the abstention
    (:func:`ratune.sources.prompt.answer_field`; the official api_call extraction keeps trailing
    marker characters when a call has no parenthesis, so it is not used here).

    Args:
        responses: ``[{"question_id", "text"}]``.
    """
    n = len(responses)
    k = sum(is_abstention(answer_field(r.get("text"), "api_call")) for r in responses)
    return {"n": n, "abstained_n": k, "rate": k / n if n else 0.0,
            "rate_ci": list(wilson_interval(k, n)) if n else None}
