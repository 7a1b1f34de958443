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
    assert (tmp_path / "run" / ".complete").exists()

    # rerunning into the same folder without --resume-from is refused, with a clear message
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(config)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2
    assert "output folder exists from an earlier run; pass --resume-from latest" in proc.stderr
