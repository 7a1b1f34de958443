"""The GPU path's first-hour failures, checked on CPU.

- eval places the model on CUDA in bfloat16 when torch sees a GPU, on the CPU in float32
  otherwise, records both in each cell's identity and metrics, and validates --device/--dtype;
- a GPU ``accelerate launch`` where torch sees no CUDA is refused (never a silent CPU run), judged
  from the environment accelerate 1.15 itself builds for each shipped accelerate config;
- attention that cannot run here (flash_attention_2 without flash-attn) is refused before any
  data or model is loaded, QLoRA included, and the shipped GPU configs use sdpa;
- the paper configs save per epoch with a checkpoint limit, and a save_steps the run never
  reaches is refused;
- a full finetune in 16-bit weights without DeepSpeed is refused.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from ratune.config import load_config, validate
from ratune.errors import RatuneError
from ratune.train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
PAPER_CONFIGS = sorted((ROOT / "configs" / "train").glob("llama7b_rat_paper*.yaml"))


# ---------------------------------------------------------------------------------------------
# a GPU launch without CUDA is refused


def _accelerate_env(argv: list[str]) -> dict:
    """The environment accelerate 1.15's own launch code gives the training processes for ``argv``
    (``accelerate launch ARGV -m ratune.train ...``), choosing the launcher as launch_command does."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(argv + ["-m", "ratune.train", "--config", "x.yaml"])
    args, _, _ = _validate_launch_command(args)
    if (args.multi_gpu or args.use_deepspeed or args.use_fsdp) and not args.cpu:
        return dict(prepare_multi_gpu_env(args))  # torchrun; adds WORLD_SIZE etc. in each worker
    return dict(prepare_simple_launcher_cmd_env(args)[1])


GPU_LAUNCHES = {"1gpu.yaml": "ACCELERATE_USE_CPU=False", "8gpu_zero3.yaml": "ACCELERATE_MIXED_PRECISION=bf16",
                "multinode_zero3.yaml": "ACCELERATE_MIXED_PRECISION=bf16"}
CPU_LAUNCHES = ("cpu_1proc.yaml", "cpu_2proc.yaml", "cpu_2proc_deepspeed.yaml")


@pytest.fixture
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return torch


def test_gpu_accelerate_configs_without_cuda_are_refused_in_one_line(no_cuda):
    from ratune.train.launch import check_cuda_launch

    torch = no_cuda
    for name, evidence in GPU_LAUNCHES.items():
        env = _accelerate_env(["--config_file", str(ROOT / "configs" / "accelerate" / name)])
        with pytest.raises(RatuneError) as err:
            check_cuda_launch(env)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"accelerate launch asked for a GPU run ({evidence}")
        assert f"torch {torch.__version__} (torch.version.cuda {torch.version.cuda}) sees no CUDA device" in message
        if torch.version.cuda is None:  # this machine's CPU wheel
            assert "this torch is a CPU-only build: install a CUDA build of torch (make setup TORCH=torch" in message
        # asking for the CPU on purpose is always allowed
        check_cuda_launch({**env, "ACCELERATE_USE_CPU": "true"})


