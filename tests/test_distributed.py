"""DeepSpeed on CPU with 2 processes, and the save-time reload check.

The `distributed` tests launch `accelerate launch --config_file configs/accelerate/cpu_2proc_deepspeed.yaml
-m ratune.train` (torchrun, 2 processes, gloo) on the tiny random Llama with the shipped ZeRO-2 and
ZeRO-3 JSONs (no optimizer or offload block: nothing but the prebuilt communication op is
compiled). Each asserts what the trainer really ran (manifest `distributed`: 2 processes,
DEEPSPEED, the configured stage), that every save was checked when it was made, and reloads the
saved folders itself; one more runs ZeRO-3 in a single process started without a launcher. The
launchers that silently start ONE process are shown to be refused.
The reload-check unit tests corrupt a saved folder in the ways a bad save does (a tensor zeroed,
emptied or missing, an adapter tensor changed) and expect a RatuneError naming folder and tensor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent
ACCELERATE = Path(sys.executable).with_name("accelerate")


def _make_data(folder: Path) -> Path:
    from test_train_correctness import _make_data as make

    return make(folder)


def _launch(tmp_path, tiny_model_dir, run_name, *, launcher_args, timeout=600, **overrides):
    """Write a training config for the tiny model and launch it; returns (proc, run folder)."""
    data = tmp_path / "data"
    if not data.exists():
        _make_data(data)
    out = tmp_path / run_name
    config = {"model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none",
              "output_dir": str(out), "max_length": 512, "global_batch_size": 4, "per_device_batch_size": 1,
              "max_steps": 2, "max_examples": 8, "save_steps": 1, "learning_rate": 1e-3, "warmup_ratio": 0.0,
              "lr_scheduler": "constant", "seed": 0, "torch_threads": 1}
    config.update(overrides)
    cfg = tmp_path / f"{run_name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    accelerate = str(ACCELERATE if ACCELERATE.exists() else shutil.which("accelerate"))
    # the venv's bin first: its ninja is the one `make setup` prebuilt DeepSpeed's comm op with
    # (another ninja version sees the build as stale and recompiles it, minutes on a busy machine)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run([accelerate, "launch", *launcher_args, "-m", "ratune.train", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return proc, out


TWO_PROCS = ["--config_file", str(ROOT / "configs/accelerate/cpu_2proc_deepspeed.yaml")]


def _assert_every_tensor_non_empty(folder: Path) -> int:
    from safetensors.torch import load_file

    n = 0
    for f in folder.glob("*.safetensors"):
        for name, t in load_file(str(f)).items():
            assert t.numel() > 0, f"{f}:{name}"
            n += 1
    assert n > 0, folder
    return n


def _initial_weights(tiny_model_dir):
    from safetensors.torch import load_file

    return load_file(str(Path(tiny_model_dir) / "model.safetensors"))


@pytest.mark.distributed
def test_zero2_full_finetune_two_processes(tmp_path, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    proc, out = _launch(tmp_path, tiny_model_dir, "z2", launcher_args=TWO_PROCS, deepspeed=str(ROOT / "configs/deepspeed/zero2.json"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 2, "accelerator_num_processes": 2,
                                       "distributed_type": "DEEPSPEED", "deepspeed": True, "zero_stage": 2,
                                       "partitioned_load": False}
    assert (manifest["num_processes"], manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"],
            manifest["global_batch_size"], manifest["steps"]) == (2, 1, 2, 4, 2)
    # every save was reloaded and compared when it was made, by rank 0
    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == ["trainer/checkpoint-1", "trainer/checkpoint-2", "model"]
    assert all(c["max_abs_logit_diff"] <= 1e-4 and c["tensors"] >= 20 for c in checks), checks
    assert [e["step"] for e in json.loads((out / "log_history.json").read_text()) if "loss" in e] == [1, 2]

    model, info = AutoModelForCausalLM.from_pretrained(str(out / "model"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert _assert_every_tensor_non_empty(out / "model") >= 20
    start, end = _initial_weights(tiny_model_dir), model.state_dict()
    changed = [k for k in start if not torch.equal(start[k], end[k])]
    assert len(changed) >= len(start) // 2  # it trained: most weights moved
    assert not (out / "model" / "training_args.bin").exists()  # no pickles in the model folder


@pytest.mark.distributed
def test_zero3_lora_two_processes(tmp_path, tiny_model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    proc, out = _launch(tmp_path, tiny_model_dir, "z3", launcher_args=TWO_PROCS, deepspeed=str(ROOT / "configs/deepspeed/zero3.json"),
                        lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.05})
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    # the training arguments existed before the model: it was loaded partitioned (zero.Init)
    assert manifest["distributed"] == {"world_size": 2, "accelerator_num_processes": 2,
                                       "distributed_type": "DEEPSPEED", "deepspeed": True, "zero_stage": 3,
                                       "partitioned_load": True}
    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == ["trainer/checkpoint-1", "trainer/checkpoint-2", "adapter", "model"]
    assert all(c["max_abs_logit_diff"] <= c["tolerance"] for c in checks), checks
    # 2 layers x 7 linear modules x (lora_A, lora_B), gathered from the ZeRO-3 partitions
    assert [c["tensors"] for c in checks[:3]] == [28, 28, 28]
    assert [c["weights_compared"] for c in checks] == [28, 28, 28, 20]  # bit for bit; model/: the merge

    merged = AutoModelForCausalLM.from_pretrained(str(out / "model"))
    assert _assert_every_tensor_non_empty(out / "model") >= 20
    assert _assert_every_tensor_non_empty(out / "adapter") == 28
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    lora_b = {k: v for k, v in PeftModel.from_pretrained(base, str(out / "adapter")).state_dict().items()
              if "lora_B" in k}
    assert len(lora_b) == 14 and any(v.abs().max() > 0 for v in lora_b.values())  # trained (B starts at 0)
    start = _initial_weights(tiny_model_dir)
    assert not torch.equal(merged.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                           start["model.layers.0.self_attn.q_proj.weight"])  # the adapter is merged in


@pytest.mark.distributed
def test_zero3_full_finetune_one_process_without_launcher(tmp_path, tiny_model_dir):
    """`python -m ratune.train` with a ZeRO-3 JSON and no launcher: rank 0 of 1 under DeepSpeed,
    the gathered 16-bit (here float32) weights saved and checked."""
    data = tmp_path / "data"
    _make_data(data)
    out = tmp_path / "z3one"
    cfg = tmp_path / "z3one.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none", "output_dir": str(out),
        "max_length": 512, "global_batch_size": 2, "per_device_batch_size": 1, "max_steps": 2, "max_examples": 4,
        "save_steps": 2, "learning_rate": 1e-3, "warmup_ratio": 0.0, "seed": 0, "torch_threads": 1,
        "deepspeed": str(ROOT / "configs/deepspeed/zero3.json")}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 1, "accelerator_num_processes": 1,
                                       "distributed_type": "DEEPSPEED", "deepspeed": True, "zero_stage": 3,
                                       "partitioned_load": True}
    assert [c["folder"] for c in manifest["save_checks"]] == ["trainer/checkpoint-2", "model"]
    # a full finetune saved and reloaded in its own dtype, same device and kernels: identical logits
    assert all(c["max_abs_logit_diff"] == 0.0 and c["weights_compared"] == 20 for c in manifest["save_checks"])
    assert _assert_every_tensor_non_empty(out / "model") >= 20


@pytest.mark.distributed
@pytest.mark.parametrize("launcher", [
    ["--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
    ["--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")],
], ids=["cpu-flag", "multi-cpu-config"])
def test_launchers_that_start_one_process_are_refused(tmp_path, tiny_model_dir, launcher):
    """Both launchers ask for 2 processes and start ONE (accelerate 1.15 simple launcher)."""
    proc, out = _launch(tmp_path, tiny_model_dir, "one", launcher_args=launcher, timeout=300,
                        deepspeed=str(ROOT / "configs/deepspeed/zero2.json"))
    assert proc.returncode != 0
    assert "accelerate started a single process although more than one was asked for" in proc.stderr
    assert not (out / "model").exists() and not (out / "manifest.json").exists()


def test_distributed_fallbacks_are_errors():
    from ratune.train.launch import check_distributed, deepspeed_settings

    z3 = deepspeed_settings(str(ROOT / "configs/deepspeed/zero3.json"))
    assert z3 == {"path": str(ROOT / "configs/deepspeed/zero3.json"), "zero_stage": 3}
    ok = {"world_size": 2, "accelerator_num_processes": 2, "distributed_type": "DEEPSPEED", "deepspeed": True,
          "zero_stage": 3}
    check_distributed(ok, expected_processes=2, deepspeed=z3)
    with pytest.raises(RatuneError, match=r"started 2 process\(es\) \(WORLD_SIZE\) but the trainer sees world_size 1"):
        check_distributed({**ok, "world_size": 1, "accelerator_num_processes": 1}, expected_processes=2, deepspeed=z3)
    with pytest.raises(RatuneError, match="is configured but the trainer runs MULTI_CPU without DeepSpeed"):
        check_distributed({**ok, "distributed_type": "MULTI_CPU", "deepspeed": False, "zero_stage": None},
                          expected_processes=2, deepspeed=z3)
    with pytest.raises(RatuneError, match="asks for ZeRO stage 3 but the trainer runs stage 2"):
        check_distributed({**ok, "zero_stage": 2}, expected_processes=2, deepspeed=z3)
    check_distributed({**ok, "distributed_type": "MULTI_CPU", "deepspeed": False, "zero_stage": None},
                      expected_processes=2, deepspeed=None)


def test_zero3_without_gathered_saves_is_refused(tmp_path):
    from ratune.train.launch import deepspeed_settings

    ds = json.loads((ROOT / "configs/deepspeed/zero3.json").read_text())
    ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    path = tmp_path / "z3.json"
    path.write_text(json.dumps(ds))
    with pytest.raises(RatuneError, match="stage3_gather_16bit_weights_on_model_save"):
        deepspeed_settings(str(path))
    with pytest.raises(RatuneError, match="cannot read the DeepSpeed config"):
        deepspeed_settings(str(tmp_path / "missing.json"))
    assert deepspeed_settings(str(ROOT / "configs/deepspeed/zero2.json"))["zero_stage"] == 2


# ---- the reload check on corrupted saves (in-process, no launcher) ----

@pytest.fixture
def saved(tmp_path, tiny_model_dir, smol_tokenizer):
    """The tiny model and a copy of its saved folder to corrupt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    folder = tmp_path / "saved"
    shutil.copytree(tiny_model_dir, folder)
    return model, folder


