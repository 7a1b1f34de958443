"""Batched generation: left padding, answers independent of batch composition."""

from __future__ import annotations

import functools

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


def test_left_padded_puts_padding_before_each_prompt():
    from ratune.models import left_padded

    input_ids, attention = left_padded([[5, 6, 7], [8]], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert attention.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert str(input_ids.dtype) == str(attention.dtype) == "torch.int64"


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

    def spy(model_, batch_prompts, width, max_new_tokens, prefix=None):
        calls.append((len(batch_prompts), width))
        cache = real(model_, batch_prompts, width, max_new_tokens, prefix=prefix)
        # a static cache for the prompt and the 12 new tokens, filled up to the last prompt column
        assert cache.layers[0].keys.shape[:3] == (len(batch_prompts), 2, width + 12)  # 2 kv heads
        assert int(cache.get_seq_length()) == width - 1
        return cache

    monkeypatch.setattr(generate, "prefill_each", spy)
    each = generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12, prefill="each", decode_chunk=None)
    assert calls == [(3, max(len(p) for p in prompts)), (2, sorted(len(p) for p in prompts)[1])]
    padded = generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12, prefill="padded")
    single = generate_all(model, tok, prompts, batch_size=1, max_new_tokens=12)
    assert len(calls) == 2  # neither the padded path nor batch 1 prefills alone
    assert each == padded == single
    assert generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12, decode_chunk=None) == each
    assert len(calls) == 4  # "auto" is "each" on CPU
    assert generate_all(model, tok, prompts, batch_size=3, max_new_tokens=12) == each  # chunked decoding
    assert len(calls) == 4  # which stacks its own caches
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


