"""`accelerate launch -m ratune.train --config FILE` runs the same training entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml


def test_accelerate_launch_single_process_cpu(tmp_path, apibench, tiny_model_dir, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset

    data = tmp_path / "data"
    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=data, tokenizer=smol_tokenizer, tokenizer_name="t",
                  modes=["none"], progress=False, settings=BuildSettings(max_length=512))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none",
        "output_dir": str(tmp_path / "run"), "max_length": 512, "global_batch_size": 2, "per_device_batch_size": 1,
        "max_steps": 1, "max_examples": 4, "torch_threads": 1}))
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate if accelerate.exists() else shutil.which("accelerate")), "launch", "--cpu",
           "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "ratune.train", "--config", str(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"model": str(tmp_path / "run" / "model")}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["steps"] == 1 and manifest["global_batch_size"] == 2
    import torch

    assert manifest["device"] == {"type": "cpu", "torch": torch.__version__, "cuda_build": torch.version.cuda}
    # the processor it computed on, with the config's thread count in force (ratune.manifest.host_facts)
    assert (manifest["host"]["cpu_capability"], manifest["host"]["torch_threads"]) == \
        (torch.backends.cpu.get_cpu_capability(), 1)
    assert (tmp_path / "run" / ".complete").exists()

    # rerunning into the same folder without --resume-from is refused, with a clear message
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(config)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2
    assert "output folder exists from an earlier run; pass --resume-from latest" in proc.stderr


def _accelerate() -> str:
    accelerate = Path(sys.executable).with_name("accelerate")
    return str(accelerate if accelerate.exists() else shutil.which("accelerate"))


def test_gpu_accelerate_config_without_cuda_is_refused_before_any_work(tmp_path):
    """`accelerate launch --config_file configs/accelerate/1gpu.yaml` where torch sees no CUDA: one
    error line naming torch's version and CUDA build, before any data is read or folder made."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the launch would be allowed")
    root = Path(__file__).resolve().parent.parent
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": "no-such-model", "data_dir": str(tmp_path / "no_data"), "train_retriever": "none",
        "output_dir": str(tmp_path / "run"), "global_batch_size": 2, "per_device_batch_size": 1}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    proc = subprocess.run([_accelerate(), "launch", "--config_file", str(root / "configs/accelerate/1gpu.yaml"),
                           "-m", "ratune.train", "--config", str(config)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("ratune: error: ")]
    assert line.startswith("ratune: error: accelerate launch asked for a GPU run (ACCELERATE_USE_CPU=False: neither "
                           "`accelerate launch --cpu` nor `use_cpu: true` in the accelerate config) but torch "
                           f"{torch.__version__} (torch.version.cuda {torch.version.cuda}) sees no CUDA device; ")
    assert "install a CUDA build of torch" in line or "install a torch build" in line
    assert not (tmp_path / "run").exists()
