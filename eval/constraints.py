"""Constraint-aware evaluation (Gorilla, section 4.3 and Table 4): TorchHub requests that add an
accuracy constraint, scored on the task *and* on whether the chosen API meets the constraint.
How the questions are made and scored: docs/experiments.md#constraints.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Sequence

from ratune.eval.stats import count_rates

_MODEL_ARG = re.compile(r"model\s*=\s*['\"]([^'\"]+)['\"]|,\s*['\"]([^'\"]+)['\"]")


def _norm(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(key).lower())


def _model_name(api_call: str) -> str | None:
    m = _MODEL_ARG.search(api_call or "")
    return (m.group(1) or m.group(2)) if m else None


def _number(value) -> float | None:
    try:
        return float(str(value).strip().rstrip("%"))
    except (TypeError, ValueError):
        return None


def _top1_of(block: dict) -> float | None:
    for key, value in block.items():
        k = _norm(key)
        if k in ("top1", "top1acc", "top1accuracy"):
            return _number(value)
        if k in ("top1error", "top1err"):
            err = _number(value)
            return None if err is None else 100.0 - err
    return None


def top1_accuracy(doc: dict) -> float | None:
    """The top-1 accuracy (percent) an API record states, or None (formats read:
    docs/experiments.md#constraints)."""
    perf = doc.get("performance")
    accuracy = perf.get("accuracy") if isinstance(perf, dict) else None
    if not isinstance(accuracy, dict):
        return None
    direct = _top1_of(accuracy)
    if direct is not None:
        return direct
    nested = {k: v for k, v in accuracy.items() if isinstance(v, dict)}
    model = _norm(_model_name(doc.get("api_call", "")) or "")
    for key, block in nested.items():
        if model and (_norm(key) == model or _norm(key) in model):
            return _top1_of(block)
    if len(nested) == 1:
        return _top1_of(next(iter(nested.values())))
    return None


@dataclass(frozen=True)
class Constraint:
    """An accuracy constraint: the API must have at least ``min_top1`` percent top-1 accuracy."""

    min_top1: int

    def text(self) -> str:
        """The sentence appended to the instruction."""
        return f" The model should have at least {self.min_top1}% top-1 accuracy."

    def met_by(self, doc: dict | None) -> bool:
        """Whether an API record meets the constraint (unknown accuracy: not met)."""
        top1 = top1_accuracy(doc) if doc else None
        return top1 is not None and top1 >= self.min_top1


def constrained_examples(examples: Sequence, database: Sequence[dict]) -> list[tuple[object, Constraint]]:
    """``[(example with the constraint in its instruction, Constraint)]`` for the TorchHub eval
    ``examples`` that get one, given the hub's API records ``database``."""
    by_domain: dict[str, list[float]] = {}
    for doc in database:
        top1 = top1_accuracy(doc)
        if top1 is not None:
            by_domain.setdefault(doc.get("domain"), []).append(top1)
    out = []
    for ex in examples:
        top1 = top1_accuracy(ex.api)
        if top1 is None:
            continue
        threshold = math.floor(top1)
        if not any(other < threshold for other in by_domain.get(ex.api.get("domain"), [])):
            continue  # no sibling the constraint would rule out
        constraint = Constraint(min_top1=threshold)
        out.append((replace(ex, instruction=ex.instruction + constraint.text()), constraint))
    return out


def constraint_metrics(scorer, responses: Sequence[dict], constraints: dict[int, Constraint]) -> dict:
    """Rates ``n``, ``task_gorilla``, ``task_strict``, ``constraint_met``, ``both`` (as
    :func:`ratune.eval.stats.count_rates`) and ``per_question`` of answers to constrained questions
    (``constraints``: ``{question_id: Constraint}``), by the TorchHub ``scorer``.
    """
    counts = {"task_gorilla": 0, "task_strict": 0, "constraint_met": 0, "both": 0}
    per_question = []
    for r in responses:
        constraint = constraints[r["question_id"]]
        score = scorer.score_text(r.get("text"), r["question_id"])
        named = scorer.named_documents(r.get("text"))
        met = any(constraint.met_by(scorer.api_database[i]) for i in named)
        outcome = {"task_gorilla": score.gorilla == "correct", "task_strict": score.strict == "correct",
                   "constraint_met": met}
        outcome["both"] = outcome["task_gorilla"] and met
        for key, value in outcome.items():
            counts[key] += value
        per_question.append({"question_id": r["question_id"], "min_top1": constraint.min_top1, **outcome})
    n = len(per_question)
    return {"n": n, **count_rates(counts, n), "per_question": per_question}
