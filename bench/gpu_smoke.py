"""GPU smoke run: ratune's own training and generation paths beside a hand-written ceiling, on one
GPU, with no network and no pretrained weights.

Usage:
    python bench/gpu_smoke.py [--out DIR] [--budget-s 570] [--dry-run]
    make gpu-smoke                   # the same with --out runs/gpu_smoke

Needs ratune importable with its dependencies (on a bare GPU image: the wheels it lacks, e.g. trl,
datasets, pydantic and the pinned transformers, then ``pip install --no-deps --no-build-isolation
-e .``; nothing is downloaded at run time). On a machine without a CUDA GPU it says so and exits 0,
unless ``--dry-run``.

Stages, in this order, each in its own process under a time limit (its own limit or what is left
of ``--budget-s``, whichever is less); a stage that fails or runs out of time is reported as such
and the others still run (:data:`STAGES`):

- ``models``: random-init models in the shapes of bench/gpu_train.py (``llama1b``: the
  Llama-3.2-1B shape; ``llama7b``: LLaMA-7B) saved in bf16 beside a byte-level LLaMA-style
  tokenizer (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, one token per byte, BOS added, no pad token;
  tests/tiny_llama_tokenizer.py ``build_llama_tokenizer``), and a
  ``ratune data build``-shaped data folder: rows of exactly ``row_tokens`` (512) tokens in the
  paper's gorilla_v0 format. The 7B folder is skipped when the disk lacks room for it.
- ``train_1b_ratune``: ``python -m ratune.train`` on the 1B shape, one GPU: float32 weights with
  bf16 autocast (ratune's full finetune without DeepSpeed), padding-free micro-batches of 4 x 512
  = 2048 tokens (per-device batch 4, no accumulation), sdpa, gradient checkpointing, save checks
  on: its ``model/`` is reloaded, compared bit for bit and its logits compared on the GPU.
- ``train_1b_loop``: the same shape, micro-batch and precision through bench/gpu_train.py's
  minimal PyTorch loop (the ceiling).
- ``train_7b_full_ratune`` / ``train_7b_full_loop``: the same on the LLaMA-7B shape (float32
  weights + Adam: 16 bytes per parameter, 108 GB; skipped where the GPU has less memory). The
  ratune process ends after its last timed step: a float32 7B ``model/`` would be 27 GB to write.
- ``train_7b_lora_ratune`` / ``train_7b_lora_loop``: LoRA r 16 (alpha 32, dropout 0.05, all
  linear layers) on the frozen bf16 7B base, bf16 autocast, as configs/train/llama7b_rat_paper_lora.yaml.
- ``generate``: the 7B folder (the 1B one when the 7B is missing) loaded the way ``ratune eval
  run`` loads a checkpoint (:func:`ratune.eval.settings.resolve_placement`, then
  :func:`ratune.models.load_model`: CUDA, bfloat16) and batched greedy generation through
  :func:`ratune.eval.generate.generate_batches` at batch 1, 8 and 32 (64 new tokens; tokens counted by
  bench/eval_throughput.py's ``measure_hf``), beside a hand-written greedy loop on the same model
  and prompts (one padded prefill, then one forward per token with the KV cache, no stopping).

How ratune's training is timed: a ``sitecustomize`` hook on the training process's PYTHONPATH
(:data:`_TIMING_HOOK`) records the time at the end of every optimizer step (after
``torch.cuda.synchronize``) and the process's peak GPU memory, and for the 7B stages ends the
process after its last timed step. tokens/s = tokens per step x timed steps / their seconds (the
first ``warmup`` steps are not timed); MFU as bench/gpu_train.py: 6 N per token (LoRA 4 N: no
weight gradients for the frozen base) over the GPU's dense bf16 peak, N the matmul parameters.
The loop figures are bench/gpu_train.py's own. "ratune / ceiling" is the ratio of tokens/s.

Output: a table on stdout and ``OUT/gpu_smoke.json`` (``{"dry_run", "device", "versions",
"budget_s", "seconds", "stages": {name: result or {"failed"|"skipped": why}}}``), plus
``OUT/STAGE.json`` and ``OUT/STAGE.log`` per stage (training: ``OUT/work/runs/KIND.log``); models,
data and runs under ``OUT/work``.

``--dry-run``: every stage on the CPU (CUDA hidden) with the toy shapes ``llama1b-tiny`` and
``llama7b-tiny``, 2-row micro-batches of 400-token rows (the gorilla_v0 system prompt alone is
about 190 tokens here), 1 + 2 steps and generation at batch 1, 2 and 4 with 4 new tokens, so
that tests/test_bench.py runs the whole script in CI and it cannot rot. Its stages run in the
script's own process (ratune's training still in ``python -m ratune.train``), and CUDA is hidden
from every process it starts. Its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

#: Stage name -> its own time limit in seconds on a GPU (the dry run gives every stage 240 s).
STAGES = {
    "models": 120, "train_1b_ratune": 150, "train_1b_loop": 60, "train_7b_full_ratune": 150,
    "train_7b_full_loop": 90, "train_7b_lora_ratune": 120, "train_7b_lora_loop": 60, "generate": 120,
}
DRY_STAGE_LIMIT = 240

#: The sizes of a real run and of the CPU dry run.
PLANS = {
    "gpu": {"small": "llama1b", "big": "llama7b", "rows_per_step": 4, "row_tokens": 512, "rows": 64,
            "steps": {"1b": (3, 10), "7b": (2, 6)}, "gen_batches": (1, 8, 32), "gen_prompts_at_1": 4,
            "max_new_tokens": 64, "lora_r": 16},
    "dry": {"small": "llama1b-tiny", "big": "llama7b-tiny", "rows_per_step": 2, "row_tokens": 400, "rows": 8,
            "steps": {"1b": (1, 2), "7b": (1, 2)}, "gen_batches": (1, 2, 4), "gen_prompts_at_1": 2,
            "max_new_tokens": 4, "lora_r": 4},
}

#: What each training stage trains: (shape key, dtype, LoRA, save checks, stop after the timed steps).
TRAIN_KINDS = {
    "1b": ("small", "float32", False, True, False),
    "7b_full": ("big", "float32", False, False, True),
    "7b_lora": ("big", "bfloat16", True, False, True),
}

#: Loaded by ratune's training process through PYTHONPATH (only when RATUNE_SMOKE_TIMES is set):
#: the end time of every optimizer step (synchronised) and the peak GPU memory, written to that
#: file at exit, or after step RATUNE_SMOKE_STOP_AFTER, where it then ends the process.
_TIMING_HOOK = '''
import os

_FILE = os.environ.get("RATUNE_SMOKE_TIMES")
if _FILE:
    import atexit
    import json
    import time

    import transformers.trainer_callback as _tc

    _state = {"train_begin": None, "step_end": []}
    _stop = int(os.environ.get("RATUNE_SMOKE_STOP_AFTER") or 0)

    def _cuda():
        import torch

        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def _write():
        import torch

        cuda = _cuda()
        _state["max_memory_allocated"] = torch.cuda.max_memory_allocated() if cuda else None
        _state["max_memory_reserved"] = torch.cuda.max_memory_reserved() if cuda else None
        with open(_FILE, "w") as fh:
            json.dump(_state, fh)

    def _now():
        if _cuda():
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    _begin, _end = _tc.CallbackHandler.on_train_begin, _tc.CallbackHandler.on_step_end

    def on_train_begin(self, args, state, control):
        _state["train_begin"] = _now()
        return _begin(self, args, state, control)

    def on_step_end(self, args, state, control):
        _state["step_end"].append(_now())
        out = _end(self, args, state, control)
        if _stop and state.global_step >= _stop:
            _write()
            os._exit(0)
        return out

    _tc.CallbackHandler.on_train_begin = on_train_begin
    _tc.CallbackHandler.on_step_end = on_step_end
    atexit.register(_write)
'''


def _bench_module(name: str, folder: Path = BENCH):
    """A bench script (or another file of ``folder``) loaded as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    tmp.replace(path)


