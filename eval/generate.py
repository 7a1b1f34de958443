"""Batched greedy generation for eval prompts (HF ``generate``).

Prompts are sorted by length (longest first) and batched with **left** padding, so every
sequence's last prompt token sits at the end of the batch and answers do not depend on batch
composition; decoding is greedy and stops at the tokenizer's EOS (:func:`stop_token_ids`, the
stop ids of the vLLM backend too). Both backends follow one length policy
(:func:`generation_limits`): prompt plus answer never exceed the model's positions
(``max_position_embeddings``), so a prompt near them gets fewer than ``max_new_tokens`` new tokens,
and one that fills them is an error.

With ``prefill="each"`` every prompt but its last token is first run through the model alone,
without padding, and the key/value caches are then left-padded into one batch cache from which
the batch decodes together. On CPU a padded batch prefill costs more than one prompt at a time
(padding to the longest prompt, attention over the padded width), while decoding gains
several-fold from batching (bench/eval_throughput.py measures both; docs/performance.md).
``prefill="padded"`` runs the prompts through ``generate`` as one padded batch. The default,
``"auto"``, is ``"each"`` on CPU and ``"padded"`` elsewhere, where a padded batch keeps an
accelerator busy (not measured here: no GPU). Models whose cache is not a plain full-attention
cache (sliding-window layers) always use ``"padded"``. When only scoring needs the answer,
``stop_after_api_call`` stops a sequence as soon as its answer is complete in its answer format
(sources/formats.py: an ``apibench`` answer's ``<<<api_provider>>>`` line, which comes after the
api_call line; a ``python_calls`` list's closing bracket), which saves most of the generation time;
a sequence that never completes one runs to ``max_new_tokens``, so its text is kept as generated.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, get_answer_format

def finish_answer(text: str, *, stop_after_api_call: bool, answer_format: str = DEFAULT_ANSWER_FORMAT) -> str:
    """The stored answer for decoded generated text: cut where the answer is complete when
    ``stop_after_api_call`` (:meth:`ratune.sources.formats.AnswerFormat.finish`), then stripped.

    Every backend (HF here, vLLM in :mod:`ratune.eval.vllm_backend`) passes its decoded text
    through this one function, so a backend that stops as soon as the answer is complete and one
    that runs on and is cut afterwards store the same answer.
    """
    return get_answer_format(answer_format).finish(text, stop=stop_after_api_call)


def stop_token_ids(tokenizer) -> list[int]:
    """The token ids that end an answer, the same for every backend (HF ``generate`` in
    :func:`generate_batches`, vLLM in :mod:`ratune.eval.vllm_backend`): the tokenizer's EOS alone,
    the token training appends to every answer (:func:`ratune.data.labels.tokenize_row`).

    Other end-of-sequence ids a model folder's ``generation_config.json`` may list (LLaMA-3
    Instruct lists three) are not stop ids here: HF is given this list explicitly (which
    overrides the folder's generation config) and vLLM is told to stop at exactly this list, so
    neither backend stops where the other goes on.

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
    """The new tokens each prompt may get: the length policy both backends follow.

    A sequence never runs past the model's positions: a prompt of ``n`` tokens gets
    ``min(max_new_tokens, max_positions - n)`` new tokens (its answer is cut there, as vLLM cuts at
    its ``max_model_len``; HF ``generate`` would go on past the trained positions). Without a
    known ``max_positions`` every prompt gets ``max_new_tokens``.

    Args:
        prompt_lengths: token count of each prompt.
        max_new_tokens: the generation limit.
        max_positions: :func:`max_positions_of` the model's config, or None.
        names: how errors name each prompt (default ``prompt {index}``).
    Returns:
        One limit per prompt, each at least 1.
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


#: How a batch's prompts are processed before decoding (see the module docstring).
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
    caches, left-padded with zeros to ``width - 1`` positions, into one batch cache.

    Args:
        model: a causal LM with a full-attention cache (see :func:`_plain_cache`).
        prompts: the batch's prompt ids (each at least 1 token, at most ``width``).
        width: the batch's padded prompt width (its longest prompt).
        max_new_tokens: the generation limit; sizes the cache.
    Returns:
        A ``StaticCache`` of ``width + max_new_tokens`` positions per layer, shape ``(batch,
        kv_heads, width + max_new_tokens, head_dim)``, filled up to position ``width - 1``. It is
        written in place at each decoding step (a ``DynamicCache`` copies itself with
        ``torch.cat`` at every step: about 30 % of a batch-8 step on CPU). Passed to ``generate``
        with the left-padded prompts and their attention mask, only the last prompt column is
        run as a batch; the padded positions are masked out, and the position ids ``generate``
        derives from the mask equal each prompt's own.
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

    Args:
        model: a causal LM (eval mode is set here).
        tokenizer: its tokenizer (pad token set; padding side is forced to left here).
        prompts: token ids per prompt (from :func:`ratune.sources.prompt.encode_prompt`).
        batch_size: prompts per ``generate`` call.
        max_new_tokens: the generation limit per answer; a prompt near the model's positions gets
            fewer (:func:`generation_limits`).
        stop_after_api_call: stop once the answer is complete (the api_provider line of an
            ``apibench`` answer, the closing bracket of ``python_calls``); cut the text there.
        prefill: ``"each"`` (every prompt alone, then the batch decodes together), ``"padded"``
            (one padded batch) or ``"auto"`` (``"each"`` on CPU); see the module docstring.
            Batches of one prompt and models without a plain full-attention cache use
            ``generate`` directly either way.
        max_positions: the model's positions (prompt + answer); None: :func:`max_positions_of`
            ``model.config``.
        answer_format: a name in :data:`ratune.sources.formats.ANSWER_FORMATS`.
    Yields:
        Lists of ``(index into prompts, generated text without special tokens)``. Decoding stops
        at :func:`stop_token_ids`.
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


def generate_all(model, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers, in prompt order (see :func:`generate_batches` for the arguments)."""
    texts = [""] * len(prompts)
    for batch in generate_batches(model, tokenizer, prompts, **kwargs):
        for i, text in batch:
            texts[i] = text
    return texts


ProgressFn = Callable[[int], None]
