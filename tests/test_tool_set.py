"""Tool sets: ``ratune tools import`` (xLAM and chat rows, BFCL's categories) into a folder that
every stage reads as a hub (hubs/tools.py), built into ``python_calls`` chats and trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratune.errors import InputError, RatuneError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tools"


@pytest.fixture
def rows_file(tmp_path) -> Path:
    """The 3 xLAM rows and the 2 chat rows of tests/fixtures/tools in one file."""
    path = tmp_path / "rows.jsonl"
    path.write_text((FIXTURES / "xlam_rows.jsonl").read_text() + (FIXTURES / "chat_rows.jsonl").read_text())
    return path


def _rows(folder: Path, split: str) -> list[dict]:
    path = folder / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_import_keeps_each_distinct_tool_once_and_every_row(rows_file, tmp_path):
    from ratune.sources.toolset import import_tool_set, load_tools, tool_key

    manifest = import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0)
    folder = tmp_path / "ts"
    tools = load_tools(folder)
    # two schemas named convert and two named book_table stay apart; get_weather once
    assert sorted(t["name"] for t in tools.values()) == ["book_table", "book_table", "convert", "convert", "get_weather"]
    assert all(tool_key(tool) == key for key, tool in tools.items())
    rows = _rows(folder, "train")
    assert [r["id"] for r in rows] == [f"rows.jsonl:{i}" for i in range(1, 6)]
    assert rows[1]["calls"] == [{"name": "convert", "arguments": {"amount": 10, "to": "EUR"}},
                                {"name": "convert", "arguments": {"amount": 10, "to": "JPY"}}]
    assert rows[2]["calls"] == [] and rows[4]["calls"] == []
    assert rows[3]["system"] == "You call tools." and "system" not in rows[0]
    assert not (folder / "eval.jsonl").exists()  # an empty split has no file
    assert manifest["counts"] == {"tools": 5, "train": 5, "eval": 0, "calls": 4, "no_call_rows": 2}
    assert manifest["name"] == "rows" and manifest["source"]["kind"] == "rows"
    assert json.loads((folder / "manifest.json").read_text())["kind"] == "tool_set"


def test_the_split_keeps_tool_sets_and_queries_on_one_side(rows_file, tmp_path):
    from ratune.sources.toolset import import_tool_set, split_rows

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0.2, seed=3)
    train, held = _rows(tmp_path / "ts", "train"), _rows(tmp_path / "ts", "eval")
    assert len(train) + len(held) == 5 and held
    # the two convert rows (one schema each) and the two book_table rows go together
    names = lambda rows: {r["id"]: r["tools"] for r in rows}  # noqa: E731
    assert {r["id"] for r in held} in ({"rows.jsonl:1"}, {"rows.jsonl:2", "rows.jsonl:3"},
                                       {"rows.jsonl:4", "rows.jsonl:5"})
    assert names(train).keys().isdisjoint(names(held).keys())
    # a near-duplicate query links rows whose tools differ
    rows = [{"query": "get the weather in Paris", "tool_names": ["a"]},
            {"query": "Paris: get the weather in", "tool_names": ["b"]},
            {"query": "something else entirely", "tool_names": ["c"]}]
    for seed in range(6):
        split = split_rows(rows, 0.3, seed)
        sides = {r["tool_names"][0]: side for side, rs in split.items() for r in rs}
        assert sides["a"] == sides["b"]


def test_import_refusals(rows_file, tmp_path):
    from ratune.sources.toolset import import_tool_set

    with pytest.raises(RatuneError, match="give one source"):
        import_tool_set(tmp_path / "a", rows_file=rows_file, bfcl=["simple_python"])
    with pytest.raises(RatuneError, match=r"--eval-fraction 1.0: expected a share in \[0, 1\)"):
        import_tool_set(tmp_path / "a", rows_file=rows_file, eval_fraction=1.0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "tools": [], "answers": [{"name": "nope", "arguments": {}}]}\n')
    with pytest.raises(InputError) as err:
        import_tool_set(tmp_path / "a", rows_file=bad)
    assert str(err.value) == f"{bad}:1: field '/answers/0/name': calls 'nope', which is not among the row's tools (none)"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(RatuneError):
        import_tool_set(mine, rows_file=rows_file)
    assert (mine / "notes.txt").read_text() == "keep" and not (tmp_path / "a").exists()


def test_a_tool_set_folder_is_a_hub_of_its_own_kind(rows_file, tmp_path):
    from ratune.hubs import ToolSetHub, resolve_hub
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0, name="mytools")
    hub = resolve_hub(str(tmp_path / "ts"))
    assert isinstance(hub, ToolSetHub) and hub.name == "mytools" and hub.answer_format == "python_calls"
    examples = hub.load_examples("train")
    assert [e.line for e in examples] == [1, 2, 3, 4, 5]
    convert = examples[1]
    assert convert.answer.api_call == "[convert(amount=10, to='EUR'), convert(amount=10, to='JPY')]"
    assert convert.api["name"] == "convert" and [t["name"] for t in convert.tools] == ["convert"]
    assert examples[2].answer.api_call == "[]" and examples[2].calls == ()
    with pytest.raises(RatuneError, match="has no eval rows"):
        hub.load_examples("eval")


def test_data_build_writes_python_calls_chats(rows_file, tmp_path, smol_tokenizer):
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.data.labels import tokenize_row
    from ratune.sources.formats import PythonCallsFormat
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0)
    manifest = build_dataset(apibench_dir=None, hub=str(tmp_path / "ts"), out_dir=tmp_path / "data",
                             tokenizer=smol_tokenizer, tokenizer_name="smol", modes=["none", "oracle"],
                             progress=False, settings=BuildSettings(max_length=1024), leakage="allow")
    assert manifest["answer_format"] == "python_calls" and manifest["tool_set"]["name"] == "rows"
    oracle = load_from_disk(str(tmp_path / "data" / "oracle"))["train"]
    book = oracle[3]
    schema = json.loads((FIXTURES / "chat_rows.jsonl").read_text().splitlines()[0])["tools"][0]["function"]
    assert book["system"] == PythonCallsFormat.system_prompt([schema]) + "\n\nYou call tools."
    assert book["user_turn"] == "Book a table for 2 at 7pm."
    assert book["completion"] == "[book_table(people=2, time='19:00', options={'outdoor': False})]"
    assert oracle[2]["completion"] == "[]" and oracle[2]["document_api_calls"] == ["convert"]
    none = load_from_disk(str(tmp_path / "data" / "none"))["train"][0]
    assert none["system"] == PythonCallsFormat.system_prompt([]) and none["document_api_calls"] == []
    # the loss covers exactly the answer and EOS, behind the system turn
    row = tokenize_row(smol_tokenizer, book["user_turn"], book["completion"], system=book["system"])
    answer = [t for t, m in zip(row.input_ids, row.completion_mask) if m]
    assert smol_tokenizer.decode(answer) == book["completion"] + smol_tokenizer.eos_token
    assert row.n_prompt_tokens == book["n_prompt_tokens"]


def test_an_irrelevant_mixture_row_answers_with_no_call(rows_file, tmp_path, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_rows
    from ratune.hubs import resolve_hub
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0)
    examples = resolve_hub(str(tmp_path / "ts")).load_examples("train")[:2]
    rows, counts = build_rows(examples, [[examples[1].tools[0]], [examples[0].tools[0]]], mode="mix-x",
                              tokenizer=smol_tokenizer, settings=BuildSettings(max_length=1024),
                              components=["irrelevant", "gold"], answer_format="python_calls")
    assert [r["completion"] for r in rows] == ["[]", "[convert(amount=10, to='EUR'), convert(amount=10, to='JPY')]"]
    assert counts["rows"] == 2


def test_an_over_long_tool_row_is_dropped_never_cut(rows_file, tmp_path, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_rows
    from ratune.hubs import resolve_hub
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0)
    examples = resolve_hub(str(tmp_path / "ts")).load_examples("train")
    rows, counts = build_rows(examples, [list(e.tools) for e in examples], mode="oracle", tokenizer=smol_tokenizer,
                              settings=BuildSettings(max_length=330, max_document_tokens=8),
                              answer_format="python_calls")
    lengths = {r["line"]: r["n_prompt_tokens"] + r["n_completion_tokens"] for r in rows}
    assert all(n <= 330 for n in lengths.values())
    assert counts["shortened"] == 0 and counts["dropped"] == 5 - len(rows) and counts["dropped_lines"]
    assert all(r["system"].count('"name"') == 1 for r in rows)  # whole schemas


def test_same_examples_keeps_in_every_mode_the_examples_all_modes_kept(rows_file, tmp_path, smol_tokenizer):
    """--same-examples: with max_length at the third shortest `oracle` row (every `none` row is
    shorter), `none` keeps every example alone, `oracle` three; with the option both modes keep exactly the examples whose
    oracle row fits, and `none` counts the others as dropped_elsewhere."""
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0)

    def build(out, **settings):
        manifest = build_dataset(apibench_dir=None, hub=str(tmp_path / "ts"), out_dir=tmp_path / out,
                                 tokenizer=smol_tokenizer, tokenizer_name="smol", modes=["none", "oracle"],
                                 progress=False, leakage="allow",
                                 settings=BuildSettings(answer_format="python_calls", **settings))
        rows = {m: load_from_disk(str(tmp_path / out / m))["train"] for m in ("none", "oracle")}
        return manifest, {m: {r["line"]: r["n_prompt_tokens"] + r["n_completion_tokens"] for r in d}
                          for m, d in rows.items()}

    _, full = build("full", max_length=2048)
    limit = sorted(full["oracle"].values())[2]
    fits = {line for line, n in full["oracle"].items() if n <= limit}
    assert len(full["none"]) == 5 and max(full["none"].values()) <= limit and len(fits) == 3  # the premise
    _, alone = build("alone", max_length=limit)
    assert set(alone["none"]) == set(full["none"]) and set(alone["oracle"]) == fits
    manifest, same = build("same", max_length=limit, same_examples=True)
    assert set(same["none"]) == set(same["oracle"]) == fits
    counts = manifest["counts"]["train"]
    assert counts["none"] == {**counts["none"], "rows": len(fits), "dropped": 0, "dropped_elsewhere": 5 - len(fits)}
    assert counts["oracle"]["dropped"] == 5 - len(fits) and counts["oracle"]["dropped_elsewhere"] == 0
    assert manifest["settings"]["same_examples"] is True and "same_examples" not in build("plain", max_length=limit
                                                                                          )[0]["settings"]


def test_training_on_a_tool_set(rows_file, tmp_path, smol_tokenizer, tiny_model_dir):
    import yaml

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.sources.toolset import import_tool_set
    from ratune.train.sft import main

    folder = tmp_path / "ts"
    import_tool_set(folder, rows_file=rows_file, eval_fraction=0)
    build_dataset(apibench_dir=None, hub=str(folder), out_dir=tmp_path / "data", tokenizer=smol_tokenizer,
                  tokenizer_name="smol", modes=["oracle"], progress=False, settings=BuildSettings(max_length=1024), leakage="allow")
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "hub": str(folder), "data_dir": str(tmp_path / "data"),
        "train_retriever": "oracle", "output_dir": str(tmp_path / "run"), "max_length": 1024,
        "global_batch_size": 5, "per_device_batch_size": 5, "max_steps": 1, "learning_rate": 5e-2,
        "warmup_ratio": 0.0, "lr_scheduler": "constant"}))
    assert main(["--config", str(config)]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["hub"] == "rows" and manifest["tool_set"]["kind"] == "tool_set"
    assert manifest["data"]["examples"] == 5 and manifest["steps"] == 1


def test_validation_rows_of_a_tool_set_without_an_eval_split(rows_file, tmp_path, smol_tokenizer, tiny_model_dir,
                                                              monkeypatch):
    """A tool set imported with --eval-fraction 0 has no eval.jsonl; its validation rows (held out by
    the data build) are still asked and scored, and the cell's inputs are the file they came from."""
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.io import sha256_file
    from ratune.sources.toolset import import_tool_set
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    folder = tmp_path / "ts"
    import_tool_set(folder, rows_file=rows_file, eval_fraction=0)
    assert not (folder / "eval.jsonl").exists()
    build_dataset(apibench_dir=None, hub=str(folder), out_dir=tmp_path / "data", tokenizer=smol_tokenizer,
                  tokenizer_name="smol", modes=["oracle"], progress=False, leakage="allow",
                  settings=BuildSettings(max_length=1024, validation_fraction=0.4, validation_by="api_grouped"))
    held = load_from_disk(str(tmp_path / "data" / "oracle"))["validation"]
    gold = dict(zip(held["instruction"], held["completion"]))
    train(TrainConfig(model=str(tiny_model_dir), hub=str(folder), data_dir=str(tmp_path / "data"),
                      train_retriever="oracle", output_dir=str(tmp_path / "run"), max_length=1024, global_batch_size=1,
                      max_steps=1, warmup_ratio=0.0, lr_scheduler="constant", torch_threads=1))

    def answers(backend, model, tokenizer, prompts, **kw):  # each held-out row's own answer
        texts = [tokenizer.decode(p) for p in prompts]
        return [[(j, next(a for q, a in gold.items() if q in text)) for j, text in enumerate(texts)]]

    monkeypatch.setattr("ratune.eval.run.backend_batches", answers)
    results = evaluate_checkpoint(tmp_path / "run", hub=str(folder), apibench_dir=None, out_dir=tmp_path / "e",
                                  settings=EvalSettings(settings=("oracle",), split="validation", batch_size=2,
                                                        max_new_tokens=8, torch_threads=1), progress=False)
    m = results["oracle"]
    assert m["split"] == "validation" and m["n"] == len(gold) >= 1 and m["strict"]["correct_n"] == len(gold)
    inputs = json.loads((tmp_path / "e" / "oracle" / "metrics.json").read_text())["inputs"]
    assert inputs["train.jsonl"] == sha256_file(folder / "train.jsonl") and "eval.jsonl" not in inputs