def test_cpu_launches_and_plain_python_are_never_refused(no_cuda):
    from ratune.train.launch import check_cuda_launch, gpu_launch_evidence

    for name in CPU_LAUNCHES:
        env = _accelerate_env(["--config_file", str(ROOT / "configs" / "accelerate" / name)])
        assert gpu_launch_evidence(env) is None, name
        check_cuda_launch(env)
    # tests/test_accelerate_launch.py's command line
    env = _accelerate_env(["--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                           "--dynamo_backend", "no"])
    assert env["ACCELERATE_USE_CPU"] == "True" and gpu_launch_evidence(env) is None
    # python -m ratune.train, the demo, in-process tests: no accelerate variables at all
    assert gpu_launch_evidence({"PATH": "/bin", "WORLD_SIZE": "1"}) is None
    check_cuda_launch({})


def test_gpu_launch_with_cuda_passes_and_a_cuda_build_gets_the_driver_hint(monkeypatch):
    import torch

    from ratune.train.launch import check_cuda_launch

    env = _accelerate_env(["--config_file", str(ROOT / "configs" / "accelerate" / "8gpu_zero3.yaml")])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_cuda_launch(env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(RatuneError, match=r"\(torch\.version\.cuda 12\.8\) sees no CUDA device; this torch is "
                                          r"built for CUDA 12\.8 but finds no usable GPU: check nvidia-smi"):
        check_cuda_launch(env)


def test_device_facts_name_the_gpu(monkeypatch):
    import torch

    from ratune.train.launch import device_facts

    assert device_facts(torch.device("cpu")) == {"type": "cpu", "torch": torch.__version__,
                                                 "cuda_build": torch.version.cuda}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: f"NVIDIA H200 #{index}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    facts = device_facts(torch.device("cuda", 3))
    assert (facts["type"], facts["name"], facts["count"]) == ("cuda", "NVIDIA H200 #3", 8)


# ---------------------------------------------------------------------------------------------
# attention checked before any heavy work


def test_gpu_configs_default_to_sdpa():
    assert len(PAPER_CONFIGS) == 3
    for path in PAPER_CONFIGS:
        assert load_config(TrainConfig, path).attn_implementation == "sdpa", path.name


def _fake_flash(monkeypatch, present: bool) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present else None) if name == "flash_attn" else real(name, *a))


@pytest.mark.parametrize("qlora", [False, True])
def test_missing_flash_attn_is_refused_before_data_or_folders(tmp_path, monkeypatch, qlora):
    from ratune.train.sft import train

    out = tmp_path / "run"
    cfg = TrainConfig(model="no-such-model", data_dir=str(tmp_path / "no_data"), train_retriever="oracle",
                      output_dir=str(out), attn_implementation="flash_attention_2", padding_free=True,
                      lora={"enabled": True}, load_in_4bit=qlora)
    _fake_flash(monkeypatch, present=False)
    with pytest.raises(RatuneError) as err:
        train(cfg)
    message = str(err.value)
    assert message == ("attn_implementation: flash_attention_2 needs the flash-attn package, which is not installed: "
                       "pip install flash-attn --no-build-isolation (after a CUDA build of torch); or set "
                       "attn_implementation: sdpa (exact, no extra package)")
    assert "packing" not in message and "padding" not in message and not out.exists()
    # flash-attn installed, but no GPU: the message names CUDA, still before anything is written
    _fake_flash(monkeypatch, present=True)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RatuneError, match=r"^attn_implementation: flash_attention_2 runs on CUDA GPUs only, and "
                                          r"torch .* sees none here; set attn_implementation: sdpa$"):
        train(cfg)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# saves that fit the data size


def test_paper_configs_save_per_epoch_with_a_limit():
    for path in PAPER_CONFIGS:
        cfg = load_config(TrainConfig, path)
        assert (cfg.resolved_save_strategy, cfg.save_steps, cfg.save_total_limit) == ("epoch", None, 2), path.name
    paper = load_config(TrainConfig, ROOT / "configs" / "train" / "llama7b_rat_paper.yaml")
    # TorchHub's 837 training examples at batch 64: 14 optimizer steps per epoch, 70 in 5 epochs
    assert [paper.optimizer_steps_bound(837, n) for n in (1, 2, 8, 16)] == [70, 70, 70, 70]
    assert paper.optimizer_steps_bound(837, 8) < 200  # the old save_steps: 200 never saved


def test_save_strategy_schema():
    base = {"model": "m", "data_dir": "d", "train_retriever": "none", "output_dir": "o"}
    assert TrainConfig(**base).resolved_save_strategy == "no"
    assert TrainConfig(**base, save_steps=10).resolved_save_strategy == "steps"  # configs written before the field
    with pytest.raises(RatuneError, match="save_strategy: steps needs save_steps"):
        validate(TrainConfig, {**base, "save_strategy": "steps"}, "t.yaml")
    with pytest.raises(RatuneError, match=r"save_steps: 10 contradicts save_strategy: epoch \(save_steps is used "
                                          r"only with save_strategy: steps\)"):
        validate(TrainConfig, {**base, "save_strategy": "epoch", "save_steps": 10}, "t.yaml")
    with pytest.raises(RatuneError, match="save_total_limit"):
        validate(TrainConfig, {**base, "save_total_limit": 0}, "t.yaml")


@pytest.fixture(scope="module")
def none_data(tmp_path_factory, apibench, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset

    data = tmp_path_factory.mktemp("gpu_launch") / "data"
    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=data, tokenizer=smol_tokenizer, tokenizer_name="t",
                  modes=["none"], progress=False, settings=BuildSettings(max_length=512))
    return data


def _tiny(model_dir, data, out, **changes) -> TrainConfig:
    return TrainConfig(**{"model": str(model_dir), "data_dir": str(data), "train_retriever": "none",
                          "output_dir": str(out), "max_length": 512, "global_batch_size": 2,
                          "per_device_batch_size": 1, "max_examples": 4, "torch_threads": 1, "verify_saves": False,
                          "learning_rate": 1e-3, "warmup_ratio": 0.0, **changes})


