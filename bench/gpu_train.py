"""Training throughput on one GPU: tokens/s per GPU and model FLOPs utilisation (MFU).

Usage:
    python bench/gpu_train.py [--model demo|llama1b|llama7b|PATH] [--steps 10] [--warmup 3]
                              [--micro-batch 4] [--seq-len 2048] [--doc-len 640] [--attn sdpa]
                              [--no-grad-ckpt] [--peak-tflops X] [--json]

On a machine without a CUDA GPU it prints that it has nothing to measure and exits 0 (with
``--json``: ``{"skipped": reason}``).

Models (``--model``): ``demo`` is SmolLM2-135M-Instruct (the converted demo model,
:func:`ratune.train.model.ensure_demo_model`); ``llama7b`` is the paper's LLaMA-7B shape (hidden
4096, 32 layers, 32 heads, MLP 11008, vocabulary 32000; Touvron et al. 2023, Table 2) and
``llama1b`` a 1B-class stand-in (the Llama-3.2-1B shape: hidden 2048, 16 layers, 32 query / 8 KV
heads, MLP 8192, vocabulary 128256, tied embeddings), both randomly initialised on the GPU: no
weights are downloaded, and throughput does not depend on weight values. A folder path loads
that model with ``from_pretrained``.

What a step is: the paper recipe's micro-batch as ratune trains it with ``packing: true`` (TRL bfd
packing, padding-free): ``--micro-batch`` rows of ``--seq-len`` tokens flattened into one
sequence whose ``position_ids`` restart every ``--doc-len`` tokens (examples of that length; 640
is about the mean TorchHub oracle row), so the attention kernel gets per-example boundaries as in
training; ``--doc-len 0`` gives plain unpacked rows instead. Random token ids, loss on every
token, bf16 weights, gradient checkpointing on (as the paper configs) unless ``--no-grad-ckpt``,
AdamW (fused) step each iteration. The first ``--warmup`` steps are not timed; the timed steps
are synchronised with ``torch.cuda.synchronize``.

Numbers:
- ``tokens_per_s_per_gpu`` = tokens per step x timed steps / timed seconds (one process, one GPU).
- ``mfu`` = :func:`mfu`: 6 x N x tokens/s / peak FLOP/s, with N = :func:`matmul_params` (the
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
     "seq_len", "doc_len", "attn", "grad_ckpt", "tokens_per_step", "seconds", "tokens_per_s_per_gpu",
     "mfu", "mfu_with_attention", "step_seconds", "max_memory_gib", "loss_first", "loss_last",
     "torch", "transformers"}
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
        extra_flops_per_token: float = 0.0) -> float:
    """Model FLOPs utilisation: ``(6 x params + extra) x tokens / seconds / (peak x n_gpus)``.

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
    return (6.0 * params + extra_flops_per_token) * tokens / seconds / (peak_flops_per_s * n_gpus)


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


def build_model(name: str, *, attn: str, device: str):
    """The model for ``--model`` in bf16 on ``device`` (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if name in SHAPES:
        config = LlamaConfig(**SHAPES[name], max_position_embeddings=4096)
        torch.manual_seed(0)
        with torch.device(device):  # initialised in place on the GPU, directly in bf16
            model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
        return model, name
    if name == "demo":
        from ratune.train.model import ensure_demo_model

        path = ensure_demo_model()
    else:
        path = name
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation=attn)
    return model.to(device), str(path)


def run(*, model_name: str = "demo", steps: int = 10, warmup: int = 3, micro_batch: int = 4, seq_len: int = 2048,
        doc_len: int = 640, attn: str = "sdpa", grad_ckpt: bool = True, peak_tflops: float | None = None,
        device: str = "cuda") -> dict:
    """Train ``warmup + steps`` steps on random tokens and measure the timed ones; returns the
    ``--json`` object. ``device="cpu"`` exists for the tests (a tiny model, to check the loop)."""
    import torch
    import transformers

    cuda = device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    model, label = build_model(model_name, attn=attn, device=device)
    model.config.use_cache = False
    if grad_ckpt:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
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
    n = matmul_params(model)
    cfg = model.config
    context = doc_len or seq_len
    attn_extra = attention_flops_per_token(cfg.num_hidden_layers, cfg.hidden_size, context)
    return {
        "model": label, "params": sum(p.numel() for p in model.parameters()), "matmul_params": n, "gpu": name,
        "peak_tflops": peak, "steps": steps, "warmup": warmup, "micro_batch": micro_batch, "seq_len": seq_len,
        "doc_len": doc_len, "attn": attn, "grad_ckpt": grad_ckpt, "tokens_per_step": total,
        "seconds": round(seconds, 3), "tokens_per_s_per_gpu": round(tokens / seconds, 1),
        "mfu": round(mfu(n, tokens, seconds, peak * 1e12), 4) if peak else None,
        "mfu_with_attention": round(mfu(n, tokens, seconds, peak * 1e12, extra_flops_per_token=attn_extra), 4)
        if peak else None,
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
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU peak bf16 TFLOP/s (overrides the table)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        reason = "no CUDA GPU on this machine: bench/gpu_train.py measures GPU training throughput; nothing to do"
        print(json.dumps({"skipped": reason}) if args.json else reason)
        return 0
    result = run(model_name=args.model, steps=args.steps, warmup=args.warmup, micro_batch=args.micro_batch,
                 seq_len=args.seq_len, doc_len=args.doc_len, attn=args.attn, grad_ckpt=not args.no_grad_ckpt,
                 peak_tflops=args.peak_tflops)
    print(json.dumps(result) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
