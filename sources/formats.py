"""Answer formats, one class per kind (docs/function_calling.md): how an answer is written, where it
is complete and what calling nothing looks like."""

from __future__ import annotations

import ast
import json
import platform
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

from ratune.errors import RatuneError
from ratune.sources.prompt import (ABSTAIN_API_CALL, abstain_answer, assistant_text, format_answer, render_user_turn,
                                   require_tool_template)


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: ``user_turn``, ``system`` turn, ``tools=`` of the chat template (None: not
    given) and whether a document was ``shortened``."""

    user_turn: str
    system: str | None = None
    tools: tuple[dict, ...] | None = None
    shortened: bool = False


class AnswerFormat(ABC):
    """One way of writing answers."""

    name: ClassVar[str]
    #: The answer that calls nothing (an abstention).
    no_call: ClassVar[str]
    #: Whether an over-long row's documents may be cut to fit (data/build.py); else it is dropped.
    shortens_documents: ClassVar[bool] = False

    @abstractmethod
    def prompt(self, example, docs: Sequence[dict], *, max_document_tokens: int | None,
               count_tokens) -> Prompt:
        """The prompt of ``example`` (a :class:`~ratune.sources.apibench.Example`) with ``docs`` shown."""

    @abstractmethod
    def completion(self, example, *, abstain: bool = False, tokenizer=None, prompt: Prompt | None = None) -> str:
        """The answer text ``example`` is trained on (:attr:`no_call`'s when ``abstain``); ``tokenizer``
        and ``prompt`` for a format whose answer the chat template writes."""

    @abstractmethod
    def answer_end(self, text: str) -> int | None:
        """The offset in generated ``text`` after which scoring needs nothing, or None while incomplete."""

    def parser_record(self) -> dict:
        """What reads this format's answers, with its version (a scored cell's ``parser``)."""
        return {}

    def record(self) -> dict:
        """The format as a generation record holds it (:func:`answer_format_of` reads it back)."""
        return {"answer_format": self.name}

    def restored(self, record: Mapping) -> "AnswerFormat":
        """This format as :meth:`record` wrote it (itself by default)."""
        return self

    def chat(self, messages: Sequence[Mapping], functions: Sequence[Mapping]) -> tuple[list[dict], tuple | None]:
        """A function-calling chat (BFCL's entries) as this format shows it: ``(messages, tools)``.

        Raises:
            RatuneError: a format without function lists (``apibench``).
        """
        raise RatuneError(f"the {self.name} answer format does not show function lists; use python_calls or "
                          "tool_calls")

    def bfcl_text(self, text: str) -> str:
        """An answer as BFCL's prompting decoder reads it (a Python call list)."""
        return text

    def reading(self, tokenizer) -> "AnswerFormat":
        """This format reading answers as ``tokenizer``'s chat template writes them (itself by default)."""
        return self

    def check_tokenizer(self, tokenizer) -> None:
        """Refuse a tokenizer (its chat template) this format cannot be written with; any by default.

        Raises:
            RatuneError: naming the way out.
        """

    def finish(self, text: str, *, stop: bool) -> str:
        """The stored answer for generated ``text`` (every backend's): cut at :meth:`answer_end` when
        ``stop``, then stripped."""
        end = self.answer_end(text) if stop else None
        return (text if end is None else text[:end]).strip()


class APIBenchFormat(AnswerFormat):
    """The paper's answer: ``<<<domain>>>``, ``<<<api_call>>>``, ``<<<api_provider>>>`` first, then
    explanation and code; complete once the api_provider line is."""

    name = "apibench"
    no_call = ABSTAIN_API_CALL
    shortens_documents = True

    def prompt(self, example, docs, *, max_document_tokens, count_tokens):
        """The paper's user turn (:func:`ratune.sources.prompt.render_user_turn`), no system turn."""
        user_turn, shortened = render_user_turn(example.instruction, docs, max_document_tokens=max_document_tokens,
                                                count_tokens=count_tokens)
        return Prompt(user_turn=user_turn, shortened=shortened)

    def completion(self, example, *, abstain=False, tokenizer=None, prompt=None):
        return format_answer(abstain_answer(example.answer) if abstain else example.answer)
    #: The last field scoring needs (the answer writes domain, api_call, api_provider first).
    last_needed_field: ClassVar[str] = "<<<api_provider>>>:"

    def answer_end(self, text: str) -> int | None:
        """End of the api_provider line: its newline, or where a later marker (``<<<``) starts on it."""
        start = text.find(self.last_needed_field)
        if start < 0:
            return None
        rest = start + len(self.last_needed_field)
        ends = [i for i in (text.find("\n", rest), text.find("<<<", rest)) if i >= 0]
        return min(ends) if ends else None


# BFCL's prompting-mode system prompt, copied from bfcl-eval 2026.3.23 (BFCL_EVAL_VERSION):
# bfcl_eval/constants/default_prompts.py, PROMPT_STYLE_TEMPLATES["classic"], _PLAINTEXT_SYSTEM_PROMPT_TEMPLATE,
# OUTPUT_FORMAT_MAPPING["python"] and PARAM_TYPE_MAPPING["python"], filled as
# bfcl_eval/model_handler/utils.py formulate_system_prompt fills them for DEFAULT_SYSTEM_PROMPT_FORMAT
# (ret_fmt=python, tool_call_tag=False, func_doc_fmt=json, prompt_fmt=plaintext, style=classic).
# tests/test_bfcl_eval.py checks the messages against BFCL's own for every entry.
_PERSONA = "You are an expert in composing functions."
_TASK = ("You are given a question and a set of possible functions. Based on the question, you will need to make "
         "one or more function/tool calls to achieve the purpose. If none of the functions can be used, point it "
         "out. If the given question lacks the parameters required by the function, also point it out.")
_TOOL_CALL_NO_TAG = ("You should only return the function calls in your response.\n\nIf you decide to invoke any of "
                     "the function(s), you MUST put it in the format of {output_format}. {param_types} You SHOULD NOT "
                     "include any other text in the response.")
_MULTITURN_BEHAVIOR = ("At each turn, you should try your best to complete the tasks requested by the user within the "
                       "current turn. Continue to output functions to call until you have fulfilled the user's "
                       "request to the best of your ability. Once you have no more functions to call, the system "
                       "will consider the current turn complete and proceed to the next turn or task.")
_AVAILABLE_TOOLS = "Here is a list of functions in {format} format that you can invoke.\n{functions}\n"
_PLAINTEXT_TEMPLATE = "{persona}{task}\n\n{tool_call_format}\n\n{multiturn_behavior}\n\n{available_tools}"
_PYTHON_OUTPUT_FORMAT = ("[func_name1(params_name1=params_value1, params_name2=params_value2...), "
                         "func_name2(params)]")
_PYTHON_PARAM_TYPES = ""
#: What BFCL appends to every function description of a Python category
#: (bfcl_eval/utils.py _get_language_specific_hint, applied when ``bfcl generate`` loads the data).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
#: What BFCL's decoder strips from both ends of a prompting answer before it reads it
#: (bfcl_eval/model_handler/utils.py default_decode_ast_prompting).
_BFCL_STRIP = "`\n "
#: An answer that starts with a call, not a list: BFCL's decoder reads it wrapped in ``[...]``.
_BARE_CALL = re.compile(r"[A-Za-z_][\w.]*\(")


class PythonCallsFormat(AnswerFormat):
    """BFCL's prompting answer: a Python list of calls with keyword arguments, ``[]`` for none;
    complete at the bracket that closes the first top-level list (brackets inside string literals
    do not count). An answer that starts with a bare call (``f(a=[1])``, which BFCL's decoder
    wraps in a list) has no end of its own: it is kept whole and read as BFCL reads it."""

    name = "python_calls"
    no_call = "[]"

    def prompt(self, example, docs, *, max_document_tokens=None, count_tokens=None):
        """BFCL's prompting messages: :meth:`system_prompt` over ``docs`` (never shortened) before the
        row's own system message, and the instruction as the user turn."""
        system = self.system_prompt(docs)
        if example.system:
            system = f"{system}\n\n{example.system}"
        return Prompt(user_turn=example.instruction, system=system)

    def completion(self, example, *, abstain=False, tokenizer=None, prompt=None):
        return self.no_call if abstain else self.render_calls(example.calls)

    @staticmethod
    def system_prompt(functions: Sequence[Mapping]) -> str:
        """BFCL's default prompting system prompt for ``functions`` (JSON schemas, each description
        ending in :data:`PYTHON_HINT`)."""
        functions = [{**fn, "description": fn.get("description", "") + PYTHON_HINT} for fn in functions]
        return _PLAINTEXT_TEMPLATE.format(
            persona=_PERSONA, task=_TASK,
            tool_call_format=_TOOL_CALL_NO_TAG.format(output_format=_PYTHON_OUTPUT_FORMAT,
                                                      param_types=_PYTHON_PARAM_TYPES),
            multiturn_behavior=_MULTITURN_BEHAVIOR,
            available_tools=_AVAILABLE_TOOLS.format(format="json", functions=json.dumps(list(functions), indent=4)))

    @staticmethod
    def _starts_with_call(text: str) -> bool:
        """Whether ``text`` starts (after what BFCL's decoder strips) with a bare call."""
        return _BARE_CALL.match(text.lstrip(_BFCL_STRIP)) is not None

    @classmethod
    def _bare_calls(cls, text: str) -> str | None:
        """``text`` as BFCL's decoder reads an answer that starts with a call: stripped and wrapped in
        ``[...]``; None for any other answer."""
        if not cls._starts_with_call(text):
            return None
        body = text.strip(_BFCL_STRIP)
        return "[" + body + ("" if body.endswith("]") else "]")

    def answer_end(self, text: str) -> int | None:
        start = text.find("[")  # called per generated token (the stop rule): no string is built here
        if start < 0 or self._starts_with_call(text):
            return None
        depth, quote, escaped = 0, None, False
        for i in range(start, len(text)):
            char = text[i]
            if quote is not None:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == quote:
                    quote = None
            elif char in "'\"":
                quote = char
            elif char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
                if depth == 0:
                    return i + 1 if char == "]" else None
        return None

    def parser_record(self) -> dict:
        return {"python_ast": platform.python_version()}

    def shot_turns(self, functions: Sequence[Mapping], query: str, calls: Sequence[Mapping]) -> list[dict]:
        """A worked example as two earlier turns: the user's ``query`` behind its own ``functions``,
        listed as :meth:`system_prompt` lists them, and the answer ``calls``."""
        functions = [{**fn, "description": fn.get("description", "") + PYTHON_HINT} for fn in functions]
        offered = _AVAILABLE_TOOLS.format(format="json", functions=json.dumps(functions, indent=4))
        return [{"role": "user", "content": f"{offered}\n{query}"},
                {"role": "assistant", "content": self.render_calls(calls)}]

    def chat(self, messages, functions):
        """:meth:`system_prompt` over ``functions`` before the chat's own system message; no ``tools=``."""
        system = self.system_prompt(functions)
        messages = [dict(message) for message in messages]
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = system + "\n\n" + messages[0]["content"]
        else:
            messages.insert(0, {"role": "system", "content": system})
        return messages, None

    def parse_calls(self, text: str) -> list[dict] | None:
        """The first call list in ``text`` (or its bare calls, as BFCL's decoder wraps them) as
        ``[{"name", "arguments"}]``, or None when there is no list of keyword calls with literal
        values. Read with :mod:`ast`; nothing is evaluated."""
        source = self._bare_calls(text)
        if source is None:
            end = self.answer_end(text)
            if end is None:
                return None
            source = text[text.find("["):end]
        try:
            tree = ast.parse(source, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        if not isinstance(tree, ast.List):
            return None
        calls = []
        for node in tree.elts:
            name = dotted_name(node.func) if isinstance(node, ast.Call) and not node.args else None
            if name is None or any(kw.arg is None for kw in node.keywords):
                return None
            try:
                arguments = {kw.arg: _as_json(ast.literal_eval(kw.value)) for kw in node.keywords}
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
            calls.append({"name": name, "arguments": arguments})
        return calls

    @staticmethod
    def render_calls(calls: Sequence[Mapping]) -> str:
        """``[{"name": "f", "arguments": {"a": 1}}, ...]`` as ``[f(a=1), ...]`` (values as Python literals)."""
        rendered = []
        for call in calls:
            args = ", ".join(f"{key}={python_literal(value)}" for key, value in call["arguments"].items())
            rendered.append(f"{call['name']}({args})")
        return "[" + ", ".join(rendered) + "]"


class ToolCallsFormat(AnswerFormat):
    """The chat template's own tool calling (TRL's ``tools`` column): tools as ``tools=`` (OpenAI
    form), answers as the template writes ``tool_calls``, read back by a ``response_template``.

    Args:
        response_template: the tokenizer's ``response_template`` (None: answers cannot be read).
    """

    name = "tool_calls"
    no_call = "None of the given functions can be used."

    def __init__(self, response_template: Mapping | None = None):
        self.response_template = response_template

    def reading(self, tokenizer) -> "ToolCallsFormat":
        """This format reading answers with ``tokenizer``'s ``response_template``.

        Raises:
            RatuneError: the tokenizer has none (its template's answers could not be scored).
        """
        template = getattr(tokenizer, "response_template", None)
        if not template:
            raise RatuneError(f"{getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}: the tool_calls answer "
                              "format reads answers with the tokenizer's response_template and this tokenizer has "
                              "none; use --chat-template chatml_tools (it brings one)")
        return ToolCallsFormat(template)

    def check_tokenizer(self, tokenizer) -> None:
        require_tool_template(tokenizer)

    def prompt(self, example, docs, *, max_document_tokens=None, count_tokens=None):
        """The instruction as the user turn, the row's own system message, ``docs`` as the tools."""
        return Prompt(user_turn=example.instruction, system=example.system,
                      tools=tuple({"type": "function", "function": dict(doc)} for doc in docs))

    def completion(self, example, *, abstain=False, tokenizer=None, prompt=None):
        """The assistant message as the template writes it behind ``prompt`` (EOS and after cut), with
        a ``tokenizer`` that passed :meth:`check_tokenizer`."""
        if tokenizer is None or prompt is None:
            raise TypeError("the tool_calls format renders answers through the tokenizer's chat template")
        if abstain or not example.calls:
            message = {"role": "assistant", "content": self.no_call}
        else:
            message = {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in example.calls]}
        return assistant_text(tokenizer, prompt.user_turn, prompt.system, prompt.tools, message)

    def answer_end(self, text: str) -> int | None:
        return None  # the answer ends at EOS, where generation stops anyway

    def parser_record(self) -> dict:
        from importlib.metadata import version

        return {"transformers_parse_response": version("transformers")}

    def record(self) -> dict:
        return {"answer_format": self.name, "response_template": self.response_template}

    def restored(self, record):
        return ToolCallsFormat(record.get("response_template"))

    def chat(self, messages, functions):
        """The messages as they are; ``functions`` as the tools, in OpenAI's form."""
        return [dict(m) for m in messages], tuple({"type": "function", "function": dict(fn)} for fn in functions)

    def bfcl_text(self, text: str) -> str:
        """The calls as a Python call list (``[]`` for a text answer); the text itself when a call
        does not decode."""
        calls = self.parse_calls(text)
        return text if calls is None else PythonCallsFormat.render_calls(calls)

    def parse_calls(self, text: str) -> list[dict] | None:
        """The answer's calls as ``[{"name", "arguments"}]`` (``[]``: a text answer), or None when a
        call does not decode.

        Raises:
            RatuneError: this instance has no response template (see :meth:`reading`).
        """
        from transformers.utils.chat_parsing import parse_response

        if self.response_template is None:
            raise RatuneError("the tool_calls format needs the tokenizer's response_template to read answers")
        try:
            message = parse_response(text, dict(self.response_template), prefix="")
        except (ValueError, TypeError, KeyError, RecursionError):
            return None
        calls = []
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else None
            name, arguments = (fn.get("name"), fn.get("arguments", {})) if isinstance(fn, dict) else (None, None)
            if isinstance(arguments, str):  # a template that writes arguments as a JSON string
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return None
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return None
            calls.append({"name": name, "arguments": arguments})
        return calls


def dotted_name(node: ast.AST) -> str | None:
    """``"a.b.c"`` for a ``Name``/``Attribute`` chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _as_json(value):
    """A literal as JSON would hold it: tuples and sets as lists (sets sorted by repr)."""
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [_as_json(v) for v in sorted(value, key=repr)]
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (complex, bytes)):
        raise TypeError("not a JSON value")
    return value


def python_literal(value) -> str:
    """A JSON value as a Python literal (``repr``, element by element).

    Raises:
        TypeError: a value JSON cannot hold.
    """
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise TypeError(f"not a JSON value: {json.dumps(value, default=repr)}")


#: The answer formats by name.
ANSWER_FORMATS: dict[str, AnswerFormat] = {f.name: f() for f in (APIBenchFormat, PythonCallsFormat, ToolCallsFormat)}
#: The format of APIBench hubs and of builds that record none.
DEFAULT_ANSWER_FORMAT = APIBenchFormat.name


def answer_format_of(record: Mapping, default: str) -> AnswerFormat:
    """The answer format a generation record (:meth:`AnswerFormat.record`) names, else ``default``.

    Raises:
        RatuneError: an unknown name.
    """
    return get_answer_format(record.get("answer_format") or default).restored(record)


def get_answer_format(name: str) -> AnswerFormat:
    """The format called ``name``.

    Raises:
        RatuneError: an unknown name, listing the known ones.
    """
    if name not in ANSWER_FORMATS:
        raise RatuneError(f"unknown answer format {name!r}: expected one of {', '.join(ANSWER_FORMATS)}")
    return ANSWER_FORMATS[name]
