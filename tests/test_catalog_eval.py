"""`ratune eval run`, the learning curve and `ratune report` on a catalog hub: the
catalog's strict metric and argument score in every cell, no gorilla metric (it is
APIBench's, and the cells say so), the precomputed and constrained settings refused, on the real
OpenAPI petstore (examples/catalogs/) with its hand-written pairs split at eval fraction 0.2, seed 0.

The six eval questions (pairs/eval.jsonl, question_id = line):
1 list_pets(limit=5), 2 list_pets(limit=20), 3 create_pets(id=45, name='Nibbles', tag='hamster'),
4 create_pets(id=88, ...), 5 show_pet_by_id(petId='42'), 6 show_pet_by_id(petId='3').
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratune.catalog.folder import import_catalog
from ratune.catalog.pairs import write_pairs
from ratune.cli import main
from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent
PETSTORE = ROOT / "examples" / "catalogs" / "openapi-spec-validator" / "petstore.yaml"
PAIRS = ROOT / "examples" / "catalogs" / "petstore_pairs.jsonl"

#: One answer per eval question, each a case worked by hand (module docstring for the gold calls).
CASES = {
    1: ("petstore.list_pets(limit=5)", "correct", True, True),              # the gold call
    2: ("petstore.list_pets(limit=10)", "correct", True, False),            # right API, another limit
    3: ("petstore.create_pets(name='Nibbles', tag='hamster')", "correct", False, False),  # id missing
    4: ("petstore.show_pet_by_id(petId='88')", "error", False, False),      # another catalog API
    5: ("petstore.delete_pet(petId='42')", "hallucination", False, False),  # an invented API
    6: ("show me pet 3 please (((", "error", False, False),                 # not Python
}


def _answer(call: str) -> str:
    return f"<<<domain>>>: pets\n<<<api_call>>>: {call}\n<<<api_provider>>>: Swagger Petstore"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hub") / "petstore"
    import_catalog("openapi", PETSTORE, folder, "petstore")
    write_pairs(folder, PAIRS, eval_fraction=0.2, seed=0)
    return folder


def _settings(names, **kw):
    from ratune.eval.run import EvalSettings

    return EvalSettings(settings=tuple(names), batch_size=3, max_new_tokens=6, torch_threads=1, **kw)


def _fake_generation(monkeypatch, smol_tokenizer, answer_of):
    """Replace generation with answers chosen per question (found by its instruction in the
    prompt); returns the decoded prompts, in the order they were asked."""
    asked = []

    def fake(backend, model, tokenizer, prompts, **kw):
        out = []
        for j, ids in enumerate(prompts):
            text = tokenizer.decode(ids)
            asked.append(text)
            out.append((j, answer_of(text)))
        return [out]

    monkeypatch.setattr("ratune.eval.run.backend_batches", fake)
    return asked


def _by_instruction(catalog, answers: dict[int, str]):
    from ratune.hubs import resolve_hub

    examples = resolve_hub(catalog).load_examples("eval")

    def answer_of(prompt: str) -> str:
        (line,) = [e.line for e in examples if e.instruction in prompt]
        return _answer(answers[line])
    return answer_of


# ------------------------------------------------------------------------------ the scorer


def test_catalog_eval_scorer_counts_the_hand_worked_cases(catalog):
    from ratune.hubs import resolve_hub
    from ratune.eval.catalog_scorer import CatalogEvalScorer

    scorer = CatalogEvalScorer.from_source(resolve_hub(catalog))
    assert scorer.n_questions == 6 and scorer.hub == "petstore"
    scored = scorer.score([{"question_id": q, "text": _answer(c[0])} for q, c in CASES.items()])
    assert scored["n"] == 6
    assert scored["strict"] == {"accuracy": 0.5, "hallucination": 1 / 6, "error": 2 / 6, "correct_n": 3,
                                "hallucination_n": 1, "error_n": 2}
    assert scored["arguments"] == {"required_present": 2 / 6, "values_equal": 1 / 6, "required_present_n": 2,
                                   "values_equal_n": 1}
    assert [(q["question_id"], q["strict"], q["required_present"], q["values_equal"]) for q in scored["per_question"]] \
        == [(q, c[1], c[2], c[3]) for q, c in CASES.items()]
    assert scored["per_question"][3]["named"] == ["petstore.show_pet_by_id"]
    assert "gorilla" not in scored
    # the swap experiment's question: which API does an answer name?
    assert scorer.gold_api_call(5) == "petstore.show_pet_by_id(petId='42')"
    assert scorer.names_api(_answer("petstore.show_pet_by_id(petId='7')"), "petstore.show_pet_by_id(petId='string')")
    assert not scorer.names_api(_answer("petstore.list_pets()"), "petstore.show_pet_by_id(petId='string')")
    assert not scorer.names_api(None, "petstore.list_pets()")
    with pytest.raises(RatuneError, match="question_id 7 is not a line of catalog petstore's eval pairs"):
        scorer.score_text("x", 7)


# ------------------------------------------------------------------------------ eval run


def test_eval_run_on_a_catalog_scores_strict_and_arguments_without_gorilla(catalog, tiny_model_dir, smol_tokenizer,
                                                                           tmp_path, monkeypatch):
    from ratune.eval.run import evaluate_checkpoint

    asked = _fake_generation(monkeypatch, smol_tokenizer, _by_instruction(catalog, {q: c[0] for q, c in CASES.items()}))
    out = tmp_path / "eval"
    results = evaluate_checkpoint(tiny_model_dir, hub=str(catalog), apibench_dir=None, out_dir=out,
                                  settings=_settings(["0_shot", "oracle", "bm25"]), progress=False)
    assert set(results) == {"0_shot", "oracle", "bm25"}
    for setting, m in results.items():
        assert json.loads((out / setting / "metrics.json").read_text()) == m
        assert m["hub"] == "petstore" and m["hub_kind"] == "catalog" and m["metric"] == "strict" and m["n"] == 6
        assert "gorilla" not in m and "APIBench hubs only" in m["gorilla_unavailable"]
        # the top-level rates are the strict metric's, with their Wilson intervals
        assert (m["accuracy"], m["hallucination"], m["error"]) == (0.5, 1 / 6, 2 / 6)
        assert m["strict"]["correct_n"] == 3 and m["strict"]["accuracy_ci"] == m["accuracy_ci"]
        # 3 of 6, z 1.96: centre 0.5, half-width (1.96 / 1.64027) x sqrt(0.25 / 6 + 3.8416 / 144) = 0.3124
        assert m["accuracy_ci"] == pytest.approx([0.1876, 0.8124], abs=1e-4)
        assert m["arguments"]["required_present_n"] == 2 and m["arguments"]["values_equal_n"] == 1
        assert m["arguments"]["values_equal"] == pytest.approx(1 / 6)
        assert m["catalog"]["name"] == "petstore" and m["catalog"]["kind"] == "catalog"
        assert set(m["inputs"]) == {"apis.jsonl", "eval.jsonl"}
        assert [q["question_id"] for q in m["per_question"]] == [1, 2, 3, 4, 5, 6]
    assert results["bm25"]["retriever"]["hub"] == "petstore"  # BM25 over the catalog's documents
    # the oracle prompts hold the gold document, the 0-shot ones no document
    reference = "Use this API documentation for reference"
    assert len(asked) == 18
    assert sum(reference in p for p in asked) == 12  # oracle and bm25, 6 each
    # in question order (each cell generates its questions in order): the oracle prompts of questions
    # 5 and 6 hold show_pet_by_id's document; no 0-shot prompt holds a document
    assert all("show_pet_by_id" in p for p in asked[6:12][4:6]) and "show_pet_by_id" not in asked[6:12][3]
    assert not any(reference in p for p in asked[0:6])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["hub"] == "petstore" and set(manifest["cells"]) == {"0_shot", "oracle", "bm25"}


def test_eval_run_swap_on_a_catalog_uses_the_catalog_identity(catalog, tiny_model_dir, smol_tokenizer, tmp_path,
                                                              monkeypatch):
    from ratune.hubs import resolve_hub
    from ratune.eval.run import evaluate_checkpoint

    gold = {e.line: e.answer.api_call for e in resolve_hub(catalog).load_examples("eval")}
    _fake_generation(monkeypatch, smol_tokenizer, _by_instruction(catalog, gold))  # every answer: the gold call
    results = evaluate_checkpoint(tiny_model_dir, hub=catalog, apibench_dir=None, out_dir=tmp_path / "eval",
                                  settings=_settings(["swap"]), progress=False)
    swap = results["swap"]["document_swap"]
    # all three petstore APIs share the domain "pets": every question gets another API's document
    assert swap["n"] == 6 and swap["left_out"] == 0
    assert swap["follows_memory_n"] == 6 and swap["follows_document_n"] == 0
    assert results["swap"]["strict"]["correct_n"] == 6 and results["swap"]["arguments"]["values_equal_n"] == 6


def test_eval_run_refuses_settings_a_catalog_does_not_have(catalog, tiny_model_dir, tmp_path):
    from ratune.eval.run import evaluate_checkpoint

    for setting, message in (("gpt_index", "precomputed documents, which exist for the APIBench hubs only, "
                                           "not for catalog petstore"),
                             ("released_bm25", "precomputed documents"),
                             ("constraints_oracle", "constrained questions exist for torchhub only")):
        with pytest.raises(RatuneError, match=f"test setting {setting}: .*{message}"):
            evaluate_checkpoint(tiny_model_dir, hub=catalog, apibench_dir=None, out_dir=tmp_path / setting,
                                settings=_settings([setting]), progress=False)
        assert not (tmp_path / setting).exists()  # refused before any cell is written


def test_eval_run_cli_on_a_catalog_defaults_to_the_computed_settings(catalog, tiny_model_dir, tmp_path, capsys,
                                                                     monkeypatch):
    from ratune.registry import CATALOG_DEFAULT_SETTINGS, DEFAULT_SETTINGS

    assert CATALOG_DEFAULT_SETTINGS == tuple(s for s in DEFAULT_SETTINGS if s != "gpt_index")
    monkeypatch.setattr("ratune.eval.run.backend_batches", lambda backend, model, tokenizer, prompts, **kw: [
        [(j, _answer("petstore.list_pets()")) for j in range(len(prompts))]])
    out = tmp_path / "eval"
    rc = main(["eval", "run", "--checkpoint", str(tiny_model_dir), "--hub", str(catalog), "--out", str(out),
               "--n-questions", "2", "--batch-size", "2", "--max-new-tokens", "4", "--threads", "1"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) == set(CATALOG_DEFAULT_SETTINGS)
    # questions 1 and 2 ask for list_pets: both correct by the strict metric
    assert all(printed[s] == {"n": 2, "accuracy": 1.0, "hallucination": 0.0, "error": 0.0} for s in printed)


# ------------------------------------------------------------------------------ report and curve


def test_report_of_catalog_cells_is_strict_and_arguments_only(catalog, tiny_model_dir, smol_tokenizer, tmp_path,
                                                             monkeypatch, capsys):
    from ratune.eval.run import evaluate_checkpoint

    _fake_generation(monkeypatch, smol_tokenizer, _by_instruction(catalog, {q: c[0] for q, c in CASES.items()}))
    ev = tmp_path / "eval"
    evaluate_checkpoint(tiny_model_dir, hub=catalog, apibench_dir=None, out_dir=ev,
                        settings=_settings(["0_shot", "oracle"]), progress=False)
    out = tmp_path / "report"
    assert main(["report", "--eval", f"oracle={ev}", "--model", "tiny", "--out", str(out)]) == 0
    table = json.loads((out / "table2.json").read_text())
    assert table["hub"] == "petstore" and table["metric"] == "strict"
    cell = next(c for c in table["cells"] if c["test_retriever"] == "oracle")
    assert "accuracy" not in cell  # no gorilla numbers for a catalog
    assert cell["strict"]["correct_n"] == 3 and cell["arguments"]["required_present_n"] == 2
    md = (out / "table2.md").read_text()
    assert "gorilla" not in md and "## strict (exact API)" in md
    assert "| oracle | 50.0 [19-81] (h 16.7) | 50.0 [19-81] (h 16.7) |" in md
    assert "| oracle | 33.3 / 16.7 | 33.3 / 16.7 |" in md  # required present / values equal, % of 6
    csv_row = (out / "table2.csv").read_text().splitlines()[1].split(",")
    assert csv_row[:8] == ["petstore", "tiny", "oracle", "0_shot", "6", "", "", ""]  # gorilla columns blank
    assert (out / "table2.png").stat().st_size > 0
    # --hub is a check against what the cells record
    assert main(["report", "--eval", f"oracle={ev}", "--model", "tiny", "--out", str(out), "--hub", str(catalog)]) == 0
    capsys.readouterr()
    assert main(["report", "--eval", f"oracle={ev}", "--model", "tiny", "--out", str(out), "--hub", "torchhub"]) == 2
    assert "--hub torchhub: the cells were evaluated on petstore" in capsys.readouterr().err


def test_curve_row_and_files_of_a_catalog_cell_leave_gorilla_blank(tmp_path):
    from ratune.eval.curve import curve_csv, curve_markdown, curve_row, plot_curve

    from test_curve import metric_block

    metrics = {"n": 6, "metric": "strict", "strict": metric_block(3, 1, 2)}
    row = curve_row(4, 1.0, "oracle", metrics)
    assert row["strict_correct"] == 3 and row["strict_accuracy"] == 0.5
    assert row["strict_ci"] == pytest.approx([0.1876, 0.8124], abs=1e-4)
    assert all(row[f"gorilla_{k}"] is None for k in ("correct", "accuracy", "hallucination", "ci"))
    assert curve_markdown([row]).splitlines()[2] == "| 4 | 1 | oracle | 6 | 3 (50.0) [18.8-81.2] | 16.7 | - | - |"
    assert curve_csv([row]).splitlines()[1].endswith(",,,,")  # the four gorilla columns
    assert plot_curve([row], tmp_path / "c.png").stat().st_size > 0


def test_eval_score_cli_scores_a_catalog_response_file(catalog, tmp_path, capsys):
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps({"question_id": q, "text": _answer(c[0])}) + "\n" for q, c in CASES.items()))
    capsys.readouterr()
    assert main(["eval", "score", "--hub", str(catalog), "--responses", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hub"] == "petstore" and result["n"] == 6 and "gorilla" not in result
    assert (result["strict"]["correct_n"], result["strict"]["error_n"], result["strict"]["hallucination_n"]) == (3, 2, 1)
    assert (result["arguments"]["required_present_n"], result["arguments"]["values_equal_n"]) == (2, 1)
    assert main(["eval", "score", "--hub", str(catalog), "--responses", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"catalog petstore, 6 responses ({path})"
    assert table[2].replace("( ", "(").split() == ["strict", "3", "(50.00%)", "1", "(16.67%)", "2", "(33.33%)"]
    assert table[3] == "arguments: required present 2 (33.33%), values equal 1 (16.67%) of 6"
    assert main(["eval", "score", "--hub", str(catalog), "--responses", str(path), "--metric", "gorilla"]) == 2
    assert "--metric gorilla: the gorilla metric" in capsys.readouterr().err
    path.write_text(json.dumps({"question_id": 9, "text": "x"}) + "\n")
    assert main(["eval", "score", "--hub", str(catalog), "--responses", str(path)]) == 2
    assert "responses.jsonl:1: field 'question_id': question_id 9 is not a line of catalog petstore's eval pairs" \
        in capsys.readouterr().err


def test_compare_two_catalog_response_files_by_the_strict_metric(catalog, tmp_path, capsys):
    from ratune.hubs import resolve_hub

    gold = {e.line: e.answer.api_call for e in resolve_hub(catalog).load_examples("eval")}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"question_id": q, "text": _answer(c[0])}) + "\n" for q, c in CASES.items()))
    b.write_text("".join(json.dumps({"question_id": q, "text": _answer(call)}) + "\n" for q, call in gold.items()))
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--hub", str(catalog), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hub"] == "petstore" and result["metric"] == "strict" and result["n"] == 6
    # A is right on questions 1-3, B on all six: 3 discordant, all "only B"; exact McNemar p = 2 x 0.5^3
    assert result["contingency"] == {"both": 3, "only_a": 0, "only_b": 3, "neither": 0}
    assert result["mcnemar_p"] == pytest.approx(0.25)
    assert result["difference"]["value"] == pytest.approx(-0.5)
    assert main(["compare", str(a), str(b), "--hub", str(catalog), "--metric", "gorilla"]) == 2
    assert "--metric gorilla: the gorilla metric" in capsys.readouterr().err


def test_worst_case_table_of_catalog_cells_has_strict_columns_only():
    from ratune.eval.robustness import worst_case, worst_case_markdown

    cells = [{"train_retriever": "oracle", "test_retriever": s, "n": 6,
              "strict": {"accuracy": k / 6, "accuracy_ci": [0.0, 1.0]}} for s, k in (("0_shot", 0), ("oracle", 6))]
    md = worst_case_markdown(worst_case(cells)).splitlines()
    assert md[0] == "| train | worst strict (setting) | mean strict | settings |"
    assert md[1] == "|---|---|---|---|"
    assert md[2] == "| oracle | 0.0 [0-100] (0_shot) | 50.0 | 2 |"
