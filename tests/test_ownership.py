"""Ratune never deletes or overwrites what it did not create, a failed rebuild keeps the previous
build, temporary folders are unique and ratune's, and two processes never write one
output at once (docs/reliability.md#what-ratune-deletes-or-overwrites).

- data build --overwrite refuses a folder holding a user's file (message names the folder and says
  it is not a ratune output); a rebuild that fails on a bad input line, or is interrupted after a
  mode was written, leaves the previous build byte-identical and no temporary sibling.
- retrieval train --overwrite, retrieval index, eval run and the demo's cleanup of an unfinished
  training arm refuse folders ratune did not make, leaving the user's files as they were.
- export leaves a user's OUT.tmp untouched, accepts ``..`` in --out (resolved: the model lands in
  the folder the path names), refuses an output inside the checkpoint in one line.
- the training save's temporary folder is unique and ratune's (a user's model.tmp survives; a stale
  ratune temporary folder of that save is removed).
- the demo model's one-time conversion (ratune/models.py ``ensure_demo_model``) writes into a unique
  ratune temporary sibling and renames it into place: a user's folder beside the cache is never
  touched, and a conversion that loses a race keeps the winner's folder and removes only its own.
- a second process on a locked output (a real holder process, started with sys.executable) is
  refused by data build, retrieval index, eval run, export and train in one line naming the lock
  file and the holder's pid; a lock left by a dead process on this host is taken over with a note.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import ratune.models as model_module
from ratune.errors import RatuneError
from ratune.models import DEMO_MODEL_ALIAS, ensure_demo_model


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _ratune_temps(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".ratune-"))


def _one_error_line(err: str) -> str:
    """The one ``ratune: error:`` line of a refusal (progress bars of the steps before it aside)."""
    lines = [line for line in err.splitlines() if line.startswith("ratune: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def small_apibench(tmp_path_factory, apibench):
    """The TorchHub files of APIBench (API database, train and eval examples), copied."""
    from ratune.sources.apibench import api_database_path, examples_path

    root = tmp_path_factory.mktemp("apibench")
    for src in (api_database_path(apibench, "torchhub"), examples_path(apibench, "torchhub", "train"),
                examples_path(apibench, "torchhub", "eval")):
        dst = root / src.relative_to(apibench)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return root


def _build_argv(apibench_dir, out, tokenizer_dir, *extra):
    return ["data", "build", "--apibench", str(apibench_dir), "--hub", "torchhub", "--out", str(out),
            "--tokenizer", str(tokenizer_dir), "--max-length", "512", "--max-document-tokens", "64",
            "--modes", "none", "oracle", *extra]


# ----------------------------------------------------------------------------- who made a folder


def test_output_stage_reads_the_marker_or_the_record_file_only(tmp_path):
    from ratune.manifest import claim_folder, output_stage, require_owned

    def folder(name: str, files: dict[str, str]) -> Path:
        path = tmp_path / name
        for rel, text in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_text(text)
        return path

    marked = folder("marked", {"x.txt": ""})
    claim_folder(marked, "train")
    assert output_stage(marked) == "train"
    data = folder("data", {"manifest.json": '{"command": "data build"}'})
    claim_folder(data, "data build")
    assert output_stage(folder("export", {"ratune_export.json": "{}"})) == "export"  # pushed as it is: no marker
    # a manifest, a cell's identity.json or a saved sweep file alone is not ratune's mark
    for user in (folder("u1", {"notes.txt": ""}), folder("u2", {"manifest.json": '{"command": "data build"}'}),
                 folder("u3", {"0_shot/identity.json": "{}"}), folder("u4", {".ratune-output": "not json"}),
                 folder("u5", {"sweep.yaml": "axes: {}\nsource: configs/sweeps/x.yaml\n"}),
                 folder("u6", {".ratune-output": "[1, 2]"}), folder("u7", {"ratune_bm25_index.json": "{}"})):
        assert output_stage(user) is None
        with pytest.raises(RatuneError, match=rf"{user}: not a ratune train output .*does not delete folders"):
            require_owned(user, "train", action="delete")
    with pytest.raises(RatuneError, match="not a ratune train output \\(it is a ratune data build output\\)"):
        require_owned(data, "train")
    require_owned(tmp_path / "missing", "train")
    (tmp_path / "empty").mkdir()
    require_owned(tmp_path / "empty", "train")
    (tmp_path / "file").write_text("")
    with pytest.raises(RatuneError, match="exists and is not a folder"):
        require_owned(tmp_path / "file", "train")


# ------------------------------------------------------------------------------------ data build


def test_data_build_overwrite_never_deletes_a_user_folder(tmp_path, small_apibench, smol_tokenizer_dir, capsys):
    from ratune.cli import main

    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("my own notes\n")
    for extra in ((), ("--overwrite",)):
        assert main(_build_argv(small_apibench, user, smol_tokenizer_dir, *extra)) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"{user}: not a ratune data build output" in line
    assert _snapshot(user) == {"notes.txt": b"my own notes\n"}
    assert _ratune_temps(tmp_path) == []


def test_failed_or_interrupted_rebuild_keeps_the_previous_build(tmp_path, small_apibench, smol_tokenizer_dir,
                                                                capsys, monkeypatch):
    from ratune.cli import main
    from ratune.sources.apibench import examples_path

    apibench = tmp_path / "apibench"
    shutil.copytree(small_apibench, apibench)
    out = tmp_path / "data"
    assert main(_build_argv(apibench, out, smol_tokenizer_dir, "--json")) == 0
    capsys.readouterr()
    before = _snapshot(out)
    assert {"manifest.json", ".complete", ".ratune-output", "none/dataset_dict.json",
            "oracle/dataset_dict.json"} <= set(before)
    assert json.loads(before[".ratune-output"]) == {"stage": "data build"}

    # a bad input line: the rebuild fails, the previous build stays as it was
    train_file = examples_path(apibench, "torchhub", "train")
    data = train_file.read_bytes()
    train_file.write_bytes(data + (b"" if data.endswith(b"\n") else b"\n") + b'{"code": "torn\n')
    bad_line = len(train_file.read_bytes().splitlines())
    assert main(_build_argv(apibench, out, smol_tokenizer_dir, "--overwrite")) == 2
    assert f"{train_file}:{bad_line}:" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(out) == before
    assert _ratune_temps(tmp_path) == []

    # interrupted after the first mode was written into the new build: the same
    shutil.copyfile(small_apibench / train_file.relative_to(apibench), train_file)
    import ratune.data.build as build

    real, calls = build.build_rows, []

    def interrupt_second_mode(*args, **kwargs):
        calls.append(kwargs["mode"])
        if kwargs["mode"] == "oracle":
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "build_rows", interrupt_second_mode)
    assert main(_build_argv(apibench, out, smol_tokenizer_dir, "--overwrite")) == 130
    assert calls == ["none", "none", "oracle"]  # train and eval of none were built, then Ctrl-C
    assert _snapshot(out) == before
    assert _ratune_temps(tmp_path) == []

    # the rerun the interrupt message asks for works and swaps the new build in
    monkeypatch.setattr(build, "build_rows", real)
    assert main(_build_argv(apibench, out, smol_tokenizer_dir, "--overwrite", "--json")) == 0
    after = _snapshot(out)
    assert set(after) == set(before) and after["none/dataset_dict.json"] == before["none/dataset_dict.json"]
    assert _ratune_temps(tmp_path) == []


# ------------------------------------------------------------ other commands that replace or write


def test_retrieval_train_overwrite_and_index_refuse_a_user_folder(tmp_path, apibench, capsys):
    from ratune.cli import main

    user = tmp_path / "mine"
    user.mkdir()
    (user / "arrays.npz").write_bytes(b"not ours")
    assert main(["retrieval", "train", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(user),
                 "--overwrite"]) == 2
    assert f"{user}: not a ratune retrieval train output" in _one_error_line(capsys.readouterr().err)
    assert main(["retrieval", "index", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(user)]) == 2
    assert f"{user}: not a ratune retrieval index output" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(user) == {"arrays.npz": b"not ours"}

    # a ratune index is rebuilt in place of the old one (swapped in; no temporary folder left)
    index = tmp_path / "index"
    assert main(["retrieval", "index", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(index)]) == 0
    first = _snapshot(index)
    assert main(["retrieval", "index", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(index)]) == 0
    assert _snapshot(index) == first and json.loads(first[".ratune-output"]) == {"stage": "retrieval index"}
    assert _ratune_temps(tmp_path) == []


def test_eval_run_refuses_to_write_into_a_user_folder(tmp_path, apibench, tiny_model_dir, capsys):
    from ratune.cli import main

    user = tmp_path / "responses"
    (user / "0_shot").mkdir(parents=True)
    theirs = b'{"question_id": 1, "text": "their own answer"}\n'
    (user / "0_shot" / "responses.jsonl").write_bytes(theirs)
    assert main(["eval", "run", "--checkpoint", str(tiny_model_dir), "--hub", "torchhub", "--apibench",
                 str(apibench), "--out", str(user), "--settings", "0_shot", "--n-questions", "2"]) == 2
    assert f"{user}: not a ratune eval run output" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(user) == {"0_shot/responses.jsonl": theirs}



# ------------------------------------------- commands that write fixed file names into a folder


def _sweep_file(tmp_path: Path, **over) -> Path:
    import yaml

    data = {"name": "t", "out_dir": str(tmp_path / "sweep"),
            "base": {"model": "tiny-model", "hub": "torchhub", "train_retriever": "none", "global_batch_size": 4,
                     "max_steps": 2},
            "eval": {"settings": ["0_shot"], "n_questions": 2}, "axes": {"train_retriever": ["none", "oracle"]},
            **over}
    path = tmp_path / "sweep_file.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_sweep_never_writes_into_a_user_folder(tmp_path, capsys):
    """Both launchers refuse a non-empty folder ratune did not make before writing (its sweep.yaml
    and slurm/submit.sh were overwritten before); a new folder is marked and can be written again;
    a folder holding only a saved-looking sweep.yaml is not ratune's."""
    from ratune.cli import main

    user = tmp_path / "mine"
    (user / "slurm").mkdir(parents=True)
    (user / "sweep.txt").write_text("mine\n")
    (user / "slurm" / "submit.sh").write_text("my own script\n")
    path = _sweep_file(tmp_path)
    for launcher in ("local", "slurm"):
        assert main(["sweep", str(path), "--launcher", launcher, "--out", str(user)]) == 2
        assert f"{user}: not a ratune sweep output (it has no .ratune-output marker)" in \
            _one_error_line(capsys.readouterr().err)
    assert _snapshot(user) == {"sweep.txt": b"mine\n", "slurm/submit.sh": b"my own script\n"}

    new = tmp_path / "new"
    for _ in range(2):  # a second run writes into its own folder
        assert main(["sweep", str(path), "--launcher", "slurm", "--out", str(new)]) == 0
    assert json.loads((new / ".ratune-output").read_text()) == {"stage": "sweep"}
    assert (new / "slurm" / "submit.sh").is_file()

    old = tmp_path / "old"  # no marker: a sweep.yaml that names a source does not make it ratune's
    old.mkdir()
    (old / "sweep.yaml").write_text("name: t\nsource: configs/sweeps/x.yaml\n")
    assert main(["sweep", str(path), "--launcher", "slurm", "--out", str(old)]) == 2
    assert f"{old}: not a ratune sweep output (it has no .ratune-output marker)" in \
        _one_error_line(capsys.readouterr().err)

    # a user's own, hand-written sweep.yaml in its folder is not a saved one: refused, kept as it was
    exp = tmp_path / "exp"
    exp.mkdir()
    mine = "# my sweep, with comments\nname: t\n"
    (exp / "sweep.yaml").write_text(mine)
    assert main(["sweep", str(path), "--launcher", "slurm", "--out", str(exp)]) == 2
    assert f"{exp}: not a ratune sweep output (it has no .ratune-output marker)" in \
        _one_error_line(capsys.readouterr().err)
    assert _snapshot(exp) == {"sweep.yaml": mine.encode()}


