"""The catalog scorer (ratune.catalog.scoring, docs/catalog_scoring.md), on a small hand-written
catalog: every verdict, identity and argument outcome below is worked out by hand from the
documents in CATALOG."""

from __future__ import annotations

import ast
import os

import pytest

from ratune.catalog.scoring import (MAX_CALL_CHARS, CatalogIndex, CatalogScorer, call_identity,
                                    extract_call_text)
from ratune.sources.apibench import Answer
from ratune.sources.prompt import format_answer
from ratune.errors import RatuneError


def arg(name, required, default=None, type_="string"):
    return {"name": name, "type": type_, "required": required, "default": default, "description": ""}


def doc(api_name, api_call, arguments=(), identifying=None, **extra):
    out = {"api_name": api_name, "api_call": api_call, "description": "", "domain": "default",
           "provider": "test", "arguments": list(arguments), "example_code": ""}
    if identifying is not None:
        out["identifying_arguments"] = identifying
    out.update(extra)
    return out


HUB_ARGS = [arg("repo_or_dir", True), arg("model", True), arg("pretrained", False, False, "bool")]

CATALOG = [
    # Default identity (no identifying arguments): callee + positional string literals = ().
    doc("petstore.list_pets", "petstore.list_pets(limit=10)",
        [arg("limit", True, type_="integer"), arg("tag", False, "all")], identifying=[]),
    doc("petstore.get_pet", "petstore.get_pet(pet_id=1)", [arg("pet_id", True, type_="integer")]),
    # One callee, two APIs, told apart by the repo and model arguments (keyword names).
    doc("hub.resnet18", "torch.hub.load('pytorch/vision', 'resnet18')", HUB_ARGS,
        identifying=["repo_or_dir", "model"]),
    doc("hub.alexnet", "torch.hub.load(repo_or_dir='pytorch/vision', model='alexnet', pretrained=True)",
        HUB_ARGS, identifying=["repo_or_dir", "model"]),
    # One callee, two APIs, told apart by a positional index.
    doc("s3.photos", "s3.bucket('photos')", [arg("name", True)], identifying=[0]),
    doc("s3.logs", "s3.bucket('logs')", [arg("name", True)], identifying=[0]),
    doc("json.dumps", "json.dumps(obj)", [arg("obj", True, type_=None), arg("indent", False, type_="int")]),
]


@pytest.fixture(scope="module")
def scorer() -> CatalogScorer:
    return CatalogScorer(CATALOG)


def answer(call: str) -> str:
    """A full five-field answer, as the model is trained to write it (sources/prompt.py)."""
    return format_answer(Answer(domain="default", api_call=call, api_provider="test",
                                explanation="Calls the API.", code=call))


def call_of(text: str) -> ast.Call:
    return ast.parse(text, mode="eval").body


# --------------------------------------------------------------------------------------------
# Identity.

def test_identity_keys_of_the_catalog():
    index = CatalogIndex(CATALOG)
    assert index.keys == {
        "petstore.list_pets": ("petstore.list_pets", ()),
        "petstore.get_pet": ("petstore.get_pet", ()),
        "hub.resnet18": ("torch.hub.load", ("pytorch/vision", "resnet18")),
        "hub.alexnet": ("torch.hub.load", ("pytorch/vision", "alexnet")),
        "s3.photos": ("s3.bucket", ("photos",)),
        "s3.logs": ("s3.bucket", ("logs",)),
        "json.dumps": ("json.dumps", ()),
    }


def test_default_rule_is_the_positional_string_literals():
    # 'a' and 'b' are positional str literals; x, 2 and the keyword 'c' are not counted.
    assert call_identity(call_of("pkg.mod.f('a', x, 2, 'b', k='c')"), None) == ("pkg.mod.f", ("a", "b"))
    assert call_identity(call_of("f()"), {"identifying_arguments": []}) == ("f", ())


