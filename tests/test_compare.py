"""ratune compare: paired comparison of two response files (released TorchHub files)."""

from __future__ import annotations

import argparse
import json
import math
import shutil

import pytest

from ratune.errors import RatuneError
from ratune.eval.compare import add_compare_arguments, cli_compare, compare_files, compare_outcomes

RELEASED = "responses/response_torchhub_Gorilla_{}_oracle.jsonl"


@pytest.fixture(scope="module")
def ft_rt(apibench):
    return apibench / RELEASED.format("FT"), apibench / RELEASED.format("RT")


@pytest.fixture(scope="module")
def ft_vs_rt(apibench, ft_rt):
    return compare_files(*ft_rt, hub="torchhub", apibench_dir=apibench)


def _args(*argv):
    return add_compare_arguments(argparse.ArgumentParser()).parse_args(list(argv))


def test_released_ft_vs_rt_oracle(ft_vs_rt):
    r = ft_vs_rt
    assert r["n"] == 186 and r["metric"] == "gorilla" and r["hub"] == "torchhub"
    # Official gorilla counts: FT oracle 110 of 186 correct, RT oracle 173 of 186.
    assert r["a"]["correct_n"] == 110 and r["b"]["correct_n"] == 173
    t = r["contingency"]
    assert t == {"both": 100, "only_a": 10, "only_b": 73, "neither": 3}  # measured
    assert t["both"] + t["only_a"] == 110 and t["both"] + t["only_b"] == 173 and sum(t.values()) == 186
    # p = 2 P(X <= 10), X ~ Bin(83, 1/2) = 5.80e-13
    assert r["mcnemar_p"] == pytest.approx(2 * sum(math.comb(83, i) for i in range(11)) / 2 ** 83, rel=1e-12)
    assert r["mcnemar_p"] < 1e-10
    d = r["difference"]
    assert d["value"] == pytest.approx((110 - 173) / 186)  # -33.9 points
    assert d["resamples"] == 10000 and d["seed"] == 0
    assert d["low"] < d["value"] < d["high"] < 0
    # measured with numpy 2.x: [-0.419, -0.258] (loose: Generator streams may change across numpy versions)
    assert d["low"] == pytest.approx(-0.419, abs=0.015) and d["high"] == pytest.approx(-0.258, abs=0.015)
    lo, hi = r["a"]["accuracy_ci"]
    assert lo == pytest.approx(0.520, abs=1e-3) and hi == pytest.approx(0.659, abs=1e-3)


def test_bootstrap_reproducible_on_released_files(apibench, ft_rt, ft_vs_rt):
    again = compare_files(*ft_rt, hub="torchhub", apibench_dir=apibench)
    assert again["difference"] == ft_vs_rt["difference"]


def test_cli_text_and_json(capsys, apibench, ft_rt):
    a, b = map(str, ft_rt)
    assert cli_compare(_args(a, b, "--hub", "torchhub", "--apibench", str(apibench))) == 0
    out = capsys.readouterr().out
    assert "186 paired questions" in out and "p = 5.8e-13" in out
    assert "10000 resamples, seed 0" in out and "Wilson" in out
    assert cli_compare(_args(a, b, "--hub", "torchhub", "--apibench", str(apibench), "--json", "--metric",
                             "strict", "--resamples", "500", "--seed", "3")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metric"] == "strict" and result["difference"]["resamples"] == 500
    assert result["difference"]["seed"] == 3
    assert sum(result["contingency"].values()) == 186


def test_eval_cell_folder_in_place_of_file(tmp_path, apibench, ft_rt, ft_vs_rt):
    cell = tmp_path / "eval" / "oracle"
    cell.mkdir(parents=True)
    shutil.copy(ft_rt[0], cell / "responses.jsonl")
    r = compare_files(cell, ft_rt[1], hub="torchhub", apibench_dir=apibench)
    assert r["contingency"] == ft_vs_rt["contingency"]
    assert r["a"]["path"].endswith("responses.jsonl")
    with pytest.raises(RatuneError, match="without responses.jsonl"):
        compare_files(tmp_path, ft_rt[1], hub="torchhub", apibench_dir=apibench)


def _write(path, ids):
    text = "<<<domain>>>: Classification, <<<api_call>>>: torch.hub.load('pytorch/vision', 'resnet18')"
    path.write_text("".join(json.dumps({"question_id": q, "text": text}) + "\n" for q in ids))
    return path


def test_unpaired_files_refused(tmp_path, apibench):
    a = _write(tmp_path / "a.jsonl", [1, 2, 3])
    b = _write(tmp_path / "b.jsonl", [1, 2, 4])
    with pytest.raises(RatuneError, match="unpaired comparison refused") as err:
        compare_files(a, b, hub="torchhub", apibench_dir=apibench)
    assert "1 only in A" in str(err.value) and "(3)" in str(err.value) and "(4)" in str(err.value)
    # The same ids in another order are paired fine.
    c = _write(tmp_path / "c.jsonl", [3, 1, 2])
    r = compare_files(a, c, hub="torchhub", apibench_dir=apibench)
    assert r["n"] == 3 and r["contingency"]["only_a"] == r["contingency"]["only_b"] == 0
    assert r["mcnemar_p"] == 1.0


def test_subset_of_released_file_refused(tmp_path, apibench, ft_rt):
    head = tmp_path / "head.jsonl"
    head.write_text("".join(ft_rt[0].read_text().splitlines(keepends=True)[:50]))
    with pytest.raises(RatuneError, match="unpaired"):
        cli_compare(_args(str(head), str(ft_rt[1]), "--hub", "torchhub", "--apibench", str(apibench)))


def test_compare_outcomes_direct():
    qa = [{"question_id": i, "gorilla": o, "strict": o} for i, o in
          enumerate(["correct"] * 11 + ["hallucination"] * 5 + ["correct"] * 30 + ["error"] * 14, start=1)]
    qb = [{"question_id": i, "gorilla": o, "strict": o} for i, o in
          enumerate(["error"] * 11 + ["correct"] * 5 + ["correct"] * 30 + ["hallucination"] * 14, start=1)]
    r = compare_outcomes(qa, qb, resamples=1000)
    assert r["contingency"] == {"both": 30, "only_a": 11, "only_b": 5, "neither": 14}
    assert r["mcnemar_p"] == pytest.approx(0.2101135, abs=1e-7)
    with pytest.raises(RatuneError, match="unknown metric"):
        compare_outcomes(qa, qb, metric="both")
    with pytest.raises(RatuneError, match="--resamples"):
        cli_compare(argparse.Namespace(responses_a="x", responses_b="y", hub="torchhub", resamples=0))
