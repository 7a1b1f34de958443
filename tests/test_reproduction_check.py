"""docs/reproduction/scripts/check_reproduce.py: a `make reproduce` sweep's cells against the committed
report's, response by response, on hand-made folders."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "scripts"))
import check_reproduce  # noqa: E402


def _cell(folder: Path, texts: dict[int, str], gorilla: int, strict: int, right: dict[int, tuple] | None = None) -> None:
    """An eval cell; ``right``: question -> (gorilla correct, strict correct), by default the first
    ``gorilla`` / ``strict`` questions in id order."""
    folder.mkdir(parents=True)
    (folder / "responses.jsonl").write_text("".join(
        json.dumps({"question_id": q, "text": t, "model": "m"}) + "\n" for q, t in texts.items()))
    ids = sorted(texts)
    right = right or {q: (i < gorilla, i < strict) for i, q in enumerate(ids)}
    outcome = lambda ok: "correct" if ok else "error"
    per_question = [{"question_id": q, "gorilla": outcome(right[q][0]), "strict": outcome(right[q][1])} for q in ids]
    (folder / "metrics.json").write_text(json.dumps({"gorilla": {"correct_n": gorilla}, "strict": {"correct_n": strict},
                                                     "per_question": per_question}))


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
            (cell / "train" / "trainer" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")  # complete
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
    # one text differs, the same questions right in both: no discordant question, p = 1 for both metrics
    close = rows[("none", "step1", "0_shot")]
    assert (close["status"], close["same_texts"], close["committed"], close["p"]) == \
        ("close", 2, [2, 1], {"gorilla": 1.0, "strict": 1.0})
    assert close["committed_cell"] == str(docs / "none_full3" / "curve_step1" / "0_shot")
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
    assert "| none | step1 | 0_shot | 2 / 1 | 2 / 1 | 2 / 3 | 1 / 1 | close |" in text
    assert "| none | final | 0_shot | 3 / 2 | 3 / 2 | 3 / 3 | - | same |" in text
    assert text.endswith("2 same, 1 close, 0 differs, 1 new, 6 not run yet")


def test_a_significant_paired_difference_differs_and_close_fails_only_with_exact(tmp_path, capsys):
    """Six questions, all right in the committed cell by the official metric and wrong in the rerun:
    McNemar b = 0, c = 6, p = 2 * (1/2)**6 = 0.03125 < 0.05; strict wrong in both (p = 1)."""
    docs, sweep = tmp_path / "docs", tmp_path / "sweep"
    ids = range(1, 7)
    _cell(docs / "none_full3" / "0_shot", {q: "right" for q in ids}, 6, 0, {q: (True, False) for q in ids})
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("base: {}\neval:\n  settings: [0_shot]\naxes:\n  train_retriever: [none]\n")
    cell = sweep / "cells" / "train_retriever-none-1"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({"axes": {"train_retriever": "none"}}))
    _cell(cell / "eval" / "0_shot", {q: "wrong" for q in ids}, 0, 0, {q: (False, False) for q in ids})
    (row,) = check_reproduce.check(sweep, docs)
    assert (row["status"], row["p"]) == ("differs", {"gorilla": 0.03125, "strict": 1.0})
    assert check_reproduce.main([str(sweep)], docs) == 1
    assert "| none | final | 0_shot | 0 / 0 | 6 / 0 | 0 / 6 | 0.031 / 1 | differs |" in capsys.readouterr().out


def test_exit_codes_close_passes_unless_exact(folders, capsys):
    docs, sweep = folders
    assert check_reproduce.main([str(sweep)], docs) == 0
    assert check_reproduce.main([str(sweep), "--exact"], docs) == 1
    assert "1 close, 0 differs" in capsys.readouterr().out


def test_check_refuses_a_folder_without_a_saved_sweep_file(tmp_path):
    from ratune.errors import RatuneError

    with pytest.raises(RatuneError, match=r"no sweep.yaml; not a folder a sweep ran in"):
        check_reproduce.check(tmp_path)
