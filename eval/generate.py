"""Batched greedy generation for eval prompts (HF ``generate``).

Prompts are sorted by length (longest first) and batched with **left** padding, so every
sequence's last prompt token sits at the end of the batch and answers do not depend on batch
composition; decoding is greedy and stops at EOS.

With ``prefill="each"`` every prompt but its last token is first run through the model alone,
without padding, and the key/value caches are then left-padded into one batch cache from which
the batch decodes together. On CPU a padded batch prefill costs more than one prompt at a time
(padding to the longest prompt, attention over the padded width), while decoding gains
several-fold from batching (bench/eval_throughput.py measures both; docs/performance.md).
``prefill="padded"`` runs the prompts through ``generate`` as one padded batch. The default,
``"auto"``, is ``"each"`` on CPU and ``"padded"`` elsewhere, where a padded batch keeps an
accelerator busy (not measured here: no GPU). Models whose cache is not a plain full-attention
cache (sliding-window layers) always use ``"padded"``. When only scoring needs the answer,
``stop_after_api_call`` stops a sequence as soon as its ``<<<api_provider>>>`` line is complete
(the api_call line comes before it), which saves most of the generation time; a sequence that
never writes that field runs to ``max_new_tokens``, so its text is kept as generated.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

#: When only scoring needs the answer, a sequence is done once this field's line is complete: the
#: answer format puts domain, api_call, api_provider first (data/prompt.py), so by then the
#: api_call and api_provider fields are complete.
LAST_NEEDED_FIELD = "<<<api_provider>>>:"


def needed_fields_end(text: str) -> int | None:
    """End offset of the api_provider line in generated text (None while it is incomplete).

    The line is complete at its newline or when a later marker (``<<<``) starts on it.
    """
    start = text.find(LAST_NEEDED_FIELD)
    if start < 0:
        return None
    rest = start + len(LAST_NEEDED_FIELD)
    ends = [i for i in (text.find("\n", rest), text.find("<<<", rest)) if i >= 0]
    return min(ends) if ends else None


def finish_answer(text: str, *, stop_after_api_call: bool) -> str:
    """The stored answer for decoded generated text: cut after the api_provider line when
    ``stop_after_api_call`` (and the line is complete), then stripped.

    Every backend (HF here, vLLM in :mod:`ratune.eval.vllm_backend`) passes its decoded text
    through this one function. A backend that stops generating as soon as the line is complete
    and one that runs on and is cut afterwards store the same answer: the cut is at the first
    line end after the api_provider marker, which is the same offset in any continuation.
    """
    end = needed_fields_end(text) if stop_after_api_call else None
    if end is not None:
        text = text[:end]
    return text.strip()


def decode_answer(tokenizer, new_token_ids, *, stop_after_api_call: bool) -> str:
    """Decode a sequence's generated ids (after the prompt; EOS and padding are special tokens
    and skipped) and apply :func:`finish_answer`."""
    text = tokenizer.decode(list(int(t) for t in new_token_ids), skip_special_tokens=True)
    return finish_answer(text, stop_after_api_call=stop_after_api_call)


class FieldsCompleteCriteria:
    """A transformers stopping criterion: per sequence, True once :func:`needed_fields_end` finds
    the api_provider line complete in the tokens generated after ``prompt_width``."""

    def __init__(self, tokenizer, prompt_width: int):
        self.tokenizer, self.prompt_width = tokenizer, prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
        return torch.tensor([needed_fields_end(t) is not None for t in texts], device=input_ids.device)


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
                     max_new_tokens: int = 256, stop_after_api_call: bool = False, prefill: str = "auto"
                     ) -> Iterator[list[tuple[int, str]]]:
    """Generate answers, yielding each finished batch as ``[(prompt index, text), ...]``.

    Args:
        model: a causal LM (eval mode is set here).
        tokenizer: its tokenizer (pad token set; padding side is forced to left here).
        prompts: token ids per prompt (from :func:`ratune.data.prompt.encode_prompt`).
        batch_size: prompts per ``generate`` call.
        max_new_tokens: the generation limit per answer.
        stop_after_api_call: stop once the api_provider line is complete; cut the text there.
        prefill: ``"each"`` (every prompt alone, then the batch decodes together), ``"padded"``
            (one padded batch) or ``"auto"`` (``"each"`` on CPU); see the module docstring.
            Batches of one prompt and models without a plain full-attention cache use
            ``generate`` directly either way.
    Yields:
        Lists of ``(index into prompts, generated text without special tokens)``.
    Raises:
        ValueError: an unknown ``prefill``.
    """
    import torch

    prefill = resolve_prefill(prefill, model.device)
    model.eval()
    prefill_alone = prefill == "each" and batch_size > 1 and _plain_cache(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                  eos_token_id=tokenizer.eos_token_id)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = prompts[i]
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        extra = {}
        if stop_after_api_call:
            from transformers import StoppingCriteriaList

            extra["stopping_criteria"] = StoppingCriteriaList([FieldsCompleteCriteria(tokenizer, width)])
        with torch.inference_mode():
            if prefill_alone and len(idx) > 1 and width > 1:
                extra["cache"] = prefill_each(model, [prompts[i] for i in idx], width, max_new_tokens)
            out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                                 **kwargs, **extra)
        batch = []
        for row, i in enumerate(idx):
            batch.append((i, decode_answer(tokenizer, out[row, width:].tolist(),
                                           stop_after_api_call=stop_after_api_call)))
        yield batch


def generate_all(model, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers, in prompt order (see :func:`generate_batches` for the arguments)."""
    texts = [""] * len(prompts)
    for batch in generate_batches(model, tokenizer, prompts, **kwargs):
        for i, text in batch:
            texts[i] = text
    return texts


ProgressFn = Callable[[int], None]
