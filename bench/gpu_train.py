"""Training throughput on one GPU: tokens/s per GPU and model FLOPs utilisation (MFU).

Usage:
    python bench/gpu_train.py [--model demo|llama1b|llama7b|PATH] [--steps 10] [--warmup 3]
                              [--micro-batch 4] [--seq-len 2048] [--doc-len 640] [--attn sdpa]
                              [--no-grad-ckpt] [--precision bf16|autocast] [--lora-r R]
                              [--peak-tflops X] [--device cuda|cpu] [--json]

On a machine without a CUDA GPU it prints that it has nothing to measure and exits 0 (with
``--json``: ``{"skipped": reason}``), unless ``--device cpu`` asks for the CPU (the tiny shapes of
bench/gpu_smoke.py's dry run).

Models (``--model``): ``demo`` is SmolLM2-135M-Instruct (the converted demo model,
:func:`ratune.models.ensure_demo_model`); ``llama7b`` is the paper's LLaMA-7B shape (hidden
4096, 32 layers, 32 heads, MLP 11008, vocabulary 32000; Touvron et al. 2023, Table 2) and
``llama1b`` a 1B-class stand-in (the Llama-3.2-1B shape: hidden 2048, 16 layers, 32 query / 8 KV
heads, MLP 8192, vocabulary 128256, tied embeddings), both randomly initialised on the GPU: no
weights are downloaded, and throughput does not depend on weight values. ``llama1b-tiny`` and
``llama7b-tiny`` are the same layouts (tied embeddings and 4:1 GQA; untied and multi-head) at toy
size, for CPU dry runs. A folder path loads that model with ``from_pretrained``.

What a step is: the paper recipe's micro-batch as ratune trains it with ``packing: true`` (TRL bfd
packing, padding-free): ``--micro-batch`` rows of ``--seq-len`` tokens flattened into one
sequence whose ``position_ids`` restart every ``--doc-len`` tokens (examples of that length; 640
is about the mean TorchHub oracle row), so the attention kernel gets per-example boundaries as in
training; ``--doc-len 0`` gives plain unpacked rows instead. Random token ids, loss on every
token, gradient checkpointing on (as the paper configs) unless ``--no-grad-ckpt``, AdamW (fused)
step each iteration. The first ``--warmup`` steps are not timed; the timed steps are synchronised
with ``torch.cuda.synchronize``. Precision (``--precision``): ``bf16`` (default) trains bf16
weights with a bf16 AdamW; ``autocast`` keeps float32 weights and optimizer and runs the forward
and backward under bf16 autocast, as ratune's full finetune without DeepSpeed does (``dtype:
float32``, ``bf16: true``). ``--lora-r R``: LoRA of rank R (alpha 2R) on every linear layer of a
frozen bf16 base (dropout 0.05), adapters in float32, under bf16 autocast, as ratune's LoRA configs
(peft; only the adapters are in the optimizer).

Numbers:
- ``tokens_per_s_per_gpu`` = tokens per step x timed steps / timed seconds (one process, one GPU).
- ``mfu`` = :func:`mfu`: 6 x N x tokens/s / peak FLOP/s (LoRA: 4 x N, ``flops_per_param``: the
  frozen base computes no weight gradients, only the forward 2N and the input gradients 2N), with
  N = :func:`matmul_params` of the base (the
  parameters multiplied per token: all weights except the input embedding; the output head
  counted also when tied to it). 6N per token is the forward (2N) plus backward (4N) matmul cost
  (Kaplan et al. 2020, sec. 2.1); attention-score FLOPs and gradient-checkpointing recomputation
  are not counted (the usual MFU convention, Chowdhery et al. 2022, appendix B), so ``mfu`` is a
  lower bound on the hardware utilisation. ``mfu_with_attention`` adds the attention term
  12 x layers x hidden x doc-len per token (same appendix).
- peak FLOP/s: dense bf16 tensor-core peak per GPU from :data:`PEAK_BF16_TFLOPS` (NVIDIA data
  sheets; the sparsity figures halved), matched on ``torch.cuda.get_device_name``, or
  ``--peak-tflops``. Unknown GPU and no flag: ``mfu`` is null.

With ``--json`` prints one object::

    {"model", "params", "matmul_params", "gpu", "peak_tflops", "steps", "warmup", "micro_batch",
     "seq_len", "doc_len", "attn", "grad_ckpt", "precision", "lora_r", "flops_per_param",
     "tokens_per_step", "seconds", "tokens_per_s_per_gpu", "mfu", "mfu_with_attention",
     "step_seconds", "max_memory_gib", "loss_first", "loss_last", "torch", "transformers"}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: Dense (no sparsity) bf16 tensor-core peak per GPU, TFLOP/s, from NVIDIA's data sheets (their
#: "with sparsity" figures halved). Matched in order as substrings of the device name, so the
#: specific variants come before the general names.
PEAK_BF16_TFLOPS = (
    ("H100 NVL", 835.0),   # H100 NVL: 1,671 sparse
    ("H100 PCIe", 756.0),  # H100 PCIe: 1,513 sparse
    ("H100", 989.0),       # H100 SXM5: 1,979 sparse
    ("H200", 989.0),       # H200 SXM: 1,979 sparse (same tensor cores as H100 SXM)
    ("GH200", 989.0),
    ("B200", 2250.0),      # HGX B200: 4.5 PFLOPS sparse per GPU
    ("A100", 312.0),       # A100 SXM/PCIe: 624 sparse
    ("L40S", 362.0),       # L40S: 733 sparse
    ("L4", 121.0),         # L4: 242 sparse
    ("A10G", 70.0),        # AWS A10G (A10 silicon at lower clocks; AWS figure)
    ("A10", 125.0),        # A10: 250 sparse
)

#: Model shapes built at random on the GPU (no download).
SHAPES = {
    # LLaMA-7B (Touvron et al. 2023, Table 2): d 4096, 32 layers, 32 heads; MLP 11008; vocab 32000
    "llama7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False),
    # Llama-3.2-1B shape (its config.json): a 1B-class stand-in that trains on any 24 GB+ GPU
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0),
    # the same two layouts at toy size, for CPU dry runs (bench/gpu_smoke.py --dry-run)
    "llama7b-tiny": dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=512, tie_word_embeddings=False),
    "llama1b-tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, rope_theta=500000.0),
}


def peak_tflops_for(device_name: str | None) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU from :data:`PEAK_BF16_TFLOPS` (None when not listed)."""
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def mfu(params: float, tokens: float, seconds: float, peak_flops_per_s: float, *, n_gpus: int = 1,
        extra_flops_per_token: float = 0.0, flops_per_param: float = 6.0) -> float:
    """Model FLOPs utilisation: ``(6 x params + extra) x tokens / seconds / (peak x n_gpus)``
    (``flops_per_param`` replaces the 6: 4 for LoRA on a frozen base).

    Args:
        params: parameters multiplied per token (see :func:`matmul_params`).
        tokens: training tokens processed (all GPUs together) in ``seconds``.
        seconds: wall time, > 0.
        peak_flops_per_s: one GPU's peak, FLOP/s (not TFLOP/s), > 0.
        n_gpus: GPUs that processed ``tokens``.
        extra_flops_per_token: FLOPs per token on top of 6N (e.g. attention, 12 x L x H x S).
    Returns:
        A fraction (0.42 = 42 %).
    Raises:
        ValueError: non-positive seconds, peak or GPU count.
    """
    if seconds <= 0 or peak_flops_per_s <= 0 or n_gpus < 1:
        raise ValueError(f"need seconds > 0, peak > 0, n_gpus >= 1 (got {seconds}, {peak_flops_per_s}, {n_gpus})")
    return (flops_per_param * params + extra_flops_per_token) * tokens / seconds / (peak_flops_per_s * n_gpus)


