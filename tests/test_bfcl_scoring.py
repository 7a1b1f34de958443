"""BFCL's scorer path: the loader of BFCL's shipped data and the answer-key converter
(sources/bfcl.py), and the bridge to BFCL's own decoder and checker in .bfcl-venv (eval/bfcl.py,
eval/bfcl_worker.py), proven on the real data: converted possible answers score 100 % but for four
entries no answer can pass, planted wrong answers are counted wrong, and ``bfcl evaluate`` run by
hand agrees entry by entry. Tests marked ``bfcl`` need .bfcl-venv (make bfcl-setup; CI builds it)."""

from __future__ import annotations

import copy
import json
import os
import subprocess

import pytest

from ratune.errors import InputError, RatuneError
from ratune.eval.bfcl import (AST_CATEGORIES, BFCL_MODEL, BfclScores, category_metrics, score_texts,
                              write_result_files)
from ratune.eval.stats import wilson_interval
from ratune.sources.bfcl import BFCL_EVAL_VERSION, bfcl_data_dir, bfcl_venv, load_bfcl, possible_answer_text

#: Entries per category in bfcl-eval 2026.3.23 (DESIGN.md, "Function calling and BFCL").
SIZES = {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "live_simple": 258,
         "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24, "irrelevance": 240,
         "live_irrelevance": 884, "live_relevance": 16}
#: The converted possible answers BFCL's checker rejects, each because no answer can pass it:
#: required parameters whose accepted values are [] (106, 112), a parameter the function does not
#: have and no "" to allow leaving it out (862), a required parameter the key does not name (964).
UNANSWERABLE = {"live_simple": [["live_simple_106-63-0", "simple_function_checker:missing_required"],
                                ["live_simple_112-68-0", "simple_function_checker:missing_required"]],
                "live_multiple": [["live_multiple_862-181-3", "simple_function_checker:unexpected_param"],
                                  ["live_multiple_964-207-0", "simple_function_checker:missing_required"]]}
PROSE = "I am sorry, I cannot help with that using the functions I have."


# ---- the converter, on hand-written keys (no BFCL needed)

def _fn(name, properties, required=()):
    return {"name": name, "parameters": {"type": "dict", "properties": properties, "required": list(required)}}


def test_converter_takes_the_first_value_and_leaves_optional_parameters_out():
    # simple_python_0's key and schema: unit accepts "" (may be left out) and is not required
    fn = _fn("calculate_triangle_area", {"base": {"type": "integer"}, "height": {"type": "integer"},
                                         "unit": {"type": "string"}}, ["base", "height"])
    key = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    assert possible_answer_text(key, [fn]) == "[calculate_triangle_area(base=10, height=5)]"
    assert possible_answer_text([], [fn]) == "[]"


def test_converter_writes_python_literals():
    fns = [_fn("a.f", {"flag": {"type": "boolean"}, "none": {"type": "any"}, "xs": {"type": "array"},
                       "s": {"type": "string"}, "x": {"type": "float"}}), _fn("g", {})]
    key = [{"a.f": {"flag": [False, True], "none": [None], "xs": [[1, "b", [2.5, -3]]], "s": ["it's"], "x": [-0.5]}},
           {"g": {}}]
    assert possible_answer_text(key, fns) == "[a.f(flag=False, none=None, xs=[1, 'b', [2.5, -3]], s=\"it's\", x=-0.5), g()]"


def test_converter_gives_a_required_parameter_even_where_empty_is_accepted():
    """ast_checker refuses a missing required parameter before it looks at "" (simple_python_17,
    parallel_88, live_multiple_507-149-4 have such keys); [] accepts nothing, so it is left out."""
    fn = _fn("f", {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "array"}}, ["a", "b", "c"])
    assert possible_answer_text([{"f": {"a": ["", 3], "b": [""], "c": []}}], [fn]) == "[f(a=3, b='')]"


