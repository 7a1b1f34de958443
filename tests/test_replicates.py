"""Replicates across seeds: a sweep axis ``seed`` is averaged per Table 2 cell (mean, sample sd,
min-max, number of seeds, each run's Wilson interval), checked on hand-made finished cell folders
against values worked out by hand; single-seed sweeps are reported as before."""

from __future__ import annotations

import csv
import json
import math
from functools import partial
from pathlib import Path

import pytest
from sweep_cells import finished_cell, rate_metrics

from ratune import sweep as sw
from ratune.eval.report import aggregate_replicates, format_replicates, make_cell, table2_markdown
from ratune.eval.stats import wilson_interval


metrics = partial(rate_metrics, n=60, correct=30, halluc=6)


def make_cell_dir(sweep_dir: Path, name: str, axes: dict, retriever: str, results: dict) -> Path:
    """A finished sweep cell folder whose config records the cell's seed (default 42)."""
    return finished_cell(sweep_dir, name, axes, results, train_retriever=retriever, seed=axes.get("seed", 42))


# correct answers of 60 per seed: none/0_shot 30, 33, 39 -> 0.50, 0.55, 0.65
#   mean = 102 / 180 = 0.566667; deviations -0.066667, -0.016667, +0.083333
#   sum of squares = 0.0044444 + 0.0002778 + 0.0069444 = 0.0116667; / (3 - 1) = 0.0058333
#   sd = sqrt(0.0058333) = 0.0763763 -> "56.7 ±7.6 sd (3 seeds)"
# hallucination 6, 9, 3 -> 0.10, 0.15, 0.05: mean 0.10, sd 0.05
# strict (one fewer correct): 29, 32, 38 -> mean 99 / 180 = 0.55, sd 0.0763763
NONE_0SHOT = {1: (30, 6), 2: (33, 9), 3: (39, 3)}
# none/oracle 42, 45, 48 -> 0.70, 0.75, 0.80: mean 0.75, sd 0.05 -> "75.0 ±5.0 sd (3 seeds)"
NONE_ORACLE = {1: 42, 2: 45, 3: 48}
# oracle/0_shot: seed 3 unfinished -> 2 seeds, 36, 40 -> 0.60, 0.6667: mean 0.633333, sd 0.0471405
ORACLE_0SHOT = {1: 36, 2: 40}


def three_seed_sweep(tmp_path: Path) -> Path:
    sweep_dir = tmp_path / "sweep"
    for seed in (1, 2, 3):
        c, h = NONE_0SHOT[seed]
        make_cell_dir(sweep_dir, f"none-{seed}", {"train_retriever": "none", "seed": seed}, "none",
                      {"0_shot": metrics(correct=c, halluc=h), "oracle": metrics(correct=NONE_ORACLE[seed])})
        d = make_cell_dir(sweep_dir, f"oracle-{seed}", {"train_retriever": "oracle", "seed": seed}, "oracle",
                          {"0_shot": metrics(correct=ORACLE_0SHOT[seed])} if seed in ORACLE_0SHOT else {})
        if seed not in ORACLE_0SHOT:  # started, not finished: missing, never zero
            (d / "eval" / "0_shot").mkdir(parents=True)
            (d / "eval" / "0_shot" / "metrics.json").write_text(json.dumps(metrics(correct=0)))
    return sweep_dir


