"""Batched greedy generation for eval prompts (HF ``generate``).

Prompts are sorted by length (longest first) and batched with **left** padding, so every
sequence's last prompt token sits at the end of the batch and answers do not depend on batch
composition; decoding is greedy and stops at EOS. When only scoring needs the answer,
``stop_after_api_call`` stops a sequence as soon as the ``<<<api_call>>>`` and
``<<<api_provider>>>`` fields are complete (the next marker, ``<<<explanation>>>``, appears),
which saves most of the generation time.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

#: Generation stops here when only the api_call and api_provider fields are needed.
STOP_MARKER = "<<<explanation>>>"


def generate_batches(model, tokenizer, prompts: Sequence[list[int]], *, batch_size: int = 8,
                     max_new_tokens: int = 256, stop_after_api_call: bool = False
                     ) -> Iterator[list[tuple[int, str]]]:
    """Generate answers, yielding each finished batch as ``[(prompt index, text), ...]``.

    Args:
        model: a causal LM (eval mode is set here).
        tokenizer: its tokenizer (pad token set; padding side is forced to left here).
        prompts: token ids per prompt (from :func:`ratune.data.prompt.encode_prompt`).
        batch_size: prompts per ``generate`` call.
        max_new_tokens: the generation limit per answer.
        stop_after_api_call: stop at :data:`STOP_MARKER` and cut the text there.
    Yields:
        Lists of ``(index into prompts, generated text without special tokens)``.
    """
    import torch

    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                  eos_token_id=tokenizer.eos_token_id)
    if stop_after_api_call:
        kwargs.update(stop_strings=[STOP_MARKER], tokenizer=tokenizer)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids = prompts[i]
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        batch = []
        for row, i in enumerate(idx):
            text = tokenizer.decode(out[row, width:], skip_special_tokens=True)
            if stop_after_api_call and STOP_MARKER in text:
                text = text[:text.index(STOP_MARKER)]
            batch.append((i, text.strip()))
        yield batch


def generate_all(model, tokenizer, prompts: Sequence[list[int]], **kwargs) -> list[str]:
    """All answers, in prompt order (see :func:`generate_batches` for the arguments)."""
    texts = [""] * len(prompts)
    for batch in generate_batches(model, tokenizer, prompts, **kwargs):
        for i, text in batch:
            texts[i] = text
    return texts


ProgressFn = Callable[[int], None]
