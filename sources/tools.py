"""Tools as JSON schemas and function-calling rows, read from the shapes the field uses (OpenAI or
BFCL tools; xLAM or chat rows: docs/function_calling.md). Errors name file, line and JSON pointer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ratune.errors import InputError
from ratune.io import iter_jsonl

#: The row shapes :func:`load_tool_rows` reads, by the key that tells them apart.
ROW_SHAPES = {"query": "xlam", "messages": "chat"}


@dataclass(frozen=True)
class ToolRow:
    """One function-calling row: ``query``, the ``tools`` offered (normalised), the ``calls`` that
    answer it (empty: no tool fits), its 1-based ``line``, ``shape`` and own ``system`` message."""

    line: int
    query: str
    tools: list
    calls: list
    shape: str
    system: str | None = None


class _Where:
    """A file and line to name in errors."""

    def __init__(self, path, line):
        self.path, self.line = str(path), line

    def error(self, pointer: str, message: str) -> InputError:
        return InputError(self.path, self.line, pointer or "/", message)


def normalise_tool(raw, where: _Where, pointer: str) -> dict:
    """A tool in either style as ``{"name", "description", "parameters"}`` (the schema as given;
    no ``parameters``: an object with no properties).

    Raises:
        InputError: not an object, a missing or empty ``name``, a ``parameters`` that is not an object,
            ``properties`` not an object, or a ``required`` entry that is no property.
    """
    if not isinstance(raw, dict):
        raise where.error(pointer, "expected a tool object")
    if raw.get("type") == "function" and "function" in raw:
        raw, pointer = raw["function"], f"{pointer}/function"
        if not isinstance(raw, dict):
            raise where.error(pointer, "expected an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise where.error(f"{pointer}/name", "missing or not a non-empty string")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise where.error(f"{pointer}/description", "expected a string")
    parameters = raw.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise where.error(f"{pointer}/parameters", "expected a JSON schema object")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise where.error(f"{pointer}/parameters/properties", "expected an object")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise where.error(f"{pointer}/parameters/required", "expected a list of parameter names")
    missing = [r for r in required if r not in properties]
    if missing:
        raise where.error(f"{pointer}/parameters/required", f"names no property: {', '.join(missing)}")
    return {"name": name, "description": description, "parameters": parameters}


def load_tool_list(path: str | os.PathLike) -> list[dict]:
    """The tools of a file: a JSON array of tools, or one tool a line; names must be unique.

    Raises:
        InputError: a bad tool (file, line for JSON lines, JSON pointer), a duplicate name, a file
            that is neither.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise InputError(str(path), None, None, f"not a JSON array of tools ({exc})") from None
        tools = [normalise_tool(item, _Where(path, None), f"/{i}") for i, item in enumerate(items)]
        lines = [None] * len(tools)
    else:
        pairs = [(line, normalise_tool(obj, _Where(path, line), "")) for line, obj in iter_jsonl(path)]
        lines, tools = [p[0] for p in pairs], [p[1] for p in pairs]
    seen: dict[str, int | None] = {}
    for i, (line, tool) in enumerate(zip(lines, tools)):
        if tool["name"] in seen:
            pointer = "/name" if line is not None else f"/{i}/name"
            raise InputError(str(path), line, pointer, f"duplicate tool name {tool['name']!r}")
        seen[tool["name"]] = line
    return tools


def _decoded(value, where: _Where, pointer: str, kind: type):
    """``value``, or the JSON it holds when it is a string (datasets often store lists as text)."""
    if isinstance(value, str) and kind is not str:
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise where.error(pointer, f"a string that is not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise where.error(pointer, f"expected {'a list' if kind is list else 'an object'}")
    return value


def _call(raw, tools: dict, where: _Where, pointer: str) -> dict:
    """A call ``{"name", "arguments"}`` naming one of ``tools``."""
    if not isinstance(raw, dict):
        raise where.error(pointer, "expected a call object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise where.error(f"{pointer}/name", "missing or not a non-empty string")
    if name not in tools:
        raise where.error(f"{pointer}/name", f"calls {name!r}, which is not among the row's tools "
                                             f"({', '.join(tools) or 'none'})")
    arguments = _decoded(raw.get("arguments", {}), where, f"{pointer}/arguments", dict)
    return {"name": name, "arguments": arguments}


def _tools(raw, where: _Where) -> list[dict]:
    tools = [normalise_tool(t, where, f"/tools/{i}") for i, t in enumerate(_decoded(raw, where, "/tools", list))]
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise where.error("/tools", f"duplicate tool names: {', '.join(twice)}")
    return tools


def xlam_row(obj: dict, where: _Where) -> ToolRow:
    """An APIGen/xLAM row: ``query``, ``tools``, ``answers`` (each a list or its JSON text)."""
    query = obj.get("query")
    if not isinstance(query, str) or not query.strip():
        raise where.error("/query", "missing or not a non-empty string")
    tools = _tools(obj.get("tools"), where)
    by_name = {t["name"]: t for t in tools}
    answers = _decoded(obj.get("answers"), where, "/answers", list)
    calls = [_call(a, by_name, where, f"/answers/{i}") for i, a in enumerate(answers)]
    return ToolRow(line=where.line, query=query, tools=tools, calls=calls, shape="xlam")


def chat_row(obj: dict, where: _Where) -> ToolRow:
    """A chat row: ``messages`` (optional system turns, one user turn, then one assistant turn whose
    ``tool_calls`` are the answer; no ``tool_calls``: no call) and ``tools``."""
    messages = _decoded(obj.get("messages"), where, "/messages", list)
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    users = [i for i, r in enumerate(roles) if r == "user"]
    if len(users) != 1 or roles[users[0] + 1:] != ["assistant"]:
        raise where.error("/messages", "expected one user turn followed by one assistant turn "
                                       f"(single-turn rows only), got roles {roles}")
    query = messages[users[0]].get("content")
    systems = [m.get("content") for m in messages[:users[0]] if m.get("role") == "system"]
    if not isinstance(query, str) or not query.strip():
        raise where.error(f"/messages/{users[0]}/content", "missing or not a non-empty string")
    tools = _tools(obj.get("tools"), where)
    by_name = {t["name"]: t for t in tools}
    assistant = len(messages) - 1
    raw_calls = messages[assistant].get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise where.error(f"/messages/{assistant}/tool_calls", "expected a list")
    calls = []
    for i, raw in enumerate(raw_calls):
        pointer = f"/messages/{assistant}/tool_calls/{i}"
        function = raw.get("function") if isinstance(raw, dict) else None
        calls.append(_call(function, by_name, where, f"{pointer}/function"))
    return ToolRow(line=where.line, query=query, tools=tools, calls=calls, shape="chat",
                   system="\n\n".join(str(c) for c in systems) or None)


def load_tool_rows(path: str | os.PathLike) -> list[ToolRow]:
    """The rows of a JSON-lines file, each xLAM-style (``query``) or chat-style (``messages``).

    Raises:
        InputError: a line of neither shape, or a bad field (file, line, JSON pointer); a call to a
            tool missing from its row's tools.
    """
    rows = []
    for line, obj in iter_jsonl(path):
        where = _Where(path, line)
        shapes = [key for key in ROW_SHAPES if key in obj]
        if len(shapes) != 1:
            raise where.error("/", "expected a row with either 'query' (xLAM: query, tools, answers) or "
                                   "'messages' (chat: messages with tool_calls, tools)")
        rows.append(xlam_row(obj, where) if shapes[0] == "query" else chat_row(obj, where))
    return rows
