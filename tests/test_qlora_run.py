"""A QLoRA run folder (``load_in_4bit: true``: ``adapter/`` and no ``model/``) is evaluable and
exportable on a CPU: eval merges the adapter into the unquantized base its manifest names, export
--merge-lora writes that merge as a normal model folder (a base recorded as a hub id is sent to
the model loader, which resolves hub ids; a base folder that is gone is refused by name before
anything is loaded), and QLoRA under ZeRO-3 is refused.

bitsandbytes' 4-bit layers are CUDA-only, so the run folder is built here the way train/sft.py
leaves a QLoRA run: a real peft LoRA adapter (random, non-zero B, so it changes the model) saved
from the tiny Llama with its tokenizer, the run manifest recording ``config.load_in_4bit: true``
and the base's ``model_path``, ``ratune_manifest.json`` in ``adapter/``, and ``.complete``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "v_proj"]
HUB_BASE = "someorg/tiny-llama-base"


@pytest.fixture(scope="module")
def qlora_run(tmp_path_factory, tiny_model_dir):
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model

    from ratune.io import write_json
    from ratune.manifest import base_manifest, mark_complete
    from ratune.train.config import TrainConfig
    from ratune.models import load_model, load_tokenizer

    run = tmp_path_factory.mktemp("qlora") / "run"
    config = TrainConfig(model=str(tiny_model_dir), data_dir=str(run.parent / "data"), train_retriever="oracle",
                         output_dir=str(run), load_in_4bit=True, dtype="float32",
                         lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": TARGETS})
    torch.manual_seed(1)
    model = get_peft_model(load_model(tiny_model_dir), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM", init_lora_weights=False))
    model.save_pretrained(str(run / "adapter"), safe_serialization=True)
    load_tokenizer(tiny_model_dir).save_pretrained(str(run / "adapter"))
    manifest = {**base_manifest("train"), "config": config.model_dump(), "model_path": str(tiny_model_dir),
                "num_processes": 1, "per_device_batch_size": 1, "gradient_accumulation_steps": 64,
                "global_batch_size": 64, "steps": 1, "prompt": {"max_document_tokens": 64, "chat_template": None}}
    (run / "config.yaml").write_text(yaml.safe_dump(config.model_dump(), sort_keys=True))
    write_json(run / "manifest.json", manifest)
    write_json(run / "adapter" / "ratune_manifest.json", manifest)
    mark_complete(run)
    assert not (run / "model").exists()
    return run


def _base_plus_adapter(tiny_model_dir, run):
    """The reference: the base with peft's (unmerged) adapter on it."""
    from peft import PeftModel

    from ratune.models import load_model

    return PeftModel.from_pretrained(load_model(tiny_model_dir), str(run / "adapter")).eval()


def _zero_shot_prompts(apibench, tokenizer, n):
    from ratune.sources.apibench import load_examples
    from ratune.sources.prompt import encode_prompt, render_user_turn

    examples = load_examples(apibench, "torchhub", "eval")[:n]
    return examples, [encode_prompt(tokenizer, render_user_turn(e.instruction, None, max_document_tokens=64,
                                                                count_tokens=len)[0]) for e in examples]


