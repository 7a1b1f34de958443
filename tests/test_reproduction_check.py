"""docs/reproduction/scripts/check_reproduce.py: a `make reproduce` sweep's cells against the committed
report's, response by response, on hand-made folders."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "scripts"))
import check_reproduce  # noqa: E402


def _cell(folder: Path, texts: dict[int, str], gorilla: int, strict: int) -> None:
    folder.mkdir(parents=True)
    (folder / "responses.jsonl").write_text("".join(
        json.dumps({"question_id": q, "text": t, "model": "m"}) + "\n" for q, t in texts.items()))
    (folder / "metrics.json").write_text(json.dumps({"gorilla": {"correct_n": gorilla}, "strict": {"correct_n": strict}}))


@pytest.fixture
def folders(tmp_path):
    docs, sweep = tmp_path / "docs", tmp_path / "sweep"
    # committed: the none arm's final 0_shot and its curve at step 2; the oracle arm's step-1 checkpoint
    _cell(docs / "none_full3" / "0_shot", {1: "a", 2: "b", 3: "c"}, 3, 2)
    _cell(docs / "none_full3" / "curve_step2" / "0_shot", {1: "a", 2: "b", 3: "c"}, 3, 2)
    _cell(docs / "none_full3" / "curve_step1" / "0_shot", {1: "a", 2: "x", 3: "c"}, 2, 1)
    _cell(docs / "oracle_full1" / "oracle", {1: "o", 2: "o", 3: "o"}, 3, 3)
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("base: {}\neval:\n  settings: [0_shot, oracle]\n  curve_settings: [0_shot]\n"
                                      "axes:\n  train_retriever: [none, oracle, mix-robust_bm25]\n")
    none, oracle = sweep / "cells" / "train_retriever-none-1", sweep / "cells" / "train_retriever-oracle-2"
    for cell, arm, steps in ((none, "none", (1, 2, 3)), (oracle, "oracle", (1,))):
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({"axes": {"train_retriever": arm}}))
        (cell / "train" / "manifest.json").parent.mkdir()
        (cell / "train" / "manifest.json").write_text("{}")
        for step in steps:  # the Trainer checkpoints saved so far: the curve's points
            (cell / "train" / "trainer" / f"checkpoint-{step}").mkdir(parents=True)
            (cell / "train" / "trainer" / f"checkpoint-{step}" / "config.json").write_text("{}")
    (none / "train" / ".complete").write_text("")  # none trained (3 steps); oracle is training (1 step saved)
    _cell(none / "eval" / "0_shot", {1: "a", 2: "b", 3: "c"}, 3, 2)                 # same as committed
    _cell(none / "curve" / "step1" / "0_shot", {1: "a", 2: "y", 3: "c"}, 2, 1)      # one text differs
    _cell(none / "curve" / "step2" / "0_shot", {1: "a", 2: "b", 3: "c"}, 3, 2)
    # none's step 3 (its final model's checkpoint) is not evaluated on the curve yet
    _cell(oracle / "eval" / "0_shot", {1: "z", 2: "z", 3: "z"}, 0, 0)               # nothing committed: new
    return docs, sweep


def test_check_pairs_each_sweep_cell_with_its_committed_cell(folders):
    docs, sweep = folders
    rows = {(r["arm"], r["checkpoint"], r["setting"]): r for r in check_reproduce.check(sweep, docs)}
    assert len(rows) == 10  # 3 arms x 2 settings + none's 3 curve points + oracle's 1
    same = rows[("none", "final", "0_shot")]
    assert (same["status"], same["same_texts"], same["n"], same["sweep"], same["committed"]) == ("same", 3, 3, [3, 2], [3, 2])
    differs = rows[("none", "step1", "0_shot")]
    assert (differs["status"], differs["same_texts"], differs["committed"]) == ("differs", 2, [2, 1])
    assert differs["committed_cell"] == str(docs / "none_full3" / "curve_step1" / "0_shot")
    assert rows[("none", "step2", "0_shot")]["status"] == "same"
    # step 3 is the last step of a finished training run: the committed final 0_shot cell is its counterpart
    last = rows[("none", "step3", "0_shot")]
    assert (last["status"], last["committed_cell"]) == ("not run yet", str(docs / "none_full3" / "0_shot"))
    assert rows[("none", "final", "oracle")]["status"] == "not run yet"
    assert (rows[("oracle", "final", "0_shot")]["status"], rows[("oracle", "final", "0_shot")]["sweep"]) == ("new", [0, 0])
    # the oracle arm's step-1 checkpoint (saved, its training still running) is committed as its own
    # arm folder (oracle_full1); not evaluated here yet. Its final model is not step 1's checkpoint.
    assert rows[("oracle", "step1", "0_shot")]["status"] == "not run yet"
    assert rows[("oracle", "final", "oracle")]["committed"] is None
    # the mixture arm's cell folder does not exist yet: its settings are listed, not run yet
    assert [rows[("mix-robust_bm25", "final", s)]["status"] for s in ("0_shot", "oracle")] == ["not run yet"] * 2


def test_committed_finds_the_final_model_as_its_last_checkpoint(tmp_path):
    _cell(tmp_path / "oracle_full3" / "swap", {1: "s"}, 1, 1)
    _cell(tmp_path / "oracle_full1" / "swap", {1: "t"}, 0, 0)
    assert check_reproduce.committed("oracle", 315, "swap", 315, tmp_path) == tmp_path / "oracle_full3" / "swap"
    assert check_reproduce.committed("oracle", 105, "swap", 315, tmp_path) == tmp_path / "oracle_full1" / "swap"
    assert check_reproduce.committed("oracle", 210, "swap", 315, tmp_path) is None


def test_table_tallies_the_statuses(folders):
    docs, sweep = folders
    text = check_reproduce.table(check_reproduce.check(sweep, docs))
    assert "| none | step1 | 0_shot | 2 / 1 | 2 / 1 | 2 / 3 | differs |" in text
    assert text.endswith("2 same, 1 differs, 1 new, 6 not run yet")


def test_check_refuses_a_folder_without_a_saved_sweep_file(tmp_path):
    from ratune.errors import RatuneError

    with pytest.raises(RatuneError, match=r"no sweep.yaml; not a folder a sweep ran in"):
        check_reproduce.check(tmp_path)
