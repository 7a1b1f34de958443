"""Batched greedy generation for eval prompts (HF ``generate``), with the stop ids, length limits
and answer cut the vLLM backend shares. Batching and prefill modes: docs/performance.md#generation;
stop ids and length policy: docs/pipeline.md#eval.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

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
    answer complete (:meth:`ratune.sources.formats.AnswerFormat.answer_end`) in the tokens
    generated after ``prompt_width``."""

    def __init__(self, tokenizer, prompt_width: int, answer_format: str = DEFAULT_ANSWER_FORMAT):
        self.tokenizer, self.prompt_width = tokenizer, prompt_width
        self.answer_format = get_answer_format(answer_format)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
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


def prefill_each(model, prompts: Sequence[list[int]], width: int, max_new_tokens: int):
    """Run each prompt except its last token through ``model`` alone and write the key/value
    caches, left-padded with zeros to ``width - 1`` positions (``width``: the batch's longest
    prompt), into one ``StaticCache`` of ``width + max_new_tokens`` positions for ``generate``.
    """
    import torch
    from transformers.cache_utils import StaticCache

    device = model.device
    stacked = None  # per layer: (keys, values), shape (batch, kv_heads, width - 1, head_dim), zeros = padding
    for row, ids in enumerate(prompts):
        if len(ids) < 2:
            continue  # nothing before the last token: the row stays padding
        head = torch.tensor([ids[:-1]], dtype=torch.long, device=device)
        out = model(input_ids=head, attention_mask=torch.ones_like(head), use_cache=True, logits_to_keep=1)
        if stacked is None:
            stacked = [tuple(t.new_zeros((len(prompts), t.shape[1], width - 1, t.shape[3]))
                             for t in (layer.keys, layer.values)) for layer in out.cache.layers]
        for (keys, values), layer in zip(stacked, out.cache.layers):
            keys[row, :, width - len(ids):] = layer.keys[0]
            values[row, :, width - len(ids):] = layer.values[0]
    cache = StaticCache(config=model.config, max_cache_len=width + max_new_tokens)
    for (keys, values), layer in zip(stacked, cache.layers):
        layer.update(keys, values)
    return cache


def generate_batches(model, tokenizer, prompts: Sequence[list[int]], *, batch_size: int = 8,
                     max_new_tokens: int = 256, stop_after_api_call: bool = False, prefill: str = "auto",
                     max_positions: int | None = None, answer_format: str = DEFAULT_ANSWER_FORMAT
                     ) -> Iterator[list[tuple[int, str]]]:
    """Generate answers, yielding each finished batch as ``[(prompt index, text), ...]``.

    ``prompts`` are token ids (:func:`ratune.sources.prompt.encode_prompt`); ``stop_after_api_call``
    cuts each answer where it is complete in ``answer_format``; ``prefill`` is one of
    :data:`PREFILL_MODES`; ``max_positions`` None: :func:`max_positions_of` ``model.config``.

    Raises:
        ValueError: an unknown ``prefill``.
        RatuneError: a prompt that leaves no room for an answer (:func:`generation_limits`), before
            anything is generated; a tokenizer without EOS (:func:`stop_token_ids`).
    """
    import torch

    prefill = resolve_prefill(prefill, model.device)
    model.eval()
    prefill_alone = prefill == "each" and batch_size > 1 and _plain_cache(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    if max_positions is None:
        max_positions = max_positions_of(getattr(model, "config", None))
    limits = generation_limits([len(p) for p in prompts], max_new_tokens=max_new_tokens, max_positions=max_positions)
    # a list of stop ids overrides every EOS id of the model folder's generation config
    kwargs = dict(do_sample=False, pad_token_id=pad_id, eos_token_id=stop_token_ids(tokenizer))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = prompts[i]
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        extra, criteria = {}, []
        batch_new = max(limits[i] for i in idx)  # rows with a lower limit stop at it (RowLimitCriteria)
        if stop_after_api_call:
            criteria.append(AnswerCompleteCriteria(tokenizer, width, answer_format))
        if any(limits[i] < batch_new for i in idx):
            criteria.append(RowLimitCriteria([limits[i] for i in idx], width))
        if criteria:
            from transformers import StoppingCriteriaList

            extra["stopping_criteria"] = StoppingCriteriaList(criteria)
        with torch.inference_mode():
            if prefill_alone and len(idx) > 1 and width > 1:
                extra["cache"] = prefill_each(model, [prompts[i] for i in idx], width, batch_new)
            out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                                 max_new_tokens=batch_new, **kwargs, **extra)
        batch = []
        for row, i in enumerate(idx):
            batch.append((i, decode_answer(tokenizer, out[row, width:].tolist(),
                                           stop_after_api_call=stop_after_api_call, answer_format=answer_format)))
        yield batch


ProgressFn = Callable[[int], None]
