"""The finetuned dense retriever: leakage check, saved folder and metadata, hub refusal, real learning.

One short finetune (16 TorchHub training pairs of 16 different APIs, 2 epochs of batch 8, 64 word
pieces) is shared by the tests of this file.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from ratune.sources.apibench import api_identity, examples_path, load_examples
from ratune.errors import RatuneError
from ratune.io import read_json, sha256_file
from ratune.retrieval.finetune import (FinetuneSettings, pairs_sha256, train_dense_retriever, training_pairs)
from ratune.retrieval.retrievers import (RETRIEVER_METADATA_FILE, DenseRetriever, Query, default_dense_model,
                                         dense_document_text, make_retriever)

SETTINGS = FinetuneSettings(epochs=2, batch_size=8, learning_rate=1e-4, warmup_ratio=0.0, seed=0, max_seq_length=64)


@pytest.fixture(scope="module")
def splits(apibench):
    return load_examples(apibench, "torchhub", "train"), load_examples(apibench, "torchhub", "eval")


@pytest.fixture(scope="module")
def small_train(splits):
    """The first 16 training examples whose gold APIs are all different (no in-batch duplicates)."""
    seen, out = set(), []
    for ex in splits[0]:
        if api_identity(ex.api) not in seen:
            seen.add(api_identity(ex.api))
            out.append(ex)
        if len(out) == 16:
            return out
    raise AssertionError("TorchHub train has fewer than 16 APIs")


@pytest.fixture(scope="module")
def trained(apibench, splits, small_train, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ft") / "torchhub-ft"
    old_umask = os.umask(0o022)  # as tests/conftest.py umask_022: modes ratune sets (0644) differ from safetensors' 0600
    try:
        meta = train_dense_retriever(small_train, splits[1], hub="torchhub", out_dir=folder,
                                     train_path=examples_path(apibench, "torchhub", "train"),
                                     eval_path=examples_path(apibench, "torchhub", "eval"), settings=SETTINGS, threads=1)
    finally:
        os.umask(old_umask)
    return folder, meta


def _train(apibench, train, eval_, out):
    return train_dense_retriever(train, eval_, hub="torchhub", out_dir=out, settings=SETTINGS,
                                 train_path=examples_path(apibench, "torchhub", "train"),
                                 eval_path=examples_path(apibench, "torchhub", "eval"))


@pytest.mark.parametrize("kind", ["exact", "normalised", "near"])
def test_eval_instruction_in_training_pairs_is_refused(apibench, splits, small_train, tmp_path, kind):
    train, eval_ = splits
    leaked = eval_[4]
    text = {"exact": leaked.instruction,
            "normalised": "  " + leaked.instruction.upper().replace(" ", "   ") + " ",
            # one added word: Jaccard n/(n+1) >= 0.9 for these instructions (>= 9 distinct tokens)
            "near": leaked.instruction + " quickly"}[kind]
    poisoned = list(small_train)
    poisoned[3] = dataclasses.replace(poisoned[3], instruction=text)
    with pytest.raises(RatuneError) as err:
        _train(apibench, poisoned, eval_, tmp_path / "out")
    msg = str(err.value)
    assert "leakage: 1 eval instruction(s)" in msg
    assert f"torchhub_train.json:{poisoned[3].line} <-> " in msg and f"torchhub_eval.json:{leaked.line} ({kind}" in msg
    assert not (tmp_path / "out").exists()  # refused before any training or writing


def test_examples_of_another_split_are_refused(apibench, splits, tmp_path):
    train, eval_ = splits
    with pytest.raises(RatuneError, match="training split"):
        _train(apibench, eval_[:8], eval_, tmp_path / "out")


def test_saved_folder_reloads_with_metadata(apibench, small_train, trained):
    folder, meta = trained
    on_disk = read_json(folder / RETRIEVER_METADATA_FILE)
    assert on_disk == meta
    assert meta["hub"] == "torchhub"
    assert meta["train_sha256"] == sha256_file(examples_path(apibench, "torchhub", "train"))
    assert meta["pairs_sha256"] == pairs_sha256(training_pairs(small_train))
    assert (meta["n_pairs"], meta["epochs"], meta["batch_size"], meta["seed"]) == (16, 2, 8, 0)
    assert meta["steps"] == 4  # 16 pairs / batch 8 x 2 epochs
    assert meta["leakage_check"]["checked"] is True and meta["leakage_check"]["pairs"] == 0
    assert meta["leakage_check"]["n_eval"] == 186
    modes = {str(p.relative_to(folder)): p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes  # trained under umask 022
    r = make_retriever("dense_ft", hub="torchhub", apibench_dir=apibench, dense_model=folder)
    assert isinstance(r, DenseRetriever) and r.name == "dense_ft"
    assert r._model.max_seq_length == 64  # the training length is saved with the model
    assert r.metadata()["finetuned"]["train_sha256"] == meta["train_sha256"]
    ranked = r.retrieve([Query(small_train[0].instruction)], top_k=5)[0]
    assert len(ranked) == 5


def test_finetuned_retriever_refuses_another_hub(apibench, trained):
    folder, _ = trained
    with pytest.raises(RatuneError, match="finetuned for hub 'torchhub', not 'huggingface'"):
        make_retriever("dense_ft", hub="huggingface", apibench_dir=apibench, dense_model=folder)
    with pytest.raises(RatuneError, match="finetuned for hub 'torchhub', not 'tensorflowhub'"):
        DenseRetriever([], hub="tensorflowhub", model=folder)
    with pytest.raises(RatuneError, match="needs the finetuned model folder"):
        make_retriever("dense_ft", hub="torchhub", apibench_dir=apibench)
    with pytest.raises(RatuneError, match="not a ratune finetuned retriever"):
        make_retriever("dense_ft", hub="torchhub", apibench_dir=apibench, dense_model=default_dense_model())


def _gold_stats(model_dir, examples, max_seq_length):
    """Per training pair: cosine(instruction, gold document) and the gold's rank among the pairs' documents."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = max_seq_length
    q = model.encode([e.instruction for e in examples], normalize_embeddings=True)
    d = model.encode([dense_document_text(e.api) for e in examples], normalize_embeddings=True)
    sims = q @ d.T  # (n_pairs, n_pairs); gold on the diagonal
    gold = np.diag(sims)
    ranks = 1 + (sims > gold[:, None]).sum(axis=1)
    return gold, ranks


