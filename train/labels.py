"""Where labels are made: prompt/completion token ids and the completion-only loss mask.

A training row is ``prompt_ids + completion_ids`` where ``prompt_ids`` come from
:func:`ratune.data.prompt.encode_prompt` and ``completion_ids`` are the answer text's tokens
followed by the EOS id. The loss mask is 0 on the prompt and 1 on the completion, built by
position (never by searching for marker tokens, which tokenize differently in context), so the
tokens that carry loss decode exactly to the answer followed by EOS, also when pad == EOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratune.data.prompt import encode_prompt


class NoTrainableTokens(ValueError):
    """A row whose completion would carry no loss (empty answer or no room for it)."""


@dataclass(frozen=True)
class TokenizedRow:
    """One training row. ``input_ids`` and ``completion_mask`` have the same length."""

    input_ids: list[int]
    completion_mask: list[int]

    @property
    def n_prompt_tokens(self) -> int:
        return self.completion_mask.count(0)

    @property
    def n_completion_tokens(self) -> int:
        return self.completion_mask.count(1)


def completion_ids(tokenizer, completion: str) -> list[int]:
    """The answer's tokens (no special tokens) followed by the tokenizer's EOS id."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token: the model could never learn to stop")
    return list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def tokenize_row(tokenizer, user_turn: str, completion: str) -> TokenizedRow:
    """Tokenize a (user turn, answer) pair into ids and the completion-only loss mask.

    Raises:
        NoTrainableTokens: when ``completion`` is empty (the row would train only on EOS).
    """
    if not completion.strip():
        raise NoTrainableTokens("the answer is empty: nothing to learn")
    prompt = encode_prompt(tokenizer, user_turn)
    answer = completion_ids(tokenizer, completion)
    return TokenizedRow(input_ids=prompt + answer, completion_mask=[0] * len(prompt) + [1] * len(answer))
