"""A validation split held out of the training examples (`ratune data build --validation-fraction`):
seeded, stratified by API (every validation API is also trained on) or grouped by API (none is),
recorded in the manifest with its example lines, and never in any training row."""

from __future__ import annotations

import json

import pytest

from ratune.errors import RatuneError
from ratune.sources.validate import grouped_holdout, stratified_holdout

#: Positions 0-3 are API A, 4-5 API B, 6 API C.
KEYS = ["A", "A", "A", "A", "B", "B", "C"]


def test_stratified_holdout_worked_by_hand():
    # A (k=4): round(4 x 0.25) = 1 held, the first of A's seeded order [0, 1, 3, 2]; B (k=2): round(0.5) = 1,
    # the first of [4, 5]; C has one example and stays in training
    assert stratified_holdout(KEYS, 0.25, seed=0) == {0, 4}
    assert stratified_holdout(KEYS, 0.25, seed=0) == stratified_holdout(list(KEYS), 0.25, seed=0)  # seeded


def test_grouped_holdout_worked_by_hand():
    # target round(7 x 0.3) = 2 positions; seeded key order [B, C, A]: B (2 positions) reaches it
    assert grouped_holdout(KEYS, 0.3, seed=0) == {4, 5}
    # never every key: A, the last in the order, stays in training whatever the fraction
    assert grouped_holdout(KEYS, 0.99, seed=0) == {4, 5, 6}


def test_grouped_holdout_passes_over_a_group_larger_than_twice_what_is_missing():
    # positions 0-7 are D, 8 B, 9 C, 10 E; target round(11 x 0.2) = 2; seeded key order [E, D, B, C]:
    # E (1), then D would make 9 (7 away from 2, not closer than 1) and is passed over, then B makes 2
    keys = ["D"] * 8 + ["B", "C", "E"]
    assert grouped_holdout(keys, 0.2, seed=0) == {10, 8}


def _tool_example(line: int, *names: str):
    from ratune.sources.apibench import Answer, Example

    tools = tuple({"name": n, "description": "", "parameters": {}} for n in names)
    return Example(hub="t", split="train", line=line, instruction=f"q{line}", api=tools[0],
                   answer=Answer(domain="", api_call="", api_provider="", explanation="", code=""), layout="tools",
                   tools=tools)


def test_api_groups_join_every_tool_a_row_shows():
    from ratune.sources.validate import api_groups

    # rows 1 and 2 share tool b, so a, b and c are one group (named a); d and e another; f alone
    examples = [_tool_example(1, "a", "b"), _tool_example(2, "c", "b"), _tool_example(3, "e", "d"),
                _tool_example(4, "f")]
    assert api_groups(examples) == ["a", "a", "d", "f"]


def _build(apibench_tiny, smol_tokenizer_dir, out, *extra):
    from ratune.cli import main

    return main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(out),
                 "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", "oracle", "bm25",
                 "--mixture", "half:none=0.5,oracle=0.5", *extra])


@pytest.mark.parametrize("by, fraction, held, also_trained", [("api_stratified", "0.5", 6, 6),
                                                                ("api_grouped", "0.34", 4, 0)])
def test_no_validation_example_is_in_any_training_row(tmp_path, apibench_tiny, smol_tokenizer_dir, by, fraction, held,
                                                      also_trained):
    """The tiny TorchHub has two training examples for each of its 6 APIs: stratified 0.5 holds out
    one of each (6, all 6 APIs also trained on); grouped 0.34 holds out round(12 x 0.34) = 4
    examples, two whole APIs (none trained on)."""
    from datasets import load_from_disk

    out = tmp_path / "data"
    assert _build(apibench_tiny, smol_tokenizer_dir, out, "--validation-fraction", fraction, "--validation-by", by) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["validation_split"]
    assert (record["by"], record["n"], len(record["lines"]), record["apis_also_trained"]) == (by, held, held,
                                                                                            also_trained)
    assert manifest["splits"] == {"train": 12 - held, "eval": 6, "validation": held}
    assert manifest["settings"]["validation_fraction"] == float(fraction)
    for mode in ("none", "oracle", "bm25", "mix-half"):
        dd = load_from_disk(str(out / mode))
        train_lines = {r["line"] for r in dd["train"]}
        validation = list(dd["validation"])
        assert {r["line"] for r in validation} == set(record["lines"]) and not train_lines & set(record["lines"])
        assert {r["split"] for r in validation} == {"validation"}
        assert {r["instruction"] for r in dd["train"]}.isdisjoint(r["instruction"] for r in validation)
        if by == "api_grouped":  # no validation API is trained on
            assert {r["gold_api_call"] for r in dd["train"]}.isdisjoint(r["gold_api_call"] for r in validation)


