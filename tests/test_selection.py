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


@pytest.mark.parametrize("rule, step, score", [("zero_shot", 30, 7), ("oracle", 30, 12), ("worst_case", 20, 4),
                                              ("mean", 30, 7.0)])
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


def test_balanced_takes_the_worse_of_calling_and_abstaining_worked_out_by_hand():
    """A tool set's curve: 10 questions that call and 30 that call nothing. Step 10 abstains on all:
    plain accuracy 30/40 but 0 of the calls; step 20 gets 4/10 calls and 24/30 abstentions (28/40);
    step 30 gets 6/10 and 15/30 (21/40). worst_case (one setting: plain accuracy) keeps step 10;
    balanced scores min(0, 1) = 0, min(0.4, 0.8) = 0.4, min(0.6, 0.5) = 0.5 and keeps step 30. With
    two settings it takes each step's worse setting: step 30's bm25 row, min(0.1, 0.9), brings it to 0.1."""
    def row(step, setting, call, no_call):
        return {"step": step, "epoch": step / 10, "setting": setting, "n": 40, "strict_correct": call + no_call,
                "gorilla_correct": None, "by_answer": {"call": {"n": 10, "correct_n": call},
                                                       "no_call": {"n": 30, "correct_n": no_call}}}

    curve = [row(10, "oracle", 0, 30), row(20, "oracle", 4, 24), row(30, "oracle", 6, 15)]
    assert choose_checkpoint(curve, "worst_case")["step"] == 10
    chosen = choose_checkpoint(curve, "balanced")
    assert [(s["step"], s["score"]) for s in chosen["scores"]] == [(10, 0.0), (20, 0.4), (30, 0.5)]
    assert (chosen["step"], chosen["score"]) == (30, 0.5)
    two = curve + [row(10, "bm25", 0, 30), row(20, "bm25", 4, 24), row(30, "bm25", 1, 27)]
    assert [(s["step"], s["score"]) for s in choose_checkpoint(two, "balanced")["scores"]] == [
        (10, 0.0), (20, 0.4), (30, 0.1)]
    # a kind without questions is left out: only calling questions -> their accuracy
    only_calls = [{**row(10, "oracle", 3, 0), "by_answer": {"call": {"n": 10, "correct_n": 3},
                                                           "no_call": {"n": 0, "correct_n": 0}}}]
    assert choose_checkpoint(only_calls, "balanced")["score"] == 0.3
    # an APIBench or catalog curve has no by_answer counts; nor has the gorilla metric
    with pytest.raises(RatuneError, match=r"selection rule balanced: the curve has no strict counts by reference "
                                          r"answer \(by_answer: a tool set's curve, --metric strict; a curve scored "
                                          r"before ratune counted them lacks them\)"):
        choose_checkpoint(CURVE, "balanced")
    with pytest.raises(RatuneError, match="the curve has no strict counts by reference answer"):
        choose_checkpoint(curve, "balanced", metric="gorilla")


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
    feeds a selection rule. The paper's documents (eval questions only), a finetuned retriever that
    trained on the validation questions and a model without a run manifest are refused."""
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
    # dense_ft on validation questions: a finetuned retriever that trained on them is refused
    from ratune.io import sha256_file
    from ratune.retrieval.retrievers import RETRIEVER_METADATA_FILE

    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(
        {"hub": "torchhub", "train_sha256": sha256_file(resolve_hub("torchhub", apibench_tiny).examples_file("train"))}))
    with pytest.raises(RatuneError, match=r"test setting dense_ft on validation questions: the finetuned retriever "
                                          r".* trained on 4 of the 4 validation questions"):
        evaluate_checkpoint(tmp_path / "run", hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "d",
                            settings=EvalSettings(settings=("0_shot", "dense_ft"), split="validation",
                                                  dense_model=str(tmp_path / "ft")), progress=False)
    assert not (tmp_path / "d").exists()
    with pytest.raises(RatuneError, match="has no run manifest naming the data it was trained on"):
        evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench_tiny, out_dir=tmp_path / "m",
                            settings=EvalSettings(settings=("0_shot",), split="validation"), progress=False)



def choosing_runner(base, *, rule: str, setting: str, hub: str, epochs: dict, metrics):
    """A fake runner class on ``base`` (tests/test_sweep.py) that also leaves what a curve and a
    choice leave: curve.json with a row per step of ``epochs`` (``{step: epoch}``) under ``setting``,
    ``metrics(step)`` its counts, and selection.json choosing the last step by ``rule``."""
    import json
    from pathlib import Path

    from ratune.eval.curve import curve_row

    class Runner(base):
        def __call__(self, cmd, log_path):
            out = Path(cmd[cmd.index("--out") + 1]) if "--out" in cmd else None
            if cmd[:3] == ["ratune", "eval", "select"]:
                self.calls.append(cmd)
                step = max(epochs)
                out.write_text(json.dumps({"rule": rule, "metric": "strict", "step": step, "epoch": epochs[step],
                                           "score": 3,
                                           "checkpoint": str(out.parent / f"train/trainer/checkpoint-{step}")}))
            elif "--all-checkpoints" in cmd:
                self.calls.append(cmd)
                out.mkdir(parents=True, exist_ok=True)
                rows = [curve_row(s, e, setting, metrics(s)) for s, e in epochs.items()]
                (out / "curve.json").write_text(json.dumps({"run": "r", "hub": hub, "rows": rows}))
            else:
                super().__call__(cmd, log_path)

    return Runner



def run_choosing_sweep(path, runner, monkeypatch, test_step: str):
    """Run the sweep file ``path`` with ``runner`` (:func:`choosing_runner`); assert that each cell
    ran train, its curve, the choice and ``test_step`` (``run`` or ``bfcl``) on checkpoint 2 and is
    finished. Returns the sweep and each cell's commands."""
    import ratune.sweep as sw
    from test_sweep import args

    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    sweep, per_cell = sw.load_sweep(path), []
    for cell in sw.expand(sweep):
        steps = [c for c in runner.calls if cell.name in " ".join(c)]
        kinds = ["train" if c[0] == "accelerate" else "curve" if "--all-checkpoints" in c else c[2] for c in steps]
        assert kinds == ["train", "curve", "select", test_step], kinds
        assert steps[-1][steps[-1].index("--checkpoint") + 1] == str(cell.dir / "train/trainer/checkpoint-2")
        assert sw.is_finished(sweep, cell)
        per_cell.append(steps)
    return sweep, per_cell


