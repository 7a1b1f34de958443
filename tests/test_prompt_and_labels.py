"""The prompt format, the over-length policy and the loss mask.

Known failure classes covered: EOS masked out when pad == eos; answer boundary searched by
marker tokens (labels all masked, loss 0); truncation cutting the answer or its EOS; rows with no
trainable tokens; right-padded collation.
"""

from __future__ import annotations

import pytest

from ratune.sources.apibench import Answer, load_examples
from ratune.data.build import BuildSettings, build_rows, retrieve_for_mode
from ratune.sources.prompt import (REFERENCE_PHRASE, build_user_turn, encode_prompt, format_answer,
                                render_user_turn, serialize_document, shorten_document)
from ratune.data.labels import NoTrainableTokens, tokenize_row


def test_user_turn_exact_strings():
    assert build_user_turn("Find a model.", None) == "Find a model."
    assert build_user_turn("Find a model.", '{"a": 1}') == (
        "Find a model.\nUse this API documentation for reference: {\"a\": 1}")
    assert REFERENCE_PHRASE == "Use this API documentation for reference: "


def test_answer_markers():
    answer = Answer(domain="D", api_call="f(x=1)", api_provider="P", explanation="E", code="import f")
    assert format_answer(answer) == ("<<<domain>>>: D\n<<<api_call>>>: f(x=1)\n<<<api_provider>>>: P\n"
                                     "<<<explanation>>>: E\n<<<code>>>: import f")


def test_shorten_document_drops_fields_in_order_then_cuts():
    doc = {"domain": "D", "api_call": "f()", "example_code": "x" * 400, "description": "y" * 40}
    length = len  # one "token" per character keeps the arithmetic visible
    text, cut = shorten_document(doc, 1000, length)
    assert not cut and text == serialize_document(doc)
    # {"domain": "D", "api_call": "f()", "description": "y"*40} is 16 + 19 + 16 + 40 + 2 = 93 characters
    text, cut = shorten_document(doc, 93, length)
    assert cut and text == serialize_document({"domain": "D", "api_call": "f()", "description": "y" * 40})
    text, cut = shorten_document(doc, 20, length)
    assert cut and text == '{"domain": "D", "api'  # 20 characters, KEPT_FIELDS first


