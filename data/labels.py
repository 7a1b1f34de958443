"""Where labels are made: prompt/completion token ids (answer + EOS) and the completion-only loss
mask, built by position, never by searching for marker tokens (docs/prompts.md#bos-and-eos)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from ratune.errors import RatuneError
from ratune.sources.prompt import encode_prompt, prompt_text, template_of


#: How an answer is tokenized behind its prompt (``ratune data build --answer-tokenization``;
#: docs/prompts.md): in context (as FastChat) or ``separate`` (TRL's way).
ANSWER_TOKENIZATIONS = ("in_context", "separate")


def built_answer_tokenization(settings: dict) -> str:
    """The answer tokenization a data build's manifest ``settings`` record (the default when none)."""
    return settings.get("answer_tokenization", ANSWER_TOKENIZATIONS[0])


class NoTrainableTokens(ValueError):
    """A row whose completion would carry no loss (empty answer or no room for it)."""


class AnswerMerge(RatuneError):
    """The tokenizer merges the answer's first token with the prompt's last one: no position-exact
    loss mask exists."""


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
    return list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + [_eos_id(tokenizer)]


def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token: the model could never learn to stop")
    return tokenizer.eos_token_id


def answer_ids_in_context(tokenizer, user_turn: str, text: str, system: str | None = None,
                          tools=None) -> list[int]:
    """The tokens of ``text`` (no EOS) as they come after the prompt: the tail of the prompt text +
    ``text`` tokenized together, behind the prompt text's own tokens.

    Raises:
        AnswerMerge: when the prompt's tokens are not a prefix of the joined text's (a merge across
            the boundary; LLaMA's vocabulary has none across a space).
    """
    head_text = prompt_text(tokenizer, user_turn, system, tools)
    head = tokenizer(head_text, add_special_tokens=False)["input_ids"]
    full = tokenizer(head_text + text, add_special_tokens=False)["input_ids"]
    if full[:len(head)] != head:
        at = next((i for i, (a, b) in enumerate(zip(head, full)) if a != b), min(len(head), len(full)) - 1)
        template = template_of(tokenizer)
        name = template.name if template else "(the tokenizer's own)"
        raise AnswerMerge(
            f"chat template {name}, tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}: the answer's first token merges "
            f"with the prompt's last one into {tokenizer.convert_ids_to_tokens(full[at])!r}, so no loss mask is "
            "exact by position; build with --answer-tokenization separate (prompt and answer tokenized apart, "
            "ids concatenated, as TRL does), or use a chat template whose answer starts a token of its own "
            "(e.g. chatml)")
    return list(full[len(head):])


def tokenize_row(tokenizer, user_turn: str, completion: str, *, system: str | None = None, tools=None,
                 answer_tokenization: str = ANSWER_TOKENIZATIONS[0]) -> TokenizedRow:
    """Tokenize a (user turn, answer) pair (behind ``system``; ``tools`` for the chat template) into
    ids and the completion-only loss mask.

    Raises:
        NoTrainableTokens: when ``completion`` is empty (the row would train only on EOS).
        AnswerMerge: ``in_context`` with a tokenizer whose merges cross the prompt/answer boundary.
    """
    if not completion.strip():
        raise NoTrainableTokens("the answer is empty: nothing to learn")
    prompt = encode_prompt(tokenizer, user_turn, system, tools)
    template = template_of(tokenizer)
    if answer_tokenization == "separate":
        answer = completion_ids(tokenizer, (template.answer_prefix if template is not None else "") + completion)
    elif template is not None and template.answer_prefix:
        answer = (answer_ids_in_context(tokenizer, user_turn, template.answer_prefix + completion, system, tools)
                  + [_eos_id(tokenizer)])
    else:
        answer = completion_ids(tokenizer, completion)
    return TokenizedRow(input_ids=prompt + answer, completion_mask=[0] * len(prompt) + [1] * len(answer))


def tokenize_built_row(tokenizer, row: Mapping, *, answer_tokenization: str = ANSWER_TOKENIZATIONS[0]) -> TokenizedRow:
    """:func:`tokenize_row` of a row ``ratune data build`` wrote."""
    tools = row.get("tools")
    return tokenize_row(tokenizer, row["user_turn"], row["completion"], system=row.get("system"),
                        tools=None if tools is None else json.loads(tools), answer_tokenization=answer_tokenization)