def test_save_steps_the_run_never_reaches_is_refused(tmp_path, tiny_model_dir, none_data):
    from ratune.train.sft import train

    cfg = _tiny(tiny_model_dir, none_data, tmp_path / "run", num_epochs=2, save_steps=5)
    with pytest.raises(RatuneError, match=r"^save_steps 5 > the 4 optimizer steps of this run \(4 examples / global "
                                          r"batch 2 x 2 epochs\): no checkpoint would be written, and a preempted "
                                          r"run could not resume; use save_strategy: epoch, or save_steps of at most 4$"):
        train(cfg)
    assert not (tmp_path / "run" / "trainer").exists()


def test_epoch_saves_reach_the_trainer_with_the_limit(tmp_path, tiny_model_dir, none_data):
    from ratune.train.sft import train

    out = tmp_path / "run"
    train(_tiny(tiny_model_dir, none_data, out, num_epochs=2, save_strategy="epoch", save_total_limit=1))
    # 2 optimizer steps per epoch: saves at steps 2 and 4; the limit keeps only the newest
    assert sorted(p.name for p in (out / "trainer").glob("checkpoint-*")) == ["checkpoint-4"]
    state = json.loads((out / "trainer" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["epoch"] == 2.0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["save_strategy"] == "epoch" and manifest["config"]["save_total_limit"] == 1
    assert manifest["device"]["type"] == "cpu"


# ---------------------------------------------------------------------------------------------
# no full finetune in 16-bit weights without DeepSpeed


def test_bf16_full_finetune_without_deepspeed_is_refused():
    base = {"model": "m", "data_dir": "d", "train_retriever": "none", "output_dir": "o"}
    with pytest.raises(RatuneError) as err:
        validate(TrainConfig, {**base, "dtype": "bfloat16", "bf16": True}, "t.yaml")
    assert ("dtype: bfloat16 with a full finetune (lora.enabled: false) and no deepspeed keeps no fp32 master "
            "weights: at learning_rate 2e-05 most updates round away in bfloat16; use dtype: float32 with bf16: "
            "true (bf16 autocast, fp32 weights), or LoRA (lora.enabled: true), or DeepSpeed") in str(err.value)
    with pytest.raises(RatuneError, match="dtype: float16 with a full finetune"):
        validate(TrainConfig, {**base, "dtype": "float16"}, "t.yaml")
    # the three ways out
    validate(TrainConfig, {**base, "dtype": "float32", "bf16": True}, "t.yaml")
    validate(TrainConfig, {**base, "dtype": "bfloat16", "lora": {"enabled": True}}, "t.yaml")
    validate(TrainConfig, {**base, "dtype": "bfloat16", "bf16": True, "deepspeed": "configs/deepspeed/zero3.json"},
             "t.yaml")


def test_no_shipped_config_hits_the_bf16_refusal():
    from ratune import sweep as sw

    for path in sorted((ROOT / "configs" / "train").glob("*.yaml")):
        load_config(TrainConfig, path)
    for path in [ROOT / "configs" / "demo.yaml", *sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))]:
        sweep = sw.load_sweep(path, out_dir=None)
        for cell in sw.expand(sweep):
            TrainConfig(**cell.config)


# ---------------------------------------------------------------------------------------------
# eval device and dtype


def test_eval_placement_defaults_and_validation(monkeypatch):
    import torch

    from ratune.eval.settings import resolve_placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_placement() == ("cuda", "bfloat16")
    assert resolve_placement("cpu") == ("cpu", "float32")
    assert resolve_placement("auto", "float16") == ("cuda", "float16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_placement() == ("cpu", "float32")
    assert resolve_placement("cpu", "bfloat16") == ("cpu", "bfloat16")
    with pytest.raises(RatuneError, match=rf"--device cuda, but torch {re.escape(torch.__version__)} sees no CUDA device"):
        resolve_placement("cuda")
    with pytest.raises(RatuneError, match=r"unknown eval device 'tpu': expected one of auto, cpu, cuda"):
        resolve_placement("tpu")
    with pytest.raises(RatuneError, match=r"unknown eval dtype 'int8': expected one of auto, float32, bfloat16, float16"):
        resolve_placement("auto", "int8")
    with pytest.raises(RatuneError, match="the vLLM backend generates on CUDA only"):
        resolve_placement("cpu", backend="vllm")


def _eval(tiny_model_dir, apibench, out, **settings):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    return evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=out, progress=False,
                               settings=EvalSettings(settings=["0_shot"], n_questions=2, batch_size=2,
                                                     max_new_tokens=4, torch_threads=1, **settings))