def test_a_sweep_evaluates_the_checkpoint_chosen_on_validation(tmp_path, monkeypatch, capsys):
    """With eval.selection_rule each cell runs: train, the curve on the validation questions, the
    choice (CELL/selection.json), then eval.settings on the chosen checkpoint; a rerun skips it; the
    Slurm script chooses in the job; the report sets validation and test side by side."""
    import json

    import ratune.sweep as sw
    from test_curve import metric_block
    from test_sweep import BASE, FakeRunner, args, write_sweep

    Runner = choosing_runner(FakeRunner, rule="zero_shot", setting="0_shot", hub="torchhub", epochs={1: 0.5, 2: 1.0},
                             metrics=lambda s: {"n": 5, "strict": metric_block(s + 1, 0, 4 - s),
                                                "gorilla": metric_block(s + 2, 0, 3 - s)})  # step 2 best

    base = {**BASE, "save_steps": 1}
    selection = {"settings": ["0_shot", "oracle"], "n_questions": 5, "curve_settings": ["0_shot"],
                 "selection_rule": "zero_shot"}
    path = write_sweep(tmp_path, base=base, eval=selection, data={"max_length": 256, "validation_fraction": 0.1})
    runner = Runner()
    sweep, per_cell = run_choosing_sweep(path, runner, monkeypatch, "run")
    for _, curve, _, test in per_cell:
        assert curve[curve.index("--split") + 1] == "validation" and "--split" not in test
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
    marked = [line for line in text.splitlines() if line.endswith(" | zero_shot (strict) | 2 | 1 | 0_shot 3/5 (gorilla 4) | "
                                                                  "0_shot 4/10 (gorilla 5); oracle 4/10 (gorilla 5) |")]
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
    # ... a dense_ft curve with a finetuned retriever that did not hold this validation split out
    from ratune.hubs import resolve_hub
    from ratune.io import sha256_file
    from ratune.retrieval.retrievers import RETRIEVER_METADATA_FILE
    from ratune.retrieval.finetune import retriever_examples
    from ratune.sources.validate import HoldoutSettings

    hub = resolve_hub("torchhub")
    lines = retriever_examples(hub, HoldoutSettings(validation_fraction=0.1))[1]["lines"]
    meta = {"hub": "torchhub", "train_sha256": sha256_file(hub.examples_file("train"))}
    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(
        {**meta, "validation_split": {"lines": lines[1:]}}))  # trained on one of them
    bad = write_sweep(tmp_path, base=base, data={"validation_fraction": 0.1},
                      eval={**selection, "curve_settings": ["0_shot", "dense_ft"], "dense_model": str(tmp_path / "ft")})
    with pytest.raises(RatuneError, match=rf"sweep.yaml: eval.curve_settings dense_ft \(the validation questions\): "
                                          rf"the finetuned retriever .*ft trained on 1 of the {len(lines)} validation "
                                          rf"questions \(lines {lines[0]} of .*; train one that holds them out: ratune "
                                          r"retrieval train --hub torchhub --validation-fraction 0.1 --validation-by "
                                          r"api_stratified --validation-seed 0 --out DIR"):
        sw.cli_sweep(args(bad, out=tmp_path / "refused", dry_run=True))
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps({**meta, "validation_split": {"lines": lines}}))
    assert sw.cli_sweep(args(bad, out=tmp_path / "planned", dry_run=True)) == 0  # held out: planned


