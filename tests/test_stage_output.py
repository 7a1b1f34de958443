"""ratune/output.py ``StageOutput``: the one way a command writes its output folder. The refusals of
a second process through the CLI are tests/test_ownership.py's; here the context's own order:
the ownership check writes nothing, the lock is held while writing only, a process that does not
lock writes no lock file, a replaced folder is swapped in only on success, and no writer calls the
pieces (lock, marker, swap, ``.complete``) itself."""

from __future__ import annotations

import ast
import json
import os
import socket

import pytest

from ratune.errors import RatuneError
from ratune.locks import LockHeld, lock_path
from ratune.manifest import COMPLETE_MARKER, OWNER_MARKER
from ratune.output import StageOutput, built_beside, reserve_sibling
from source_tree import ROOT, source_files


def test_the_lock_is_held_while_writing_and_the_folder_is_claimed(tmp_path):
    out = tmp_path / "out"
    output = StageOutput(out, "unit", command="unit")
    with output.writing() as folder:
        holder = json.loads(lock_path(out).read_text())
        assert folder == out and json.loads((out / OWNER_MARKER).read_text()) == {"stage": "unit"}
        output.complete()
    assert holder["pid"] == os.getpid() and holder["command"] == "unit" and holder["host"] == socket.gethostname()
    assert not lock_path(out).exists()  # released
    assert (out / COMPLETE_MARKER).read_text() == "complete\n"


def test_a_process_that_does_not_lock_writes_no_lock_and_claim_false_creates_nothing(tmp_path):
    out = tmp_path / "deep" / "run"
    with StageOutput(out, "train", lock=False, claim=False).writing() as folder:
        assert folder == out
    assert not (tmp_path / "deep").exists()  # not even the parent folder
    with StageOutput(out, "train", claim=False).writing():
        assert lock_path(out).exists() and not out.exists()
    assert not lock_path(out).exists()


def test_the_ownership_check_writes_nothing_and_runs_again_under_the_lock(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "mine.txt").write_text("a user's file\n")
    with pytest.raises(RatuneError, match=r"user: not a ratune eval run output .*does not write into folders"):
        StageOutput(user, "eval run").check()
    with pytest.raises(RatuneError, match=r"user: not a ratune eval run output .*does not write into folders"):
        with StageOutput(user, "eval run").writing():
            raise AssertionError("never runs on a folder ratune did not make")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user"]  # no lock file was made

    # a folder another writer filled between the first check and the lock
    empty = tmp_path / "empty"
    empty.mkdir()
    import ratune.output as output_module

    real_output_lock = output_module.output_lock

    def output_lock(target, **kwargs):
        (empty / "theirs.txt").write_text("written while we waited\n")
        return real_output_lock(target, **kwargs)

    monkeypatch.setattr(output_module, "output_lock", output_lock)
    with pytest.raises(RatuneError, match="not a ratune eval run output"):
        with StageOutput(empty, "eval run").writing():
            raise AssertionError("refused under the lock")
    assert not lock_path(empty).exists() and not (empty / OWNER_MARKER).exists()


def test_a_held_lock_refuses_the_writer(tmp_path):
    out = tmp_path / "out"
    lock = lock_path(out)
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "command": "first"}))  # not taken over
    with pytest.raises(LockHeld, match=rf"{out} is being written by pid 1 on another-host \(first\); lock file {lock}"):
        with StageOutput(out, "second").writing():
            raise AssertionError("never runs while another writer holds the lock")
    assert lock.exists() and not out.exists()


def test_a_replaced_folder_is_swapped_in_on_success_only(tmp_path):
    out = tmp_path / "index"
    output = StageOutput(out, "retrieval index", replace=True)
    with output.writing() as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".ratune-tmp.") and tmp.name.endswith(".index")
        (tmp / "arrays.npz").write_text("first")
        output.complete()
    assert sorted(p.name for p in out.iterdir()) == [COMPLETE_MARKER, OWNER_MARKER, "arrays.npz"]
    stale = tmp_path / ".ratune-tmp.deadbeef.index"  # left by a killed writer
    stale.mkdir()
    with pytest.raises(KeyboardInterrupt):
        with StageOutput(out, "retrieval index", replace=True).writing() as tmp:
            (tmp / "arrays.npz").write_text("second")
            raise KeyboardInterrupt
    assert (out / "arrays.npz").read_text() == "first"  # the previous content stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # the stale and the new sibling are gone
    with pytest.raises(RatuneError, match=r"index: not a ratune data build output \(it is a ratune retrieval index "
                                          r"output\); ratune does not overwrite folders"):
        StageOutput(out, "data build", replace=True, action="overwrite").check()


def test_a_sub_folder_built_beside_by_one_process_of_several(tmp_path):
    final = tmp_path / "run" / "model"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".ratune-tmp.0000dead.model").mkdir()  # a killed save's
    token = reserve_sibling(final)
    with built_beside(final, token, writer=False) as other:  # another rank: a path, no swap
        pass
    with built_beside(final, token) as tmp:
        assert tmp == other and tmp.is_dir()
        (tmp / "model.safetensors").write_text("weights")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]
    assert (final / "model.safetensors").read_text() == "weights"


#: Modules that may call the pieces: their owners, and the demo model's conversion cache
#: (ratune/models.py), which concurrent processes fill without a lock (a lost race keeps the
#: winner's folder), so it is no stage output.
OWNERS = {"ratune/output.py", "ratune/locks.py", "ratune/manifest.py", "ratune/io.py", "ratune/models.py"}
PIECES = {"output_lock", "claim_folder", "mark_complete", "swap_folder", "temp_folder", "stale_temp_folders",
          "require_owned"}


def test_no_writer_calls_the_pieces_itself():
    calls = []
    for path in source_files():
        name = str(path.relative_to(ROOT))
        if name in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if called in PIECES:
                    calls.append(f"{name}:{node.lineno} {called}")
    assert calls == []