@pytest.mark.bfcl
def test_bfcl_rows_are_trained_on_the_prompt_bfcl_scores(tmp_path, smol_tokenizer):
    """BFCL imported: every converted answer BFCL's checker accepts is kept (the four keys no
    answer passes are left out by name), and the oracle prompt of every row is the prompt
    ``ratune eval bfcl`` sends for that entry."""
    from ratune.eval.bfcl import AST_CATEGORIES, check_converted_answers
    from ratune.hubs import resolve_hub
    from ratune.sources.bfcl import bfcl_data_dir, bfcl_messages, load_bfcl
    from ratune.sources.formats import get_answer_format
    from ratune.sources.prompt import chat_messages
    from ratune.sources.toolset import import_tool_set

    categories = [*AST_CATEGORIES, "irrelevance", "live_irrelevance"]
    manifest = import_tool_set(tmp_path / "bfcl", bfcl=categories, eval_fraction=0.2)
    refused = {i for c in check_converted_answers(AST_CATEGORIES).values() for i, _ in c["dropped"]}
    assert set(manifest["skipped"]["unpassable"]) == refused == {
        "live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_862-181-3", "live_multiple_964-207-0"}
    entries = {e.id: e for c in categories for e in load_bfcl(bfcl_data_dir(), c)}
    kept = len(entries) - len(refused) - len(manifest["skipped"]["multi_turn"])
    assert manifest["counts"]["train"] + manifest["counts"]["eval"] == kept
    hub = resolve_hub(str(tmp_path / "bfcl"))
    fmt = get_answer_format(hub.answer_format)
    ids = {split: [r["id"] for r in _rows(tmp_path / "bfcl", split)] for split in ("train", "eval")}
    for split in ("train", "eval"):
        for example, entry_id in zip(hub.load_examples(split), ids[split]):
            prompt = fmt.prompt(example, example.tools, max_document_tokens=None, count_tokens=None)
            assert chat_messages(prompt.user_turn, prompt.system) == bfcl_messages(entries[entry_id]), entry_id


