"""The prompt format: the one owner of how a RAT chat looks, at train time and at test time
(Gorilla, section 3.2; docs/prompts.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from ratune.sources.apibench import ANSWER_FIELDS, Answer
from ratune.errors import RatuneError
from ratune.registry import unknown_name

#: The exact phrase that introduces the retrieved document (Gorilla, section 3.2).
REFERENCE_PHRASE = "Use this API documentation for reference: "

#: Markers of the canonical answer text, in order (Gorilla, Figure 3 and the released eval files).
ANSWER_MARKERS = tuple(f"<<<{name}>>>: " for name in ANSWER_FIELDS)

#: ChatML, without a default system turn, for tokenizers that have no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: The system text of Gorilla's FastChat conversation ``gorilla_v0`` (Gorilla repository,
#: inference/serve/conv_template.py).
GORILLA_V0_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                     "helpful, detailed, and polite answers to the user's questions.")

#: Gorilla's FastChat template ``gorilla_v0`` (docs/prompts.md). Every newline is written inside an
#: expression (the HF Jinja environment trims the one after a block tag).
GORILLA_V0_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set system = messages[0]['content'] -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = \"" + GORILLA_V0_SYSTEM + "\" -%}{%- set turns = messages -%}{%- endif -%}"
    "{{ system + '\\n' }}"
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'user' -%}{{ 'USER: ' + message['content'] + '\\n' }}"
    "{%- else -%}{{ 'ASSISTANT: ' + message['content'] + (eos_token or '') }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}"
)


#: ChatML with tools, for tokenizers whose own template ignores ``tools=``; answers as Qwen2.5's
#: template writes them (Hermes' function-calling format; docs/function_calling.md).
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.get('content') -%}{{- '\\n' + message['content'] -}}{%- endif -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call.get('function') else call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' + (fn['arguments'] | tojson)"
    " + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] != 'system' -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: How :data:`CHATML_TOOLS_TEMPLATE`'s answers are read back (``transformers.utils.chat_parsing``).
CHATML_TOOLS_RESPONSE = {
    "start_anchor": "<|im_start|>assistant\n",
    "defaults": {"role": "assistant"},
    "fields": {
        "content": {},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True,
                       "transform": {"type": "function", "function": "{content}"}},
    },
}


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template ratune can give a tokenizer: its ``jinja`` text, the ``answer_prefix`` between
    prompt and answer in a training row (gorilla_v0: one space), a ``summary`` line and the
    transformers ``response_template`` that reads answers back (or None)."""

    name: str
    jinja: str
    answer_prefix: str
    summary: str
    response_template: dict | None = None


#: The one registry of template names (docs/prompts.md).
CHAT_TEMPLATES: dict[str, ChatTemplate] = {t.name: t for t in (
    ChatTemplate("chatml", CHATML_TEMPLATE, "", "ChatML, no system turn: <|im_start|>user ... <|im_start|>assistant"),
    ChatTemplate("gorilla_v0", GORILLA_V0_TEMPLATE, " ",
                 "the paper's FastChat format: {system}\\nUSER: ...\\nASSISTANT: {answer}</s>"),
    ChatTemplate("chatml_tools", CHATML_TOOLS_TEMPLATE, "",
                 "ChatML with a tool list and <tool_call> answers (Qwen2.5's layout), for the tool_calls answer format",
                 response_template=CHATML_TOOLS_RESPONSE),
)}
#: The template names, in registry order.
CHAT_TEMPLATE_NAMES = tuple(CHAT_TEMPLATES)

#: Document fields dropped, in this order, to fit the token budget. Our design, not the paper's.
SHORTENING_ORDER = ("example_code", "python_environment_requirements", "performance", "api_arguments",
                    "description")

#: Fields never dropped: they name the API and what it does.
KEPT_FIELDS = ("domain", "framework", "functionality", "api_name", "api_call")


def serialize_document(doc: dict) -> str:
    """Serialize one API document: compact JSON in the database's own key order, UTF-8 kept
    (ratune's only document serialization)."""
    return json.dumps(doc, ensure_ascii=False)


