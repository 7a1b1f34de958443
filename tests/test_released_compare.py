"""Cells compared with the released Gorilla-7B responses made with the same documents:
ratune/registry.py TestSetting.released, eval/compare.py compare_with_released, and the
sweep report's released.{md,json}. The released files' counts are the anchors (n = 186,
TorchHub): FT 0_shot gorilla 141 / strict 18, RT 0_shot 0 / 0, RT bm25 strict 14."""

from __future__ import annotations

import json
import shutil

import pytest
from sweep_cells import finished_cell, rate_metrics

from ratune.errors import RatuneError
from ratune.registry import RELEASED_MODELS, TEST_SETTINGS


def _cell(tmp_path, apibench, setting, released_file):
    folder = tmp_path / "eval" / setting
    folder.mkdir(parents=True)
    shutil.copy(apibench / "responses" / released_file, folder / "responses.jsonl")
    return folder


def test_released_counterparts_in_the_registry():
    assert {n: s.released for n, s in TEST_SETTINGS.items() if s.released} == {
        "0_shot": "0_shot", "gpt_index": "gpt_index", "released_bm25": "bm25", "oracle": "oracle"}
    assert TEST_SETTINGS["bm25"].released is None  # ours: no released file used these documents
    assert RELEASED_MODELS == ("FT", "RT")


def test_a_copy_of_ft_against_ft_and_rt(tmp_path, apibench):
    from ratune.eval.compare import compare_with_released, released_markdown

    cell = _cell(tmp_path, apibench, "0_shot", "response_torchhub_Gorilla_FT_0_shot.jsonl")
    results = compare_with_released(cell, "0_shot", hub="torchhub", apibench_dir=apibench)
    by = {(r["released"], r["metric"]): r for r in results}
    assert sorted(by) == [("FT", "gorilla"), ("FT", "strict"), ("RT", "gorilla"), ("RT", "strict")]
    same = by[("FT", "strict")]
    assert same["n"] == 186 and same["a"]["correct_n"] == same["b"]["correct_n"] == 18
    assert same["contingency"]["only_a"] == same["contingency"]["only_b"] == 0
    assert same["mcnemar_p"] == 1.0 and same["difference"]["value"] == 0.0
    # RT answers 0 of 186 0-shot: every one of FT's 141 (gorilla) / 18 (strict) is discordant,
    # p = 2 x (1/2)^18 for strict
    rt = by[("RT", "strict")]
    assert (rt["a"]["correct_n"], rt["b"]["correct_n"], rt["contingency"]["only_a"]) == (18, 0, 18)
    assert rt["mcnemar_p"] == pytest.approx(2 / 2 ** 18)
    assert by[("RT", "gorilla")]["contingency"]["only_a"] == 141
    assert by[("RT", "gorilla")]["difference"]["value"] == pytest.approx(141 / 186)
    table = released_markdown([{**r, "cell": "train_retriever=none"} for r in results]).splitlines()
    assert len(table) == 2 + 4
    assert "| train_retriever=none | 0_shot | strict | 18/186 | RT | 0/186 | 18 | 0 | 7.63e-06 |" in table[2:][3]


def test_released_bm25_is_compared_with_the_released_bm25_files(tmp_path, apibench):
    from ratune.eval.compare import compare_with_released

    cell = _cell(tmp_path, apibench, "released_bm25", "response_torchhub_Gorilla_RT_bm25.jsonl")
    results = compare_with_released(cell, "released_bm25", hub="torchhub", apibench_dir=apibench)
    rt = next(r for r in results if r["released"] == "RT" and r["metric"] == "strict")
    assert rt["b"]["path"].endswith("response_torchhub_Gorilla_RT_bm25.jsonl")
    assert rt["a"]["correct_n"] == rt["b"]["correct_n"] == 14 and rt["mcnemar_p"] == 1.0
    assert compare_with_released(cell, "dense", hub="torchhub", apibench_dir=apibench) == []


