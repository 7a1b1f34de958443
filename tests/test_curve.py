"""Learning curves (eval/curve.py): every Trainer checkpoint of a run
evaluated under the same settings, through `ratune eval run --all-checkpoints` and a sweep's
`eval.curve_settings`."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from ratune.errors import RatuneError
from test_train_correctness import _config, _make_data


def _settings(**kw):
    from ratune.eval.run import EvalSettings

    return EvalSettings(settings=("0_shot", "oracle"), n_questions=3, batch_size=3, max_new_tokens=6,
                        torch_threads=1, **kw)


def metric_block(correct: int, hallucination: int, error: int) -> dict:
    """A metric block as a cell's metrics.json holds it (eval/run.py ``_cell_metrics``): counts,
    fractions and their 95 % Wilson intervals."""
    from ratune.eval.stats import rate_intervals

    n = correct + hallucination + error
    counts = {"correct_n": correct, "hallucination_n": hallucination, "error_n": error}
    return {**counts, "accuracy": correct / n, "hallucination": hallucination / n, "error": error / n,
            **rate_intervals(counts, n)}


def test_curve_row_counts_rates_and_wilson_interval():
    from ratune.eval.curve import curve_row

    metrics = {"n": 10, "strict": metric_block(3, 2, 5), "gorilla": metric_block(5, 1, 4)}
    row = curve_row(21, 1.0, "0_shot", metrics)
    assert row["step"] == 21 and row["epoch"] == 1.0 and row["setting"] == "0_shot" and row["n"] == 10
    assert row["strict_correct"] == 3 and row["strict_accuracy"] == pytest.approx(0.3)
    assert row["strict_hallucination"] == pytest.approx(0.2) and row["gorilla_accuracy"] == pytest.approx(0.5)
    # Wilson, worked by hand: p 0.3, z 1.96: centre (0.3 + 0.19208) / 1.38416 = 0.35551,
    # half-width 1.96 / 1.38416 x sqrt(0.021 + 0.009604) = 0.24772 -> [0.1078, 0.6032]
    assert row["strict_ci"] == pytest.approx([0.1078, 0.6032], abs=1e-4)
    # 5 of 10: centre 0.5, half-width 1.41602 x sqrt(0.025 + 0.009604) = 0.26340 -> [0.2366, 0.7634]
    assert row["gorilla_ci"] == pytest.approx([0.2366, 0.7634], abs=1e-4)
    # the row copies the cell's own rates and interval (one computation, in the cell's metrics.json)
    copied = curve_row(21, 1.0, "0_shot", {**metrics, "strict": {**metrics["strict"], "accuracy_ci": [0.25, 0.5]}})
    assert copied["strict_ci"] == [0.25, 0.5]
    # an APIBench cell has no counts by reference answer; a tool set's cell has them, copied
    assert row["by_answer"] is None
    by_answer = {"call": {"n": 4, "correct_n": 1}, "no_call": {"n": 6, "correct_n": 2}}
    tool_row = curve_row(21, 1.0, "oracle", {"n": 10, "strict": metric_block(3, 2, 5),
                                             "calls": {"call_rate": 0.5, "by_answer": by_answer}})
    assert tool_row["by_answer"] == by_answer and tool_row["gorilla_correct"] is None


def test_curve_ticks_are_the_measured_epochs(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from ratune.eval.curve import curve_row, curve_xticks, plot_curve

    assert curve_xticks([3.0, 1.0, 2.0, 1.0]) == [1.0, 2.0, 3.0]  # whole epochs, once each, in order
    assert curve_xticks([0.5, 1.0]) == [0.5, 1.0]
    assert curve_xticks([float(k) for k in range(13)]) is None  # past 12 points: matplotlib's own ticks
    seen = []
    monkeypatch.setattr(Axes, "set_xticks", lambda ax, ticks, *a, **k: seen.append(list(ticks)))
    metrics = {"n": 10, "strict": metric_block(3, 2, 5), "gorilla": metric_block(5, 1, 4)}
    rows = [curve_row(105 * e, float(e), "0_shot", metrics) for e in (3, 1, 2)]
    assert plot_curve(rows, tmp_path / "c.png").stat().st_size > 0
    assert seen == [[1.0, 2.0, 3.0]] * 2  # one panel per metric


def test_trainer_checkpoints_in_numeric_step_order(tmp_path, tiny_model_dir):
    from ratune.train.layout import trainer_checkpoints
    from ratune.train.sft import train

    run = tmp_path / "run"
    train(_config(tiny_model_dir, _make_data(tmp_path / "data", n=4), run, global_batch_size=2, max_steps=2,
                  save_steps=1))
    shutil.copytree(run / "trainer" / "checkpoint-1", run / "trainer" / "checkpoint-10")
    (run / "trainer" / "checkpoint-9x").mkdir()  # not a checkpoint name: ignored
    assert [c.step for c in trainer_checkpoints(run)] == [1, 2, 10]  # not 1, 10, 2 (text order)
    with pytest.raises(RatuneError, match="not a ratune train run folder"):
        trainer_checkpoints(tmp_path)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_all_checkpoints_curve_files_and_resume(tmp_path, tiny_model_dir, apibench, lora):
    from ratune.eval.curve import evaluate_curve, read_curve
    from ratune.eval.run import evaluate_checkpoint
    from ratune.train.sft import train

    run = tmp_path / "run"
    extra = {"lora": {"enabled": True, "r": 4, "alpha": 8}} if lora else {}
    # 4 rows, 2 per step: the checkpoints of steps 1 and 2 are epochs 0.5 and 1.0
    train(_config(tiny_model_dir, _make_data(tmp_path / "data", n=4), run, global_batch_size=2, max_steps=2,
                  save_steps=1, **extra))
    out = tmp_path / "curve"
    rows = evaluate_curve(run, hub="torchhub", apibench_dir=apibench, out_dir=out, settings=_settings(),
                          progress=False)
    assert [(r["step"], r["setting"]) for r in rows] == [(1, "0_shot"), (1, "oracle"), (2, "0_shot"), (2, "oracle")]
    assert [r["epoch"] for r in rows] == [0.5, 0.5, 1.0, 1.0]
    for r in rows:  # each row is its step folder's metrics
        metrics = json.loads((out / f"step{r['step']}" / r["setting"] / "metrics.json").read_text())
        assert metrics["train_step"] == r["step"] and metrics["n"] == r["n"] == 3
        assert r["strict_correct"] == metrics["strict"]["correct_n"]
        assert r["gorilla_correct"] == metrics["gorilla"]["correct_n"]
    # the last checkpoint is the final model: the same greedy answers as evaluating the run itself
    evaluate_checkpoint(run, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "final",
                        settings=_settings(), progress=False)
    texts = lambda folder: [json.loads(line)["text"] for line in  # noqa: E731
                            (folder / "oracle" / "responses.jsonl").read_text().splitlines()]
    assert texts(out / "step2") == texts(tmp_path / "final")

    assert read_curve(out) == rows  # curve.json loads back
    table = list(csv.DictReader(io.StringIO((out / "curve.csv").read_text())))
    assert [(t["step"], t["setting"]) for t in table] == [("1", "0_shot"), ("1", "oracle"), ("2", "0_shot"),
                                                          ("2", "oracle")]
    low, high = (float(x) for x in table[0]["strict_ci"].split(";"))
    assert [low, high] == pytest.approx(rows[0]["strict_ci"], rel=1e-5)
    md = (out / "curve.md").read_text().splitlines()
    assert md[0].startswith("| step | epoch | setting | n | strict correct") and len(md) == 2 + 4
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a rerun generates nothing (every step folder is complete) and gives the same rows
    before = {p: p.stat().st_mtime_ns for p in out.glob("step*/*/responses.jsonl")}
    assert evaluate_curve(run, hub="torchhub", apibench_dir=apibench, out_dir=out, settings=_settings(),
                          progress=False) == rows
    assert {p: p.stat().st_mtime_ns for p in out.glob("step*/*/responses.jsonl")} == before


def test_curve_refusals(tmp_path, tiny_model_dir, apibench):
    from ratune.eval.curve import evaluate_curve
    from ratune.train.sft import train

    run = tmp_path / "run"
    train(_config(tiny_model_dir, _make_data(tmp_path / "data", n=4), run, global_batch_size=2, max_steps=1))
    with pytest.raises(RatuneError, match=r"run: no Trainer checkpoints .* save_strategy: epoch or save_steps"):
        evaluate_curve(run, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "c", settings=_settings(),
                       progress=False)
    assert not (tmp_path / "c").exists()
    shutil.copytree(run / "model", run / "trainer" / "checkpoint-1")  # a checkpoint with weights
    (run / "trainer" / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')  # and its state
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(RatuneError, match="not a ratune eval curve output"):
        evaluate_curve(run, hub="torchhub", apibench_dir=apibench, out_dir=foreign, settings=_settings(),
                       progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_cli_all_checkpoints(tmp_path, tiny_model_dir, apibench, capsys):
    from ratune.cli import main
    from ratune.train.sft import train

    run = tmp_path / "run"
    train(_config(tiny_model_dir, _make_data(tmp_path / "data", n=4), run, global_batch_size=2, max_steps=2,
                  save_steps=1))
    capsys.readouterr()
    assert main(["eval", "run", "--checkpoint", str(run), "--hub", "torchhub", "--apibench", str(apibench),
                 "--out", str(tmp_path / "c"), "--settings", "0_shot", "--n-questions", "2", "--batch-size", "2",
                 "--max-new-tokens", "4", "--threads", "1", "--all-checkpoints"]) == 0
    printed = capsys.readouterr().out
    assert "| 1 | 0.5 | 0_shot | 2 |" in printed and "| 2 | 1 | 0_shot | 2 |" in printed
    assert sorted(p.name for p in (tmp_path / "c").glob("step*")) == ["step1", "step2"]
    # each checkpoint's responses name the run folder and the step ...
    first = json.loads((tmp_path / "c" / "step1" / "0_shot" / "responses.jsonl").read_text().splitlines()[0])
    assert first["model"] == "run-step1"
    # ... or the name given (a sweep gives its cell's), with the step
    assert main(["eval", "run", "--checkpoint", str(run), "--hub", "torchhub", "--apibench", str(apibench),
                 "--out", str(tmp_path / "named"), "--settings", "0_shot", "--n-questions", "2", "--batch-size", "2",
                 "--max-new-tokens", "4", "--threads", "1", "--all-checkpoints", "--model-name", "cellA"]) == 0
    for step in (1, 2):
        cell = tmp_path / "named" / f"step{step}" / "0_shot"
        assert {json.loads(line)["model"] for line in (cell / "responses.jsonl").read_text().splitlines()} == \
            {f"cellA-step{step}"}
        assert json.loads((cell / "metrics.json").read_text())["model"] == f"cellA-step{step}"


# ---- the sweep's learning curve (eval.curve_settings)


def _sweep_file(tmp_path, base, **eval_over):
    from test_sweep import BASE

    data = {"name": "t", "out_dir": str(tmp_path / "sweep"), "base": {**BASE, **base},
            "eval": {"settings": ["0_shot", "oracle"], "n_questions": 5, **eval_over},
            "axes": {"train_retriever": ["none", "oracle"]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_sweep_curve_needs_kept_checkpoints(tmp_path):
    from ratune import sweep as sw

    with pytest.raises(RatuneError, match=r"sweep.yaml: cell .*: eval.curve_settings .* saves none: set save_strategy"):
        sw.expand(sw.load_sweep(_sweep_file(tmp_path, {}, curve_settings=["0_shot"])))
    with pytest.raises(RatuneError, match=r"save_total_limit: 1 deletes older ones"):
        sw.expand(sw.load_sweep(_sweep_file(tmp_path, {"save_strategy": "epoch", "save_total_limit": 1},
                                            curve_settings=["0_shot"])))
    cells = sw.expand(sw.load_sweep(_sweep_file(tmp_path, {"save_steps": 1}, curve_settings=["0_shot"])))
    assert len(cells) == 2


def test_sweep_runs_and_reports_the_curve(tmp_path, capsys, monkeypatch):
    from test_sweep import FakeRunner, args

    from ratune import sweep as sw
    from ratune.eval.curve import write_curve

    class CurveRunner(FakeRunner):
        def __call__(self, cmd, log_path):
            if "--all-checkpoints" in cmd:
                self.calls.append(cmd)
                out = Path(cmd[cmd.index("--out") + 1])
                out.mkdir(parents=True, exist_ok=True)
                strict = 1 if "oracle" in out.parent.name else 0
                rows = [{"step": s, "epoch": float(s), "setting": "0_shot", "n": 5, "strict_correct": strict * s,
                         "strict_accuracy": strict * s / 5, "strict_hallucination": 0.0, "strict_ci": [0.0, 0.5],
                         "gorilla_correct": s, "gorilla_accuracy": s / 5, "gorilla_hallucination": 0.0,
                         "gorilla_ci": [0.0, 0.6]} for s in (1, 2)]
                write_curve(out, rows, run=cmd[cmd.index("--checkpoint") + 1], hub="torchhub")
                return
            super().__call__(cmd, log_path)

    path = _sweep_file(tmp_path, {"save_strategy": "epoch"}, curve_settings=["0_shot"])
    sweep = sw.load_sweep(path)
    cells = sw.expand(sweep)
    assert sw.dry_run(sweep, cells) == 0
    printed = capsys.readouterr().out
    assert printed.count("  curve: ratune eval run --checkpoint ") == 2
    assert f"--out {cells[0].dir / 'curve'} --settings 0_shot" in printed and "--all-checkpoints" in printed

    runner = CurveRunner()
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0
    assert sum("--all-checkpoints" in c for c in runner.calls) == 2
    assert all(sw.is_finished(sweep, c) for c in cells)
    runner = CurveRunner()  # finished cells: nothing runs again
    monkeypatch.setattr("ratune.sweep.local.run_command", runner)
    assert sw.cli_sweep(args(path)) == 0 and runner.calls == []
    # a new curve setting is not a changed config: only the curve runs again
    path = _sweep_file(tmp_path, {"save_strategy": "epoch"}, curve_settings=["0_shot", "oracle"])
    assert sw.changed_keys(sw.load_sweep(path), cells[0]) == []
    assert not sw.is_finished(sw.load_sweep(path), cells[0])

    sw.report_sweep(tmp_path / "sweep")
    report = tmp_path / "sweep" / "report"
    table = list(csv.DictReader(io.StringIO((report / "learning_curve.csv").read_text())))
    assert sorted((t["run"], t["step"], t["strict_correct"]) for t in table) == [
        ("train_retriever=none", "1", "0"), ("train_retriever=none", "2", "0"),
        ("train_retriever=oracle", "1", "1"), ("train_retriever=oracle", "2", "2")]
    assert "### train_retriever=oracle" in (report / "learning_curve.md").read_text()
    assert (report / "learning_curve.png").is_file()
    summary = json.loads((report / "sweep.json").read_text())
    assert sorted(summary["learning_curves"]) == ["train_retriever=none", "train_retriever=oracle"]
    assert sum(k.endswith("curve/curve.json") for k in summary["sources"]) == 2
