"""CPU training speed of the demo model: real training tokens per second, side by side.

Usage:
    python bench/train_throughput.py [--apibench DIR] [--mode none] [--steps 4] [--threads 2]
                                     [--candidates baseline,batch8_padding_free,...] [--profile] [--json]
                                     [--model DIR]

Each candidate is a real ``ratune.train.sft.train`` run (TRL's SFTTrainer, LoRA r 16 on
SmolLM2-135M-Instruct, the demo's data build of TorchHub: max_length 768, documents cut to 128
tokens) of ``--steps`` optimizer steps of 8 examples each, the same seed and so the same examples
in the same order; only the way a step's 8 examples are batched and computed changes:

- ``baseline``: the demo's settings, per-device batch 1 x accumulation 8;
- ``batch2`` / ``batch4`` / ``batch8``: per-device batch 2, 4 or 8 (accumulation 4, 2, 1), padded;
- ``batch8_padding_free``: batch 8 flattened into one row without padding (TRL padding_free);
- ``baseline_eager``: the baseline with eager attention instead of sdpa;
- ``baseline_1thread``: the baseline on one thread;
- ``dropout0`` and ``dropout0_*``: LoRA dropout 0 (a change of recipe: no dropout noise on the
  adapter's input), alone and with the batchings above;
- ``*_ddp2``: two data-parallel processes of one thread each (``accelerate launch --config_file
  configs/accelerate/cpu_2proc_deepspeed.yaml``, plain DDP over gloo, no DeepSpeed JSON), per-device
  batch 1 x accumulation 4 x 2 processes: the 2 cores as two workers instead of one 2-thread one.

Tokens per second are TRL's non-padding tokens over the Trainer's train time (the run
manifest's ``throughput``), so padding is never counted as work. ``loss_max_abs_diff`` is the
largest difference between a candidate's logged step losses and its reference's: the baseline's,
or for the other ``dropout0_*`` candidates the ``dropout0`` run's (``dropout0`` itself is
compared with the baseline, whose dropout noise it lacks, so it never keeps the loss). A change of batching keeps the loss
(the token mean over the 8 examples either way) only without dropout: dropout draws its masks per
micro-batch, so under dropout 0.05 another batching is another random draw. A candidate "keeps
the loss" when the difference is within LOSS_TOLERANCE (tests/test_packing.py). The ceiling is
this machine's measured float32 matrix-multiply rate (``torch.mm`` of 2048 x 2048 matrices on the
same threads); ``model_gflops`` is ``6 x parameters x tokens/s`` (the usual training FLOP
estimate; a LoRA step computes less, so this overstates the work), for scale.

With ``--profile`` the baseline and ``batch8`` micro-batches are profiled once each (one
forward+backward through TRL's loss, torch.profiler) and the operators taking most CPU time are
printed, which says why a bigger micro-batch is or is not faster here.

``--model DIR`` trains another local model folder instead of the demo model (the tests use a tiny
one; the measured tables are the demo model's).

With ``--json`` prints one object: {"baseline_tokens_per_s", "best_tokens_per_s", "speedup",
"best", "best_settings", "best_recipe_change", "matmul_gflops", "loss_max_abs_diff" (the best's),
"model", "candidates": {NAME: {..., "reference", "changes_recipe", "keeps_loss"}}, "profile",
"machine", "versions"}; the best is the fastest candidate that keeps the baseline's recipe and loss
(:func:`judge`), and its speedup is over the baseline; ``best_recipe_change`` is the fastest
LoRA-dropout-0 candidate. Run it on an idle machine (two CPU-heavy jobs on 2 cores slow each other 5-20x).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent

#: Candidate name -> the TrainConfig fields it changes from the baseline (the demo's train section).
CANDIDATES = {
    "baseline": {},
    "batch2": {"per_device_batch_size": 2},
    "batch4": {"per_device_batch_size": 4},
    "batch8": {"per_device_batch_size": 8},
    "batch8_padding_free": {"per_device_batch_size": 8, "padding_free": True},
    "baseline_eager": {"attn_implementation": "eager"},
    "baseline_1thread": {"torch_threads": 1},
    "dropout0": {"lora": {"dropout": 0.0}},
    "dropout0_eager": {"lora": {"dropout": 0.0}, "attn_implementation": "eager"},
    "dropout0_batch2": {"lora": {"dropout": 0.0}, "per_device_batch_size": 2},
    "dropout0_batch8_padding_free": {"lora": {"dropout": 0.0}, "per_device_batch_size": 8, "padding_free": True},
    "baseline_ddp2": {"torch_threads": 1, "processes": 2},
    "dropout0_ddp2": {"lora": {"dropout": 0.0}, "torch_threads": 1, "processes": 2},
    "dropout0_eager_ddp2": {"lora": {"dropout": 0.0}, "attn_implementation": "eager", "torch_threads": 1,
                            "processes": 2},
}
#: The launcher config of the multi-process candidates (torchrun; plain DDP without a deepspeed JSON).
LAUNCH_CONFIG = ROOT / "configs" / "accelerate" / "cpu_2proc_deepspeed.yaml"
#: Candidates that change the recipe (LoRA dropout 0: no dropout noise), compared with the
#: ``dropout0`` run instead of the baseline. The others change only how a step is computed.
RECIPE = "dropout0"
#: Largest loss difference that counts as the same loss (tests/test_packing.py TOL).
LOSS_TOLERANCE = 1e-5


#: The demo's sweep file: its ``base`` is the baseline's training config, its ``data`` the data build.
DEMO_SWEEP = ROOT / "configs" / "demo.yaml"


@functools.lru_cache(maxsize=1)
def _demo_sweep():
    """configs/demo.yaml, read and validated once per run (every candidate starts from it)."""
    from ratune.sweep.schema import load_sweep

    return load_sweep(DEMO_SWEEP)


def demo_train_settings() -> dict:
    """The demo's training config (configs/demo.yaml ``base``, TrainConfig keys), the baseline every
    candidate starts from."""
    return copy.deepcopy(_demo_sweep().base)  # each candidate's own copy of the cached config


def demo_build_settings():
    """The demo's data build settings (configs/demo.yaml ``data``; ``max_length`` the training
    config's when the section gives none, as the sweep's data command does)."""
    from ratune.data.build import BUILD_OPTIONS, BuildSettings
    from ratune.options import config_values

    sweep = _demo_sweep()
    values = config_values(sweep.config.data, BUILD_OPTIONS)
    if values.get("max_length") is None:
        values["max_length"] = sweep.base["max_length"]
    return BuildSettings(**values)


def matmul_gflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` float32 ``torch.mm`` rate of two n x n matrices, in GFLOP/s (2 n^3 flops)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def build_data(apibench: str, mode: str, out: Path, model_path: Path) -> Path:
    """The demo's data build of one train-time mode (:func:`demo_build_settings`)."""
    from ratune.data.build import build_dataset
    from ratune.models import load_tokenizer

    build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=load_tokenizer(model_path),
                  tokenizer_name=str(model_path), modes=[mode], progress=False, settings=demo_build_settings())
    return out