def test_sweep_refuses_a_missing_accelerate_config_before_anything_runs(tmp_path, capsys):
    from ratune.cli import main

    path = _sweep_file(tmp_path, accelerate_config="no/such/accelerate.yaml")
    for launcher in (["--dry-run"], ["--launcher", "slurm"]):
        assert main(["sweep", str(path), *launcher]) == 2
        assert _one_error_line(capsys.readouterr().err) == (
            f"ratune: error: {path}: accelerate_config: no/such/accelerate.yaml: no such file (a relative path is "
            "looked up from the working directory, then from the sweep file's folder and the folders above it)")
    assert not (tmp_path / "sweep").exists()


def test_report_never_writes_into_a_user_folder(tmp_path, capsys):
    """ratune report (a sweep folder, or --eval folders) refuses --out folders ratune did not make
    (a user's sweep.csv was overwritten before); its own report folders, old ones included, are
    written again; --hub and --model, which a sweep report cannot use, are refused, not ignored."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from sweep_cells import finished_cell, rate_metrics

    from ratune.cli import main

    sweep_dir = tmp_path / "sweep"
    cell = finished_cell(sweep_dir, "train_retriever-none", {"train_retriever": "none"},
                         {"0_shot": {**rate_metrics(10, 4, 2), "hub": "torchhub"}})
    user = tmp_path / "mine"
    user.mkdir()
    (user / "sweep.csv").write_text("my own table\n")
    assert main(["report", str(sweep_dir), "--out", str(user)]) == 2
    assert f"{user}: not a ratune report output" in _one_error_line(capsys.readouterr().err)
    assert main(["report", "--eval", f"none={cell / 'eval'}", "--model", "m", "--out", str(user)]) == 2
    assert f"{user}: not a ratune report output" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(user) == {"sweep.csv": b"my own table\n"}

    for _ in range(2):
        assert main(["report", str(sweep_dir)]) == 0
    assert json.loads((sweep_dir / "report" / ".ratune-output").read_text()) == {"stage": "report"}
    old_sweep_report = tmp_path / "old1"  # no marker: a sweep.json does not make it ratune's
    old_sweep_report.mkdir()
    (old_sweep_report / "sweep.json").write_text("{}")
    assert main(["report", str(sweep_dir), "--out", str(old_sweep_report)]) == 2
    assert f"{old_sweep_report}: not a ratune report output" in _one_error_line(capsys.readouterr().err)
    # the default report/ of a ratune sweep folder is ratune's even when an interrupted report left
    # it without sweep.json or marker
    (sweep_dir / ".ratune-output").write_text('{"stage": "sweep"}')
    for name in ("sweep.json", ".ratune-output"):
        (sweep_dir / "report" / name).unlink()
    assert main(["report", str(sweep_dir)]) == 0
    # a demo folder's root, or a user's folder that holds data/manifest.json, is not a report folder
    demo, proj = tmp_path / "demo", tmp_path / "proj"
    (demo / "cells").mkdir(parents=True)
    (demo / ".ratune-output").write_text('{"stage": "demo"}')
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "manifest.json").write_text('{"command": "data build"}')
    for folder in (demo, proj):
        assert main(["report", str(sweep_dir), "--out", str(folder)]) == 2
        assert f"{folder}: not a ratune report output" in _one_error_line(capsys.readouterr().err)
    assert not (proj / ".ratune-output").exists() and not (demo / "sweep.json").exists()

    assert main(["report", str(sweep_dir), "--hub", "huggingface"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "ratune: error: --hub: for --eval folders only; a sweep report takes every cell's hub and model from its "
        "cell.json (one table per hub)")
    assert main(["report", str(sweep_dir), "--hub", "torchhub", "--model", "m"]) == 2
    assert "--hub and --model: for --eval folders only" in _one_error_line(capsys.readouterr().err)
    empty = tmp_path / "empty_eval"
    empty.mkdir()
    assert main(["report", "--eval", f"none={empty}", "--model", "m", "--out", str(tmp_path / "r")]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"ratune: error: no complete eval cells (SETTING/ folders with .complete) in the --eval folders: {empty}")


def test_retrieval_eval_and_data_utility_never_write_into_a_user_folder(tmp_path, apibench, tiny_model_dir, capsys):
    from ratune.cli import main

    user = tmp_path / "mine"
    user.mkdir()
    (user / "retrieval_torchhub.json").write_text("my own numbers\n")
    (user / "utility.json").write_text("my own numbers\n")
    assert main(["retrieval", "eval", "--apibench", str(apibench), "--hub", "torchhub", "--retriever", "oracle",
                 "--out", str(user)]) == 2
    assert f"{user}: not a ratune retrieval eval output" in _one_error_line(capsys.readouterr().err)
    data = tmp_path / "data"
    data.mkdir()
    assert main(["data", "utility", "--data", str(data), "--model", str(tiny_model_dir), "--out", str(user)]) == 2
    assert f"{user}: not a ratune data utility output" in _one_error_line(capsys.readouterr().err)
    assert _snapshot(user) == {"retrieval_torchhub.json": b"my own numbers\n", "utility.json": b"my own numbers\n"}

    out = tmp_path / "retrieval"
    for _ in range(2):
        assert main(["retrieval", "eval", "--apibench", str(apibench), "--hub", "torchhub", "--retriever", "oracle",
                     "--out", str(out)]) == 0
    assert json.loads((out / ".ratune-output").read_text()) == {"stage": "retrieval eval"}
    assert json.loads((out / "retrieval_torchhub.json").read_text())["results"][0]["retriever"] == "oracle"


@pytest.mark.apibench_data  # the command reads the real APIBench before what is tested
def test_demo_never_deletes_an_unfinished_arm_it_did_not_make(tmp_path, tiny_model_dir, capsys):
    from ratune.cli import main
    from ratune.manifest import claim_folder

    from ratune.sweep import expand, load_sweep

    out = tmp_path / "demo"
    config = tmp_path / "demo.yaml"
    config.write_text(json.dumps({"out_dir": str(out), "axes": {"train_retriever": ["none"]},
                                  "base": {"model": str(tiny_model_dir), "hub": "torchhub", "max_length": 512,
                                           "torch_threads": 1},
                                  "data": {"max_document_tokens": 64},
                                  "accelerate_config": "configs/accelerate/cpu_1proc.yaml"}))
    arm = expand(load_sweep(config))[0].dir / "train"  # the cell's training run folder
    arm.mkdir(parents=True)
    claim_folder(out, "demo")  # a demo folder ratune made; the arm folder in it is the user's
    (arm / "keep.txt").write_text("a user's file\n")
    assert main(["demo", "--config", str(config)]) == 1  # the cell fails, as in `ratune sweep`
    printed = capsys.readouterr().out
    assert f"[fail] {arm.parent.name}: `accelerate launch " in printed  # the training refused it, under its lock
    error = (arm.parent / "error.txt").read_text()
    assert f"ratune: error: {arm}: not a ratune train output (it has no .ratune-output marker); ratune does not " \
           "resume or restart folders it did not make" in error
    assert (arm / "keep.txt").read_text() == "a user's file\n"
    assert (out / "data" / "torchhub" / ".complete").exists()  # the data step ran before the refusal


# ----------------------------------------------------------------------------------------- export


@pytest.fixture()
def checkpoint(tmp_path, tiny_model_dir):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, folder)
    return folder


def test_export_leaves_a_users_out_tmp_untouched(tmp_path, checkpoint, umask_022):
    from ratune.export.checkpoint import export_checkpoint

    users = tmp_path / "exported.tmp"
    users.mkdir()
    (users / "thesis.tex").write_text("months of work\n")
    out = export_checkpoint(checkpoint, tmp_path / "exported")
    assert out == (tmp_path / "exported").resolve() and (out / "model.safetensors").exists()
    assert _snapshot(users) == {"thesis.tex": b"months of work\n"}
    assert _ratune_temps(tmp_path) == []
    # every exported file has open()'s mode under umask 022 (safetensors 0.8 writes 0600 on its own)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_open_file_modes_gives_files_the_mode_open_would(tmp_path, umask_022):
    """A 0600 file (as safetensors writes model.safetensors) gets 0o666 & ~umask, as every other
    file ratune writes; so do files in sub-folders. swap_folder leaves modes alone (a data build's
    files are not walked): the writers of weights call open_file_modes."""
    from ratune.io import current_umask, open_file_modes, swap_folder, temp_folder

    out = tmp_path / "model"
    tmp = temp_folder(out)
    (tmp / "sub").mkdir()
    for name in ("model.safetensors", "sub/weights.safetensors"):
        (tmp / name).write_bytes(b"x")
        os.chmod(tmp / name, 0o600)
    swap_folder(tmp, out)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o600
    open_file_modes(out)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (out / "sub" / "weights.safetensors").stat().st_mode & 0o777 == 0o644
    assert current_umask() == 0o022 and os.umask(0o022) == 0o022  # read without changing it


def test_export_resolves_dotdot_and_refuses_an_output_inside_the_checkpoint(tmp_path, checkpoint, capsys):
    from ratune.cli import main

    place = tmp_path / "place"
    place.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["export", str(checkpoint), "--out", str(place / "missing" / "..")]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(place.resolve())
    assert (place / "model.safetensors").exists() and (place / "config.json").exists()
    assert not (place / "missing").exists() and sorted(p.name for p in tmp_path.iterdir()) == before

    inside = checkpoint / "export"
    for out in (inside, checkpoint / "sub" / ".." / "export2", checkpoint):
        assert main(["export", str(checkpoint), "--out", str(out)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "inside the checkpoint" in line or "exists and is not empty" in line
    from ratune.export.checkpoint import export_checkpoint

    with pytest.raises(RatuneError, match="the export folder is inside the checkpoint"):
        export_checkpoint(checkpoint, inside)
    assert not inside.exists() and not (checkpoint / "export2").exists() and not (checkpoint / "sub").exists()
    assert _ratune_temps(checkpoint) == [] and _ratune_temps(tmp_path) == []


# ------------------------------------------------------------------------- the training save folder


def test_training_save_uses_a_unique_ratune_temporary_folder(tmp_path):
    from types import SimpleNamespace

    import torch

    from ratune.train.sft import _save_folder

    run = tmp_path / "run"
    (run / "model.tmp").mkdir(parents=True)
    (run / "model.tmp" / "mine.txt").write_text("a user's folder\n")
    stale = run / ".ratune-tmp.deadbeef.model"  # left by a killed save of this run
    stale.mkdir()
    (run / "model").mkdir()
    (run / "model" / "old.safetensors").write_text("previous save")
    seen = []

    def write(tmp: Path):
        seen.append(tmp)
        (tmp / "model.safetensors").write_text("new save")
        (tmp / "training_args.bin").write_bytes(b"pickle")

    trainer = SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu"), wait_for_everyone=lambda: None))
    assert _save_folder(run / "model", write, True, trainer) == run / "model"
    assert seen[0].parent == run and seen[0].name.startswith(".ratune-tmp.") and seen[0].name.endswith(".model")
    assert _snapshot(run / "model") == {"model.safetensors": b"new save"}
    assert _snapshot(run / "model.tmp") == {"mine.txt": b"a user's folder\n"}
    assert sorted(p.name for p in run.iterdir()) == ["model", "model.tmp"]


# ------------------------------------------------------------------- the demo model's conversion
# The GGUF load is replaced by stand-ins that write small files (the real conversion takes 20-30 s
# and is run by the demo tests): what is checked is where the conversion writes and what it renames.


class _Loaded:
    """What the stand-in from_pretrained returns: saving writes ``content`` and runs ``on_save``."""

    saved: list[Path] = []
    on_save = None

    def __init__(self, name: str):
        self.name, self.config, self.hf_quantizer, self.is_quantized = name, SimpleNamespace(), "gguf", True

    def save_pretrained(self, folder, **kwargs):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / self.name).write_bytes(b"ours")
        _Loaded.saved.append(folder)
        if _Loaded.on_save is not None and self.name == "model.safetensors":
            _Loaded.on_save()


@pytest.fixture()
def gguf_stand_ins(monkeypatch, tmp_path):
    """The GGUF file and transformers' loaders replaced; returns the target folder in a temporary cache."""
    import transformers

    gguf = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(model_module, "_demo_gguf", lambda: gguf)
    monkeypatch.setattr(transformers, "AutoTokenizer",
                        SimpleNamespace(from_pretrained=lambda *a, **k: _Loaded("tokenizer.json")))
    monkeypatch.setattr(transformers, "AutoModelForCausalLM",
                        SimpleNamespace(from_pretrained=lambda *a, **k: _Loaded("model.safetensors")))
    monkeypatch.setattr(_Loaded, "saved", [])
    monkeypatch.setattr(_Loaded, "on_save", None)
    return tmp_path / "cache" / "models" / DEMO_MODEL_ALIAS


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_demo_conversion_uses_a_unique_ratune_sibling_and_never_touches_a_users_tmp_folder(gguf_stand_ins):
    target = gguf_stand_ins
    users = target.with_name(target.name + ".tmp")  # the name a fixed temporary folder would have
    users.mkdir(parents=True)
    (users / "mine.txt").write_text("a user's folder\n")

    assert ensure_demo_model(target.parent.parent) == target
    (written,) = set(_Loaded.saved)  # model and tokenizer into the same folder
    assert written.parent == target.parent and written != users
    assert written.name.startswith(".ratune-tmp.") and written.name.endswith(f".{DEMO_MODEL_ALIAS}")
    assert not written.exists()  # renamed into place
    assert _files(target) == {"model.safetensors": b"ours", "tokenizer.json": b"ours",
                              ".complete": b"converted from SmolLM2-135M-Instruct.Q4_1.gguf\n"}
    assert _files(users) == {"mine.txt": b"a user's folder\n"}
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, users.name]

    # a second conversion (the first one's folder removed) writes into another temporary folder
    shutil.rmtree(target)
    ensure_demo_model(target.parent.parent)
    assert len(set(_Loaded.saved)) == 2 and _files(target)["model.safetensors"] == b"ours"