def test_aggregate_replicates_by_hand():
    runs = [make_cell("none", "0_shot", metrics(correct=c, halluc=h)) for c, h in NONE_0SHOT.values()]
    cell = aggregate_replicates(runs[::-1], [3, 2, 1])  # sorted by seed
    assert cell["seeds"] == [1, 2, 3] and cell["n_seeds"] == 3 and cell["n"] == 60 and cell["n_runs"] == [60] * 3
    assert cell["accuracy"] == pytest.approx(0.566667, abs=1e-6)
    assert cell["accuracy_sd"] == pytest.approx(0.0763763, abs=1e-7)
    assert (cell["accuracy_min"], cell["accuracy_max"]) == (0.5, 0.65)
    assert cell["accuracy_runs"] == [0.5, 0.55, 0.65]
    assert cell["accuracy_run_ci"] == [list(wilson_interval(k, 60)) for k in (30, 33, 39)]
    assert cell["accuracy_ci"] is None  # no single-run interval for a mean over seeds
    assert cell["hallucination"] == pytest.approx(0.10) and cell["hallucination_sd"] == pytest.approx(0.05)
    assert cell["strict"]["accuracy"] == pytest.approx(0.55) and cell["strict"]["accuracy_sd"] == pytest.approx(
        0.0763763, abs=1e-7)
    one = aggregate_replicates(runs[:1], [7])
    assert one["accuracy_sd"] is None and one["accuracy"] == 0.5 and one["n_seeds"] == 1
    assert format_replicates(cell["accuracy"], cell["accuracy_sd"], 3) == "56.7 ±7.6 sd (3 seeds)"
    assert format_replicates(0.5, None, 1) == "50.0 (1 seed)"
    with pytest.raises(ValueError, match="one seed per run"):
        aggregate_replicates(runs, [1, 2])
    with pytest.raises(ValueError, match="share train and test"):
        aggregate_replicates([runs[0], make_cell("oracle", "0_shot", metrics())], [1, 2])


def test_sweep_report_aggregates_seeds(tmp_path, capsys):
    sweep_dir = three_seed_sweep(tmp_path)
    assert sw.cli_report_sweep(str(sweep_dir)) == 0
    printed = capsys.readouterr().out
    report = sweep_dir / "report"
    summary = json.loads((report / "sweep.json").read_text())
    assert list(summary["tables"]) == ["torchhub"]  # one table, not one per seed
    assert summary["seeds"] == [1, 2, 3]
    table = summary["tables"]["torchhub"]
    assert table["replicates"]["seeds"] == [1, 2, 3]
    assert "greedy" in table["replicates"]["generation"]
    cells = {(c["train_retriever"], c["test_retriever"]): c for c in table["cells"]}
    assert set(cells) == {("none", "0_shot"), ("none", "oracle"), ("oracle", "0_shot")}
    a = cells[("none", "0_shot")]
    assert a["accuracy"] == pytest.approx(102 / 180) and a["accuracy_sd"] == pytest.approx(0.0763763, abs=1e-7)
    assert a["run_cells"] == ["none-1", "none-2", "none-3"]
    assert a["accuracy_run_ci"][2] == pytest.approx(list(wilson_interval(39, 60)))
    b = cells[("none", "oracle")]
    assert b["accuracy"] == pytest.approx(0.75) and b["accuracy_sd"] == pytest.approx(0.05)
    c = cells[("oracle", "0_shot")]
    assert c["seeds"] == [1, 2] and c["n_seeds"] == 2
    assert c["accuracy"] == pytest.approx(76 / 120) and c["accuracy_sd"] == pytest.approx(
        math.sqrt(2) * (40 / 60 - 36 / 60) / 2)  # two values: sd = |a - b| / sqrt(2)
    assert c["accuracy_sd"] == pytest.approx(0.0471405, abs=1e-7)

    md = (report / "torchhub" / "table2.md").read_text()
    none_row = next(line for line in md.splitlines() if line.startswith("| none |"))
    assert none_row == "| none | 56.7 ±7.6 sd (3 seeds) (h 10.0) | 75.0 ±5.0 sd (3 seeds) (h 10.0) |"
    oracle_row = next(line for line in md.splitlines() if line.startswith("| oracle |"))
    assert oracle_row == "| oracle | 63.3 ±4.7 sd (2 seeds) (h 10.0) | - |"
    assert "seeds 1, 2, 3" in md and "Wilson" in md and "greedy" in md
    assert "| none | 56.7 ±7.6 sd (3 seeds)" in printed
    assert md == table2_markdown(table)

    t2_rows = csv.DictReader((report / "torchhub" / "table2.csv").open())
    t2 = {(r["train_retriever"], r["test_retriever"]): r for r in t2_rows}
    assert t2[("none", "0_shot")]["n_seeds"] == "3" and t2[("none", "0_shot")]["seeds"] == "1 2 3"
    assert float(t2[("none", "0_shot")]["accuracy_sd"]) == pytest.approx(0.0763763, abs=1e-6)
    assert float(t2[("none", "0_shot")]["strict_accuracy"]) == pytest.approx(0.55)
    assert t2[("none", "0_shot")]["accuracy_low"] == ""  # the per-run bounds are in replicates.csv

    reps = list(csv.DictReader((report / "replicates.csv").open()))
    assert len(reps) == 3 + 3 + 2  # one row per (cell, seed, test setting) that finished
    assert list(reps[0])[:3] == ["group", "seed", "cell"] and list(reps[0]).count("seed") == 1
    first = reps[0]
    assert (first["group"], first["cell"], first["seed"], first["test_retriever"]) == \
        ("torchhub", "none-1", "1", "0_shot")
    lo, hi = wilson_interval(30, 60)
    assert float(first["accuracy"]) == 0.5 and float(first["accuracy_low"]) == pytest.approx(lo, abs=1e-6)
    assert float(first["accuracy_high"]) == pytest.approx(hi, abs=1e-6)
    assert len(list(csv.DictReader((report / "sweep.csv").open()))) == 8  # per-run rows as before


