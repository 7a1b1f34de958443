"""Worked examples before a BFCL question (``ratune eval bfcl --shots N --shots-from TOOLS_DIR``):
rows of a tool set's training split that call a tool, drawn with a seed, each shown as a user turn
behind its own functions and the answer as an assistant turn, between BFCL's system prompt and the
question; the draw is recorded; refusals are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratune.errors import RatuneError
from ratune.sources.bfcl import BfclEntry, bfcl_chat, bfcl_messages
from ratune.sources.formats import PYTHON_HINT, PythonCallsFormat
from ratune.sources.toolset import draw_shots, import_tool_set

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tools"

#: A hand-made single-turn entry (no BFCL venv needed).
ENTRY = BfclEntry(id="simple_python_0", category="simple_python",
                  question=[[{"role": "user", "content": "What is 2 + 3?"}]],
                  functions=[{"name": "add", "description": "Add two numbers.",
                              "parameters": {"type": "dict", "properties": {"a": {"type": "integer"},
                                                                            "b": {"type": "integer"}}}}],
                  possible_answer=None, line=1)


@pytest.fixture
def tool_set(tmp_path) -> Path:
    """The 3 xLAM and 2 chat rows of tests/fixtures/tools, all in the train split: lines 1 (weather),
    2 (two convert calls) and 4 (book_table) call a tool; 3 and 5 call none."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text((FIXTURES / "xlam_rows.jsonl").read_text() + (FIXTURES / "chat_rows.jsonl").read_text())
    import_tool_set(tmp_path / "ts", rows_file=rows, eval_fraction=0)
    return tmp_path / "ts"


def test_shots_are_rows_that_call_a_tool_drawn_with_a_seed(tool_set):
    assert [s.line for s in draw_shots(tool_set, 3, seed=0)] == [1, 2, 4]  # all three, in file order
    two = [s.line for s in draw_shots(tool_set, 2, seed=0)]
    assert two == [s.line for s in draw_shots(tool_set, 2, seed=0)] and set(two) < {1, 2, 4} and two == sorted(two)
    assert {tuple(s.line for s in draw_shots(tool_set, 1, seed=seed)) for seed in range(20)} == {(1,), (2,), (4,)}
    with pytest.raises(RatuneError, match="--shots 4: tool set .* has 3 training rows that call a tool"):
        draw_shots(tool_set, 4, seed=0)
    with pytest.raises(RatuneError, match="--shots-from .*: not a tool-set folder"):
        draw_shots(tool_set.parent, 1, seed=0)


def test_each_shot_is_a_user_turn_behind_its_functions_and_its_answer(tool_set):
    shots = draw_shots(tool_set, 3, seed=0)
    messages, tools = bfcl_chat(ENTRY, PythonCallsFormat(), shots)
    plain = bfcl_messages(ENTRY)
    assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant",
                                                               "user", "assistant", "user"]
    assert messages[0] == plain[0] and messages[-1] == plain[-1]  # BFCL's own system prompt and the question
    head = "Here is a list of functions in json format that you can invoke.\n"
    weather = messages[1]["content"]
    assert weather.startswith(head) and weather.endswith("]\n\nWhat is the weather in Paris in celsius?")
    listed = json.loads(weather[len(head):-len("\n\nWhat is the weather in Paris in celsius?")])
    assert [f["name"] for f in listed] == ["get_weather"]
    assert listed[0]["description"] == "Current weather of a city" + PYTHON_HINT
    assert listed[0]["parameters"]["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert messages[2]["content"] == "[get_weather(city='Paris', unit='celsius')]"
    assert messages[4]["content"] == "[convert(amount=10, to='EUR'), convert(amount=10, to='JPY')]"
    assert messages[6]["content"] == "[book_table(people=2, time='19:00', options={'outdoor': False})]"
    assert bfcl_chat(ENTRY, PythonCallsFormat())[0] == plain  # no shots: BFCL's prompt as it is


def test_shots_go_together_with_their_tool_set_and_python_calls(tool_set, tmp_path, capsys):
    from ratune.cli import main
    from ratune.eval.bfcl_run import _shots
    from ratune.eval.settings import BfclSettings
    from ratune.sources.formats import ToolCallsFormat

    with pytest.raises(RatuneError, match="--shots N and --shots-from TOOLS_DIR go together"):
        BfclSettings(shots=2)
    with pytest.raises(RatuneError, match="worked examples are written in python_calls .* not tool_calls"):
        _shots(BfclSettings(shots=1, shots_from=str(tool_set)), ToolCallsFormat())
    assert _shots(BfclSettings(), PythonCallsFormat()) == ()
    assert main(["eval", "bfcl", "--checkpoint", "x", "--shots-from", str(tool_set), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--shots N and --shots-from TOOLS_DIR go together" in err


@pytest.mark.bfcl
def test_a_run_with_shots_records_the_drawn_lines(tool_set, tiny_model_dir, tmp_path):
    from ratune.cli import main

    out = tmp_path / "run"
    argv = ["eval", "bfcl", "--checkpoint", str(tiny_model_dir), "--categories", "simple_python", "--limit", "1",
            "--max-new-tokens", "4", "--shots", "2", "--shots-from", str(tool_set), "--shots-seed", "3",
            "--out", str(out)]
    assert main(argv) == 0
    shots = json.loads((out / "simple_python" / "identity.json").read_text())["generation"]["shots"]
    assert shots == {"tool_set": str(tool_set.resolve()), "seed": 3,
                     "lines": [s.line for s in draw_shots(tool_set, 2, seed=3)]}