# ------------------------------------------------------------------------------ scoring a tool set


def test_python_calls_answers_are_read_without_evaluating_them():
    from ratune.sources.formats import PythonCallsFormat

    parse = PythonCallsFormat().parse_calls
    assert parse("[math.factorial(number=5)]") == [{"name": "math.factorial", "arguments": {"number": 5}}]
    assert parse("Sure: [f(a=1, b=(1, 2)), g()] and more") == [{"name": "f", "arguments": {"a": 1, "b": [1, 2]}},
                                                              {"name": "g", "arguments": {}}]
    assert parse("[]") == [] and parse("[f(a={'x': [True, None]})]") == [
        {"name": "f", "arguments": {"a": {"x": [True, None]}}}]
    # bare calls, read as BFCL's decoder reads them: stripped of backticks and wrapped in a list
    assert parse("music.theory.chordProgression(progression=['I', 'V'])") == [
        {"name": "music.theory.chordProgression", "arguments": {"progression": ["I", "V"]}}]
    assert parse("```\nf(a=1), g(b=[2])\n```") == [{"name": "f", "arguments": {"a": 1}},
                                                   {"name": "g", "arguments": {"b": [2]}}]
    for text in ("no list here", "[f(1)]", "[f(**kw)]", "[f(a=__import__('os'))]", "[f(a=1 + x)]", "[1, 2]",
                 "[f(a=1)", "[g()(a=1)]", "f(a=[1]) and then prose", "f(a=1"):
        assert parse(text) is None, text