# ---------------------------------------------------------------------------- stage: models


def build_data(folder: Path, tokenizer_dir: Path, *, rows: int, row_tokens: int) -> dict:
    """A complete ``ratune data build``-shaped folder (mode ``none``, gorilla_v0) whose rows are
    each exactly ``row_tokens`` tokens as ratune tokenizes them (prompt, answer, EOS)."""
    from datasets import Dataset, DatasetDict

    from ratune.manifest import mark_complete
    from ratune.data.labels import tokenize_row
    from ratune.sources.prompt import use_chat_template
    from ratune.models import load_tokenizer

    tok = use_chat_template(load_tokenizer(tokenizer_dir), "gorilla_v0")

    def user(i):
        return f"Question {i:05d}: which API classifies images of cats?"

    answer = "<<<domain>>>: Classification\n<<<api_call>>>: torch.hub.load('pytorch/vision', 'resnet34')\n"
    base = len(tokenize_row(tok, user(0), answer).input_ids)
    if base > row_tokens:
        raise ValueError(f"row_tokens {row_tokens} < the {base} tokens of a minimal row")
    completion = answer + "x" * (row_tokens - base)
    lengths = {len(tokenize_row(tok, user(i), completion).input_ids) for i in range(rows)}
    assert lengths == {row_tokens}, lengths
    data = {"user_turn": [user(i) for i in range(rows)], "completion": [completion] * rows,
            "line": list(range(1, rows + 1))}
    DatasetDict({"train": Dataset.from_dict(data)}).save_to_disk(str(folder / "none"))
    (folder / "manifest.json").write_text(json.dumps({"settings": {"chat_template": "gorilla_v0",
                                                                   "max_document_tokens": None},
                                                      "modes": ["none"]}))
    mark_complete(folder)
    return {"rows": rows, "row_tokens": row_tokens}


