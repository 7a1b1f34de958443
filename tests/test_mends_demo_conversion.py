"""ratune/models.py ``ensure_demo_model`` converts into a unique, ratune-owned temporary sibling
(ratune/io.py ``temp_folder``) and renames it into place: a user's folder beside the cache is never
touched, and a conversion that loses a race to another process keeps the winner's folder and
removes only its own temporary one.

The GGUF load is replaced by stand-ins that write small files (the real conversion takes 20-30 s
and is run by the demo tests): what is checked is where the conversion writes and what it renames.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import ratune.models as model_module
from ratune.models import DEMO_MODEL_ALIAS, ensure_demo_model


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
def stand_ins(monkeypatch, tmp_path):
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


def test_converts_into_a_unique_ratune_sibling_and_never_touches_a_users_tmp_folder(stand_ins):
    target = stand_ins
    users = target.with_name(target.name + ".tmp")  # the name the conversion used to write into
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
    import shutil

    shutil.rmtree(target)
    ensure_demo_model(target.parent.parent)
    assert len(set(_Loaded.saved)) == 2 and _files(target)["model.safetensors"] == b"ours"


def test_a_lost_race_keeps_the_winners_folder_and_removes_only_its_own_temporary_one(stand_ins):
    target = stand_ins

    def another_process_finishes():  # while this one is still writing
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"winner")
        (target / ".complete").write_text("converted by the winner\n")

    _Loaded.on_save = another_process_finishes
    assert ensure_demo_model(target.parent.parent) == target
    assert _files(target) == {"model.safetensors": b"winner", ".complete": b"converted by the winner\n"}
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # its own temporary folder removed
    assert ensure_demo_model(target.parent.parent) == target and len(_Loaded.saved) == 2  # no new conversion


def test_an_unfinished_target_is_replaced(stand_ins):
    """A target folder without .complete (ratune never leaves one) is not a conversion: replaced."""
    target = stand_ins
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"torn")
    assert ensure_demo_model(target.parent.parent) == target
    assert _files(target)["model.safetensors"] == b"ours" and (target / ".complete").exists()
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_a_failed_conversion_leaves_nothing_beside_the_target(stand_ins):
    target = stand_ins

    def disk_full():
        raise OSError(28, "No space left on device")

    _Loaded.on_save = disk_full
    with pytest.raises(OSError, match="No space left"):
        ensure_demo_model(target.parent.parent)
    assert list(target.parent.iterdir()) == []
