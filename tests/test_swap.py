"""Document swap (eval/swap.py) on the real TorchHub data: the swapped document
is another API of the same domain, drawn deterministically; answers are classified by hand-made
responses naming the swapped API, the gold API, or neither."""

from __future__ import annotations

import pytest

from ratune.sources.apibench import api_database_path, api_identity, load_api_database, load_examples
from ratune.eval.scoring import Scorer
from ratune.eval.swap import follow_rates
from ratune.retrieval.perturbed import SwapRetriever
from ratune.retrieval.retrievers import Query


@pytest.fixture(scope="module")
def torchhub(apibench):
    database = load_api_database(api_database_path(apibench, "torchhub"))
    examples = load_examples(apibench, "torchhub", "eval")
    return database, examples, Scorer.from_apibench("torchhub", apibench)


def answer(call: str) -> str:
    return f"<<<domain>>>: Classification\n<<<api_call>>>: {call}\n<<<api_provider>>>: PyTorch"


def test_swapped_documents_share_the_domain_and_are_deterministic(torchhub):
    database, examples, _ = torchhub
    queries = [Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples]
    docs = SwapRetriever(database).retrieve(queries)
    assert docs == SwapRetriever(database).retrieve(queries)
    assert docs != SwapRetriever(database, seed=1).retrieve(queries)
    domain_sizes = {}
    for d in database:
        domain_sizes.setdefault(d["domain"], set()).add(api_identity(d))
    for q, got in zip(queries, docs):
        if len(domain_sizes[q.gold["domain"]]) == 1:
            assert got == []  # nothing to swap in: left out
            continue
        (doc,) = got
        assert doc["domain"] == q.gold["domain"] and api_identity(doc) != api_identity(q.gold)
    assert sum(1 for d in docs if d) > 0.9 * len(docs)


def test_follow_rates_by_hand(torchhub):
    database, examples, scorer = torchhub
    retriever = SwapRetriever(database)
    swapped = {}
    for e in examples[:3]:
        doc = retriever.swapped(Query(text=e.instruction, gold=e.api, question_id=e.line))
        assert doc is not None
        swapped[e.line] = doc
    q1, q2, q3 = (e.line for e in examples[:3])
    responses = [{"question_id": q1, "text": answer(swapped[q1]["api_call"])},        # follows the document
                 {"question_id": q2, "text": answer(examples[1].api["api_call"])},    # follows its memory
                 {"question_id": q3, "text": answer("torch.hub.load('nobody/none', 'nothing')")},
                 {"question_id": examples[3].line, "text": answer("x")}]             # not swapped: left out
    rates = follow_rates(scorer, responses, swapped)
    assert (rates["n"], rates["left_out"]) == (3, 1)
    assert (rates["follows_document_n"], rates["follows_memory_n"], rates["neither_n"]) == (1, 1, 1)
    assert rates["follows_document"] == pytest.approx(1 / 3)
    assert [p["outcome"] for p in rates["per_question"]] == ["follows_document", "follows_memory", "neither"]
    lo, hi = rates["follows_document_ci"]
    assert lo == pytest.approx(0.0615, abs=1e-3) and hi == pytest.approx(0.7923, abs=1e-3)  # Wilson, 1 of 3


def test_names_api_uses_strict_keys(torchhub):
    _, examples, scorer = torchhub
    gold = examples[0].api["api_call"]
    assert scorer.names_api(answer(gold), gold)
    assert not scorer.names_api("no call here", gold)
    assert not scorer.names_api(answer("torch.hub.load('pytorch/vision', 'resnet9000')"), gold)


def test_irrelevant_documents_and_abstention_rate(torchhub):
    from ratune.sources.prompt import abstain_answer, format_answer
    from ratune.eval.abstain import abstention
    from ratune.retrieval.perturbed import IrrelevantRetriever

    database, examples, _ = torchhub
    queries = [Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples]
    docs = IrrelevantRetriever(database).retrieve(queries)
    assert docs == IrrelevantRetriever(database).retrieve(queries)
    assert all(len(d) == 1 and d[0]["domain"] != q.gold["domain"] for q, d in zip(queries, docs))
    responses = [{"question_id": 1, "text": format_answer(abstain_answer(None))},
                 {"question_id": 2, "text": "<<<domain>>>: x\n<<<api_call>>>:  no_api_fits \n<<<api_provider>>>: y"},
                 {"question_id": 3, "text": answer(examples[2].api["api_call"])},
                 {"question_id": 4, "text": None}]
    rate = abstention(responses)
    assert (rate["n"], rate["abstained_n"], rate["rate"]) == (4, 2, 0.5)
    assert rate["rate_ci"][0] == pytest.approx(0.150, abs=1e-3) and rate["rate_ci"][1] == pytest.approx(0.850, abs=1e-3)


def test_experiment_settings_through_the_eval_stage_and_sweep_report(tmp_path, apibench, tiny_model_dir, torchhub):
    """swap, irrelevant and constraints_oracle run as eval settings with a tiny model; their
    metrics carry the experiment blocks over the right questions, and the sweep report lists them
    beside Table 2 (never in it)."""
    import json

    from ratune import sweep as sw
    from ratune.eval.constraints import constrained_examples
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    database, examples, _ = torchhub
    first = examples[:6]
    retriever = SwapRetriever(database)
    swappable = [e.line for e in first if retriever.swapped(Query(text=e.instruction, gold=e.api,
                                                                  question_id=e.line)) is not None]
    constrained = [e.line for e, _ in constrained_examples(first, database)]
    cell = tmp_path / "sweep" / "cells" / "c"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({"name": "c", "axes": {"train_retriever": "oracle"}, "config": {
        "hub": "torchhub", "model": str(tiny_model_dir), "train_retriever": "oracle"}}))
    results = evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=cell / "eval",
                                  settings=EvalSettings(settings=["oracle", "swap", "irrelevant", "constraints_oracle"],
                                                        n_questions=6, batch_size=3, max_new_tokens=6,
                                                        torch_threads=1), progress=False)
    swap = results["swap"]["document_swap"]
    assert swap["n"] == len(swappable) and swap["left_out"] == 6 - len(swappable)
    assert swap["follows_document_n"] + swap["follows_memory_n"] + swap["neither_n"] == swap["n"]
    assert [r["question_id"] for r in swap["per_question"]] == swappable
    assert results["irrelevant"]["abstention"]["n"] == 6 and results["oracle"]["abstention"]["n"] == 6
    cons = results["constraints_oracle"]["constraints"]
    assert cons["n"] == len(constrained) and cons["unconstrained_left_out"] == 6 - len(constrained)
    assert [p["question_id"] for p in cons["per_question"]] == constrained
    assert set(results["oracle"]["inputs"]) == {"torchhub_api.jsonl", "torchhub_eval.json"}

    tables = sw.report_sweep(tmp_path / "sweep")
    (table,) = tables.values()
    assert {c["test_retriever"] for c in table["cells"]} == {"oracle"}  # experiments are not Table 2 columns
    rows = json.loads((tmp_path / "sweep" / "report" / "experiments.json").read_text())["experiments"]
    assert len(rows) == 1 and rows[0]["follows_document"]["n"] == len(swappable)
    assert rows[0]["false_abstention"]["n"] == 6 and rows[0]["abstention"]["n"] == 6
    assert rows[0]["constraints"]["constraints_oracle"]["both"]["n"] == len(constrained)
    md = (tmp_path / "sweep" / "report" / "experiments.md").read_text()
    assert "| c | oracle |" in md and "constraints_oracle: both" in md