def attention_flops_per_token(num_layers: int, hidden_size: int, context: int) -> float:
    """Training FLOPs per token of the attention scores and weighted values, 12 x L x H x S
    (Chowdhery et al. 2022, appendix B; S = tokens each query attends over, the example length)."""
    return 12.0 * num_layers * hidden_size * context


def matmul_params(model) -> int:
    """Parameters multiplied per token: every distinct parameter except the input embedding
    table (a lookup), plus the output head's weight when it is tied to that table (it is still a
    matmul). For SmolLM2-135M (tied) this equals its parameter count."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    return total - embed.numel() + (embed.numel() if tied else 0)


def shape_config(name: str):
    """The ``LlamaConfig`` of a shape of :data:`SHAPES` (4096 positions)."""
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[name], max_position_embeddings=4096)


def build_model(name: str, *, attn: str, device: str, dtype: str = "bfloat16"):
    """The model for ``--model`` in ``dtype`` (bf16 by default) on ``device`` (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    if name in SHAPES:
        torch.manual_seed(0)
        with torch.device(device):  # initialised in place on the GPU, directly in its dtype
            model = LlamaForCausalLM._from_config(shape_config(name), dtype=getattr(torch, dtype),
                                                  attn_implementation=attn)
        return model, name
    if name == "demo":
        from ratune.models import ensure_demo_model

        path = ensure_demo_model()
    else:
        path = name
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), attn_implementation=attn)
    return model.to(device), str(path)