def stage_models(plan: dict, work: Path, device: str) -> dict:
    """Tokenizer (byte-level: tests/tiny_llama_tokenizer.py ``build_llama_tokenizer`` without pieces), data, and the
    two random-init model folders (bf16)."""
    import torch

    build_llama_tokenizer = _bench_module("tiny_llama_tokenizer", ROOT / "tests").build_llama_tokenizer
    gt = _bench_module("gpu_train")
    tokenizer_dir = work / "tokenizer"
    shutil.rmtree(work, ignore_errors=True)
    tokenizer_dir.mkdir(parents=True)
    build_llama_tokenizer(tokenizer_dir)
    result = {"data": build_data(work / "data", tokenizer_dir, rows=plan["rows"], row_tokens=plan["row_tokens"]),
              "models": {}}
    for key in ("small", "big"):
        shape = plan[key]
        config = gt.shape_config(shape)
        with torch.device("meta"):
            from transformers import LlamaForCausalLM

            n = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
        free = shutil.disk_usage(work).free
        if 2 * n * 1.1 > free:
            result["models"][shape] = {"skipped": f"{2 * n / 1e9:.1f} GB of bf16 weights, {free / 1e9:.1f} GB free"}
            continue
        start = time.perf_counter()
        model, _ = gt.build_model(shape, attn="sdpa", device=device, dtype="bfloat16")
        folder = work / "models" / shape
        model.save_pretrained(str(folder))
        shutil.copytree(tokenizer_dir, folder, dirs_exist_ok=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        result["models"][shape] = {"folder": str(folder), "params": n,
                                   "seconds": round(time.perf_counter() - start, 1)}
    return result


# ---------------------------------------------------------------------------- stage: training


def _shape_params(shape: str) -> tuple[int, int]:
    """``(parameters, matmul parameters)`` of a shape (built on the meta device: no memory)."""
    import torch
    from transformers import LlamaForCausalLM

    gt = _bench_module("gpu_train")
    with torch.device("meta"):
        model = LlamaForCausalLM(gt.shape_config(shape))
    return sum(p.numel() for p in model.parameters()), gt.matmul_params(model)


def _fits(params: int, bytes_per_param: int, device: str) -> str | None:
    """Why a run of ``params`` at ``bytes_per_param`` (plus 10 GiB) does not fit the GPU; None if it does."""
    if device != "cuda":
        return None
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    need = params * bytes_per_param + 10 * 2**30
    if need > total:
        return (f"needs about {need / 2**30:.0f} GiB ({bytes_per_param} bytes/param + 10 GiB), the GPU has "
                f"{total / 2**30:.0f}")
    return None


def stage_train_ratune(kind: str, plan: dict, work: Path, device: str, dry: bool) -> dict:
    """``python -m ratune.train`` on a shape (see the module docstring), timed by the hook."""
    import yaml

    gt = _bench_module("gpu_train")
    shape_key, dtype, lora, verify, stop_early = TRAIN_KINDS[kind]
    shape = plan[shape_key]
    folder = work / "models" / shape
    if not (folder / "config.json").exists():
        return {"skipped": f"no model folder {folder} (see the models stage)"}
    params, n = _shape_params(shape)
    full_bytes = 16 if not lora else 2  # float32 weights, grads, Adam moments; LoRA: the bf16 base
    reason = _fits(params, full_bytes, device)
    if reason:
        return {"skipped": reason}
    warmup, steps = plan["steps"]["1b" if kind == "1b" else "7b"]
    rows = plan["rows_per_step"]
    run_dir = work / "runs" / kind
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config = {"model": str(folder), "data_dir": str(work / "data"), "train_retriever": "none",
              "output_dir": str(run_dir), "chat_template": "gorilla_v0", "max_length": 2048,
              "global_batch_size": rows, "per_device_batch_size": rows, "gradient_accumulation_steps": 1,
              "learning_rate": 1e-5, "max_steps": warmup + steps, "warmup_ratio": 0.0, "lr_scheduler": "constant",
              "dtype": dtype, "bf16": True, "gradient_checkpointing": True, "padding_free": True,
              "attn_implementation": "sdpa", "seed": 0, "save_strategy": "no", "verify_saves": verify,
              "lora": ({"enabled": True, "r": plan["lora_r"], "alpha": 2 * plan["lora_r"], "dropout": 0.05,
                        "target_modules": "all-linear"} if lora else {"enabled": False})}
    if dry:
        config["torch_threads"] = 1
    config_path = work / "runs" / f"{kind}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_TIMING_HOOK)
    times_file = work / "runs" / f"{kind}.times.json"
    times_file.unlink(missing_ok=True)
    python_path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": python_path,
           "RATUNE_SMOKE_TIMES": str(times_file), "RATUNE_SMOKE_STOP_AFTER": str(warmup + steps) if stop_early else ""}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ratune.train", "--config", str(config_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    (work / "runs" / f"{kind}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"failed": f"python -m ratune.train exited {proc.returncode}: "
                          f"{(proc.stderr.strip().splitlines() or [''])[-1][:300]}"}
    times = json.loads(times_file.read_text())
    ends = [times["train_begin"], *times["step_end"]]
    intervals = [b - a for a, b in zip(ends, ends[1:])]
    if len(intervals) != warmup + steps:
        return {"failed": f"{len(intervals)} optimizer steps timed, expected {warmup + steps}"}
    timed = intervals[warmup:]
    tokens_per_step = rows * plan["row_tokens"]
    seconds = sum(timed)
    rate = tokens_per_step * steps / seconds
    gpu = _gpu_name(device)
    peak = gt.peak_tflops_for(gpu)
    factor = 4.0 if lora else 6.0
    result = {"shape": shape, "params": params, "matmul_params": n, "dtype": dtype, "bf16_autocast": True,
              "lora_r": plan["lora_r"] if lora else None, "flops_per_param": factor,
              "tokens_per_step": tokens_per_step, "steps": steps, "warmup": warmup,
              "step_seconds": [round(t, 4) for t in timed], "tokens_per_s": round(rate, 1),
              "mfu": round(gt.mfu(n, tokens_per_step * steps, seconds, peak * 1e12, flops_per_param=factor), 4)
              if peak else None,
              "max_memory_gib": round(times["max_memory_allocated"] / 2**30, 2)
              if times.get("max_memory_allocated") else None,
              "wall_s": round(wall, 1), "stopped_after_timed_steps": stop_early}
    manifest_path = run_dir / "manifest.json"
    if not stop_early and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        result["save_checks"] = manifest.get("save_checks")
        result["run_tokens_per_s"] = (manifest.get("throughput") or {}).get("tokens_per_s")
        result["device"] = manifest.get("device")
    return result