def test_converter_reads_dict_parameters_in_answer_key_form():
    fn = _fn("f", {"body": {"type": "dict"}, "conds": {"type": "array", "items": {"type": "dict"}},
                   "raw": {"type": "any"}})
    key = [{"f": {"body": ["", {"mode": ["COOL", "cool"], "temp": ["", 22], "on": [True]}],
                  "conds": [[{"field": ["age"], "op": [">"]}, {"field": ["job"], "op": ["=", "=="]}]],
                  "raw": [{"k": ["v"]}]}}]
    assert possible_answer_text(key, [fn]) == ("[f(conds=[{'field': 'age', 'op': '>'}, {'field': 'job', 'op': '='}], "
                                               "raw={'k': ['v']})]")  # body: "" accepted, left out
    key[0]["f"]["body"] = [{"mode": ["COOL", "cool"], "temp": ["", 22], "on": [True]}]
    assert possible_answer_text(key, [fn]).startswith("[f(body={'mode': 'COOL', 'on': True}, conds=")


def test_converter_refuses_a_function_the_entry_does_not_offer():
    with pytest.raises(ValueError, match="'g', which is not among the entry's functions"):
        possible_answer_text([{"g": {}}], [_fn("f", {})])


# ---- the loader's errors, on hand-written files

def _write(folder, category, questions, answers=None):
    (folder / "possible_answer").mkdir(parents=True, exist_ok=True)
    (folder / f"BFCL_v4_{category}.json").write_text("".join(q + "\n" for q in questions))
    if answers is not None:
        (folder / "possible_answer" / f"BFCL_v4_{category}.json").write_text("".join(a + "\n" for a in answers))
    return folder / f"BFCL_v4_{category}.json", folder / "possible_answer" / f"BFCL_v4_{category}.json"


Q0 = json.dumps({"id": "c_0", "question": [[{"role": "user", "content": "hi"}]],
                 "function": [_fn("f", {"a": {"type": "integer"}}, ["a"])]})
A0 = json.dumps({"id": "c_0", "ground_truth": [{"f": {"a": [1]}}]})


def test_loader_joins_questions_and_answers_by_id(tmp_path):
    _write(tmp_path, "c", [Q0], [A0])
    (entry,) = load_bfcl(tmp_path, "c")
    assert (entry.id, entry.category, entry.line, entry.possible_answer) == ("c_0", "c", 1, [{"f": {"a": [1]}}])
    _write(tmp_path, "d", [Q0])  # no answer key: a relevance category
    assert load_bfcl(tmp_path, "d")[0].possible_answer is None


@pytest.mark.parametrize("questions, answers, message", [
    ([Q0, "{not json"], [A0], "BFCL_v4_c.json:2: not a JSON object"),
    ([json.dumps({"id": "c_0", "question": []})], [A0], "BFCL_v4_c.json:1: field 'function': expected a list of function schemas"),
    ([json.dumps({"id": "c_0", "question": [], "function": [{"name": ""}]})], [A0],
     "BFCL_v4_c.json:1: field 'function[0].name': missing or not a non-empty string"),
    ([Q0, Q0], [A0], "BFCL_v4_c.json:2: field 'id': duplicate id 'c_0'"),
    ([Q0], [A0, json.dumps({"id": "c_9", "ground_truth": []})],
     "possible_answer/BFCL_v4_c.json:2: field 'id': no question with id 'c_9' in BFCL_v4_c.json"),
    ([Q0], [json.dumps({"id": "c_0", "ground_truth": [{"g": {"a": [1]}}]})],
     "possible_answer/BFCL_v4_c.json:1: field 'ground_truth[0]': calls 'g', which the entry does not offer"),
    ([Q0], [json.dumps({"id": "c_0", "ground_truth": [{"f": {"a": 1}}]})],
     "possible_answer/BFCL_v4_c.json:1: field 'ground_truth[0].f.a': expected a list of accepted values"),
    ([Q0, Q0.replace("c_0", "c_1")], [A0],
     "possible_answer/BFCL_v4_c.json: field 'id': no possible answer for 'c_1' (BFCL_v4_c.json line 2)"),
])
def test_loader_names_file_line_and_field(tmp_path, questions, answers, message):
    _write(tmp_path, "c", questions, answers)
    with pytest.raises(InputError) as err:
        load_bfcl(tmp_path, "c")
    assert str(err.value).startswith(f"{tmp_path}/{message}")


def test_a_missing_bfcl_venv_is_one_line_saying_what_to_run(tmp_path):
    with pytest.raises(RatuneError, match=r"^BFCL's virtual environment not found \(tried .*nowhere\): run make bfcl-setup"):
        score_texts([("simple_python", "simple_python_0", "[]")], venv=tmp_path / "nowhere")
    with pytest.raises(RatuneError, match="BFCL category 'simple_java' is not scored here"):
        score_texts([("simple_java", "simple_java_0", "[]")], venv=tmp_path / "nowhere")


