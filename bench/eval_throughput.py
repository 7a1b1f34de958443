"""Generation throughput: HF greedy at batch 1 vs the batched backend (and vLLM where it runs).

Usage:
    python bench/eval_throughput.py [--model PATH] [--apibench DIR] [--n 16] [--batch-size 8]
                                    [--max-new-tokens 48] [--threads N] [--device cpu|cuda] [--json]
    python bench/eval_throughput.py --prompts bfcl [--n 16] [--max-new-tokens 256] [--full-answers] ...
    python bench/eval_throughput.py --batch-sizes 8 16 32 [--prompts bfcl] ...   # batched runs only
    python bench/eval_throughput.py --decode-chunks 16 32 [--prompts bfcl] ...   # decoding variants

``--decode-chunks 16 32`` runs the batched backend (prefill each) on the same prompts with one
``generate`` call per batch and whole prompts (the reference), with the prompts' shared prefix
prefilled once, and with chunked decoding at each size (finished rows leave the batch between
chunks) plus the shared prefix, side by side: seconds, the speed-up over the reference and the
answers equal to its.

``--batch-sizes`` runs the batched backend (the device's default prefill) once per size on the same
prompts, side by side, with each size's ratio to the first and the answers that equal the first
size's; no batch-1 run, no vLLM, no prefill/decode split.

Takes the first ``--n`` TorchHub eval questions and renders them with
:func:`ratune.sources.prompt.render_user_turn` / :func:`ratune.sources.prompt.encode_prompt`,
alternating the oracle setting (even positions: the gold document) and 0-shot (odd positions), so
prompts of very different lengths are mixed. The HF runs go through the project's own backend,
:func:`ratune.eval.generate.generate_batches` (prompts sorted by length, left padding, greedy, stop
at EOS), once with ``batch_size=1`` and twice with ``--batch-size``: with the device's default
prefill (``"each"`` on CPU: every prompt alone, then the batch decodes together) and with the
other one (``"padded"`` on CPU), side by side in one process after a short warm-up, on the demo
model (SmolLM2-135M-Instruct) unless ``--model`` is given.

``--prompts bfcl`` measures ``ratune eval bfcl``'s generation instead: the first entries of BFCL's
four Python non-live categories, taken in turn (simple_python, multiple, parallel,
parallel_multiple; ``--n`` in all), as :func:`ratune.sources.bfcl.encode_bfcl_prompt` encodes
them, with that command's stop rule (the ``python_calls`` answer's closing bracket) unless
``--full-answers``. Every run also reports ``prompts_per_s``.

Generated tokens are counted from the output ids of every ``generate`` call (recorded by a thin
wrapper around the model): per sequence, the tokens after the prompt up to and including the
first EOS; the padding (= EOS for SmolLM2) that fills a finished sequence while the rest of its
batch runs on is not counted. Throughput = generated tokens / wall seconds of the whole run
(prefill included). ``answers_identical`` counts prompts whose batch-1 and batched answers agree.

Where the vLLM backend runs (a supported ``vllm`` and a CUDA GPU), vLLM generates the same prompt
ids through ``ratune eval run --backend vllm``'s own path (eval/vllm_backend.py: eval's CUDA dtype,
bfloat16; greedy; stop at the HF backend's stop ids; at most ``--max-new-tokens`` within the
model's positions) and is reported too; otherwise it is reported as skipped with the backend's
reason. The HF rows load the model in float32 whatever the device (this bench's own setting).

With ``--json`` prints one object::

    {"batch1_tokens_per_s", "batched_tokens_per_s", "ratio",
     "batch1": RUN, "batched": RUN, "batched_other_prefill": RUN,
     "vllm": RUN | {"skipped": reason}, "vllm_vs_batched": r | None,
     "answers_identical", "n_prompts", "prompt_tokens": {"min", "max", "mean"},
     "settings": {"model", "prompts", "batch_size", "max_new_tokens", "stop_at_answer_end", "device"},
     "machine": {"platform", "processor", "cpu_count", "torch_threads", "torch", "transformers", "gpu"}}

where ``RUN`` is ``{"seconds", "generated_tokens", "tokens_per_s", "prompts_per_s"}`` (HF runs add
``"prefill_seconds"`` and ``"decode_tokens_per_s"`` unless ``--no-breakdown``: the same run
repeated with ``max_new_tokens=1`` measures the prompt processing, the rest is decoding; the
batched runs add ``"prefill"``, their mode, and ``batched_other_prefill`` its own
``"answers_identical"``) and ``ratio`` is batched / batch-1 tokens per second (prefill included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def count_generated(new_tokens: Sequence[int], eos_id: int | None) -> int:
    """Tokens a sequence really generated: up to and including its first EOS (all if none).

    ``new_tokens`` are the ids after the prompt; what follows the first EOS is padding added
    while other sequences of the batch were still running.
    """
    tokens = [int(t) for t in new_tokens]
    if eos_id is not None and eos_id in tokens:
        return tokens.index(eos_id) + 1
    return len(tokens)


class CountingModel:
    """Wraps a causal LM: forwards ``generate`` (moving inputs to the model's device) and counts
    the generated tokens of each call with :func:`count_generated`; forward calls (the per-prompt
    prefill of :func:`ratune.eval.generate.prefill_each`), ``device`` and ``config`` pass through."""

    def __init__(self, model, eos_id: int | None):
        self.model, self.eos_id, self.generated = model, eos_id, 0

    @property
    def device(self):
        """The wrapped model's device."""
        return self.model.device

    @property
    def config(self):
        """The wrapped model's config."""
        return self.model.config

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def eval(self):
        """Put the wrapped model in eval mode."""
        self.model.eval()
        return self

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """``model.generate`` on the model's device; adds the batch's generated tokens to ``generated``."""
        device = self.model.device
        out = self.model.generate(input_ids=input_ids.to(device),
                                  attention_mask=None if attention_mask is None else attention_mask.to(device),
                                  **kwargs).cpu()
        width = input_ids.shape[1]
        self.generated += sum(count_generated(row[width:].tolist(), self.eos_id) for row in out)
        return out


def _all_answers():
    """tests/all_answers.py, loaded by path: the generators' answers in prompt order."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tests" / "all_answers.py"
    spec = importlib.util.spec_from_file_location("ratune_all_answers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_hf(model, tokenizer, prompts: Sequence[list[int]], *, batch_size: int, max_new_tokens: int,
               prefill: str = "auto", stop: dict | None = None, options: dict | None = None) -> tuple[dict, list[str]]:
    """Run :func:`ratune.eval.generate.generate_batches` once (``prefill`` as there; ``stop``: its
    ``stop_after_api_call`` and ``answer_format`` arguments; ``options``: any other of its keyword
    arguments); returns ``(RUN, answers in prompt order)``."""
    generate_all = _all_answers().generate_all
    counting = CountingModel(model, tokenizer.eos_token_id)
    start = time.perf_counter()
    texts = generate_all(counting, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         prefill=prefill, **(stop or {}), **(options or {}))
    seconds = time.perf_counter() - start
    return _run_record(seconds, counting.generated, len(prompts)), texts


def _run_record(seconds: float, generated: int, n_prompts: int) -> dict:
    """``RUN`` of a timed generation."""
    return {"seconds": round(seconds, 3), "generated_tokens": generated,
            "tokens_per_s": round(generated / seconds, 2) if seconds else None,
            "prompts_per_s": round(n_prompts / seconds, 4) if seconds else None}


def decode_breakdown(model, tokenizer, prompts: Sequence[list[int]], full: dict, *, batch_size: int,
                     prefill: str = "auto", stop: dict | None = None) -> dict:
    """Split a run into prompt processing and decoding: the same run with ``max_new_tokens=1``
    takes ``prefill_seconds`` (prefill plus one token per prompt); the rest of ``full`` is decoding.

    Returns:
        ``{"prefill_seconds", "decode_tokens_per_s"}`` (the latter over the tokens after the first).
    """
    first, _ = measure_hf(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=1, prefill=prefill,
                          stop=stop)
    decode_s = full["seconds"] - first["seconds"]
    decode_tokens = full["generated_tokens"] - first["generated_tokens"]
    return {"prefill_seconds": first["seconds"],
            "decode_tokens_per_s": round(decode_tokens / decode_s, 2) if decode_s > 0 else None}


class CountingLLM:
    """Wraps a ``vllm.LLM``: forwards ``generate`` and counts the generated tokens of each output
    with :func:`count_generated` (as :class:`CountingModel` counts HF's)."""

    def __init__(self, llm, eos_id: int | None):
        self.llm, self.eos_id, self.generated = llm, eos_id, 0

    def generate(self, prompts, sampling_params=None, **kwargs):
        """``llm.generate``; adds the outputs' generated tokens to ``generated``."""
        outputs = self.llm.generate(prompts, sampling_params, **kwargs)
        self.generated += sum(count_generated(o.outputs[0].token_ids, self.eos_id) for o in outputs)
        return outputs


def measure_vllm(model_path, tokenizer, prompts: Sequence[list[int]], *, max_new_tokens: int) -> dict:
    """vLLM on the same prompt ids, the way ``ratune eval run --backend vllm`` runs it
    (eval/vllm_backend.py): :func:`ratune.eval.vllm_backend.load_llm` (eval's CUDA dtype default,
    bfloat16; ``max_model_len`` = the model's positions, :func:`ratune.eval.run.checkpoint_max_positions`)
    and :func:`ratune.eval.vllm_backend.vllm_generate_batches` (greedy, stop at exactly
    :func:`ratune.eval.generate.stop_token_ids`, the length policy of
    :func:`ratune.eval.generate.generation_limits`), after a 4-token warm-up on the first prompt.

    Returns:
        ``RUN``, or ``{"skipped": reason}`` where the backend refuses to run
        (:func:`ratune.eval.vllm_backend.require_vllm`: vllm missing or outside the supported
        releases, no CUDA GPU; the reason is its message).
    """
    from ratune.errors import RatuneError
    from ratune.eval.run import checkpoint_max_positions
    from ratune.train.layout import resolve_checkpoint
    from ratune.eval.vllm_backend import load_llm, require_vllm

    vllm_generate_all = _all_answers().vllm_generate_all

    try:
        require_vllm()
    except RatuneError as exc:
        return {"skipped": str(exc)}
    source = resolve_checkpoint(model_path)
    positions = checkpoint_max_positions(source)
    llm = CountingLLM(load_llm(source.folder, max_positions=positions), tokenizer.eos_token_id)
    vllm_generate_all(llm, tokenizer, prompts[:1], max_new_tokens=4, max_positions=positions)  # warm-up
    llm.generated = 0
    start = time.perf_counter()
    vllm_generate_all(llm, tokenizer, prompts, max_new_tokens=max_new_tokens, max_positions=positions)
    seconds = time.perf_counter() - start
    return _run_record(seconds, llm.generated, len(prompts))


def eval_prompts(tokenizer, apibench_dir, n: int) -> list[list[int]]:
    """The first ``n`` TorchHub eval questions as prompt ids: oracle at even positions, 0-shot at odd."""
    from ratune.sources.apibench import load_examples
    from ratune.sources.prompt import encode_prompt, render_user_turn
    from ratune.retrieval.retrievers import Query, make_retriever

    examples = load_examples(apibench_dir, "torchhub", "eval")[:n]
    oracle = make_retriever("oracle", hub="torchhub", apibench_dir=apibench_dir)
    docs = oracle.retrieve([Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples], top_k=1)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return [encode_prompt(tokenizer, render_user_turn(e.instruction, docs[i] if i % 2 == 0 else None,
                                                      max_document_tokens=None, count_tokens=count)[0])
            for i, e in enumerate(examples)]


#: The categories ``--prompts bfcl`` takes its prompts from, in turn.
BFCL_BENCH_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")


def bfcl_prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` BFCL prompts: entry 0 of each of :data:`BFCL_BENCH_CATEGORIES`, then entry 1, and so on."""
    from ratune.sources.bfcl import bfcl_data_dir, encode_bfcl_prompt, load_bfcl

    data = bfcl_data_dir()
    per_category = [load_bfcl(data, c)[:(n + len(BFCL_BENCH_CATEGORIES) - 1) // len(BFCL_BENCH_CATEGORIES)]
                    for c in BFCL_BENCH_CATEGORIES]
    entries = [e for row in zip(*per_category) for e in row][:n]
    return [encode_bfcl_prompt(tokenizer, e) for e in entries]


def machine_info() -> dict:
    """What the numbers were measured on."""
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gpu": gpu}


def run(*, model_path=None, apibench_dir=None, n: int = 16, batch_size: int = 8, max_new_tokens: int = 48,
        device: str | None = None, threads: int | None = None, breakdown: bool = True, prompt_set: str = "apibench",
        full_answers: bool = False) -> dict:
    """Measure batch 1, batched and (where possible) vLLM on the same prompts; returns the ``--json`` object."""
    from ratune.eval.generate import resolve_prefill

    model_path, device, tokenizer, model, prompts, stop = _loaded(model_path, apibench_dir, n, device, threads,
                                                                  prompt_set, full_answers)
    batch1, texts1 = measure_hf(model, tokenizer, prompts, batch_size=1, max_new_tokens=max_new_tokens, stop=stop)
    batched, texts_b = measure_hf(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                  stop=stop)
    batched["prefill"] = resolve_prefill("auto", device)
    other = "padded" if batched["prefill"] == "each" else "each"
    batched_other, texts_o = measure_hf(model, tokenizer, prompts, batch_size=batch_size,
                                        max_new_tokens=max_new_tokens, prefill=other, stop=stop)
    batched_other["prefill"] = other
    if breakdown:
        for run_, size, mode in ((batch1, 1, "auto"), (batched, batch_size, "auto"),
                                 (batched_other, batch_size, other)):
            run_.update(decode_breakdown(model, tokenizer, prompts, run_, batch_size=size, prefill=mode, stop=stop))
    del model
    vllm = measure_vllm(model_path, tokenizer, prompts, max_new_tokens=max_new_tokens)
    ratio = batched["tokens_per_s"] / batch1["tokens_per_s"] if batch1["tokens_per_s"] else None
    vllm_ratio = (vllm["tokens_per_s"] / batched["tokens_per_s"]
                  if "tokens_per_s" in vllm and batched["tokens_per_s"] else None)
    lengths = [len(p) for p in prompts]
    return {"batch1_tokens_per_s": batch1["tokens_per_s"], "batched_tokens_per_s": batched["tokens_per_s"],
            "ratio": round(ratio, 3) if ratio else None, "batch1": batch1, "batched": batched, "vllm": vllm,
            "vllm_vs_batched": round(vllm_ratio, 3) if vllm_ratio else None,
            "answers_identical": sum(a == b for a, b in zip(texts1, texts_b)), "n_prompts": len(prompts),
            "batched_other_prefill": {**batched_other,
                                      "answers_identical": sum(a == b for a, b in zip(texts1, texts_o))},
            "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": round(sum(lengths) / len(lengths), 1)},
            "settings": {"model": str(model_path), "prompts": prompt_set, "batch_size": batch_size,
                         "max_new_tokens": max_new_tokens, "stop_at_answer_end": stop is not None, "device": device},
            "machine": machine_info()}


def compare_batch_sizes(*, model_path=None, apibench_dir=None, n: int = 16, batch_sizes: Sequence[int] = (8, 16),
                        max_new_tokens: int = 48, device: str | None = None, threads: int | None = None,
                        prompt_set: str = "apibench", full_answers: bool = False) -> dict:
    """The batched backend at each of ``batch_sizes`` on the same prompts; returns
    ``{"runs": [RUN + batch_size, ratio (to the first size), answers_identical (to the first)], "settings",
    "machine"}``."""
    model_path, device, tokenizer, model, prompts, stop = _loaded(model_path, apibench_dir, n, device, threads,
                                                                  prompt_set, full_answers)
    runs, first = [], None
    for size in batch_sizes:
        record, texts = measure_hf(model, tokenizer, prompts, batch_size=size, max_new_tokens=max_new_tokens,
                                   stop=stop)
        first = first or (record, texts)
        runs.append({"batch_size": size, **record,
                     "ratio": round(record["tokens_per_s"] / first[0]["tokens_per_s"], 3),
                     "answers_identical": sum(a == b for a, b in zip(first[1], texts))})
    return {"runs": runs, "n_prompts": len(prompts),
            "settings": {"model": str(model_path), "prompts": prompt_set, "max_new_tokens": max_new_tokens,
                         "stop_at_answer_end": stop is not None, "device": device},
            "machine": machine_info()}


def decoding_variants(chunks: Sequence[int]) -> dict[str, dict]:
    """``--decode-chunks``' runs by name: ``generate_batches`` options of each, the first the
    reference (one ``generate`` call per batch, every prompt prefilled whole)."""
    variants = {"one call, whole prompts": {"decode_chunk": None, "share_prefix": False},
                "one call, shared prefix": {"decode_chunk": None, "share_prefix": True}}
    for chunk in chunks:
        variants[f"chunks of {chunk}, shared prefix"] = {"decode_chunk": chunk, "share_prefix": True}
    return variants


def compare_decoding(*, model_path=None, apibench_dir=None, n: int = 16, batch_size: int = 8,
                     chunks: Sequence[int] = (32,), max_new_tokens: int = 48, device: str | None = None,
                     threads: int | None = None, prompt_set: str = "apibench", full_answers: bool = False) -> dict:
    """The batched backend (prefill each) on the same prompts under each of
    :func:`decoding_variants`; returns ``{"runs": [RUN + variant, options, ratio (to the first),
    answers_identical (to the first)], "n_prompts", "shared_prefix_tokens", "settings", "machine"}``."""
    from ratune.eval.generate import common_prefix_length

    model_path, device, tokenizer, model, prompts, stop = _loaded(model_path, apibench_dir, n, device, threads,
                                                                  prompt_set, full_answers)
    runs, first = [], None
    for name, options in decoding_variants(chunks).items():
        record, texts = measure_hf(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                   prefill="each", stop=stop, options=options)
        first = first or (record, texts)
        runs.append({"variant": name, "options": options, **record,
                     "ratio": round(first[0]["seconds"] / record["seconds"], 3),
                     "answers_identical": sum(a == b for a, b in zip(first[1], texts))})
    return {"runs": runs, "n_prompts": len(prompts), "shared_prefix_tokens": common_prefix_length(prompts),
            "settings": {"model": str(model_path), "prompts": prompt_set, "batch_size": batch_size,
                         "max_new_tokens": max_new_tokens, "stop_at_answer_end": stop is not None, "device": device},
            "machine": machine_info()}


def format_decoding(r: dict) -> str:
    """The ``--decode-chunks`` table."""
    s = r["settings"]
    lines = [f"{PROMPT_SETS[s['prompts']]}, {r['n_prompts']} prompts ({r['shared_prefix_tokens']} tokens shared), "
             f"batch {s['batch_size']}, {s['max_new_tokens']} new tokens, {s['device']}",
             "| decoding | seconds | tokens | prompts/s | speed-up | answers as the first |", "|---" * 6 + "|"]
    for run_ in r["runs"]:
        lines.append(f"| {run_['variant']} | {run_['seconds']:.1f} | {run_['generated_tokens']} | "
                     f"{run_['prompts_per_s']} | {run_['ratio']:.2f}x | {run_['answers_identical']}/{r['n_prompts']} |")
    return "\n".join(lines)


def _loaded(model_path, apibench_dir, n: int, device: str | None, threads: int | None, prompt_set: str,
            full_answers: bool) -> tuple:
    """``(model_path, device, tokenizer, model, prompts, stop)`` for a measurement, the model warmed up."""
    import torch

    from ratune.models import ensure_demo_model, load_model, load_tokenizer, set_torch_threads

    set_torch_threads(threads)
    model_path = model_path or ensure_demo_model()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path).to(device)
    prompts, stop = _prompts(tokenizer, prompt_set, n, apibench_dir, full_answers)
    measure_hf(model, tokenizer, prompts[:1], batch_size=1, max_new_tokens=4)  # warm-up
    return model_path, device, tokenizer, model, prompts, stop


def _prompts(tokenizer, prompt_set: str, n: int, apibench_dir, full_answers: bool) -> tuple[list, dict | None]:
    """``(prompt ids, stop arguments of generate_batches)`` of a ``--prompts`` set."""
    from ratune.sources.formats import PythonCallsFormat

    if prompt_set == "bfcl":
        stop = None if full_answers else {"stop_after_api_call": True, "answer_format": PythonCallsFormat.name}
        return bfcl_prompts(tokenizer, n), stop
    from ratune.sources.apibench import resolve_apibench_dir

    return eval_prompts(tokenizer, resolve_apibench_dir(apibench_dir), n), None


def format_batch_sizes(r: dict) -> str:
    """The ``--batch-sizes`` table."""
    lines = [f"{PROMPT_SETS[r['settings']['prompts']]}, {r['n_prompts']} prompts, "
             f"{r['settings']['max_new_tokens']} new tokens, {r['settings']['device']}",
             "| batch | seconds | tokens | tokens/s | prompts/s | ratio | answers as the first |", "|---" * 7 + "|"]
    for run_ in r["runs"]:
        lines.append(f"| {run_['batch_size']} | {run_['seconds']:.1f} | {run_['generated_tokens']} | "
                     f"{run_['tokens_per_s']} | {run_['prompts_per_s']} | {run_['ratio']:.2f}x | "
                     f"{run_['answers_identical']}/{r['n_prompts']} |")
    return "\n".join(lines)


#: ``--prompts`` choices and how the report names them.
PROMPT_SETS = {"apibench": "TorchHub eval (oracle/0-shot alternating)",
               "bfcl": "BFCL Python non-live (" + ", ".join(BFCL_BENCH_CATEGORIES) + " in turn)"}


def format_table(r: dict) -> str:
    """The readable report."""
    m, s = r["machine"], r["settings"]
    lines = [f"machine: {m['processor']}, {m['cpu_count']} CPUs, torch threads {m['torch_threads']}, "
             f"GPU {m['gpu'] or 'none'}; device {s['device']}",
             f"model {s['model']}; {r['n_prompts']} {PROMPT_SETS[s['prompts']]} prompts "
             f"({r['prompt_tokens']['min']}-{r['prompt_tokens']['max']} tokens), greedy, "
             f"max_new_tokens {s['max_new_tokens']}, stop at answer end: {'yes' if s['stop_at_answer_end'] else 'no'}",
             "",
             f"{'backend':<26} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'prompts/s':>9} {'prefill s':>9} "
             f"{'decode tok/s':>12}"]
    other = r["batched_other_prefill"]
    rows = [("HF batch 1", r["batch1"]), (f"HF batched ({s['batch_size']}, {r['batched']['prefill']})", r["batched"]),
            (f"HF batched ({s['batch_size']}, {other['prefill']})", other)]
    if "skipped" not in r["vllm"]:
        rows.append(("vLLM", r["vllm"]))
    for name, run_ in rows:
        prefill, decode = run_.get("prefill_seconds"), run_.get("decode_tokens_per_s")
        lines.append(f"{name:<26} {run_['seconds']:>8.2f} {run_['generated_tokens']:>7} {run_['tokens_per_s']:>9.2f} "
                     f"{run_['prompts_per_s']:>9.3f} "
                     f"{'-' if prefill is None else f'{prefill:.2f}':>9} {'-' if decode is None else f'{decode:.2f}':>12}")
    lines.append("")
    lines.append(f"batched / batch 1: {r['ratio']:.2f}x; answers identical: {r['answers_identical']}/{r['n_prompts']}")
    lines.append(f"batched with {other['prefill']} prefill / batch 1: {other['tokens_per_s'] / r['batch1']['tokens_per_s']:.2f}x; "
                 f"answers identical: {other['answers_identical']}/{r['n_prompts']}")
    if "skipped" in r["vllm"]:
        lines.append(f"vLLM: skipped ({r['vllm']['skipped']})")
    else:
        lines.append(f"vLLM / HF batched: {r['vllm_vs_batched']:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    from ratune.errors import RatuneError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: the converted demo model)")
    p.add_argument("--apibench", default=None)
    p.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="apibench", help="which prompts to generate for")
    p.add_argument("--full-answers", action="store_true", help="bfcl: no stop at the end of the call list")
    p.add_argument("--n", type=int, default=16, help="eval prompts")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help="compare the batched backend at these sizes only (no batch 1, vLLM or split)")
    p.add_argument("--decode-chunks", type=int, nargs="+", default=None,
                   help="compare one generate call per batch with chunked decoding at these chunk sizes "
                        "(batched, prefill each; no batch 1, vLLM or split)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the prefill/decode split (two shorter runs)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.batch_sizes:
            result = compare_batch_sizes(model_path=args.model, apibench_dir=args.apibench, n=args.n,
                                         batch_sizes=args.batch_sizes, max_new_tokens=args.max_new_tokens,
                                         device=args.device, threads=args.threads, prompt_set=args.prompts,
                                         full_answers=args.full_answers)
            print(json.dumps(result, indent=2) if args.json else format_batch_sizes(result))
            return 0
        if args.decode_chunks:
            result = compare_decoding(model_path=args.model, apibench_dir=args.apibench, n=args.n,
                                      batch_size=args.batch_size, chunks=args.decode_chunks,
                                      max_new_tokens=args.max_new_tokens, device=args.device, threads=args.threads,
                                      prompt_set=args.prompts, full_answers=args.full_answers)
            print(json.dumps(result, indent=2) if args.json else format_decoding(result))
            return 0
        result = run(model_path=args.model, apibench_dir=args.apibench, n=args.n, batch_size=args.batch_size,
                     max_new_tokens=args.max_new_tokens, device=args.device, threads=args.threads,
                     breakdown=not args.no_breakdown, prompt_set=args.prompts, full_answers=args.full_answers)
    except RatuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
