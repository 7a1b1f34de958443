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