def test_keyword_and_positional_forms_of_an_identifying_argument_agree():
    resnet = CATALOG[2]
    want = ("torch.hub.load", ("pytorch/vision", "resnet18"))
    for text in ("torch.hub.load('pytorch/vision', 'resnet18')",
                 "torch.hub.load(repo_or_dir='pytorch/vision', model='resnet18')",
                 "torch.hub.load(model='resnet18', repo_or_dir='pytorch/vision')",
                 "torch.hub.load('pytorch/vision', model='resnet18', pretrained=True)"):
        assert call_identity(call_of(text), resnet) == want, text
    # An index reads the keyword of the document argument at that index (s3.bucket: 0 = name).
    assert call_identity(call_of("s3.bucket(name='logs')"), CATALOG[5]) == ("s3.bucket", ("logs",))
    # Missing or non-literal identifying values are None.
    assert call_identity(call_of("torch.hub.load(repo, 'resnet18')"), resnet) == ("torch.hub.load", (None, "resnet18"))
    assert call_identity(call_of("torch.hub.load('pytorch/vision')"), resnet) == ("torch.hub.load", ("pytorch/vision", None))


def test_non_literal_strings_take_repr():
    document = {"arguments": [arg("n", True)], "identifying_arguments": ["n"]}
    assert call_identity(call_of("f(3)"), document) == ("f", ("3",))
    assert call_identity(call_of("f(n=-1.5)"), document) == ("f", ("-1.5",))
    assert call_identity(call_of("f(n=(1, 'a'))"), document) == ("f", ("(1, 'a')",))


@pytest.mark.parametrize("text", ["f()()", "x[0]()", "'s'.join(a)", "(lambda: 1)()", "a.b().c()"])
def test_a_callee_that_is_no_dotted_name_identifies_nothing(text):
    assert call_identity(call_of(text), None) is None
    assert CatalogIndex(CATALOG).identify(call_of(text)) == ()


# --------------------------------------------------------------------------------------------
# Verdicts and the argument score, hand-worked.

def test_right_api_other_argument_values(scorer):
    result = scorer.score_text(answer("pets = petstore.list_pets(limit=5, tag='all')"), "petstore.list_pets")
    assert result.verdict == "correct"
    assert result.api_call == "pets = petstore.list_pets(limit=5, tag='all')"
    assert result.named == ("petstore.list_pets",)
    assert result.required_present is True and result.missing == ()
    # The document's call fixes limit=10; the response gives 5.
    assert result.values_equal is False and result.mismatched == ("limit",)
    # With the instruction's own gold call (a pair's api_call) the same response is all right.
    same = scorer.score_text(answer("petstore.list_pets(limit=5, tag='all')"), "petstore.list_pets",
                             gold_call="petstore.list_pets(limit=5)")
    assert (same.verdict, same.values_equal, same.mismatched) == ("correct", True, ())


def test_right_api_missing_a_required_argument(scorer):
    result = scorer.score_text(answer("petstore.list_pets(tag='dogs')"), "petstore.list_pets")
    assert result.verdict == "correct"
    assert result.required_present is False and result.missing == ("limit",)
    # limit=10 of the gold call is absent, so it is also a mismatched value.
    assert result.values_equal is False and result.mismatched == ("limit",)


def test_positional_arguments_are_named_in_document_order(scorer):
    # limit is the first document argument, so the positional 10 is limit=10.
    result = scorer.score_text("petstore.list_pets(10, tag='cats')", "petstore.list_pets")
    assert (result.verdict, result.required_present, result.values_equal) == ("correct", True, True)
    assert result.mismatched == () and result.missing == ()
    result = scorer.score_text("petstore.list_pets(7)", "petstore.list_pets")
    assert (result.required_present, result.mismatched) == (True, ("limit",))
    # list_pets has the default identity rule and its own api_call gives no string literal, so a
    # positional string ('cats' as tag) does not change which API the call names.
    assert scorer.score_text("petstore.list_pets(10, 'cats')", "petstore.list_pets").verdict == "correct"


