"""What only a CUDA GPU can check; marker ``gpu``.

Skipped where torch sees no CUDA device (tests/conftest.py ``pytest_collection_modifyitems``);
on a GPU machine ``make test`` runs them with the rest and ``pytest -m gpu`` alone. Every other
test of the suite runs on the CPU even there (conftest ``_cpu_only``), so these are the only
ones that train and generate on the GPU:

- bf16 training on CUDA through the real ``train()``: LoRA on a bf16 base with sdpa and, when
  flash-attn is installed, flash_attention_2 (padding-free rows, gradient checkpointing); a
  full finetune in float32 weights with bf16 autocast; every save checked on the GPU;
- the QLoRA path (bitsandbytes 4-bit NF4 base + LoRA; skipped without bitsandbytes): load,
  train, save only ``adapter/``, its save checks;
- ``ratune eval run`` on CUDA: ``auto`` placement is CUDA + bfloat16, the model really loaded
  there, and recorded in the cell;
- ``prefill="auto"`` takes the padded batch path on CUDA (``prefill_each`` never runs) and
  gives the answers of ``prefill="padded"``.

They use the tiny random Llama of conftest (SmolLM2's tokenizer) and the hand-made data folder
of tests/test_train_correctness.py, so each runs in seconds on any CUDA GPU. The one test here
without the marker checks the other side of the split: a CPU test sees no CUDA, in its own
process or in those it starts.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest



def _data(tmp_path):
    from test_train_correctness import _make_data

    return _make_data(tmp_path / "data")


def _train(tiny_model_dir, tmp_path, name, **overrides):
    """Train the tiny model with the real train() on CUDA; returns (run folder, manifest, losses)."""
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    config = dict(model=str(tiny_model_dir), data_dir=str(_data(tmp_path)), train_retriever="none",
                  output_dir=str(tmp_path / name), max_length=512, global_batch_size=2, per_device_batch_size=2,
                  max_examples=2, max_steps=3, save_steps=1, learning_rate=1e-2, warmup_ratio=0.0,
                  lr_scheduler="constant", seed=0, bf16=True, padding_free=True, gradient_checkpointing=True)
    config.update(overrides)
    train(TrainConfig(**config))
    out = tmp_path / name
    manifest = json.loads((out / "manifest.json").read_text())
    losses = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    return out, manifest, losses


def _assert_trained_on_cuda(manifest, losses, *, attn: str, autocast: str | None, dtype: str):
    import torch

    assert manifest["device"]["type"] == "cuda" and manifest["device"]["name"] == torch.cuda.get_device_name(0)
    assert manifest["compute"] == {"dtype": dtype, "autocast": autocast, "deepspeed_bf16": False,
                                   "attn_implementation": attn}
    assert manifest["data"]["token_shares"]["mode"] == "padding_free"
    # 2 examples = the global batch: every step sees the same batch, and its loss falls
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    for check in manifest["save_checks"]:  # reloaded and compared on the GPU, same kernel and autocast
        assert check["compute_dtype"] == "torch.bfloat16"
        assert 0.0 <= check["max_abs_logit_diff"] <= check["tolerance"], check


@pytest.mark.gpu
@pytest.mark.parametrize("attn", ["sdpa", pytest.param("flash_attention_2", marks=pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed"))])
def test_bf16_lora_training_on_cuda(tiny_model_dir, tmp_path, attn):
    """LoRA on the frozen bf16 base (configs/train/llama7b_rat_paper_lora.yaml's precision)."""
    out, manifest, losses = _train(tiny_model_dir, tmp_path, "lora", dtype="bfloat16", attn_implementation=attn,
                                   lora={"enabled": True, "r": 4, "alpha": 8})
    _assert_trained_on_cuda(manifest, losses, attn=attn, autocast="bfloat16", dtype="bfloat16")
    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == ["trainer/checkpoint-1", "trainer/checkpoint-2", "trainer/checkpoint-3",
                                             "adapter", "model"]
    assert [c["weights_compared"] for c in checks] == [28, 28, 28, 28, 20]  # adapters bit for bit; the merge


@pytest.mark.gpu
def test_bf16_full_finetune_on_cuda(tiny_model_dir, tmp_path):
    """A full finetune without DeepSpeed: float32 weights, bf16 autocast (the validator's rule)."""
    import torch
    from safetensors.torch import load_file

    out, manifest, losses = _train(tiny_model_dir, tmp_path, "full", dtype="float32", attn_implementation="sdpa",
                                   learning_rate=1e-3)
    _assert_trained_on_cuda(manifest, losses, attn="sdpa", autocast="bfloat16", dtype="float32")
    assert [c["folder"] for c in manifest["save_checks"]][-1] == "model"
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    end = load_file(str(out / "model" / "model.safetensors"))
    assert {t.dtype for t in end.values()} == {torch.float32}
    assert sum(not torch.equal(start[k], end[k]) for k in start) >= len(start) // 2


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
def test_qlora_loads_trains_and_saves_the_adapter(tiny_model_dir, tmp_path):
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    config = TrainConfig(model=str(tiny_model_dir), data_dir=str(_data(tmp_path)), train_retriever="none",
                         output_dir=str(tmp_path / "qlora"), max_length=512, global_batch_size=2,
                         per_device_batch_size=2, max_examples=2, max_steps=2, save_steps=1, learning_rate=1e-2,
                         warmup_ratio=0.0, lr_scheduler="constant", seed=0, dtype="bfloat16", bf16=True,
                         load_in_4bit=True, lora={"enabled": True, "r": 4, "alpha": 8})
    final = train(config)
    out = tmp_path / "qlora"
    assert final == out / "adapter" and not (out / "model").exists()  # no merge into 4-bit weights
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"]["type"] == "cuda"
    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == ["trainer/checkpoint-1", "trainer/checkpoint-2", "adapter"]
    assert all(c["tensors"] == 28 and c["weights_compared"] == 28 for c in checks), checks
    assert all(0.0 <= c["max_abs_logit_diff"] <= c["tolerance"] for c in checks), checks
    losses = [e["loss"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


@pytest.mark.gpu
def test_eval_run_generates_on_cuda_in_bf16(tiny_model_dir, tmp_path, apibench, monkeypatch):
    import torch

    import ratune.models as model_module
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.eval.settings import resolve_placement

    assert resolve_placement() == ("cuda", "bfloat16")
    loaded = []
    real_load = model_module.load_model

    def spy(*args, **kwargs):
        model = real_load(*args, **kwargs)
        loaded.append((model.device.type, model.dtype))
        return model

    monkeypatch.setattr("ratune.eval.run.load_model", spy)  # the name evaluate_checkpoint calls
    results = evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                                  settings=EvalSettings(settings=["0_shot"], n_questions=4, max_new_tokens=16,
                                                        batch_size=4), progress=False)
    assert loaded == [("cuda", torch.bfloat16)]
    metrics = results["0_shot"]
    assert metrics["n"] == 4 and metrics["device_name"] == torch.cuda.get_device_name()
    assert (metrics["generation"]["device"], metrics["generation"]["dtype"]) == ("cuda", "bfloat16")
    identity = json.loads((tmp_path / "eval" / "0_shot" / "identity.json").read_text())
    assert (identity["generation"]["device"], identity["generation"]["dtype"]) == ("cuda", "bfloat16")


@pytest.mark.gpu
def test_prefill_auto_takes_the_padded_path_on_cuda(tiny_model_dir, smol_tokenizer, monkeypatch):
    import ratune.eval.generate as gen
    from all_answers import generate_all
    from ratune.sources.prompt import encode_prompt
    from ratune.models import load_model

    model = load_model(tiny_model_dir, device="cuda")
    assert gen.resolve_prefill("auto", model.device) == "padded"
    prompts = [encode_prompt(smol_tokenizer, q) for q in ("hi", "load a classifier " * 8, "which API? " * 3)]
    calls = []
    real_each = gen.prefill_each

    def counting(*args, **kwargs):
        calls.append(len(args[1]))
        return real_each(*args, **kwargs)

    monkeypatch.setattr(gen, "prefill_each", counting)
    each = generate_all(model, smol_tokenizer, prompts, batch_size=3, max_new_tokens=8, prefill="each")
    assert calls == [3]  # the spy sees the per-prompt path when it is asked for
    calls.clear()
    auto = generate_all(model, smol_tokenizer, prompts, batch_size=3, max_new_tokens=8)
    padded = generate_all(model, smol_tokenizer, prompts, batch_size=3, max_new_tokens=8, prefill="padded")
    assert calls == [] and auto == padded and len(auto) == 3
    assert all(isinstance(t, str) for t in each)


def test_a_test_without_the_gpu_marker_sees_no_cuda():
    """conftest's _cpu_only, which makes the CPU tests mean the same on a GPU machine."""
    import os
    import subprocess
    import sys

    import torch
    from transformers.utils import is_torch_cuda_available

    from ratune.eval.settings import resolve_placement

    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert torch.cuda.is_available() is False and is_torch_cuda_available() is False
    assert resolve_placement() == ("cpu", "float32")
    child = subprocess.run([sys.executable, "-c", "import os, torch; print(repr(os.environ['CUDA_VISIBLE_DEVICES']), "
                            "torch.cuda.is_available())"], capture_output=True, text=True, timeout=120)
    assert child.stdout.split() == ["''", "False"], child.stderr[-2000:]