def test_a_build_without_it_is_the_build_it_was(tmp_path, apibench_tiny, smol_tokenizer_dir):
    out = tmp_path / "data"
    assert _build(apibench_tiny, smol_tokenizer_dir, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "validation_split" not in manifest and "validation_fraction" not in manifest["settings"]
    assert manifest["splits"] == {"train": 12, "eval": 6}


def test_bad_fractions_are_refused(tmp_path, apibench_tiny, smol_tokenizer_dir, capsys):
    from ratune.sources.apibench import load_examples
    from ratune.sources.validate import hold_out

    for bad in ("0", "1", "1.5"):
        assert _build(apibench_tiny, smol_tokenizer_dir, tmp_path / "d", "--validation-fraction", bad) == 2
        assert "--validation-fraction" in capsys.readouterr().err
    with pytest.raises(RatuneError, match="holds out none of the 12 training examples"):
        hold_out(load_examples(apibench_tiny, "torchhub", "train"), 0.01, by="api_grouped", seed=0)


def test_a_grouped_split_hides_its_apis_from_every_training_prompt(tmp_path, apibench_tiny, smol_tokenizer_dir):
    """api_grouped: the held-out APIs are never the answer of a training row, and never one of its
    retrieved documents or drawn distractors either (they are passed over; validation rows keep them)."""
    from datasets import load_from_disk
    from ratune.cli import main

    out = tmp_path / "data"
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(out),
                 "--tokenizer", str(smol_tokenizer_dir), "--modes", "bm25", "--top-k", "5",
                 "--mixture", "far:distractors=0.5,top1=0.5", "--validation-fraction", "0.34",
                 "--validation-by", "api_grouped"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation_split"]["hidden_from_training"] == 2
    for mode in ("bm25", "mix-far"):
        dd = load_from_disk(str(out / mode))
        hidden = {r["gold_api_call"] for r in dd["validation"]}
        assert len(hidden) == 2
        shown = {d for r in dd["train"] for d in r["document_api_calls"]}
        assert shown and not shown & hidden
    # the bm25 rows still have 5 documents: of the 6 APIs, 4 are trained on and 2 hidden, so at most 4 remain
    assert {len(r["document_api_calls"]) for r in load_from_disk(str(out / "bm25"))["train"]} == {4}


def test_a_grouped_split_of_a_tool_set_keeps_each_validation_tool_out_of_training(tmp_path, smol_tokenizer):
    """The tool rows of tests/fixtures/tools form three groups: get_weather (line 1), convert (lines 2,
    3) and book_table (lines 4, 5). Held-out groups' tools are in no training row's offered tools nor
    among its retrieved ones, though BM25's top 3 of the 3 tools would hold them all."""
    from pathlib import Path

    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.sources.toolset import import_tool_set

    fixtures = Path(__file__).resolve().parent / "fixtures" / "tools"
    rows = tmp_path / "rows.jsonl"
    rows.write_text((fixtures / "xlam_rows.jsonl").read_text() + (fixtures / "chat_rows.jsonl").read_text())
    import_tool_set(tmp_path / "ts", rows_file=rows, eval_fraction=0)
    settings = BuildSettings(max_length=1024, top_k=3, validation_fraction=0.4, validation_by="api_grouped")
    manifest = build_dataset(apibench_dir=None, hub=str(tmp_path / "ts"), out_dir=tmp_path / "data",
                             tokenizer=smol_tokenizer, tokenizer_name="smol", modes=["oracle", "bm25"],
                             progress=False, settings=settings, leakage="allow")
    record = manifest["validation_split"]
    groups = {1: "get_weather", 2: "convert", 3: "convert", 4: "book_table", 5: "book_table"}
    hidden = {groups[line] for line in record["lines"]}
    assert record["hidden_from_training"] == len(hidden) >= 1 and record["apis_also_trained"] == 0
    assert {groups[line] for line in groups if line not in record["lines"]}.isdisjoint(hidden)
    for mode in ("oracle", "bm25"):
        train = load_from_disk(str(tmp_path / "data" / mode))["train"]
        shown = {name for r in train for name in r["document_api_calls"]}
        assert shown and shown.isdisjoint(hidden), mode


def _retriever_folder(folder, train_path, lines=None):
    """A finetuned retriever's metadata alone (the checks read nothing else), holding out ``lines``."""
    from ratune.io import sha256_file
    from ratune.retrieval.retrievers import RETRIEVER_METADATA_FILE

    folder.mkdir()
    meta = {"hub": "torchhub", "train_sha256": sha256_file(train_path)}
    if lines is not None:
        meta["validation_split"] = {"fraction": 0.5, "by": "api_stratified", "seed": 0, "n": len(lines),
                                    "lines": lines}
    (folder / RETRIEVER_METADATA_FILE).write_text(json.dumps(meta))
    return folder


def test_the_finetuned_retriever_must_hold_the_validation_questions_out(tmp_path, apibench_tiny):
    """require_held_out: a retriever that trained on validation questions (or on another training
    file) is refused, naming how many and the command that trains one without them."""
    from ratune.hubs import resolve_hub
    from ratune.retrieval.dense import require_held_out

    train_path = resolve_hub("torchhub", apibench_tiny).examples_file("train")
    held = {"fraction": 0.34, "by": "api_grouped", "seed": 0, "lines": [3, 4, 9, 10]}
    check = dict(held=held, hub="torchhub", train_path=train_path, what="the dense_ft mode")
    require_held_out(_retriever_folder(tmp_path / "own", train_path, [3, 4, 9, 10, 11]), **check)  # a superset
    command = ("train one that holds them out: ratune retrieval train --hub torchhub --validation-fraction 0.34 "
               "--validation-by api_grouped --validation-seed 0 --out DIR")
    with pytest.raises(RatuneError, match=r"the dense_ft mode: the finetuned retriever .*all trained on 4 of the 4 "
                                          r"validation questions \(lines 3, 4, 9, 10 of torchhub_train.json\), so its documents for them would be "
                                          r"chosen with their answers known; " + command):
        require_held_out(_retriever_folder(tmp_path / "all", train_path), **check)
    with pytest.raises(RatuneError, match=r"trained on 1 of the 4 validation questions \(lines 10 of"):
        require_held_out(_retriever_folder(tmp_path / "some", train_path, [3, 4, 9]), **check)
    other = tmp_path / "other.jsonl"
    other.write_text("{}\n")
    with pytest.raises(RatuneError, match=r"was trained on another version of torchhub_train.json, so .*; " + command):
        require_held_out(_retriever_folder(tmp_path / "file", other, [3, 4, 9, 10]), **check)


@pytest.mark.parametrize("modes, user", [
    (["--modes", "dense_ft"], "dense_ft"),
    (["--modes", "none", "hybrid_ft"], "hybrid_ft"),
    (["--modes", "none", "--mixture", "half:none=0.5,top1=0.5", "--top1-retriever", "dense_ft"], "dense_ft"),
])
def test_a_build_refuses_a_finetuned_retriever_that_trained_on_its_validation_split(tmp_path, apibench_tiny,
                                                                                   smol_tokenizer_dir, capsys, modes,
                                                                                   user):
    """Every mode that retrieves with the finetuned retriever (dense_ft, hybrid_ft, a mixture's top1)."""
    from ratune.cli import main
    from ratune.hubs import resolve_hub

    folder = _retriever_folder(tmp_path / "ft", resolve_hub("torchhub", apibench_tiny).examples_file("train"))
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out",
                 str(tmp_path / "data"), "--tokenizer", str(smol_tokenizer_dir), *modes,
                 "--dense-model", str(folder), "--validation-fraction", "0.5"]) == 2
    assert (f"the {user} mode with a validation split: the finetuned retriever " + str(folder) +
            " trained on 6 of the 6 validation questions") in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_the_retrievers_split_is_drawn_after_removing_duplicates_as_the_builds_is(apibench_tiny, tmp_path):
    """retriever_examples (what `ratune retrieval train --validation-*` trains on) drops a duplicate
    before drawing: with a copy of line 1 appended as line 13, API A's count would be 3 and
    round(3 x 0.5) = 2 of them held out instead of 1."""
    import shutil

    from ratune.hubs import resolve_hub
    from ratune.retrieval.finetune import retriever_examples
    from ratune.sources.apibench import load_examples
    from ratune.sources.validate import HoldoutSettings, hold_out

    train = load_examples(apibench_tiny, "torchhub", "train")
    shutil.copytree(apibench_tiny, tmp_path / "ab")
    train_file = resolve_hub("torchhub", tmp_path / "ab").examples_file("train")
    with train_file.open("a", encoding="utf-8") as f:
        f.write(train_file.read_text(encoding="utf-8").splitlines()[0] + "\n")  # line 13: a copy of line 1
    kept, record, dropped = retriever_examples(resolve_hub("torchhub", tmp_path / "ab"),
                                               HoldoutSettings(validation_fraction=0.5))
    expected = [e.line for e in hold_out(train, 0.5, by="api_stratified", seed=0)[1]]
    assert record == {"fraction": 0.5, "by": "api_stratified", "seed": 0, "n": 6, "lines": expected}
    assert 13 not in {e.line for e in kept} and len(kept) == 6 and dropped is None
    with_copy = load_examples(tmp_path / "ab", "torchhub", "train")
    assert len(hold_out(with_copy, 0.5, by="api_stratified", seed=0)[1]) == 7  # without the dedupe
    assert len(retriever_examples(resolve_hub("torchhub", tmp_path / "ab"))[0]) == 13  # no split: every example
    with pytest.raises(RatuneError, match="no validation split asked for"):
        HoldoutSettings().draw(train)


def test_the_eval_settings_that_retrieve_with_the_finetuned_retriever():
    """What eval --split validation and a sweep's preflight check (needs_finetuned_retriever): the
    finetuned retrievers' settings, with and without constraints, and no other."""
    from ratune.eval.settings import needs_finetuned_retriever
    from ratune.registry import EVAL_SETTINGS

    assert {s for s in EVAL_SETTINGS if needs_finetuned_retriever(s)} == {
        "dense_ft", "hybrid_ft", "constraints_dense_ft", "constraints_hybrid_ft"}