def _rewrite(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


def test_logit_tolerance_follows_the_dtype_and_the_logit_scale():
    import math

    import torch

    from ratune.train import checks

    ref = [torch.tensor([[30.0, -2.0]]), torch.tensor([[-12.0]])]
    # sqrt(eps) x the largest |logit|: float32 eps 2^-23, bfloat16 2^-7, float16 2^-10
    assert checks.logit_tolerance(torch.float32, ref) == pytest.approx(2 ** -11.5 * 30)  # 0.01036
    assert checks.logit_tolerance(torch.bfloat16, ref) == pytest.approx(2 ** -3.5 * 30)  # 2.652
    assert checks.logit_tolerance(torch.float16, ref) == pytest.approx(2 ** -5 * 30)  # 0.9375
    assert checks.logit_tolerance(torch.float32, [torch.tensor([0.5])]) == pytest.approx(2 ** -11.5)  # floor 1
    # the differences that stopped correct saves (0.000103 on a merged fp32 LoRA model, 0.133 in bf16) are within it
    assert 0.000103 < checks.logit_tolerance(torch.float32, ref) and 0.133 < checks.logit_tolerance(torch.bfloat16, ref)
    assert checks.compute_dtype(torch.float32, None, torch.bfloat16) == torch.bfloat16
    assert math.isclose(checks.logit_tolerance(checks.compute_dtype(torch.float32, torch.float16), ref), 0.9375)


def test_reload_check_passes_an_intact_save(saved, smol_tokenizer):
    import torch

    from ratune.train import checks

    model, folder = saved
    ref = checks.prompt_logits(model, smol_tokenizer)
    assert [r.shape[0] for r in ref] == [len(smol_tokenizer(p, add_special_tokens=False)["input_ids"])
                                         for p in checks.PROMPTS]
    summary = checks.verify_saved(folder, model, smol_tokenizer, adapter=False)
    assert summary["max_abs_logit_diff"] == 0.0 and summary["tensors"] == len(model.state_dict()) - 1  # lm_head tied
    assert summary["weights_compared"] == len(list(model.parameters())) == 20
    scale = max(float(r.abs().max()) for r in ref)
    assert summary["tolerance"] == pytest.approx(torch.finfo(torch.float32).eps ** 0.5 * scale)


def test_reload_check_catches_a_zeroed_tensor(saved, smol_tokenizer):
    from ratune.train import checks

    model, folder = saved
    _rewrite(folder, lambda t: t["model.layers.1.mlp.down_proj.weight"].zero_())
    with pytest.raises(RatuneError, match=rf"{folder}: weight 'model.layers.1.mlp.down_proj.weight' differs from "
                                          r"the in-memory model's \(max abs difference"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False)


def test_reload_check_catches_one_flipped_bit(saved, smol_tokenizer):
    """A change far below any logit tolerance is still a corrupt save: weights compare bit for bit."""
    import torch

    from ratune.train import checks

    model, folder = saved

    def flip(t):
        w = t["model.layers.0.self_attn.v_proj.weight"]
        w.view(torch.int32)[0, 0] ^= 1  # the lowest mantissa bit of one weight

    _rewrite(folder, flip)
    with pytest.raises(RatuneError, match=r"weight 'model.layers.0.self_attn.v_proj.weight' differs"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False)


def test_reload_check_catches_an_empty_tensor(saved, smol_tokenizer):
    import torch

    from ratune.train import checks

    model, folder = saved
    _rewrite(folder, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight", torch.empty(0)))
    with pytest.raises(RatuneError, match=rf"{folder}: tensor 'model.layers.0.self_attn.q_proj.weight' .* is empty"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False)


def test_reload_check_catches_a_missing_tensor(saved, smol_tokenizer):
    from ratune.train import checks

    model, folder = saved
    _rewrite(folder, lambda t: t.pop("model.layers.1.post_attention_layernorm.weight"))
    with pytest.raises(RatuneError, match=rf"{folder}: .*missing keys: model.layers.1.post_attention_layernorm.weight"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False)


def test_reload_check_catches_a_config_that_does_not_reload_as_trained(saved, smol_tokenizer):
    """Weights intact, config changed (RoPE base 10000 -> 100): only the logits show it (by 6.7 on
    the tiny model, tolerance 0.00478)."""
    from ratune.train import checks

    model, folder = saved
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_theta"] = 100.0
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(RatuneError, match=rf"{folder}: reloaded model's logits on .* differ from the in-memory "
                                          r"model.s by [0-9.]+ > tolerance 0.00478"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False)


def test_reload_check_runs_both_sides_under_the_runs_autocast(saved, smol_tokenizer):
    """accelerate wraps the trained model's forward in bf16 autocast (a LoRA run with bf16: true
    on CPU); the reloaded model runs under the same autocast, so a correct save passes. Compared
    in float32 without autocast (the check before this fix), it failed by about 0.5."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from ratune.train import checks

    model, folder = saved
    # accelerate keeps one process-wide state: a training test earlier in this pytest process
    # (a Trainer) set it up without mixed precision; this test needs its own bf16 state
    AcceleratorState._reset_state(reset_partial_state=True)
    model = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(model)
    summary = checks.verify_saved(folder, model, smol_tokenizer, adapter=False, autocast_dtype=torch.bfloat16)
    assert summary["max_abs_logit_diff"] == 0.0 and summary["compute_dtype"] == "torch.bfloat16"
    with pytest.raises(RatuneError, match="reloaded model's logits .* differ"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=False, autocast_dtype=None)


def test_merged_lora_model_passes_despite_another_float_order(tmp_path, tiny_model_dir, smol_tokenizer):
    """The LoRA model/ is the adapter merged into its base: its weights equal the merge bit for bit
    and its logits equal the adapter model's up to float order (make demo stopped here at 1e-4)."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ratune.train import checks

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    merged = copy.deepcopy(model).merge_and_unload()
    folder = tmp_path / "model"
    merged.save_pretrained(str(folder))
    summary = checks.verify_saved(folder, model, smol_tokenizer, adapter=False, expected=merged,
                                  expected_on_rank0_only=True)
    assert 0.0 < summary["max_abs_logit_diff"] < summary["tolerance"]
    assert summary["weights_compared"] == 20


def test_a_check_that_cannot_run_is_not_called_a_corrupt_save(tmp_path, tiny_model_dir, smol_tokenizer):
    """The LoRA check's fresh base failing to load (e.g. flash_attention_2 where it cannot run)
    is the check's failure: the message says the save was not judged."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ratune.train import checks

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    folder = tmp_path / "adapter"
    model.save_pretrained(str(folder))

    def base():
        raise ValueError("Flash Attention 2 with a model not initialized on GPU and with no GPU available")

    with pytest.raises(RatuneError, match=rf"{folder}: the save check could not load a fresh base model for the "
                                          r"adapter \(ValueError: Flash Attention 2 .*\); the save itself was not judged"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=True, load_base=base)


def test_reload_check_catches_a_changed_adapter(tmp_path, tiny_model_dir, smol_tokenizer):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from ratune.train import checks

    def base():
        return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))

    model = get_peft_model(base(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # a trained-looking adapter (B starts at zero)
    folder = tmp_path / "adapter"
    model.save_pretrained(str(folder))
    summary = checks.verify_saved(folder, model, smol_tokenizer, adapter=True, load_base=base)
    assert summary["tensors"] == 28 and summary["weights_compared"] == 28  # lora_A and lora_B of 14 linears

    f = folder / "adapter_model.safetensors"
    tensors = load_file(str(f))
    name = next(k for k in sorted(tensors) if "lora_B" in k)
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(RatuneError, match=rf"{folder}: weight '{re.escape(name[:-len('.weight')])}.default.weight' differs"):
        checks.verify_saved(folder, model, smol_tokenizer, adapter=True, load_base=base)


def _same_row_data(folder: Path, n: int = 8) -> Path:
    """A data folder of ``n`` copies of one row: every sampler order gives the same batches, so a
    distributed run and a single-process run of the same global batch must train alike."""
    from datasets import Dataset, DatasetDict

    from ratune.manifest import mark_complete

    rows = {"user_turn": ["Which API classifies images of cats?"] * n,
            "completion": ["load the pretrained resnet50 model from torch hub and run it on the image"] * n,
            "line": list(range(1, n + 1))}
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(folder / "none"))
    mark_complete(folder)
    return folder


@pytest.mark.distributed
def test_zero2_two_processes_match_one_process_of_the_same_global_batch(tmp_path, tiny_model_dir):
    """2 processes x accumulation 2 under ZeRO-2 against 1 process x accumulation 4 (global batch 4
    both): the same losses at every step and the same final weights, within float32 reduction
    noise (torchtune checks distributed losses against single-device ones)."""
    import torch
    from safetensors.torch import load_file

    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    data = _same_row_data(tmp_path / "same")
    common = {"data_dir": str(data), "max_steps": 3, "save_steps": None}
    proc, out = _launch(tmp_path, tiny_model_dir, "z2", launcher_args=TWO_PROCS,
                        deepspeed=str(ROOT / "configs/deepspeed/zero2.json"), **common)
    assert proc.returncode == 0, proc.stderr[-4000:]
    config = yaml.safe_load((tmp_path / "z2.yaml").read_text())
    config.pop("deepspeed")
    single = train(TrainConfig(**{**config, "output_dir": str(tmp_path / "single")}))

    def losses(run):
        return [e["loss"] for e in json.loads((run / "log_history.json").read_text()) if "loss" in e]

    assert json.loads((out / "manifest.json").read_text())["gradient_accumulation_steps"] == 2
    assert json.loads((tmp_path / "single" / "manifest.json").read_text())["gradient_accumulation_steps"] == 4
    assert len(losses(out)) == 3
    assert losses(out) == pytest.approx(losses(tmp_path / "single"), rel=1e-4)
    assert losses(out)[2] < losses(out)[0]  # it learns the repeated row
    distributed, reference = load_file(str(out / "model" / "model.safetensors")), load_file(str(single / "model.safetensors"))
    # the DeepSpeed save writes the tied lm_head too (equal to the embedding); the plain save does not
    assert set(distributed) - set(reference) <= {"lm_head.weight"} and set(reference) <= set(distributed)
    if "lm_head.weight" in distributed:
        assert torch.equal(distributed["lm_head.weight"], distributed["model.embed_tokens.weight"])
    for name in reference:
        torch.testing.assert_close(distributed[name], reference[name], rtol=1e-4, atol=1e-5, msg=name)
