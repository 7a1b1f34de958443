"""Determinism: retrieval indexes and reports give byte-identical outputs for the
same inputs and config (data building is checked in tests/test_reruns.py).

Reports are written in separate processes with different PYTHONHASHSEED values, so an ordering
that came from iterating a set or a dict of strings would show up as a difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ratune.sources.apibench import api_identity, load_examples
from ratune.retrieval.retrievers import BM25_VARIANTS, BM25Retriever, Query, make_retriever

# hand-made eval / sweep folders are built with the report and sweep tests' own helpers
# (tests/ is on sys.path under pytest's default import mode)
from test_report import _metrics
from test_sweep import finish_eval
from test_sweep import metrics as sweep_metrics


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _python(code: str, *args: str, hash_seed: str) -> subprocess.CompletedProcess:
    """Run ``python -c code args`` with the given PYTHONHASHSEED (and one torch thread)."""
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return proc


def _assert_same_files(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert sorted(a) == sorted(b)
    different = [name for name in a if a[name] != b[name]]
    assert different == [], f"files differ between the two runs: {different}"


# --------------------------------------------------------------------------------------------
# retrieval


@pytest.mark.parametrize("name", [*BM25_VARIANTS, "dense"])
def test_rebuilt_retriever_ranks_identically(name, apibench):
    examples = load_examples(apibench, "torchhub", "eval")
    queries = [Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples]

    def ranking():
        retriever = make_retriever(name, hub="torchhub", apibench_dir=apibench)  # a fresh index each time
        ranked = retriever.retrieve(queries, top_k=10)
        return retriever, [[json.dumps(d, sort_keys=True) for d in r] for r in ranked]

    first, a = ranking()
    second, b = ranking()
    assert first is not second
    assert len(a) == 186 and all(len(r) == 10 for r in a)
    assert a == b
    assert first.metadata() == second.metadata()
    if name == "dense":
        assert first._doc_emb.tobytes() == second._doc_emb.tobytes()  # the index itself, bit for bit
    # the ranking is a real one: top-1 is right on part of the questions, and lists differ by query
    top1 = sum(api_identity(json.loads(r[0])) == api_identity(e.api) for r, e in zip(a, examples))
    assert 0 < top1 < 186
    assert len({r[0] for r in a}) > 10
    if name == "bm25":
        assert top1 == 25  # tests/test_retrieval.py: 25/186


@pytest.mark.parametrize("variant", list(BM25_VARIANTS))
def test_bm25_ties_keep_database_order(variant):
    # 40 APIs whose documents differ only in a name token: every "alpha" document gets the same
    # score, so their order comes from the tie rule alone (database order; an unstable sort
    # scrambles it)
    corpus = [{"domain": "d", "api_call": f"lib.fn{i:02d}()", "description": "x alpha x" if i % 3 else "x beta x"}
              for i in range(40)]
    retriever = BM25Retriever(corpus, hub="test", variant=variant)
    ranked = retriever.retrieve([Query(text="alpha")], top_k=26)[0]
    assert [d["api_call"] for d in ranked] == [f"lib.fn{i:02d}()" for i in range(40) if i % 3]
    # a query that matches nothing: all scores 0, the database order
    assert retriever.retrieve([Query(text="nothing matches this")], top_k=5)[0] == corpus[:5]


def test_retrieval_eval_outputs_are_byte_identical(tmp_path, apibench):
    # `ratune retrieval eval --retriever all --out DIR --json` in two fresh processes with different
    # hash seeds; every retriever but dense and hybrid (slow to encode twice here; the dense index
    # is compared bit for bit above), so the top-1 agreement with the paper's BM25 documents is written too
    code = ("import sys\n"
            "import ratune.registry as registry\n"
            "for slow in ('dense', 'hybrid'):  # the one dict every stage reads\n"
            "    del registry.RETRIEVERS[slow]\n"
            "from ratune.cli import main\n"
            "sys.exit(main(['retrieval', 'eval', '--apibench', sys.argv[1], '--hub', 'torchhub', '--retriever', 'all',"
            " '--out', sys.argv[2], '--json']))\n")
    printed = [_python(code, str(apibench), str(tmp_path / f"run{seed}"), hash_seed=seed).stdout
               for seed in ("1", "2")]
    assert printed[0] == printed[1]
    a, b = _files(tmp_path / "run1"), _files(tmp_path / "run2")
    assert {"retrieval_torchhub.json", "retrieval_torchhub.md"} <= set(a)
    _assert_same_files(a, b)
    data = json.loads(a["retrieval_torchhub.json"])
    results = {r["retriever"]: r for r in data["results"]}
    assert set(results) == {"oracle", "bm25", "bm25_replica", "gpt_index", "released_bm25"}
    assert results["bm25"]["top1"] == pytest.approx(25 / 186) and results["oracle"]["top1"] == 1.0
    assert [(x["a"], x["agree"], x["n"]) for x in data["agreement"]] == [("bm25", 97, 186), ("bm25_replica", 167, 186)]
    assert json.loads(printed[0])["agreement"] == data["agreement"]
    assert "Top-1 agreement of `bm25_replica` with the paper's BM25 documents: 167 of 186 (89.8 %)." in \
        a["retrieval_torchhub.md"].decode()


# --------------------------------------------------------------------------------------------
# reports


def _eval_folder(root: Path, cells: dict[str, dict]) -> Path:
    for setting, m in cells.items():
        finish_eval(root, setting, m)
    return root


def test_table2_report_is_byte_identical(tmp_path):
    none = _eval_folder(tmp_path / "eval_none", {"0_shot": _metrics(44, 6, 10, strict=(40, 10, 10)),
                                                 "oracle": _metrics(30, 20, 10), "bm25": _metrics(12, 40, 8)})
    oracle = _eval_folder(tmp_path / "eval_oracle", {"oracle": _metrics(60, 0, 0), "0_shot": _metrics(1, 50, 9)})
    (oracle / "bm25").mkdir()  # started, not finished: left out
    (oracle / "bm25" / "metrics.json").write_text(json.dumps(_metrics(5, 5, 50)))

    code = "import sys; from ratune.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["report", "--eval", f"none={none}", "--eval", f"oracle={oracle}", "--hub", "torchhub", "--model", "tiny"]
    printed = [_python(code, *args, "--out", str(tmp_path / f"report{seed}"), hash_seed=seed).stdout
               for seed in ("1", "2")]
    assert printed[0] == printed[1]
    a, b = _files(tmp_path / "report1"), _files(tmp_path / "report2")
    assert {"table2.csv", "table2.json", "table2.md", "table2.png"} <= set(a)
    _assert_same_files(a, b)

    md = a["table2.md"].decode()
    assert "| train \\ test | 0_shot | bm25 | oracle |" in md
    assert "| none | 73.3 [61-83] (h 10.0) | 20.0 [" in md
    # the unfinished oracle/bm25 cell is missing; strict = gorilla here, so the row is in both tables
    assert md.splitlines().count("| oracle | 1.7 [0-9] (h 83.3) | - | 100.0 [94-100] (h 0.0) |") == 2
    table = json.loads(a["table2.json"])
    assert [(c["train_retriever"], c["test_retriever"], c["correct_n"]) for c in table["cells"]] == [
        ("none", "0_shot", 44), ("none", "bm25", 12), ("none", "oracle", 30), ("oracle", "0_shot", 1),
        ("oracle", "oracle", 60)]
    png = a["table2.png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"tIME" not in png and b"Creation Time" not in png  # no timestamp in the image


def _sweep_folder(root: Path, *, ranks: tuple, seeds: list | None) -> Path:
    """A sweep folder with hand-made finished cells (as tests/test_sweep.py builds them): two
    train-time retrieval modes x LoRA ranks, optionally x seeds (replicates)."""
    i = 0
    for retriever in ("oracle", "none"):
        for r in ranks:
            for seed in seeds or [None]:
                axes = {"train_retriever": retriever, "lora.r": r, **({"seed": seed} if seed is not None else {})}
                name = f"cell{i:02d}"
                d = root / "cells" / name
                d.mkdir(parents=True)
                (d / "cell.json").write_text(json.dumps({"name": name, "axes": axes, "config": {
                    "hub": "torchhub", "model": "/models/tiny", "train_retriever": retriever,
                    **({"seed": seed} if seed is not None else {})}}))
                for setting, correct in (("0_shot", 2 + i % 5), ("oracle", 6 + i % 3)):
                    finish_eval(d / "eval", setting, sweep_metrics(correct=correct, halluc=1))
                i += 1
    return root


def test_sweep_report_is_byte_identical(tmp_path):
    plain = _sweep_folder(tmp_path / "plain", ranks=(16, 8), seeds=None)
    repl = _sweep_folder(tmp_path / "replicates", ranks=(8,), seeds=[3, 1, 2])
    code = ("import sys; from ratune.sweep import report_sweep\n"
            "report_sweep(sys.argv[1], sys.argv[3]); report_sweep(sys.argv[2], sys.argv[4])\n")
    for seed in ("1", "2"):
        _python(code, str(plain), str(repl), str(tmp_path / f"plain_report{seed}"),
                str(tmp_path / f"repl_report{seed}"), hash_seed=seed)
    plain_a, plain_b = _files(tmp_path / "plain_report1"), _files(tmp_path / "plain_report2")
    repl_a, repl_b = _files(tmp_path / "repl_report1"), _files(tmp_path / "repl_report2")
    _assert_same_files(plain_a, plain_b)
    _assert_same_files(repl_a, repl_b)

    tables = [f"torchhub__lora-r-{r}/table2.{ext}" for r in (16, 8) for ext in ("csv", "json", "md", "png")]
    # (the byte comparison above covers every file; these are the ones that must be there)
    assert {"sweep.csv", "sweep.json", *tables} <= set(plain_a)
    assert {"replicates.csv", "sweep.csv", "sweep.json", *tables[4:]} <= set(repl_a)
    assert not any(name.startswith("torchhub__lora-r-16/") for name in repl_a)
    summary = json.loads(repl_a["sweep.json"])
    assert summary["seeds"] == [1, 2, 3] and list(summary["tables"]) == ["torchhub__lora-r-8"]
    cells = {(c["train_retriever"], c["test_retriever"]): c for c in summary["tables"]["torchhub__lora-r-8"]["cells"]}
    # cells 0, 1, 2 (oracle, seeds 3, 1, 2): 0_shot correct 2 + i % 5 = 2, 3, 4 of 10; cells 3-5: none
    assert cells[("oracle", "0_shot")]["seeds"] == [1, 2, 3]
    assert cells[("oracle", "0_shot")]["accuracy_runs"] == [0.3, 0.4, 0.2]
    assert cells[("oracle", "0_shot")]["run_cells"] == ["cell01", "cell02", "cell00"]
    assert cells[("none", "0_shot")]["accuracy_runs"] == [0.6, 0.2, 0.5]  # cells 4, 5, 3
    assert "±" in repl_a["torchhub__lora-r-8/table2.md"].decode()
    assert len(json.loads(plain_a["sweep.json"])["tables"]["torchhub__lora-r-16"]["cells"]) == 4
    assert plain_a["sweep.csv"].decode().count("\n") == 1 + 8
