"""Probe (not a bench/ target): does torch.compile (inductor, dynamic shapes) speed up a training
micro-step of the demo model on this CPU? For LoRA r 16 (dropout 0) and for full finetuning, one
fresh model each, eager and then compiled, side by side in one run: forward with labels and
backward on the same 24 random sequences of 150-250 tokens (batch 1, 2 threads, sdpa, float32);
the first 8 steps are warm-up (compilation), the mean of the other 16 is the steady step time.
Writes train_compile_probe.json next to this file. Run from the repository root:
    .venv/bin/python docs/performance/train_compile_probe.py"""
import json, time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

from ratune.manifest import package_versions
from ratune.models import DEMO_MODEL_ALIAS, resolve_model_path

torch.set_num_threads(2)
WARMUP = 8
gen = torch.Generator().manual_seed(0)
lengths = [int(x) for x in torch.randint(150, 251, (24,), generator=gen)]
VOCAB = AutoConfig.from_pretrained(resolve_model_path(DEMO_MODEL_ALIAS)).vocab_size  # 49,152 for SmolLM2
seqs = [torch.randint(0, VOCAB, (1, n), generator=gen) for n in lengths]


def run(adapter: str, compiled: bool) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(DEMO_MODEL_ALIAS), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    if adapter == "lora":
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    model.train()
    forward = torch.compile(model, dynamic=True) if compiled else model
    times, losses = [], []
    for x in seqs:
        start = time.perf_counter()
        loss = forward(input_ids=x, labels=x).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    steady = times[WARMUP:]
    return {"first_step_s": times[0], "warmup_s": sum(times[:WARMUP]), "steady_step_s": sum(steady) / len(steady),
            "tokens_per_s": sum(lengths[WARMUP:]) / sum(steady), "losses": losses}


results = {}
for adapter in ("lora", "full"):
    for compiled in (False, True):
        results[f"{adapter}_{'compiled' if compiled else 'eager'}"] = run(adapter, compiled)
print("| model | eager tokens/s | compiled tokens/s | ratio | compile warm-up s | max loss diff |")
print("|---|---|---|---|---|---|")
for adapter in ("lora", "full"):
    e, c = results[f"{adapter}_eager"], results[f"{adapter}_compiled"]
    c["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(e["losses"], c["losses"]))
    c["speedup"] = c["tokens_per_s"] / e["tokens_per_s"]
    print(f"| {adapter} | {e['tokens_per_s']:.1f} | {c['tokens_per_s']:.1f} | {c['speedup']:.2f} | "
          f"{c['warmup_s']:.0f} | {c['max_abs_loss_diff']:.1e} |")
out = Path(__file__).with_name("train_compile_probe.json")
out.write_text(json.dumps({"lengths": lengths, "threads": 2, "warmup_steps": WARMUP, "results": results,
                           "versions": package_versions()}, indent=1) + "\n")