def test_result_files_refuse_an_entry_given_twice(tmp_path):
    with pytest.raises(RatuneError, match="BFCL result files: irrelevance entry 'irrelevance_0' given twice"):
        write_result_files(tmp_path, [("irrelevance", "irrelevance_0", "[]"), ("irrelevance", "irrelevance_0", "[f()]")])
    assert not (tmp_path / "result").exists()


# ---- on the real data, through BFCL's checker (one worker process for the whole batch)

def _planted(entry, kind):
    """The entry's possible answer made wrong: its first call without its first required parameter
    that the key names, or calling a function that does not exist."""
    key = copy.deepcopy(entry.possible_answer)
    (name, params), = key[0].items()
    if kind == "unknown_function":
        key[0] = {"no_such_function": params}
        return possible_answer_text(key, entry.functions + [{"name": "no_such_function", "parameters": {}}])
    required = next(fn for fn in entry.functions if fn["name"] == name)["parameters"].get("required", [])
    del params[next(p for p in required if p in params)]
    return possible_answer_text(key, entry.functions)


def _unanswerable_variant(entry):
    """Another try at each unanswerable entry (UNANSWERABLE), also rejected."""
    key = copy.deepcopy(entry.possible_answer)
    params = key[0][next(iter(key[0]))]
    if entry.id.startswith("live_simple"):  # give the [] parameters an empty list
        params.update({p: [[]] for p, v in params.items() if v == []})
    elif entry.id == "live_multiple_862-181-3":
        del params["journey_start_time"]
    else:
        params["statement"] = params.pop("question")
    return possible_answer_text(key, entry.functions)


def _call_text(entry):
    return f"[{entry.functions[0]['name'] if entry.functions else 'get_weather'}()]"


@pytest.fixture(scope="module")
def real():
    """The real data (``{category: entries}``), the scores of one batch over all of it, and its rows
    ``[(tag, category, id, text, verdict)]``."""
    data = bfcl_data_dir()
    entries = {c: load_bfcl(data, c) for c in SIZES}
    batch = []  # (tag, category, id, text)
    for c in AST_CATEGORIES:
        batch += [("converted", c, e.id, possible_answer_text(e.possible_answer, e.functions)) for e in entries[c]]
        first = entries[c][0]
        batch += [("missing_required", c, first.id, _planted(first, "missing_required")),
                  ("unknown_function", c, first.id, _planted(first, "unknown_function")),
                  ("prose", c, first.id, PROSE)]
    by_id = {e.id: e for c in ("live_simple", "live_multiple") for e in entries[c]}
    batch += [("variant", e.split("_")[0] + "_" + e.split("_")[1], e, _unanswerable_variant(by_id[e]))
              for e, _ in UNANSWERABLE["live_simple"] + UNANSWERABLE["live_multiple"]]
    batch += [("underscored", "simple_python", "simple_python_1", "[math_factorial(number=5)]")]
    for c in ("irrelevance", "live_irrelevance", "live_relevance"):
        for e in entries[c]:
            batch += [("empty", c, e.id, "[]"), ("call", c, e.id, _call_text(e)), ("prose", c, e.id, PROSE)]
    scores = score_texts([(c, i, t) for _, c, i, t in batch])
    assert len(scores.verdicts) == len(batch) == 2351 + 8 * 3 + 4 + 1 + 3 * (240 + 884 + 16)
    assert [(v.category, v.id) for v in scores.verdicts] == [(c, i) for _, c, i, _ in batch]
    return entries, scores, [(tag, c, i, t, v) for (tag, c, i, t), v in zip(batch, scores.verdicts)]


def _subset(scores, rows, tag):
    return BfclScores(scores.bfcl_version, scores.model, [v for t, *_, v in rows if t == tag])


@pytest.mark.bfcl
def test_the_shipped_data_loads_with_its_sizes(real):
    entries, scores, _ = real
    assert {c: len(es) for c, es in entries.items()} == SIZES
    assert all(e.possible_answer for c in AST_CATEGORIES for e in entries[c])
    assert all(e.possible_answer is None for c in ("irrelevance", "live_irrelevance", "live_relevance")
               for e in entries[c])
    assert entries["simple_python"][1].possible_answer == [{"math.factorial": {"number": [5]}}]
    assert (scores.bfcl_version, scores.model) == (BFCL_EVAL_VERSION, BFCL_MODEL)