def _scorer(folder):
    from ratune.eval.hub_scoring import scoring_for
    from ratune.hubs import resolve_hub

    return scoring_for(resolve_hub(str(folder)))


def test_the_tool_set_scorer_counts_hand_worked_cases(rows_file, tmp_path):
    from ratune.sources.toolset import import_tool_set

    # everything in eval: lines 1..5 are the rows in file order
    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0.999)
    scoring = _scorer(tmp_path / "ts")
    assert scoring.scorer.n_questions == 5 and scoring.metrics == ("strict",)
    answers = {
        1: "[get_weather(unit='celsius', city='Paris')]",  # keyword order does not matter: correct
        2: "[convert(to='JPY', amount=10.0), convert(amount=10, to='EUR')]",  # call order, 10.0 == 10: correct
        3: "[send_email(to='x')]",  # no tool of the set is called send_email: hallucination
        4: "[book_table(people=2, time='7pm')]",  # a wrong value: error
        5: "Hi! How can I help?",  # no call list at all: error
    }
    scored = scoring.score([{"question_id": q, "text": t} for q, t in answers.items()])
    assert scored["strict"] == {"accuracy": 0.4, "hallucination": 0.2, "error": 0.4, "correct_n": 2,
                                "hallucination_n": 1, "error_n": 2}
    # rows 1, 2 and 4 call a tool (2 right); rows 3 and 5 call nothing (one answered with a call, one in prose)
    assert scored["calls"] == {"format_adherence": 0.8, "call_rate": 0.8, "decoded_n": 4, "calling_n": 4,
                               "by_answer": {"call": {"n": 3, "correct_n": 2}, "no_call": {"n": 2, "correct_n": 0}}}
    assert [q["strict"] for q in scored["per_question"]] == ["correct", "correct", "hallucination", "error", "error"]
    assert scoring.score([{"question_id": 3, "text": "[]"}])["strict"]["correct_n"] == 1  # row 3 calls nothing
    with pytest.raises(RatuneError, match="--metric gorilla: the gorilla metric is APIBench's"):
        scoring.require_metric("gorilla")
    with pytest.raises(RatuneError, match="question_id 6 is not a line of tool set rows's eval rows"):
        scoring.score([{"question_id": 6, "text": "[]"}])


