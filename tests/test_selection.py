"""eval/selection.py: a checkpoint chosen on a learning curve by a declared rule, worked out by hand."""

from __future__ import annotations

import pytest

from ratune.errors import RatuneError
from ratune.eval.selection import SELECTION_RULES, choose_checkpoint


def _rows(counts: dict[int, dict[str, int]], gorilla: bool = True) -> list[dict]:
    return [{"step": step, "epoch": step / 10, "setting": setting, "n": 20, "strict_correct": k,
             "gorilla_correct": k + 1 if gorilla else None}
            for step, by_setting in counts.items() for setting, k in by_setting.items()]


#: strict correct counts per step and setting:
#:   step 10: 0_shot 3, bm25 5, oracle 9   -> worst 3, mean 17/3
#:   step 20: 0_shot 6, bm25 4, oracle 10  -> worst 4, mean 20/3
#:   step 30: 0_shot 7, bm25 2, oracle 12  -> worst 2, mean 21/3
CURVE = _rows({10: {"0_shot": 3, "bm25": 5, "oracle": 9}, 20: {"0_shot": 6, "bm25": 4, "oracle": 10},
               30: {"0_shot": 7, "bm25": 2, "oracle": 12}})


@pytest.mark.parametrize("rule, step, score", [("zero_shot", 30, 7), ("worst_case", 20, 4), ("mean", 30, 7.0)])
def test_each_rule_chooses_the_checkpoint_worked_out_by_hand(rule, step, score):
    chosen = choose_checkpoint(CURVE, rule)
    assert (chosen["step"], chosen["epoch"], chosen["score"]) == (step, step / 10, score)
    assert chosen["rule"] == rule and chosen["summary"] == SELECTION_RULES[rule].summary


def test_scores_are_listed_by_step_and_the_metric_is_chosen():
    chosen = choose_checkpoint(CURVE, "worst_case")
    assert [(s["step"], s["score"]) for s in chosen["scores"]] == [(10, 3), (20, 4), (30, 2)]
    # the gorilla counts are the strict ones + 1 here: the same steps, scores one higher
    assert choose_checkpoint(CURVE, "worst_case", metric="gorilla")["score"] == 5


def test_a_tie_goes_to_the_earlier_step_whatever_the_row_order():
    tied = _rows({30: {"0_shot": 6}, 10: {"0_shot": 6}, 20: {"0_shot": 5}})
    assert choose_checkpoint(tied, "zero_shot")["step"] == 10


def test_refusals_name_the_way_out():
    with pytest.raises(RatuneError, match="unknown selection rule 'best'"):
        choose_checkpoint(CURVE, "best")
    with pytest.raises(RatuneError, match="no 0_shot cell at step 10; evaluate the curve with --settings 0_shot"):
        choose_checkpoint(_rows({10: {"bm25": 1}}), "zero_shot")
    with pytest.raises(RatuneError, match="the curve has no gorilla metric"):
        choose_checkpoint(_rows({10: {"0_shot": 1}}, gorilla=False), "zero_shot", metric="gorilla")
    with pytest.raises(RatuneError, match="no learning-curve rows"):
        choose_checkpoint([], "mean")