def test_demo_conversion_that_loses_a_race_keeps_the_winners_folder_and_removes_only_its_own(gguf_stand_ins):
    target = gguf_stand_ins

    def another_process_finishes():  # while this one is still writing
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"winner")
        (target / ".complete").write_text("converted by the winner\n")

    _Loaded.on_save = another_process_finishes
    assert ensure_demo_model(target.parent.parent) == target
    assert _files(target) == {"model.safetensors": b"winner", ".complete": b"converted by the winner\n"}
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # its own temporary folder removed
    assert ensure_demo_model(target.parent.parent) == target and len(_Loaded.saved) == 2  # no new conversion


def test_demo_conversion_replaces_an_unfinished_target(gguf_stand_ins):
    """A target folder without .complete (ratune never leaves one) is not a conversion: replaced."""
    target = gguf_stand_ins
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"torn")
    assert ensure_demo_model(target.parent.parent) == target
    assert _files(target)["model.safetensors"] == b"ours" and (target / ".complete").exists()
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_failed_demo_conversion_leaves_nothing_beside_the_target(gguf_stand_ins):
    target = gguf_stand_ins

    def disk_full():
        raise OSError(28, "No space left on device")

    _Loaded.on_save = disk_full
    with pytest.raises(OSError, match="No space left"):
        ensure_demo_model(target.parent.parent)
    assert list(target.parent.iterdir()) == []


