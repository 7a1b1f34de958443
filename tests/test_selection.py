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


def test_a_curve_on_the_validation_questions_chooses_a_checkpoint(tmp_path, apibench_tiny, smol_tokenizer_dir,
                                                                  tiny_model_dir, monkeypatch, capsys):
    """``--split validation`` asks the questions the checkpoint's data build held out, numbered 1..n,
    scored against their own gold APIs; the cells record which build and lines; a curve of them
    feeds a selection rule. The paper's documents (eval questions only) and a model without a run
    manifest are refused."""
    import json

    from ratune.cli import main
    from ratune.eval.curve import evaluate_curve
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.hubs import resolve_hub
    from ratune.sources.prompt import format_answer
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    data = tmp_path / "data"
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(data),
                 "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", "--validation-fraction", "0.34",
                 "--validation-by", "api_grouped"]) == 0
    held = json.loads((data / "manifest.json").read_text())["validation_split"]["lines"]
    assert len(held) == 4  # two whole APIs, two examples each: not the first four eval questions' APIs
    train(TrainConfig(model=str(tiny_model_dir), data_dir=str(data), train_retriever="none",
                      output_dir=str(tmp_path / "run"), max_length=512, global_batch_size=2, max_steps=2,
                      save_steps=1, warmup_ratio=0.0, lr_scheduler="constant", torch_threads=1))
    gold = {e.instruction: format_answer(e.answer)
            for e in resolve_hub("torchhub", apibench_tiny).load_examples("train") if e.line in held}

    def answers(backend, model, tokenizer, prompts, **kw):  # the gold answer of each held-out question
        texts = [tokenizer.decode(p) for p in prompts]
        return [[(j, next((a for q, a in gold.items() if q in text), "no answer")) for j, text in enumerate(texts)]]

    monkeypatch.setattr("ratune.eval.run.backend_batches", answers)
    settings = EvalSettings(settings=("0_shot", "oracle"), split="validation", batch_size=4, max_new_tokens=8,
                            torch_threads=1)
    rows = evaluate_curve(tmp_path / "run", hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "curve",
                          settings=settings, progress=False)
    assert [(r["step"], r["setting"], r["n"], r["strict_correct"]) for r in rows] == [
        (1, "0_shot", 4, 4), (1, "oracle", 4, 4), (2, "0_shot", 4, 4), (2, "oracle", 4, 4)]
    cell = tmp_path / "curve" / "step2" / "oracle"
    identity = json.loads((cell / "identity.json").read_text())
    assert (identity["split"], identity["lines"], identity["questions"]) == ("validation", held, [1, 2, 3, 4])
    assert json.loads((cell / "metrics.json").read_text())["split"] == "validation"
    assert choose_checkpoint(rows, "worst_case")["step"] == 1  # a tie: the earlier step
    capsys.readouterr()
    assert main(["eval", "select", str(tmp_path / "curve"), "--rule", "worst_case", "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert (chosen["step"], chosen["checkpoint"]) == (1, str(tmp_path / "run" / "trainer" / "checkpoint-1"))
    # a curve of the test questions is not chosen on
    evaluate_curve(tmp_path / "run", hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "test_curve",
                   settings=EvalSettings(settings=("0_shot",), n_questions=2, torch_threads=1), progress=False)
    assert main(["eval", "select", str(tmp_path / "test_curve"), "--rule", "zero_shot"]) == 2
    assert "a learning curve of the eval questions" in capsys.readouterr().err
    with pytest.raises(RatuneError, match="test setting gpt_index: the paper's documents exist for its eval "
                                          "questions only, not for validation questions"):
        evaluate_checkpoint(tmp_path / "run", hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "g",
                            settings=EvalSettings(settings=("gpt_index",), split="validation"), progress=False)
    with pytest.raises(RatuneError, match="has no run manifest naming the data it was trained on"):
        evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "m",
                            settings=EvalSettings(settings=("0_shot",), split="validation"), progress=False)