def test_eval_run_on_a_tool_set(rows_file, tmp_path, tiny_model_dir, smol_tokenizer, monkeypatch):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.sources.formats import PythonCallsFormat
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows_file, eval_fraction=0.999)
    asked, seen = [], {}

    def fake(backend, model, tokenizer, prompts, **kw):
        seen.update(kw)
        asked.extend(tokenizer.decode(ids) for ids in prompts)
        return [[(j, "[get_weather(city='Paris', unit='celsius')]") for j in range(len(prompts))]]

    monkeypatch.setattr("ratune.eval.run.backend_batches", fake)
    results = evaluate_checkpoint(tiny_model_dir, hub=str(tmp_path / "ts"), apibench_dir=None, out_dir=tmp_path / "e",
                                  settings=EvalSettings(settings=("0_shot", "oracle"), batch_size=2, max_new_tokens=8,
                                                        torch_threads=1), progress=False)
    assert seen["answer_format"] == "python_calls"
    for setting, m in results.items():
        assert m["hub_kind"] == "tool_set" and m["metric"] == "strict" and m["n"] == 5
        assert m["strict"]["correct_n"] == 1 and m["calls"]["call_rate"] == 1.0
        assert m["generation"]["answer_format"] == "python_calls" and "gorilla" not in m
    weather = json.loads((FIXTURES / "xlam_rows.jsonl").read_text().splitlines()[0])["tools"]
    oracle_system = PythonCallsFormat.system_prompt(json.loads(weather))
    assert sum(oracle_system in text for text in asked) == 1  # the oracle prompt of row 1 shows its tool
    assert sum(PythonCallsFormat.system_prompt([]) in text for text in asked) == 5  # the 0-shot prompts
    with pytest.raises(RatuneError, match="test setting swap: an experiment of the API hubs"):
        evaluate_checkpoint(tiny_model_dir, hub=str(tmp_path / "ts"), apibench_dir=None, out_dir=tmp_path / "s",
                            settings=EvalSettings(settings=("swap",)), progress=False)


def test_the_import_command(rows_file, tmp_path, capsys):
    from ratune.cli import main

    assert main(["tools", "import", "--from", "rows", str(rows_file), "--out", str(tmp_path / "ts"),
                 "--eval-fraction", "0", "--name", "fixtures"]) == 0
    out = capsys.readouterr().out
    assert "tool set fixtures: 5 tools; 5 train and 0 eval rows (2 call nothing)" in out
    assert main(["tools", "import", "--from", "rows", str(rows_file), str(rows_file), "--out", str(tmp_path / "b")]) == 2
    assert "--from rows: one rows file, got 2 sources" in capsys.readouterr().err
    assert main(["tools", "import", "--from", "rows", str(rows_file), "--name", "torchhub", "--out",
                 str(tmp_path / "c")]) == 2
    assert "tool set name 'torchhub': an APIBench hub's name" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