def _config_dict(changes: dict, *, data: Path, model: str, mode: str, steps: int, threads: int,
                 output_dir: Path) -> dict:
    """The demo's training config with a candidate's changes (a nested dict updates its section)."""
    config = {**demo_train_settings(), "model": model, "data_dir": str(data), "train_retriever": mode,
              "hub": "torchhub", "output_dir": str(output_dir), "max_length": demo_build_settings().max_length,
              "torch_threads": threads, "max_steps": steps, "logging_steps": 1, "verify_saves": False}
    for key, value in changes.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    return config


def baseline_config(data: Path, mode: str, steps: int, threads: int, output_dir: Path, model: str):
    """The baseline candidate's TrainConfig (what --profile tokenizes)."""
    from ratune.train.config import TrainConfig

    return TrainConfig(**_config_dict({}, data=data, model=model, mode=mode, steps=steps,
                                      threads=threads, output_dir=output_dir))


def run_candidate(name: str, changes: dict, *, data: Path, model: str, mode: str, steps: int, threads: int,
                  work: Path) -> dict:
    """Train one candidate; returns its tokens/s, step losses and settings."""
    from ratune.io import read_json
    from ratune.train.config import TrainConfig
    from ratune.train.sft import train

    changes = dict(changes)
    processes = changes.pop("processes", 1)
    config = _config_dict(changes, data=data, model=model, mode=mode, steps=steps, threads=threads,
                          output_dir=work / name)
    cfg = TrainConfig(**config)
    if processes == 1:
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is the report
            train(cfg)
    else:
        launch(cfg, processes, work / f"{name}.yaml")
    manifest = read_json(work / name / "manifest.json")
    losses = [e["loss"] for e in read_json(work / name / "log_history.json") if "loss" in e]
    return {"tokens_per_s": manifest["throughput"]["tokens_per_s"], "tokens": manifest["throughput"]["tokens"],
            "train_runtime_s": manifest["throughput"]["train_runtime_s"], "losses": losses,
            "settings": {"per_device_batch_size": cfg.per_device_batch_size, "padding_free": cfg.padding_free,
                         "attn_implementation": cfg.attn_implementation, "torch_threads": cfg.torch_threads,
                         "lora_dropout": cfg.lora.dropout, "processes": processes}}