def stage_train_loop(kind: str, plan: dict, work: Path, device: str) -> dict:
    """bench/gpu_train.py's loop on the same shape, micro-batch and precision as the ratune stage."""
    gt = _bench_module("gpu_train")
    shape_key, _, lora, _, _ = TRAIN_KINDS[kind]
    shape = plan[shape_key]
    params, _ = _shape_params(shape)
    reason = _fits(params, 2 if lora else 16, device)
    if reason:
        return {"skipped": reason}
    warmup, steps = plan["steps"]["1b" if kind == "1b" else "7b"]
    tokens = plan["rows_per_step"] * plan["row_tokens"]
    r = gt.run(model_name=shape, steps=steps, warmup=warmup, micro_batch=1, seq_len=tokens,
               doc_len=plan["row_tokens"], attn="sdpa", grad_ckpt=True, device=device,
               precision="autocast", lora_r=plan["lora_r"] if lora else None)
    r["tokens_per_s"] = r.pop("tokens_per_s_per_gpu")
    return r


# ---------------------------------------------------------------------------- stage: generation


def greedy_loop(model, prompts: list[list[int]], *, batch_size: int, max_new_tokens: int, pad_id: int) -> dict:
    """The ceiling: left-padded batches, one prefill forward, then one forward per new token with
    the KV cache and argmax; no stopping at EOS. Returns ``{"seconds", "generated_tokens", "tokens_per_s"}``."""
    import torch

    device = model.device
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start, generated = time.perf_counter(), 0
    with torch.inference_mode():
        for at in range(0, len(order), batch_size):
            batch = [prompts[i] for i in order[at:at + batch_size]]
            width = max(len(p) for p in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, p in enumerate(batch):
                ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            ids, mask = ids.to(device), mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
            cache, token = out.cache, out.logits[:, -1].argmax(-1)
            position = positions[:, -1:]
            for _ in range(max_new_tokens - 1):
                mask = torch.cat([mask, mask.new_ones((len(batch), 1))], dim=1)
                position = position + 1
                out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position, cache=cache,
                            use_cache=True)
                cache, token = out.cache, out.logits[:, -1].argmax(-1)
            generated += len(batch) * max_new_tokens
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "generated_tokens": generated, "tokens_per_s": round(generated / seconds, 2)}


