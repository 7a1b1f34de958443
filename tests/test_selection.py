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
    assert main(["eval", "select", str(tmp_path / "curve"), "--rule", "worst_case", "--checkpoint-only",
                 "--out", str(tmp_path / "selection.json")]) == 0
    assert capsys.readouterr().out == chosen["checkpoint"] + "\n"  # for a script: CHECKPOINT=$(...)
    assert json.loads((tmp_path / "selection.json").read_text()) == chosen
    (tmp_path / "mine.json").write_text("{}")  # a file ratune did not write is never replaced
    assert main(["eval", "select", str(tmp_path / "curve"), "--rule", "mean", "--out", str(tmp_path / "mine.json")]) == 2
    assert "exists and is not a ratune eval select choice; not overwritten" in capsys.readouterr().err
    assert (tmp_path / "mine.json").read_text() == "{}"
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


def test_a_sweep_evaluates_the_checkpoint_chosen_on_validation(tmp_path, monkeypatch, capsys):
    """With eval.selection_rule each cell runs: train, the curve on the validation questions, the
    choice (CELL/selection.json), then eval.settings on the chosen checkpoint; a rerun skips it; the
    Slurm script chooses in the job; the report sets validation and test side by side."""
    import json
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.eval.curve import curve_row
    from test_curve import metric_block
    from test_sweep import BASE, FakeRunner, args, write_sweep

    class Runner(FakeRunner):
        """Also leaves what a curve and a choice leave: curve.json (step 2 best on validation) and selection.json."""

        def __call__(self, cmd, log_path):
            out = Path(cmd[cmd.index("--out") + 1]) if "--out" in cmd else None
            if cmd[:3] == ["ratune", "eval", "select"]:
                self.calls.append(cmd)
                out.write_text(json.dumps({"rule": "zero_shot", "metric": "strict", "step": 2, "epoch": 1.0,
                                           "score": 3, "checkpoint": str(out.parent / "train/trainer/checkpoint-2")}))
            elif "--all-checkpoints" in cmd:
                self.calls.append(cmd)
                out.mkdir(parents=True, exist_ok=True)
                rows = [curve_row(s, s / 2, "0_shot", {"n": 5, "strict": metric_block(s + 1, 0, 4 - s),
                                                        "gorilla": metric_block(s + 2, 0, 3 - s)}) for s in (1, 2)]
                (out / "curve.json").write_text(json.dumps({"run": "r", "hub": "torchhub", "rows": rows}))
            else:
                super().__call__(cmd, log_path)

    base = {**BASE, "save_steps": 1}
    selection = {"settings": ["0_shot", "oracle"], "n_questions": 5, "curve_settings": ["0_shot"],
                 "selection_rule": "zero_shot"}
    path = write_sweep(tmp_path, base=base, eval=selection, data={"max_length": 256, "validation_fraction": 0.1})
    runner = Runner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    sweep = sw.load_sweep(path)
    for cell in sw.expand(sweep):
        steps = [c for c in runner.calls if cell.name in " ".join(c)]
        kinds = ["train" if c[0] == "accelerate" else "curve" if "--all-checkpoints" in c else c[2] for c in steps]
        assert kinds == ["train", "curve", "select", "run"], kinds
        _, curve, _, test = steps
        assert curve[curve.index("--split") + 1] == "validation"
        assert test[test.index("--checkpoint") + 1] == str(cell.dir / "train/trainer/checkpoint-2")
        assert "--split" not in test and sw.is_finished(sweep, cell)
    runner.calls.clear()
    assert sw.cli_sweep(args(path)) == 0 and runner.calls == []  # finished: nothing runs again
    capsys.readouterr()
    # the Slurm job chooses, then evaluates what it chose
    assert sw.cli_sweep(args(path, launcher="slurm", out=tmp_path / "s")) == 0
    script = next((tmp_path / "s" / "cells").glob("*/slurm/eval.sbatch")).read_text().splitlines()
    select = next(i for i, line in enumerate(script) if line.startswith("CHECKPOINT=$(ratune eval select "))
    assert "--checkpoint \"$CHECKPOINT\"" in script[select + 1] and "--all-checkpoints" in script[select - 1]
    # the report: the chosen step, its validation counts and its test counts
    assert sw.cli_report_sweep(str(tmp_path / "sweep")) == 0
    table = (tmp_path / "sweep" / "report" / "selection.md").read_text()
    assert "| zero_shot (strict) | 2 | 1 | 0_shot 3/5 (gorilla 4) | 0_shot 4/10 (gorilla 5); oracle 4/10 (gorilla 5) |" in table
    # ... and Table 2 marks each row's chosen checkpoint under the table
    tables = sorted((tmp_path / "sweep" / "report").glob("*/table2.md"))
    text = "".join(t.read_text() for t in tables)
    marked = [line for line in text.splitlines() if line.endswith(" | zero_shot (strict) | 2 | 1 | 0_shot 3/5 | "
                                                                  "0_shot 4/10; oracle 4/10 |")]
    assert len(marked) == len(sw.expand(sweep)) and "## checkpoints chosen on validation" in text
    chosen = [json.loads(t.with_suffix(".json").read_text())["chosen"] for t in tables]
    assert sorted(r for c in chosen for r in c) == sorted(cell.config["train_retriever"] for cell in sw.expand(sweep))
    # refused before anything runs: no curve to choose on, no validation questions to draw it on
    for eval_section, data, missing in (({**selection, "curve_settings": []}, {"validation_fraction": 0.1},
                                         "set eval.curve_settings"),
                                        (selection, {}, "set data.validation_fraction")):
        bad = write_sweep(tmp_path, base=base, eval=eval_section, data=data)
        with pytest.raises(RatuneError, match=missing):
            sw.cli_sweep(args(bad, out=tmp_path / "refused"))
