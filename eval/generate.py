"""Batched greedy generation for eval prompts (HF ``generate``), with the stop ids, length limits
and answer cut the vLLM backend shares. Batching and prefill modes: docs/performance.md#generation;
stop ids and length policy: docs/pipeline.md#eval.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from ratune.models import left_padded
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, get_answer_format

def finish_answer(text: str, *, stop_after_api_call: bool, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """The stored answer for decoded generated text: cut where the answer is complete when
    ``stop_after_api_call`` (:meth:`ratune.sources.formats.AnswerFormat.finish`), then stripped;
    every backend stores its answers through this one function.
    """
    return get_answer_format(answer_format).finish(text, stop=stop_after_api_call)


def stop_token_ids(tokenizer) -> list[int]:
    """The token ids that end an answer in every backend: the tokenizer's EOS alone, the token
    training appends to every answer (:func:`ratune.data.labels.tokenize_row`).

    Raises:
        RatuneError: the tokenizer has no EOS token.
    """
    from ratune.errors import RatuneError

    if tokenizer.eos_token_id is None:
        raise RatuneError("the tokenizer has no EOS token: answers would never end (set eos_token in its "
                          "tokenizer_config.json)")
    return [int(tokenizer.eos_token_id)]


def max_positions_of(config) -> int | None:
    """The longest sequence, prompt plus answer, a model config allows: ``max_position_embeddings``
    of its text config (2048 for LLaMA-1); None when the config names none."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def generation_limits(prompt_lengths: Sequence[int], *, max_new_tokens: int, max_positions: int | None,
                      names: Sequence[str] | None = None) -> list[int]:
    """The new tokens each prompt may get: ``min(max_new_tokens, max_positions - n)`` for a prompt
    of ``n`` tokens (``max_new_tokens`` when ``max_positions`` is None). ``names`` name the prompts
    in errors (default ``prompt {index}``).

    Raises:
        RatuneError: a prompt of ``max_positions`` tokens or more (no room for one new token),
            naming it, its length and the limit.
    """
    from ratune.errors import RatuneError

    limits = []
    for i, n in enumerate(prompt_lengths):
        room = max_new_tokens if max_positions is None else min(max_new_tokens, max_positions - n)
        if room < 1:
            name = names[i] if names is not None else f"prompt {i}"
            raise RatuneError(f"{name}: the prompt has {n} tokens, and the model has {max_positions} positions "
                              "(max_position_embeddings): no room for an answer; shorten the documents "
                              "(--max-document-tokens)")
        limits.append(room)
    return limits


