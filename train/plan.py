"""``ratune plan``: per-GPU memory and ideal training time of a training config, before renting GPUs,
by arithmetic on the config alone (no weights, no GPU). The formulas and their sources:
docs/training.md#how-ratune-plan-counts-memory-and-time."""

from __future__ import annotations

import json
from pathlib import Path

from ratune.args import bounded, input_file
from ratune.config import PositiveFloat, Share, Threads, load_config
from ratune.errors import RatuneError
from ratune.train.config import TrainConfig

GIB = 2 ** 30
#: Relative config paths (configs/deepspeed/..., runs/...) are also tried from the checkout's root.
_REPO_ROOT = Path(__file__).resolve().parent.parent

#: config.json fields of models the planner knows without a local folder.
KNOWN_MODELS: dict[str, dict] = {
    "huggyllama/llama-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                            "vocab_size": 32000, "tie_word_embeddings": False},
    "meta-llama/Llama-2-7b-hf": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                                 "vocab_size": 32000, "tie_word_embeddings": False},
    "smollm2-135m-instruct": {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
                              "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                              "vocab_size": 49152, "tie_word_embeddings": True},
}
#: Examples in APIBench's training files where the data manifest is not reachable.
KNOWN_TRAIN_EXAMPLES = {"torchhub": 837}


