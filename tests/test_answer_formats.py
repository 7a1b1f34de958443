"""sources/formats.py: each answer format says where an answer is complete, what calling nothing
looks like and (python_calls) how calls are written."""

from __future__ import annotations

import pytest

from ratune.errors import RatuneError
from ratune.sources.formats import ANSWER_FORMATS, PythonCallsFormat, get_answer_format, python_literal


def test_the_registry_names_each_format_once():
    assert list(ANSWER_FORMATS) == ["apibench", "python_calls", "tool_calls"]
    assert [f.no_call for f in ANSWER_FORMATS.values()] == ["NO_API_FITS", "[]",
                                                            "None of the given functions can be used."]
    with pytest.raises(RatuneError, match=r"^unknown answer format 'json': expected one of apibench, python_calls, "
                                          r"tool_calls$"):
        get_answer_format("json")


def test_apibench_answers_end_after_the_api_provider_line():
    fmt = get_answer_format("apibench")
    text = "<<<domain>>>: D\n<<<api_call>>>: f(x)\n<<<api_provider>>>: PyTorch\n<<<explanation>>>: e"
    assert fmt.finish(text, stop=True) == "<<<domain>>>: D\n<<<api_call>>>: f(x)\n<<<api_provider>>>: PyTorch"
    assert fmt.finish(text, stop=False) == text
    assert fmt.answer_end("<<<api_provider>>>: PyT") is None
    assert fmt.answer_end("<<<api_provider>>>: P<<<explanation>>>") == len("<<<api_provider>>>: P")


@pytest.mark.parametrize("text,end", [
    ("[f(a=1)] and then prose", len("[f(a=1)]")),
    ("Sure: [f(a='x]'), g(b=[1, 2])]\nmore", len("Sure: [f(a='x]'), g(b=[1, 2])]")),
    ('[f(s="it\\"s ] here")]tail', len('[f(s="it\\"s ] here")]')),
    ("[]", 2),
    ("[f(a={'k': [1]})", None),  # the list is still open
    ("no call at all", None),
    # a bare call (BFCL's decoder wraps it in a list): never cut inside its list arguments
    ("music.theory.chordProgression(progression=['I', 'V', 'vi', 'IV'])", None),
    ("```\nf(a=[1, 2]) and more", None),
])
def test_python_calls_answers_end_at_the_bracket_that_closes_the_list(text, end):
    fmt = get_answer_format("python_calls")
    assert fmt.answer_end(text) == end
    if end is not None:  # any continuation gives the same offset
        assert fmt.answer_end(text + "])'\"") == end


def test_python_calls_are_written_with_python_literals():
    calls = [{"name": "math.factorial", "arguments": {"n": 5}},
             {"name": "g", "arguments": {"flag": True, "none": None, "items": [1.5, "a'b"], "opts": {"k": False}}},
             {"name": "h", "arguments": {}}]
    assert PythonCallsFormat.render_calls(calls) == (
        "[math.factorial(n=5), g(flag=True, none=None, items=[1.5, \"a'b\"], opts={'k': False}), h()]")
    assert PythonCallsFormat.render_calls([]) == "[]"
    with pytest.raises(TypeError, match="not a JSON value"):
        python_literal({1, 2})