def test_seed_next_to_other_axes(tmp_path):
    """Other axes still split tables; seed does not."""
    sweep_dir = tmp_path / "sweep"
    for r in (8, 16):
        for seed in (1, 2, 3):
            make_cell_dir(sweep_dir, f"r{r}-s{seed}", {"train_retriever": "none", "lora.r": r, "seed": seed}, "none",
                          {"0_shot": metrics(correct=NONE_ORACLE[seed] - (r == 16) * 12)})
    tables = sw.report_sweep(sweep_dir)
    assert list(tables) == ["torchhub__lora-r-16", "torchhub__lora-r-8"]
    c8 = tables["torchhub__lora-r-8"]["cells"][0]
    c16 = tables["torchhub__lora-r-16"]["cells"][0]
    assert c8["accuracy"] == pytest.approx(0.75) and c16["accuracy"] == pytest.approx(0.55)
    assert c8["accuracy_sd"] == pytest.approx(0.05) and c16["accuracy_sd"] == pytest.approx(0.05)
    assert c8["seeds"] == [1, 2, 3]


@pytest.mark.apibench_data  # its sweep.json has no "released" key only where the real APIBench is found
def test_single_seed_sweep_unchanged(tmp_path):
    """A one-value seed axis (no replicates) is reported exactly as before: seed in the group name,
    plain cells with Wilson intervals, no replicates.csv."""
    sweep_dir = tmp_path / "sweep"
    make_cell_dir(sweep_dir, "a", {"train_retriever": "none", "seed": 1}, "none", {"0_shot": metrics(correct=44)})
    make_cell_dir(sweep_dir, "b", {"train_retriever": "oracle", "seed": 1}, "oracle", {"0_shot": metrics(correct=30)})
    tables = sw.report_sweep(sweep_dir)
    assert list(tables) == ["torchhub__seed-1"]
    table = tables["torchhub__seed-1"]
    assert "replicates" not in table
    cell = next(c for c in table["cells"] if c["train_retriever"] == "none")
    assert "n_seeds" not in cell and cell["accuracy_ci"] == pytest.approx([0.6099, 0.8287], abs=1e-4)
    report = sweep_dir / "report"
    assert not (report / "replicates.csv").exists()
    assert set(json.loads((report / "sweep.json").read_text())) == {"axes", "tables", "worst_case", "best", "no_best", "sources"}
    md = (report / "torchhub__seed-1" / "table2.md").read_text()
    assert "| none | 73.3 [61-83] (h 10.0) |" in md and "sd" not in md
    header = (report / "torchhub__seed-1" / "table2.csv").read_text().splitlines()[0]
    assert "n_seeds" not in header
