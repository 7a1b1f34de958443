"""ratune/locks.py ``locked_output``: the one way a command holds its output's lock for a whole
call (train/sft.py ``train``, eval/run.py ``evaluate_checkpoint``, export/checkpoint.py
``export_checkpoint``), with the function's signature written once. The refusals of a second
process through the CLI are tests/test_ownership.py's; here the decorator's own order: argument
checks and the ownership check write nothing, the lock is held during the call only, and a rank
that does not lock writes no lock file."""

from __future__ import annotations

import inspect
import json
import os
import socket
from types import SimpleNamespace

import pytest

from ratune.errors import RatuneError
from ratune.locks import LockHeld, lock_path, locked_output


def test_the_lock_is_held_during_the_call_and_the_signature_is_the_functions(tmp_path):
    seen = {}

    @locked_output("out_dir", command="unit")
    def write(name: str, *, out_dir, suffix: str = "!") -> str:
        """Write one file."""
        holder = json.loads(lock_path(out_dir).read_text())
        seen.update(holder=holder)
        return name + suffix

    out = tmp_path / "out"
    assert write("x", out_dir=out) == "x!"
    assert seen["holder"]["pid"] == os.getpid() and seen["holder"]["command"] == "unit"
    assert seen["holder"]["host"] == socket.gethostname()
    assert not lock_path(out).exists()  # released
    assert write.__name__ == "write" and write.__doc__ == "Write one file."
    assert inspect.signature(write) == inspect.signature(write.__wrapped__)
    assert list(inspect.signature(write).parameters) == ["name", "out_dir", "suffix"]
    with pytest.raises(TypeError, match=r"write\(\) missing 1 required keyword-only argument: 'out_dir'"):
        write("x")  # the function's own TypeError


def test_an_attribute_of_an_argument_names_the_output_and_a_rank_that_does_not_lock_writes_no_lock(tmp_path):
    main = {"rank0": False}
    out = tmp_path / "deep" / "run"

    @locked_output("config.output_dir", command="train", enabled=lambda: main["rank0"])
    def train(config):
        return lock_path(config.output_dir).exists()

    config = SimpleNamespace(output_dir=str(out))
    assert train(config) is False and not (tmp_path / "deep").exists()  # not even the parent folder
    main["rank0"] = True
    assert train(config) is True and not lock_path(out).exists()


def test_checks_refuse_before_anything_is_written_and_ownership_is_checked_again_under_the_lock(tmp_path):
    calls = []

    def check(out_dir, push, **_):
        calls.append("check")
        if push:
            raise RatuneError("no token")

    @locked_output("out_dir", command="export", resolve=True, check=check)
    def export(out_dir, *, push=False):
        calls.append("body")

    out = tmp_path / "missing_parent" / "out"
    with pytest.raises(RatuneError, match="no token"):
        export(out, push=True)
    assert calls == ["check"] and not (tmp_path / "missing_parent").exists()

    user = tmp_path / "user"
    user.mkdir()
    (user / "mine.txt").write_text("a user's file\n")

    @locked_output("out_dir", command="eval run", owned_by="eval run")
    def evaluate(*, out_dir):
        raise AssertionError("never runs on a folder ratune did not make")

    with pytest.raises(RatuneError, match=r"user: not a ratune eval run output .*does not write into folders"):
        evaluate(out_dir=user)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user"]  # no lock file was made

    # the ownership check runs again once the lock is held: a folder another writer filled meanwhile
    empty = tmp_path / "empty"
    empty.mkdir()

    def fill(**_):
        (empty / "theirs.txt").write_text("written while we waited\n")

    @locked_output("out_dir", command="eval run", owned_by="eval run", check=lambda **_: None)
    def evaluate_late(*, out_dir):
        raise AssertionError("refused under the lock")

    with pytest.MonkeyPatch.context() as mp:  # the first check passes (empty); filled before the lock is taken
        import ratune.locks as locks

        real_output_lock = locks.output_lock

        def output_lock(target, **kwargs):
            fill()
            return real_output_lock(target, **kwargs)

        mp.setattr(locks, "output_lock", output_lock)
        with pytest.raises(RatuneError, match="not a ratune eval run output"):
            evaluate_late(out_dir=empty)
    assert not lock_path(empty).exists()


def test_a_held_lock_refuses_the_call(tmp_path):
    @locked_output("out_dir", command="second")
    def write(out_dir):
        raise AssertionError("never runs while another writer holds the lock")

    out = tmp_path / "out"
    lock = lock_path(out)
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "command": "first"}))  # not taken over
    with pytest.raises(LockHeld, match=rf"{out} is being written by pid 1 on another-host \(first\); lock file {lock}"):
        write(out)
    assert lock.exists() and not out.exists()


def test_a_name_that_is_no_parameter_is_refused_at_decoration():
    with pytest.raises(TypeError, match=r"locked_output\('out'\): .*f has no parameter 'out'"):
        @locked_output("out", command="x")
        def f(out_dir):
            pass