def decode_answer(tokenizer, new_token_ids, *, stop_after_api_call: bool,
                  answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """Decode a sequence's generated ids (after the prompt; EOS and padding are special tokens
    and skipped) and apply :func:`finish_answer`."""
    text = tokenizer.decode(list(int(t) for t in new_token_ids), skip_special_tokens=True)
    return finish_answer(text, stop_after_api_call=stop_after_api_call, answer_format=answer_format)


class AnswerCompleteCriteria:
    """A transformers stopping criterion: per sequence, True once the answer format finds the
    answer complete (:meth:`ratune.sources.formats.AnswerFormat.answer_end`) in the tokens after
    ``prompt_width`` (one column for all rows, or one per row)."""

    def __init__(self, tokenizer, prompt_width: int | Sequence[int], answer_format: str = DEFAULT_ANSWER_FORMAT):
        self.tokenizer, self.prompt_width = tokenizer, prompt_width
        self.answer_format = get_answer_format(answer_format)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        if isinstance(self.prompt_width, int):
            answers = input_ids[:, self.prompt_width:]
        else:
            answers = [row[start:] for row, start in zip(input_ids.tolist(), self.prompt_width)]
        texts = self.tokenizer.batch_decode(answers, skip_special_tokens=True)
        return torch.tensor([self.answer_format.answer_end(t) is not None for t in texts], device=input_ids.device)


class RowLimitCriteria:
    """A transformers stopping criterion: row ``i`` is done once it has ``limits[i]`` tokens after
    ``prompt_width`` (the per-prompt limits of :func:`generation_limits` within one batch)."""

    def __init__(self, limits: Sequence[int], prompt_width: int):
        self.limits, self.prompt_width = list(limits), prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        generated = input_ids.shape[1] - self.prompt_width
        return torch.tensor([generated >= n for n in self.limits], device=input_ids.device)


#: How a batch's prompts are processed before decoding (docs/performance.md#generation).
PREFILL_MODES = ("auto", "each", "padded")


def resolve_prefill(prefill: str, device) -> str:
    """The prefill mode a run uses: ``"auto"`` is ``"each"`` on CPU and ``"padded"`` on any other
    device (a ``torch.device`` or its name); other modes are returned as given.

    Raises:
        ValueError: an unknown mode.
    """
    if prefill not in PREFILL_MODES:
        raise ValueError(f"unknown prefill mode {prefill!r}: expected one of {', '.join(PREFILL_MODES)}")
    if prefill != "auto":
        return prefill
    return "each" if getattr(device, "type", str(device).split(":")[0]) == "cpu" else "padded"


def _plain_cache(model) -> bool:
    """True when the model's generation cache is one full-attention DynamicLayer per layer, so
    per-prompt caches can be left-padded and stacked into one batch cache."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    config = getattr(model, "config", None)
    if config is None:
        return False
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read: keep generate's own path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def common_prefix_length(prompts: Sequence[list[int]]) -> int:
    """The number of leading token ids all ``prompts`` share (0 for no prompts)."""
    if not prompts:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts)
    for ids in prompts[1:]:
        k = 0
        while k < n and ids[k] == first[k]:
            k += 1
        n = k
    return n


#: The shortest shared prompt prefix (tokens) :func:`generate_batches` prefills once for all
#: prompts; a shorter one is prefilled with each prompt (docs/performance.md#generation).
MIN_SHARED_PREFIX = 16


def prefix_cache(model, ids: Sequence[int]):
    """The key/value cache of ``ids`` run through ``model`` once (a ``DynamicCache``), for
    :func:`prefill_each`'s ``prefix``."""
    import torch

    head = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    return model(input_ids=head, attention_mask=torch.ones_like(head), use_cache=True, logits_to_keep=1).cache


def _head_cache(model, prefix, ids: Sequence[int]) -> list[tuple]:
    """Per layer ``(keys, values)`` of shape ``(kv_heads, len(ids), head_dim)``: ``ids`` run through
    ``model`` alone, after ``prefix`` (``(n, cache)`` of :func:`prefix_cache`, or None) on a copy of
    its cache when ``ids`` start with it and go on past it."""
    import torch
    from transformers.cache_utils import DynamicCache

    past, start = None, 0
    if prefix is not None and len(ids) > prefix[0]:
        start, past = prefix[0], DynamicCache(config=model.config)
        for i, layer in enumerate(prefix[1].layers):
            past.update(layer.keys, layer.values, i)
    head = torch.tensor([list(ids[start:])], dtype=torch.long, device=model.device)
    mask = torch.ones((1, len(ids)), dtype=torch.long, device=model.device)
    cache = model(input_ids=head, attention_mask=mask, cache=past, use_cache=True, logits_to_keep=1).cache
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def _stacked_cache(heads: Sequence[list[tuple] | None], width: int, max_new_tokens: int, config):
    """One ``StaticCache`` of ``width + max_new_tokens`` positions holding each row's head cache
    (:func:`_head_cache`; None: nothing, the row is all padding) right-aligned at ``width - 1``,
    zeros to its left."""
    from transformers.cache_utils import StaticCache

    cache = StaticCache(config=config, max_cache_len=width + max_new_tokens)
    first = next((h for h in heads if h is not None), None)
    if first is None:  # one-token prompts: generate fills the cache from the start
        return cache
    stacked = [tuple(t.new_zeros((len(heads), t.shape[0], width - 1, t.shape[2])) for t in layer) for layer in first]
    for row, head in enumerate(heads):
        if head is None:
            continue
        for (keys, values), (k, v) in zip(stacked, head):
            keys[row, :, width - 1 - k.shape[1]:] = k
            values[row, :, width - 1 - v.shape[1]:] = v
    for (keys, values), layer in zip(stacked, cache.layers):
        layer.update(keys, values)
    return cache


def prefill_each(model, prompts: Sequence[list[int]], width: int, max_new_tokens: int, prefix=None):
    """Run each prompt except its last token through ``model`` alone and write the key/value
    caches, left-padded with zeros to ``width - 1`` positions (``width``: the batch's longest
    prompt), into one ``StaticCache`` of ``width + max_new_tokens`` positions for ``generate``.
    ``prefix``: ``(n, cache)`` of :func:`prefix_cache` for the first ``n`` ids every prompt starts
    with; each prompt then runs only its ids after them.
    """
    heads = [_head_cache(model, prefix, ids[:-1]) if len(ids) > 1 else None for ids in prompts]
    return _stacked_cache(heads, width, max_new_tokens, model.config)


def _stopping(tokenizer, starts: int | list[int], left: list[int], steps: int, *, stop_after_api_call: bool,
              answer_format: str, width: int) -> list:
    """The stopping criteria of one ``generate`` call of ``steps`` new tokens after column ``width``:
    a complete answer after ``starts`` (with ``stop_after_api_call``), first; each row's own limit of
    ``left`` new tokens where one is below ``steps``."""
    criteria = []
    if stop_after_api_call:
        criteria.append(AnswerCompleteCriteria(tokenizer, starts, answer_format))
    if any(n < steps for n in left):
        criteria.append(RowLimitCriteria(left, width))
    return criteria


class _Row:
    """A prompt being answered by :func:`_decode_continuously`: its ``ids`` (prompt, then the
    tokens generated so far), where the answer starts, its token ``limit`` and the ``head`` cache
    of all its ids but the last (None until prefilled)."""

    def __init__(self, index: int, prompt: list[int], limit: int):
        self.index, self.ids, self.start, self.limit, self.head = index, list(prompt), len(prompt), limit, None

    @property
    def generated(self) -> int:
        """Tokens generated so far."""
        return len(self.ids) - self.start


def _decode_continuously(model, tokenizer, prompts: Sequence[list[int]], order: Sequence[int], limits: list[int], *,
                         batch_size: int, chunk: int, prefix, stop_after_api_call: bool, answer_format: str,
                         kwargs: dict) -> Iterator[list[tuple[int, list[int]]]]:
    """Greedy decoding of ``prompts`` (taken in ``order``) ``chunk`` new tokens per ``generate``
    call over at most ``batch_size`` rows: after each call the rows that are done (EOS, a complete
    answer, their limit) leave, the next prompts (prefilled alone) take their places and the rest
    continue from their own caches. Yields the rows done in each call as ``(prompt index, new
    token ids)``, the ids one ``generate`` call per row would give.
    """
    import collections

    from transformers import StoppingCriteriaList

    stops = set(kwargs["eos_token_id"])
    waiting = collections.deque(order)
    live: list[_Row] = []
    while live or waiting:
        while len(live) < batch_size and waiting:
            i = waiting.popleft()
            live.append(_Row(i, prompts[i], limits[i]))
        for row in live:
            if row.head is None and len(row.ids) > 1:
                row.head = _head_cache(model, prefix, row.ids[:-1])
        input_ids, attention = left_padded([r.ids for r in live], kwargs["pad_token_id"])
        width = input_ids.shape[1]
        steps = min(chunk, max(r.limit - r.generated for r in live))
        criteria = _stopping(tokenizer, [width - r.generated for r in live], [r.limit - r.generated for r in live],
                             steps, stop_after_api_call=stop_after_api_call, answer_format=answer_format, width=width)
        extra = {"stopping_criteria": StoppingCriteriaList(criteria)} if criteria else {}
        cache = _stacked_cache([r.head for r in live], width, steps, model.config)
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                             max_new_tokens=steps, cache=cache, **kwargs, **extra).cpu()
        complete = criteria[0](out, None).tolist() if stop_after_api_call else [False] * len(live)
        done, going = [], []
        for j, row in enumerate(live):
            new = out[j, width:].tolist()
            row.ids.extend(new)
            if len(new) < steps or stops.intersection(new) or complete[j] or row.generated >= row.limit:
                done.append((row.index, row.ids[row.start:]))
            else:  # its cache: all its ids but the last, which end where the call's cache ends
                end = width - 1 + len(new)
                row.head = [(layer.keys[j, :, end - len(row.ids) + 1:end],
                             layer.values[j, :, end - len(row.ids) + 1:end]) for layer in cache.layers]
                going.append(row)
        live = going
        if done:
            yield done