def test_eval_run_of_a_qlora_run_folder_uses_the_adapter_on_the_unquantized_base(qlora_run, apibench, tmp_path,
                                                                                 tiny_model_dir):
    from all_answers import generate_all
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.train.layout import resolve_checkpoint
    from ratune.models import load_model, load_tokenizer

    source = resolve_checkpoint(qlora_run)
    assert (source.folder, source.base, source.base_in_4bit) == (qlora_run / "adapter", str(tiny_model_dir.resolve()),
                                                                 True)
    settings = EvalSettings(settings=["0_shot"], n_questions=3, batch_size=3, max_new_tokens=8, device="cpu",
                            torch_threads=1)
    metrics = evaluate_checkpoint(qlora_run, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                                  settings=settings, progress=False)["0_shot"]
    cell = tmp_path / "eval" / "0_shot"
    rows = [json.loads(line) for line in (cell / "responses.jsonl").read_text().splitlines()]

    tok = load_tokenizer(qlora_run / "adapter")
    examples, prompts = _zero_shot_prompts(apibench, tok, 3)
    expected = generate_all(_base_plus_adapter(tiny_model_dir, qlora_run), tok, prompts, batch_size=3,
                            max_new_tokens=8)
    assert [r["question_id"] for r in rows] == [e.line for e in examples]
    assert [r["text"] for r in rows] == expected
    assert expected != generate_all(load_model(tiny_model_dir), tok, prompts, batch_size=3, max_new_tokens=8)
    identity = json.loads((cell / "identity.json").read_text())
    assert identity["checkpoint"] == str((qlora_run / "adapter").resolve())
    assert identity["adapter_base"] == str(tiny_model_dir.resolve())
    assert metrics["adapter"] == {"base": str(tiny_model_dir.resolve()), "base_trained_in_4bit": True,
                                  "evaluated_on": "the unquantized base in float32, adapter merged"}
    assert metrics["n"] == 3 and metrics["generation"]["dtype"] == "float32"

    # vLLM loads model folders only: the adapter run is sent to export --merge-lora first
    import torch

    import ratune.eval.vllm_backend as vllm_backend

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_backend, "require_vllm", lambda: None)
        mp.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises(RatuneError, match=r"saved only its LoRA adapter .*--merge-lora"):
            evaluate_checkpoint(qlora_run, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval_vllm",
                                settings=EvalSettings(settings=["0_shot"], backend="vllm"), progress=False)
    assert not (tmp_path / "eval_vllm" / "0_shot").exists()


def test_export_merge_lora_of_a_qlora_run_writes_the_unquantized_merge(qlora_run, tmp_path, tiny_model_dir):
    import torch
    from huggingface_hub import ModelCard

    from ratune.train.checks import logit_tolerance, prompt_logits
    from ratune.export.checkpoint import export_checkpoint
    from ratune.models import load_model, load_tokenizer

    with pytest.raises(RatuneError, match=r"saved only its LoRA adapter \(QLoRA.*export it with --merge-lora"):
        export_checkpoint(qlora_run, tmp_path / "plain")
    out = export_checkpoint(qlora_run, tmp_path / "merged", merge_lora=True)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md",
            "ratune_export.json"} <= files
    assert not files & {"adapter_config.json", "adapter_model.safetensors", "ratune_manifest.json"}
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"

    exported = load_model(out)
    tok = load_tokenizer(out)
    reference = _base_plus_adapter(tiny_model_dir, qlora_run)
    # the weights are peft's merge into the unquantized base, bit for bit
    merged = _base_plus_adapter(tiny_model_dir, qlora_run).merge_and_unload().state_dict()
    saved = exported.state_dict()
    assert set(saved) == set(merged) and all(torch.equal(saved[k], merged[k]) for k in merged)
    # and its logits are base + adapter's on the same device (float32, merged: another summation order)
    ref = prompt_logits(reference, tok, device="cpu")
    got = prompt_logits(exported, tok, device="cpu")
    tol = logit_tolerance(torch.float32, ref)
    assert max(float((a - b).abs().max()) for a, b in zip(ref, got)) <= tol
    base = prompt_logits(load_model(tiny_model_dir), tok, device="cpu")
    assert max(float((a - b).abs().max()) for a, b in zip(ref, base)) > 100 * tol  # the adapter mattered

    meta = json.loads((out / "ratune_export.json").read_text())
    assert meta["source"]["merged_lora_at_export"] is True and meta["recipe"]["load_in_4bit"] is True
    assert meta["vocabulary"] == {"embedding_rows": len(tok), "tokenizer_length": len(tok)}
    card = ModelCard.load(out / "README.md").text
    assert "| LoRA | QLoRA (trained on the base in 4-bit NF4), rank 4, alpha 8" in card
    assert "merged into the unquantized base at export |" in card


