"""Answer formats, one class per kind (docs/function_calling.md): how an answer is written, where it
is complete (generation stops there when only scoring needs it) and what calling nothing looks like.

``apibench`` is the paper's ``<<<domain>>>: ... <<<api_call>>>: ...`` answer (sources/prompt.py
renders it); ``python_calls`` is BFCL's prompting answer, ``[f(a=1), g(b='x')]``, ``[]`` for no call.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import ClassVar, Mapping, Sequence

from ratune.errors import RatuneError
from ratune.sources.prompt import ABSTAIN_API_CALL


class AnswerFormat(ABC):
    """One way of writing answers."""

    name: ClassVar[str]
    #: The answer that calls nothing (an abstention).
    no_call: ClassVar[str]

    @abstractmethod
    def answer_end(self, text: str) -> int | None:
        """The offset in generated ``text`` after which nothing is needed for scoring, or None
        while the answer is incomplete. Any continuation of ``text`` gives the same offset."""

    def finish(self, text: str, *, stop: bool) -> str:
        """The stored answer for generated ``text``: cut at :meth:`answer_end` when ``stop`` (and the
        answer is complete), then stripped. Every backend passes its text through this."""
        end = self.answer_end(text) if stop else None
        return (text if end is None else text[:end]).strip()


class APIBenchFormat(AnswerFormat):
    """The paper's answer: ``<<<domain>>>``, ``<<<api_call>>>``, ``<<<api_provider>>>`` first, then
    explanation and code; complete once the api_provider line is."""

    name = "apibench"
    no_call = ABSTAIN_API_CALL
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


class PythonCallsFormat(AnswerFormat):
    """BFCL's prompting answer: a Python list of calls with keyword arguments, ``[]`` for none;
    complete at the bracket that closes the first top-level list (brackets inside string literals
    do not count)."""

    name = "python_calls"
    no_call = "[]"

    def answer_end(self, text: str) -> int | None:
        start = text.find("[")
        if start < 0:
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

    @staticmethod
    def render_calls(calls: Sequence[Mapping]) -> str:
        """``[{"name": "f", "arguments": {"a": 1}}, ...]`` as ``[f(a=1), ...]``; argument values as
        Python literals (``True``, ``None``, nested lists and dicts)."""
        rendered = []
        for call in calls:
            args = ", ".join(f"{key}={python_literal(value)}" for key, value in call["arguments"].items())
            rendered.append(f"{call['name']}({args})")
        return "[" + ", ".join(rendered) + "]"


def python_literal(value) -> str:
    """A JSON value as a Python literal: ``repr`` of strings, numbers, bools and None, and of lists and
    dicts element by element.

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
ANSWER_FORMATS: dict[str, AnswerFormat] = {f.name: f() for f in (APIBenchFormat, PythonCallsFormat)}
#: The format of APIBench hubs and of every build made before formats existed.
DEFAULT_ANSWER_FORMAT = APIBenchFormat.name


def get_answer_format(name: str) -> AnswerFormat:
    """The format called ``name``.

    Raises:
        RatuneError: an unknown name, listing the known ones.
    """
    if name not in ANSWER_FORMATS:
        raise RatuneError(f"unknown answer format {name!r}: expected one of {', '.join(ANSWER_FORMATS)}")
    return ANSWER_FORMATS[name]