def launch(cfg, processes: int, config_file: Path) -> None:
    """Train ``cfg`` under ``accelerate launch`` with ``processes`` CPU processes (LAUNCH_CONFIG).

    Raises:
        RuntimeError: when the launch fails, with the tail of its output.
    """
    import shutil
    import subprocess

    import yaml

    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate if accelerate.exists() else shutil.which("accelerate")), "launch", "-q",
               "--config_file", str(LAUNCH_CONFIG), "--num_processes", str(processes),
               "-m", "ratune.train", "--config", str(config_file)]
    proc = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")


def profile_micro_batches(config, model_path: Path, threads: int, top: int = 12) -> str:
    """torch.profiler tables of one forward+backward of a batch-1 and a batch-8 micro-batch,
    computed as TRL's SFTTrainer computes them (its fused LM head: log-probabilities at the label
    positions only, never the whole vocabulary's logits), on the rows ratune trains on."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from ratune.models import load_tokenizer
    from ratune.train.preflight import load_training_rows

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_path)
    columns, _ = load_training_rows(config, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation="sdpa")
    add_fused_lm_head(model)
    lora = config.lora
    model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                             target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    out = []
    for batch in (1, 8):
        ids, labels = columns["input_ids"][:batch], columns["labels"][:batch]
        width = max(len(t) for t in ids)
        input_ids = torch.full((batch, width), tokenizer.pad_token_id or 0)
        label_ids = torch.full((batch, width), -100)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (t, lab) in enumerate(zip(ids, labels)):
            input_ids[i, :len(t)], label_ids[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), torch.tensor(lab), 1

        def step():
            outputs = model(input_ids=input_ids, attention_mask=mask, labels=label_ids, fused_lm_head=True,
                            use_cache=False)
            (-outputs.log_probs.sum() / outputs.label_mask.sum()).backward()

        step()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        out.append(f"### micro-batch {batch} ({batch} x {width} positions, {int(mask.sum())} real tokens)\n"
                   + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    return "\n".join(out)


def count_parameters(model_path: Path) -> int:
    """Parameters of the model (embedding counted once when tied)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())