def test_a_sweep_evaluated_on_validation_questions_is_checked_before_anything_runs(tmp_path):
    """``eval.split: validation`` without a selection rule runs eval.settings and the curve on the
    validation questions: refused at expansion (before any training) without data.validation_fraction,
    with a setting that exists for test questions only, and with a dense_ft setting whose retriever
    trained on them (eval.settings, not only the curve); planned once the retriever held them out."""
    import json

    import ratune.sweep as sw
    from ratune.hubs import resolve_hub
    from ratune.io import sha256_file
    from ratune.retrieval.retrievers import RETRIEVER_METADATA_FILE
    from ratune.retrieval.finetune import retriever_examples
    from ratune.sources.validate import HoldoutSettings
    from test_sweep import write_sweep

    on_validation = {"settings": ["0_shot", "oracle"], "n_questions": 5, "split": "validation"}
    fraction = {"max_length": 256, "validation_fraction": 0.1}

    def cells(**over):
        return sw.expand(sw.load_sweep(write_sweep(tmp_path, **over)))

    with pytest.raises(RatuneError, match=r"sweep.yaml: eval.split validation: 0_shot, oracle run on the validation "
                                          r"questions; set data.validation_fraction"):
        cells(eval=on_validation)
    with pytest.raises(RatuneError, match=r"sweep.yaml: eval.split validation: test setting gpt_index: the paper's "
                                          r"documents exist for its eval questions only, not for validation questions"):
        cells(eval={**on_validation, "settings": ["0_shot", "gpt_index"]}, data=fraction)
    with pytest.raises(RatuneError, match=r"eval.split validation: test setting constraints_released_bm25: the paper's"):
        cells(eval={**on_validation, "settings": ["constraints_released_bm25"]}, data=fraction)
    hub = resolve_hub("torchhub")
    lines = retriever_examples(hub, HoldoutSettings(validation_fraction=0.1))[1]["lines"]
    (tmp_path / "ft").mkdir()
    meta = {"hub": "torchhub", "train_sha256": sha256_file(hub.examples_file("train")),
            "validation_split": {"lines": lines[:-1]}}  # trained on the last of them
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(meta))
    finetuned = {**on_validation, "settings": ["dense_ft"], "dense_model": str(tmp_path / "ft")}
    with pytest.raises(RatuneError, match=rf"sweep.yaml: eval.settings dense_ft \(the validation questions\): the "
                                          rf"finetuned retriever .*ft trained on 1 of the {len(lines)} validation "
                                          rf"questions \(lines {lines[-1]} of "):
        cells(eval=finetuned, data=fraction)
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps({**meta, "validation_split": {"lines": lines}}))
    assert [c.config["train_retriever"] for c in cells(eval=finetuned, data=fraction)] == ["none", "oracle"]
    # the test questions (eval.split eval) need no split and may read the paper's documents
    assert len(cells(eval={**on_validation, "split": "eval", "settings": ["gpt_index"]})) == 2


