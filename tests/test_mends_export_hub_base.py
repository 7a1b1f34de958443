"""``ratune export RUN --merge-lora`` of a run whose base model is a hub id (the run manifest's
``model_path`` is ``OWNER/NAME``, not a local folder): the id goes to the loader ratune/models.py
``load_model`` uses for every model (which resolves hub ids), and a base folder that is gone is
still refused by name before anything is loaded.

The hub cannot be reached here: the loader is wrapped so that the hub id loads the tiny local
Llama the adapter was made on (tests/test_qlora_run.py ``qlora_run``).
"""

from __future__ import annotations

import json
import shutil

import pytest

from ratune.errors import RatuneError
from test_qlora_run import _base_plus_adapter, qlora_run  # noqa: F401 - the adapter-only run fixture

HUB_BASE = "someorg/tiny-llama-base"


def _with_base(run, tmp_path, name: str, model_path: str):
    """A copy of the adapter-only run whose manifests record ``model_path`` (and config.model) as its base."""
    from ratune.io import write_json

    copy = tmp_path / name
    shutil.copytree(run, copy)
    for path in (copy / "manifest.json", copy / "adapter" / "ratune_manifest.json"):
        manifest = json.loads(path.read_text())
        manifest["model_path"] = model_path
        manifest["config"]["model"] = model_path
        write_json(path, manifest)
    return copy


def test_merge_lora_sends_a_hub_id_base_to_the_model_loader(qlora_run, tmp_path, tiny_model_dir,  # noqa: F811
                                                            monkeypatch):
    import torch

    import ratune.models as model_module
    from ratune.export.checkpoint import export_checkpoint

    run = _with_base(qlora_run, tmp_path, "hub_run", HUB_BASE)
    real_load_model, asked = model_module.load_model, []

    def load_model(model_path, **kwargs):
        asked.append(str(model_path))
        return real_load_model(tiny_model_dir if str(model_path) == HUB_BASE else model_path, **kwargs)

    monkeypatch.setattr(model_module, "load_model", load_model)  # what load_adapter_merged calls
    out = export_checkpoint(run, tmp_path / "merged", merge_lora=True)
    assert asked == [HUB_BASE]  # the hub id itself, as the manifest records it
    merged = _base_plus_adapter(tiny_model_dir, qlora_run).merge_and_unload().state_dict()
    saved = real_load_model(out).state_dict()
    assert set(saved) == set(merged) and all(torch.equal(saved[k], merged[k]) for k in merged)
    meta = json.loads((out / "ratune_export.json").read_text())
    assert meta["base_model"] == HUB_BASE and meta["source"]["merged_lora_at_export"] is True


def test_merge_lora_of_an_unreachable_hub_id_base_names_it(qlora_run, tmp_path):  # noqa: F811
    """Offline (tests/conftest.py sets HF_HUB_OFFLINE) the hub id reaches from_pretrained, which
    cannot resolve it: one line naming the id, and no export folder."""
    from ratune.export.checkpoint import export_checkpoint

    run = _with_base(qlora_run, tmp_path, "hub_run", HUB_BASE)
    with pytest.raises(RatuneError, match=rf"^{HUB_BASE}: not a local folder, and loading it as a hub id failed"):
        export_checkpoint(run, tmp_path / "merged", merge_lora=True)
    assert not (tmp_path / "merged").exists()


def test_merge_lora_of_a_missing_local_base_folder_is_refused_before_loading(qlora_run, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    import ratune.models as model_module
    from ratune.export.checkpoint import export_checkpoint

    def boom(*args, **kwargs):
        raise AssertionError("nothing may be loaded")

    monkeypatch.setattr(model_module, "load_model", boom)
    monkeypatch.setattr("ratune.export.merge.load_model", boom)  # the name export_checkpoint calls
    gone = tmp_path / "deleted_base"
    run = _with_base(qlora_run, tmp_path, "gone_run", str(gone))
    with pytest.raises(RatuneError, match=rf"^{gone}: the base model folder recorded in .*manifest.json is gone "
                                          r"\(no config.json\); the adapter loads only on it$"):
        export_checkpoint(run, tmp_path / "merged", merge_lora=True)
    assert not (tmp_path / "merged").exists()