def test_finetuning_moves_gold_documents_up(small_train, trained):
    """On its own training pairs the finetuned model ranks the gold documents higher than the base model."""
    folder, _ = trained
    base_cos, base_rank = _gold_stats(default_dense_model(), small_train, 64)
    ft_cos, ft_rank = _gold_stats(folder, small_train, 64)
    assert ft_cos.mean() > base_cos.mean() + 0.05
    assert ft_rank.mean() < base_rank.mean()
    assert (ft_rank == 1).sum() > (base_rank == 1).sum()


def test_cli_arguments_and_hub_without_training_split(apibench, tmp_path):
    """`ratune retrieval train` parses its settings; a hub without a training file stops before training."""
    import argparse

    from ratune.retrieval.finetune import add_train_arguments, run_train

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--apibench", str(apibench), "--hub", "huggingface", "--out", str(tmp_path / "hf"),
                              "--epochs", "2", "--batch-size", "16", "--lr", "3e-5", "--seed", "7"])
    assert (args.epochs, args.batch_size, args.lr, args.seed) == (2, 16, 3e-5, 7)
    with pytest.raises(RatuneError, match="no training split for huggingface"):
        run_train(args)
    assert not (tmp_path / "hf").exists()


def test_cli_retrieval_eval_with_a_finetuned_folder(apibench, trained, capsys):
    """`ratune retrieval eval --retriever dense_ft --dense-model DIR` measures the folder; without
    the folder the name is refused."""
    import json

    from ratune.cli import main

    folder, meta = trained
    assert main(["retrieval", "eval", "--apibench", str(apibench), "--hub", "torchhub", "--retriever", "dense_ft",
                 "--dense-model", str(folder), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["retriever"] == "dense_ft" and result["n"] == 186
    assert result["metadata"]["finetuned"]["train_sha256"] == meta["train_sha256"]
    assert 0 <= result["top1"] <= result["recall@5"] <= result["recall@10"] <= 1
    assert main(["retrieval", "eval", "--apibench", str(apibench), "--hub", "torchhub", "--retriever",
                 "dense_ft"]) == 2
    assert "--retriever dense_ft needs --dense-model DIR" in capsys.readouterr().err


def test_a_retriever_trained_beside_a_validation_split_holds_out_the_builds_questions(
        apibench_tiny, smol_tokenizer_dir, tmp_path, capsys):
    """`ratune retrieval train --validation-*` leaves out exactly the examples a data build with the
    same settings holds out (4 of the tiny TorchHub's 12: two whole APIs), records their lines, and
    then passes the check that refuses a retriever trained on validation questions; a build with
    dense_ft then runs, and is not reused once the retriever's record says it trained on one."""
    import json

    from ratune.cli import main
    from ratune.hubs import resolve_hub
    from ratune.retrieval.dense import require_held_out

    split = ["--validation-fraction", "0.34", "--validation-by", "api_grouped", "--validation-seed", "0"]
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out",
                 str(tmp_path / "data"), "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", *split]) == 0
    held = json.loads((tmp_path / "data" / "manifest.json").read_text())["validation_split"]
    capsys.readouterr()
    assert main(["retrieval", "train", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out",
                 str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "4", "--threads", "1", *split, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the Trainer's own log lines
    assert (summary["n_pairs"], summary["validation_held_out"]) == (8, 4)
    meta = json.loads((tmp_path / "ft" / RETRIEVER_METADATA_FILE).read_text())
    assert meta["validation_split"] == {"fraction": 0.34, "by": "api_grouped", "seed": 0, "n": 4,
                                        "lines": held["lines"]}
    require_held_out(tmp_path / "ft", held, hub="torchhub", what="dense_ft",
                     train_path=resolve_hub("torchhub", apibench_tiny).examples_file("train"))
    # a build that retrieves with it for its own validation split; reused only while it holds them out
    build = ["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(tmp_path / "ft_data"),
             "--tokenizer", str(smol_tokenizer_dir), "--modes", "dense_ft", "--dense-model", str(tmp_path / "ft"),
             "--reuse-if-same", *split]
    assert main(build) == 0
    assert json.loads((tmp_path / "ft_data" / "manifest.json").read_text())["validation_split"]["lines"] == held["lines"]
    meta["validation_split"]["lines"] = held["lines"][1:]  # as if it had trained on one of them
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(build) == 2  # the same request (the weights did not change), but not reused
    assert (f"trained on 1 of the 4 validation questions (lines {held['lines'][0]} of torchhub_train.json"
            in capsys.readouterr().err)


def test_a_leaky_hub_trains_its_retriever_with_leakage_drop_on_the_builds_training_examples(
        apibench_tiny, smol_tokenizer_dir, tmp_path, capsys):
    """The tiny TorchHub with line 13 a copy of line 1 and line 14 line 1 asking eval question 1:
    `ratune retrieval train` refuses the leak; with `--leakage drop` it leaves line 14 out (and the
    copy, before the draw), as `ratune data build --leakage drop` does, so both hold out the same 4
    lines (those of the hub without 13 and 14) and a dense_ft build with that split runs; a retriever
    without them is refused with a command that names --leakage drop. A build with --leakage allow
    keeps line 14 and records it, and its dense_ft refusal says that no retriever can match."""
    import json
    import shutil

    from ratune.cli import main
    from ratune.hubs import resolve_hub
    from ratune.retrieval.dense import require_held_out

    apibench = tmp_path / "ab"
    shutil.copytree(apibench_tiny, apibench)
    train_file = resolve_hub("torchhub", apibench).examples_file("train")
    first = train_file.read_text(encoding="utf-8").splitlines()[0]
    train_1 = load_examples(apibench, "torchhub", "train")[0].instruction
    eval_1 = load_examples(apibench, "torchhub", "eval")[0].instruction
    assert train_1 in first and train_1 != eval_1
    with train_file.open("a", encoding="utf-8") as f:
        f.write(first + "\n" + first.replace(train_1, eval_1) + "\n")
    split = ["--validation-fraction", "0.34", "--validation-by", "api_grouped", "--validation-seed", "0"]
    hub = ["--apibench", str(apibench), "--hub", "torchhub"]
    retriever = ["retrieval", "train", *hub, "--out", str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "4",
                 "--threads", "1", *split, "--json"]
    assert main(retriever) == 2
    err = capsys.readouterr().err
    assert "train/eval leakage: 1 eval instruction(s) also in the training data" in err
    assert err.rstrip().endswith("or pass --leakage drop (leave the leaked training examples out)")
    build = ["data", "build", *hub, "--tokenizer", str(smol_tokenizer_dir), "--leakage", "drop", *split]
    assert main([*build, "--out", str(tmp_path / "data"), "--modes", "none"]) == 0
    held = json.loads((tmp_path / "data" / "manifest.json").read_text())["validation_split"]
    assert held["leakage"] == "drop" and held["n"] == 4 and not {13, 14} & set(held["lines"])
    capsys.readouterr()
    assert main([*retriever, "--leakage", "drop"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["n_pairs"], summary["validation_held_out"], summary["leaked_dropped"]) == (8, 4, 1)
    meta = json.loads((tmp_path / "ft" / RETRIEVER_METADATA_FILE).read_text())
    assert meta["validation_split"] == {"fraction": 0.34, "by": "api_grouped", "seed": 0, "n": 4,
                                        "lines": held["lines"], "leakage": "drop"}
    assert (meta["leakage_check"]["policy"], meta["leakage_check"]["dropped_train_rows"]) == ("drop", 1)
    assert main([*build, "--out", str(tmp_path / "ft_data"), "--modes", "dense_ft", "--dense-model",
                 str(tmp_path / "ft")]) == 0
    meta["validation_split"]["lines"] = held["lines"][1:]  # as if it had trained on one of them
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(RatuneError, match=r"ratune retrieval train --hub torchhub --validation-fraction 0.34 "
                                          r"--validation-by api_grouped --validation-seed 0 --leakage drop --out DIR"):
        require_held_out(tmp_path / "ft", held, hub="torchhub", what="dense_ft", train_path=train_file)
    # data.leakage: allow keeps line 14, so its split is drawn over other rows than any retriever's:
    # the build records the kept row, and a dense_ft build (or sweep) on that split says none can match
    from ratune.retrieval.finetune import retriever_examples
    from ratune.sources.validate import HoldoutSettings

    allowed = ["data", "build", *hub, "--tokenizer", str(smol_tokenizer_dir), "--leakage", "allow", *split]
    assert main([*allowed, "--out", str(tmp_path / "allow"), "--modes", "none"]) == 0
    kept = json.loads((tmp_path / "allow" / "manifest.json").read_text())["validation_split"]
    assert (kept["leakage"], kept["leaked_rows_kept"]) == ("allow", 1)
    record = retriever_examples(resolve_hub("torchhub", apibench), HoldoutSettings(0.34, "api_grouped", 0),
                                leakage="allow")[1]
    assert {k: record[k] for k in ("lines", "leakage", "leaked_rows_kept")} == {
        "lines": kept["lines"], "leakage": "allow", "leaked_rows_kept": 1}
    meta["validation_split"]["lines"] = kept["lines"][1:]  # as if it had trained on one of them
    (tmp_path / "ft" / RETRIEVER_METADATA_FILE).write_text(json.dumps(meta))
    capsys.readouterr()
    assert main([*allowed, "--out", str(tmp_path / "allow_ft"), "--modes", "dense_ft", "--dense-model",
                 str(tmp_path / "ft")]) == 2
    assert ("no finetuned retriever can hold these questions out: the split was drawn with 1 training row(s) "
            "that eval instructions leak into kept (--leakage allow") in capsys.readouterr().err