def test_validation_counts_are_reported_as_such_and_never_exported_as_test_results(tmp_path, capsys, monkeypatch):
    """A sweep with eval.split validation (no rule): Table 2 says its 10 questions per cell are
    validation questions, the report names no best cell to export, and ratune export refuses those
    cells for a model card, from the eval folder and from table2.json, naming the file and field."""
    import json
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.errors import InputError
    from ratune.export.checkpoint import _table2_cells
    from test_sweep import FakeRunner, args, finish_eval, metrics, write_sweep

    class Runner(FakeRunner):  # eval run --split S writes metrics.json with split S, as eval/run.py does
        def __call__(self, cmd, log_path):
            if cmd[:3] == ["ratune", "eval", "run"]:
                self.calls.append(cmd)
                for s in ("0_shot", "oracle"):
                    finish_eval(Path(cmd[cmd.index("--out") + 1]), s,
                                {**metrics(), "split": cmd[cmd.index("--split") + 1]})
                return
            super().__call__(cmd, log_path)

    path = write_sweep(tmp_path, eval={"settings": ["0_shot", "oracle"], "n_questions": 5, "split": "validation"},
                       data={"max_length": 256, "validation_fraction": 0.1})
    monkeypatch.setattr("ratune.sweep.local.run_command", Runner())
    assert sw.cli_sweep(args(path)) == 0
    assert sw.cli_report_sweep(str(tmp_path / "sweep")) == 0
    out = capsys.readouterr().out
    assert "n = 10 validation questions (held out of training, not the test questions) per cell." in out
    assert "best in torchhub" not in out and ("no best cell in torchhub: its cells are scored on the validation "
                                               "questions (eval.split)") in out
    table2 = tmp_path / "sweep" / "report" / "torchhub" / "table2.json"
    assert {c["split"] for c in json.loads(table2.read_text())["cells"]} == {"validation"}
    with pytest.raises(InputError, match=r"table2.json: field 'cells\[0\].split': scored on the validation questions "
                                         r"\(ratune eval run --split validation\); a model card reports the test"):
        _table2_cells("none", table2, None, tmp_path / "model")
    cell = next((tmp_path / "sweep" / "cells").glob("*none*"))
    with pytest.raises(RatuneError, match=r"/eval/0_shot/metrics.json: scored on the validation questions"):
        _table2_cells("none", None, [cell / "eval"], tmp_path / "model")