@pytest.mark.bfcl
def test_converted_possible_answers_score_100_percent_but_for_the_unanswerable(real):
    _, scores, rows = real
    metrics = category_metrics(_subset(scores, rows, "converted"))
    dropped = {c: [[v.id, v.error_type] for t, cat, *_, v in rows if t == "converted" and cat == c and not v.correct]
               for c in AST_CATEGORIES}
    assert {c: d for c, d in dropped.items() if d} == UNANSWERABLE
    assert {c: (m["n"], m["correct"]) for c, m in metrics.items()} == {
        "simple_python": (400, 400), "multiple": (200, 200), "parallel": (200, 200), "parallel_multiple": (200, 200),
        "live_simple": (258, 256), "live_multiple": (1053, 1051), "live_parallel": (16, 16),
        "live_parallel_multiple": (24, 24)}
    assert metrics["simple_python"] == {"n": 400, "correct": 400, "accuracy": 1.0,
                                        "accuracy_ci": list(wilson_interval(400, 400)), "call_rate": 1.0,
                                        "format_adherence": 1.0, "bfcl_version": "2026.3.23", "bfcl_model": BFCL_MODEL}
    assert metrics["live_simple"]["accuracy"] == 256 / 258
    # every entry decodes to as many calls as its key holds
    assert all(v.decoded and v.calls == len(e.possible_answer)
               for (t, c, i, _, v), e in zip([r for r in rows if r[0] == "converted"],
                                             [e for c in AST_CATEGORIES for e in real[0][c]]))
    # another try at each unanswerable entry fails too
    variants = [(v.id, v.correct, v.error_type) for t, *_, v in rows if t == "variant"]
    assert variants == [("live_simple_106-63-0", False, "type_error:simple"),
                        ("live_simple_112-68-0", False, "type_error:simple"),
                        ("live_multiple_862-181-3", False, "simple_function_checker:missing_optional"),
                        ("live_multiple_964-207-0", False, "simple_function_checker:unexpected_param")]


@pytest.mark.bfcl
def test_planted_wrong_answers_are_counted_wrong(real):
    _, _, rows = real
    planted = {(t, c): (v.correct, v.decoded, v.calls, v.error_type) for t, c, _, _, v in rows
               if t in ("missing_required", "unknown_function")}
    no_order = "parallel_function_checker_no_order:cannot_find_match"
    expected = {}
    for c in AST_CATEGORIES:
        parallel = "parallel" in c
        calls = {"parallel": 2, "parallel_multiple": 2, "live_parallel": 2, "live_parallel_multiple": 2}.get(c, 1)
        expected[("missing_required", c)] = (False, True, calls, no_order if parallel else
                                             "simple_function_checker:missing_required")
        expected[("unknown_function", c)] = (False, True, calls, no_order if parallel else
                                             "simple_function_checker:wrong_func_name")
    assert planted == expected


@pytest.mark.bfcl
def test_a_dotted_function_name_scores_correct_as_written(real):
    entries, _, rows = real
    converted = {i: (t, v) for tag, c, i, t, v in rows if tag == "converted"}
    text, verdict = converted["simple_python_1"]
    assert (text, verdict.correct) == ("[math.factorial(number=5)]", True)
    dotted = {c: [converted[e.id][1].correct for e in entries[c] if any("." in next(iter(call)) for call in e.possible_answer)]
              for c in AST_CATEGORIES}
    assert {c: (len(d), sum(d)) for c, d in dotted.items()} == {
        "simple_python": (167, 167), "multiple": (123, 123), "parallel": (85, 85), "parallel_multiple": (154, 154),
        "live_simple": (77, 77), "live_multiple": (123, 123), "live_parallel": (1, 1), "live_parallel_multiple": (5, 5)}
    (underscored,) = [v for tag, *_, v in rows if tag == "underscored"]
    assert (underscored.correct, underscored.error_type) == (False, "simple_function_checker:wrong_func_name")


