"""User-brought instruction pairs (ratune.catalog.pairs): validation against a hand-written
catalog, and the API-stratified seeded split with its leakage check, worked out by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from ratune.catalog.pairs import Pair, PairLeak, load_pairs, split_pairs
from ratune.errors import InputError, RatuneError


def doc(api_name, api_call, arguments=(), identifying=None):
    out = {"api_name": api_name, "api_call": api_call, "description": "", "domain": "pets",
           "provider": "petstore", "arguments": [
               {"name": a, "type": None, "required": True, "default": None, "description": ""}
               for a in arguments], "example_code": ""}
    if identifying is not None:
        out["identifying_arguments"] = identifying
    return out


CATALOG = [
    doc("petstore.list_pets", "petstore.list_pets(limit=10)", ["limit"]),
    doc("petstore.get_pet", "petstore.get_pet(pet_id=1)", ["pet_id"]),
    doc("petstore.delete_pet", "petstore.delete_pet(pet_id=1)", ["pet_id"]),
    doc("hub.resnet18", "torch.hub.load('pytorch/vision', 'resnet18')", ["repo_or_dir", "model"],
        identifying=["repo_or_dir", "model"]),
    doc("hub.alexnet", "torch.hub.load('pytorch/vision', 'alexnet')", ["repo_or_dir", "model"],
        identifying=["repo_or_dir", "model"]),
]


def write(tmp_path, lines, name="pairs.jsonl"):
    path = tmp_path / name
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# load_pairs


def test_good_file_loads_with_defaults(tmp_path):
    path = write(tmp_path, [
        {"instruction": "  Show me ten pets  ", "api_name": "petstore.list_pets"},
        "",
        {"instruction": "Fetch pet number 7", "api_name": "petstore.get_pet",
         "api_call": " petstore.get_pet(7) ", "explanation": "Gets pet 7.", "code": "petstore.get_pet(7)"},
        {"instruction": "Load ResNet-18", "api_name": "hub.resnet18",
         "api_call": "torch.hub.load(model='resnet18', repo_or_dir='pytorch/vision', pretrained=True)"},
    ])
    pairs = load_pairs(path, CATALOG)
    assert pairs == [
        Pair("Show me ten pets", "petstore.list_pets", "petstore.list_pets(limit=10)", None, None, str(path), 1),
        Pair("Fetch pet number 7", "petstore.get_pet", "petstore.get_pet(7)", "Gets pet 7.",
             "petstore.get_pet(7)", str(path), 3),
        Pair("Load ResNet-18", "hub.resnet18",
             "torch.hub.load(model='resnet18', repo_or_dir='pytorch/vision', pretrained=True)", None, None,
             str(path), 4),
    ]


def test_unknown_api_name_names_line_and_suggests(tmp_path):
    path = write(tmp_path, [{"instruction": "Show pets", "api_name": "petstore.list_pets"},
                            {"instruction": "Show more pets", "api_name": "petstore.list_pet"}])
    with pytest.raises(InputError) as info:
        load_pairs(path, CATALOG)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, "api_name")
    assert str(err).startswith(f"{path}:2: field 'api_name': unknown API 'petstore.list_pet'; did you mean "
                               "'petstore.list_pets'")
    path = write(tmp_path, [{"instruction": "Show pets", "api_name": "zzz"}], "far.jsonl")
    with pytest.raises(InputError, match=r"far.jsonl:1: field 'api_name': unknown API 'zzz' \(the catalog has 5 APIs\)"):
        load_pairs(path, CATALOG)


@pytest.mark.parametrize("line,message", [
    ({"instruction": "   ", "api_name": "petstore.list_pets"}, "field 'instruction': empty"),
    ({"instruction": "", "api_name": "petstore.list_pets"}, "field 'instruction': empty"),
    ({"api_name": "petstore.list_pets"}, "field 'instruction': missing"),
    ({"instruction": 3, "api_name": "petstore.list_pets"}, "field 'instruction': expected a string, got int"),
    ({"instruction": "x"}, "field 'api_name': missing"),
    ({"instruction": "x", "api_name": "petstore.list_pets", "explanation": ["a"]},
     "field 'explanation': expected a string, got list"),
    ({"instruction": "x", "api_name": "petstore.list_pets", "api_cal": "petstore.list_pets(limit=1)"},
     "field 'api_cal': unknown field; did you mean 'api_call'?"),
    ({"instruction": "x", "api_name": "petstore.list_pets", "domain": "pets"},
     "field 'domain': comes from the catalog document"),
    ({"instruction": "x", "api_name": "petstore.list_pets", "api_call": "petstore.list_pets(limit="},
     "field 'api_call': 'petstore.list_pets\\(limit=': not a Python expression"),
    ({"instruction": "x", "api_name": "petstore.list_pets", "api_call": "pets = petstore.list_pets()"},
     "field 'api_call': .* not a Python expression"),
])
def test_invalid_lines(tmp_path, line, message):
    path = write(tmp_path, [{"instruction": "fine", "api_name": "petstore.get_pet"}, line])
    with pytest.raises(InputError, match=f"pairs.jsonl:2: {message}"):
        load_pairs(path, CATALOG)


def test_api_call_must_identify_its_own_api(tmp_path):
    path = write(tmp_path, [{"instruction": "List pets", "api_name": "petstore.list_pets",
                             "api_call": "petstore.get_pet(pet_id=3)"}])
    with pytest.raises(InputError) as info:
        load_pairs(path, CATALOG)
    assert (info.value.line, info.value.field) == (1, "api_call")
    assert info.value.reason == ("'petstore.get_pet(pet_id=3)' does not identify 'petstore.list_pets': it names "
                                 "'petstore.get_pet' instead (the catalog's call for it is "
                                 "'petstore.list_pets(limit=10)')")
    path = write(tmp_path, [{"instruction": "Load AlexNet", "api_name": "hub.alexnet",
                             "api_call": "torch.hub.load('pytorch/vision', 'vgg16')"}])
    with pytest.raises(InputError, match="does not identify 'hub.alexnet': it names no catalog API"):
        load_pairs(path, CATALOG)
    path = write(tmp_path, [{"instruction": "Load AlexNet", "api_name": "hub.alexnet",
                             "api_call": "torch.hub.load('pytorch/vision', 'resnet18')"}])
    with pytest.raises(InputError, match="it names 'hub.resnet18' instead"):
        load_pairs(path, CATALOG)


def test_duplicates_error_drop_and_conflicts(tmp_path):
    lines = [{"instruction": "List all pets", "api_name": "petstore.list_pets"},
             {"instruction": "Get pet 2", "api_name": "petstore.get_pet"},
             {"instruction": "list   ALL pets", "api_name": "petstore.list_pets"}]
    path = write(tmp_path, lines)
    with pytest.raises(InputError, match="pairs.jsonl:3: field 'instruction': duplicate of line 1"):
        load_pairs(path, CATALOG)
    dropped = []
    pairs = load_pairs(path, CATALOG, duplicates="drop", dropped=dropped)
    assert [p.line for p in pairs] == [1, 2] and dropped == [(3, 1)]
    path = write(tmp_path, [lines[0], {"instruction": "List all pets!", "api_name": "petstore.get_pet"},
                            {"instruction": "list all pets", "api_name": "petstore.get_pet"}], "conflict.jsonl")
    with pytest.raises(InputError, match="conflict.jsonl:3: .*same instruction as line 1 .* conflicting labels"):
        load_pairs(path, CATALOG, duplicates="drop")
    with pytest.raises(RatuneError, match="unknown duplicates policy 'keep'"):
        load_pairs(path, CATALOG, duplicates="keep")


def test_unreadable_and_empty_files(tmp_path):
    with pytest.raises(RatuneError, match="pairs file not found"):
        load_pairs(tmp_path / "missing.jsonl", CATALOG)
    path = write(tmp_path, [{"instruction": "a", "api_name": "petstore.get_pet"}, "[1, 2]"])
    with pytest.raises(InputError, match="pairs.jsonl:2: not a JSON object"):
        load_pairs(path, CATALOG)
    path = write(tmp_path, ["", "  "], "empty.jsonl")
    with pytest.raises(InputError, match="empty.jsonl: no pairs"):
        load_pairs(path, CATALOG)


# --------------------------------------------------------------------------------------------
# split_pairs


def P(line, api, text=None):
    return Pair(text or f"request number {line} for {api} with distinct words", api, f"{api}()", None, None,
                "p.jsonl", line)


#: 5 pairs of A, 2 of B, 1 of C.
PAIRS = [P(i, "A") for i in range(1, 6)] + [P(i, "B") for i in (6, 7)] + [P(8, "C")]


@pytest.mark.parametrize("fraction,want_eval", [
    (0.3, {"A": 2, "B": 1}),  # A: 1.5 -> 2; B: 0.6 -> 1; C (one pair) -> train
    (0.5, {"A": 3, "B": 1}),  # A: 2.5 -> 3; B: 1.0 -> 1
    (0.1, {"A": 1, "B": 1}),  # A: 0.5 -> 1; B: 0.2 -> 0, at least 1
    (0.9, {"A": 4, "B": 1}),  # A: 4.5 -> 5, at most 4; B: 1.8 -> 2, at most 1
])
def test_split_counts_by_hand(fraction, want_eval):
    train, eval_ = split_pairs(PAIRS, fraction, seed=0)
    assert Counter(p.api_name for p in eval_) == want_eval
    totals = {"A": 5, "B": 2, "C": 1}
    assert Counter(p.api_name for p in train) == {a: totals[a] - want_eval.get(a, 0) for a in totals}
    assert sorted(p.line for p in train + eval_) == list(range(1, 9))
    # Each split keeps input order.
    assert [p.line for p in train] == sorted(p.line for p in train)
    assert [p.line for p in eval_] == sorted(p.line for p in eval_)


def test_same_seed_same_split():
    first = split_pairs(PAIRS, 0.3, seed=13)
    assert split_pairs(list(PAIRS), 0.3, seed=13) == first
    # An API's split does not depend on the other APIs present.
    only_a = split_pairs(PAIRS[:5], 0.3, seed=13)
    assert [p.line for p in only_a[1]] == [p.line for p in first[1] if p.api_name == "A"]


def test_same_seed_same_split_in_another_process():
    # The generators are seeded with a string (sha512 in random.seed), not hash(): the split
    # does not depend on PYTHONHASHSEED.
    code = ("from ratune.catalog.pairs import Pair, split_pairs\n"
            "ps = [Pair(f'request {i} for {a} here', a, a + '()', None, None, 'p', i) "
            "for i, a in enumerate('AAAAABBC', 1)]\n"
            "print([p.line for p in split_pairs(ps, 0.3, 13)[1]])\n")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pairs = [Pair(f"request {i} for {a} here", a, a + "()", None, None, "p", i) for i, a in enumerate("AAAAABBC", 1)]
    assert out.stdout.strip() == str([p.line for p in split_pairs(pairs, 0.3, 13)[1]])


def test_different_seed_different_split():
    # One API with two pairs and fraction 0.5: exactly one pair goes to eval, so there are
    # exactly two possible splits; across seeds 0..31 both occur (for this implementation
    # seeds 0 and 2 differ).
    two = [P(1, "A"), P(2, "A")]
    evals = {tuple(p.line for p in split_pairs(two, 0.5, seed)[1]) for seed in range(32)}
    assert evals == {(1,), (2,)}
    assert split_pairs(two, 0.5, 0)[1] != split_pairs(two, 0.5, 2)[1]


def test_leakage_detected():
    # Two pairs of one API, equal after normalisation: one must go to each split.
    pairs = [P(1, "A", "List all pets"), P(2, "A", "list   ALL pets"), P(3, "B"), P(4, "B")]
    with pytest.raises(RatuneError) as info:
        split_pairs(pairs, 0.5, seed=0)
    message = str(info.value)
    assert message.startswith("train/eval leakage in the pair split: 1 pair(s) (1 normalised;")
    assert ("p.jsonl:1 (train) <-> p.jsonl:2 (eval)" in message) or ("p.jsonl:2 (train) <-> p.jsonl:1 (eval)" in message)
    leaks = []
    train, eval_ = split_pairs(pairs, 0.5, seed=0, leakage="drop", leaks=leaks)
    assert len(leaks) == 1 and isinstance(leaks[0], PairLeak) and leaks[0].kind == "normalised"
    assert {leaks[0].train.line, leaks[0].eval.line} == {1, 2}
    assert leaks[0].train not in train and leaks[0].eval in eval_
    assert len(train) == 1 and len(eval_) == 2
    train, eval_ = split_pairs(pairs, 0.5, seed=0, leakage="allow")
    assert len(train) == 2 and len(eval_) == 2


def test_near_duplicate_leakage_and_threshold():
    base = "please show me every pet that the store has for sale right now"  # 13 distinct tokens
    pairs = [P(1, "A", base), P(2, "A", base + " today")]  # Jaccard 13/14 = 0.93
    with pytest.raises(RatuneError, match=r"(?s)1 pair\(s\) \(1 near; .*\(near, jaccard 0.93\)"):
        split_pairs(pairs, 0.5, seed=1)
    train, eval_ = split_pairs(pairs, 0.5, seed=1, near_threshold=None)
    assert len(train) == 1 and len(eval_) == 1


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.1, True, "0.2"])
def test_bad_fraction_and_policy(fraction):
    with pytest.raises(RatuneError, match="eval_fraction must be in"):
        split_pairs(PAIRS, fraction, seed=0)


def test_bad_leakage_policy():
    with pytest.raises(RatuneError, match="unknown leakage policy 'ignore'"):
        split_pairs(PAIRS, 0.3, seed=0, leakage="ignore")


def test_loaded_file_splits(tmp_path):
    lines = [{"instruction": f"show me {n} pets from the shop", "api_name": "petstore.list_pets",
              "api_call": f"petstore.list_pets(limit={n})"} for n in (1, 2, 3, 4)]
    lines.append({"instruction": "remove pet 9", "api_name": "petstore.delete_pet"})
    pairs = load_pairs(write(tmp_path, lines), CATALOG)
    train, eval_ = split_pairs(pairs, 0.25, seed=3)  # list_pets: 4 * 0.25 = 1 to eval
    assert Counter(p.api_name for p in eval_) == {"petstore.list_pets": 1}
    assert Counter(p.api_name for p in train) == {"petstore.list_pets": 3, "petstore.delete_pet": 1}