def test_values_are_compared_with_their_types(scorer):
    result = scorer.score_text("petstore.list_pets(limit=10.0)", "petstore.list_pets")
    assert (result.verdict, result.values_equal, result.mismatched) == ("correct", False, ("limit",))
    result = scorer.score_text("petstore.list_pets(limit=n)", "petstore.list_pets")  # not a literal
    assert (result.values_equal, result.mismatched) == (False, ("limit",))


def test_an_omitted_optional_argument_matches_its_document_default(scorer):
    gold = "petstore.list_pets(limit=10, tag='all')"  # tag's default is 'all'
    result = scorer.score_text("petstore.list_pets(limit=10)", "petstore.list_pets", gold_call=gold)
    assert (result.values_equal, result.mismatched) == (True, ())
    result = scorer.score_text("petstore.list_pets(limit=10)", "petstore.list_pets",
                               gold_call="petstore.list_pets(limit=10, tag='dogs')")
    assert (result.values_equal, result.mismatched) == (False, ("tag",))


def test_another_catalog_api_is_an_error(scorer):
    result = scorer.score_text(answer("petstore.get_pet(pet_id=3)"), "petstore.list_pets")
    assert (result.verdict, result.named, result.reason) == ("error", ("petstore.get_pet",), None)
    assert result.required_present is False and result.values_equal is False


def test_an_invented_api_is_a_hallucination(scorer):
    result = scorer.score_text(answer("petstore.delete_everything(confirm=True)"), "petstore.list_pets")
    assert (result.verdict, result.named, result.reason) == ("hallucination", (), None)


@pytest.mark.parametrize("text,reason", [
    (answer("petstore.list_pets(limit=10"), "unparseable"),
    ("Sorry, I cannot help with that.", "unparseable"),
    (answer("10"), "no_call"),
    ("", "no_call"),
])
def test_no_parsed_call_is_an_error(scorer, text, reason):
    result = scorer.score_text(text, "petstore.list_pets")
    assert (result.verdict, result.reason, result.named) == ("error", reason, ())


def test_shared_callee_told_apart_by_identifying_arguments(scorer):
    assert scorer.score_text("torch.hub.load('pytorch/vision', 'resnet18')", "hub.resnet18").verdict == "correct"
    assert scorer.score_text("torch.hub.load(model='resnet18', repo_or_dir='pytorch/vision')",
                             "hub.resnet18").verdict == "correct"
    wrong = scorer.score_text("torch.hub.load('pytorch/vision', 'alexnet')", "hub.resnet18")
    assert (wrong.verdict, wrong.named) == ("error", ("hub.alexnet",))
    assert scorer.score_text("torch.hub.load('pytorch/vision', 'resnet9000')", "hub.resnet18").verdict == "hallucination"
    # The positional index rule: s3.bucket(name='logs') is the logs API, keyword or positional.
    assert scorer.score_text("s3.bucket(name='logs')", "s3.logs").verdict == "correct"
    assert scorer.score_text("s3.bucket('logs')", "s3.photos").verdict == "error"


def test_alexnet_gold_pretrained_value(scorer):
    # alexnet's document call fixes pretrained=True (a literal), so omitting it mismatches (the
    # document default is False, not the gold value).
    result = scorer.score_text("torch.hub.load('pytorch/vision', 'alexnet')", "hub.alexnet")
    assert (result.verdict, result.required_present, result.mismatched) == ("correct", True, ("pretrained",))


def test_some_call_in_the_answer_names_the_gold(scorer):
    result = scorer.score_text("json.dumps(petstore.list_pets(limit=10))", "petstore.list_pets")
    assert result.verdict == "correct"
    assert result.named == ("json.dumps", "petstore.list_pets")  # outer call first
    assert scorer.score_text("json.dumps(petstore.list_pets(limit=10))", "json.dumps").verdict == "correct"