def test_a_sweep_tested_on_bfcl_alone_reads_the_chosen_checkpoint(tmp_path, monkeypatch, capsys):
    """No eval.settings and a bfcl: section (configs/bfcl/unseen.yaml): each cell runs train, the
    validation curve, the choice and ``ratune eval bfcl`` of the chosen checkpoint, no ``eval run`` of
    test questions; the dry run and the Slurm job say the same, and the Slurm data job of a tool-set
    folder hub is named by its data folder. With neither eval.settings nor bfcl: refused."""
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.sources.toolset import import_tool_set
    from test_curve import metric_block
    from test_sweep import BASE, BfclRunner, args, write_sweep

    fixtures = Path(__file__).resolve().parent / "fixtures" / "tools"
    import_tool_set(tmp_path / "ts", rows_file=fixtures / "xlam_rows.jsonl", eval_fraction=0, name="mine")

    Runner = choosing_runner(BfclRunner, rule="worst_case", setting="oracle", hub="mine", epochs={1: 1.0, 2: 2.0},
                             metrics=lambda s: {"n": 5, "strict": metric_block(s + 1, 0, 4 - s)})  # step 2 best

    evaluation = {"settings": [], "curve_settings": ["oracle"], "selection_rule": "worst_case"}
    path = write_sweep(tmp_path, base={**BASE, "hub": str(tmp_path / "ts"), "save_steps": 1}, eval=evaluation,
                       data={"max_length": 512, "validation_fraction": 0.4, "validation_by": "api_grouped",
                             "leakage": "allow", "same_examples": True},
                       bfcl={"categories": ["multiple"], "unseen_by": str(tmp_path / "ts")})
    monkeypatch.setattr("ratune.sweep.local.run_command", lambda *a: pytest.fail("dry run ran a command"))
    assert sw.cli_sweep(args(path, dry_run=True)) == 0
    dry = capsys.readouterr().out
    assert "  eval:  " not in dry and dry.count("  bfcl:  ratune eval bfcl --checkpoint CHOSEN_CHECKPOINT ") == 2
    assert "--same-examples" in dry
    runner = Runner()
    run_choosing_sweep(path, runner, monkeypatch, "bfcl")
    runner.calls.clear()
    assert sw.cli_sweep(args(path)) == 0 and runner.calls == []
    capsys.readouterr()
    assert sw.cli_sweep(args(path, launcher="slurm", out=tmp_path / "s")) == 0
    script = next((tmp_path / "s" / "cells").glob("*/slurm/eval.sbatch")).read_text().splitlines()
    assert script[-2].startswith("CHECKPOINT=$(ratune eval select ")
    assert script[-1].startswith('ratune eval bfcl --checkpoint "$CHECKPOINT" --out ')
    assert not any(line.startswith("ratune eval run ") and "--all-checkpoints" not in line for line in script)
    submit = (tmp_path / "s" / "slurm" / "submit.sh").read_text()
    assert "data_mine_jid=$(sbatch --parsable " in submit and (tmp_path / "s" / "slurm" / "data_mine.sbatch").is_file()
    with pytest.raises(RatuneError, match="eval.settings is empty and there is no bfcl: section"):
        sw.expand(sw.load_sweep(write_sweep(tmp_path, eval={"settings": []})))


@pytest.mark.bfcl
def test_the_report_of_a_sweep_tested_on_bfcl_alone(tmp_path, monkeypatch, capsys):
    """No eval cells, but a choice and BFCL categories: the report has no Table 2 and no sweep.csv,
    and selection.md sets the chosen step's validation counts beside its BFCL counts (the answer
    keys given as answers: 2 of 2)."""
    import json
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.cli import main
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text
    from ratune.sources.toolset import import_tool_set
    from test_curve import metric_block
    from test_sweep import BASE, FakeRunner, args, write_sweep

    import_tool_set(tmp_path / "ts", rows_file=Path(__file__).resolve().parent / "fixtures" / "tools" /
                    "xlam_rows.jsonl", eval_fraction=0, name="mine")
    given = tmp_path / "given" / "simple_python"
    given.mkdir(parents=True)
    given.joinpath("responses.jsonl").write_text("".join(
        json.dumps({"id": e.id, "text": possible_answer_text(e.possible_answer, e.functions)}) + "\n"
        for e in load_bfcl(bfcl_data_dir(), "simple_python")[:2]))

    class Runner(choosing_runner(FakeRunner, rule="worst_case", setting="oracle", hub="mine", epochs={1: 1.0},
                                 metrics=lambda s: {"n": 5, "strict": metric_block(3, 0, 2), "calls": {
                                     "by_answer": {"call": {"n": 2, "correct_n": 1},
                                                   "no_call": {"n": 3, "correct_n": 2}}}})):
        def __call__(self, cmd, log_path):
            if cmd[:3] == ["ratune", "eval", "bfcl"]:
                assert main(["eval", "bfcl", "--responses", str(given.parent), "--out",
                             cmd[cmd.index("--out") + 1]]) == 0
            else:
                super().__call__(cmd, log_path)

    monkeypatch.setattr("ratune.sweep.local.run_command", Runner())
    path = write_sweep(tmp_path, base={**BASE, "hub": str(tmp_path / "ts"), "save_steps": 1},
                       eval={"settings": [], "curve_settings": ["oracle"], "selection_rule": "worst_case"},
                       data={"max_length": 512, "validation_fraction": 0.4, "leakage": "allow"},
                       bfcl={"categories": ["simple_python"], "limit": 2}, axes={"train_retriever": ["oracle"]})
    assert sw.cli_sweep(args(path)) == 0
    capsys.readouterr()
    assert sw.cli_report_sweep(str(tmp_path / "sweep")) == 0
    out = capsys.readouterr().out
    report = tmp_path / "sweep" / "report"
    assert "(no Table 2: no eval cells)" in out and not (report / "sweep.csv").exists()
    # a tool set's validation counts show the rows that call and the rows answered [] apart
    assert ("| worst_case (strict) | 1 | 1 | oracle 3/5 (calls 1/2, [] 2/3) | bfcl simple_python 2/2 |"
            in (report / "selection.md").read_text())
    assert json.loads((report / "sweep.json").read_text())["tables"] == {}


