"""Worst case across test-time retrievers (eval/robustness.py), by hand."""

from __future__ import annotations

import json

import pytest

from ratune import sweep as sw
from ratune.eval.robustness import worst_case, worst_case_markdown


def cell(train, test, acc, strict, ci=(0.1, 0.3)):
    return {"train_retriever": train, "test_retriever": test, "n": 50, "accuracy": acc, "accuracy_ci": list(ci),
            "strict": {"accuracy": strict, "accuracy_ci": [0.0, 0.2]}}


def test_worst_case_by_hand():
    cells = [cell("oracle", "0_shot", 0.00, 0.00), cell("oracle", "bm25", 0.56, 0.12), cell("oracle", "oracle", 1.0, 1.0),
             cell("mix", "0_shot", 0.30, 0.20), cell("mix", "bm25", 0.40, 0.10), cell("mix", "oracle", 0.90, 0.90),
             cell("none", "0_shot", 0.50, 0.40)]
    w = worst_case(cells)
    assert w["oracle"]["gorilla"] == {"worst": 0.0, "worst_ci": [0.1, 0.3], "worst_setting": "0_shot",
                                      "mean": pytest.approx(1.56 / 3)}
    assert w["mix"]["gorilla"]["worst"] == 0.30 and w["mix"]["gorilla"]["worst_setting"] == "0_shot"
    assert w["mix"]["strict"]["worst"] == 0.10 and w["mix"]["strict"]["worst_setting"] == "bm25"
    assert w["mix"]["complete"] and not w["none"]["complete"] and w["none"]["settings"] == ["0_shot"]
    md = worst_case_markdown(w)
    assert "| mix | 30.0 [10-30] (0_shot) | 53.3 | 10.0 [0-20] (bm25) | 40.0 | 3 |" in md
    assert "| none | 50.0 [10-30] (0_shot) | 50.0 | 40.0 [0-20] (0_shot) | 40.0 | 1 (incomplete) |" in md


def test_sweep_report_writes_worst_case(tmp_path, capsys):
    from test_sweep_pairs import make_cell, outcomes

    d = tmp_path / "sweep"
    make_cell(d, "o", {"train_retriever": "oracle"}, {"oracle": outcomes({0, 1, 2}), "0_shot": outcomes({0})})
    make_cell(d, "n", {"train_retriever": "none"}, {"oracle": outcomes({0, 1}), "0_shot": outcomes({0, 1})})
    assert sw.cli_report_sweep(str(d)) == 0
    w = json.loads((d / "report" / "sweep.json").read_text())["worst_case"]["torchhub"]
    assert (w["oracle"]["gorilla"]["worst"], w["oracle"]["gorilla"]["worst_setting"]) == (0.1, "0_shot")
    assert (w["none"]["gorilla"]["worst"], w["none"]["gorilla"]["worst_setting"]) == (0.2, "0_shot")  # tie: by name
    assert "| none | 20.0" in (d / "report" / "torchhub" / "worst_case.md").read_text()
    assert "Worst case across test settings" in capsys.readouterr().out