@pytest.mark.bfcl
def test_irrelevance_no_call_is_correct_and_a_call_is_wrong(real):
    _, scores, rows = real
    outcome = {}
    for tag in ("empty", "call", "prose"):
        m = category_metrics(_subset(scores, rows, tag))
        outcome[tag] = {c: (m[c]["n"], m[c]["correct"], m[c]["call_rate"], m[c]["format_adherence"])
                        for c in ("irrelevance", "live_irrelevance", "live_relevance")}
    assert outcome == {
        "empty": {"irrelevance": (240, 240, 0.0, 1.0), "live_irrelevance": (884, 884, 0.0, 1.0),
                  "live_relevance": (16, 0, 0.0, 1.0)},
        "call": {"irrelevance": (240, 0, 1.0, 1.0), "live_irrelevance": (884, 0, 1.0, 1.0),
                 "live_relevance": (16, 16, 1.0, 1.0)},
        "prose": {"irrelevance": (240, 240, 0.0, 0.0), "live_irrelevance": (884, 884, 0.0, 0.0),
                  "live_relevance": (16, 0, 0.0, 0.0)},
    }
    (wrong,) = {v.error_type for t, c, *_, v in rows if t == "call" and c == "irrelevance"}
    assert wrong == "irrelevance_error:decoder_success"


@pytest.mark.bfcl
def test_prose_in_an_ast_category_is_wrong_and_not_adherent(real):
    _, _, rows = real
    prose = {c: (v.correct, v.decoded, v.calls, v.error_type) for t, c, *_, v in rows
             if t == "prose" and c in AST_CATEGORIES}
    assert prose == {c: (False, False, 0, "ast_decoder:decoder_failed") for c in AST_CATEGORIES}


@pytest.mark.bfcl
def test_an_id_bfcl_does_not_have_is_one_line():
    with pytest.raises(RatuneError, match=r"BFCL's checker failed .*: bfcl_worker: ValueError: no entry "
                                          r"'simple_python_9999' in BFCL's simple_python data$"):
        score_texts([("simple_python", "simple_python_9999", "[]")])


@pytest.mark.bfcl
def test_bfcl_evaluate_by_hand_agrees_with_the_bridge(real, tmp_path):
    """Result files written by write_result_files, scored by BFCL's own CLI (offline, on a partial
    set), give the same verdict per entry as the bridge, planted wrong answers included."""
    entries, _, _ = real
    sp, irr = entries["simple_python"][:5], entries["irrelevance"][:3]
    items = [("simple_python", e.id, possible_answer_text(e.possible_answer, e.functions)) for e in sp]
    items[2] = ("simple_python", sp[2].id, _planted(sp[2], "missing_required"))
    items[4] = ("simple_python", sp[4].id, PROSE)
    items += [("irrelevance", irr[0].id, "[]"), ("irrelevance", irr[1].id, _call_text(irr[1])),
              ("irrelevance", irr[2].id, PROSE)]
    written = write_result_files(tmp_path, items)
    folder = tmp_path / "result" / "meta-llama_Llama-3.1-8B-Instruct"
    assert written == [folder / "non_live" / "BFCL_v4_simple_python_result.json",
                       folder / "non_live" / "BFCL_v4_irrelevance_result.json"]
    assert json.loads(written[1].read_text().splitlines()[1]) == {"id": "irrelevance_1", "result": _call_text(irr[1])}
    assert json.loads((folder / "ratune_bfcl.json").read_text()) == {"bfcl_version": "2026.3.23", "model": BFCL_MODEL}

    done = subprocess.run([str(bfcl_venv() / "bin" / "bfcl"), "evaluate", "--model", BFCL_MODEL, "--test-category",
                           "simple_python,irrelevance", "--partial-eval"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, BFCL_PROJECT_ROOT=str(tmp_path)), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    by_hand = {}
    for category in ("simple_python", "irrelevance"):
        header, *wrong = [json.loads(line) for line in
                          (tmp_path / "score" / folder.name / "non_live" / f"BFCL_v4_{category}_score.json").open()]
        by_hand[category] = (header["correct_count"], header["total_count"], {w["id"]: w["error_type"] for w in wrong})
    bridge = score_texts(items).verdicts
    assert by_hand == {c: (sum(v.correct for v in bridge if v.category == c), sum(v.category == c for v in bridge),
                           {v.id: v.error_type for v in bridge if v.category == c and not v.correct})
                       for c in ("simple_python", "irrelevance")}
    assert by_hand == {"simple_python": (3, 5, {"simple_python_2": "simple_function_checker:missing_required",
                                                "simple_python_4": "ast_decoder:decoder_failed"}),
                       "irrelevance": (2, 3, {"irrelevance_1": "irrelevance_error:decoder_success"})}