def join_documents(texts: Sequence[str]) -> str:
    """Several serialized documents as a prompt's one document text, one per line in rank order."""
    return "\n".join(texts)


def build_user_turn(instruction: str, document: str | None) -> str:
    """The user turn: the instruction, plus the reference phrase and the document when given."""
    if document is None:
        return instruction
    return f"{instruction}\n{REFERENCE_PHRASE}{document}"


#: The api_call of an abstention (no given document fits the request). Our design, not the paper's.
ABSTAIN_API_CALL = "NO_API_FITS"


def abstain_answer(answer: Answer) -> Answer:
    """The abstention answer (:data:`ABSTAIN_API_CALL`) of ``answer``'s type."""
    return Answer(domain="none", api_call=ABSTAIN_API_CALL, api_provider="none",
                  explanation="None of the given API documentation fits this request.", code="")


def is_abstention(api_call: str | None) -> bool:
    """Whether an api_call field's value is the abstention (whitespace and case ignored)."""
    return api_call is not None and api_call.strip().upper() == ABSTAIN_API_CALL


def answer_field(text, name: str) -> str | None:
    """The stripped value of the first ``<<<name>>>:`` line of a generated answer, or None."""
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
    """``(text, shortened)``: ``doc`` serialized within ``max_tokens`` tokens (None: no limit) of
    ``count_tokens``, dropping fields in SHORTENING_ORDER, then cutting the text (KEPT_FIELDS first)."""
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
    # still too long: binary search on the character length
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
    """``(user_turn, shortened)`` for an instruction and its documents (None or []: none), each
    shortened to ``max_document_tokens``."""
    if not docs:
        return build_user_turn(instruction, None), False
    parts, shortened = [], False
    for doc in docs:
        text, cut = shorten_document(doc, max_document_tokens, count_tokens)
        parts.append(text)
        shortened |= cut
    return build_user_turn(instruction, join_documents(parts)), shortened


def chat_messages(user_turn: str, system: str | None = None) -> list[dict]:
    """The single-turn chat for generation, behind a ``system`` turn when given."""
    head = [] if system is None else [{"role": "system", "content": system}]
    return head + [{"role": "user", "content": user_turn}]


def use_chat_template(tokenizer, name: str | None):
    """Give ``tokenizer`` the registry template ``name`` (replacing its own; None keeps it) and return it.

    Raises:
        RatuneError: an unknown template name.
    """
    if name is None:
        return tokenizer
    if name not in CHAT_TEMPLATES:
        raise RatuneError(unknown_name("chat template", name, CHAT_TEMPLATE_NAMES))
    tokenizer.chat_template = CHAT_TEMPLATES[name].jinja
    if CHAT_TEMPLATES[name].response_template is not None:  # saved with the tokenizer, read by parse_response
        tokenizer.response_template = CHAT_TEMPLATES[name].response_template
    return tokenizer


def template_of(tokenizer) -> ChatTemplate | None:
    """The registry template the tokenizer carries (by its ``chat_template`` text), or None."""
    text = getattr(tokenizer, "chat_template", None)
    return next((t for t in CHAT_TEMPLATES.values() if t.jinja == text), None) if text else None


def template_name(tokenizer) -> str | None:
    """The name of :func:`template_of` (None: the tokenizer's own template, or none)."""
    template = template_of(tokenizer)
    return template.name if template is not None else None


