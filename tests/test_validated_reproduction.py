"""docs/reproduction/README.md's validated re-run: each arm's subsection names its committed folder
(``Files: [validated/NAME/]``), and its validation-curve table, the checkpoint it marks as chosen and
its test table are that folder's curve/, selection.json and eval/ cells, number for number."""

import json
import re
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parent.parent / "docs" / "reproduction"
TEXT = (REPRO / "README.md").read_text(encoding="utf-8")
SECTION = TEXT[TEXT.index("## The re-run with every choice made on validation"):]
SECTION = SECTION[:SECTION.index("\n## ", 1)]
#: column headers of the two tables -> setting folders
CURVE_COLUMNS = {"0-shot": "0_shot", "bm25": "bm25", "oracle": "oracle"}
TEST_COLUMNS = {"0-shot": "0_shot", "paper's GPT-Index documents": "gpt_index",
                "paper's BM25 documents": "released_bm25", "our BM25": "bm25", "dense": "dense",
                "`dense_ft`": "dense_ft", "gold document": "oracle"}


def _subsections() -> dict[str, str]:
    """Committed folder name -> the text of the subsection that reports it."""
    parts = re.split(r"\n### ", SECTION)[1:]
    found = {}
    for part in parts:
        if m := re.search(r"Files: \[validated/(\w+)/\]", part):
            found[m[1]] = part
    return found


def _tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append([row for row in current if not set("".join(row)) <= set("-: ")])
            current = []
    return tables


def _counts(metrics: Path) -> tuple[int, int]:
    m = json.loads(metrics.read_text())
    return m["strict"]["correct_n"], m["gorilla"]["correct_n"]


SUBSECTIONS = _subsections()


def test_every_committed_validated_arm_is_reported():
    committed = {p.parent.name for p in (REPRO / "validated").glob("*/cell.json")}
    assert committed and committed == set(SUBSECTIONS), (committed, set(SUBSECTIONS))


@pytest.mark.parametrize("name", sorted(SUBSECTIONS))
def test_curve_table_and_choice_are_the_committed_curve(name):
    folder = REPRO / "validated" / name
    selection = json.loads((folder / "selection.json").read_text())
    steps = sorted((folder / "curve").glob("step*"), key=lambda p: int(p.name[4:]))
    table = next(t for t in _tables(SUBSECTIONS[name]) if t[0][0] == "epoch")
    header, rows = table[0], table[1:]
    assert len(rows) == len(steps) == len(selection["scores"])
    for epoch, (row, step) in enumerate(zip(rows, steps), 1):
        assert row[0] == str(epoch)
        for column, cell in zip(header[1:], row[1:]):
            strict, official = _counts(step / CURVE_COLUMNS[column] / "metrics.json")
            chosen = int(step.name[4:]) == selection["step"] and CURVE_COLUMNS[column] == selection["setting"]
            shown = f"**{strict}**" if chosen else str(strict)
            assert cell == f"{shown} ({official})", (name, epoch, column)
    assert f"epoch {int(selection['epoch'])} chosen on validation" in SUBSECTIONS[name].splitlines()[0]


@pytest.mark.parametrize("name", sorted(SUBSECTIONS))
def test_test_table_is_the_committed_test_cells(name):
    folder = REPRO / "validated" / name
    tables = [t for t in _tables(SUBSECTIONS[name]) if t[0][0] == "0-shot"]
    if not tables:
        assert not (folder / "eval").exists(), f"{name}: test cells committed but not reported"
        return
    (header, row), = tables
    selection = json.loads((folder / "selection.json").read_text())
    for column, cell in zip(header, row):
        metrics = folder / "eval" / TEST_COLUMNS[column] / "metrics.json"
        assert json.loads(metrics.read_text())["train_step"] == selection["step"], (name, column)
        assert cell == "{} / {}".format(*_counts(metrics)), (name, column)


def test_oracle_arm_writes_the_test_selected_models_answers_given_a_document():
    """The oracle subsection's last claim: with every document setting both models share, the
    validated oracle arm's 186 answers are oracle_full1's, text for text."""
    def texts(folder: Path) -> list[str]:
        return [json.loads(line)["text"] for line in (folder / "responses.jsonl").read_text().splitlines()]

    shared = ("gpt_index", "released_bm25", "dense_ft", "oracle")
    assert "(GPT-Index, the paper's BM25, `dense_ft`, gold) it writes the same\n  186 answers" in SUBSECTIONS["oracle_full"]
    for setting in shared:
        ours, earlier = (texts(REPRO / f / setting) for f in ("validated/oracle_full/eval", "oracle_full1"))
        assert len(ours) == 186 and ours == earlier, setting