def test_default_rule_reads_the_documents_own_string_positions(scorer):
    # json.dumps(obj) gives no string literal, so its callee alone identifies it: a response's
    # positional string literal ('hello' as the object to serialise) does not make it another API.
    assert scorer.score_text("json.dumps(data, indent=2)", "json.dumps").verdict == "correct"
    assert scorer.score_text("json.dumps('hello')", "json.dumps").verdict == "correct"
    from ratune.catalog.scoring import default_identifying

    assert default_identifying({"api_call": "torch.hub.load('pytorch/vision', 'resnet18', pretrained=True)"}) == [0, 1]
    assert default_identifying({"api_call": "json.dumps(obj)"}) == []
    assert default_identifying({"api_call": "x", "identifying_arguments": ["model"]}) == ["model"]
    assert default_identifying(None) is None and default_identifying({"api_call": "not a call"}) is None


def test_cut_of_the_api_call_field():
    assert extract_call_text("<<<domain>>>: d\n<<<api_call>>>:  a.b(1)\n<<<api_provider>>>: p") == "a.b(1)"
    assert extract_call_text("<<<api_call>>>: a.b(1)<<<api_provider>>>: p") == "a.b(1)"
    assert extract_call_text("  a.b(1)\n") == "a.b(1)"
    assert extract_call_text(None) is None


def test_trailing_marker_remains_and_quotes_are_stripped(scorer):
    assert scorer.score_text("<<<api_call>>>: `petstore.list_pets(limit=10)`,", "petstore.list_pets").verdict == "correct"
    # Prose after the call's last ')' is cut away.
    result = scorer.score_text("petstore.list_pets(limit=10) lists ten pets", "petstore.list_pets")
    assert (result.verdict, result.values_equal) == ("correct", True)


def test_aggregate_percentages_worked_by_hand(scorer):
    responses = [
        {"text": answer("petstore.list_pets(limit=10)"), "api_name": "petstore.list_pets"},  # correct, args ok
        {"text": "petstore.list_pets(tag='x')", "api_name": "petstore.list_pets"},  # correct, limit missing
        {"text": "petstore.get_pet(pet_id=1)", "api_name": "petstore.list_pets"},  # error (other API)
        {"text": "petstore.fly(1)", "api_name": "petstore.list_pets"},  # hallucination
        {"text": None, "api_name": "hub.resnet18"},  # error (no text)
    ]
    out = scorer.score(responses)
    assert out["n"] == 5
    assert out["counts"] == {"correct": 2, "error": 2, "hallucination": 1,
                             "args_required_present": 1, "args_values_equal": 1}
    assert out["percent"] == {"correct": 40.0, "error": 40.0, "hallucination": 20.0,
                              "args_required_present": 20.0, "args_values_equal": 20.0}
    assert [r["verdict"] for r in out["per_response"]] == ["correct", "correct", "error", "hallucination", "error"]
    assert out["per_response"][1]["missing"] == ["limit"]
    assert scorer.score([])["percent"]["correct"] == 0.0


def test_pair_gold_call_in_aggregate(scorer):
    out = scorer.score([{"text": "petstore.list_pets(limit=3)", "api_name": "petstore.list_pets",
                         "api_call": "petstore.list_pets(limit=3)"}])
    assert out["counts"]["args_values_equal"] == 1


# --------------------------------------------------------------------------------------------
# Refusals.

def test_unknown_gold_and_bad_gold_call_are_refused(scorer):
    with pytest.raises(RatuneError, match="'petstore.nope' is not in the catalog"):
        scorer.score_text("petstore.list_pets(limit=1)", "petstore.nope")
    with pytest.raises(RatuneError, match="does not identify 'hub.resnet18'"):
        scorer.score_text("x", "hub.resnet18", gold_call="torch.hub.load('pytorch/vision', 'alexnet')")
    with pytest.raises(RatuneError, match="a Constant expression, not a call"):
        scorer.score_text("x", "hub.resnet18", gold_call="42")


