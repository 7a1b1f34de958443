"""README's reproduction headline and the comparison sentences of docs/reproduction/README.md, each
worded by its paired test and read back from the committed cells.

- The headline table's counts are the committed cells' (``docs/reproduction/ARM/SETTING/metrics.json``
  for our models; the released models' from the committed paired comparisons).
- Each comparison sentence is a :class:`Claim`: a phrase whose every number is filled in from the
  committed per-question results, so that the phrase is found in the text only if the text says
  what the cells say. Each ``p = X`` (or ``p <= X``) in it is the exact McNemar p
  (:func:`ratune.eval.stats.mcnemar_exact`) recomputed here from the per-question results at the
  precision the text shows; a difference stated as a finding must have p < 0.05, and one whose p
  is 0.05 or more must say so in its words (:data:`HEDGES`). A comparison that changes the model and
  the documents at once must say so (:data:`TWO_THINGS`).
- Every ``p`` of README.md lies in a checked phrase, and so does every number of the headline
  paragraph: changing any of them fails a test.

Per-question results: our cells' from their committed ``metrics.json`` (``per_question``); a pair
with a released Gorilla-7B model from the committed paired comparison that holds it
(``comparisons.json``, ``released.json``, ``worst_case.json``: its discordant counts), whose
McNemar p is recomputed here. With the real APIBench present (``apibench_data`` tests) both are
re-derived: our committed responses re-scored, the released responses scored and paired afresh.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Callable

import pytest

from ratune.eval.stats import mcnemar_exact

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "docs" / "reproduction"
README = (ROOT / "README.md").read_text(encoding="utf-8")
REPRO_README = (REPRO / "README.md").read_text(encoding="utf-8")
RELEASED = ("FT", "RT")
#: our setting folder -> the released responses' setting in their file name
RELEASED_SETTING = {"0_shot": "0_shot", "released_bm25": "bm25", "gpt_index": "gpt_index", "oracle": "oracle"}
#: the four settings every model (ours and the released ones) has: the worst case of the headline
FOUR = ("0_shot", "released_bm25", "gpt_index", "oracle")
#: words that say a difference is not a finding (next to its p >= 0.05)
HEDGES = ("does not confirm", "not significant", "no significant", "in count only", "not significantly")
#: words that say a comparison changes the model and the documents at once
TWO_THINGS = "two things at once"

Cell = tuple[str, str]  # (arm folder under docs/reproduction/, or "FT" / "RT"; setting)


def _flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ the committed results


def _arms_module():
    spec = importlib.util.spec_from_file_location("reproduction_arms", REPRO / "scripts" / "arms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _label_to_arm() -> dict[str, str]:
    labels = {label: arm for arm, (label, _) in _arms_module().ARMS.items()}
    labels.update({f"released Gorilla-7B {m}": m for m in RELEASED})
    return labels


@cache
def _per_question(cell: Cell) -> dict[int, dict]:
    arm, setting = cell
    assert arm not in RELEASED, cell
    rows = json.loads((REPRO / arm / setting / "metrics.json").read_text())["per_question"]
    return {row["question_id"]: row for row in rows}


@cache
def _validated_cells() -> dict[str, str]:
    """A validated sweep cell's name -> its test cells' folder under docs/reproduction/."""
    return {json.loads(path.read_text())["name"]: f"validated/{path.parent.name}/eval"
            for path in (REPRO / "validated").glob("*/cell.json")}


def _cell_of_path(path: str) -> Cell | None:
    if m := re.search(r"response_torchhub_Gorilla_(FT|RT)_(\w+)\.jsonl$", path):
        return m[1], {v: k for k, v in RELEASED_SETTING.items()}[m[2]]
    if m := re.search(r"/validated/cells/([^/]+)/eval/([^/]+)/responses\.jsonl$", path):
        arm = _validated_cells().get(m[1])
        return (arm, m[2]) if arm else None
    if m := re.search(r"docs/reproduction/([^/]+)/([^/]+)/responses\.jsonl$", path):
        return m[1], m[2]
    return None


def _walk(node, found: list[dict]) -> None:
    if isinstance(node, dict):
        if "contingency" in node:
            found.append(node)
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)


@cache
def _committed_pairs() -> dict[tuple[Cell, Cell, str], dict]:
    """Every committed paired comparison under docs/reproduction/ whose two cells are known:
    ``{(cell a, cell b, metric): {"a": count, "b": count, "only_a": .., "only_b": ..}}``. Entries of
    one pair in several files must agree."""
    pairs: dict[tuple[Cell, Cell, str], dict] = {}
    for path in sorted(REPRO.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        found: list[dict] = []
        _walk(data, found)
        for entry in found:
            if "a" in entry:  # a compare_files result
                a, b = _cell_of_path(entry["a"].get("path", "")), _cell_of_path(entry["b"].get("path", ""))
                counts = entry["a"]["correct_n"], entry["b"]["correct_n"]
            elif "mixture_model" in entry:  # worst_case.json
                arm_a, arm_b = _label_to_arm().get(entry["mixture_model"]), _label_to_arm().get(entry["other"])
                a = (arm_a, entry["mixture"][0]) if arm_a else None
                b = (arm_b, entry["other_worst"][0]) if arm_b else None
                counts = entry["mixture"][1], entry["other_worst"][1]
            else:
                continue
            if a is None or b is None:
                continue
            c = entry["contingency"]
            record = {"a": counts[0], "b": counts[1], "only_a": c["only_a"], "only_b": c["only_b"]}
            assert record["a"] == c["both"] + c["only_a"] and record["b"] == c["both"] + c["only_b"], path
            key = (a, b, entry["metric"])
            assert pairs.setdefault(key, record) == record, (path, key)
    return pairs


def _outcome(row: dict, metric: str) -> bool:
    return row[metric] == "correct"


def count(cell: Cell, metric: str) -> int:
    """Correct answers of one cell: ours from its metrics.json, a released one from every committed
    comparison that holds it (they must agree)."""
    if cell[0] not in RELEASED:
        return sum(_outcome(row, metric) for row in _per_question(cell).values())
    seen = {r["a"] for (a, _, m), r in _committed_pairs().items() if a == cell and m == metric}
    seen |= {r["b"] for (_, b, m), r in _committed_pairs().items() if b == cell and m == metric}
    assert len(seen) == 1, (cell, metric, seen)
    return seen.pop()


@dataclass(frozen=True)
class Pair:
    a: Cell
    b: Cell
    metric: str

    def changes_model_and_documents(self) -> bool:
        return self.a[0] != self.b[0] and self.a[1] != self.b[1]


def contingency(pair: Pair) -> tuple[int, int]:
    """``(only a right, only b right)`` on the 186 questions."""
    if pair.a[0] not in RELEASED and pair.b[0] not in RELEASED:
        a, b = _per_question(pair.a), _per_question(pair.b)
        assert set(a) == set(b) and len(a) == 186, pair
        return (sum(_outcome(a[q], pair.metric) and not _outcome(b[q], pair.metric) for q in a),
                sum(_outcome(b[q], pair.metric) and not _outcome(a[q], pair.metric) for q in a))
    pairs = _committed_pairs()
    if (pair.a, pair.b, pair.metric) in pairs:
        record = pairs[pair.a, pair.b, pair.metric]
        found = record["only_a"], record["only_b"]
        counts = record["a"], record["b"]
    else:
        assert (pair.b, pair.a, pair.metric) in pairs, f"no committed comparison holds {pair}"
        record = pairs[pair.b, pair.a, pair.metric]
        found = record["only_b"], record["only_a"]
        counts = record["b"], record["a"]
    assert counts == (count(pair.a, pair.metric), count(pair.b, pair.metric)), pair
    return found


def p_value(pair: Pair) -> float:
    return mcnemar_exact(*contingency(pair))


def worst(arm: str, metric: str, settings=FOUR) -> Cell:
    """The arm's worst cell over ``settings``, the first in their order on a tie (worst_case.py's rule)."""
    return min(((arm, s) for s in settings), key=lambda cell: count(cell, metric))


# ------------------------------------------------------------------ claims


@dataclass(frozen=True)
class P:
    """A ``p = X`` or ``p <= X`` in a claim: the McNemar p of each pair (``=``: every pair's p is X
    at the precision shown; ``<=``: the largest is at most X at that precision), a finding or not."""
    pairs: tuple[Pair, ...]
    finding: bool
    #: shown as the number alone, after another ``p = X`` ("p = 0.39 and 1.0")
    bare: bool = False


@dataclass
class Claim:
    """A phrase of the text with ``{name}`` fields: a value (shown exactly) or a :class:`P`."""
    template: str
    fields: Callable[[], dict]
    check: Callable[[dict], None] = field(default=lambda values: None)
    #: compares worst cells, which may lie in different settings (other documents) by design
    worst_case: bool = False

    def pattern(self, values: dict) -> str:
        out, pos = [], 0
        for m in re.finditer(r"\{(\w+)\}", self.template):
            out.append(re.escape(self.template[pos:m.start()]))
            value = values[m[1]]
            if isinstance(value, P):
                prefix = "" if value.bare else "p (?:=|<=) "
                out.append(rf"(?P<{m[1]}>{prefix}[0-9.]+(?:e-?[0-9]+)?)")
            else:
                out.append(re.escape(str(value)))
            pos = m.end()
        out.append(re.escape(self.template[pos:]))
        return "".join(out)


def _shown(p: float, literal: str) -> bool:
    """``p`` to the significant digits of ``literal`` (``0.17``: 2, ``1.5e-5``: 2, ``0.0005``: 1) is it."""
    digits = max(1, len(literal.split("e")[0].replace(".", "").lstrip("0")))
    return f"{p:.{digits - 1}e}" == f"{float(literal):.{digits - 1}e}"


def check_p(stat: P, literal: str) -> list[str]:
    """What is wrong with ``literal`` (``p = X``, ``p <= X``) as the text of ``stat``."""
    op, value = re.fullmatch(r"p (=|<=) (\S+)", literal).groups()
    ps = [p_value(pair) for pair in stat.pairs]
    problems = []
    if op == "=" and not all(_shown(p, value) for p in ps):
        problems.append(f"{literal}: recomputed {', '.join(f'{p:.3g}' for p in ps)}")
    if op == "<=" and not (max(ps) <= float(value) or _shown(max(ps), value)):
        problems.append(f"{literal}: recomputed largest {max(ps):.3g}")
    if stat.finding and not max(ps) < 0.05:
        problems.append(f"{literal} is worded as a finding, recomputed p {max(ps):.3g} >= 0.05")
    if not stat.finding and not min(ps) >= 0.05:
        problems.append(f"{literal} is worded as no finding, recomputed p {min(ps):.3g} < 0.05")
    return problems


def match_claim(claim: Claim, text: str) -> tuple[re.Match, dict]:
    values = claim.fields()
    found = list(re.finditer(claim.pattern(values), text))
    assert len(found) == 1, (f"{len(found)} matches in the text for the committed numbers of\n  {claim.template}"
                             f"\nwith {values}")
    m = found[0]
    problems = [problem for name, value in values.items() if isinstance(value, P)
                for problem in check_p(value, ("p = " if value.bare else "") + m[name])]
    for name, value in values.items():
        if isinstance(value, P) and not value.finding:
            if not any(h in claim.template for h in HEDGES):
                problems.append(f"{name}: p >= 0.05 but the phrase does not say the difference is not confirmed")
        if isinstance(value, P) and any(pair.changes_model_and_documents() for pair in value.pairs):
            if TWO_THINGS not in claim.template and not claim.worst_case:
                problems.append(f"{name}: compares another model with other documents, and does not say so")
    assert not problems, (claim.template, problems)
    claim.check(values)
    return m, values


def _pair(a: Cell, b: Cell, metric: str) -> Pair:
    return Pair(a, b, metric)


def _counts(pair: Pair) -> tuple[int, int]:
    return count(pair.a, pair.metric), count(pair.b, pair.metric)


def _retrieval_top1_percent(row: str) -> str:
    """The top-1 column of a row of docs/retrieval/finetuned.md's table."""
    text = (ROOT / "docs" / "retrieval" / "finetuned.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith(f"| {row} |"))
    return line.strip("|").split("|")[2].strip().strip("*")


NONE3, NONE_LORA, NONE2 = "none_full3", "none", "none_full"
ORACLE, ORACLE_FULL1, MIX = "oracle", "oracle_full1", "mix_bm25_full3"
#: the validated reproduction's test cells (docs/reproduction/validated/, each arm's epoch chosen on validation)
V_NONE, V_ORACLE = "validated/none_full/eval", "validated/oracle_full/eval"
#: The README table's rows and the committed arm each reads ("FT" / "RT": the released models).
ROWS = {"ours, trained without documents, full finetuning, 3 epochs": NONE3,
        "ours, trained with the gold document (LoRA 1 epoch; full finetuning 1 or 3 epochs answers alike)": ORACLE,
        "ours, trained on a mixture (no document, gold, BM25's top-1), full finetuning, 3 epochs": MIX,
        "released Gorilla-7B FT": "FT", "released Gorilla-7B RT": "RT"}
COLUMNS = ("0_shot", "released_bm25", "oracle")


def F(pair: Pair, finding: bool | None = None, a="a", b="b", oa=None, ob=None, p="p", bare=False) -> dict:
    """The fields of one pair: its two counts, its discordant counts and its p, under the names given."""
    out = dict(zip((a, b), _counts(pair)))
    if oa:
        out.update(zip((oa, ob), contingency(pair)))
    if finding is not None:
        out[p] = P((pair,), finding, bare)
    return out


FIVE = FOUR + ("dense_ft",)
#: every model but the robust_bm25 mixture (epochs 3 and 4): what its worst cell is held against
ALL_BUT_MIXTURE = ("mix", "none", "oracle", "mix_full", NONE2, NONE3, "none_full4", ORACLE_FULL1, "oracle_full3",
                   "FT", "RT")
G, S = "gorilla", "strict"


def _retriever_hurts():
    final = _pair((NONE3, "0_shot"), (NONE3, "released_bm25"), "strict")
    lora = _pair((NONE_LORA, "0_shot"), (NONE_LORA, "released_bm25"), "strict")
    two = _pair((NONE2, "0_shot"), (NONE2, "released_bm25"), "strict")
    return {**F(final, True), **F(lora, False, "c", "d", p="p2"), **F(two, False, "e", "f", p="p3")}


def _retriever_hurts_officially():
    pairs = [_pair((arm, "0_shot"), (arm, "released_bm25"), "gorilla") for arm in (NONE3, NONE_LORA, NONE2)]
    out = {}
    for pair, (a, b, p) in zip(pairs, (("a", "b", "p"), ("c", "d", "p2"), ("e", "f", "p3"))):
        out.update(F(pair, True, a, b, p=p))
    return out


def _gold_then_none():
    pairs = tuple(_pair((ORACLE, "oracle"), (ORACLE, "0_shot"), m) for m in ("strict", "gorilla"))
    (a, b), (c, d) = (_counts(pair) for pair in pairs)
    assert (a, b) == (c, d)  # 186 -> 0 by both metrics
    return {"a": a, "b": b, "p": P(pairs, True)}


def _retriever_gain():
    pair = _pair((ORACLE_FULL1, "dense_ft"), ("RT", "gpt_index"), "strict")
    return F(pair, True)


def _gold_top1():
    a = count((ORACLE_FULL1, "dense_ft"), "strict")
    n = len(_per_question((ORACLE_FULL1, "dense_ft")))
    return {"a": a, "pct": _retrieval_top1_percent("**dense_ft, 3 epochs**"), "n": n}


def _check_gold_top1(values):
    # 37 strict answers of a model that copies the given document's call = the retriever's top-1 count
    assert f"{100 * values['a'] / values['n']:.1f}" == values["pct"], values


OTHERS = (NONE3, ORACLE, "FT", "RT")  # the table's other models


def _keeps_with_bm25():
    pairs = tuple(_pair((MIX, "released_bm25"), (o, "released_bm25"), "gorilla") for o in OTHERS)
    others = [count(pair.b, "gorilla") for pair in pairs]
    return {"a": count((MIX, "released_bm25"), "gorilla"), "lo": min(others), "hi": max(others),
            "p": P(pairs, True)}


def _worst_official():
    mine = worst(MIX, "gorilla")
    pairs = tuple(_pair(mine, worst(o, "gorilla"), "gorilla") for o in OTHERS)
    others = [count(pair.b, "gorilla") for pair in pairs]
    assert all(count(mine, "gorilla") > o for o in others)
    return {"a": count(mine, "gorilla"), "b": max(others), "p": P(pairs, True)}


def _worst_strict():
    mine = worst(MIX, "strict")
    collapse = tuple(_pair(mine, worst(o, "strict"), "strict") for o in (ORACLE, "RT"))
    assert {count(pair.b, "strict") for pair in collapse} == {0}
    none3, ft = (_pair(mine, worst(o, "strict"), "strict") for o in (NONE3, "FT"))
    a = count(mine, "strict")
    assert a > count(none3.b, "strict") and a > count(ft.b, "strict")
    return {"a": a, "z": 0, "p": P(collapse, True), "c": count(none3.b, "strict"), "p2": P((none3,), False),
            "d": count(ft.b, "strict"), "p3": P((ft,), False)}


#: README's headline paragraph, sentence by sentence.
README_CLAIMS = [
    Claim("by the official metric {a} against the released 7B FT model's {b} at 0-shot ({p})",
          lambda: F(_pair((NONE3, "0_shot"), ("FT", "0_shot"), "gorilla"), True)),
    Claim("by the strict one {a} exact calls against its {b}, a difference its paired test does not confirm ({p})",
          lambda: F(_pair((NONE3, "0_shot"), ("FT", "0_shot"), "strict"), False)),
    Claim("A weak retriever (the paper's BM25 documents) hurts it, by the strict metric only in this final recipe: "
          "{a} -> {b} ({p}), where the LoRA model went the other way, {c} -> {d} ({p2}), and 2 epochs of full "
          "finetuning gave {e} -> {f}, not significant ({p3})", _retriever_hurts,
          lambda v: (v["a"] > v["b"] and v["c"] < v["d"] and v["e"] > v["f"]) or pytest.fail(str(v))),
    Claim("by the official metric it hurts in all three ({a} -> {b}, {p}; LoRA {c} -> {d}, {p2}; "
          "2 epochs {e} -> {f}, {p3})", _retriever_hurts_officially,
          lambda v: (v["a"] > v["b"] and v["c"] > v["d"] and v["e"] > v["f"]) or pytest.fail(str(v))),
    Claim("The model trained with the gold document copies it and collapses without one ({a} -> {b}, {p})",
          _gold_then_none),
    Claim("Given our finetuned retriever's documents, the oracle-trained model makes {a} exact calls where the "
          "released RT model makes {b} with the paper's GPT-Index documents ({p}): a comparison that changes two "
          "things at once, the model and the documents, and mostly measures the retriever",
          _retriever_gain),
    Claim("{a} is the number of questions whose top-1 document is the gold one, {pct} % of {n}",
          _gold_top1, _check_gold_top1),
    Claim("with the paper's BM25 documents it keeps {a} where every other model of the table falls to {lo}-{hi} ({p})",
          _keeps_with_bm25),
    Claim("Its worst cell over the four settings every model has is the best of every model, significantly so by "
          "the official metric ({a} against at most {b}, {p})", _worst_official, worst_case=True),
    Claim("by the strict one significantly only above the models that collapse without a document ({a} against "
          "{z}, {p}), and in count only above our model trained without documents ({c}, {p2}) and the released "
          "FT model ({d}, {p3})", _worst_strict, worst_case=True),
]


def _headline_paragraph() -> tuple[int, int]:
    """Where README's headline paragraph (the one after the reproduction table) starts and ends in
    the flattened text."""
    text = _flat(README)
    start = text.index("Both of the paper's findings appear")
    return start, text.index("## Your own APIs", start)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("row, arm", sorted(ROWS.items()))
def test_the_headline_table_is_the_committed_cells(row, arm):
    line = next(line for line in README.splitlines() if line.startswith(f"| {row} |"))
    cells = [c.strip().replace("*", "") for c in line.strip("|").split("|")[1:]]
    assert [tuple(int(x) for x in c.split(" / ")) for c in cells] == \
        [(count((arm, s), "strict"), count((arm, s), "gorilla")) for s in COLUMNS]


@pytest.mark.parametrize("claim", README_CLAIMS, ids=lambda c: c.template[:40])
def test_each_headline_sentence_is_the_committed_cells_and_their_tests(claim):
    match_claim(claim, _flat(README))


def test_every_number_and_p_of_the_headline_is_in_a_checked_sentence():
    """Blank out each checked phrase of the headline paragraph: no digit may remain (but in the
    names 7B, BM25, 0-shot, top-1), and no ``p`` anywhere in README lies outside a checked phrase."""
    text = _flat(README)
    spans = [match_claim(claim, text)[0].span() for claim in README_CLAIMS]
    start, end = _headline_paragraph()
    assert all(start <= s < e <= end for s, e in spans), "a checked phrase outside the headline paragraph"
    chars = list(text)
    for s, e in spans:
        chars[s:e] = " " * (e - s)
    rest = re.sub(r"\b7B\b|\bBM25\b|\b0-shot\b|\btop-1\b", " ", "".join(chars)[start:end])
    assert not re.search(r"\d", rest), f"numbers in the headline no test reads back: {rest!r}"
    for m in re.finditer(r"\bp (?:=|<=|<|>=|>) ?[0-9]", text):
        context = text[m.start() - 80:m.end() + 20]
        assert any(s <= m.start() < e for s, e in spans), f"a p no test recomputes: {context!r}"


def test_the_recipe_is_said_to_be_chosen_on_the_test_questions():
    text = _flat(README)
    intro = text[text.index("## The reproduction on all of TorchHub"):text.index("| model | 0-shot |")]
    assert "**The recipe was chosen on the test questions**" in intro
    assert "no validation split" in intro and "--validation-fraction" in intro
    repro = _flat(REPRO_README)
    assert "**The recipe was chosen on the test questions.**" in repro


def test_the_known_offenders_are_gone():
    """Sentences that said more than their paired tests, as they once read, are gone."""
    text = _flat(README) + " " + _flat(REPRO_README)
    assert "more exact ones than the 7B FT model" not in text
    assert "beats the released RT model's best retrieved cell, 37 against 17" not in text
    assert "a weak retriever hurts it (26 -> 11" not in text


# ------------------------------------------------------------------ with the real APIBench


def _cells_of_claims(claims) -> set[Cell]:
    cells: set[Cell] = set()
    for claim in claims:
        for value in claim.fields().values():
            if isinstance(value, P):
                cells |= {cell for pair in value.pairs for cell in (pair.a, pair.b)}
    return cells


@pytest.mark.apibench_data
def test_committed_cells_rescore_to_their_per_question_results():
    """Every cell of ours that a checked sentence or the table reads: its committed responses.jsonl,
    scored again, gives its committed metrics.json's per-question results."""
    from conftest import real_apibench_or_skip

    from ratune.eval.hub_scoring import scoring_for
    from ratune.hubs import resolve_hub

    scoring = scoring_for(resolve_hub("torchhub", real_apibench_or_skip(), locate=False))
    cells = _cells_of_claims(README_CLAIMS + DOC_CLAIMS)
    cells |= {(arm, s) for arm in ROWS.values() for s in COLUMNS}
    ours = sorted(c for c in cells if c[0] not in RELEASED)
    assert len(ours) >= 12
    for cell in ours:
        scored = scoring.score(scoring.load_responses(REPRO / cell[0] / cell[1] / "responses.jsonl"))["per_question"]
        assert {row["question_id"]: row for row in scored} == _per_question(cell), cell


@pytest.mark.apibench_data
def test_released_pairs_pair_afresh_to_the_committed_comparisons():
    """Every pair with a released model that a checked sentence reads, and every released cell of
    the table: the released responses scored here and paired with our committed per-question
    results give the committed counts and discordant counts."""
    from conftest import real_apibench_or_skip

    from ratune.eval.hub_scoring import scoring_for
    from ratune.hubs import resolve_hub

    apibench = real_apibench_or_skip()
    scoring = scoring_for(resolve_hub("torchhub", apibench, locate=False))

    def outcomes(cell: Cell) -> dict[int, dict]:
        if cell[0] not in RELEASED:
            return _per_question(cell)
        path = apibench / "responses" / f"response_torchhub_Gorilla_{cell[0]}_{RELEASED_SETTING[cell[1]]}.jsonl"
        return {row["question_id"]: row for row in scoring.score(scoring.load_responses(path))["per_question"]}

    pairs = {pair for claim in README_CLAIMS + DOC_CLAIMS for value in claim.fields().values()
             if isinstance(value, P) for pair in value.pairs if pair.a[0] in RELEASED or pair.b[0] in RELEASED}
    assert len(pairs) >= 6
    for pair in sorted(pairs, key=repr):
        a, b = outcomes(pair.a), outcomes(pair.b)
        only_a = sum(_outcome(a[q], pair.metric) and not _outcome(b[q], pair.metric) for q in a)
        only_b = sum(_outcome(b[q], pair.metric) and not _outcome(a[q], pair.metric) for q in a)
        assert (only_a, only_b) == contingency(pair), pair
    for model in RELEASED:
        for setting in COLUMNS:
            for metric in ("strict", "gorilla"):
                assert sum(_outcome(r, metric) for r in outcomes((model, setting)).values()) == \
                    count((model, setting), metric), (model, setting, metric)


# ------------------------------------------------------------------ docs/reproduction/README.md

def _more_at_gpt_index(values):
    for metric, key in ((S, "a"), (G, "c")):
        others = [count((arm, "gpt_index"), metric) for arm in ALL_BUT_MIXTURE + ("mix_bm25_full4",)]
        assert values[key] > max(others), (metric, others)


def _worst_pairs(arm, others, metric, settings=FOUR):
    return tuple(_pair(worst(arm, metric, settings), worst(o, metric, settings), metric) for o in others)


#: Comparison sentences of docs/reproduction/README.md, each worded by its paired test and read back.
DOC_CLAIMS: list[Claim] = [
    Claim("and its worst cell is the best of every model (significantly by the official metric, {p}; by the "
          "strict one in count only against our `none` arm's and the released FT model's, {p2} and {p3})",
          lambda: {"p": P(_worst_pairs(MIX, ALL_BUT_MIXTURE, G), True),
                   "p2": P(_worst_pairs(MIX, (NONE3,), S), False),
                   "p3": P(_worst_pairs(MIX, ("FT",), S), False, bare=True)}, worst_case=True),
    Claim("FT model cell for cell: {a} vs {b} at 0-shot and {c} vs {d} with the paper's BM25 documents, no "
          "significant difference in either ({p} and {p2})",
          lambda: {**F(_pair((NONE_LORA, "0_shot"), ("FT", "0_shot"), G), False),
                   **F(_pair((NONE_LORA, "released_bm25"), ("FT", "released_bm25"), G), False, "c", "d",
                       p="p2", bare=True)}),
    Claim("against {a} from memory: the count goes the other way, {a} -> {b}, not significant ({p})",
          lambda: F(_pair((NONE_LORA, "0_shot"), (NONE_LORA, "released_bm25"), S), False),
          lambda v: v["a"] < v["b"] or pytest.fail(str(v))),
    Claim("With the gold document it is right on all {a} questions, RT on {b} ({p}, not significant)",
          lambda: F(_pair((ORACLE, "oracle"), ("RT", "oracle"), S), False)),
    Claim("By the gorilla metric it is ahead of RT with the paper's BM25 documents ({a} vs {b}, {p}) and, in "
          "count only, with its GPT-Index documents ({c} vs {d}, {p2}, not significant)",
          lambda: {**F(_pair((ORACLE, "released_bm25"), ("RT", "released_bm25"), G), True),
                   **F(_pair((ORACLE, "gpt_index"), ("RT", "gpt_index"), G), False, "c", "d", p="p2")}),
    Claim("Given our finetuned retriever's documents, the RAT model makes more exact calls than the released RT "
          "model given the paper's GPT-Index documents (RT's best retrieved cell): {a} against {b} correct ({p}), "
          "and more by the official metric, {c} against {d} ({p2}). This comparison changes two things at once, "
          "the model and the documents",
          lambda: {**F(_pair((ORACLE, "dense_ft"), ("RT", "gpt_index"), S), True),
                   **F(_pair((ORACLE, "dense_ft"), ("RT", "gpt_index"), G), True, "c", "d", p="p2")}),
    Claim("and {a} with our retriever's, twice RT's best retrieved cell ({b} with the paper's GPT-Index documents; "
          "{oa} vs {ob} discordant, {p}), a comparison that changes two things at once",
          lambda: F(_pair((NONE2, "dense_ft"), ("RT", "gpt_index"), S), True, oa="oa", ob="ob")),
    Claim("names more exact APIs without a document than with LoRA in count only, {a} against {b}, a difference "
          "its test does not confirm ({p}), and significantly fewer than the none arm's {d} at the same budget "
          "({oa} vs {ob} discordant, {p2})",
          lambda: {**F(_pair(("mix_full", "0_shot"), ("mix", "0_shot"), S), False),
                   **F(_pair(("mix_full", "0_shot"), (NONE2, "0_shot"), S), True, "a", "d", "oa", "ob", "p2")}),
    Claim("is significantly above the oracle arm's {z} ({p}) and, in count only, above our LoRA arms' {c} and "
          "{d} ({p2} and {p3})",
          lambda: {"z": count(worst(ORACLE, S, FIVE), S), "p": P(_worst_pairs("mix_full", (ORACLE,), S, FIVE), True),
                   "c": count(worst("mix", S, FIVE), S), "d": count(worst(NONE_LORA, S, FIVE), S),
                   "p2": P(_worst_pairs("mix_full", ("mix",), S, FIVE), False),
                   "p3": P(_worst_pairs("mix_full", (NONE_LORA,), S, FIVE), False, bare=True)}, worst_case=True),
    Claim("In count it still rises by 7 exact APIs at epoch 3 (from {b}; {oa} vs {ob} discordant, {p}, not "
          "significant; the none arm's last step: 8, from {d}, {p2})",
          lambda: {**F(_pair((MIX, "curve_step315/0_shot"), (MIX, "curve_step210/0_shot"), S), False, oa="oa", ob="ob"),
                   **F(_pair((NONE3, "curve_step315/0_shot"), (NONE3, "curve_step210/0_shot"), S), False, "c", "d",
                       p="p2")},
          lambda v: (v["a"] - v["b"], v["c"] - v["d"]) == (7, 8) or pytest.fail(str(v))),
    Claim("it has the most correct answers of every model by both metrics: {a} strict (released FT and RT {b}; "
          "{oa} vs {ob} discordant against RT, {p}; {oc} vs {od} against FT, {p2}, not significant) and {c} by the "
          "official metric (RT {d}, {p3}; FT {e}, {p4})",
          lambda: {**F(_pair((MIX, "gpt_index"), ("RT", "gpt_index"), S), True, oa="oa", ob="ob"),
                   **F(_pair((MIX, "gpt_index"), ("FT", "gpt_index"), S), False, "a", "b", "oc", "od", "p2"),
                   **F(_pair((MIX, "gpt_index"), ("RT", "gpt_index"), G), True, "c", "d", p="p3"),
                   **F(_pair((MIX, "gpt_index"), ("FT", "gpt_index"), G), True, "c", "e", p="p4")},
          _more_at_gpt_index),
    Claim("It names fewer exact APIs 0-shot than the none arm in count only ({a} vs {b}, {oa} vs {ob} discordant, "
          "{p}, not significant), as many as the released FT model ({c}, {p2}), and with the gold document it "
          "answers {e} of 186 strict, below the oracle arm's {f} ({p3}) and, in count only, the released RT "
          "model's {g} ({p4}, not significant)",
          lambda: {**F(_pair((MIX, "0_shot"), (NONE3, "0_shot"), S), False, oa="oa", ob="ob"),
                   **F(_pair((MIX, "0_shot"), ("FT", "0_shot"), S), False, "a", "c", p="p2"),
                   **F(_pair((MIX, "oracle"), (ORACLE, "oracle"), S), True, "e", "f", p="p3"),
                   **F(_pair((MIX, "oracle"), ("RT", "oracle"), S), False, "e", "g", p="p4")}),
    Claim("With our finetuned retriever it answers {a} strict, the most of any cell without the gold document, "
          "against the released RT model's best retrieved cell, {b} with the paper's GPT-Index documents ({oa} vs "
          "{ob} discordant, {p}, +11.3 points [+5.9, +17.2]), a comparison that changes two things at once",
          lambda: F(_pair((MIX, "dense_ft"), ("RT", "gpt_index"), S), True, oa="oa", ob="ob")),
    Claim("By the strict metric its {a} is significantly above our oracle arm's {z} ({p}), the LoRA arms' {c} and "
          "{d} ({p2}, {p3}) and the released RT model's {z} ({p4}), but not significantly above the full none "
          "arm's {e} ({oa} vs {ob} discordant, {p5}), the earlier full mixture's {f} ({p6}) or the released FT "
          "model's {g} ({oc} vs {od}, {p7})",
          lambda: {"z": 0, **F(_worst_pairs(MIX, (ORACLE,), S)[0], True),
                   **F(_worst_pairs(MIX, ("mix",), S)[0], True, "a", "c", p="p2"),
                   **F(_worst_pairs(MIX, (NONE_LORA,), S)[0], True, "a", "d", p="p3", bare=True),
                   "p4": P(_worst_pairs(MIX, ("RT",), S), True),
                   **F(_worst_pairs(MIX, (NONE3,), S)[0], False, "a", "e", "oa", "ob", "p5"),
                   **F(_worst_pairs(MIX, ("mix_full",), S)[0], False, "a", "f", p="p6"),
                   **F(_worst_pairs(MIX, ("FT",), S)[0], False, "a", "g", "oc", "od", "p7")}, worst_case=True),
    Claim("Its worst cells, {a} (released_bm25) and {c} (0_shot), are below epoch 3's {b} and {d} ({p} by the "
          "official metric; by the strict one in count only, {p2}) and still above every other model's, "
          "significantly by the official metric ({p3}) and by the strict one in count only against the full none "
          "arm's 11-14 and the released FT model's 13 ({p4}-{p5})",
          lambda: {**F(_worst_pairs("mix_bm25_full4", (MIX,), G)[0], True),
                   **F(_worst_pairs("mix_bm25_full4", (MIX,), S)[0], False, "c", "d", p="p2"),
                   "p3": P(_worst_pairs("mix_bm25_full4", ALL_BUT_MIXTURE, G), True),
                   "p4": P((min(_worst_pairs("mix_bm25_full4", (NONE2, NONE3, "none_full4", "FT"), S), key=p_value),),
                           False),
                   "p5": P((max(_worst_pairs("mix_bm25_full4", (NONE2, NONE3, "none_full4", "FT"), S), key=p_value),),
                           False, bare=True)},
          lambda v: sorted({count(worst(o, S), S) for o in (NONE2, NONE3, "none_full4")}) == [11, 13, 14]
          and count(worst("FT", S), S) == 13 or pytest.fail("the none arms' and FT's worst strict cells"),
          worst_case=True),
    Claim("and beats both released models' best retrieved cell (gpt_index, {b}): {oa} vs {ob}, {p}, a comparison "
          "that changes two things at once",
          lambda: F(_pair(("none_full4", "dense_ft"), ("RT", "gpt_index"), S), True, oa="oa", ob="ob"),
          lambda v: (count(("FT", "gpt_index"), S) == v["b"]
                     and p_value(_pair(("none_full4", "dense_ft"), ("FT", "gpt_index"), S)) < 0.05)
          or pytest.fail("FT's gpt_index cell")),
    Claim("The epoch-3 `robust_bm25` mixture's worst cells, {a} and {c}, stay above it, significantly by the "
          "official metric ({oa} vs {ob} discordant, {p}) and in count only by the strict one ({oc} vs {od}, {p2})",
          lambda: {**F(_worst_pairs(MIX, ("none_full4",), G)[0], True, oa="oa", ob="ob"),
                   **F(_worst_pairs(MIX, ("none_full4",), S)[0], False, "c", "d", "oc", "od", "p2")},
          worst_case=True),
    Claim("mixture's worst cell beats: official {a} vs {b} ({p}), strict {c} vs {d} ({p2})",
          lambda: {**F(_worst_pairs(MIX, (ORACLE_FULL1,), G)[0], True),
                   **F(_worst_pairs(MIX, (ORACLE_FULL1,), S)[0], True, "c", "d", p="p2")}, worst_case=True),
    # the validated re-run
    Claim("0-shot {a} -> {b} with the paper's BM25 documents ({p}), official metric {c} -> {d} ({p2})",
          lambda: {**F(_pair((V_NONE, "0_shot"), (V_NONE, "released_bm25"), S), True),
                   **F(_pair((V_NONE, "0_shot"), (V_NONE, "released_bm25"), G), True, "c", "d", p="p2")}),
    Claim("official metric {a} against {b} ({p}); strict {c} against {d} ({p2}), not significant at 0.05",
          lambda: {**F(_pair((V_NONE, "0_shot"), ("FT", "0_shot"), G), True),
                   **F(_pair((V_NONE, "0_shot"), ("FT", "0_shot"), S), False, "c", "d", p="p2")}),
    Claim("0-shot strict {a} against {b} ({p}), official {c} against {d} ({p2}), not significant either way",
          lambda: {**F(_pair((V_NONE, "0_shot"), (NONE3, "0_shot"), S), False),
                   **F(_pair((V_NONE, "0_shot"), (NONE3, "0_shot"), G), False, "c", "d", p="p2")}),
    Claim("strict {a} against {b} ({p}), not significant; official metric {c} against {d} ({p2})",
          lambda: {**F(_pair((V_ORACLE, "oracle"), ("RT", "oracle"), S), False),
                   **F(_pair((V_ORACLE, "oracle"), ("RT", "oracle"), G), True, "c", "d", p="p2")}),
    Claim("as RT does: {a} of 186 by both metrics (RT {b} and {c})",
          lambda: {"a": count((V_ORACLE, "0_shot"), S), "b": count(("RT", "0_shot"), S),
                   "c": count(("RT", "0_shot"), G)},
          lambda v: count((V_ORACLE, "0_shot"), G) == v["a"] or pytest.fail(str(v))),
    Claim("its `dense_ft` cell beats the released RT model's best retrieved cell (`gpt_index`, {b} strict): {a} vs "
          "{b}, {oa} vs {ob} discordant, {p}, +8.6 points [+3.2, +14.0] (a comparison that changes two things at "
          "once, the model and the documents)",
          lambda: F(_pair((NONE3, "dense_ft"), ("RT", "gpt_index"), S), True, oa="oa", ob="ob")),
]


@pytest.mark.parametrize("claim", DOC_CLAIMS, ids=lambda c: c.template[:40])
def test_each_reworded_reproduction_sentence_is_the_committed_cells_and_their_tests(claim):
    match_claim(claim, _flat(REPRO_README))
