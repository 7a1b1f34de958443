"""docs/function_calling.md's BFCL experiment tables, read back from the committed files.

- The report (``docs/bfcl/unseen/report/bfcl.json``) pools every committed cell of each arm, and
  only those: an arm's paths are exactly its ``docs/bfcl/unseen/<arm>_seed<N>/bfcl`` folders.
- The results table (accuracy ±sd [interval] per category and model) and the paired-test table
  (counts, discordant entries, difference with its interval, Holm p) are the report's numbers at
  the precision shown.
- The cells table's step, validation counts and per-category accuracies are each cell's
  ``selection.json``, validation curve and ``bfcl/<category>/metrics.json``.
- Each target's verdict quotes the report's mixture-oracle numbers, and the worst-category claim is
  every cell's parallel_multiple count.
Changing any number of those tables, or committing a cell without regenerating the report, fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNSEEN = ROOT / "docs" / "bfcl" / "unseen"
DOC = (ROOT / "docs" / "function_calling.md").read_text(encoding="utf-8")
REPORT = json.loads((UNSEEN / "report" / "bfcl.json").read_text(encoding="utf-8"))
CATEGORIES = tuple(dict.fromkeys(r["category"] for r in REPORT["rows"]))  # the report's, in its order
ROWS = {(r["model"], r["category"]): r for r in REPORT["rows"]}
COMPARISONS = {(c["a"]["model"], c["b"]["model"], c["category"]): c for c in REPORT["comparisons"]}
ARMS = ("oracle", "mix-robust", "none")


def _section(heading: str) -> str:
    start = DOC.index(f"\n{heading}\n")
    end = DOC.find("\n### ", start + 1)
    return DOC[start : end if end > 0 else len(DOC)]


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables of ``text``: per table its rows' cells, the header first (the rule left out)."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = [cells]
            else:
                current.append(cells)
        elif current is not None:
            tables.append(current[:1] + current[2:])
            current = None
    if current is not None:
        tables.append(current[:1] + current[2:])
    return tables


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _count(v: float) -> str:
    return str(round(v)) if abs(v - round(v)) < 1e-6 else f"{v:.1f}"


def _p(v: float) -> str:
    """A p value as the doc writes it: 1, 0.11, 4.1e-4."""
    if v >= 0.9995:
        return "1"
    if v >= 1e-3:
        return f"{v:.2g}"
    mantissa, exponent = f"{v:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _cells(arm: str) -> list[Path]:
    return sorted(p for p in UNSEEN.glob(f"{arm}_seed*") if (p / "bfcl").is_dir())


@pytest.mark.parametrize("arm", ARMS)
def test_the_report_pools_every_committed_cell_of_each_arm(arm):
    expected = {str((cell / "bfcl").relative_to(ROOT)) for cell in _cells(arm)}
    assert len(expected) >= 2, f"{arm}: fewer than two committed cells"
    for (_, _, category), comparison in COMPARISONS.items():
        for side in ("a", "b"):
            if comparison[side]["model"] == arm:
                paths = {str(Path(p).parent) for p in comparison[side]["paths"]}
                assert paths == expected, (arm, category, sorted(paths))
                assert comparison[side]["seeds"] == len(expected)


def test_the_results_table_is_the_report():
    header, *table = _tables(_section("### Results"))[0]
    models = [h.split("`")[1] for h in header[2:]]
    assert [row[0] for row in table] == list(CATEGORIES)
    for row in table:
        category = row[0]
        for model, cell in zip(models, row[2:]):
            r = ROWS[(model, category)]
            assert row[1] == str(r["n"])
            want = _pct(r["accuracy"])
            if r.get("seeds", 1) > 1:
                want += f" ±{_pct(r['accuracy_sd'])}"
            want += f" [{_pct(r['accuracy_low'])}-{_pct(r['accuracy_high'])}]"
            assert cell == want, (model, category)


def test_the_paired_test_table_is_the_report():
    tables = [t[1:] for t in _tables(_section("### Results")) if t[0][0] == "A against B"]
    assert tables, "no paired-test table in the Results section"
    seen = set()
    for row in tables[0]:
        a, b = (m.strip().strip("`") for m in row[0].split(" / "))
        c = COMPARISONS[(a, b, row[1])]
        d, k = c["difference"], c["contingency"]
        assert row[2:] == [
            f"{_count(c['a']['correct_n'])} / {_count(c['b']['correct_n'])}",
            f"{k['only_a']} / {k['only_b']}",
            f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]",
            _p(c["holm_p"]),
        ], (a, b, row[1])
        seen.add((a, b, row[1]))
    for arm in ("mix-robust", "none"):
        for category in CATEGORIES:
            assert (arm, "oracle", category) in seen


def _validation(cell: Path, step: int) -> tuple[str, str]:
    metrics = cell / "curve" / f"step{step}" / "oracle" / "metrics.json"
    calls = json.loads(metrics.read_text())["calls"] if metrics.exists() else {}
    if "by_answer" in calls:
        by = calls["by_answer"]
        return f"{by['call']['correct_n']} / {by['no_call']['correct_n']}", _pct(calls["call_rate"])
    rescored = json.loads((cell / "curve_by_answer.json").read_text())  # none seed 0, see the doc
    row = next(r for r in rescored["rows"] if r["step"] == step)
    return f"{row['by_answer']['call']['correct_n']} / {row['by_answer']['no_call']['correct_n']}", None


def test_the_cells_table_is_the_committed_cells():
    table = _tables(_section("### The cells"))[0][1:]
    listed = {(row[0].strip("`"), int(row[1])) for row in table}
    committed = {(arm, int(p.name.rsplit("seed", 1)[1])) for arm in ARMS for p in _cells(arm)}
    assert listed == committed
    for row in table:
        cell = UNSEEN / f"{row[0].strip('`')}_seed{row[1]}"
        selection = cell / "selection.json"
        if selection.exists():
            step = json.loads(selection.read_text())["step"]
        else:
            step = json.loads((cell / "curve_by_answer.json").read_text())["choices"]["balanced"]["step"]
        assert row[6] == str(step), cell.name
        counts, call_rate = _validation(cell, step)
        assert row[7] == counts, cell.name
        if call_rate is not None:
            assert row[8] == call_rate, cell.name
        manifest = json.loads((cell / "train_manifest.json").read_text())
        assert row[3] == manifest["git_commit"][:7], cell.name
        assert row[4] == f"{manifest['throughput']['train_runtime_s']:,.0f}", cell.name
        assert row[5] == f"{manifest['train_result']['train_loss']:.2f}", cell.name
        for category, shown in zip(CATEGORIES, row[9:14]):
            metrics = json.loads((cell / "bfcl" / category / "metrics.json").read_text())
            assert shown == _pct(metrics["accuracy"]), (cell.name, category)


def test_each_target_quotes_the_reports_numbers():
    """Target 1 quotes the mixture-oracle difference, its interval and Holm p in three categories;
    target 3's "every cell ... 0 of 197 parallel_multiple" is every committed cell's count."""
    targets = " ".join(_section("### The targets").split())
    for category in ("irrelevance", "simple_python", "multiple"):
        c = COMPARISONS[("mix-robust", "oracle", category)]
        d = c["difference"]
        assert f"{abs(100 * d['value']):.1f} points" in targets, category
        assert f"95 % interval {100 * d['low']:+.1f} to {100 * d['high']:+.1f}, Holm p {_p(c['holm_p'])}" in targets, category
    assert "Every cell of every arm gets 0 of 197 parallel_multiple entries right" in targets
    for arm in ARMS:
        for cell in _cells(arm):
            metrics = json.loads((cell / "bfcl" / "parallel_multiple" / "metrics.json").read_text())
            assert (metrics["correct"], metrics["n"]) == (0, 197), cell.name
    assert len(re.findall(r"\b(?:Not met|Met)\b", targets)) == 3  # a verdict per target