def test_eval_records_device_and_dtype_and_refuses_to_mix_them(tmp_path, tiny_model_dir, apibench, monkeypatch):
    import torch

    import ratune.models as model_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = _eval(tiny_model_dir, apibench, tmp_path / "cpu")["0_shot"]
    identity = json.loads((tmp_path / "cpu" / "0_shot" / "identity.json").read_text())
    assert (identity["generation"]["device"], identity["generation"]["dtype"]) == ("cpu", "float32")
    assert (cpu["generation"]["device"], cpu["generation"]["dtype"], cpu["device_name"]) == ("cpu", "float32", "cpu")
    assert (cpu["host"]["cpu_capability"], cpu["host"]["torch_threads"]) == (torch.backends.cpu.get_cpu_capability(), 1)
    # the same cell on a GPU machine (auto: cuda, bfloat16) is another cell
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RatuneError, match=r"0_shot: this eval cell was made with different settings \(generation.device: "
                                          r"'cpu' then, 'cuda' now; generation.dtype: 'float32' then, 'bfloat16' now"):
        _eval(tiny_model_dir, apibench, tmp_path / "cpu")
    # on the CPU again it is the same cell, read back
    assert _eval(tiny_model_dir, apibench, tmp_path / "cpu", device="cpu")["0_shot"]["n"] == 2

    # with a GPU present, the model is asked for on cuda in bfloat16 (loaded on the CPU here)
    real_load, asked = model_module.load_model, {}

    def load_model(path, **kwargs):
        asked.update(kwargs)
        return real_load(path, **{**kwargs, "device": None})

    monkeypatch.setattr("ratune.eval.run.load_model", load_model)  # the name evaluate_checkpoint calls
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200 (simulated)")
    gpu = _eval(tiny_model_dir, apibench, tmp_path / "gpu")["0_shot"]
    assert (asked["device"], asked["dtype"]) == ("cuda", "bfloat16")
    identity = json.loads((tmp_path / "gpu" / "0_shot" / "identity.json").read_text())
    assert (identity["generation"]["device"], identity["generation"]["dtype"]) == ("cuda", "bfloat16")
    assert (gpu["generation"]["device"], gpu["device_name"]) == ("cuda", "NVIDIA H200 (simulated)")
    # --dtype overrides
    _eval(tiny_model_dir, apibench, tmp_path / "gpu32", dtype="float32")
    assert asked["dtype"] == "float32"


def test_device_and_dtype_reach_eval_run_from_the_cli_the_sweep_and_the_demo(tmp_path, capsys):
    from ratune import sweep as sw
    from ratune.cli import build_parser

    parser = build_parser()
    base = ["eval", "run", "--checkpoint", str(tmp_path), "--hub", "torchhub", "--out", "o"]
    args = parser.parse_args(base)
    assert (args.device, args.dtype) == ("auto", "auto")
    args = parser.parse_args(base + ["--device", "cuda", "--dtype", "float16"])
    assert (args.device, args.dtype) == ("cuda", "float16")
    with pytest.raises(SystemExit):
        parser.parse_args(base + ["--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err

    def sweep_file(eval_settings):
        path = tmp_path / "sweep.yaml"
        path.write_text(yaml.safe_dump({
            "name": "t", "out_dir": str(tmp_path / "sweep"),
            "base": {"model": "m", "hub": "torchhub", "train_retriever": "none", "global_batch_size": 4,
                     "lora": {"enabled": True}},
            "eval": {"settings": ["0_shot"], **eval_settings}}))
        return sw.load_sweep(path)

    sweep = sweep_file({"device": "cuda", "dtype": "bfloat16"})
    cmd = sw.eval_command(sweep, sw.expand(sweep)[0])
    assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    plain = sweep_file({})
    cmd = sw.eval_command(plain, sw.expand(plain)[0])
    assert "--device" not in cmd and "--dtype" not in cmd
    with pytest.raises(RatuneError, match="device"):
        sweep_file({"device": "tpu"})
    demo = sw.load_sweep(ROOT / "configs" / "demo.yaml")  # the demo: a sweep, on the default device
    cmd = sw.eval_command(demo, sw.expand(demo)[0])
    assert "--device" not in cmd and "--dtype" not in cmd
    assert (demo.config.eval.device, demo.config.eval.dtype) == ("auto", "auto")