def run(*, model_name: str = "demo", steps: int = 10, warmup: int = 3, micro_batch: int = 4, seq_len: int = 2048,
        doc_len: int = 640, attn: str = "sdpa", grad_ckpt: bool = True, peak_tflops: float | None = None,
        device: str = "cuda", precision: str = "bf16", lora_r: int | None = None) -> dict:
    """Train ``warmup + steps`` steps on random tokens and measure the timed ones; returns the
    ``--json`` object. ``device="cpu"`` exists for the tests and dry runs (a tiny model, to check
    the loop). ``precision`` and ``lora_r``: see the module docstring."""
    import contextlib

    import torch
    import transformers

    if precision not in ("bf16", "autocast"):
        raise ValueError(f"unknown precision {precision!r}: expected bf16 or autocast")
    cuda = device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    weights = "float32" if precision == "autocast" and lora_r is None else "bfloat16"
    model, label = build_model(model_name, attn=attn, device=device, dtype=weights)
    n = matmul_params(model)  # the base's, before any adapter
    model.config.use_cache = False
    if lora_r is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.05,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    autocast = precision == "autocast" or lora_r is not None
    amp = (lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    if grad_ckpt:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=cuda)
    vocab = model.config.vocab_size
    total = micro_batch * seq_len
    gen = torch.Generator(device=device).manual_seed(0)
    if doc_len:
        shape = (1, total)  # padding-free: the micro-batch flattened into one sequence
        position_ids = (torch.arange(total, device=device) % doc_len)[None]
    else:
        shape, position_ids = (micro_batch, seq_len), None
    losses, times = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        ids = torch.randint(0, vocab, shape, device=device, generator=gen)
        sync()
        start = time.perf_counter()
        with amp():
            out = model(input_ids=ids, labels=ids, position_ids=position_ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        losses.append(float(out.loss.detach()))
    seconds = sum(times)
    tokens = total * steps
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = peak_tflops if peak_tflops is not None else peak_tflops_for(name)
    factor = 4.0 if lora_r is not None else 6.0
    cfg = model.config
    context = doc_len or seq_len
    attn_extra = attention_flops_per_token(cfg.num_hidden_layers, cfg.hidden_size, context)
    return {
        "model": label, "params": sum(p.numel() for p in model.parameters()), "matmul_params": n, "gpu": name,
        "peak_tflops": peak, "steps": steps, "warmup": warmup, "micro_batch": micro_batch, "seq_len": seq_len,
        "doc_len": doc_len, "attn": attn, "grad_ckpt": grad_ckpt, "precision": "autocast" if autocast else "bf16",
        "lora_r": lora_r,
        "flops_per_param": factor, "tokens_per_step": total,
        "seconds": round(seconds, 3), "tokens_per_s_per_gpu": round(tokens / seconds, 1),
        "mfu": round(mfu(n, tokens, seconds, peak * 1e12, flops_per_param=factor), 4) if peak else None,
        "mfu_with_attention": round(mfu(n, tokens, seconds, peak * 1e12, extra_flops_per_token=attn_extra,
                                        flops_per_param=factor), 4) if peak else None,
        "step_seconds": [round(t, 4) for t in times],
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }


def _table(r: dict) -> str:
    mfu_s = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a (unknown GPU peak; pass --peak-tflops)"
    rows = [("model", r["model"]), ("GPU", f"{r['gpu']} (peak {r['peak_tflops']} TFLOP/s bf16)"),
            ("matmul params", f"{r['matmul_params'] / 1e6:.1f} M"),
            ("step", f"{r['micro_batch']} x {r['seq_len']} tokens, doc_len {r['doc_len']}, {r['attn']}, "
                     f"grad ckpt {r['grad_ckpt']}"),
            ("timed", f"{r['steps']} steps in {r['seconds']} s"),
            ("tokens/s per GPU", f"{r['tokens_per_s_per_gpu']:,.0f}"), ("MFU (6N)", mfu_s),
            ("max memory", f"{r['max_memory_gib']} GiB")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exits 0 without a GPU (nothing to measure)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo | llama1b | llama7b | a model folder")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--doc-len", type=int, default=640, help="example length inside packed rows; 0 = unpacked")
    parser.add_argument("--attn", default="sdpa", help="sdpa | flash_attention_2 | eager | flex_attention")
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--precision", choices=("bf16", "autocast"), default="bf16",
                        help="bf16 weights and optimizer, or float32 ones under bf16 autocast")
    parser.add_argument("--lora-r", type=int, default=None, help="LoRA of this rank on a frozen bf16 base")
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU peak bf16 TFLOP/s (overrides the table)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: tiny shapes, dry runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA GPU on this machine: bench/gpu_train.py measures GPU training throughput; nothing to do"
        print(json.dumps({"skipped": reason}) if args.json else reason)
        return 0
    result = run(model_name=args.model, steps=args.steps, warmup=args.warmup, micro_batch=args.micro_batch,
                 seq_len=args.seq_len, doc_len=args.doc_len, attn=args.attn, grad_ckpt=not args.no_grad_ckpt,
                 peak_tflops=args.peak_tflops, device=args.device, precision=args.precision, lora_r=args.lora_r)
    print(json.dumps(result) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
