"""Third-party noise is silenced, and only it (ratune/noise.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import yaml

from ratune.noise import _DropPrefixes, quiet_known_noise


def test_filters_drop_exactly_the_named_messages(monkeypatch):
    import ratune.noise

    logger = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(logger, "filters", [])  # restored after the test
    monkeypatch.setattr(ratune.noise, "_installed", False)
    drop = logging.LogRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 213,
                             "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",
                             None, None)
    keep = logging.LogRecord("DeepSpeed", logging.WARNING, "engine.py", 1, "Setting ZeRO stage 3", None, None)
    with warnings.catch_warnings(record=True) as seen:  # restores the warning filters afterwards
        warnings.simplefilter("default")
        quiet_known_noise()
        quiet_known_noise()  # idempotent: one filter on the logger
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("`something_else` is deprecated", FutureWarning)
    assert [str(w.message) for w in seen] == ["`something_else` is deprecated"]
    assert sum(isinstance(f, _DropPrefixes) for f in logger.filters) == 1
    assert logger.filter(drop) is False and logger.filter(keep) is True


def _script(quiet: bool) -> str:
    return ("import sys\nfrom ratune.boundary import run_guarded\n"
            + ("" if quiet else "import ratune.noise\nratune.noise.quiet_known_noise = lambda: None\n")
            + "def body():\n    from deepspeed.accelerator import get_accelerator\n    get_accelerator()\n    return 0\n"
            "sys.exit(run_guarded(body))\n")


def test_deepspeed_cpu_guess_is_silent_under_the_boundary():
    """The same DeepSpeed import prints its accelerator guess without the filter and nothing with
    it (CUDA is hidden from tests, so DeepSpeed guesses the CPU)."""
    loud = subprocess.run([sys.executable, "-c", _script(quiet=False)], capture_output=True, text=True)
    quiet = subprocess.run([sys.executable, "-c", _script(quiet=True)], capture_output=True, text=True)
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "Setting accelerator to CPU" in loud.stdout + loud.stderr
    assert "Setting accelerator to CPU" not in quiet.stdout + quiet.stderr


def test_lora_run_with_gradient_checkpointing_prints_no_deprecation(tmp_path, tiny_model_dir):
    """A LoRA run with gradient checkpointing through ``python -m ratune.train``: transformers 5.24
    warned twice (our ``gradient_checkpointing`` argument, peft's ``is_gradient_checkpointing``)."""
    from test_train_correctness import _make_data

    data = _make_data(tmp_path / "data", n=2)
    config = {"model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none",
              "output_dir": str(tmp_path / "run"), "max_length": 512, "global_batch_size": 2, "max_steps": 1,
              "warmup_ratio": 0.0, "torch_threads": 1, "gradient_checkpointing": True, "lora": {"enabled": True}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "FutureWarning" not in out and "deprecated" not in out, out[-3000:]
    assert "Setting accelerator to CPU" not in out
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
