"""Table 2 files carry n and 95 % Wilson intervals (hand-made cells, no model)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ratune.eval.report import make_cell, table2_markdown, write_table2
from ratune.eval.stats import wilson_interval


def _metrics(correct, hallucination, error, strict=None, per_question=True):
    """A metrics.json object as eval/run.py writes it (gorilla counts, strict counts, per_question)."""
    n = correct + hallucination + error
    strict = strict or (correct, hallucination, error)

    def block(c, h, e):
        return {"accuracy": c / n, "hallucination": h / n, "error": e / n,
                "correct_n": c, "hallucination_n": h, "error_n": e}

    g = block(correct, hallucination, error)
    outcomes = ["correct"] * correct + ["hallucination"] * hallucination + ["error"] * error
    s_outcomes = ["correct"] * strict[0] + ["hallucination"] * strict[1] + ["error"] * strict[2]
    return {"n": n, "accuracy": g["accuracy"], "hallucination": g["hallucination"], "error": g["error"],
            "gorilla": g, "strict": block(*strict),
            "per_question": [{"question_id": i, "gorilla": o, "strict": so} for i, (o, so) in
                             enumerate(zip(outcomes, s_outcomes), start=1)] if per_question else []}


# 44 of 60 correct: Wilson [0.609912, 0.828674] (worked out in tests/test_stats.py) -> "73.3 [61-83]"
# 6 of 60 hallucinated = 10.0 %; strict 40 of 60 = 66.7 %: centre (0.666667 + 0.0320122) / 1.0640243 = 0.656638,
# half 1.842030 * sqrt(0.00370370 + 0.00026677) = 0.116070 -> Wilson [0.540568, 0.772708] -> "66.7 [54-77]"
CELLS = [
    make_cell("none", "0_shot", _metrics(44, 6, 10, strict=(40, 10, 10))),
    make_cell("none", "oracle", _metrics(30, 20, 10)),
    make_cell("oracle", "oracle", _metrics(60, 0, 0)),
]


def test_table2_sets_each_chosen_checkpoints_validation_counts_beside_its_test_counts():
    """Under Table 2, a chosen row's validation counts (gorilla where the hub has it, a tool set's
    calling and [] rows apart) beside the row's test counts: strict 40, gorilla 44 of 60 at 0_shot."""
    chosen = {"none": {"rule": "balanced", "metric": "strict", "step": 90, "epoch": 2.0,
                       "validation": {"oracle": {"n": 217, "strict": 131, "by_answer": {
                           "call": {"n": 96, "correct_n": 22}, "no_call": {"n": 121, "correct_n": 109}}}}},
              "oracle": {"rule": "zero_shot", "metric": "strict", "step": 3, "epoch": None,
                         "validation": {"0_shot": {"n": 5, "strict": 3, "gorilla": 4}}}}
    text = table2_markdown({"hub": "h", "model": "m", "cells": CELLS, "chosen": chosen})
    assert ("| none | balanced (strict) | 90 | 2 | oracle 131/217 (calls 22/96, [] 109/121) "
            "| 0_shot 40/60 (gorilla 44); oracle 30/60 (gorilla 30) |") in text
    assert "| oracle | zero_shot (strict) | 3 |  | 0_shot 3/5 (gorilla 4) | oracle 60/60 (gorilla 60) |" in text


def test_make_cell_fields():
    c = CELLS[0]
    assert c["n"] == 60 and c["correct_n"] == 44 and c["hallucination_n"] == 6 and c["error_n"] == 10
    assert c["accuracy"] == pytest.approx(44 / 60)
    assert c["accuracy_ci"] == pytest.approx([0.609912, 0.828674], abs=2e-6)
    assert c["hallucination_ci"] == list(wilson_interval(6, 60))
    assert c["error_ci"] == list(wilson_interval(10, 60))
    s = c["strict"]
    assert s["accuracy"] == pytest.approx(40 / 60) and s["correct_n"] == 40
    assert s["accuracy_ci"] == pytest.approx([0.540568, 0.772708], abs=2e-6)
    assert set(s) >= {"hallucination_ci", "error_ci"}


