"""README's reproduction headline, read back from the committed cells: the table's counts are the
committed metrics.json files', and each sentence's comparison is a committed paired test (or
recomputes to it), worded as significant only where its p is below 0.05."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "docs" / "reproduction"
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The README table's rows of our models and the committed arm folder each reads.
ROWS = {"ours, trained without documents, full finetuning, 3 epochs": "none_full3",
        "ours, trained with the gold document (LoRA 1 epoch; full finetuning 1 or 3 epochs answers alike)": "oracle",
        "ours, trained on a mixture (no document, gold, BM25's top-1), full finetuning, 3 epochs": "mix_bm25_full3"}
COLUMNS = ("0_shot", "released_bm25", "oracle")


def _counts(arm: str, setting: str) -> tuple[int, int]:
    metrics = json.loads((REPRO / arm / setting / "metrics.json").read_text())
    return metrics["strict"]["correct_n"], metrics["gorilla"]["correct_n"]


def _comparison(arm: str, key: str, **match) -> dict:
    found = [c for c in json.loads((REPRO / arm / "comparisons.json").read_text())[key]
             if all(c.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (arm, key, match)
    return found[0]


@pytest.mark.parametrize("row, arm", sorted(ROWS.items()))
def test_the_headline_table_is_the_committed_cells(row, arm):
    line = next(l for l in README.splitlines() if l.startswith(f"| {row} |"))
    cells = [c.strip().replace("*", "") for c in line.strip("|").split("|")[1:]]
    assert [tuple(int(x) for x in c.split(" / ")) for c in cells] == [_counts(arm, s) for s in COLUMNS]


def test_the_none_arm_against_released_ft_is_worded_by_its_test():
    strict = _comparison("none_full3", "comparisons", metric="strict", setting="0_shot", released="FT")
    gorilla = _comparison("none_full3", "comparisons", metric="gorilla", setting="0_shot", released="FT")
    assert (strict["a"]["correct_n"], strict["b"]["correct_n"], round(strict["mcnemar_p"], 2)) == (26, 18, 0.17)
    assert (gorilla["a"]["correct_n"], gorilla["b"]["correct_n"], f"{gorilla['mcnemar_p']:.1e}") == (170, 141, "1.5e-05")
    text = " ".join(README.split())
    assert "170 against the released 7B FT model's 141 at 0-shot, p = 1.5e-5" in text
    assert "26 exact calls against its 18, a difference its paired test does not confirm, p = 0.17" in text
    assert not re.search(r"more exact ones than the 7B FT", text)  # a finding only with its significant test


def test_the_retriever_comparison_says_it_changes_two_things():
    c = _comparison("oracle_full1", "vs_released_best_retrieved", metric="strict", released="RT")
    assert (c["a"]["correct_n"], c["b"]["correct_n"], round(c["mcnemar_p"], 4)) == (37, 17, 0.0005)
    assert c["a"]["path"].endswith("dense_ft/responses.jsonl") and c["b"]["path"].endswith("RT_gpt_index.jsonl")
    text = " ".join(README.split())
    assert "37 exact calls where the released RT model makes 17 with the paper's GPT-Index documents (p = 0.0005)" in text
    assert "changes two things at once, the model and the documents" in text


@pytest.mark.apibench_data
def test_a_weak_retriever_hurts_recomputes_from_the_committed_responses():
    from conftest import real_apibench_or_skip

    from ratune.eval.compare import compare_files

    r = compare_files(REPRO / "none_full3" / "0_shot", REPRO / "none_full3" / "released_bm25", hub="torchhub",
                      apibench_dir=real_apibench_or_skip(), metric="strict")
    assert (r["a"]["correct_n"], r["b"]["correct_n"], round(r["mcnemar_p"], 3)) == (26, 11, 0.008)
    assert "a weak retriever hurts it (26 -> 11, p = 0.008)" in " ".join(README.split())
