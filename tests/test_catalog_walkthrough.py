"""The catalog walk-through of docs/catalogs.md, end to end on the real OpenAPI
petstore (examples/catalogs/openapi-spec-validator/petstore.yaml, a specification nobody here
wrote) and its hand-written pairs, with the suite's tiny model in place of the demo model:
import, pairs, data build, train (both arms), eval under every setting a catalog has, and the
report; then the committed sweep file itself (examples/catalogs/petstore_sweep.yaml) through
`ratune sweep` and `ratune report` (slow: `make test-slow`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ratune.cli import main

ROOT = Path(__file__).resolve().parent.parent
PETSTORE = ROOT / "examples" / "catalogs" / "openapi-spec-validator" / "petstore.yaml"
PAIRS = ROOT / "examples" / "catalogs" / "petstore_pairs.jsonl"
SWEEP = ROOT / "examples" / "catalogs" / "petstore_sweep.yaml"
#: Every test setting of the walk-through (the sweep file's eval.settings).
SETTINGS = ["0_shot", "bm25", "dense", "oracle", "swap", "irrelevant"]


def _catalog(tmp_path: Path) -> Path:
    catalog = tmp_path / "petstore" / "catalog"
    assert main(["catalog", "import", "--from", "openapi", str(PETSTORE), "--out", str(catalog),
                 "--name", "petstore"]) == 0
    assert main(["catalog", "pairs", "--catalog", str(catalog), "--pairs", str(PAIRS), "--eval-fraction", "0.2",
                 "--seed", "0"]) == 0
    return catalog


def test_the_walkthrough_commands_run_on_the_petstore(tmp_path, tiny_model_dir, capsys):
    catalog = _catalog(tmp_path)
    data = tmp_path / "data"
    assert main(["data", "build", "--hub", str(catalog), "--out", str(data), "--tokenizer", str(tiny_model_dir),
                 "--modes", "none", "oracle", "--max-length", "1024", "--max-document-tokens", "256"]) == 0
    sweep = yaml.safe_load(SWEEP.read_text())
    evals = {}
    for arm in ("none", "oracle"):
        config = {**sweep["base"], "model": str(tiny_model_dir), "hub": str(catalog), "data_dir": str(data),
                  "train_retriever": arm, "output_dir": str(tmp_path / f"train_{arm}"), "max_steps": 1,
                  "lora": {"enabled": True, "r": 4, "alpha": 8}, "torch_threads": 1}
        path = tmp_path / f"{arm}.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["train", "--config", str(path)]) == 0
        evals[arm] = tmp_path / f"eval_{arm}"
        assert main(["eval", "run", "--checkpoint", str(tmp_path / f"train_{arm}"), "--hub", str(catalog),
                     "--out", str(evals[arm]), "--settings", *sweep["eval"]["settings"], "--batch-size", "6",
                     "--max-new-tokens", "8", "--stop-after-api-call", "--threads", "1"]) == 0
    manifest = json.loads((tmp_path / "train_oracle" / "manifest.json").read_text())
    assert manifest["hub"] == "petstore" and manifest["catalog"]["name"] == "petstore"
    out = tmp_path / "report"
    capsys.readouterr()
    assert main(["report", "--eval", f"none={evals['none']}", "--eval", f"oracle={evals['oracle']}",
                 "--model", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = json.loads((out / "table2.json").read_text())
    assert table["hub"] == "petstore" and table["metric"] == "strict"
    assert sorted((c["train_retriever"], c["test_retriever"]) for c in table["cells"]) == sorted(
        (arm, s) for arm in ("none", "oracle") for s in ("0_shot", "bm25", "dense", "oracle"))
    for c in table["cells"]:  # every question of the eval split, every verdict counted once
        s = c["strict"]
        assert c["n"] == 6 and s["correct_n"] + s["error_n"] + s["hallucination_n"] == 6
        # the argument measures count right-API answers only
        assert max(c["arguments"]["values_equal_n"], c["arguments"]["required_present_n"]) <= s["correct_n"]
    assert "## strict (exact API)" in printed and "## arguments" in printed and "gorilla (official)" not in printed
    rows = json.loads((out / "experiments.json").read_text())["experiments"]
    assert sorted(r["train_retriever"] for r in rows) == ["none", "oracle"]
    assert all(r["follows_document"]["n"] == 6 for r in rows)  # the three petstore APIs share one domain


def test_the_committed_sweep_file_resolves_on_a_catalog(tmp_path):
    from ratune.errors import RatuneError
    from ratune.sweep import expand, load_sweep

    catalog = _catalog(tmp_path)
    spec = yaml.safe_load(SWEEP.read_text())
    assert spec["eval"]["settings"] == SETTINGS
    spec["base"]["hub"] = str(catalog)
    spec["out_dir"] = str(tmp_path / "sweep")
    path = tmp_path / "petstore.yaml"
    path.write_text(yaml.safe_dump(spec))
    cells = expand(load_sweep(path))
    assert [c.config["train_retriever"] for c in cells] == ["none", "oracle"]
    # the shared data folder is named by the catalog's name, not its path
    assert {c.config["data_dir"] for c in cells} == {str(tmp_path / "sweep" / "data" / "petstore")}
    spec["eval"]["settings"] = ["0_shot", "gpt_index"]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(RatuneError, match="cell train_retriever-none-[0-9a-f]+ \\(catalog .*\\): eval settings "
                                          "gpt_index exist for the APIBench hubs only"):
        expand(load_sweep(path))


@pytest.mark.slow
def test_the_committed_sweep_file_runs_and_reports(tmp_path, tiny_model_dir):
    catalog = _catalog(tmp_path)
    spec = yaml.safe_load(SWEEP.read_text())
    spec["out_dir"] = str(tmp_path / "sweep")
    spec["base"].update(model=str(tiny_model_dir), hub=str(catalog), max_steps=1, torch_threads=1,
                        lora={"enabled": True, "r": 4, "alpha": 8})
    spec["eval"].update(max_new_tokens=8, threads=1)
    spec["accelerate_config"] = str(ROOT / spec["accelerate_config"])
    path = tmp_path / "petstore.yaml"
    path.write_text(yaml.safe_dump(spec))
    exe = Path(sys.executable).with_name("ratune")
    ratune = [str(exe)] if exe.exists() else [sys.executable, "-m", "ratune.cli"]
    run = subprocess.run([*ratune, "sweep", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2/2 cells finished, 0 failed" in run.stdout
    report = subprocess.run([*ratune, "report", str(tmp_path / "sweep")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "report" / "sweep.json").read_text())
    assert list(summary["tables"]) == ["petstore"] and summary["tables"]["petstore"]["metric"] == "strict"
    assert len(summary["tables"]["petstore"]["cells"]) == 8
    assert summary["comparisons"]["ok"] == 4  # oracle vs none under each of the four retrieval settings
    assert "released" not in summary  # the released Gorilla-7B responses are APIBench's
    comparisons = (tmp_path / "sweep" / "report" / "comparisons.md").read_text()
    assert "### strict metric" in comparisons and "### gorilla metric" not in comparisons
    assert (tmp_path / "sweep" / "data" / "petstore" / "manifest.json").is_file()