def test_make_cell_without_count_blocks():
    # Counts recovered from per_question, else from fraction * n.
    m = _metrics(44, 6, 10)
    m.pop("gorilla")
    for key in ("correct_n", "hallucination_n", "error_n"):
        m["strict"].pop(key)
    assert make_cell("none", "bm25", m)["accuracy_ci"] == CELLS[0]["accuracy_ci"]
    assert make_cell("none", "bm25", m)["strict"]["accuracy_ci"] == CELLS[0]["accuracy_ci"]
    m["per_question"] = []
    assert make_cell("none", "bm25", m)["accuracy_ci"] == CELLS[0]["accuracy_ci"]


def test_table_files(tmp_path):
    table = write_table2(CELLS, hub="torchhub", model="tiny", out_dir=tmp_path)
    assert table["interval"] == "95 % Wilson score interval"

    data = json.loads((tmp_path / "table2.json").read_text())
    assert data["hub"] == "torchhub" and data["interval"].startswith("95 % Wilson")
    cell = data["cells"][0]
    for key in ("accuracy", "hallucination", "error"):
        assert len(cell[f"{key}_ci"]) == 2 and len(cell["strict"][f"{key}_ci"]) == 2
    assert cell["accuracy_ci"] == pytest.approx([0.609912, 0.828674], abs=2e-6)
    assert data["cells"][2]["accuracy_ci"][1] == 1.0  # 60 of 60

    rows = list(csv.DictReader(io.StringIO((tmp_path / "table2.csv").read_text())))
    assert len(rows) == 3
    for col in ("n", "accuracy", "accuracy_low", "accuracy_high", "hallucination_low", "hallucination_high",
                "error_low", "error_high", "strict_accuracy", "strict_accuracy_low", "strict_accuracy_high",
                "strict_error_high"):
        assert col in rows[0]
    assert rows[0]["n"] == "60"
    assert float(rows[0]["accuracy_low"]) == pytest.approx(0.609912, abs=2e-6)
    assert float(rows[0]["accuracy_high"]) == pytest.approx(0.828674, abs=1e-6)
    assert float(rows[0]["strict_accuracy_low"]) == pytest.approx(0.540568, abs=2e-6)

    md = (tmp_path / "table2.md").read_text()
    assert md == table2_markdown(table)
    assert "| none | 73.3 [61-83] (h 10.0) | 50.0 [38-62] (h 33.3) |" in md  # 30/60: Wilson [0.377, 0.623]
    assert "| oracle | - | 100.0 [94-100] (h 0.0) |" in md  # not run -> "-"; 60/60: [0.940, 1]
    assert "| none | 66.7 [54-77] (h 16.7) |" in md  # strict table
    assert "95 % Wilson score interval" in md and "n = 60 questions" in md

    assert (tmp_path / "table2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hand_made_cells_without_intervals(tmp_path):
    # Older-style cells (fractions only) get their intervals when the table is written.
    cells = [{"train_retriever": "none", "test_retriever": "bm25", "n": 60, "accuracy": 44 / 60,
              "hallucination": 0.1, "error": 10 / 60, "strict": {"accuracy": 0.5, "hallucination": 0.4, "error": 0.1}},
             {"train_retriever": "oracle", "test_retriever": "dense", "n": 0, "accuracy": 0.0,
              "hallucination": 0.0, "error": 0.0, "strict": {}}]
    table = write_table2(cells, hub="torchhub", model="m", out_dir=tmp_path)
    assert table["cells"][0]["accuracy_ci"] == pytest.approx([0.609912, 0.828674], abs=2e-6)
    assert table["cells"][0]["strict"]["accuracy_ci"] == list(wilson_interval(30, 60))
    assert table["cells"][1]["accuracy_ci"] == [0.0, 1.0]  # n = 0: the whole range
    md = (tmp_path / "table2.md").read_text()
    assert "73.3 [61-83] (h 10.0)" in md and "0.0 [0-100]" not in md  # n = 0 shows as missing
    assert "| oracle | - | - |" in md
    rows = list(csv.DictReader(io.StringIO((tmp_path / "table2.csv").read_text())))
    assert rows[1]["strict_accuracy"] == "" and rows[1]["strict_accuracy_low"] == ""


# ---- reports say what they hold ----

def _eval_folder(root, results: dict):
    """An `ratune eval run` output folder: one complete cell per setting with its metrics.json."""
    for setting, metrics in results.items():
        cell = root / setting
        cell.mkdir(parents=True)
        (cell / "metrics.json").write_text(json.dumps(metrics))
        (cell / ".complete").write_text("complete\n")
    return root


def test_report_eval_puts_experiments_beside_table2_and_empty_cells_as_missing(tmp_path, capsys):
    from sweep_cells import rate_metrics

    from ratune.cli import main

    swap = {**rate_metrics(10, 3, 1), "document_swap": {"n": 10, "follows_document": 0.9, "follows_document_ci":
                                                        [0.6, 0.98], "follows_memory": 0.1}}
    empty = {"n": 0, "accuracy": 0.0, "hallucination": 0.0, "error": 0.0}
    ev = _eval_folder(tmp_path / "eval", {"0_shot": rate_metrics(10, 7, 1), "bm25": empty, "swap": swap})
    out = tmp_path / "report"
    assert main(["report", "--eval", f"oracle={ev}", "--hub", "torchhub", "--model", "tiny", "--out", str(out)]) == 0
    table = json.loads((out / "table2.json").read_text())
    assert sorted(c["test_retriever"] for c in table["cells"]) == ["0_shot", "bm25"]  # swap is no Table 2 column
    md = (out / "table2.md").read_text()
    assert "swap" not in md
    row = next(line for line in md.splitlines() if line.startswith("| oracle |"))
    assert row == "| oracle | 70.0 [40-89] (h 10.0) | - |"  # n = 0 shows as missing, never 0.0 [0-100]
    assert "n = 10 questions per cell" in md
    csv_row = next(r for r in csv.DictReader(io.StringIO((out / "table2.csv").read_text()))
                   if r["test_retriever"] == "bm25")
    assert (csv_row["n"], csv_row["accuracy"], csv_row["accuracy_low"]) == ("0", "", "")
    experiments = json.loads((out / "experiments.json").read_text())["experiments"]
    assert [(e["cell"], e["follows_document"]["rate"]) for e in experiments] == [("oracle", 0.9)]
    assert "| oracle | oracle | 90.0 [60-98] | 10.0 |" in (out / "experiments.md").read_text()
    assert "Experiments (beside Table 2, not in it)" in capsys.readouterr().out


def test_sweep_report_names_ties_and_no_best_when_every_cell_is_zero(tmp_path, capsys):
    from sweep_cells import finished_cell, rate_metrics

    from ratune import sweep as sw

    tied = tmp_path / "tied"
    finished_cell(tied, "a", {"train_retriever": "none"}, {"0_shot": rate_metrics(10, 6, 1),
                                                            "oracle": rate_metrics(10, 6, 2)})
    finished_cell(tied, "b", {"train_retriever": "oracle"}, {"0_shot": rate_metrics(10, 2, 1),
                                                              "oracle": rate_metrics(10, 6, 0)})
    finished_cell(tied, "c", {"train_retriever": "bm25"}, {"0_shot": rate_metrics(10, 5, 1)})
    assert sw.cli_report_sweep(str(tied)) == 0
    summary = json.loads((tied / "report" / "sweep.json").read_text())
    best = summary["best"]["torchhub"]
    # a: 60 % twice (one checkpoint, no tie); b: 60 % under oracle (another checkpoint: a tie)
    assert (best["cell"], best["accuracy"], best["tied_with"]) == ("a", 0.6, ["b"]) and summary["no_best"] == {}
    out = capsys.readouterr().out
    assert "no single best in torchhub: a (train none, test 0_shot, accuracy 60.0 %, n = 10) ties with b;" in out

    zero = tmp_path / "zero"
    finished_cell(zero, "a", {"train_retriever": "none"}, {"0_shot": {**rate_metrics(10, 1, 5), "accuracy": 0.0}})
    finished_cell(zero, "b", {"train_retriever": "oracle"}, {"0_shot": {**rate_metrics(10, 1, 5), "accuracy": 0.0}})
    assert sw.cli_report_sweep(str(zero)) == 0
    summary = json.loads((zero / "report" / "sweep.json").read_text())
    assert summary["best"] == {}
    assert summary["no_best"] == {"torchhub": "every one of its 2 cells scored 0.0 % (gorilla); nothing to choose"}
    out = capsys.readouterr().out
    assert "no best cell in torchhub: every one of its 2 cells" in out and "best in torchhub:" not in out


def test_cell_metrics_come_from_the_cells_not_the_hub():
    from ratune.eval.report import cell_metrics, headline_metric, metric_block

    apibench = make_cell("oracle", "0_shot", {"n": 4, "accuracy": 0.5, "hallucination": 0.25, "error": 0.25,
                                              "strict": {"accuracy": 0.25, "hallucination": 0.25, "error": 0.5}})
    catalog = make_cell("oracle", "oracle", {"n": 4, "metric": "strict",
                                             "strict": {"accuracy": 0.75, "hallucination": 0.0, "error": 0.25}})
    assert metric_block(apibench, "gorilla")["correct_n"] == 2
    assert metric_block(apibench, "strict")["correct_n"] == 1
    assert metric_block(catalog, "gorilla") == {}
    assert metric_block(catalog, "strict")["correct_n"] == 3
    assert metric_block(None, "strict") == {}
    with pytest.raises(KeyError, match="unknown metric 'exact': expected one of gorilla, strict"):
        metric_block(apibench, "exact")
    assert cell_metrics([apibench]) == ("gorilla", "strict")
    assert cell_metrics([catalog]) == ("strict",)
    assert cell_metrics([]) == ("strict",)
    assert headline_metric([apibench]) == "gorilla"
    assert headline_metric([catalog]) == "strict"
    assert headline_metric([apibench, catalog]) == "strict"  # the metric every cell holds


@pytest.mark.parametrize("metrics, line", [
    ({"n": 10, "accuracy": 2.0, "hallucination": 0.0, "error": 0.0},
     "field 'accuracy': expected a fraction in [0, 1], got 2.0"),
    ({"n": "ten", "accuracy": 0.5, "hallucination": 0.0, "error": 0.0}, "field 'n': expected the number of questions"),
    ({"n": 10, "accuracy": "x", "hallucination": 0.0, "error": 0.0}, "field 'accuracy': expected a fraction"),
    ({"n": 10, "accuracy": 0.5, "hallucination": 0.0, "error": 0.0, "strict": {"accuracy": 0.5, "correct_n": 20}},
     "field 'strict.correct_n': expected a count from 0 to n = 10, got 20"),
    ({"n": 1, "accuracy": 0.0, "hallucination": 0.0, "error": 0.0,
      "per_question": [{"question_id": 1, "gorilla": "correct"}, {"question_id": 2, "gorilla": "correct"}]},
     "field 'per_question': 2 entries for n = 1 questions"),
])
def test_report_refuses_a_hand_edited_metrics_file_in_one_line(tmp_path, capsys, metrics, line):
    """Numbers make_cell cannot use (Wilson's ValueError, int('ten')) are refused where metrics.json is read."""
    from ratune.cli import main

    ev = _eval_folder(tmp_path / "eval", {"0_shot": metrics})
    assert main(["report", "--eval", f"oracle={ev}", "--hub", "torchhub", "--model", "tiny",
                 "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ratune: error: {ev / '0_shot' / 'metrics.json'}: {line}")
    assert len(err.splitlines()) == 1