def test_loss_tokens_decode_to_answer_plus_eos_for_every_built_row(apibench, smol_tokenizer):
    """Every TorchHub training row, in modes none and oracle, with a tokenizer whose pad == eos."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    tok = smol_tokenizer
    assert tok.pad_token_id == tok.eos_token_id  # the hard case
    examples = load_examples(apibench, "torchhub", "train")
    cache = {}
    for mode in ("none", "oracle"):
        docs = retrieve_for_mode(mode, examples, hub="torchhub", apibench_dir=apibench, top_k=1, retriever_cache=cache)
        rows, counts = build_rows(examples, docs, mode=mode, tokenizer=tok,
                                  settings=BuildSettings(max_length=768, max_document_tokens=192))
        assert counts["rows"] + counts["dropped"] == 837 and counts["rows"] == 837
        for row in rows:
            t = tokenize_row(tok, row["user_turn"], row["completion"])
            loss_ids = [i for i, m in zip(t.input_ids, t.completion_mask) if m]
            assert loss_ids[-1] == tok.eos_token_id
            assert tok.decode(loss_ids) == row["completion"] + tok.eos_token
            assert len(t.input_ids) <= 768
        # and through TRL's collator, with padding by the EOS id: the final EOS keeps its label
        batch_rows = [tokenize_row(tok, r["user_turn"], r["completion"]) for r in rows[:4]]
        features = [{"input_ids": r.input_ids,
                     "labels": [i if m else -100 for i, m in zip(r.input_ids, r.completion_mask)]}
                    for r in batch_rows]
        batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(features)
        for b, r in enumerate(batch_rows):
            labels = batch["labels"][b].tolist()
            kept = [x for x in labels if x != -100]
            assert kept == [i for i, m in zip(r.input_ids, r.completion_mask) if m]
            assert tok.decode(kept).endswith(tok.eos_token)


def test_row_without_trainable_tokens_is_refused(smol_tokenizer):
    with pytest.raises(NoTrainableTokens, match="answer is empty"):
        tokenize_row(smol_tokenizer, "do x", "   ")


def test_over_length_policy_shortens_document_never_answer(apibench, smol_tokenizer):
    examples = load_examples(apibench, "torchhub", "train")[:20]
    docs = [[e.api] for e in examples]
    rows, counts = build_rows(examples, docs, mode="oracle", tokenizer=smol_tokenizer,
                              settings=BuildSettings(max_length=360, max_document_tokens=None))
    assert counts["shortened"] > 0
    assert counts["rows"] + counts["dropped"] == 20
    for row, ex in zip(rows, [e for e in examples if e.line not in counts["dropped_lines"]]):
        assert row["completion"] == format_answer(ex.answer)
        assert row["n_prompt_tokens"] + row["n_completion_tokens"] <= 360
    # a limit that cannot hold instruction + answer drops the row and counts it
    rows, counts = build_rows(examples[:3], [[]] * 3, mode="none", tokenizer=smol_tokenizer,
                              settings=BuildSettings(max_length=40))
    assert counts == {"rows": 0, "shortened": 0, "dropped": 3, "dropped_lines": [1, 2, 3]}


@pytest.mark.parametrize("mode,setting", [("none", "0_shot"), ("oracle", "oracle"), ("bm25", "bm25")])
def test_prompt_parity_train_and_eval(apibench, smol_tokenizer, mode, setting):
    """The user turn built by the training-set builder equals the evaluator's for the same example
    and retriever."""
    from ratune.registry import setting_retriever
    from ratune.retrieval.retrievers import Query, make_retriever

    tok = smol_tokenizer
    examples = load_examples(apibench, "torchhub", "eval")[:12]
    docs = retrieve_for_mode(mode, examples, hub="torchhub", apibench_dir=apibench, top_k=1, retriever_cache={})
    rows, _ = build_rows(examples, docs, mode=mode, tokenizer=tok,
                         settings=BuildSettings(max_length=2048, max_document_tokens=192))
    retriever = make_retriever(setting_retriever(setting), hub="torchhub", apibench_dir=apibench)
    eval_docs = retriever.retrieve([Query(e.instruction, e.api, e.line) for e in examples], top_k=1)

    def count(text):
        return len(tok(text, add_special_tokens=False)["input_ids"])

    for row, ex, d in zip(rows, examples, eval_docs):
        user_turn, _ = render_user_turn(ex.instruction, d, max_document_tokens=192, count_tokens=count)
        assert row["user_turn"] == user_turn
        assert encode_prompt(tok, row["user_turn"]) == encode_prompt(tok, user_turn)


@pytest.fixture(scope="module")
def built(tmp_path_factory, apibench, smol_tokenizer):
    from ratune.data.build import build_dataset

    out = tmp_path_factory.mktemp("built")
    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer, tokenizer_name="smol",
                  modes=["none", "oracle"], progress=False, settings=BuildSettings(max_length=768,
                                                                                   max_document_tokens=192))
    return out


def test_training_rows_follow_the_configured_mode_no_stale_cache(built, smol_tokenizer):
    """Training re-tokenizes the built chats of its own mode with its own tokenizer every run
    (there is no tokenized cache to go stale)."""
    from ratune.train.config import TrainConfig
    from ratune.train.preflight import load_training_rows

    phrase = smol_tokenizer("Use this API documentation", add_special_tokens=False)["input_ids"]

    def has_phrase(ids):
        return any(ids[i:i + len(phrase)] == phrase for i in range(len(ids)))

    rows = {}
    for mode in ("none", "oracle"):
        cfg = TrainConfig(model="m", data_dir=str(built), train_retriever=mode, output_dir="o", max_length=768,
                          max_examples=16)
        rows[mode], stats = load_training_rows(cfg, smol_tokenizer)
        assert stats["examples"] == 16
    assert not any(has_phrase(ids) for ids in rows["none"]["input_ids"])
    assert all(has_phrase(ids) for ids in rows["oracle"]["input_ids"])
    # same seeded subsample in both arms: the same 16 answers, in the same order
    def answers(r):
        return [tuple(x for x in lab if x != -100) for lab in r["labels"]]

    assert answers(rows["none"]) == answers(rows["oracle"])


def test_training_refuses_rows_longer_than_max_length(built, smol_tokenizer):
    from ratune.errors import RatuneError
    from ratune.train.config import TrainConfig
    from ratune.train.preflight import load_training_rows

    cfg = TrainConfig(model="m", data_dir=str(built), train_retriever="oracle", output_dir="o", max_length=300)
    with pytest.raises(RatuneError, match=r"tokens > max_length 300; rebuild the data"):
        load_training_rows(cfg, smol_tokenizer)


def test_a_merge_across_the_prompt_answer_boundary_is_one_line_naming_template_tokenizer_and_token(
        tmp_path, apibench_tiny, capsys):
    """A LLaMA-1-shaped BPE tokenizer (byte fallback, BOS, no template) whose merges include ':▁',
    as one learned from APIBench text would: under gorilla_v0 the prompt's last ':' and the answer's
    leading space become one token, so no loss mask is exact by position. Refused in one line
    naming the template, the tokenizer and the merged token (before: a ValueError traceback)."""
    from ratune.cli import main
    from ratune.data.labels import AnswerMerge
    from ratune.sources.prompt import use_chat_template
    from tiny_llama_tokenizer import SPACE, build_llama_tokenizer
    from transformers import AutoTokenizer

    folder = tmp_path / "merging_tokenizer"
    folder.mkdir()
    build_llama_tokenizer(folder, pieces=[":" + SPACE], metaspace=True)
    tokenizer = use_chat_template(AutoTokenizer.from_pretrained(str(folder)), "gorilla_v0")
    with pytest.raises(AnswerMerge, match=rf"chat template gorilla_v0, tokenizer {folder}: the answer's first token "
                                          r"merges with the prompt's last one into ':▁'"):
        tokenize_row(tokenizer, "Classify this image.", "<<<domain>>>: Image Classification")
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out",
                 str(tmp_path / "data"), "--tokenizer", str(folder), "--chat-template", "gorilla_v0",
                 "--modes", "none"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ratune")]
    assert len(err) == 1 and err[0].startswith("ratune: error: torchhub ") and "into ':▁'" in err[0], err
    assert not (tmp_path / "data").exists()


def test_separate_answer_tokenization_is_the_way_out_and_training_follows_the_build(tmp_path, apibench_tiny):
    """`--answer-tokenization separate` (prompt and answer tokenized apart, ids concatenated, as TRL
    does) builds what in-context tokenization refused; the manifest records it, and training, which
    re-tokenizes the rows, reads it there (it would hit the same merge otherwise)."""
    import json

    from datasets import load_from_disk
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ratune.cli import main
    from ratune.data.labels import tokenize_row
    from ratune.sources.prompt import use_chat_template
    from tiny_llama_tokenizer import SPACE, build_llama_tokenizer

    folder = tmp_path / "merging_model"
    folder.mkdir()
    build_llama_tokenizer(folder, pieces=[":" + SPACE], metaspace=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
                     ).save_pretrained(folder)
    data = tmp_path / "data"
    assert main(["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(data),
                 "--tokenizer", str(folder), "--chat-template", "gorilla_v0", "--modes", "none",
                 "--answer-tokenization", "separate", "--max-length", "1024"]) == 0
    assert json.loads((data / "manifest.json").read_text())["settings"]["answer_tokenization"] == "separate"
    tokenizer = use_chat_template(tokenizer, "gorilla_v0")
    row = load_from_disk(str(data / "none"))["train"][0]
    tok = tokenize_row(tokenizer, row["user_turn"], row["completion"], answer_tokenization="separate")
    answer = [t for t, m in zip(tok.input_ids, tok.completion_mask) if m]
    # the loss tokens are the answer (behind the template's separator) tokenized alone, then EOS
    assert answer == tokenizer(" " + row["completion"], add_special_tokens=False)["input_ids"] + [2]
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"model": str(folder), "data_dir": str(data), "train_retriever": "none",
                                  "output_dir": str(tmp_path / "run"), "max_length": 1024, "max_steps": 1,
                                  "global_batch_size": 1, "chat_template": "gorilla_v0", "torch_threads": 1}))
    assert main(["train", "--config", str(config)]) == 0