# ------------------------------------------------------------------------------------------ locks

_HOLD = """import sys
from ratune.locks import output_lock
with output_lock(sys.argv[1], command="holder"):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture()
def held(tmp_path):
    """A second process holding the lock of tmp_path/'target' until the test ends."""
    from ratune.locks import lock_path

    target = tmp_path / "target"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        holder = json.loads(lock_path(target).read_text())
        assert holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        yield target, proc.pid, lock_path(target)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert not lock_path(target).exists()  # the holder removed its lock file on release


def test_second_process_on_a_locked_output_is_refused(held, tmp_path, apibench, small_apibench, smol_tokenizer_dir,
                                                      tiny_model_dir, capsys):
    from ratune.cli import main

    target, pid, lock = held
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"model": str(tiny_model_dir), "data_dir": str(tmp_path / "nodata"),
                                  "train_retriever": "none", "output_dir": str(target), "max_steps": 1,
                                  "global_batch_size": 1, "per_device_batch_size": 1}))
    commands = {
        "data build": _build_argv(small_apibench, target, smol_tokenizer_dir),
        "retrieval index": ["retrieval", "index", "--apibench", str(apibench), "--hub", "torchhub", "--out",
                            str(target)],
        "eval run": ["eval", "run", "--checkpoint", str(tiny_model_dir), "--hub", "torchhub", "--apibench",
                     str(apibench), "--out", str(target), "--settings", "0_shot", "--n-questions", "1"],
        "export": ["export", str(tiny_model_dir), "--out", str(target)],
        "train": ["train", "--config", str(config)],
    }
    for name, argv in commands.items():
        assert main(argv) == 2, name
        line = _one_error_line(capsys.readouterr().err)
        assert f"is being written by pid {pid} on {socket.gethostname()} (holder)" in line, (name, line)
        assert f"lock file {lock}" in line, (name, line)
        assert not target.exists(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".target.ratune.lock"]


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, apibench, capsys):
    from ratune.cli import main
    from ratune.locks import LockHeld, lock_path, output_lock

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid = int(dead.stdout)
    index = tmp_path / "index"
    lock = lock_path(index)
    lock.write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname(), "command": "killed"}))
    assert main(["retrieval", "index", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(index)]) == 0
    err = capsys.readouterr().err
    assert f"ratune: note: took over the stale lock {lock} of pid {dead_pid} (no longer running)" in err
    assert (index / "ratune_bm25_index.json").exists() and not lock.exists()

    # while held, the file names this process; a lock naming another host is not taken over
    with output_lock(index, command="test") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.write_text(json.dumps({"pid": dead_pid, "host": "another-host", "command": "remote"}))
    with pytest.raises(LockHeld, match=f"pid {dead_pid} on another-host .*delete the lock file"):
        with output_lock(index):
            pass
    assert lock.exists()


def test_train_into_a_user_folder_says_it_is_not_ratunes(tmp_path, tiny_model_dir):
    """A non-empty output_dir ratune did not make is refused as such (the message was "exists from an
    earlier run; pass --resume-from latest", wrong for a user's folder); the user's file stays."""
    from ratune.train.config import TrainConfig
    from ratune.train.resume import prepare_output_dir

    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    (tmp_path / "data").mkdir()
    cfg = TrainConfig(model=str(tiny_model_dir), data_dir=str(tmp_path / "data"), train_retriever="none",
                      output_dir=str(user))
    with pytest.raises(RatuneError, match=rf"^{user}: not a ratune train output \(it has no .ratune-output marker\); "
                                          "ratune does not write into folders it did not make"):
        prepare_output_dir(cfg, None)
    assert _snapshot(user) == {"notes.txt": b"mine\n"}