#: New tokens per ``generate`` call in :func:`generate_batches`' chunked decoding: between calls
#: finished rows leave and waiting prompts join (docs/performance.md#generation).
DECODE_CHUNK = 32


def generate_batches(model, tokenizer, prompts: Sequence[list[int]], *, batch_size: int = 8,
                     max_new_tokens: int = 256, stop_after_api_call: bool = False, prefill: str = "auto",
                     max_positions: int | None = None, answer_format: str = DEFAULT_ANSWER_FORMAT,
                     decode_chunk: int | None = DECODE_CHUNK, share_prefix: bool = True
                     ) -> Iterator[list[tuple[int, str]]]:
    """Generate answers, yielding finished ones in batches of ``[(prompt index, text), ...]``.

    ``prompts`` are token ids (:func:`ratune.sources.prompt.encode_prompt`); ``stop_after_api_call``
    cuts each answer where it is complete in ``answer_format``; ``prefill`` is one of
    :data:`PREFILL_MODES`; ``max_positions`` None: :func:`max_positions_of` ``model.config``. With
    ``prefill="each"``: ``decode_chunk`` new tokens per ``generate`` call over at most ``batch_size``
    rows, finished rows leaving and waiting prompts joining between calls, each batch yielded as
    its rows finish (None: one call per batch of ``batch_size`` prompts, yielded whole), and
    ``share_prefix`` prefills the ids all prompts start with once (at least
    :data:`MIN_SHARED_PREFIX`). Neither changes the answers.

    Raises:
        ValueError: an unknown ``prefill``; a ``decode_chunk`` below 1.
        RatuneError: a prompt that leaves no room for an answer (:func:`generation_limits`), before
            anything is generated; a tokenizer without EOS (:func:`stop_token_ids`).
    """
    import torch

    prefill = resolve_prefill(prefill, model.device)
    if decode_chunk is not None and decode_chunk < 1:
        raise ValueError(f"decode_chunk must be at least 1, got {decode_chunk}")
    model.eval()
    prefill_alone = prefill == "each" and batch_size > 1 and _plain_cache(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    if max_positions is None:
        max_positions = max_positions_of(getattr(model, "config", None))
    limits = generation_limits([len(p) for p in prompts], max_new_tokens=max_new_tokens, max_positions=max_positions)
    # a list of stop ids overrides every EOS id of the model folder's generation config
    kwargs = dict(do_sample=False, pad_token_id=pad_id, eos_token_id=stop_token_ids(tokenizer))
    prefix = None
    if prefill_alone and share_prefix and len(prompts) > 1:
        shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 2)
        if shared >= MIN_SHARED_PREFIX:
            with torch.inference_mode():
                prefix = (shared, prefix_cache(model, prompts[0][:shared]))
    if prefill_alone and decode_chunk is not None:
        rows = _decode_continuously(model, tokenizer, prompts, order, limits, batch_size=batch_size,
                                    chunk=decode_chunk, prefix=prefix, stop_after_api_call=stop_after_api_call,
                                    answer_format=answer_format, kwargs=kwargs)
        while True:
            with torch.inference_mode():
                done = next(rows, None)
            if done is None:
                return
            yield [(i, decode_answer(tokenizer, ids, stop_after_api_call=stop_after_api_call,
                                     answer_format=answer_format)) for i, ids in done]
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        input_ids, attention = left_padded([prompts[i] for i in idx], pad_id)
        width = input_ids.shape[1]
        kw = dict(kwargs)
        with torch.inference_mode():
            if prefill_alone and len(idx) > 1 and width > 1:
                kw["cache"] = prefill_each(model, [prompts[i] for i in idx], width, max(limits[i] for i in idx),
                                           prefix=prefix)
            new = _generate_once(model, tokenizer, input_ids, attention, [limits[i] for i in idx],
                                 stop_after_api_call=stop_after_api_call, answer_format=answer_format, kwargs=kw)
        yield [(i, decode_answer(tokenizer, ids, stop_after_api_call=stop_after_api_call, answer_format=answer_format))
               for i, ids in zip(idx, new)]


def _generate_once(model, tokenizer, input_ids, attention, limits: list[int], *, stop_after_api_call: bool,
                   answer_format: str, kwargs: dict) -> list[list[int]]:
    """One ``generate`` call over a left-padded batch (rows stop at EOS, a complete answer or their
    ``limits``); returns each row's new token ids."""
    from transformers import StoppingCriteriaList

    width, batch_new = input_ids.shape[1], max(limits)
    criteria = _stopping(tokenizer, width, limits, batch_new, stop_after_api_call=stop_after_api_call,
                         answer_format=answer_format, width=width)
    extra = {"stopping_criteria": StoppingCriteriaList(criteria)} if criteria else {}
    out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                         max_new_tokens=batch_new, **kwargs, **extra)
    return [row[width:].tolist() for row in out]


ProgressFn = Callable[[int], None]
