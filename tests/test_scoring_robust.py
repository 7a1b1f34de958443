"""Robustness of the scorer and its inputs: hostile texts, bad response files, the wrong hub,
and the ``ratune eval score`` entry point."""

from __future__ import annotations

import argparse
import json
from functools import lru_cache

import pytest
from conftest import real_apibench_or_skip  # tests/conftest.py

from ratune.sources.apibench import HUBS
from ratune.errors import InputError, RatuneError
from ratune.eval.cli import cli_score
from ratune.eval.scoring import Scorer, add_score_arguments, check_hub_matches, hub_evidence, load_responses

pytestmark = pytest.mark.apibench_data
APIBENCH = real_apibench_or_skip()


@lru_cache(maxsize=None)
def scorer(hub: str) -> Scorer:
    return Scorer.from_apibench(hub, APIBENCH)


HOSTILE = {
    "empty": "",
    "whitespace": "   \n\t ",
    "nested_parens": "api_call: " + "(" * 10_000 + ")" * 10_000 + " api_provider",
    "unclosed_parens": "api_call: torch.hub.load" + "(" * 10_000,
    "nested_calls": "api_call: " + "f(" * 5_000 + ")" * 5_000,
    "nested_lists": "<<<api_call>>>: " + "[" * 10_000,
    "binary_junk": "api_call: \x00\x01\x02\x7f\ufffd\ud800\udfff hub.load(\x00)",
    "only_marker": "api_call",
    "markers_only": "api_call api_provider api_call api_provider",
}

ERROR = ("error", "error")  # (gorilla, strict)
HALLUCINATION = ("hallucination", "hallucination")

# The verdicts, worked out from the rules (official_semantics.md sections 2-6 for gorilla,
# docs/scoring.md "The strict metric" for strict) for question 1 of each hub. A hallucination needs
# every database entry to miss: for gorilla that holds when no kept database argument (a repo, a
# model id, a TF Hub URL, a task string; never empty: no database call has an empty literal)
# occurs anywhere in the cut string, since every searched node's text is part of it; for strict
# when no hub loader call with a known argument is in it. Each case: (expected api_call cut per
# hub, {hub: (gorilla, strict)}).
_TH_NONE = {"torchhub": None}  # TorchHub without `api_call`: nothing is cut, nothing parsed
HOSTILE_EXPECTED = {
    # no marker: TorchHub is error unparsed (§2.2); HF/TF parse "", the empty root holds no argument nor loader
    "empty": ({**_TH_NONE, "huggingface": "", "tensorflowhub": ""},
              {"torchhub": ERROR, "huggingface": HALLUCINATION, "tensorflowhub": HALLUCINATION}),
    # the same as empty: whitespace holds no argument and no loader name
    "whitespace": ({**_TH_NONE, "huggingface": "   \n\t ", "tensorflowhub": "   \n\t "},
                   {"torchhub": ERROR, "huggingface": HALLUCINATION, "tensorflowhub": HALLUCINATION}),
    # cut from ':' + 2 to the last ')': only parentheses, so no api_name key and no argument: hallucination
    "nested_parens": ("(" * 10_000 + ")" * 10_000, dict.fromkeys(HUBS, HALLUCINATION)),
    # no ')' drops the last '(' (§2.5); no repo, URL or model id in it, and a repo-less torch.hub.load names nothing
    "unclosed_parens": ("torch.hub.load" + "(" * 9_999, dict.fromkeys(HUBS, HALLUCINATION)),
    # no database api_name is `f`, the fall-through node is the innermost "()", and `f` is no loader
    "nested_calls": ("f(" * 5_000 + ")" * 5_000, dict.fromkeys(HUBS, HALLUCINATION)),
    # SEG is ">>>: [[[...": cut from index 3 + 2, no ')' drops the last '[': brackets only, hallucination
    "nested_lists": ("[" * 9_999, dict.fromkeys(HUBS, HALLUCINATION)),
    # no repo, URL or model id in the cut; strict TF reads hub.load(handle "\x00"), no database API's handle
    "binary_junk": ("\x00\x01\x02\x7f\ufffd\ud800\udfff hub.load(\x00)", dict.fromkeys(HUBS, HALLUCINATION)),
    # the marker is there, so TorchHub parses too; SEG is "" and ""[2:-1] is "": hallucination (§2)
    "only_marker": ("", dict.fromkeys(HUBS, HALLUCINATION)),
    # SEG is " " (first api_call to api_provider), no ':' and no ')': " "[2:-1] is "": hallucination
    "markers_only": ("", dict.fromkeys(HUBS, HALLUCINATION)),
}