def test_subsets_are_skipped_not_compared(tmp_path, apibench):
    from ratune.eval.compare import compare_with_released, released_comparisons

    cell = tmp_path / "eval" / "oracle"
    cell.mkdir(parents=True)
    lines = (apibench / "responses" / "response_torchhub_Gorilla_RT_oracle.jsonl").read_text().splitlines()[:50]
    (cell / "responses.jsonl").write_text("\n".join(lines) + "\n")
    results, skipped = released_comparisons(
        [{"cell": "c", "path": cell, "setting": "oracle", "hub": "torchhub", "n": 50},
         {"cell": "c", "path": cell, "setting": "bm25", "hub": "torchhub", "n": 50}], apibench)
    assert results == []
    assert skipped == [{"cell": "c", "setting": "oracle", "reason": "50 of the 186 questions the released files answer"}]
    with pytest.raises(RatuneError, match="unpaired comparison refused: A has 50 questions, B has 186"):
        compare_with_released(cell, "oracle", hub="torchhub", apibench_dir=apibench)


def test_sweep_report_writes_released_comparisons(tmp_path, apibench):
    from ratune.sweep import report_sweep

    sweep = tmp_path / "sweep"
    full = rate_metrics(186, 110, 0)
    d = finished_cell(sweep, "train_retriever-none-x", {"train_retriever": "none"},
                      {"oracle": full, "dense": full, "0_shot": rate_metrics(50, 3, 1)})
    shutil.copy(apibench / "responses" / "response_torchhub_Gorilla_FT_oracle.jsonl",
                d / "eval" / "oracle" / "responses.jsonl")
    (sweep / "sweep.yaml").write_text(f"apibench: {apibench}\nbase: {{}}\n")
    report_sweep(sweep)
    released = json.loads((sweep / "report" / "released.json").read_text())
    assert {(r["released"], r["metric"], r["setting"]) for r in released["comparisons"]} == {
        (m, metric, "oracle") for m in ("FT", "RT") for metric in ("gorilla", "strict")}
    assert released["skipped"] == [{"cell": "train_retriever=none hub=torchhub", "setting": "0_shot",
                                    "reason": "50 of the 186 questions the released files answer"}]
    ft = next(r for r in released["comparisons"] if r["released"] == "FT" and r["metric"] == "strict")
    assert ft["a"]["correct_n"] == ft["b"]["correct_n"] == 144  # a copy of FT oracle: strict 144 (the anchors)
    assert "| train_retriever=none hub=torchhub | oracle | strict | 144/186 | FT |" in \
        (sweep / "report" / "released.md").read_text()


def _sweep_with_a_full_cell(tmp_path, sweep_yaml: str):
    sweep = tmp_path / "sweep"
    finished_cell(sweep, "train_retriever-none-x", {"train_retriever": "none"}, {"oracle": rate_metrics(186, 110, 0)})
    (sweep / "sweep.yaml").write_text(sweep_yaml)
    return sweep


def test_sweep_report_without_the_default_apibench_skips_the_released_comparisons(tmp_path, monkeypatch, capsys):
    from ratune.sweep import report_sweep

    monkeypatch.setenv("RATUNE_APIBENCH", str(tmp_path / "absent"))
    sweep = _sweep_with_a_full_cell(tmp_path, "base: {}\n")
    report_sweep(sweep)
    summary = json.loads((sweep / "report" / "sweep.json").read_text())
    assert summary["released"]["comparisons"] == 0
    assert summary["released"]["not_compared"].startswith(f"APIBench folder not found (tried {tmp_path / 'absent'})")
    assert not (sweep / "report" / "released.json").exists()
    assert "no comparisons with the released responses" in capsys.readouterr().err
    assert (sweep / "report" / "torchhub" / "table2.json").is_file()  # the rest of the report is written


def test_sweep_report_refuses_a_missing_apibench_the_sweep_file_names(tmp_path):
    from ratune.sweep import report_sweep

    sweep = _sweep_with_a_full_cell(tmp_path, f"apibench: {tmp_path / 'typo'}\nbase: {{}}\n")
    with pytest.raises(RatuneError, match=r"sweep\.yaml: apibench: APIBench folder not found \(tried .*typo\)"):
        report_sweep(sweep)
    assert not (sweep / "report" / "sweep.json").exists()  # the summary is not written