def require_chat_template(tokenizer, *, source: str, hint: str) -> None:
    """Refuse a tokenizer without a chat template, naming ``source`` and the ``hint``.

    Raises:
        RatuneError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise RatuneError(f"{source}: the tokenizer has no chat template (a base model such as LLaMA-1); {hint} "
                          f"({' or '.join(CHAT_TEMPLATE_NAMES)}; gorilla_v0 is the paper's format, docs/prompts.md)")


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts its BOS token in front of plain text (LLaMA: ``<s>``, id 1)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos]


def with_bos(tokenizer, ids: Sequence[int]) -> list[int]:
    """``ids`` starting with exactly one BOS when the tokenizer adds one to plain text; else unchanged."""
    ids = list(ids)
    if not adds_bos(tokenizer):
        return ids
    bos = tokenizer.bos_token_id
    while ids[:2] == [bos, bos]:
        ids = ids[1:]
    return ids if ids[:1] == [bos] else [bos] + ids


def prompt_text(tokenizer, user_turn: str, system: str | None = None, tools: Sequence[dict] | None = None) -> str:
    """The prompt as text (chat template, generation prompt; no BOS, which :func:`encode_prompt` adds)."""
    return tokenizer.apply_chat_template(chat_messages(user_turn, system), add_generation_prompt=True, tokenize=False,
                                         **_tools_kwargs(tools))


def _tools_kwargs(tools: Sequence[dict] | None) -> dict:
    return {} if tools is None else {"tools": list(tools)}


#: A tool no real tool list holds: :func:`require_tool_template` looks for its name in the prompt.
_PROBE_TOOL = {"type": "function", "function": {"name": "ratune_probe_tool", "description": "",
                                                "parameters": {"type": "object", "properties": {}}}}


def require_tool_template(tokenizer) -> None:
    """Refuse a chat template that ignores ``tools=`` or does not write an assistant's ``tool_calls``.

    Raises:
        RatuneError: naming the tokenizer and ``--chat-template chatml_tools``.
    """
    template = template_of(tokenizer)
    name = f"chat template {template.name}" if template else (
        f"{getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}'s own chat template")
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "ratune_probe_tool", "arguments": {}}}]}
    try:
        shown = "ratune_probe_tool" in prompt_text(tokenizer, "x", None, [_PROBE_TOOL])
        problem = "does not write tool calls" if shown else "ignores tools="
        if shown and "ratune_probe_tool" in assistant_text(tokenizer, "x", None, [_PROBE_TOOL], call):
            return
    except RatuneError:
        raise
    except Exception as exc:  # a template that raises on tools or tool_calls (jinja's own errors)
        problem = f"fails on a tool list or a tool call ({type(exc).__name__}: {exc})"
    raise RatuneError(f"{name} {problem}: the tool_calls answer format needs a template with tool calling; "
                      "build with --chat-template chatml_tools")


def assistant_text(tokenizer, user_turn: str, system: str | None, tools: Sequence[dict] | None,
                   message: dict) -> str:
    """The text the chat template writes for assistant ``message`` behind the prompt, up to the last
    EOS text (EOS is a training row's last token).

    Raises:
        RatuneError: the chat with the answer does not start with the prompt's text.
    """
    head = prompt_text(tokenizer, user_turn, system, tools)
    full = tokenizer.apply_chat_template(chat_messages(user_turn, system) + [message], tokenize=False,
                                         **_tools_kwargs(tools))
    if not full.startswith(head):
        raise RatuneError(f"{getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}: its chat template writes "
                          "the prompt differently once the answer follows it, so no answer is a continuation of "
                          "the prompt; use --chat-template chatml_tools")
    text = full[len(head):]
    eos = tokenizer.eos_token
    return text[:text.rindex(eos)] if eos and eos in text else text.rstrip("\n")


def encode_prompt(tokenizer, user_turn: str, system: str | None = None,
                  tools: Sequence[dict] | None = None) -> list[int]:
    """Token ids of the prompt, for training and generation alike: the chat template applied to the
    single user turn (behind ``system``; ``tools`` as ``tools=``) with the generation prompt,
    behind one BOS (:func:`with_bos`).

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    return encode_messages(tokenizer, chat_messages(user_turn, system), tools)


def encode_messages(tokenizer, messages: list[dict], tools: Sequence[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template with the generation prompt,
    behind exactly one BOS (:func:`with_bos`); :func:`encode_prompt` for one user turn.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: ratune trains and evaluates single-turn chats")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                        **_tools_kwargs(tools))
    return with_bos(tokenizer, ids)
