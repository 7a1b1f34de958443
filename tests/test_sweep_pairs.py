"""Chosen-pair comparisons inside sweep reports (ratune/sweep/pairs.py), on hand-made
finished cell folders whose per-question outcomes give contingencies worked out by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from sweep_cells import finished_cell

from ratune import sweep as sw
from ratune.cli import main as cli_main
from ratune.errors import RatuneError
from ratune.sweep.pairs import ComparePair, parse_selector


def outcomes(correct: set[int], n: int = 10, strict_wrong: set[int] = frozenset()) -> dict:
    """metrics.json with per-question outcomes: ``correct`` question ids are right (gorilla);
    strict also counts ``strict_wrong`` as wrong."""
    per_q = [{"question_id": q, "gorilla": "correct" if q in correct else "hallucination",
              "strict": "correct" if q in correct and q not in strict_wrong else "error"} for q in range(n)]
    k = len(correct)
    block = {"accuracy": k / n, "hallucination": (n - k) / n, "error": 0.0, "correct_n": k,
             "hallucination_n": n - k, "error_n": 0}
    ks = len(correct - set(strict_wrong))
    strict = {"accuracy": ks / n, "hallucination": 0.0, "error": (n - ks) / n, "correct_n": ks,
              "hallucination_n": 0, "error_n": n - ks}
    return {"n": n, "accuracy": k / n, "hallucination": (n - k) / n, "error": 0.0,
            "gorilla": block, "strict": strict, "per_question": per_q}


make_cell = finished_cell


# oracle/oracle right on q0-6 (7 of 10), none/0_shot right on q0-3 and q7 (5 of 10):
#   both q0-3 = 4, only A q4-6 = 3, only B q7 = 1, neither q8-9 = 2
#   exact McNemar: 4 discordant, 3 vs 1 -> p = 2 * P(X <= 1 | Bin(4, 1/2)) = 2 * 5/16 = 0.625
#   difference A - B = 0.7 - 0.5 = +0.2
# strict: A loses q6 -> both 4, only A 2, only B 1, neither 3; p = 2 * P(X <= 1 | Bin(3, 1/2)) = 1.0
ORACLE_ORACLE = set(range(7))
NONE_0SHOT = {0, 1, 2, 3, 7}


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    d = tmp_path / "sweep"
    make_cell(d, "oracle-r8", {"train_retriever": "oracle", "lora.r": 8},
              {"oracle": outcomes(ORACLE_ORACLE, strict_wrong={6}), "0_shot": outcomes({0})})
    make_cell(d, "none-r8", {"train_retriever": "none", "lora.r": 8},
              {"0_shot": outcomes(NONE_0SHOT), "oracle": outcomes({0, 1})})
    # lora.r 16: the oracle model's oracle cell never finished -> that context is missing
    make_cell(d, "oracle-r16", {"train_retriever": "oracle", "lora.r": 16}, {"0_shot": outcomes({1})})
    make_cell(d, "none-r16", {"train_retriever": "none", "lora.r": 16}, {"0_shot": outcomes({1, 2})})
    return d


CHOSEN = ComparePair(a={"train_retriever": "oracle", "test_retriever": "oracle"},
                     b={"train_retriever": "none", "test_retriever": "0_shot"})


def test_chosen_pair_per_context_by_hand(sweep_dir):
    sw.report_sweep(sweep_dir, pairs=[CHOSEN])
    results = json.loads((sweep_dir / "report" / "comparisons.json").read_text())["comparisons"]
    by_r = {r["context"]["lora.r"]: r for r in results}
    assert set(by_r) == {"8", "16"} and all(r["context"]["hub"] == "torchhub" for r in results)
    ok = by_r["8"]
    assert ok["status"] == "ok" and ok["a_cell"] == "oracle-r8/oracle" and ok["b_cell"] == "none-r8/0_shot"
    g = ok["metrics"]["gorilla"]
    assert g["n"] == 10 and g["contingency"] == {"both": 4, "only_a": 3, "only_b": 1, "neither": 2}
    assert g["mcnemar_p"] == pytest.approx(0.625)
    assert g["difference"]["value"] == pytest.approx(0.2)
    assert g["difference"]["low"] <= 0.2 <= g["difference"]["high"]
    s = ok["metrics"]["strict"]
    assert s["contingency"] == {"both": 4, "only_a": 2, "only_b": 1, "neither": 3}
    assert s["mcnemar_p"] == pytest.approx(1.0)
    assert by_r["16"]["status"] == "missing" and by_r["16"]["missing"] == ["a"]

    md = (sweep_dir / "report" / "comparisons.md").read_text()
    assert "| 1 | hub=torchhub, lora.r=8 | test_retriever=oracle, train_retriever=oracle | " \
           "test_retriever=0_shot, train_retriever=none | 10 | 70.0 | 50.0 | 4 / 3 / 1 / 2 | +20.0 [" in md
    assert "| missing: a not finished |" in md
    rows = list(csv.DictReader((sweep_dir / "report" / "comparisons.csv").open()))
    gorilla_row = next(r for r in rows if r["metric"] == "gorilla")
    assert (gorilla_row["only_a"], gorilla_row["only_b"], gorilla_row["mcnemar_p"]) == ("3", "1", "0.625")
    summary = json.loads((sweep_dir / "report" / "sweep.json").read_text())
    assert summary["comparisons"] == {"ok": 1, "missing": 1, "refused": 0}


def test_bootstrap_in_report_is_reproducible(sweep_dir, tmp_path):
    sw.report_sweep(sweep_dir, tmp_path / "r1", pairs=[CHOSEN])
    sw.report_sweep(sweep_dir, tmp_path / "r2", pairs=[CHOSEN])
    assert (tmp_path / "r1" / "comparisons.json").read_bytes() == (tmp_path / "r2" / "comparisons.json").read_bytes()


def test_pair_over_test_settings_for_every_model(sweep_dir):
    """Naming only test_retriever: one comparison per trained model (train_retriever x lora.r)."""
    pair = ComparePair(a={"test_retriever": "oracle"}, b={"test_retriever": "0_shot"})
    sw.report_sweep(sweep_dir, pairs=[pair])
    results = json.loads((sweep_dir / "report" / "comparisons.json").read_text())["comparisons"]
    ctx = {(r["context"]["train_retriever"], r["context"]["lora.r"]): r for r in results}
    assert set(ctx) == {("oracle", "8"), ("none", "8"), ("oracle", "16"), ("none", "16")}
    # none-r8: oracle {0, 1} vs 0_shot {0, 1, 2, 3, 7}: both 2, only A 0, only B 3, neither 5
    assert ctx[("none", "8")]["metrics"]["gorilla"]["contingency"] == \
        {"both": 2, "only_a": 0, "only_b": 3, "neither": 5}
    assert ctx[("none", "8")]["metrics"]["gorilla"]["mcnemar_p"] == pytest.approx(0.25)  # 2 * (1/2)^3
    assert ctx[("oracle", "16")]["status"] == "missing"


def test_unpaired_cells_refused_and_unknown_dimension(tmp_path):
    d = tmp_path / "sweep"
    make_cell(d, "a", {"train_retriever": "oracle"}, {"oracle": outcomes({0, 1}, n=10)})
    make_cell(d, "b", {"train_retriever": "none"}, {"0_shot": outcomes({0}, n=8)})
    sw.report_sweep(d, pairs=[CHOSEN])
    (entry,) = json.loads((d / "report" / "comparisons.json").read_text())["comparisons"]
    assert entry["status"] == "refused"
    assert "unpaired comparison refused: a/oracle has 10 questions, b/0_shot has 8" in entry["reason"]
    with pytest.raises(RatuneError, match=r"unknown dimension\(s\) lora.rank; the sweep's cells have hub, "
                                          r"test_retriever, train_retriever"):
        sw.report_sweep(d, pairs=[ComparePair(a={"lora.rank": 8}, b={"test_retriever": "oracle"})])


def test_ambiguous_selector_is_an_error(sweep_dir):
    """A names the train retriever only, B fixes the test setting too: A matches two settings per model."""
    pair = ComparePair(a={"train_retriever": "oracle"}, b={"train_retriever": "none", "test_retriever": "0_shot"})
    with pytest.raises(RatuneError, match="2 cells match in context hub=torchhub, lora.r=8"):
        sw.report_sweep(sweep_dir, pairs=[pair])


def test_sweep_file_compare_list_is_stored_and_used(tmp_path, sweep_dir):
    spec = {"name": "t", "out_dir": str(sweep_dir), "base": {"model": "m", "hub": "torchhub",
                                                              "train_retriever": "none"},
            "axes": {"train_retriever": ["none", "oracle"]},
            "compare": [{"a": {"train_retriever": "oracle", "test_retriever": "oracle"},
                         "b": {"train_retriever": "none", "test_retriever": "0_shot"}}]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = sw.load_sweep(path)
    assert sweep.config.compare == [CHOSEN]
    sw.save_sweep_file(sweep)
    assert sw.load_compare_pairs(sweep_dir) == [CHOSEN]
    sw.report_sweep(sweep_dir)  # no pairs given: the stored list is used
    assert json.loads((sweep_dir / "report" / "sweep.json").read_text())["comparisons"]["ok"] == 1

    bad = dict(spec, compare=[{"a": {}, "b": {"test_retriever": "oracle"}}])
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(RatuneError, match="a selector needs at least one dimension"):
        sw.load_sweep(path)


def test_the_saved_sweep_file_is_self_contained_and_loads_back_where_the_folder_moved(tmp_path, sweep_dir):
    """save_sweep_file stores the base config inline (the base file may change or vanish after the
    run) and load_saved_sweep reads it back with the folder it is in as out_dir; a saved file that
    does not validate is refused, naming the file and the field."""
    from ratune.sweep.schema import load_saved_sweep

    (tmp_path / "base.yaml").write_text("model: m\nhub: torchhub\ntrain_retriever: none\n")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"out_dir": str(sweep_dir), "base": "base.yaml",
                                    "axes": {"train_retriever": ["none", "oracle"]},
                                    "compare": [CHOSEN.model_dump(mode="json")]}))
    sw.save_sweep_file(sw.load_sweep(path))
    saved = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())
    assert (saved["base"], saved["source"]) == ({"model": "m", "hub": "torchhub", "train_retriever": "none"}, str(path))
    (tmp_path / "base.yaml").unlink()
    moved = tmp_path / "moved"
    sweep_dir.rename(moved)
    loaded = load_saved_sweep(moved)
    assert (loaded.out_dir, loaded.source, loaded.base) == (moved, str(moved / "sweep.yaml"), saved["base"])
    assert loaded.config.compare == [CHOSEN] and sw.load_compare_pairs(moved) == [CHOSEN]
    sw.report_sweep(moved)  # the stored pair, read through the one loader
    assert json.loads((moved / "report" / "sweep.json").read_text())["comparisons"]["ok"] == 1
    (moved / "sweep.yaml").write_text("base: {}\ncompare: [{a: {}, b: {test_retriever: oracle}}]\n")
    with pytest.raises(RatuneError, match=r"moved/sweep.yaml.*compare.*a selector needs at least one dimension"):
        sw.report_sweep(moved)


def test_cli_pair_flag(sweep_dir, capsys):
    assert cli_main(["report", str(sweep_dir), "--pair", "train_retriever=oracle,test_retriever=oracle",
                     "train_retriever=none,test_retriever=0_shot"]) == 0
    out = capsys.readouterr().out
    assert "### gorilla metric" in out and "4 / 3 / 1 / 2" in out
    assert cli_main(["report", str(sweep_dir), "--pair", "train_retriever", "test_retriever=0_shot"]) == 2
    assert "'train_retriever' is not KEY=VALUE" in capsys.readouterr().err


def test_parse_selector():
    assert parse_selector(" train_retriever=oracle , lora.r=8") == {"train_retriever": "oracle", "lora.r": "8"}
    with pytest.raises(RatuneError, match="is empty"):
        parse_selector(" , ")