def test_bad_catalog_documents_are_refused():
    with pytest.raises(RatuneError, match="api_name 'a.f' repeated"):
        CatalogIndex([doc("a.f", "a.f()"), doc("a.f", "a.g()")])
    with pytest.raises(RatuneError, match=r"catalog API 'a.f': api_call 'a.f\(': not a Python expression"):
        CatalogIndex([doc("a.f", "a.f(")])
    with pytest.raises(RatuneError, match="callee is not a dotted name"):
        CatalogIndex([doc("a.f", "a()()")])
    with pytest.raises(RatuneError, match=r"a BinOp expression, not a call"):
        CatalogIndex([doc("a.f", "1 + a.f()")])
    with pytest.raises(RatuneError, match="catalog document 2: api_name missing"):
        CatalogIndex([doc("a.f", "a.f()"), {"api_call": "a.g()"}])


# --------------------------------------------------------------------------------------------
# Hostile input: each gets a defined verdict, nothing raises, nothing runs.

def test_very_long_text_is_capped(scorer):
    text = "<<<api_call>>>: petstore.list_pets(limit=10)  # " + "x" * 1_000_000
    result = scorer.score_text(text, "petstore.list_pets")
    assert result.truncated is True and len(result.api_call) == MAX_CALL_CHARS
    assert result.verdict == "correct"
    # A call that only closes past the cap is cut there and does not parse.
    long_call = "petstore.list_pets(limit=10, tag='" + "y" * MAX_CALL_CHARS + "')"
    result = scorer.score_text(long_call, "petstore.list_pets")
    assert (result.verdict, result.reason, result.truncated) == ("error", "unparseable", True)


@pytest.mark.parametrize("text", [
    "f(" + "-" * 5000 + "1)",  # MemoryError / RecursionError in the parser
    "a" + ".b" * 3000 + "()",  # RecursionError during ast construction
    "+".join(["1"] * 4000),
    "f(" * 3000,  # too many nested parentheses (SyntaxError)
])
def test_deeply_nested_expressions_are_unparseable_errors(scorer, text):
    assert len(text) <= MAX_CALL_CHARS
    result = scorer.score_text(text, "petstore.list_pets")
    assert (result.verdict, result.reason) == ("error", "unparseable")


def test_deep_but_parseable_attribute_chain_needs_no_recursion(scorer):
    # 1,500 attributes parse; the dotted name is built iteratively and names no catalog API.
    result = scorer.score_text("a" + ".b" * 1500 + "()", "petstore.list_pets")
    assert (result.verdict, result.reason) == ("hallucination", None)


def test_null_bytes(scorer):
    result = scorer.score_text("petstore.list_pets(lim\x00it=10)", "petstore.list_pets")
    assert (result.verdict, result.reason) == ("error", "unparseable")
    # A null byte after the call's last ')' is cut away with the rest.
    assert scorer.score_text("petstore.list_pets(limit=10)\x00", "petstore.list_pets").verdict == "correct"


@pytest.mark.parametrize("text", [None, 42, b"petstore.list_pets(limit=10)", ["petstore.list_pets(limit=10)"]])
def test_non_string_input(scorer, text):
    result = scorer.score_text(text, "petstore.list_pets")
    assert (result.verdict, result.reason, result.api_call) == ("error", "no_text", None)


def test_import_system_call_is_only_parsed(scorer, monkeypatch):
    def forbidden(*args, **kwargs):  # pragma: no cover - must never run
        raise AssertionError("os.system was called")

    monkeypatch.setattr(os, "system", forbidden)
    result = scorer.score_text(answer("__import__('os').system('x')"), "petstore.list_pets")
    # The outer callee (a call's attribute) is no dotted name; the inner __import__('os') has key
    # ('__import__', ('os',)), which no document has.
    assert (result.verdict, result.named, result.reason) == ("hallucination", (), None)
    index = CatalogIndex(CATALOG)
    inner = call_of("__import__('os').system('x')").func.value
    assert call_identity(inner, None) == ("__import__", ("os",))
    assert index.identify(inner) == ()