def test_a_qlora_run_without_its_base_or_unfinished_is_refused(qlora_run, tmp_path, apibench):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.train.layout import resolve_checkpoint
    from ratune.io import write_json
    from ratune.export.checkpoint import export_checkpoint

    gone = tmp_path / "gone"
    shutil.copytree(qlora_run, gone)
    manifest = json.loads((gone / "manifest.json").read_text())
    write_json(gone / "manifest.json", {**manifest, "model_path": str(tmp_path / "deleted_base")})
    with pytest.raises(RatuneError, match=r"deleted_base: the base model folder recorded in .*manifest.json is gone"):
        resolve_checkpoint(gone)
    with pytest.raises(RatuneError, match=r"deleted_base: the base model folder recorded in .* is gone"):
        export_checkpoint(gone, tmp_path / "out", merge_lora=True)
    with pytest.raises(RatuneError, match=r"is gone"):
        evaluate_checkpoint(gone, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                            settings=EvalSettings(settings=["0_shot"], n_questions=1, device="cpu"), progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "eval" / "0_shot").exists()

    unfinished = tmp_path / "unfinished"
    shutil.copytree(qlora_run, unfinished)
    (unfinished / ".complete").unlink()
    with pytest.raises(RatuneError, match=r"training run is not complete .*adapter/ but no model/"):
        resolve_checkpoint(unfinished)


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


def test_merge_lora_sends_a_hub_id_base_to_the_model_loader(qlora_run, tmp_path, tiny_model_dir, monkeypatch):
    """The hub cannot be reached here: the loader is wrapped so that the hub id loads the tiny local
    Llama the adapter was made on."""
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


def test_merge_lora_of_an_unreachable_hub_id_base_names_it(qlora_run, tmp_path):
    """Offline (tests/conftest.py sets HF_HUB_OFFLINE) the hub id reaches from_pretrained, which
    cannot resolve it: one line naming the id, and no export folder."""
    from ratune.export.checkpoint import export_checkpoint

    run = _with_base(qlora_run, tmp_path, "hub_run", HUB_BASE)
    with pytest.raises(RatuneError, match=rf"^{HUB_BASE}: not a local folder, and loading it as a hub id failed"):
        export_checkpoint(run, tmp_path / "merged", merge_lora=True)
    assert not (tmp_path / "merged").exists()


def test_merge_lora_of_a_missing_local_base_folder_is_refused_before_loading(qlora_run, tmp_path, monkeypatch):
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


def test_qlora_under_zero3_is_refused_by_the_config():
    """peft's QLoRA + ZeRO-3 recipe needs 4-bit storage in the compute dtype and no device_map,
    which ratune's 4-bit load does not do: refused when the config is read, naming both; ZeRO-2
    QLoRA and ZeRO-3 LoRA stay allowed."""
    from ratune.config import validate
    from ratune.train.config import TrainConfig

    base = {"model": "m", "data_dir": "d", "train_retriever": "oracle", "output_dir": "o",
            "lora": {"enabled": True}, "load_in_4bit": True}
    for json_file in ("zero3.json", "zero3_offload.json"):
        with pytest.raises(RatuneError, match=r"load_in_4bit: true \(QLoRA\) with the ZeRO-3 DeepSpeed config .*"
                                              r"bnb_4bit_quant_storage=bfloat16.*without a device_map"):
            validate(TrainConfig, {**base, "deepspeed": str(ROOT / "configs/deepspeed" / json_file)}, "t")
    assert TrainConfig(**base, deepspeed=str(ROOT / "configs/deepspeed/zero2.json")).load_in_4bit
    assert TrainConfig(**{**base, "load_in_4bit": False}, deepspeed=str(ROOT / "configs/deepspeed/zero3.json"))
