"""Constraint-aware evaluation (eval/constraints.py): top-1 accuracy read from the
record formats APIBench uses, the constrained questions made from the real TorchHub data, and
the rates on hand-made answers."""

from __future__ import annotations

import math

import pytest

from ratune.sources.apibench import api_database_path, load_api_database, load_examples
from ratune.eval.constraints import Constraint, constraint_metrics, constrained_examples, top1_accuracy
from ratune.eval.scoring import Scorer


def rec(accuracy, model="densenet121"):
    return {"domain": "Classification", "performance": {"dataset": "ImageNet", "accuracy": accuracy},
            "api_call": f"torch.hub.load(repo_or_dir='pytorch/vision', model='{model}', pretrained=True)"}


@pytest.mark.parametrize("accuracy, expected", [
    ({"top_1": 74.58, "top_5": 91.63}, 74.58),
    ({"top1": "77.1%"}, 77.1),
    ({"top-1_error": 43.45, "top-5_error": 20.91}, 100 - 43.45),
    ({"densenet121": {"Top-1 error": 25.35}, "densenet169": {"Top-1 error": 24.0}}, 100 - 25.35),  # by model name
    ({"ResNeXt-101 32x8d": {"Top-1 Acc.": "82.2"}}, 82.2),  # a single nested block
    ({"Mean IOU": 60.5}, None),
    ("Not provided", None),
])
def test_top1_formats(accuracy, expected):
    got = top1_accuracy(rec(accuracy))
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.fixture(scope="module")
def torchhub(apibench):
    return (load_api_database(api_database_path(apibench, "torchhub")), load_examples(apibench, "torchhub", "eval"),
            Scorer.from_apibench("torchhub", apibench))


def test_constrained_questions_from_real_data(torchhub):
    database, examples, _ = torchhub
    made = constrained_examples(examples, database)
    assert 0 < len(made) < len(examples)
    by_line = {e.line: e for e in examples}
    for ex, constraint in made:
        original = by_line[ex.line]
        assert ex.instruction == original.instruction + constraint.text()
        assert constraint.min_top1 == math.floor(top1_accuracy(original.api))
        assert constraint.met_by(original.api)  # the gold API meets its own constraint
        siblings = [d for d in database if d["domain"] == original.api["domain"] and top1_accuracy(d) is not None]
        assert any(not constraint.met_by(d) for d in siblings)  # and rules out at least one sibling


def test_constraint_metrics_by_hand(torchhub):
    database, examples, scorer = torchhub
    (ex, constraint), *_ = constrained_examples(examples, database)
    gold_call = ex.api["api_call"]
    weaker = next(d for d in database if d["domain"] == ex.api["domain"] and top1_accuracy(d) is not None
                  and not constraint.met_by(d))

    def text(call):
        return f"<<<domain>>>: {ex.api['domain']}\n<<<api_call>>>: {call}\n<<<api_provider>>>: PyTorch"

    q = ex.line
    responses = [{"question_id": q, "text": text(gold_call)}, {"question_id": q, "text": text(weaker["api_call"])},
                 {"question_id": q, "text": "no call"}]
    m = constraint_metrics(scorer, responses, {q: constraint})
    assert m["n"] == 3
    # gold: task and constraint; weaker sibling: gorilla task (same domain) but not the constraint; none: neither
    assert (m["task_gorilla_n"], m["task_strict_n"], m["constraint_met_n"], m["both_n"]) == (2, 1, 1, 1)
    assert m["both"] == pytest.approx(1 / 3)
    assert [p["constraint_met"] for p in m["per_question"]] == [True, False, False]
    assert Constraint(80).text() == " The model should have at least 80% top-1 accuracy."
