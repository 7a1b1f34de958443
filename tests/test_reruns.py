"""Interrupted jobs and reruns: atomic writes, resumable generation,
deterministic data building."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ratune.io import atomic_write, write_json


def test_interrupted_write_keeps_previous_file(tmp_path):
    path = tmp_path / "metrics.json"
    write_json(path, {"accuracy": 0.5})
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with atomic_write(path) as fh:
            fh.write('{"accuracy": 0.9')  # half written ...
            raise RuntimeError("killed mid-write")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left


def _eval_cmd(model, apibench, out):
    return [sys.executable, "-m", "ratune.cli", "eval", "run", "--checkpoint", str(model), "--hub", "torchhub",
            "--apibench", str(apibench), "--out", str(out), "--settings", "0_shot", "--n-questions", "40",
            "--batch-size", "2", "--max-new-tokens", "24", "--threads", "1"]


def test_generation_resumes_after_sigkill(tmp_path, apibench, tiny_model_dir):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    reference = tmp_path / "reference"
    subprocess.run(_eval_cmd(tiny_model_dir, apibench, reference), check=True, capture_output=True, env=env,
                   timeout=600)

    killed = tmp_path / "killed"
    responses = killed / "0_shot" / "responses.jsonl"
    proc = subprocess.Popen(_eval_cmd(tiny_model_dir, apibench, killed), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline:
        if responses.exists() and responses.read_bytes().count(b"\n") >= 4:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = responses.read_bytes().count(b"\n")
    assert 4 <= written < 40, "the kill must land mid-generation"
    assert not (killed / "0_shot" / ".complete").exists()

    subprocess.run(_eval_cmd(tiny_model_dir, apibench, killed), check=True, capture_output=True, env=env,
                   timeout=600)
    final = [json.loads(x) for x in responses.read_text().splitlines()]
    assert [r["question_id"] for r in final] == list(range(1, 41))  # no duplicate, none missing
    assert responses.read_bytes() == (reference / "0_shot" / "responses.jsonl").read_bytes()
    ref_metrics = json.loads((reference / "0_shot" / "metrics.json").read_text())
    new_metrics = json.loads((killed / "0_shot" / "metrics.json").read_text())
    assert new_metrics["accuracy"] == ref_metrics["accuracy"] and new_metrics["n"] == 40


def test_a_resumed_cell_names_one_model_on_every_line(tmp_path, apibench, tiny_model_dir):
    """Lines written before an interruption take the model name of the run that finishes the cell
    (a sweep resumed by a newer ratune passes --model-name CELL where the older one wrote none)."""
    from ratune.cli import main

    out = tmp_path / "eval"
    argv = ["eval", "run", "--checkpoint", str(tiny_model_dir), "--hub", "torchhub", "--apibench", str(apibench),
            "--out", str(out), "--settings", "0_shot", "--n-questions", "4", "--batch-size", "2",
            "--max-new-tokens", "4", "--threads", "1"]
    assert main(argv) == 0
    cell = out / "0_shot"
    lines = cell.joinpath("responses.jsonl").read_text().splitlines()
    assert {json.loads(x)["model"] for x in lines} == {tiny_model_dir.name}
    (cell / ".complete").unlink()  # as a kill after the first batch leaves the cell
    (cell / "metrics.json").unlink()
    cell.joinpath("responses.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert main([*argv, "--model-name", "cellA"]) == 0
    final = [json.loads(x) for x in cell.joinpath("responses.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in final] == [1, 2, 3, 4] and {r["model"] for r in final} == {"cellA"}
    assert [r["text"] for r in final] == [json.loads(x)["text"] for x in lines]


def test_data_build_is_deterministic(tmp_path, apibench, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset

    def build(name):
        out = tmp_path / name
        build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer,
                      tokenizer_name="smol", modes=["none", "bm25"], progress=False,
                      settings=BuildSettings(max_length=768, max_document_tokens=128))
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    first, second = build("a"), build("b")
    assert first.keys() == second.keys()
    assert any(k.endswith(".arrow") for k in first)
    for name in first:
        assert first[name] == second[name], name


def test_eval_cell_made_with_other_settings_is_refused(tmp_path):
    from ratune.errors import RatuneError
    from ratune.eval.resume import check_cell_identity

    cell = tmp_path / "0_shot"
    ident = {"checkpoint": "/a", "hub": "torchhub", "setting": "0_shot", "questions": [1, 2],
             "generation": {"max_new_tokens": 8}}
    check_cell_identity(cell, ident)
    check_cell_identity(cell, dict(ident))  # same identity: continue
    # the refusal names each differing setting with both values (nested ones by dotted name)
    with pytest.raises(RatuneError, match=r"0_shot: this eval cell was made with different settings \(checkpoint: "
                                          r"'/a' then, '/b' now; generation.max_new_tokens: 8 then, 16 now\); "
                                          r"choose another --out"):
        check_cell_identity(cell, dict(ident, checkpoint="/b", generation={"max_new_tokens": 16}))
