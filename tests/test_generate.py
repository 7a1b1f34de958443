"""Batched generation: left padding, answers independent of batch composition."""

from __future__ import annotations

from ratune.sources.prompt import encode_prompt, render_user_turn
from all_answers import generate_all


def mixed_prompts(apibench, tok, n: int, max_document_tokens: int) -> list[list[int]]:
    """The first ``n`` TorchHub eval questions as prompt ids: 0-shot at even positions, with the
    gold document (cut to ``max_document_tokens``) at odd ones, so lengths differ several-fold."""
    from ratune.sources.apibench import load_examples

    def count(t):
        return len(tok(t, add_special_tokens=False)["input_ids"])

    return [encode_prompt(tok, render_user_turn(ex.instruction, [ex.api] if i % 2 else None,
                                                max_document_tokens=max_document_tokens, count_tokens=count)[0])
            for i, ex in enumerate(load_examples(apibench, "torchhub", "eval")[:n])]


def test_batched_equals_one_at_a_time(apibench, tiny_model_dir):
    """Prompts of very different lengths (0-shot and oracle) in one batch give the same greedy
    answers as generating each alone."""
    from ratune.models import load_model, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    prompts = mixed_prompts(apibench, tok, 4, max_document_tokens=256)
    lengths = sorted(len(p) for p in prompts)
    assert lengths[-1] > 3 * lengths[0]
    batched = generate_all(model, tok, prompts, batch_size=4, max_new_tokens=12)
    single = generate_all(model, tok, prompts, batch_size=1, max_new_tokens=12)
    assert batched == single
    assert sum(len(t) > 0 for t in single) >= 2


def test_needed_fields_end():
    from ratune.sources.formats import get_answer_format

    needed_fields_end = get_answer_format("apibench").answer_end

    text = "<<<domain>>>: D\n<<<api_call>>>: f(x)\n<<<api_provider>>>: PyTorch\n<<<explanation>>>: E"
    assert text[:needed_fields_end(text)] == "<<<domain>>>: D\n<<<api_call>>>: f(x)\n<<<api_provider>>>: PyTorch"
    assert needed_fields_end("<<<domain>>>: D\n<<<api_call>>>: f(x)\n<<<api_provider>>>: PyT") is None
    assert needed_fields_end("<<<api_provider>>>: P<<<explanation>>>") == len("<<<api_provider>>>: P")
    # a model that jumps to code never completes the fields: nothing is cut
    assert needed_fields_end("<<<code>>>\nimport torch\nmodel = torch.hub.load('a', 'b')\n") is None


def test_fields_complete_criterion_per_sequence(smol_tokenizer):
    """The stopping criterion looks only at generated tokens (after the prompt) and stops each
    sequence once its api_provider line is complete."""
    import torch

    from ratune.eval.generate import AnswerCompleteCriteria

    tok = smol_tokenizer
    prompt = tok("<<<api_provider>>>: in the prompt\n", add_special_tokens=False)["input_ids"]
    done = tok("<<<api_call>>>: f(x)\n<<<api_provider>>>: PyTorch\n", add_special_tokens=False)["input_ids"]
    open_line = tok("<<<api_call>>>: f(x)\n<<<api_provider>>>: PyT", add_special_tokens=False)["input_ids"]
    width = max(len(done), len(open_line))
    rows = [prompt + done + [tok.pad_token_id] * (width - len(done)),
            prompt + open_line + [tok.pad_token_id] * (width - len(open_line))]
    flags = AnswerCompleteCriteria(tok, len(prompt))(torch.tensor(rows), None)
    assert flags.tolist() == [True, False]


def test_prefill_each_prompt_alone_gives_the_batch1_answers(apibench, tiny_model_dir, monkeypatch):
    """The default path prefills every prompt alone and decodes the batch from one left-padded
    cache: its answers equal batch-1 and the padded-prefill path, and it really ran (a spy counts
    one prefill per batch of several prompts)."""
    import pytest

    from ratune.eval import generate
    from ratune.models import load_model, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    prompts = mixed_prompts(apibench, tok, 5, max_document_tokens=256)
    calls = []
    real = generate.prefill_each

    def spy(model_, batch_prompts, width, max_new_tokens):
        calls.append((len(batch_prompts), width))
        cache = real(model_, batch_prompts, width, max_new_tokens)
        # a static cache for the prompt and the 12 new tokens, filled up to the last prompt column
        assert cache.layers[0].keys.shape[:3] == (len(batch_prompts), 2, width + 12)  # 2 kv heads
        assert int(cache.get_seq_length()) == width - 1
        return cache

    monkeypatch.setattr(generate, "prefill_each", spy)
    each = generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12, prefill="each")
    assert calls == [(3, max(len(p) for p in prompts)), (2, sorted(len(p) for p in prompts)[1])]
    padded = generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12, prefill="padded")
    single = generate_all(model, tok, prompts, batch_size=1, max_new_tokens=12)
    assert len(calls) == 2  # neither the padded path nor batch 1 prefills alone
    assert each == padded == single
    assert generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12) == each
    assert len(calls) == 4  # "auto" is "each" on CPU
    assert sum(len(t) > 0 for t in single) >= 3
    with pytest.raises(ValueError, match="unknown prefill mode 'lazy'"):
        generate_all(model, tok, prompts, prefill="lazy")


def test_sliding_window_model_falls_back_to_padded_prefill(apibench, smol_tokenizer, monkeypatch):
    """A model with sliding-window layers cannot be prefilled prompt by prompt into one static cache:
    generate_batches takes the padded path (prefill_each is never called) and its answers still
    equal batch 1, with prompts longer than the window."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    from ratune.eval import generate

    tok = smol_tokenizer
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id, initializer_range=0.5)
    model = MistralForCausalLM(config).eval()
    assert not generate._plain_cache(model)
    prompts = mixed_prompts(apibench, tok, 3, max_document_tokens=128)
    assert min(len(p) for p in prompts) > config.sliding_window

    def must_not_run(*args, **kwargs):
        raise AssertionError("prefill_each ran for a sliding-window model")

    monkeypatch.setattr(generate, "prefill_each", must_not_run)
    batched = generate_all(model, tok, prompts, batch_size=3, max_new_tokens=8, prefill="each")
    single = generate_all(model, tok, prompts, batch_size=1, max_new_tokens=8)
    assert batched == single
    assert sum(len(t) > 0 for t in single) >= 2
