"""The prompt format: the one owner of how a RAT chat looks, at train time and at test time.

User turn (Gorilla, section 3.2, "retriever-aware training")::

    <instruction>
    Use this API documentation for reference: <document>

where the second line is present only when a document is given and ``<document>`` is the API
document serialized by :func:`serialize_document`. Assistant turn: :func:`format_answer`, five
marker lines ``<<<domain>>>: ...`` to ``<<<code>>>: ...`` (each marker followed by a colon and a
space). A request that none of the given documents can answer is answered with
:func:`abstain_answer` (api_call :data:`ABSTAIN_API_CALL`). The training-set builder (:mod:`ratune.data.build`) and the evaluator
(:mod:`ratune.eval.generate`) both call :func:`render_user_turn`, so the two cannot drift.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from ratune.data.apibench import ANSWER_FIELDS, Answer

#: The exact phrase that introduces the retrieved document (Gorilla, section 3.2).
REFERENCE_PHRASE = "Use this API documentation for reference: "

#: Markers of the canonical answer text, in order (Gorilla, Figure 3 and the released eval files).
ANSWER_MARKERS = tuple(f"<<<{name}>>>: " for name in ANSWER_FIELDS)

#: Chat template for tokenizers that have none (base LLaMA checkpoints): ChatML, without a
#: default system turn. Chosen by ``chat_template: chatml`` in a training config.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Document fields dropped first when a document must be shortened to fit the token budget, in
#: this order (least useful for choosing the call first). Our design, not the paper's.
SHORTENING_ORDER = ("example_code", "python_environment_requirements", "performance", "api_arguments",
                    "description")

#: Fields never dropped: they name the API and what it does.
KEPT_FIELDS = ("domain", "framework", "functionality", "api_name", "api_call")


def serialize_document(doc: dict) -> str:
    """Serialize one API document: compact JSON in the database's own key order, UTF-8 kept.

    This is the only document serialization in ratune (training prompts, eval prompts, indexes).
    """
    return json.dumps(doc, ensure_ascii=False)


def serialize_documents(docs: Sequence[dict]) -> str:
    """Serialize several documents (top_k > 1): each on its own line, in rank order."""
    return "\n".join(serialize_document(d) for d in docs)


def build_user_turn(instruction: str, document: str | None) -> str:
    """The user turn: the instruction, plus the reference phrase and the document when given."""
    if document is None:
        return instruction
    return f"{instruction}\n{REFERENCE_PHRASE}{document}"


#: The api_call of an abstention: the answer a model gives when no given document fits the
#: request (issue 9; BFCL's irrelevance category). Our design, not the paper's.
ABSTAIN_API_CALL = "NO_API_FITS"


def abstain_answer(answer: Answer) -> Answer:
    """The abstention for a request whose documents cannot answer it: the five fields, with
    :data:`ABSTAIN_API_CALL` as the call, ``none`` as domain and provider, a fixed explanation and
    no code (``answer`` is the request's real answer; only its type is used)."""
    return Answer(domain="none", api_call=ABSTAIN_API_CALL, api_provider="none",
                  explanation="None of the given API documentation fits this request.", code="")


def is_abstention(api_call: str | None) -> bool:
    """Whether an api_call field's value is the abstention (whitespace and case ignored)."""
    return api_call is not None and api_call.strip().upper() == ABSTAIN_API_CALL


def answer_field(text, name: str) -> str | None:
    """The value of the first ``<<<name>>>:`` line of a generated answer (to the end of that
    line, stripped), or None when the text has no such marker or is not a string."""
    if not isinstance(text, str):
        return None
    marker = f"<<<{name}>>>:"
    start = text.find(marker)
    if start < 0:
        return None
    return text[start + len(marker):].split("\n", 1)[0].strip()


def format_answer(answer: Answer) -> str:
    """The assistant turn for an answer: one marker line per field, in ANSWER_FIELDS order."""
    return "\n".join(f"{marker}{getattr(answer, name)}" for marker, name in zip(ANSWER_MARKERS, ANSWER_FIELDS))


def shorten_document(doc: dict, max_tokens: int | None, count_tokens: Callable[[str], int]
                     ) -> tuple[str, bool]:
    """Serialize ``doc`` within ``max_tokens`` tokens, dropping fields in SHORTENING_ORDER.

    When dropping every optional field is not enough, the serialized text is cut to the budget
    at a token boundary (the KEPT_FIELDS come first in the JSON, so the call survives).

    Args:
        doc: an API document.
        max_tokens: the budget in tokens of the serialized text; None means no limit.
        count_tokens: the tokenizer's length function for a text (no special tokens).
    Returns:
        ``(text, shortened)``: the serialized document and whether anything was removed.
    """
    text = serialize_document(doc)
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    reduced = dict(doc)
    for key in SHORTENING_ORDER:
        if key in reduced:
            del reduced[key]
            text = serialize_document(reduced)
            if count_tokens(text) <= max_tokens:
                return text, True
    # Still too long: cut characters until it fits (binary search on the character length).
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo], True


def render_user_turn(instruction: str, docs: Sequence[dict] | None, *, max_document_tokens: int | None,
                     count_tokens: Callable[[str], int]) -> tuple[str, bool]:
    """Build the user turn for an instruction and its retrieved documents (None or [] = no doc).

    Each document is shortened to ``max_document_tokens`` by :func:`shorten_document`.

    Returns:
        ``(user_turn, shortened)``.
    """
    if not docs:
        return build_user_turn(instruction, None), False
    parts, shortened = [], False
    for doc in docs:
        text, cut = shorten_document(doc, max_document_tokens, count_tokens)
        parts.append(text)
        shortened |= cut
    return build_user_turn(instruction, "\n".join(parts)), shortened


def chat_messages(user_turn: str) -> list[dict]:
    """The single-turn chat for generation: ``[{"role": "user", "content": user_turn}]``."""
    return [{"role": "user", "content": user_turn}]


def encode_prompt(tokenizer, user_turn: str) -> list[int]:
    """Token ids of the prompt: the tokenizer's chat template applied to the single user turn,
    with the generation prompt (the assistant header) appended.

    Used by training (labels start right after these ids) and by generation (the model continues
    from them), so the model sees identical prompt tokens at train and test time.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: ratune trains and evaluates single-turn chats")
    ids = tokenizer.apply_chat_template(chat_messages(user_turn), add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids)