@pytest.mark.parametrize("hub", HUBS)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_texts_give_an_outcome(hub, name):
    cut, verdicts = HOSTILE_EXPECTED[name]
    want_cut = cut[hub] if isinstance(cut, dict) else cut
    result = scorer(hub).score_text(HOSTILE[name], 1)
    assert result.api_call == want_cut
    assert (result.gorilla, result.strict) == verdicts[hub]
    assert result.matched_index is None  # no database entry matched: nothing was scored by domain


def test_one_megabyte_response():
    text = ("api_call: torch.hub.load('facebookresearch/pytorchvideo', 'slow_r50') "
            + "x = f(a, [1, 2], {'k': 'v'})  # filler\n" * 28_000)
    assert len(text) > 1_000_000
    result = scorer("torchhub").score_text(text, 1)
    # No api_provider: the cut runs to the last ')' of the filler (semantics §2, TF-08). The
    # torch.hub.load call is the searched node of every TorchHub entry; database line 1
    # (facebookresearch/pytorchvideo, slow_r50, "Video Classification") is the first whose arguments
    # it holds, and q1 is a "Video Classification" question: gorilla correct. Strict: the first
    # loader call names q1's own gold (repo, model): correct.
    assert result.api_call.startswith("torch.hub.load(") and result.api_call.endswith("{'k': 'v'})")
    assert (result.gorilla, result.strict, result.matched_index) == ("correct", "correct", 0)


@pytest.mark.parametrize("hub", HUBS)
def test_missing_or_non_string_text_is_error(hub):
    sc = scorer(hub)
    for text in (None, 42, ["api_call"], {"text": "x"}):
        result = sc.score_text(text, 1)
        assert (result.api_call, result.gorilla, result.strict) == (None, "error", "error")


def test_score_counts_missing_text_in_denominator():
    result = scorer("torchhub").score([{"question_id": 1}, {"question_id": 2, "text": None}])
    assert result["n"] == 2 and result["gorilla"]["error_n"] == 2 and result["strict"]["error_n"] == 2


@pytest.mark.parametrize("qid", [0, -1, 187, 10**9, "1", 1.0, True, None])
def test_score_text_refuses_bad_question_id(qid):
    with pytest.raises(RatuneError, match="out of range"):
        scorer("torchhub").score_text("api_call: x(1) api_provider", qid)


def test_empty_response_list():
    result = scorer("torchhub").score([])
    assert result["n"] == 0 and result["gorilla"]["accuracy"] == 0.0


# ------------------------------------------------------------------ response files