def stage_generate(plan: dict, work: Path) -> dict:
    """ratune's eval loading path and batched generation at each batch size, beside the loop."""
    import torch

    from ratune.sources.prompt import encode_prompt, use_chat_template
    from ratune.eval.settings import resolve_placement
    from ratune.models import load_model, load_tokenizer

    et = _bench_module("eval_throughput")
    folder = next((work / "models" / plan[k] for k in ("big", "small")
                   if (work / "models" / plan[k] / "config.json").exists()), None)
    if folder is None:
        return {"skipped": "no model folder (see the models stage)"}
    device, dtype = resolve_placement("auto", "auto")  # as `ratune eval run` chooses: cuda + bfloat16 on a GPU
    start = time.perf_counter()
    model = load_model(folder, dtype=dtype, device=device)
    load_s = time.perf_counter() - start
    tokenizer = use_chat_template(load_tokenizer(folder), "gorilla_v0")
    top = max(plan["gen_batches"])
    # prompts of 100 to about 700 bytes (= tokens), as 0-shot and oracle prompts differ in length
    prompts = [encode_prompt(tokenizer, f"Question {i}: " + "which API loads a pretrained model? " * (1 + i % 19))
               for i in range(top)]
    max_new = plan["max_new_tokens"]
    et.measure_hf(model, tokenizer, prompts[:1], batch_size=1, max_new_tokens=2)  # warm-up
    greedy_loop(model, prompts[:1], batch_size=1, max_new_tokens=2, pad_id=tokenizer.pad_token_id)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    batches = {}
    for b in plan["gen_batches"]:
        use = prompts[:plan["gen_prompts_at_1"] if b == 1 else b]
        ratune, _ = et.measure_hf(model, tokenizer, use, batch_size=b, max_new_tokens=max_new)
        loop = greedy_loop(model, use, batch_size=b, max_new_tokens=max_new, pad_id=tokenizer.pad_token_id)
        batches[str(b)] = {"prompts": len(use), "ratune": ratune, "loop": loop}
    return {"model": folder.name, "device": device, "dtype": dtype, "load_s": round(load_s, 1),
            "max_new_tokens": max_new, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
            "batches": batches,
            "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None}


# ---------------------------------------------------------------------------- the orchestrator


def _gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def run_stage(name: str, out: Path, *, dry: bool, limit: float) -> dict:
    """Run one stage and return its result: on a GPU in its own process session (all of it killed
    at ``limit``), so each stage starts with the GPU's memory free; in the dry run in this process
    (the CPU has nothing to free, and CI's time is better spent on ratune's own training process)."""
    if dry:
        start = time.perf_counter()
        try:
            _stage_main(name, out, dry)
        except Exception as exc:  # noqa: BLE001 - a stage's failure is reported, the others still run
            return {"failed": f"{type(exc).__name__}: {exc}"}
        return {**json.loads((out / f"{name}.json").read_text()), "stage_s": round(time.perf_counter() - start, 1)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--out", str(out)]
    result_file = out / f"{name}.json"
    result_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"failed": f"timed out after {limit:.0f} s (see {name}.log)"}
    if proc.returncode != 0 or not result_file.exists():
        return {"failed": f"exit {proc.returncode} after {time.perf_counter() - start:.0f} s (see {name}.log)"}
    result = json.loads(result_file.read_text())
    result.setdefault("stage_s", round(time.perf_counter() - start, 1))
    return result


def _stage_main(name: str, out: Path, dry: bool) -> int:
    plan = PLANS["dry" if dry else "gpu"]
    work = out / "work"
    device = "cpu" if dry else "cuda"
    if dry:
        import torch

        torch.set_num_threads(1)
    if name == "models":
        result = stage_models(plan, work, device)
    elif name.startswith("train_") and name.endswith("_ratune"):
        result = stage_train_ratune(name[len("train_"):-len("_ratune")], plan, work, device, dry)
    elif name.startswith("train_") and name.endswith("_loop"):
        result = stage_train_loop(name[len("train_"):-len("_loop")], plan, work, device)
    elif name == "generate":
        result = stage_generate(plan, work)
    else:
        raise SystemExit(f"unknown stage {name!r}")
    _write_json(out / f"{name}.json", result)
    return 0


def _fmt(r: dict, key: str, spec: str = ",.0f") -> str:
    v = r.get(key)
    return "-" if v is None else format(v, spec)


def format_table(report: dict) -> str:
    """The printed report: one row per training stage pair and per generation batch size."""
    s = report["stages"]
    lines = [f"ratune GPU smoke{' (DRY RUN on CPU: the numbers mean nothing)' if report['dry_run'] else ''}: "
             f"{report['device']}; torch {report['versions']['torch']}, transformers "
             f"{report['versions']['transformers']}; {report['seconds']:.0f} s of a {report['budget_s']} s budget", "",
             f"{'training (tokens/s, MFU, peak GiB)':<44} {'ratune':>24}   {'hand loop (ceiling)':>24}   {'ratio':>5}"]
    labels = {"1b": "1B shape, full, fp32 + bf16 autocast", "7b_full": "7B shape, full, fp32 + bf16 autocast",
              "7b_lora": "7B shape, LoRA on bf16 base"}
    for kind, label in labels.items():
        a, b = s.get(f"train_{kind}_ratune", {}), s.get(f"train_{kind}_loop", {})

        def cell(r):
            if "failed" in r or "skipped" in r:
                return "FAILED" if "failed" in r else "skipped"
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            return f"{_fmt(r, 'tokens_per_s')} {mfu} {_fmt(r, 'max_memory_gib', '.1f')}"
        ratio = (f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}" if a.get("tokens_per_s") and b.get("tokens_per_s")
                 else "-")
        tokens = a.get("tokens_per_step") or b.get("tokens_per_step")
        label += f", {tokens} tok/step" if tokens else ""
        lines.append(f"{label:<44} {cell(a):>24}   {cell(b):>24}   {ratio:>5}")
    checks = s.get("train_1b_ratune", {}).get("save_checks")
    if checks:
        lines.append("save checks of the 1B run: " + "; ".join(
            f"{c['folder']}: {c['weights_compared']} weights bit for bit, logits within {c['max_abs_logit_diff']:.3g} "
            f"(tolerance {c['tolerance']:.3g}, {c['compute_dtype']})" for c in checks))
    g = s.get("generate", {})
    lines += ["", f"{'generation (tokens/s)':<44} {'ratune':>24}   {'hand loop (ceiling)':>24}   {'ratio':>5}"]
    if "batches" in g:
        for b, r in sorted(g["batches"].items(), key=lambda item: int(item[0])):  # JSON keys are strings
            a, c = r["ratune"]["tokens_per_s"], r["loop"]["tokens_per_s"]
            label = f"{g['model']} {g['dtype']}, batch {b}, {r['prompts']} prompts, {g['max_new_tokens']} new"
            lines.append(f"{label:<44} {a:>24,.1f}   {c:>24,.1f}   {a / c:>5.2f}")
    else:
        lines.append(f"{'generate':<44} {'FAILED' if 'failed' in g else 'skipped':>24}")
    notes = [f"  {name}: {r.get('failed') or r.get('skipped')}" for name, r in s.items()
             if "failed" in r or "skipped" in r]
    return "\n".join(lines + (["", "not measured:", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_smoke"),
                        help="results folder (default runs/gpu_smoke; its work/ subfolder is replaced)")
    parser.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of all stages (default 570)")
    parser.add_argument("--dry-run", action="store_true", help="toy shapes on the CPU (CI)")
    parser.add_argument("--stage", choices=tuple(STAGES), help=argparse.SUPPRESS)  # one stage, in its own process
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: this process and its children
    if args.stage:
        return _stage_main(args.stage, out, args.dry_run)

    import torch
    import transformers

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: bench/gpu_smoke.py measures GPU training and generation; nothing to do "
              "(--dry-run runs its stages on the CPU)")
        return 0
    if importlib.util.find_spec("ratune") is None:
        print("ratune is not importable: pip install --no-deps --no-build-isolation -e . (and the wheels it needs)")
        return 2
    start = time.perf_counter()
    stages = {}
    for name, limit in STAGES.items():
        left = args.budget_s - (time.perf_counter() - start)
        if left < 10:
            stages[name] = {"skipped": f"budget of {args.budget_s:.0f} s spent"}
            continue
        own = DRY_STAGE_LIMIT if args.dry_run else limit
        stages[name] = run_stage(name, out, dry=args.dry_run, limit=min(own, left))
        print(f"  {name}: {next(iter(k for k in ('failed', 'skipped') if k in stages[name]), 'done')} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    device = "cpu" if args.dry_run else \
        f"{_gpu_name('cuda')} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    report = {"dry_run": args.dry_run, "device": device, "budget_s": args.budget_s,
              "seconds": round(time.perf_counter() - start, 1), "stages": stages,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda": torch.version.cuda, "python": sys.version.split()[0]}}
    _write_json(out / "gpu_smoke.json", report)
    print(format_table(report))
    print(f"\nwrote {out / 'gpu_smoke.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