def test_shared_prefix_is_prefilled_once_and_changes_no_cache(apibench, tiny_model_dir, monkeypatch):
    """The ids every prompt starts with (the chat template's system turn here) run through the
    model once per call: each prompt's cache built on them equals the cache of the whole prompt run
    alone, and the answers equal those without sharing and batch 1."""
    import torch

    from ratune.eval import generate
    from ratune.models import load_model, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    prompts = mixed_prompts(apibench, tok, 5, max_document_tokens=256)
    shared = generate.common_prefix_length(prompts)
    assert shared >= generate.MIN_SHARED_PREFIX and all(p[:shared] == prompts[0][:shared] for p in prompts)
    assert len({p[shared] for p in prompts}) > 1  # the prefix ends where the prompts part
    assert generate.common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 5]]) == 1
    assert generate.common_prefix_length([[7, 8]]) == 2 and generate.common_prefix_length([]) == 0
    width = max(len(p) for p in prompts)
    with torch.inference_mode():
        prefix = (shared, generate.prefix_cache(model, prompts[0][:shared]))
        on_prefix = generate.prefill_each(model, prompts, width, 4, prefix=prefix)
        alone = generate.prefill_each(model, prompts, width, 4)
    for a, b in zip(on_prefix.layers, alone.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
    assert on_prefix.layers[0].keys.abs().sum() > 0
    made = []
    real = generate.prefix_cache
    monkeypatch.setattr(generate, "prefix_cache", lambda m, ids: made.append(len(ids)) or real(m, ids))
    shared_answers = generate_all(model, tok, prompts, batch_size=2, max_new_tokens=12)
    assert made == [shared]  # once for three batches
    assert shared_answers == generate_all(model, tok, prompts, batch_size=2, max_new_tokens=12, share_prefix=False)
    assert shared_answers == generate_all(model, tok, prompts, batch_size=1, max_new_tokens=12)
    assert made == [shared]


def _ends_sometimes(tiny_model_dir, eos_id: int, every: int):
    """The tiny model, made to write EOS wherever its greedy token's id is a multiple of ``every``:
    answers of different lengths that depend only on each row's own logits."""
    import torch
    from transformers import LlamaForCausalLM

    class EndsSometimes(LlamaForCausalLM):
        @functools.wraps(LlamaForCausalLM.forward)  # generate reads the signature: position_ids for left padding
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            last = out.logits[:, -1]
            end = last.argmax(dim=-1) % every == 0
            last[:, eos_id] = torch.where(end, last.max(dim=-1).values + 1, last[:, eos_id])
            return out

    return EndsSometimes.from_pretrained(tiny_model_dir).eval()


def test_chunked_decoding_sheds_finished_rows_and_keeps_every_answer(apibench, tiny_model_dir, monkeypatch):
    """Decoding 3 tokens per generate call, rows that wrote EOS leave the batch (later calls get
    fewer rows) and the rest continue; with fewer places than prompts, waiting prompts take the
    places of finished rows: every answer equals one call per batch and batch 1, including rows
    cut by their own length limit."""
    from ratune.eval import generate
    from ratune.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = _ends_sometimes(tiny_model_dir, tok.eos_token_id, every=13)
    prompts = mixed_prompts(apibench, tok, 6, max_document_tokens=256)
    rows = []
    real = model.generate

    def spy(*args, **kwargs):
        rows.append((kwargs["input_ids"].shape[0], kwargs["cache"].layers[0].keys.shape[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    chunked = generate_all(model, tok, prompts, batch_size=6, max_new_tokens=14, decode_chunk=3)
    assert rows[0] == (6, max(len(p) for p in prompts) + 3)
    assert min(n for n, _ in rows) < 6 and len(rows) > 2  # rows left the batch between calls
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in chunked]
    assert min(lengths) < 8 and max(lengths) > 10  # some ended early, some ran on
    rows.clear()
    refilled = generate_all(model, tok, prompts, batch_size=2, max_new_tokens=14, decode_chunk=3)
    assert refilled == chunked
    assert [n for n, _ in rows[:3]] == [2, 2, 2] and len(rows) > 3  # a finished row's place is taken at once
    monkeypatch.undo()
    assert chunked == generate_all(model, tok, prompts, batch_size=6, max_new_tokens=14, decode_chunk=None)
    assert chunked == generate_all(model, tok, prompts, batch_size=1, max_new_tokens=14)
    # two 0-shot prompts, the longer limited to 5 new tokens by max_positions: cut in the second call
    short = [p for p in prompts if len(p) < 60]
    assert len(short) == 2
    limit = max(len(p) for p in short) + 5
    cut = generate_all(model, tok, short, batch_size=6, max_new_tokens=14, decode_chunk=3, max_positions=limit)
    assert cut == generate_all(model, tok, short, batch_size=1, max_new_tokens=14, max_positions=limit)
    assert cut != [t for p, t in zip(prompts, chunked) if len(p) < 60]
    import pytest

    with pytest.raises(ValueError, match="decode_chunk must be at least 1, got 0"):
        generate_all(model, tok, prompts, decode_chunk=0)


def test_chunked_decoding_stops_each_call_list_where_it_closes(tiny_model_dir, smol_tokenizer):
    """Two rows scripted to write call lists that close at different tokens, 4 tokens per generate
    call: each answer is cut where its own list closes, and the second row decodes alone once the
    first is done."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.cache_utils import StaticCache

    tok = smol_tokenizer
    answers = ["[get_weather(city='Paris', unit='celsius')]",
               "[get_time(zone='UTC'), get_date(zone='Europe/Paris', format='long', locale='fr')]"]
    scripts = [tok(a + " I hope this helps, and here is more prose." * 3, add_special_tokens=False)["input_ids"]
               for a in answers]
    prompts = [tok("What is the weather in Paris?")["input_ids"],
               tok("What time is it? " * 30)["input_ids"]]
    starts = [len(p) - 1 for p in prompts]  # the position whose logits give the first answer token
    assert starts[1] - starts[0] > max(len(s) for s in scripts)  # a position names its row
    batch_rows = []

    class Scripted(LlamaForCausalLM):
        @functools.wraps(LlamaForCausalLM.forward)  # generate reads the signature: position_ids for left padding
        def forward(self, *args, position_ids=None, cache=None, **kwargs):
            out = super().forward(*args, position_ids=position_ids, cache=cache, **kwargs)
            if isinstance(cache, StaticCache):  # a decoding step of generate
                batch_rows.append(out.logits.shape[0])
                logits = torch.full_like(out.logits, float("-inf"))
                for row, p in enumerate(position_ids[:, -1].tolist()):
                    token = tok.eos_token_id
                    for start, script in zip(starts, scripts):
                        if 0 <= p - start < len(script):
                            token = script[p - start]
                    logits[row, -1, token] = 0.0
                out.logits = logits
            return out

    model = Scripted.from_pretrained(tiny_model_dir).eval()
    got = generate_all(model, tok, prompts, batch_size=2, max_new_tokens=60, stop_after_api_call=True,
                       answer_format="python_calls", decode_chunk=4, share_prefix=False)
    assert got == answers
    closes = [next(k for k in range(1, len(s)) if tok.decode(s[:k]).rstrip().endswith(a))
              for s, a in zip(scripts, answers)]
    assert closes[0] < closes[1]
    ends = [4 * -(-c // 4) for c in closes]  # the end of the call in which each list closes
    assert batch_rows == [2] * ends[0] + [1] * (closes[1] - ends[0])
