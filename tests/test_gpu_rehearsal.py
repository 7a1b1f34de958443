"""The GPU commands of docs/training.md, rehearsed on CPU.

What runs: the two bash blocks of docs/training.md's section "The 7B paper recipe, end to end"
(the paper recipe, then its LoRA variant), read from the page command by command, with exactly
three kinds of change (:class:`Rehearsal`):

- the model: ``huggyllama/llama-7b`` becomes a tiny LLaMA-1-shaped model: the tokenizer of
  tests/conftest.py ``build_llama1_tokenizer`` (BPE with byte fallback, ``<unk>`` 0, ``<s>`` 1,
  ``</s>`` 2, BOS added, no pad token, no chat template) beside a random LlamaForCausalLM (hidden
  64, 2 layers, 4 heads and 4 KV heads as LLaMA-1 has no GQA, MLP 172 = 64 x 11008 / 4096, untied
  head, RMSNorm eps 1e-6, 2048 positions) saved in float16, as huggyllama ships LLaMA-7B;
- the launcher size: the GPU accelerate configs become ``configs/accelerate/cpu_2proc_deepspeed.yaml``
  (2 CPU processes through torchrun, gloo);
- sizes, and folders: the shipped training configs are loaded and written to a temporary folder
  with ``model``, ``data_dir`` and ``output_dir`` (``runs/paper/...`` moved under the test's
  temporary folder) and the sizes changed: 4 examples, global batch 4 = 1 per device x 2
  accumulation x 2 processes, 4 epochs (LoRA: 3), 1 torch thread (:data:`SIZES`). Everything else
  is the shipped recipe: bf16 weights and DeepSpeed bf16, ZeRO-3 (configs/deepspeed/zero3.json),
  gradient checkpointing, padding-free rows with sdpa, the gorilla_v0 prompt, lr 2e-5 (LoRA 2e-4)
  with a cosine schedule and warmup ratio 0.03, a checkpoint per epoch keeping two, save checks
  on. ``ratune eval run`` gets ``--n-questions 4 --max-new-tokens 32 --threads 1``.

bf16 on CPU: it runs. DeepSpeed 0.19.8's ZeRO-3 trains in bf16 on 2 CPU processes over torch
2.13's gloo backend (its bf16 optimizer shards ``bf16_zero_pp_rank_*_optim_states.pt`` hold the
fp32 master weights and Adam moments, 12 bytes per parameter in all, checked below), so nothing
here replaces bf16 by another precision.

With 4 examples, one global batch, every epoch is one optimizer step on the same batch, so the
loss logged at each step is the loss of a repeated batch. The shipped warmup ratio 0.03 of 4
steps is one warmup step at learning rate 0 (transformers rounds the warmup steps up): steps 1
and 2 log the same loss exactly, and steps 3 and 4 log lower ones.

The kill: a ``sitecustomize`` hook (:data:`_STOP_HOOK`) makes each training process write its
pid and sleep right after the checkpoint of epoch 2 is saved and checked; the test then sends
SIGKILL to both training processes and to the launcher, as a preempted node does. torchrun
starts its workers in sessions of their own, so a process-group kill of the launcher would not
reach them.

Wall time on the 2-core machine: 2 minutes 20 s with nothing else running, about 4 minutes when
it is shared (data build 15 s; four 2-process training launches, three ZeRO-3 and one LoRA, about
22 s each; eval of the five settings 15 s; three exports 7 s each).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import build_llama1_tokenizer

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "training.md"
SECTION = "## The 7B paper recipe, end to end"
BIN = Path(sys.executable).parent

PAPER_CONFIG = "configs/train/llama7b_rat_paper.yaml"
LORA_CONFIG = "configs/train/llama7b_rat_paper_lora.yaml"
GPU_LAUNCHERS = ("configs/accelerate/8gpu_zero3.yaml", "configs/accelerate/1gpu.yaml")
CPU_LAUNCHER = "configs/accelerate/cpu_2proc_deepspeed.yaml"
PAPER_MODEL = "huggyllama/llama-7b"
# The logged loss of a step is the mean over 2 processes x 2 micro-batches, and each epoch deals the
# 4 examples out in another order, so two steps on the same weights agree up to float32 summation
# order: one ulp (4.8e-7 at a loss of 6.87) was seen in CI. 1e-6 relative is about 14 ulp there,
# far below what one optimizer step moves (the next assertions: the loss falls at each update).
SAME_LOSS_REL = 1e-6
#: The only config values the rehearsal changes besides model, data_dir and output_dir.
SIZES = {"max_examples": 4, "global_batch_size": 4, "per_device_batch_size": 1, "num_epochs": 4, "torch_threads": 1}
EVAL_SIZES = ["--n-questions", "4", "--max-new-tokens", "32", "--threads", "1"]
#: The model's parameters: embedding and head 2 x 972 x 64, per layer 4 x 64 x 64 (attention) +
#: 3 x 64 x 172 (MLP) + 2 x 64 (norms), the final norm 64.
N_PARAMS = 2 * 972 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 172 + 2 * 64) + 64

#: Loaded by the training processes through PYTHONPATH: after the checkpoint of step
#: RATUNE_REHEARSAL_STOP_AT is saved and checked, each rank writes its pid and sleeps.
_STOP_HOOK = '''
import os
if "LOCAL_RANK" in os.environ and os.environ.get("RATUNE_REHEARSAL_STOP_AT"):
    import time
    from pathlib import Path

    import transformers.trainer_callback as tc

    _orig = tc.CallbackHandler.on_save

    def on_save(self, args, state, control):
        out = _orig(self, args, state, control)
        if state.global_step == int(os.environ["RATUNE_REHEARSAL_STOP_AT"]):
            marks = Path(os.environ["RATUNE_REHEARSAL_MARKS"])
            (marks / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
            time.sleep(600)
        return out

    tc.CallbackHandler.on_save = on_save
'''


# ---------------------------------------------------------------------------- the documented commands


def documented_blocks(text: str | None = None) -> list[list[list[str]]]:
    """The bash blocks of docs/training.md's recipe section, each a list of argv lists
    (continuation lines joined, comments and blank lines dropped)."""
    text = DOC.read_text() if text is None else text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        lines = block.replace("\\\n", " ").splitlines()
        blocks.append([shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")])
    return blocks


class Rehearsal:
    """The substitutions of the module docstring, and the commands they give.

    Attributes:
        root: the temporary folder that stands for the repository's ``runs/``'s parent.
        model: the tiny model folder standing for ``huggyllama/llama-7b``.
        configs: shipped config path -> the derived config written under ``root/configs``.
        blocks: :func:`documented_blocks`, read when the rehearsal starts.
    """

    def __init__(self, root: Path, model: Path):
        self.root, self.model, self.configs = root, model, {}
        self.blocks = documented_blocks()

    def local(self, value: str) -> str:
        """One command argument or config value, with the rehearsal's substitutions."""
        if value == PAPER_MODEL:
            return str(self.model)
        if value.startswith("runs/"):
            return str(self.root / value)
        if value in GPU_LAUNCHERS:
            return str(ROOT / CPU_LAUNCHER)
        return str(self.configs.get(value, value))

    def argv(self, command: list[str]) -> list[str]:
        """A documented command as run here: ``ratune`` and ``accelerate`` from this venv."""
        program = command[0]
        assert program in ("ratune", "accelerate"), command
        return [str(BIN / program), *(self.local(a) for a in command[1:])]

    def derive_config(self, shipped: str, *, name: str | None = None, **changes) -> tuple[Path, dict]:
        """Write the shipped config with model, folders and sizes changed; returns (path, config)."""
        config = yaml.safe_load((ROOT / shipped).read_text())
        config.update({key: self.local(config[key]) for key in ("model", "data_dir", "output_dir")})
        config.update({**SIZES, **changes})
        path = self.root / "configs" / (name or Path(shipped).name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        if name is None:
            self.configs[shipped] = path
        return path, config


def subprocess_env(**extra) -> dict:
    """The environment of the rehearsal's commands: CUDA hidden (as tests/conftest.py hides it for
    the session; said here too, since these commands must mean CPU), one thread, this venv first
    on PATH (its ninja prebuilt DeepSpeed's CPU op), no inherited distributed variables."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def run(argv: list[str], log: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run one command from the repository root; its output goes to ``log``; fail with its tail."""
    proc = subprocess.run(argv, cwd=ROOT, env=env or subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


def run_killed_after_checkpoint(argv: list[str], step: int, work: Path) -> int:
    """Run a training launch until both ranks have saved and checked checkpoint ``step``, then
    SIGKILL the two training processes and the launcher; returns the launcher's exit status."""
    hook, marks = work / "hook", work / "marks"
    hook.mkdir(parents=True)
    marks.mkdir()
    (hook / "sitecustomize.py").write_text(_STOP_HOOK)
    env = subprocess_env(PYTHONPATH=f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                         RATUNE_REHEARSAL_STOP_AT=str(step), RATUNE_REHEARSAL_MARKS=str(marks))
    with open(work / "killed.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while len(list(marks.glob("rank*.pid"))) < 2:
            assert proc.poll() is None, (work / "killed.log").read_text()[-4000:]
            assert time.monotonic() < deadline, f"no checkpoint-{step} within 600 s"
            time.sleep(0.2)
        for pid_file in sorted(marks.glob("rank*.pid")):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


def build_llama1_model(folder: Path) -> Path:
    """The tiny LLaMA-1-shaped model of the module docstring, with its tokenizer, in ``folder``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    build_llama1_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                         rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(folder)
    return folder


def _log(run_dir: Path) -> list[tuple[int, float, float]]:
    """``(step, learning rate, loss)`` of each logged optimizer step of a run."""
    history = json.loads((run_dir / "log_history.json").read_text())
    return [(e["step"], e["learning_rate"], e["loss"]) for e in history if "loss" in e]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _logits(folder: Path, ids: list[int]):
    """Logits of a saved model folder (loaded with from_pretrained in float32) on ``ids``, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


# ---------------------------------------------------------------------------- fixtures: one rehearsal


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    root = tmp_path_factory.mktemp("rehearsal")
    model = build_llama1_model(root / "llama1-tiny")
    r = Rehearsal(root, model)
    r.derive_config(PAPER_CONFIG)
    r.derive_config(LORA_CONFIG, num_epochs=3)
    return r


@pytest.fixture(scope="module")
def data(rehearsal, apibench):
    """``ratune data build`` as documented, with the tiny model's tokenizer."""
    (_, build, *_), _ = rehearsal.blocks
    run(rehearsal.argv(build), rehearsal.root / "data_build.log", env=subprocess_env(RATUNE_APIBENCH=str(apibench)))
    return Path(rehearsal.local("runs/paper/data"))


@pytest.fixture(scope="module")
def full_runs(rehearsal, data):
    """The documented ZeRO-3 launch three times: uninterrupted into a reference folder; then into
    the config's own folder, killed after the checkpoint of epoch 2 of 4, and resumed."""
    (_, _, launch, *_), _ = rehearsal.blocks
    reference_config, _ = rehearsal.derive_config(PAPER_CONFIG, name="reference.yaml",
                                                  output_dir=str(rehearsal.root / "reference"))
    argv = rehearsal.argv(launch)
    reference_argv = [reference_config if a == str(rehearsal.configs[PAPER_CONFIG]) else a for a in argv]
    run([str(a) for a in reference_argv], rehearsal.root / "reference.log")
    work = rehearsal.root / "kill"
    killed_status = run_killed_after_checkpoint(argv, 2, work)
    run_dir = Path(rehearsal.local("runs/paper/llama7b_rat_oracle"))
    killed = {"status": killed_status, "files": sorted(p.name for p in run_dir.iterdir()),
              "checkpoints": sorted(p.name for p in (run_dir / "trainer").glob("checkpoint-*")),
              "checkpoint_2_weights": _weights(run_dir / "trainer" / "checkpoint-2")}
    run(argv + ["--resume-from", "latest"], rehearsal.root / "resumed.log")
    return {"reference": rehearsal.root / "reference", "run": run_dir, "killed": killed}


@pytest.fixture(scope="module")
def evaluation(rehearsal, full_runs):
    (_, _, _, evaluate, _), _ = rehearsal.blocks
    run(rehearsal.argv(evaluate) + EVAL_SIZES, rehearsal.root / "eval.log")
    return Path(rehearsal.local("runs/paper/eval_oracle"))


@pytest.fixture(scope="module")
def lora_run(rehearsal, data):
    _, (launch, _) = rehearsal.blocks
    run(rehearsal.argv(launch), rehearsal.root / "lora.log")
    return Path(rehearsal.local("runs/paper/llama7b_rat_oracle_lora"))


# ---------------------------------------------------------------------------- tests


def test_the_rehearsed_commands_are_the_documented_ones(tmp_path):
    """Fast (in make test): the page's blocks have the shape the rehearsal runs, README shows the
    same recipe block, and the derived configs change only model, folders and sizes."""
    paper, lora = documented_blocks()
    assert paper[0][:2] == ["make", "setup"]  # the install line; the rehearsal runs in this venv
    assert [c[:3] for c in paper[1:]] == [["ratune", "data", "build"], ["accelerate", "launch", "--config_file"],
                                          ["ratune", "eval", "run"],
                                          ["ratune", "export", "runs/paper/llama7b_rat_oracle"]]
    assert [c[:3] for c in lora] == [["accelerate", "launch", "--config_file"],
                                     ["ratune", "export", "runs/paper/llama7b_rat_oracle_lora"]]
    assert paper[2][3] in GPU_LAUNCHERS and lora[0][3] in GPU_LAUNCHERS
    assert paper[2][-1] == PAPER_CONFIG and lora[0][-1] == LORA_CONFIG and PAPER_MODEL in paper[1]
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The 7B paper recipe on GPUs\n.*?```bash\n(.*?)```", readme, flags=re.S).group(1)
    assert documented_blocks(f"{SECTION}\n```bash\n{block}```")[0] == paper  # README = the rehearsed block

    from ratune.config import load_config
    from ratune.train.config import TrainConfig

    r = Rehearsal(tmp_path, tmp_path / "model")
    for shipped, extra in ((PAPER_CONFIG, {}), (LORA_CONFIG, {"num_epochs": 3})):
        path, derived = r.derive_config(shipped, **extra)
        original = yaml.safe_load((ROOT / shipped).read_text())
        changed = {k for k in original.keys() | derived.keys() if original.get(k) != derived.get(k)}
        assert changed <= {"model", "data_dir", "output_dir", *SIZES}, changed
        load_config(TrainConfig, path)  # valid as written
        assert (derived["dtype"], derived["bf16"], derived["gradient_checkpointing"], derived["padding_free"],
                derived["attn_implementation"], derived["save_strategy"]) == ("bfloat16", True, True, True, "sdpa",
                                                                              "epoch")
    paper_cfg = yaml.safe_load(r.configs[PAPER_CONFIG].read_text())
    assert paper_cfg["deepspeed"] == "configs/deepspeed/zero3.json" and paper_cfg["lora"] == {"enabled": False}


@pytest.mark.slow
def test_data_build_with_the_llama1_tokenizer(data, rehearsal):
    from datasets import load_from_disk

    from ratune.data.labels import tokenize_row
    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_tokenizer

    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["settings"]["chat_template"] == "gorilla_v0"
    counts = manifest["counts"]
    assert {m: counts["train"][m]["rows"] for m in counts["train"]} == {"none": 837, "oracle": 837}
    assert {m: counts["eval"][m]["rows"] for m in counts["eval"]} == {"none": 186, "oracle": 186}
    assert counts["train"]["oracle"]["shortened"] > 0 and counts["train"]["none"]["shortened"] == 0
    assert all(c["dropped"] == 0 for split in counts.values() for c in split.values())
    rows = load_from_disk(str(data / "oracle"))["train"]
    lengths = [p + c for p, c in zip(rows["n_prompt_tokens"], rows["n_completion_tokens"])]
    assert max(lengths) <= 2048 < 2 * max(lengths)  # documents cut to fit the paper's 2048 tokens
    tok = use_chat_template(load_tokenizer(rehearsal.model), "gorilla_v0")
    row = tokenize_row(tok, rows[0]["user_turn"], rows[0]["completion"])
    # <s> {system} \n USER: ... , the answer, </s>: BOS from the tokenizer, EOS appended
    assert row.input_ids[:4] == [1, 259, 13, 260] and row.input_ids[-1] == 2 and row.input_ids.count(1) == 1
    assert len(row.input_ids) == lengths[0]


@pytest.mark.slow
def test_zero3_bf16_training_on_two_processes(full_runs, rehearsal):
    """The uninterrupted run of the paper recipe: what the trainer ran, the loss on the repeated
    batch, the shipped schedule, every save checked, bf16 weights and ZeRO-3 shards."""
    import torch

    out = full_runs["reference"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 2, "accelerator_num_processes": 2, "distributed_type": "DEEPSPEED",
                                       "deepspeed": True, "zero_stage": 3, "partitioned_load": True}
    assert manifest["device"]["type"] == "cpu"
    assert manifest["compute"] == {"dtype": "bfloat16", "autocast": None, "deepspeed_bf16": True,
                                   "attn_implementation": "sdpa"}
    assert manifest["config"]["gradient_checkpointing"] is True and manifest["config"]["padding_free"] is True
    assert (manifest["num_processes"], manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"],
            manifest["global_batch_size"], manifest["steps"]) == (2, 1, 2, 4, 4)
    shares = manifest["data"]["token_shares"]
    assert manifest["data"]["examples"] == 4 and shares["mode"] == "padding_free" and shares["real_token_share"] == 1.0

    log = _log(out)
    assert [s for s, _, _ in log] == [1, 2, 3, 4]
    # cosine with one warmup step (0.03 x 4, rounded up): 0, then 2e-5 x (1 + cos(pi k / 3)) / 2
    assert [lr for _, lr, _ in log] == pytest.approx([0.0, 2e-5, 1.5e-5, 5e-6])
    losses = [loss for _, _, loss in log]
    assert all(math.isfinite(x) for x in losses) and 6.0 < losses[0] < 7.5  # about ln(972) = 6.88 at random init
    # the warmup step moved nothing: same batch, same weights, same loss up to float32 summation order
    assert losses[1] == pytest.approx(losses[0], rel=SAME_LOSS_REL)
    assert losses[2] < losses[1] and losses[3] < losses[2]  # then the repeated batch's loss falls

    checks = manifest["save_checks"]
    assert [c["folder"] for c in checks] == [f"trainer/checkpoint-{k}" for k in (1, 2, 3, 4)] + ["model"]
    for c in checks:  # gathered from the ZeRO-3 partitions: bit for bit, logits identical on the same device
        assert (c["weights_compared"], c["tensors"], c["max_abs_logit_diff"], c["compute_dtype"]) == \
               (21, 21, 0.0, "torch.bfloat16"), c
    assert sorted(p.name for p in (out / "trainer").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]  # kept 2

    weights = _weights(out / "model")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert sum(t.numel() for t in weights.values()) == N_PARAMS
    # ZeRO-3 bf16 optimizer shards, one per rank: fp32 master weights + two Adam moments, 12 bytes
    # per parameter split over 2 ranks (docs/training.md's checkpoint size table), plus a small header
    shards = sorted((out / "trainer" / "checkpoint-4" / "global_step4").glob("*optim_states.pt"))
    assert [p.name for p in shards] == [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert all(6 * N_PARAMS <= p.stat().st_size <= 6 * N_PARAMS + 16384 for p in shards), \
        [p.stat().st_size for p in shards]
    initial = _weights(rehearsal.model)
    moved = {k for k in initial if not torch.equal(initial[k].to(torch.bfloat16), weights[k])}
    matrices = {k for k, t in initial.items() if t.dim() == 2}
    # every matrix trained; the RMSNorm weights (all 1.0) did not move in bf16: 4 updates of at most
    # 2e-5 stay below half the bf16 spacing at 1.0 (2^-8), the fp32 master copy holds them (docs/training.md)
    assert moved == matrices and len(matrices) == 16
    assert all(torch.equal(weights[k], torch.ones_like(weights[k])) for k in initial.keys() - matrices)


@pytest.mark.slow
def test_sigkill_after_the_middle_checkpoint_then_resume_is_bit_identical(full_runs):
    import torch

    killed, run_dir = full_runs["killed"], full_runs["run"]
    assert killed["status"] == -signal.SIGKILL
    assert {"config.yaml", "manifest.json", "trainer"} <= set(killed["files"])
    assert "model" not in killed["files"] and ".complete" not in killed["files"]  # killed before the end
    assert killed["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["resumed_from"] == str(run_dir / "trainer" / "checkpoint-2") and manifest["steps"] == 4
    assert [c["folder"] for c in manifest["save_checks"]] == ["trainer/checkpoint-3", "trainer/checkpoint-4", "model"]
    assert (run_dir / ".complete").exists()
    # the same learning rate and loss at every step as the uninterrupted run (the resumed run's log
    # holds steps 1-2 from the checkpoint's trainer state), and bit-identical final weights
    assert _log(run_dir) == _log(full_runs["reference"])
    resumed, reference = _weights(run_dir / "model"), _weights(full_runs["reference"] / "model")
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in resumed)
    # and not a copy of the checkpoint it resumed from: steps 3 and 4 trained every matrix further
    assert all(not torch.equal(resumed[k], killed["checkpoint_2_weights"][k]) for k in resumed if resumed[k].dim() == 2)


@pytest.mark.slow
def test_eval_run_on_the_trained_checkpoint(evaluation, full_runs, rehearsal, apibench):
    import torch

    from ratune.sources.apibench import load_examples
    from ratune.sources.prompt import encode_prompt, render_user_turn
    from ratune.registry import DEFAULT_SETTINGS as SETTINGS  # what eval runs without --settings
    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_model, load_tokenizer

    model_dir = full_runs["run"] / "model"
    assert sorted(p.name for p in evaluation.iterdir() if p.is_dir()) == sorted(SETTINGS)
    for setting in SETTINGS:
        cell = evaluation / setting
        assert (cell / ".complete").exists()
        metrics = json.loads((cell / "metrics.json").read_text())
        assert metrics["n"] == 4
        assert metrics["accuracy"] + metrics["hallucination"] + metrics["error"] == pytest.approx(1.0)
        identity = json.loads((cell / "identity.json").read_text())
        assert identity["checkpoint"] == str(model_dir.resolve()) and identity["questions"] == [1, 2, 3, 4]
        assert {k: identity["generation"][k] for k in ("device", "dtype", "chat_template", "max_new_tokens")} == \
               {"device": "cpu", "dtype": "float32", "chat_template": "gorilla_v0", "max_new_tokens": 32}
        rows = [json.loads(line) for line in (cell / "responses.jsonl").read_text().splitlines()]
        assert [r["question_id"] for r in rows] == [1, 2, 3, 4] and all(r["text"] for r in rows)

    # the 0-shot answer to question 1 is the model's greedy continuation of the gorilla_v0 prompt
    tokenizer = use_chat_template(load_tokenizer(model_dir), "gorilla_v0")
    question = load_examples(apibench, "torchhub", "eval")[0]
    ids = encode_prompt(tokenizer, render_user_turn(question.instruction, None, max_document_tokens=None,
                                                    count_tokens=len)[0])
    assert ids[:4] == [1, 259, 13, 260] and ids[-2:] == [13, 262]  # <s> {system} \n USER: ... \n ASSISTANT:
    model = load_model(model_dir).eval()
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=32, eos_token_id=2, pad_token_id=2)
    expected = tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True).strip()
    first = json.loads((evaluation / "0_shot" / "responses.jsonl").read_text().splitlines()[0])
    assert first["text"] == expected


@pytest.mark.slow
def test_full_export_reloads_with_the_trained_logits(full_runs, rehearsal):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ratune.sources.prompt import template_name

    (_, _, _, _, export), _ = rehearsal.blocks
    run(rehearsal.argv(export), rehearsal.root / "export.log")
    out, model_dir = Path(rehearsal.local("runs/paper/llama7b_rat_oracle_hf")), full_runs["run"] / "model"
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    exported, trained = _weights(out), _weights(model_dir)
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert template_name(tokenizer) == "gorilla_v0" and tokenizer("x")["input_ids"][0] == 1
    # the trained model's logits: model/ was checked against the in-memory model on the same
    # device (identical logits); the export reproduces model/'s exactly
    (check,) = [c for c in json.loads((full_runs["run"] / "manifest.json").read_text())["save_checks"]
                if c["folder"] == "model"]
    assert check["max_abs_logit_diff"] == 0.0
    ids = tokenizer("Load a pretrained image classifier from torch hub")["input_ids"]
    assert torch.equal(_logits(out, ids), _logits(model_dir, ids))
    assert model.dtype == torch.bfloat16 and model.config.eos_token_id == 2


@pytest.mark.slow
def test_lora_run_and_its_exports(lora_run, rehearsal):
    """The documented LoRA launch (DDP on 2 CPU processes, frozen bf16 base, bf16 autocast), its
    export, and ``--merge-lora`` from the adapter: both equal the run's merged model/."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ratune.train import checks

    manifest = json.loads((lora_run / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 2, "accelerator_num_processes": 2, "distributed_type": "MULTI_CPU",
                                       "deepspeed": False, "zero_stage": None, "partitioned_load": False}
    assert manifest["compute"] == {"dtype": "bfloat16", "autocast": "bfloat16", "deepspeed_bf16": False,
                                   "attn_implementation": "sdpa"}
    log = _log(lora_run)
    assert [lr for _, lr, _ in log] == pytest.approx([0.0, 2e-4, 1e-4])  # the LoRA config's lr, cosine
    losses = [loss for _, _, loss in log]
    assert all(math.isfinite(x) for x in losses)
    assert losses[1] == pytest.approx(losses[0], rel=SAME_LOSS_REL)  # the warmup step moved nothing, then
    assert losses[2] < losses[1]  # one update of the adapter (B was 0) lowers the repeated batch's loss
    checks_ = manifest["save_checks"]
    assert [c["folder"] for c in checks_] == [f"trainer/checkpoint-{k}" for k in (1, 2, 3)] + ["adapter", "model"]
    # 2 layers x 7 linears x (lora_A, lora_B), bit for bit, same logits; model/: the merge, 21 weights
    assert [(c["tensors"], c["weights_compared"]) for c in checks_] == [(28, 28)] * 4 + [(21, 21)]
    assert all(c["max_abs_logit_diff"] == 0.0 for c in checks_[:4])
    assert 0.0 <= checks_[4]["max_abs_logit_diff"] <= checks_[4]["tolerance"]

    _, (_, export) = rehearsal.blocks
    run(rehearsal.argv(export), rehearsal.root / "lora_export.log")
    out = Path(rehearsal.local("runs/paper/llama7b_rat_oracle_lora_hf"))
    merged_again = rehearsal.root / "lora_merge_lora_export"
    run(rehearsal.argv(export)[:3] + ["--out", str(merged_again), "--merge-lora"], rehearsal.root / "merge.log")
    trained = _weights(lora_run / "model")
    base = _weights(rehearsal.model)
    for folder in (out, merged_again):
        exported = _weights(folder)
        assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16))  # the adapter is in

    # the export's logits are the trained model's (the adapter on its bf16 base, under the run's bf16
    # autocast) on the same device, within the bf16 tolerance of the save checks (the merge rounds)
    adapter_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(rehearsal.model), dtype=torch.bfloat16), str(lora_run / "adapter"))
    from ratune.models import load_tokenizer

    tokenizer = load_tokenizer(out)
    reference = checks.prompt_logits(adapter_model, tokenizer, device="cpu", autocast_dtype=torch.bfloat16)
    exported_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    got = checks.prompt_logits(exported_model, tokenizer, device="cpu", autocast_dtype=torch.bfloat16)
    tolerance = checks.logit_tolerance(torch.bfloat16, reference)
    assert all(float((a - b).abs().max()) <= tolerance for a, b in zip(reference, got))
