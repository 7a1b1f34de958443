"""sources/tools.py: tool lists (OpenAI- and BFCL-style) and function-calling rows (xLAM- and
chat-style) read into one shape, with every bad field named by file, line and JSON pointer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratune.errors import InputError
from ratune.sources.tools import load_tool_list, load_tool_rows

FIXTURES = Path(__file__).parent / "fixtures" / "tools"


def test_tool_lists_in_both_styles_keep_the_whole_schema():
    openai = load_tool_list(FIXTURES / "openai_tools.json")
    assert [t["name"] for t in openai] == ["search_flights", "cancel_booking"]
    assert openai[0]["parameters"]["properties"]["stops"] == {"type": "integer", "enum": [0, 1, 2], "default": 0}
    assert openai[0]["parameters"]["required"] == ["origin", "destination"]
    bfcl = load_tool_list(FIXTURES / "bfcl_tools.jsonl")
    assert bfcl[0] == {"name": "math.factorial", "description": "Factorial of n.",
                       "parameters": {"type": "dict", "properties": {"n": {"type": "integer",
                                                                            "description": "The number."}},
                                      "required": ["n"]}}


def test_xlam_rows_hold_zero_one_or_several_calls():
    rows = load_tool_rows(FIXTURES / "xlam_rows.jsonl")
    assert [(r.line, r.shape, len(r.calls)) for r in rows] == [(1, "xlam", 1), (2, "xlam", 2), (3, "xlam", 0)]
    assert rows[0].calls == [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]
    assert rows[0].tools[0]["parameters"]["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert [c["arguments"]["to"] for c in rows[1].calls] == ["EUR", "JPY"]


def test_chat_rows_take_the_assistant_tool_calls_or_none():
    rows = load_tool_rows(FIXTURES / "chat_rows.jsonl")
    assert rows[0].query == "Book a table for 2 at 7pm." and rows[0].shape == "chat"
    assert rows[0].calls == [{"name": "book_table",
                              "arguments": {"people": 2, "time": "19:00", "options": {"outdoor": False}}}]
    assert rows[1].calls == [] and rows[1].tools[0]["name"] == "book_table"


@pytest.mark.parametrize("row,line_field,message", [
    ({"query": "q", "tools": [{"name": "f"}], "answers": [{"name": "g", "arguments": {}}]},
     "/answers/0/name", "calls 'g', which is not among the row's tools (f)"),
    ({"query": "q", "tools": [{"type": "function", "function": {"description": "d"}}], "answers": []},
     "/tools/0/function/name", "missing or not a non-empty string"),
    ({"query": "q", "tools": [{"name": "f", "parameters": {"type": "object", "properties": {"a": {}},
                                                             "required": ["b"]}}], "answers": []},
     "/tools/0/parameters/required", "names no property: b"),
    ({"query": "q", "tools": [{"name": "f"}], "answers": "[{\"name\": \"f\", \"arguments\": \"{oops\"}]"},
     "/answers/0/arguments", "a string that is not JSON"),
    ({"query": "q", "tools": [{"name": "f"}, {"name": "f"}], "answers": []}, "/tools", "duplicate tool names: f"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}], "tools": []},
     "/messages", "single-turn rows only"),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "x"}}]}],
      "tools": [{"name": "f"}]}, "/messages/1/tool_calls/0/function/name", "calls 'x'"),
    ({"prompt": "q"}, "/", "expected a row with either 'query'"),
])
def test_a_bad_row_is_one_error_naming_file_line_and_pointer(tmp_path, row, line_field, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"query": "fine", "tools": [], "answers": []}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(InputError) as caught:
        load_tool_rows(path)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 2, line_field)
    assert message in caught.value.reason and str(caught.value).startswith(f"{path}:2: field {line_field!r}:")


def test_a_bad_tool_list_names_the_array_index_or_the_line(tmp_path):
    array = tmp_path / "tools.json"
    array.write_text(json.dumps([{"name": "f"}, {"name": "f"}]))
    with pytest.raises(InputError, match=r"tools\.json: field '/1/name': duplicate tool name 'f'"):
        load_tool_list(array)
    lines = tmp_path / "tools.jsonl"
    lines.write_text(json.dumps({"name": "f"}) + "\n" + json.dumps({"name": "g", "parameters": []}) + "\n")
    with pytest.raises(InputError, match=r"tools\.jsonl:2: field '/parameters': expected a JSON schema object"):
        load_tool_list(lines)


@pytest.mark.bfcl
def test_every_bfcl_function_list_reads_as_tools():
    """BFCL's own files are the real data: every entry's functions read as BFCL-style tools, unchanged."""
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl
    from ratune.sources.tools import _Where, normalise_tool

    data = bfcl_data_dir()
    counted = 0
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
                     "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
                     "live_irrelevance", "live_relevance"):
        for entry in load_bfcl(data, category):
            for i, fn in enumerate(entry.functions):
                tool = normalise_tool(fn, _Where(category, entry.line), f"/function/{i}")
                assert tool["parameters"] is fn["parameters"] and tool["name"] == fn["name"]
                counted += 1
    assert counted == 8576  # the functions offered across the 11 categories (bfcl-eval 2026.3.23)