def model_size(model: str) -> dict:
    """``{"params", "largest_layer_params", "hidden_size", "num_layers", "vocab_size",
    "intermediate_size", "source"}`` of ``model``, a local folder with config.json (``source``: its
    path) or a name in :data:`KNOWN_MODELS` (``table``); parameters counted on torch's ``meta`` device,
    shared ones once. Raises RatuneError for neither, or a config that is not a known causal LM."""
    folder = Path(model)
    if (folder / "config.json").exists():
        from ratune.io import read_json_object

        fields, source = read_json_object(folder / "config.json"), str(folder / "config.json")
    elif model in KNOWN_MODELS:
        fields, source = dict(KNOWN_MODELS[model]), "table"
    else:
        raise RatuneError(f"{model}: no config.json there and not a known model ({', '.join(KNOWN_MODELS)}); "
                          "give a local model folder")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in fields.items() if k not in ("quantization_config", "torch_dtype", "dtype")}
    try:
        cfg = AutoConfig.for_model(**fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise RatuneError(f"{source}: not a causal LM config transformers knows ({exc})") from None
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(cfg)
    seen, total, largest = set(), 0, 0
    for p in net.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
            largest = max(largest, p.numel())
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return {"params": total, "largest_layer_params": largest, "hidden_size": text.hidden_size,
            "num_layers": text.num_hidden_layers, "vocab_size": text.vocab_size,
            "intermediate_size": getattr(text, "intermediate_size", 4 * text.hidden_size), "source": source}


def _zero_settings(config: TrainConfig, base_dir: Path) -> tuple[int, bool]:
    """(ZeRO stage or 0 for none, optimizer offloaded to cpu)."""
    if not config.deepspeed:
        return 0, False
    path = Path(config.deepspeed)
    if not path.is_absolute() and not path.exists():
        path = base_dir / path
    if not path.exists():
        raise RatuneError(f"{config.deepspeed}: DeepSpeed config not found")
    from ratune.train.config import read_deepspeed_config

    zero = read_deepspeed_config(path)["zero_optimization"]
    offload_optimizer = zero.get("offload_optimizer") or {}
    offload = isinstance(offload_optimizer, dict) and offload_optimizer.get("device", "none") in ("cpu", "nvme")
    return zero["stage"], offload


def _lora_params(size: dict, r: int) -> int:
    """Adapter parameters for LoRA on all linear layers of a LLaMA-style block: r x (in + out) for
    q, k, v, o (h x h each; GQA k/v taken as h x h, an upper bound) and gate, up, down (h x I)."""
    h, i = size["hidden_size"], size["intermediate_size"]
    return size["num_layers"] * r * (4 * 2 * h + 3 * (h + i))


def _data_tokens(config: TrainConfig, base_dir: Path) -> tuple[int, float, str]:
    """(training examples, mean tokens per example, where the mean came from)."""
    manifest = Path(config.data_dir)
    if not manifest.is_absolute() and not manifest.exists():
        manifest = base_dir / manifest
    manifest = manifest / "manifest.json"
    examples, mean, source = KNOWN_TRAIN_EXAMPLES.get(config.hub), float(config.max_length), "max_length"
    if manifest.exists():
        from ratune.io import read_json_object

        built = read_json_object(manifest)
        try:
            examples = int(built["counts"]["train"][config.train_retriever]["rows"])
            mean = float(built["token_lengths"]["train"][config.train_retriever]["p50"])
            source = f"{manifest} token_lengths p50"
        except (KeyError, TypeError, ValueError):
            pass
    if examples is None:
        raise RatuneError(f"{manifest}: no built data manifest, and the {config.hub} training set size is unknown; "
                          "run `ratune data build` first")
    if config.max_examples is not None:
        examples = min(examples, config.max_examples)
    return examples, mean, source


def plan(config: TrainConfig, gpus: int, *, mfu: float = 0.4, peak_tflops: float = 312.0,
         base_dir: str | Path = ".") -> dict:
    """The memory and time plan of ``config`` on ``gpus`` GPUs: a dict with ``per_gpu_gib`` (weights,
    gradients, optimizer, activations, total; GiB = 2**30 bytes), ``ideal_hours`` at ``mfu`` and
    ``peak_tflops`` per GPU (312: A100), ``tokens`` and more. Relative config paths are also tried
    from ``base_dir``. The formulas: docs/training.md#how-ratune-plan-counts-memory-and-time.

    Raises:
        RatuneError: ``gpus`` < 1, ``mfu`` outside (0, 1], a batch that does not resolve, an unknown
            model, or a missing DeepSpeed config or data manifest.
    """
    if gpus < 1:
        raise RatuneError(f"--gpus {gpus}: must be at least 1")
    if not 0 < mfu <= 1:
        raise RatuneError(f"--mfu {mfu}: must be in (0, 1]")
    base_dir = Path(base_dir)
    per_device, accumulation = config.resolve_batch(gpus)
    size = model_size(config.model)
    p, l1 = size["params"], size["largest_layer_params"]
    stage, offload = _zero_settings(config, base_dir)
    half = config.bf16 or config.dtype in ("bfloat16", "float16")
    trainable, weights, gradients, optimizer, accounting = _model_states(config, size, gpus, stage, offload)
    activations = _activation_bytes(config, size, per_device, half)

    examples, mean_tokens, tokens_source = _data_tokens(config, base_dir)
    if config.max_steps is not None:
        tokens = config.max_steps * config.global_batch_size * mean_tokens
    else:
        tokens = examples * config.num_epochs * mean_tokens
    flops = 6 * p * tokens
    seconds = flops / (gpus * peak_tflops * 1e12 * mfu)

    parts = {"weights": weights, "gradients": gradients, "optimizer": optimizer, "activations": activations}
    per_gpu = {k: v / GIB for k, v in parts.items()}
    per_gpu["total"] = sum(parts.values()) / GIB
    return {
        "model": config.model, "model_source": size["source"], "params": p, "trainable_params": trainable,
        "largest_layer_params": l1, "hidden_size": size["hidden_size"], "num_layers": size["num_layers"],
        "vocab_size": size["vocab_size"],
        "gpus": gpus, "zero_stage": stage, "offload_optimizer": offload, "bf16": half,
        "gradient_checkpointing": config.gradient_checkpointing, "max_length": config.max_length,
        "per_device_batch_size": per_device, "gradient_accumulation_steps": accumulation,
        "global_batch_size": per_device * accumulation * gpus, "accounting": accounting,
        "per_gpu_gib": per_gpu, "model_states_gib": (weights + gradients + optimizer) / GIB,
        "examples": examples, "epochs": config.num_epochs, "max_steps": config.max_steps,
        "mean_tokens_per_example": mean_tokens,
        "tokens_source": tokens_source, "tokens": tokens, "train_flops": flops, "mfu": mfu,
        "peak_tflops_per_gpu": peak_tflops, "ideal_hours": seconds / 3600,
    }


def _model_states(config: TrainConfig, size: dict, gpus: int, stage: int, offload: bool) -> tuple:
    """``(trainable parameters, weight, gradient and optimizer bytes per GPU, how they were counted)``
    under ZeRO ``stage`` (0: none), its optimizer ``offload`` and LoRA or QLoRA."""
    p, l1 = size["params"], size["largest_layer_params"]
    load_4bit = getattr(config, "load_in_4bit", False)
    if config.lora.enabled or load_4bit:
        trainable = _lora_params(size, config.lora.r)
        frozen_bytes = 0.5 * 1.05 if load_4bit else (2 if config.dtype != "float32" else 4)
        weights = frozen_bytes * p / (gpus if stage == 3 else 1) + 4 * trainable
        gradients, optimizer = 4 * trainable, 8 * trainable
        accounting = "lora"
    elif stage == 3:
        trainable = p
        weights, gradients = 4 * l1 + 2 * p / gpus, 4 * p / gpus
        optimizer = 0 if offload else 12 * p / gpus
        if offload:  # DeepSpeed: 4 L1 + 2 P / N on the GPU; gradients go to the host with the optimizer
            weights, gradients = 4 * l1 + 2 * p / gpus, 0
        accounting = "deepspeed estimate_zero3_model_states_mem_needs (4 L1 + 18 P / N)"
    elif stage in (1, 2):
        trainable = p
        weights, gradients = 2 * p, (6 * p / gpus if stage == 2 else 6 * p)
        optimizer = 0 if offload else 12 * p / gpus
        accounting = "deepspeed estimate_zero2_model_states_mem_needs (2 P + 18 P / N)"
    else:
        trainable = p
        b = 2 if config.dtype != "float32" else 4
        weights, gradients, optimizer = b * p, b * p, 2 * b * p
        accounting = "ddp: weights, gradients and AdamW moments replicated in the parameter dtype"
    return trainable, weights, gradients, optimizer, accounting


def _activation_bytes(config: TrainConfig, size: dict, per_device: int, half: bool) -> float:
    """Activation bytes per GPU at ``max_length`` and ``per_device`` rows (Korthikanti et al. 2022),
    doubled when not ``half`` (16-bit)."""
    s, b, h, n_layers, v = (config.max_length, per_device, size["hidden_size"], size["num_layers"],
                            size["vocab_size"])
    act_scale = 1 if half else 2
    if config.gradient_checkpointing:
        layers_act = act_scale * (n_layers * 2 * s * b * h + 34 * s * b * h)
    else:
        layers_act = act_scale * n_layers * 34 * s * b * h
    return layers_act + 8 * s * b * v


def add_plan_arguments(parser) -> None:
    """Arguments of ``ratune plan``: --config FILE, --gpus N, --mfu F, --peak-tflops F, --json."""
    parser.add_argument("--config", required=True, type=input_file, help="training config (YAML)")
    parser.add_argument("--gpus", type=bounded(Threads), required=True, help="total GPUs (processes) of the run")
    parser.add_argument("--mfu", type=bounded(Share), default=0.4,
                        help="model FLOPs utilisation assumed, in (0, 1] (default 0.4)")
    parser.add_argument("--peak-tflops", type=bounded(PositiveFloat), default=312.0,
                        help="peak dense 16-bit TFLOP/s per GPU (default 312, A100)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def format_count(n: float) -> str:
    """A parameter count in the field's units, three significant digits: ``6.74B``, ``135M``,
    ``1.26k``, ``12``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def _format(result: dict) -> str:
    g = result["per_gpu_gib"]
    amount = (f"{result['max_steps']} steps x {result['global_batch_size']} examples"
              if result.get("max_steps") is not None else f"{result['examples']} examples x {result['epochs']:g} epochs")
    stage = f"ZeRO-{result['zero_stage']}" if result["zero_stage"] else "DDP (no DeepSpeed)"
    lines = [
        f"model {result['model']}: {format_count(result['params'])} parameters ({result['model_source']}), "
        f"{format_count(result['trainable_params'])} trainable",
        f"{result['gpus']} GPUs, {stage}{' + optimizer offload' if result['offload_optimizer'] else ''}, "
        f"batch {result['per_device_batch_size']} x {result['gradient_accumulation_steps']} x {result['gpus']} = "
        f"{result['global_batch_size']}, max_length {result['max_length']}, "
        f"bf16 {result['bf16']}, gradient checkpointing {result['gradient_checkpointing']}",
        "per-GPU memory (GiB):",
        *(f"  {k:<12}{g[k]:8.2f}" for k in ("weights", "gradients", "optimizer", "activations", "total")),
        f"  (model states {result['model_states_gib']:.2f} GiB; {result['accounting']})",
        f"ideal time: {result['ideal_hours']:.2f} h = 6 x {result['params']:.3g} params x {result['tokens']:.3g} tokens "
        f"/ ({result['gpus']} x {result['peak_tflops_per_gpu']:g} TFLOP/s x MFU {result['mfu']:g}); "
        f"{amount} x {result['mean_tokens_per_example']:g} tokens ({result['tokens_source']})",
    ]
    return "\n".join(lines)


def cli_plan(args) -> int:
    """Run ``ratune plan`` from parsed :func:`add_plan_arguments` arguments; prints text or JSON."""
    config = load_config(TrainConfig, args.config)
    result = plan(config, args.gpus, mfu=args.mfu, peak_tflops=args.peak_tflops, base_dir=_REPO_ROOT)
    print(json.dumps(result) if args.json else _format(result))
    return 0
