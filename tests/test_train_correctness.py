"""Training correctness on CPU: gradient accumulation is loss-equivalent,
and a run killed with SIGKILL after a checkpoint resumes to the same learning rates and weights.

Both use the real path (ratune.train.sft.train -> TRL SFTTrainer) on the tiny random Llama and a
small hand-made data folder whose answers have very different lengths (1 to ~150 words), so a
per-micro-batch mean (the bug public pipelines shipped) would give a different loss and gradient
than the per-token mean over the whole accumulated batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent


def _make_data(folder: Path, n: int = 8) -> Path:
    """A complete `ratune data build`-shaped folder with ``n`` rows in mode ``none``."""
    from datasets import Dataset, DatasetDict

    from ratune.manifest import mark_complete

    words = "load the pretrained model from torch hub and run it on the image".split()
    rows = {"user_turn": [], "completion": [], "line": []}
    lengths = [1, 150, 3, 60, 2, 110, 8, 30, 5, 90, 4, 45][:n]
    for i, k in enumerate(lengths):
        rows["user_turn"].append(f"Question {i}: which API classifies images of {'cats' if i % 2 else 'dogs'}?")
        rows["completion"].append(" ".join(words[(i + j) % len(words)] for j in range(k)))
        rows["line"].append(i + 1)
    DatasetDict({"train": Dataset.from_dict(rows)}).save_to_disk(str(folder / "none"))
    mark_complete(folder)
    return folder


def _config(tiny_model_dir, data, out, **kw):
    from ratune.train.config import TrainConfig

    base = dict(model=str(tiny_model_dir), data_dir=str(data), train_retriever="none", output_dir=str(out),
                max_length=512, learning_rate=1e-3, warmup_ratio=0.0, lr_scheduler="constant", seed=0,
                torch_threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture
def capture_grads(monkeypatch):
    """Patch trl.SFTTrainer (imported inside train()) so each run records the gradients seen just
    before its first optimizer step (after clipping: transformers clips, then calls
    on_pre_optimizer_step) and the loss tensors of each micro-batch."""
    import trl
    from transformers import TrainerCallback

    records = []

    class Capture(TrainerCallback):
        def __init__(self, record):
            self.record = record

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if "grads" not in self.record:
                self.record["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                        if p.grad is not None}

    class Recording(trl.SFTTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.record = {"num_items": []}
            records.append(self.record)
            self.add_callback(Capture(self.record))

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.record["num_items"].append(None if num_items_in_batch is None else int(num_items_in_batch))
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    monkeypatch.setattr(trl, "SFTTrainer", Recording)
    return records


def test_gradient_accumulation_is_loss_equivalent(tmp_path, tiny_model_dir, capture_grads):
    """Global batch 8 as 8x1, 2x4 and 1x8 (micro-batch x accumulation): same first-step loss,
    gradient norm, gradients (1e-5) and updated weights, with answers of 1 to 150 words."""
    import torch

    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    runs = {}
    for micro, accum in [(8, 1), (2, 4), (1, 8)]:
        out = tmp_path / f"run_{micro}x{accum}"
        cfg = _config(tiny_model_dir, data, out, global_batch_size=8, per_device_batch_size=micro,
                      gradient_accumulation_steps=accum, max_steps=1, max_examples=8)
        final = train(cfg)
        log = json.loads((out / "log_history.json").read_text())
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["data"]["examples"] == 8
        assert (manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"]) == (micro, accum)
        runs[(micro, accum)] = {"loss": log[0]["loss"], "grad_norm": log[0]["grad_norm"],
                                "weights": _weights(final), "record": capture_grads[-1]}

    ref = runs[(8, 1)]
    n_loss_tokens = ref["record"]["num_items"][0]
    assert n_loss_tokens > 300  # the answers are long and short: the count is what is normalised by
    for key, run in runs.items():
        # transformers passes the loss-token count of the WHOLE accumulated batch to every micro-batch
        assert run["record"]["num_items"] == [n_loss_tokens] * key[1], key
        assert run["loss"] == pytest.approx(ref["loss"], abs=1e-5), key
        assert run["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), key
        for name, g in ref["record"]["grads"].items():
            torch.testing.assert_close(run["record"]["grads"][name], g, atol=1e-5, rtol=0, msg=f"{key} {name}")
        for name, w in ref["weights"].items():
            torch.testing.assert_close(run["weights"][name], w, atol=1e-5, rtol=0, msg=f"{key} {name}")


#: Losses logged at steps 1-3 of the fixed-seed run of
#: test_first_step_loss_is_the_mean_cross_entropy_of_its_labels (tiny Llama of conftest.py, the 8
#: rows of _make_data, batch 8 in one micro-batch, lr 1e-3 constant, seed 0, CPU float32). Step 1
#: alone is also checked against the hand computation in that test; steps 2-3 have no oracle.
# regression value: log_history.json of ratune.train.sft.train (transformers 5.24.0, trl 1.16.0, torch 2.13.0 CPU)
FIRST_LOSSES = [14.77365493774414, 14.259591102600098, 13.790637969970703]


def test_first_step_loss_is_the_mean_cross_entropy_of_its_labels(tmp_path, tiny_model_dir):
    """Step 1's logged loss is the mean token cross-entropy over the label positions of the batch
    ratune builds, computed here from the untrained model's logits with F.cross_entropy (shifted by
    one, ignore_index -100); the losses of steps 1-3 of the fixed-seed run are pinned."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_tokenizer
    from ratune.train.preflight import load_training_rows
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    # one micro-batch of 8 holds all 8 rows, so step 1 sees every row whatever the shuffled order
    cfg = _config(tiny_model_dir, data, tmp_path / "run", global_batch_size=8, per_device_batch_size=8,
                  max_steps=3, max_examples=8)

    # the rows exactly as train() builds them: prompt labels -100, the answer and EOS as labels
    columns, stats = load_training_rows(cfg, use_chat_template(load_tokenizer(tiny_model_dir), cfg.chat_template))
    assert stats["examples"] == len(columns["input_ids"]) == 8
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    total, positions = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for ids, labels in zip(columns["input_ids"], columns["labels"]):
            assert labels[0] == -100 and labels[-1] != -100  # starts in the prompt, ends on EOS
            logits = model(input_ids=torch.tensor([ids])).logits[0]  # one row: no padding involved
            target = torch.tensor(labels[1:])  # token t+1 is predicted from position t
            total += F.cross_entropy(logits[:-1].float(), target, ignore_index=-100, reduction="sum").double()
            positions += int((target != -100).sum())
    assert positions == stats["loss_tokens"]  # every label position counts once (none falls on token 0)
    by_hand = (total / positions).item()

    train(cfg)
    log = json.loads((tmp_path / "run" / "log_history.json").read_text())
    losses = [e["loss"] for e in log if "loss" in e]
    assert [e["step"] for e in log if "loss" in e] == [1, 2, 3]
    assert losses[0] == pytest.approx(by_hand, rel=1e-5)
    assert losses == pytest.approx(FIRST_LOSSES, rel=1e-4)


