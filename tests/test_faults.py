"""Operating-system faults while ratune writes are one line, exit 2, and leave a rerunnable state:
a full disk (a real small tmpfs, so native writers such as pyarrow, tokenizers, safetensors and
torch.save meet it too), a full disk without a file name from a library, a read-only file system."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from ratune.boundary import run_guarded, write_fault
from ratune.locks import output_lock


def test_a_write_fault_without_a_file_name_names_the_output_being_written(tmp_path, capsys):
    out = tmp_path / "build"

    def fill_the_disk():
        with output_lock(out):
            raise OSError(errno.ENOSPC, "No space left on device")  # as close() raises it: no filename

    assert run_guarded(fill_the_disk) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ratune: error: no space left on device (errno ENOSPC) while writing {out}: what was complete "
                   "before is kept and nothing partial is marked complete; free space (or fix the file system) and "
                   "rerun the same command to continue"]


def test_a_native_error_without_an_errno_on_a_full_disk_is_one_line(small_disk, capsys):
    """torch.save reports a full disk as ``RuntimeError: ... iostream error``, with no errno: the
    boundary reads the output's file system, and only then calls it a full disk."""
    def torch_save(out):
        with output_lock(out):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6296704 vs 6296592")

    with pytest.raises(RuntimeError):  # room left: a bug keeps its traceback
        run_guarded(lambda: torch_save(small_disk / "run"))
    _fill(small_disk, leave=0)
    assert run_guarded(lambda: torch_save(small_disk / "run")) == 2
    assert capsys.readouterr().err.startswith("ratune: error: no space left on device (errno ENOSPC) while writing "
                                              f"{small_disk / 'run'}")


def test_a_libraries_own_exception_carrying_os_error_28_is_one_line(tmp_path, capsys):
    def tokenizer_save():  # tokenizers raises a plain Exception from Rust, the errno in its text
        with output_lock(tmp_path / "run"):
            try:
                raise OSError(errno.EDQUOT, "Disk quota exceeded")
            except OSError:
                raise Exception("No space left on device (os error 28)")

    assert run_guarded(tokenizer_save) == 2
    assert capsys.readouterr().err.startswith(f"ratune: error: no space left on device (errno ENOSPC) while writing "
                                              f"{tmp_path / 'run'}: ")
    assert write_fault(Exception("Read-only file system (os error 30)")) == errno.EROFS
    assert write_fault(Exception("os error 28")) is None and write_fault(ValueError("x")) is None


def test_other_exceptions_keep_their_traceback(tmp_path):
    def bug():
        with output_lock(tmp_path / "x"):
            raise OSError(errno.EINVAL, "Invalid argument")  # not a write fault and no file: a bug

    with pytest.raises(OSError, match="Invalid argument"):
        run_guarded(bug)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 64 MB at tmp_path/disk (CI runs as root); skipped where mounting is refused."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path, leave: int) -> None:
    """Fill the disk until ``leave`` bytes are free."""
    import os

    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


def test_data_build_overwrite_on_a_full_disk_keeps_the_old_build(small_disk, apibench_tiny, smol_tokenizer_dir,
                                                                 capsys):
    from ratune.cli import main

    out = small_disk / "data"
    argv = ["data", "build", "--apibench", str(apibench_tiny), "--hub", "torchhub", "--out", str(out),
            "--tokenizer", str(smol_tokenizer_dir), "--modes", "none", "oracle"]
    assert main(argv) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _fill(small_disk, leave=64 * 1024)
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ratune")]  # progress bars aside
    assert len(lines) == 1 and lines[0].startswith("ratune: error: no space left on device (errno ENOSPC) while "
                                                   f"writing {out}"), lines
    assert "Traceback" not in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # byte-identical
    assert sorted(p.name for p in small_disk.iterdir()) == ["data", "filler"]  # no temporary folder left
    (small_disk / "filler").unlink()
    assert main([*argv, "--overwrite"]) == 0  # the plain rerun


def test_training_on_a_full_disk_is_one_line_and_resumes_after_freeing_space(small_disk, tiny_model_dir, capsys):
    """Room for one checkpoint only; the second save fails inside a library (rc 2,
    one line), leaves a partial checkpoint; after space is freed the rerun passes over it."""
    from ratune.cli import main
    from ratune.train.layout import checkpoint_gap
    from test_train_correctness import _config, _make_data

    from ratune.train.sft import train

    data = _make_data(small_disk.parent / "data", n=4)
    run = small_disk / "run"
    cfg = _config(tiny_model_dir, data, run, global_batch_size=1, max_steps=4, save_steps=2)
    path = small_disk.parent / "train.yaml"
    path.write_text(json.dumps(cfg.model_dump()))
    measured = small_disk.parent / "measured"  # the same run off the small disk, to size a checkpoint
    train(cfg.model_copy(update={"output_dir": str(measured), "max_steps": 2}))
    def size(folder, skip=()):  # bytes on a tmpfs: whole pages
        return sum(-(-p.stat().st_size // 4096) * 4096 for p in folder.rglob("*")
                   if p.is_file() and not any(s in p.relative_to(folder).parts for s in skip))

    # everything the run writes up to checkpoint-2 fits, and half of another checkpoint: checkpoint-4 does not
    _fill(small_disk, leave=size(measured, skip=("model",)) + size(measured / "trainer" / "checkpoint-2") // 2)
    capsys.readouterr()
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ratune")]
    assert len(lines) == 1 and lines[0].startswith("ratune: error: no space left on device"), lines
    assert "Traceback" not in err
    assert checkpoint_gap(run / "trainer" / "checkpoint-2") is None
    (small_disk / "filler").unlink()
    assert main(["train", "--config", str(path), "--on-unfinished", "resume"]) == 0
    assert (run / ".complete").exists()