def judge(results: dict[str, dict]) -> dict:
    """Compare each candidate with its reference and pick the best; sets, per candidate (in place),
    ``reference``, ``changes_recipe``, ``speedup`` (tokens/s over the baseline's),
    ``loss_max_abs_diff`` (largest difference of the logged step losses) and ``keeps_loss`` (that
    difference within LOSS_TOLERANCE).

    The reference is the baseline, except for the candidates that change the recipe on top of
    RECIPE (``dropout0_*``), whose reference is the RECIPE run; RECIPE itself is compared with the
    baseline and, having no dropout noise, does not keep its loss.

    Args:
        results: ``{name: {"tokens_per_s", "losses", ...}}`` with a ``baseline`` entry.
    Returns:
        ``{"baseline_tokens_per_s", "best", "best_tokens_per_s", "speedup", "loss_max_abs_diff",
        "best_recipe_change"}``: ``best`` is the fastest candidate that keeps the recipe and the
        baseline's loss (the issue's target: the same training, computed faster), so at worst the
        baseline itself; ``best_recipe_change`` (None without RECIPE) is the fastest RECIPE
        candidate that keeps RECIPE's loss, with its ``name``, ``tokens_per_s`` and ``speedup``.
    Raises:
        KeyError: no ``baseline`` in ``results``.
    """
    base = results["baseline"]
    for name, r in results.items():
        r["changes_recipe"] = name.startswith(RECIPE)
        r["reference"] = RECIPE if r["changes_recipe"] and name != RECIPE and RECIPE in results else "baseline"
        ref = results[r["reference"]]
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
        r["keeps_loss"] = r["loss_max_abs_diff"] <= LOSS_TOLERANCE
    same_recipe = [n for n, r in results.items() if not r["changes_recipe"] and r["keeps_loss"]]
    best = max(same_recipe, key=lambda n: results[n]["tokens_per_s"])
    recipe = [n for n, r in results.items() if r["changes_recipe"] and (n == RECIPE or r["keeps_loss"])]
    fastest = max(recipe, key=lambda n: results[n]["tokens_per_s"]) if recipe else None
    return {"baseline_tokens_per_s": base["tokens_per_s"], "best": best,
            "best_tokens_per_s": results[best]["tokens_per_s"], "speedup": results[best]["speedup"],
            "loss_max_abs_diff": results[best]["loss_max_abs_diff"],
            "best_recipe_change": None if fastest is None else {
                "name": fastest, "tokens_per_s": results[fastest]["tokens_per_s"],
                "speedup": results[fastest]["speedup"]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apibench", default=os.environ.get("RATUNE_APIBENCH", str(ROOT.parent / "shared" / "apibench")))
    p.add_argument("--mode", default="none", help="train-time mode of the demo data (default none)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per candidate (8 examples each)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the demo's 2)")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated subset of " + ", ".join(CANDIDATES))
    p.add_argument("--profile", action="store_true", help="also print torch.profiler tables of batch 1 and 8")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", default=None, help="a local model folder instead of the demo model (tests)")
    args = p.parse_args(argv)
    names = [n for n in args.candidates.split(",") if n]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown or "baseline" not in names:
        p.error(f"--candidates: unknown {unknown}; the baseline must be among them" if unknown
                else "--candidates must include baseline")

    from ratune.manifest import package_versions
    from ratune.noise import quiet_known_noise
    from ratune.models import DEMO_MODEL_ALIAS, ensure_demo_model, set_torch_threads

    quiet_known_noise()

    model_path = Path(args.model) if args.model else ensure_demo_model()
    model = str(model_path) if args.model else DEMO_MODEL_ALIAS
    ceiling = matmul_gflops(args.threads)
    params = count_parameters(model_path)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ratune-train-bench-") as tmp:
        work = Path(tmp)
        data = build_data(args.apibench, args.mode, work / "data", model_path)
        for name in names:
            print(f"[{name}] training {args.steps} steps ...", file=sys.stderr, flush=True)
            results[name] = run_candidate(name, CANDIDATES[name], data=data, model=model,
                                          mode=args.mode, steps=args.steps, threads=args.threads, work=work / "runs")
        profile = None
        if args.profile:
            profile = profile_micro_batches(baseline_config(data, args.mode, args.steps, args.threads, work / "p",
                                                            model=model), model_path, args.threads)
    set_torch_threads(args.threads)
    verdict = judge(results)
    for r in results.values():
        r["model_gflops"] = 6 * params * r["tokens_per_s"] / 1e9
    best = verdict["best"]
    summary = {**verdict, "best_settings": results[best]["settings"],
               "matmul_gflops": ceiling, "parameters": params,
               "loss_tolerance": LOSS_TOLERANCE, "steps": args.steps, "mode": args.mode, "threads": args.threads,
               "model": model,
               "candidates": results, "profile": profile,
               "machine": {"cpus": os.cpu_count(), "torch_threads": args.threads}, "versions": package_versions()}
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        print("| candidate | tokens/s | speedup | 6N x tokens/s (GFLOP/s) | loss max abs diff (vs) | keeps loss |")
        print("|---|---|---|---|---|---|")
        for name, r in results.items():
            print(f"| {name} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f} | {r['model_gflops']:.1f} | "
                  f"{r['loss_max_abs_diff']:.1e} ({r['reference']}) | {'yes' if r['keeps_loss'] else 'no'} |")
        print(f"\nfloat32 matmul ceiling: {ceiling:.1f} GFLOP/s on {args.threads} threads; fastest with the "
              f"baseline's recipe and loss: {best}, {summary['speedup']:.2f}x the baseline")
        if summary["best_recipe_change"]:
            change = summary["best_recipe_change"]
            print(f"fastest with LoRA dropout 0 (a change of recipe): {change['name']}, {change['speedup']:.2f}x")
        if profile:
            print("\n" + profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