def write(tmp_path, lines, name="r.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join(line if isinstance(line, bytes) else line.encode() for line in lines))
    return path


def ok(qid, text="api_call: x(1) api_provider"):
    return json.dumps({"question_id": qid, "text": text}) + "\n"


def test_load_responses_good_file_with_blank_lines_and_missing_text(tmp_path):
    path = write(tmp_path, [ok(1), "\n", "   \n", json.dumps({"question_id": 3}) + "\n",
                            json.dumps({"question_id": 2, "text": 7}) + "\n"])
    responses = load_responses(path, 186)
    assert [(r["question_id"], r["text"], r["line"]) for r in responses] == [
        (1, "api_call: x(1) api_provider", 1), (3, None, 4), (2, None, 5)]


@pytest.mark.parametrize("lines,line,field,what", [
    ([ok(1), json.dumps({"text": "x"}) + "\n"], 2, "question_id", "missing"),
    ([ok(1), ok("2")], 2, "question_id", "integer"),
    ([ok(1), ok(2.0)], 2, "question_id", "integer"),
    ([ok(1), ok(True)], 2, "question_id", "integer"),
    ([ok(1), ok(None)], 2, "question_id", "integer"),
    ([ok(1), "\n", ok(1)], 3, "question_id", "duplicate"),
    ([ok(0)], 1, "question_id", "out of range"),
    ([ok(1), ok(187)], 2, "question_id", "out of range"),
    ([ok(1), b"\xff\xfe\x00junk\n"], 2, None, "not UTF-8"),
    ([ok(1), b"\x00\x01\x02\x03\n"], 2, None, "not a JSON object"),
    ([ok(1), "[1, 2]\n"], 2, None, "not a JSON object"),
    ([ok(1), '{"question_id": 2, "text": "trunc'], 2, None, "not a JSON object"),
])
def test_load_responses_errors_name_the_line(tmp_path, lines, line, field, what):
    path = write(tmp_path, lines)
    with pytest.raises(InputError) as info:
        load_responses(path, 186)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert what in str(err) and f"{path}:{line}" in str(err)


def test_load_responses_missing_file(tmp_path):
    with pytest.raises(RatuneError, match="not found"):
        load_responses(tmp_path / "nope.jsonl")


# ------------------------------------------------------------------ the wrong hub

def released(hub, mode="FT", setting="0_shot"):
    return APIBENCH / "responses" / f"response_{hub}_Gorilla_{mode}_{setting}.jsonl"


@pytest.mark.parametrize("file_hub", HUBS)
@pytest.mark.parametrize("setting", ["0_shot", "oracle"])
def test_hub_check_on_released_files(file_hub, setting):
    for mode in ("FT", "RT"):
        responses = load_responses(released(file_hub, mode, setting))
        counts = check_hub_matches(file_hub, responses)  # the right hub is accepted
        assert counts == hub_evidence(responses)
        for other in HUBS:
            if other != file_hub:
                with pytest.raises(RatuneError, match=f"looks like a {file_hub} response file"):
                    check_hub_matches(other, responses, scorer(other))


def test_hub_check_message_mentions_question_range():
    responses = load_responses(released("huggingface"))
    with pytest.raises(RatuneError, match="question_ids go up to 911 while torchhub has 186"):
        check_hub_matches("torchhub", responses, scorer("torchhub"))


def test_hub_check_tolerates_a_few_foreign_calls():
    responses = [{"question_id": i, "text": "AutoModel.from_pretrained('x')"} for i in (1, 2)]
    responses += [{"question_id": 3, "text": "torch.hub.load('a', 'b')"}]
    assert check_hub_matches("torchhub", responses)["huggingface"] == 2


# ------------------------------------------------------------------ command line

def args(**kw):
    parser = add_score_arguments(argparse.ArgumentParser())
    argv = []
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return parser.parse_args(argv)


def test_cli_json(capsys):
    assert cli_score(args(hub="torchhub", responses=released("torchhub"), apibench=APIBENCH, json=True)) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    obj = json.loads(out)
    assert set(obj) == {"hub", "n", "gorilla", "strict", "parser"}
    assert (obj["gorilla"]["correct_n"], obj["gorilla"]["hallucination_n"], obj["gorilla"]["error_n"]) == (141, 30, 15)
    assert obj["parser"] == {"tree-sitter": "0.20.1", "tree-sitter-languages": "1.9.1"}


def test_cli_metric_and_table(capsys):
    cli_score(args(hub="torchhub", responses=released("torchhub"), metric="gorilla", json=True))
    assert "strict" not in json.loads(capsys.readouterr().out)
    cli_score(args(hub="torchhub", responses=released("torchhub")))
    table = capsys.readouterr().out
    assert "gorilla" in table and "strict" in table and "141 ( 75.81%)" in table
    assert "tree-sitter 0.20.1" in table


def test_cli_namespace_defaults(capsys):
    # The CLI owner's Namespace may lack metric/no_hub_check; apibench None means the default.
    ns = argparse.Namespace(hub="torchhub", responses=str(released("torchhub")), apibench=None,
                            metric="both", json=True)
    assert cli_score(ns) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 186


def test_cli_refuses_wrong_hub_and_allows_override(capsys):
    with pytest.raises(RatuneError, match="--hub huggingface"):
        cli_score(args(hub="torchhub", responses=released("huggingface")))
    # With the override the out-of-range ids are still an input error naming the line.
    with pytest.raises(InputError, match="out of range 1..186"):
        cli_score(args(hub="torchhub", responses=released("huggingface"), no_hub_check=True))


def test_cli_user_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):  # the flag's type refuses a missing file when it is parsed
        args(hub="torchhub", responses=tmp_path / "missing.jsonl")
    assert "missing.jsonl: no such file or folder" in capsys.readouterr().err
    with pytest.raises(RatuneError, match="not found"):  # and so does cli_score, called without the parser
        cli_score(argparse.Namespace(hub="torchhub", responses=tmp_path / "missing.jsonl", apibench=None,
                                     metric="both", json=False))
    with pytest.raises(RatuneError, match="unknown hub"):
        cli_score(argparse.Namespace(hub="pypi", responses="x", apibench=None, metric="both", json=False))
    with pytest.raises(RatuneError, match="APIBench folder not found"):
        cli_score(args(hub="torchhub", responses=released("torchhub"), apibench=tmp_path))
    bad = write(tmp_path, [ok(1), b"\x80\x81\n"])
    with pytest.raises(InputError, match=r"r\.jsonl:2"):
        cli_score(args(hub="torchhub", responses=bad))
