"""Batched greedy generation for eval prompts (HF ``generate``).

Prompts are sorted by length (longest first) and batched with **left** padding, so every
sequence's last prompt token sits at the end of the batch and answers do not depend on batch
composition; decoding is greedy and stops at EOS. When only scoring needs the answer,
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
        stop_after_api_call: stop once the api_provider line is complete; cut the text there.
    Yields:
        Lists of ``(index into prompts, generated text without special tokens)``.
    """
    import torch

    model.eval()
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
            out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs, **extra)
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
