"""``ratune data build --reuse-if-same`` (what a sweep passes): a complete build made with the same
request is kept; one made with another setting, mode set, mixture or input file is rebuilt
(data/build.py ``build_request``). Before, a sweep kept any complete build that had the modes, so
a changed data setting trained on the old rows."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from ratune.data.build import BuildSettings, build_dataset
from ratune.data.mixture import Mixture
from ratune.errors import RatuneError


@pytest.fixture
def apibench(tmp_path, apibench_tiny):
    copy = tmp_path / "apibench"
    shutil.copytree(apibench_tiny, copy)
    return copy


def _build(apibench, out, tokenizer, *, modes=("none",), reuse=True, **settings):
    return build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=tokenizer,
                         tokenizer_name="smol", modes=modes, settings=BuildSettings(**settings), progress=False,
                         reuse_if_same=reuse)


def _stamp(out):
    return (out / "manifest.json").stat().st_ino, (out / "manifest.json").read_bytes()


def test_the_same_request_is_reused_and_a_changed_one_rebuilt(tmp_path, apibench, smol_tokenizer, capsys):
    out = tmp_path / "data"
    first = _build(apibench, out, smol_tokenizer, modes=("none", "oracle"))
    assert first["request"]["settings"]["max_document_tokens"] == BuildSettings().max_document_tokens
    assert set(first["request"]["inputs"]) == {"torchhub_api.jsonl", "torchhub_train.json", "torchhub_eval.json"}
    built = _stamp(out)
    capsys.readouterr()

    # the same request, or a subset of its modes: kept as it is (the same manifest file, not rewritten)
    assert _build(apibench, out, smol_tokenizer, modes=("oracle", "none")) == first
    assert _build(apibench, out, smol_tokenizer, modes=("none",)) == first
    assert _stamp(out) == built
    assert "already built with the same request" in capsys.readouterr().err

    # a changed setting: rebuilt, with the new setting in its rows' manifest
    changed = _build(apibench, out, smol_tokenizer, modes=("none", "oracle"), max_document_tokens=64)
    assert changed["settings"]["max_document_tokens"] == 64 and _stamp(out) != built
    # a mode it lacks: rebuilt with the modes asked for now
    more = _build(apibench, out, smol_tokenizer, modes=("none", "bm25"), max_document_tokens=64)
    assert more["modes"] == ["none", "bm25"]
    # a mixture: part of the request
    mixed = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer,
                          tokenizer_name="smol", modes=("none", "bm25"), progress=False, reuse_if_same=True,
                          settings=BuildSettings(max_document_tokens=64),
                          mixtures=[Mixture.parse("half:none=0.5,oracle=0.5")])
    assert mixed["modes"] == ["none", "bm25", "mix-half"] and "mix-half" in mixed["request"]["mixtures"]
    # an input file that changed (here one more blank line: another sha256): rebuilt
    stamp = _stamp(out)
    train = apibench / "apibench" / "torchhub_train.json"
    train.write_text(train.read_text() + "\n")
    again = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer,
                          tokenizer_name="smol", modes=("none", "bm25"), progress=False, reuse_if_same=True,
                          settings=BuildSettings(max_document_tokens=64),
                          mixtures=[Mixture.parse("half:none=0.5,oracle=0.5")])
    assert _stamp(out) != stamp and again["request"]["inputs"] != mixed["request"]["inputs"]


def test_a_build_from_before_the_request_was_recorded_is_rebuilt(tmp_path, apibench, smol_tokenizer):
    out = tmp_path / "data"
    _build(apibench, out, smol_tokenizer)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["request"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "request" in _build(apibench, out, smol_tokenizer)


def test_a_folder_ratune_did_not_make_is_refused_and_kept(tmp_path, apibench, smol_tokenizer):
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(RatuneError, match="not a ratune data build output"):
        _build(apibench, out, smol_tokenizer)
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_local_tokenizer_folder_that_changed_is_a_new_request(tmp_path, apibench, smol_tokenizer_dir):
    """The tokenizer by folder: its files' sha256 are part of the request, so a tokenizer saved
    again with other files under the same path rebuilds; ratune's version is recorded too."""
    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_tokenizer

    folder = tmp_path / "tok"
    shutil.copytree(smol_tokenizer_dir, folder)

    def build():
        return build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=tmp_path / "data", progress=False,
                             tokenizer=use_chat_template(load_tokenizer(folder), None), tokenizer_name=str(folder),
                             modes=("none",), reuse_if_same=True)

    first = build()
    assert set(first["request"]["tokenizer_files"]) >= {"tokenizer.json", "tokenizer_config.json"}
    assert first["request"]["ratune"]  # the installed version
    assert build() == first
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")
    assert build()["request"]["tokenizer_files"] != first["request"]["tokenizer_files"]

    # the chat template edited in place (transformers 5 keeps it in chat_template.jinja, which
    # tokenizer_config.json does not hold): the rows would render differently, so a new request
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    edited = build()
    assert edited["request"]["chat_template_sha256"] == hashlib.sha256(template.encode()).hexdigest()
    assert edited["request"]["chat_template_sha256"] != first["request"]["chat_template_sha256"]
    assert "chat_template.jinja" in edited["request"]["tokenizer_files"]


def test_a_build_swapped_out_while_it_is_read_is_not_reused(tmp_path, apibench, smol_tokenizer, monkeypatch):
    """Another `data build` swaps its folder in (two renames) while this one reads the manifest: the
    file is gone for a moment. Not reused (the rebuild that follows is refused by the writer's
    lock, in one line), instead of `ratune: error: .../manifest.json: No such file`."""
    from ratune.data import build

    out = tmp_path / "data"
    first = _build(apibench, out, smol_tokenizer)
    assert build._same_build(out, first["request"], ["none"]) == first

    def swapped_out(path):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(build, "read_json_object", swapped_out)
    assert build._same_build(out, first["request"], ["none"]) is None