#: Loaded by the training subprocess through PYTHONPATH: after each checkpoint save it writes a
#: marker and sleeps, so the test kills it at a known point (after checkpoint-2, before step 3)
#: instead of racing a run that finishes in a second.
_SITECUSTOMIZE = '''
import os, time
from pathlib import Path
import transformers.trainer_callback as tc
_orig = tc.CallbackHandler.on_save
def on_save(self, args, state, control):
    out = _orig(self, args, state, control)
    Path(os.environ["RATUNE_TEST_SAVED"]).write_text(str(state.global_step))
    time.sleep(120)
    return out
tc.CallbackHandler.on_save = on_save
'''


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, tiny_model_dir):
    """Kill `python -m ratune.train` with SIGKILL right after checkpoint-2, resume with
    --on-unfinished resume (its latest checkpoint): same learning rate and loss at every step,
    bit-identical final weights."""
    import torch
    import yaml

    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    common = dict(global_batch_size=2, per_device_batch_size=1, gradient_accumulation_steps=2, max_steps=4,
                  max_examples=8, save_steps=2, lr_scheduler="linear", warmup_ratio=0.25)
    train(_config(tiny_model_dir, data, tmp_path / "straight", **common))  # the uninterrupted reference

    cfg = _config(tiny_model_dir, data, tmp_path / "killed", **common)
    cfg_file = tmp_path / "killed.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump()))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    saved = tmp_path / "saved"
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RATUNE_TEST_SAVED": str(saved)}
    proc = subprocess.Popen([sys.executable, "-m", "ratune.train", "--config", str(cfg_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not saved.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)
        assert saved.read_text() == "2"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed = tmp_path / "killed"
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model").exists() and not (killed / ".complete").exists()
    assert [p.name for p in (killed / "trainer").glob("checkpoint-*")] == ["checkpoint-2"]

    with pytest.raises(RatuneError, match="output folder exists"):  # never reused silently
        train(cfg)
    # what a sweep passes (the same as --resume-from latest here: the run saved checkpoint-2)
    train(cfg, on_unfinished="resume")
    with pytest.raises(RatuneError, match="a finished training run"):  # a finished run is never restarted
        train(cfg, on_unfinished="restart")

    def steps(run):
        log = json.loads((run / "log_history.json").read_text())
        return [(e["step"], e["learning_rate"], e["loss"]) for e in log if "loss" in e]

    straight, resumed = steps(tmp_path / "straight"), steps(killed)
    assert [s for s, _, _ in straight] == [1, 2, 3, 4]
    assert len({lr for _, lr, _ in straight}) > 2  # warmup then linear decay: the schedule is visible
    assert resumed == straight  # same learning rate and loss (hence same data order) at every step
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["resumed_from"].endswith("checkpoint-2") and manifest["steps"] == 4
    # the loss over the whole run, not over the resumed steps 3-4 alone (logged to 4 decimals)
    reference = json.loads((tmp_path / "straight" / "manifest.json").read_text())["train_result"]["train_loss"]
    assert manifest["train_result"]["train_loss"] == pytest.approx(reference, abs=1e-4)
    assert manifest["train_result"]["train_loss"] != pytest.approx(sum(l for s, _, l in resumed[2:]) / 2, abs=1e-4)
    a, b = _weights(tmp_path / "straight" / "model"), _weights(killed / "model")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit-identical on CPU


def test_a_run_resumed_from_its_last_checkpoint_records_the_whole_runs_loss_and_no_throughput():
    """Resumed at step 4 of 4, the Trainer ran no step: its train_loss 0.0 and the earlier invocation's
    token count over this one's runtime are not recorded. Logs at steps 2 and 4 (logging_steps 2) weigh
    2 steps each: (1.0 x 2 + 0.5 x 2) / 4 = 0.75."""
    from ratune.train.sft import throughput, train_result

    history = [{"loss": "1.0", "step": 2, "num_tokens": 100.0}, {"loss": 0.5, "step": 4, "num_tokens": 200.0}]
    metrics = {"train_loss": 0.0, "train_runtime": 0.5}
    assert train_result(metrics, history, resumed_step=4) == {"train_loss": 0.75, "train_runtime": 0.5}
    assert train_result(metrics, history) == {"train_loss": 0.0, "train_runtime": 0.5}  # fresh: the Trainer's
    assert throughput(history, metrics, resumed_step=4) == {"tokens": None, "train_runtime_s": 0.5,
                                                            "tokens_per_s": None}
    # resumed at step 2: TRL's count restarted, so the last log's 200 tokens are this invocation's
    assert throughput(history, metrics, resumed_step=2)["tokens_per_s"] == 400.0
    assert train_result({}, [{"loss": 1.0, "step": 1}, {"loss": 0.4, "step": 4}], resumed_step=1) == {
        "train_loss": pytest.approx((1.0 + 0.4 * 3) / 4)}


def test_resume_from_missing_path_is_an_error(tmp_path, tiny_model_dir):
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    cfg = _config(tiny_model_dir, data, tmp_path / "run", global_batch_size=2, max_steps=1)
    with pytest.raises(RatuneError, match="--resume-from path does not exist"):
        train(cfg, resume_from=str(tmp_path / "no_such_checkpoint"))
    with pytest.raises(RatuneError, match="no checkpoint to resume"):
        train(cfg, resume_from="latest")
    assert not (tmp_path / "run" / "model").exists()


def test_every_save_of_a_lora_run_is_checked(tmp_path, tiny_model_dir, umask_022):
    """One process, LoRA: each Trainer checkpoint, adapter/ and the merged model/ were reloaded and
    compared with the in-memory model when they were saved; the merged model/ is the saved adapter
    merged into a fresh base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    out = tmp_path / "run"
    final = train(_config(tiny_model_dir, data, out, global_batch_size=2, max_steps=2, max_examples=4, save_steps=1,
                          lora={"enabled": True, "r": 4, "alpha": 8}))
    assert final == out / "model"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 1, "accelerator_num_processes": 1, "distributed_type": "NO",
                                       "deepspeed": False, "zero_stage": None, "partitioned_load": False}
    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == ["trainer/checkpoint-1", "trainer/checkpoint-2", "adapter", "model"]
    # every saved file has open()'s mode (umask 022: 0644), the weights included (safetensors 0.8 writes 0600)
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for c in checks for p in (out / c["folder"]).rglob("*")
             if p.is_file()}
    assert "trainer/checkpoint-1/adapter_model.safetensors" in modes and "model/model.safetensors" in modes
    assert set(modes.values()) == {0o644}, modes
    # by hand, not regression values: LoRA "all-linear" adapts q, k, v, o, gate, up and down of each of
    # the 2 layers, an A and a B matrix each: 7 x 2 x 2 = 28 adapter tensors; the merged tiny Llama has
    # the embedding, 9 tensors per layer (7 projections, 2 norms) and the final norm, lm_head tied: 20
    assert [c["tensors"] for c in checks[:3]] == [28, 28, 28]
    assert [c["weights_compared"] for c in checks] == [28, 28, 28, 20]
    # adapter saves reproduce the logits exactly; the merged model/ within the float32 tolerance
    assert [c["max_abs_logit_diff"] for c in checks[:3]] == [0.0, 0.0, 0.0]
    assert 0.0 <= checks[3]["max_abs_logit_diff"] <= checks[3]["tolerance"], checks

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    rebuilt = PeftModel.from_pretrained(base, str(out / "adapter")).merge_and_unload().state_dict()
    merged = _weights(final)
    for name, w in merged.items():
        assert torch.equal(w, rebuilt[name]), name


def test_padding_free_and_packing_train_like_padded_batches(tmp_path, tiny_model_dir):
    """The config switches through the real train(): padding_free and packing give the padded run's
    first-step loss and updated weights (1e-5), no position is padding, and the manifest records the
    token shares and the attention implementation that keeps examples apart."""
    import torch

    from ratune.train.sft import train

    data = _make_data(tmp_path / "data")
    runs = {}
    for name, switches in [("padded", {}), ("padding_free", {"padding_free": True}), ("packing", {"packing": True})]:
        out = tmp_path / name
        # one micro-batch of 8 holds every row, so all three runs see the same examples in step 1;
        # packing's bins of 512 tokens then hold all 8 rows in one micro-batch too
        final = train(_config(tiny_model_dir, data, out, global_batch_size=8, per_device_batch_size=8,
                              max_steps=1, max_examples=8, **switches))
        manifest = json.loads((out / "manifest.json").read_text())
        runs[name] = {"loss": json.loads((out / "log_history.json").read_text())[0]["loss"],
                      "weights": _weights(final), "shares": manifest["data"]["token_shares"],
                      "attn": manifest["data"].get("attn_implementation")}
    assert runs["padded"]["shares"]["mode"] == "per_batch" and runs["padded"]["shares"]["real_token_share"] < 0.9
    assert runs["padded"]["attn"] is None
    for name in ("padding_free", "packing"):
        run = runs[name]
        assert run["shares"]["mode"] == name and run["shares"]["real_token_share"] == 1.0
        assert run["attn"] == "sdpa"
        assert run["loss"] == pytest.approx(runs["padded"]["loss"], abs=1e-5), name
        for key, w in runs["padded"]["weights"].items():
            torch.testing.assert_close(run["weights"][key], w, atol=1e-5, rtol=0, msg=f"{name} {key}")


def test_packing_and_padding_free_are_exclusive(tmp_path, tiny_model_dir):
    from ratune.config import validate

    with pytest.raises(RatuneError, match="packing: true and padding_free: true are exclusive"):
        validate(type(_config(tiny_model_dir, tmp_path, tmp_path / "o")),
                 {**_config(tiny_model_dir, tmp_path, tmp_path / "o").model_dump(), "packing": True,
                  "padding_free": True}, "t")


def test_run_logs_to_tensorboard_and_draws_its_curves(tmp_path, tiny_model_dir):
    """report_to: [tensorboard] writes event files whose train/loss scalars are the log history's
    losses; every run draws training_curves.png and records device, dtype, attention and
    tokens per second."""
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ratune.io import read_json
    from ratune.train.sft import train

    data = _make_data(tmp_path / "data", n=4)
    out = tmp_path / "run"
    train(_config(tiny_model_dir, data, out, global_batch_size=2, max_steps=3, report_to=["tensorboard"]))

    history = read_json(out / "log_history.json")
    losses = [e["loss"] for e in history if "loss" in e]
    assert len(losses) == 3  # logging_steps 1, 3 optimizer steps
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [s.step for s in events.Scalars("train/loss")] == [1, 2, 3]
    assert [s.value for s in events.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)

    with Image.open(out / "training_curves.png") as png:
        assert png.format == "PNG" and png.size == (704, 616)  # 6.4 x 5.6 inches at 110 dpi

    manifest = read_json(out / "manifest.json")
    assert manifest["compute"] == {"dtype": "float32", "autocast": None, "deepspeed_bf16": False,
                                   "attn_implementation": "sdpa"}
    assert manifest["device"]["type"] == "cpu"
    # 3 steps x 2 examples = 6 of the 4 examples (one epoch and a half, seeded order): TRL counts
    # every real token it trains on; 4 examples hold manifest["data"]["tokens"] tokens in all
    seen = manifest["throughput"]["tokens"]
    assert manifest["data"]["tokens"] < seen < 2 * manifest["data"]["tokens"]
    assert manifest["throughput"]["tokens_per_s"] == pytest.approx(seen / manifest["train_result"]["train_runtime"])


def test_report_to_without_its_package_is_refused_before_loading(tmp_path, tiny_model_dir, monkeypatch):
    import importlib.util

    from ratune.train.sft import train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    data = _make_data(tmp_path / "data", n=4)
    with pytest.raises(RatuneError, match=r"^report_to: wandb needs the wandb package, which is not installed: "
                                          r"pip install wandb, then wandb login$"):
        train(_config(tiny_model_dir, data, tmp_path / "run", global_batch_size=2, max_steps=1, report_to=["wandb"]))
    assert not (tmp_path / "run").exists()