def test_a_rule_per_arm(tmp_path):
    """eval.selection_rule as a mapping: each cell's choice uses its arm's rule; an arm without a rule,
    or a rule for an arm no cell trains, is refused before anything runs."""
    import ratune.sweep as sw
    from ratune.sweep.commands import select_command
    from test_sweep import BASE, write_sweep

    def sweep_with(rules):
        return sw.load_sweep(write_sweep(tmp_path, base={**BASE, "save_steps": 1},
                                         eval={"settings": ["0_shot"], "curve_settings": ["0_shot", "oracle"],
                                               "selection_rule": rules},
                                         data={"max_length": 256, "validation_fraction": 0.1}))

    sweep = sweep_with({"none": "zero_shot", "oracle": "oracle"})
    rules = {c.config["train_retriever"]: select_command(sweep, c) for c in sw.expand(sweep)}
    assert {arm: cmd[cmd.index("--rule") + 1] for arm, cmd in rules.items()} == {"none": "zero_shot",
                                                                                 "oracle": "oracle"}
    with pytest.raises(RatuneError, match="names no rule for train_retriever oracle"):
        sw.expand(sweep_with({"none": "zero_shot"}))
    with pytest.raises(RatuneError, match="names mix-x, which no cell trains with"):
        sw.expand(sweep_with({"none": "zero_shot", "oracle": "oracle", "mix-x": "mean"}))
    # balanced reads a tool set's counts by reference answer: refused on APIBench before anything runs
    with pytest.raises(RatuneError, match=r"cell train_retriever-oracle-\w+: selection rule balanced reads the "
                                          r"curves of a tool_set hub only \(it needs strict counts by reference "
                                          r"answer .*\); hub torchhub is of kind apibench"):
        sw.expand(sweep_with({"none": "zero_shot", "oracle": "balanced"}))


def test_the_balanced_rule_is_taken_for_a_tool_set_sweep(tmp_path):
    from pathlib import Path

    import ratune.sweep as sw
    from ratune.sources.toolset import import_tool_set
    from ratune.sweep.commands import select_command
    from test_sweep import BASE, write_sweep

    import_tool_set(tmp_path / "ts", rows_file=Path(__file__).resolve().parent / "fixtures" / "tools" /
                    "xlam_rows.jsonl", eval_fraction=0, name="mine")
    sweep = sw.load_sweep(write_sweep(tmp_path, base={**BASE, "hub": str(tmp_path / "ts"), "save_steps": 1},
                                      eval={"settings": [], "curve_settings": ["oracle"], "selection_rule": "balanced"},
                                      data={"max_length": 512, "validation_fraction": 0.4, "leakage": "allow"},
                                      bfcl={"categories": ["simple_python"]}))
    commands = [select_command(sweep, c) for c in sw.expand(sweep)]
    assert len(commands) == 2 and all(cmd[cmd.index("--rule") + 1] == "balanced" for cmd in commands)
    gorilla = sw.load_sweep(write_sweep(tmp_path, base={**BASE, "hub": str(tmp_path / "ts"), "save_steps": 1},
                                        eval={"settings": [], "curve_settings": ["oracle"], "selection_rule": "balanced",
                                              "selection_metric": "gorilla"},
                                        data={"max_length": 512, "validation_fraction": 0.4, "leakage": "allow"},
                                        bfcl={"categories": ["simple_python"]}))
    with pytest.raises(RatuneError, match="selection rule balanced reads strict counts only; use selection metric "
                                          "strict, not gorilla"):
        sw.expand(gorilla)
