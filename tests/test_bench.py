"""Tests of the bench scripts (bench/token_efficiency.py, eval_throughput.py, train_throughput.py,
score_released.py, retrieval_scale.py and the GPU scripts' CPU paths): their arithmetic, and
runs end to end on tiny models or the real released files.

The scripts are not part of the ``ratune`` package; they are loaded from their files. Nothing here
times anything: throughput targets are checked by running the benches, not by tests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from test_vllm_backend import FULL, FakeLLM, _fake_vllm, _without_vllm

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def te():
    return _load("token_efficiency")


@pytest.fixture(scope="module")
def et():
    return _load("eval_throughput")


def test_padding_arithmetic_by_hand(te):
    lengths, loss = [2, 4, 6, 8], [1, 2, 1, 3]
    # every row padded to 8: 20 real of 32
    assert te.padded_to_max_length(lengths, 8) == 32
    # batches (2, 4) -> 2*4 and (6, 8) -> 2*8: 24 processed
    assert te.padded_per_batch(lengths, [0, 1, 2, 3], 2) == (24, 2)
    # (8, 2) -> 16 and (4, 6) -> 12: 28 processed; a short last batch counts its own rows only
    assert te.padded_per_batch(lengths, [3, 0, 1, 2], 2) == (28, 2)
    assert te.padded_per_batch(lengths, [0, 1, 2], 2) == (8 + 6, 2)
    r = te.strategy_result(32, lengths, loss, 2)
    assert r["real_token_share"] == pytest.approx(20 / 32)
    assert r["loss_token_share"] == pytest.approx(7 / 32)
    with pytest.raises(ValueError):
        te.padded_to_max_length([9], 8)


def test_packing_keeps_rows_whole_within_max_length(te):
    lengths = [2, 4, 6, 8]
    bins = te.pack_bins(lengths, 8)
    # best-fit decreasing: [8], [6, 2], [4]
    assert sorted(sorted(lengths[i] for i in b) for b in bins) == [[2, 6], [4], [8]]
    lengths = [5, 3, 7, 1, 4, 4, 2, 6, 8, 3]
    bins = te.pack_bins(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # each row once, whole
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 5  # 43 tokens: at least 5 bins of 10, and BFD reaches it here
    with pytest.raises(ValueError):
        te.pack_bins([11], 10)


def test_efficiency_all_strategies(te):
    lengths, loss = [2, 4, 6, 8], [1, 1, 1, 1]
    out = te.efficiency(lengths, loss, max_length=8, batch_size=2, seed=0)
    assert set(out) == set(te.STRATEGIES)
    assert out["max_length"]["real_token_share"] == pytest.approx(20 / 32)
    assert out["packing"]["real_token_share"] == pytest.approx(20 / 24)  # 3 bins of 8
    assert out["packing"]["batches"] == 3
    assert out["packing_padding_free"]["real_token_share"] == pytest.approx(1.0)
    for r in out.values():
        assert r["real_tokens"] == 20 and r["loss_tokens"] == 4
        assert 0 < r["loss_token_share"] <= r["real_token_share"] <= 1
    # per-batch padding never beats max_length padding by losing tokens, and never exceeds 100 %
    assert out["per_batch"]["processed_tokens"] >= 20
    assert out["length_grouped"]["processed_tokens"] >= 20


def test_length_grouped_order_is_a_seeded_permutation(te):
    lengths = list(range(1, 101))
    order = te.length_grouped_order(lengths, 4, seed=1)
    assert sorted(order) == list(range(100))
    assert order == te.length_grouped_order(lengths, 4, seed=1)
    # grouped batches waste less than a random order on widely spread lengths
    grouped, _ = te.padded_per_batch(lengths, order, 4)
    shuffled, _ = te.padded_per_batch(lengths, te.random_order(100, 1), 4)
    assert grouped < shuffled


def test_count_generated_excludes_padding_after_eos(et):
    eos = 2
    assert et.count_generated([5, 6, 7], eos) == 3  # ran to the limit
    assert et.count_generated([5, eos, eos, eos], eos) == 2  # EOS counted once, padding not
    assert et.count_generated([eos, eos], eos) == 1
    assert et.count_generated([5, 6], None) == 2


def test_hf_measurement_counts_only_generated_tokens(et, tiny_model_dir):
    import torch

    from ratune.sources.prompt import encode_prompt
    from ratune.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    prompts = [encode_prompt(tokenizer, "hi"), encode_prompt(tokenizer, "a much longer question " * 20)]
    assert len(prompts[0]) < len(prompts[1])
    one, texts1 = et.measure_hf(model, tokenizer, prompts, batch_size=1, max_new_tokens=5)
    two, texts2 = et.measure_hf(model, tokenizer, prompts, batch_size=2, max_new_tokens=5)

    # the expected count, from the same greedy generation done one prompt at a time by hand
    expected = 0
    for ids in prompts:
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=5, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        expected += et.count_generated(out[0, len(ids):].tolist(), tokenizer.eos_token_id)
    assert one["generated_tokens"] == expected
    assert two["generated_tokens"] == expected  # left padding of the short prompt is not counted
    assert 0 < expected <= 2 * 5
    assert texts1 == texts2


def test_counting_model_ignores_padding_of_finished_rows(et):
    import inspect

    import torch
    from transformers import GenerationMixin

    calls = []

    class Fake:
        device = torch.device("cpu")

        def eval(self):
            return self

        def generate(self, *args, **kwargs):
            # bound to transformers' own generate: a positional argument it lacks fails here. Its
            # signature ends in **kwargs (model inputs such as input_ids), so keywords all bind.
            calls.append(inspect.signature(GenerationMixin.generate).bind(self, *args, **kwargs).arguments)
            new = torch.tensor([[7, 8, 9], [7, 2, 2]])  # row 2 finished at EOS (2), then padded with 2
            return torch.cat([kwargs["input_ids"], new], dim=1)

    counting = et.CountingModel(Fake(), eos_id=2)
    counting.generate(torch.tensor([[0, 1], [0, 1]]), max_new_tokens=3)
    assert counting.generated == 3 + 2
    # CountingModel passes the batch by keyword, with the caller's generation settings
    (call,) = calls
    assert set(call) == {"self", "kwargs"}  # nothing went to a named parameter of generate
    assert set(call["kwargs"]) == {"input_ids", "attention_mask", "max_new_tokens"}
    assert call["kwargs"]["attention_mask"] is None and call["kwargs"]["max_new_tokens"] == 3


@pytest.fixture(scope="module")
def gt():
    return _load("gpu_train")


def test_gpu_train_exits_0_without_a_gpu():
    """On a CPU-only machine (here: CUDA hidden) bench/gpu_train.py says so and exits 0."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for extra in ([], ["--json"]):
        proc = subprocess.run([sys.executable, str(BENCH / "gpu_train.py"), *extra], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout.strip()
        if extra:
            assert json.loads(out) == {"skipped": "no CUDA GPU on this machine: bench/gpu_train.py measures GPU "
                                                  "training throughput; nothing to do"}
        else:
            assert out.startswith("no CUDA GPU on this machine")


def test_mfu_arithmetic_by_hand(gt):
    # 7e9 params, 1e6 tokens in 100 s on one 989 TFLOP/s GPU: 6 x 7e9 x 1e4 tok/s = 4.2e14 FLOP/s
    assert gt.mfu(7e9, 1e6, 100.0, 989e12) == pytest.approx(4.2e14 / 989e12)  # 0.4247
    # the same tokens over 8 GPUs: each does an eighth of the work
    assert gt.mfu(7e9, 1e6, 100.0, 989e12, n_gpus=8) == pytest.approx(4.2e14 / 989e12 / 8)
    # attention term, LLaMA-7B at 640-token examples: 12 x 32 x 4096 x 640 = 1.00663296e9 FLOP/token
    extra = gt.attention_flops_per_token(32, 4096, 640)
    assert extra == 1_006_632_960
    assert gt.mfu(7e9, 1e6, 100.0, 989e12, extra_flops_per_token=extra) == \
        pytest.approx((42e9 + 1_006_632_960) * 1e4 / 989e12)
    # the 7B paper run's estimate: 39 M tokens at 50 % MFU on 8 H100s take 6 x 6.7e9 x 39e6 / (0.5 x 8 x 989e12) = 396 s
    seconds = 6 * 6.7e9 * 39e6 / (0.5 * 8 * 989e12)
    assert gt.mfu(6.7e9, 39e6, seconds, 989e12, n_gpus=8) == pytest.approx(0.5)
    assert 6 < seconds / 60 < 7
    with pytest.raises(ValueError):
        gt.mfu(1, 1, 0.0, 1.0)
    # the peak table: the specific variant wins over the family name
    assert gt.peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert gt.peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert gt.peak_tflops_for("NVIDIA H100 NVL") == 835.0
    assert gt.peak_tflops_for("NVIDIA H200") == 989.0
    assert gt.peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert gt.peak_tflops_for("NVIDIA L40S") == 362.0 and gt.peak_tflops_for("NVIDIA L4") == 121.0
    assert gt.peak_tflops_for("Some Future GPU") is None and gt.peak_tflops_for(None) is None


def test_matmul_params_by_hand(gt):
    """Tiny Llama, hidden 8, MLP 16, 1 layer, 2 heads, 1 KV head (head dim 4), vocab 10."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def model(tied):
        return LlamaForCausalLM(LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1,
                                            tie_word_embeddings=tied))

    # layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; MLP 3 x 8x16 = 384; 2 norms 16; final norm 8
    body = 192 + 384 + 16 + 8
    assert gt.matmul_params(model(False)) == body + 80  # untied head 10x8 counted, input table not
    assert gt.matmul_params(model(True)) == body + 80  # tied: the one table counted once, as the head


def test_gpu_train_loop_runs_on_cpu_for_tests(gt, tiny_model_dir):
    """The measuring loop itself (packed position_ids, backward, AdamW) on the tiny model on CPU."""
    r = gt.run(model_name=str(tiny_model_dir), steps=2, warmup=1, micro_batch=2, seq_len=32, doc_len=16,
               peak_tflops=1.0, device="cpu")
    assert r["tokens_per_step"] == 64 and r["steps"] == 2 and len(r["step_seconds"]) == 2
    # "seconds" is rounded to 3 decimals and the tiny run takes a few ms, so each figure is checked against
    # the range the unrounded seconds allow (plus its own rounding), not against a fixed tolerance.
    lo, hi = r["seconds"] - 0.0005, r["seconds"] + 0.0005

    def between(value, per_second, rounding):
        assert per_second / hi - rounding <= value <= per_second / lo + rounding

    between(r["tokens_per_s_per_gpu"], 128, 0.05)  # 1 decimal
    between(r["mfu"], 6 * r["matmul_params"] * 128 / 1e12, 5e-5)  # 4 decimals
    extra = 12 * 2 * 32 * 16  # layers 2, hidden 32, doc_len 16
    between(r["mfu_with_attention"], (6 * r["matmul_params"] + extra) * 128 / 1e12, 5e-5)
    assert r["loss_first"] > 0


def test_gpu_run_plan_exits_0_without_a_gpu():
    """bench/gpu_run_plan.sh on a CPU-only machine (CUDA hidden): says so, runs nothing, exits 0."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(BENCH / "gpu_run_plan.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ("no CUDA GPU on this machine: bench/gpu_run_plan.sh measures GPU throughput; "
                                   "nothing to do")


def test_retrieval_scale_catalog_and_backends_agree(apibench):
    rs = _load("retrieval_scale")
    from ratune.sources.apibench import api_database_path, load_api_database
    from ratune.sources.prompt import serialize_document

    real = load_api_database(api_database_path(apibench, "torchhub"))
    catalog = rs.synthetic_catalog(real, 3 * len(real), seed=0)
    assert len(catalog) == 3 * len(real)
    assert catalog == rs.synthetic_catalog(real, 3 * len(real), seed=0)  # deterministic
    assert len({serialize_document(d) for d in catalog}) == len(catalog)  # no two index the same text
    assert catalog[len(real)]["api_name"] == real[0]["api_name"] + "-v1"
    out = rs.run(apibench, apis=500, queries=30, seed=0)
    assert out["catalog"] == {"apis": 500, "from_real_documents": out["catalog"]["from_real_documents"],
                              "queries": 30, "seed": 0}
    assert out["top10_identical"] == 30
    assert set(out["speedup"]) == {"index", "queries"} and out["bm25s"]["queries_per_second"] > 0


def test_eval_throughput_reports_both_prefill_modes(et, apibench, tiny_model_dir):
    """One run of the bench on the tiny model: batch 1, batched with the CPU default (each prompt
    prefilled alone) and batched with a padded prefill, all with the same answers and tokens."""
    r = et.run(model_path=tiny_model_dir, apibench_dir=apibench, n=4, batch_size=2, max_new_tokens=6,
               device="cpu", threads=1, breakdown=False)
    assert r["batched"]["prefill"] == "each"
    assert r["batched_other_prefill"]["prefill"] == "padded"
    assert r["answers_identical"] == 4 and r["batched_other_prefill"]["answers_identical"] == 4
    tokens = r["batch1"]["generated_tokens"]
    assert 0 < tokens <= 4 * 6
    assert r["batched"]["generated_tokens"] == r["batched_other_prefill"]["generated_tokens"] == tokens
    assert r["ratio"] == pytest.approx(r["batched_tokens_per_s"] / r["batch1_tokens_per_s"], rel=1e-3)
    table = et.format_table(r)
    assert "HF batched (2, each)" in table and "HF batched (2, padded)" in table


@pytest.mark.bfcl
def test_eval_throughput_on_bfcl_prompts(et, tiny_model_dir, smol_tokenizer):
    """``--prompts bfcl``: the first entries of the four Python non-live categories in turn, encoded
    as ``ratune eval bfcl`` encodes them, generated with its stop rule; prompts per second reported."""
    from ratune.sources.bfcl import bfcl_data_dir, encode_bfcl_prompt, load_bfcl

    prompts = et.bfcl_prompts(smol_tokenizer, 6)
    data = bfcl_data_dir()
    first = {c: load_bfcl(data, c)[:2] for c in et.BFCL_BENCH_CATEGORIES}
    order = [first["simple_python"][0], first["multiple"][0], first["parallel"][0], first["parallel_multiple"][0],
             first["simple_python"][1], first["multiple"][1]]
    assert prompts == [encode_bfcl_prompt(smol_tokenizer, e) for e in order]
    r = et.run(model_path=tiny_model_dir, n=4, batch_size=2, max_new_tokens=4, device="cpu", threads=1,
               breakdown=False, prompt_set="bfcl")
    assert r["settings"]["prompts"] == "bfcl" and r["settings"]["stop_at_answer_end"] is True
    # ``seconds`` is rounded to the millisecond, ``prompts_per_s`` to 1e-4 from the unrounded time
    seconds, per_s = r["batch1"]["seconds"], r["batch1"]["prompts_per_s"]
    assert 4 / (seconds + 5e-4) - 1e-4 <= per_s <= 4 / max(seconds - 5e-4, 1e-9) + 1e-4
    assert r["answers_identical"] == 4
    assert "BFCL Python non-live" in et.format_table(r)


def test_eval_throughput_compares_batch_sizes_side_by_side(et, tiny_model_dir):
    """``--batch-sizes``: one batched run per size on the same prompts, each against the first."""
    r = et.compare_batch_sizes(model_path=tiny_model_dir, n=4, batch_sizes=[1, 2, 4], max_new_tokens=4,
                               device="cpu", threads=1, prompt_set="bfcl")
    assert [run["batch_size"] for run in r["runs"]] == [1, 2, 4]
    assert r["runs"][0]["ratio"] == 1.0
    for run in r["runs"]:
        assert run["answers_identical"] == 4
        assert run["ratio"] == pytest.approx(run["tokens_per_s"] / r["runs"][0]["tokens_per_s"], abs=1e-3)
    table = et.format_batch_sizes(r)
    assert table.count("\n| ") == 4 and "\n| 4 | " in table and "4/4 |" in table  # header and three sizes


def test_eval_throughput_compares_decoding_side_by_side(et, tiny_model_dir, smol_tokenizer):
    """``--decode-chunks``: the reference (one call, whole prompts), the shared prefix alone, and
    each chunk size with it, on the same BFCL prompts (which share BFCL's system-prompt opening)."""
    from ratune.eval.generate import common_prefix_length

    r = et.compare_decoding(model_path=tiny_model_dir, n=4, batch_size=4, chunks=[2, 3], max_new_tokens=5,
                            device="cpu", threads=1, prompt_set="bfcl")
    assert [run["variant"] for run in r["runs"]] == ["one call, whole prompts", "one call, shared prefix",
                                                    "chunks of 2, shared prefix", "chunks of 3, shared prefix"]
    assert r["runs"][2]["options"] == {"decode_chunk": 2, "share_prefix": True}
    assert r["shared_prefix_tokens"] == common_prefix_length(et.bfcl_prompts(smol_tokenizer, 4)) > 100
    assert r["runs"][0]["ratio"] == 1.0
    for run in r["runs"]:
        assert run["answers_identical"] == 4
        assert run["ratio"] == pytest.approx(r["runs"][0]["seconds"] / run["seconds"], abs=1e-2)
    table = et.format_decoding(r)
    assert table.count("\n| ") == 5 and "\n| chunks of 3, shared prefix | " in table and "4/4 |" in table


def test_measure_vllm_goes_through_the_eval_backend(monkeypatch, et, tiny_model_dir, smol_tokenizer):
    """``measure_vllm`` runs vLLM the way ``ratune eval run --backend vllm`` does: the engine in
    eval's CUDA dtype with max_model_len = the model's positions, greedy with exactly the HF
    backend's stop ids, and the shared length policy; vllm 0.30.0's stand-ins of
    tests/test_vllm_backend.py take the place of vllm."""
    from ratune.eval.generate import stop_token_ids

    tok = smol_tokenizer
    _fake_vllm(monkeypatch)
    answer = tok(FULL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    monkeypatch.setattr(FakeLLM, "answer", answer)
    prompts = [[1, 2, 3], [4] * 40]
    r = et.measure_vllm(tiny_model_dir, tok, prompts, max_new_tokens=2040)

    (llm,) = FakeLLM.made
    assert (llm.model, llm.dtype, llm.max_model_len, llm.generation_config) == (
        str(tiny_model_dir), "bfloat16", 2048, "vllm")  # eval's CUDA dtype, the model's positions
    warm, timed = llm.calls
    assert [x["prompt_token_ids"] for x in warm[0]] == [[1, 2, 3]] and warm[1][0].max_tokens == 4
    assert [x["prompt_token_ids"] for x in timed[0]] == prompts and timed[2] is False
    for params in timed[1]:
        assert (params.temperature, params.stop_token_ids, params.ignore_eos, params.skip_special_tokens) == (
            0.0, stop_token_ids(tok), True, True)
    # the length policy of both backends: prompt plus answer within the 2048 positions
    assert [p.max_tokens for p in timed[1]] == [2040, 2048 - 40]
    # tokens counted as for HF: up to and including the first EOS, the warm-up left out
    assert r["generated_tokens"] == 3 * 9 + len(answer) and r["tokens_per_s"] > 0


def test_measure_vllm_is_skipped_with_the_backends_reason(monkeypatch, et, tiny_model_dir, smol_tokenizer):
    """Where the vLLM backend refuses to run, ``measure_vllm`` is skipped with the backend's own reason."""
    _without_vllm(monkeypatch)
    r = et.measure_vllm(tiny_model_dir, smol_tokenizer, [[1, 2, 3]], max_new_tokens=8)
    assert list(r) == ["skipped"]
    assert r["skipped"].startswith("the vLLM backend needs the vllm package, which is not installed: pip install")


def test_gpu_smoke_dry_run_runs_every_stage_on_cpu(tmp_path):
    """bench/gpu_smoke.py --dry-run: every stage of the GPU smoke run on toy shapes on the CPU,
    ratune's own training process included, so the script cannot rot before a GPU runs it; and
    without --dry-run on a CPU-only machine it says so and exits 0."""
    import json
    import os
    import subprocess
    import sys

    gs = _load("gpu_smoke")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_smoke.py"), "--out", str(tmp_path / "gpu")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("no CUDA GPU on this machine"), proc.stderr[-2000:]
    assert not (tmp_path / "gpu" / "gpu_smoke.json").exists()

    proc = subprocess.run([sys.executable, str(BENCH / "gpu_smoke.py"), "--dry-run", "--out", str(tmp_path / "dry")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "dry" / "gpu_smoke.json").read_text())
    stages = report["stages"]
    assert report["dry_run"] is True and report["device"] == "cpu" and set(stages) == set(gs.STAGES)
    assert not [name for name, r in stages.items() if "failed" in r or "skipped" in r], stages
    plan = gs.PLANS["dry"]
    tokens = plan["rows_per_step"] * plan["row_tokens"]  # one padding-free micro-batch: 2 rows of 400 tokens
    for kind in ("1b", "7b_full", "7b_lora"):
        ratune, loop = stages[f"train_{kind}_ratune"], stages[f"train_{kind}_loop"]
        warmup, steps = plan["steps"]["1b" if kind == "1b" else "7b"]
        assert ratune["tokens_per_step"] == loop["tokens_per_step"] == tokens
        assert ratune["steps"] == loop["steps"] == steps and len(ratune["step_seconds"]) == steps
        assert ratune["tokens_per_s"] == pytest.approx(tokens * steps / sum(ratune["step_seconds"]), rel=0.01)
        assert ratune["matmul_params"] == loop["matmul_params"] > 0 and loop["tokens_per_s"] > 0
        assert ratune["flops_per_param"] == loop["flops_per_param"] == (4.0 if kind == "7b_lora" else 6.0)
        assert ratune["stopped_after_timed_steps"] is (kind != "1b")
    # the 1B run ran to its end: model/ saved and checked (bit for bit, logits on the same device)
    (check,) = stages["train_1b_ratune"]["save_checks"]
    assert check["folder"] == "model" and check["max_abs_logit_diff"] <= check["tolerance"]
    assert stages["train_1b_ratune"]["device"]["type"] == "cpu"
    generate = stages["generate"]
    assert (generate["device"], generate["dtype"], generate["model"]) == ("cpu", "float32", plan["big"])
    assert set(generate["batches"]) == {str(b) for b in plan["gen_batches"]}
    for b, r in generate["batches"].items():
        assert r["loop"]["generated_tokens"] == r["prompts"] * plan["max_new_tokens"]
        assert 0 < r["ratune"]["generated_tokens"] <= r["loop"]["generated_tokens"]  # ratune stops at EOS
    table = gs.format_table(report)
    assert "DRY RUN" in table and "hand loop (ceiling)" in table and "save checks of the 1B run" in table
    assert table.splitlines()[0] in proc.stdout


def test_train_throughput_side_by_side_on_a_tiny_model(apibench_tiny, tiny_model_dir, capsys):
    """bench/train_throughput.py end to end with a tiny model: each candidate is a real training run
    of the same examples; without LoRA dropout, batch 2 keeps the batch-1 loss within the packing
    tests' tolerance, and the summary's speedup and best are derived from the candidates' numbers."""
    import json

    tt = _load("train_throughput")
    assert tt.main(["--apibench", str(apibench_tiny), "--model", str(tiny_model_dir), "--steps", "2",
                    "--threads", "1", "--candidates", "baseline,dropout0,dropout0_batch2", "--profile",
                    "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    candidates = out["candidates"]
    assert set(candidates) == {"baseline", "dropout0", "dropout0_batch2"}
    assert out["model"] == str(tiny_model_dir) and out["steps"] == 2
    for name, r in candidates.items():
        assert len(r["losses"]) == 2 and r["tokens"] > 0 and r["tokens_per_s"] > 0, name
    assert candidates["baseline"]["settings"]["lora_dropout"] == 0.05
    assert candidates["dropout0_batch2"]["settings"]["per_device_batch_size"] == 2
    assert candidates["dropout0_batch2"]["reference"] == "dropout0"
    assert candidates["dropout0"]["reference"] == "baseline"  # a change of recipe, compared with the baseline
    assert {n for n, r in candidates.items() if r["changes_recipe"]} == {"dropout0", "dropout0_batch2"}
    # the same 16 examples either way: the same real-token count, and the same loss without dropout
    assert candidates["dropout0_batch2"]["tokens"] == candidates["dropout0"]["tokens"] == candidates["baseline"]["tokens"]
    assert candidates["dropout0_batch2"]["loss_max_abs_diff"] <= tt.LOSS_TOLERANCE
    assert candidates["dropout0_batch2"]["keeps_loss"] is True
    assert candidates["baseline"]["loss_max_abs_diff"] == 0 and candidates["baseline"]["speedup"] == 1.0
    # the only candidate with the baseline's recipe is the baseline: it is the best, at 1.0x
    assert out["best"] == "baseline" and out["speedup"] == 1.0 and out["loss_max_abs_diff"] == 0
    change = out["best_recipe_change"]
    assert change["name"] == max(("dropout0", "dropout0_batch2"), key=lambda n: candidates[n]["tokens_per_s"])
    assert change["speedup"] == candidates[change["name"]]["tokens_per_s"] / out["baseline_tokens_per_s"]
    assert out["matmul_gflops"] > 0
    assert "micro-batch 1 (" in out["profile"] and "micro-batch 8 (" in out["profile"]


def test_train_throughput_judge_by_hand():
    """judge(): a change of batching under the baseline's recipe counts only when it keeps the
    baseline's loss; LoRA dropout 0 is judged against the baseline (it drops the dropout noise, so
    its loss moves) and the dropout0_* candidates against dropout0; numbers worked out by hand."""
    tt = _load("train_throughput")
    results = {"baseline": {"tokens_per_s": 100.0, "losses": [2.0, 1.5]},
               "batch2": {"tokens_per_s": 90.0, "losses": [2.0, 1.5000001]},      # slower, same loss
               "batch8": {"tokens_per_s": 150.0, "losses": [2.0004, 1.5]},        # faster, loss moved 4e-4
               "baseline_eager": {"tokens_per_s": 120.0, "losses": [2.000002, 1.5]},  # 1.2x, 2e-6 apart
               "dropout0": {"tokens_per_s": 140.0, "losses": [1.99, 1.49]},
               "dropout0_batch2": {"tokens_per_s": 160.0, "losses": [1.99, 1.490003]},
               "dropout0_batch8": {"tokens_per_s": 200.0, "losses": [1.9902, 1.49]}}  # 2e-4 from dropout0
    verdict = tt.judge(results)
    assert verdict["best"] == "baseline_eager"
    assert verdict["speedup"] == pytest.approx(1.2) and verdict["best_tokens_per_s"] == 120.0
    assert verdict["loss_max_abs_diff"] == pytest.approx(2e-6)
    assert verdict["best_recipe_change"] == {"name": "dropout0_batch2", "tokens_per_s": 160.0, "speedup": 1.6}
    assert results["batch8"]["keeps_loss"] is False and results["batch8"]["loss_max_abs_diff"] == pytest.approx(4e-4)
    assert results["dropout0"]["reference"] == "baseline" and results["dropout0"]["keeps_loss"] is False
    assert results["dropout0_batch8"]["reference"] == "dropout0" and results["dropout0_batch8"]["keeps_loss"] is False
    assert results["dropout0_batch2"]["loss_max_abs_diff"] == pytest.approx(3e-6)


def test_score_released_counts_the_released_torchhub_table(apibench, capsys):
    """bench/score_released.py scores all 24 released files; its TorchHub rows are the released
    Gorilla-7B counts of 186 questions (the reproduction's anchor table, scored by ratune)."""
    import json

    sr = _load("score_released")
    assert sr.main(["--apibench", str(apibench), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"]["files"] == 24 == len(out["files"])
    torchhub = {(f["mode"], f["setting"]): (f["gorilla"]["correct_n"], f["strict"]["correct_n"])
                for f in out["files"] if f["hub"] == "torchhub"}
    assert torchhub == {("FT", "0_shot"): (141, 18), ("FT", "bm25"): (83, 13), ("FT", "gpt_index"): (144, 17),
                        ("FT", "oracle"): (110, 144), ("RT", "0_shot"): (0, 0), ("RT", "bm25"): (93, 14),
                        ("RT", "gpt_index"): (143, 17), ("RT", "oracle"): (173, 182)}
    assert all(f["n"] == 186 for f in out["files"] if f["hub"] == "torchhub")


def test_behaviour_hashes_compare_by_hand():
    """A probe that changed, one only the new record has and one only the old has are named; a
    family that failed on one side is reported and fails the comparison."""
    bh = _load("behaviour_hashes")
    before = {"data/bm25_replica/train": "aa", "eval/0_shot": "bb", "scores/gone.jsonl": "cc"}
    after = {"data/bm25_replica/train": "aa", "eval/0_shot": "b2", "sweep_dry_run/new.yaml": "dd"}
    assert bh.compare(before, after) == ["eval/0_shot", "scores/gone.jsonl", "sweep_dry_run/new.yaml"]

    base = {"train/model.safetensors": "1" * 64, "train/manifest.json": "2" * 64, "help/ratune": "3" * 64}
    head = {**base, "train/manifest.json": "4" * 64}
    lines, same = bh.comparison(base, head, ("base", "head"))
    assert not same and "CHANGED train/manifest.json:\n    base 2222222222222222\n    head 4444444444444444" in lines
    assert "help              1 of 1    identical" in lines and "train             1 of 2    identical" in lines
    assert lines[-1] == "2 of 3 probes identical"
    assert bh.comparison(base, dict(base)) == (["help              1 of 1    identical",
                                                           "train             2 of 2    identical",
                                                           "3 of 3 probes identical"], True)
    missing = "missing: ratune catalog import: exit 2: ratune: error: argument stage: invalid choice: 'catalog'"
    lines, same = bh.comparison({**base, "catalog/folder/apis.jsonl": "5" * 64}, {**base, "catalog/FAILED": missing},
                                ("base", "head"))
    text = "\n".join(lines)
    assert not same and "catalog           0 of 2    identical" in text
    assert f"MISSING catalog/FAILED:\n    base missing\n    head {missing}" in text
    assert "MISSING catalog/folder/apis.jsonl:\n    base 5555555555555555\n    head missing" in text
    lines, same = bh.comparison({"help/FAILED": "failed: x"}, {"help/FAILED": "failed: x"})
    assert not same and "FAILED help/FAILED on both sides: failed: x" in lines


def test_behaviour_hashes_strip_volatile_by_hand():
    """Times, durations, rates, git, host and pid keys go at any depth, digests of JSON files
    become SHA256, paths become their placeholders (longest first); the rest is kept as it is."""
    bh = _load("behaviour_hashes")
    record = {
        "git_commit": "5ed16b9", "created_at": "2026-12-05", "host": {"cpu": "AMD EPYC"}, "pid": 12,
        "train_result": {"train_runtime": 2.4, "train_samples_per_second": 1.6, "train_loss": 14.49},
        "throughput": {"tokens": 993, "tokens_per_s": 407.1, "train_runtime_s": 2.4},
        "eval": [{"wall_s": 3.0, "seconds": 1, "n": 4}],
        "data_manifest_sha256": "a" * 64,
        "inputs": {"checkpoint ratune_manifest.json": "b" * 64, "eval.jsonl": "c" * 64},
        "sources": {"cells/x/metrics.json": "d" * 64},
        "config": {"output_dir": "/tmp/w/run/x", "model": "/tmp/w/tree/m", "max_steps": 2, "hosted": True},
        "versions": {"torch": "2.13.0+cpu"}, "steps": 2, "sha256": "e" * 64,
    }
    assert bh.strip_volatile(record, {"/tmp/w": "WORK", "/tmp/w/tree": "TREE"}) == {
        "train_result": {"train_loss": 14.49}, "throughput": {"tokens": 993}, "eval": [{"n": 4}],
        "data_manifest_sha256": "SHA256",
        "inputs": {"checkpoint ratune_manifest.json": "SHA256", "eval.jsonl": "c" * 64},
        "sources": {"cells/x/metrics.json": "SHA256"},
        "config": {"output_dir": "WORK/run/x", "model": "TREE/m", "max_steps": 2, "hosted": True},
        "versions": {"torch": "2.13.0+cpu"}, "steps": 2, "sha256": "e" * 64,
    }
    # printed text: the Trainer's summary line (a Python dict) loses its timings; paths are replaced
    text = "{'train_runtime': '1.8', 'train_loss': '14.49'}\nwrote /tmp/w/run\n{not a dict}"
    assert bh.strip_text(text, {"/tmp/w": "WORK"}) == '{"train_loss": "14.49"}\nwrote WORK/run\n{not a dict}'


def test_behaviour_hashes_missing_command_by_hand():
    """A command the CLI does not have (argparse: exit 2, invalid choice) is "missing"; any other
    failure is "failed"; both name the command and the last line of its error."""
    bh = _load("behaviour_hashes")
    exc = bh.ProbeFailed("ratune catalog import", 2, "ratune: error: argument stage: invalid choice: 'catalog' "
                                                     "(see ratune --help)\n")
    assert exc.missing and str(exc) == ("missing: ratune catalog import: exit 2: ratune: error: argument stage: "
                                        "invalid choice: 'catalog' (see ratune --help)")
    exc = bh.ProbeFailed("ratune train", 1, "Traceback ...\nKeyError: 'x'\n")
    assert not exc.missing and str(exc) == "failed: ratune train: exit 1: KeyError: 'x'"


def test_behaviour_hashes_shadow_package(tmp_path):
    """The shadow package maps ratune and each sub-package as the tree's pyproject.toml says and
    wins over the editable install on PYTHONPATH (also run in the tree root); a sub-package mapped apart from its parent
    (ratune.eval.scoring elsewhere) gets its own link without touching the tree."""
    bh = _load("behaviour_hashes")
    shadow = bh.build_shadow(bh.ROOT, tmp_path / "shadow")
    side = bh.Side("t", bh.ROOT, shadow, "")
    out = side.python(["-c", "import ratune.cli, ratune.data, ratune.sweep; print(ratune.data.__file__); "
                             "print(ratune.sweep.__file__)"], bh.ROOT, "import").decode().split()
    assert out == [str(shadow / "ratune" / "data" / "__init__.py"), str(shadow / "ratune" / "sweep" / "__init__.py")]

    tree = tmp_path / "tree"
    for folder in ("ratune", "eval", "scoring"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text(f"WHERE = {folder!r}\n")
    (tree / "eval" / "scoring").mkdir()
    (tree / "eval" / "scoring" / "__init__.py").write_text("WHERE = 'eval/scoring'\n")
    (tree / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = { "ratune" = "ratune", "ratune.eval" = '
                                         '"eval", "ratune.eval.scoring" = "scoring" }\n')
    shadow = bh.build_shadow(tree, tmp_path / "shadow2")
    side = bh.Side("t", tree, shadow, "")
    out = side.python(["-c", "import ratune, ratune.eval, ratune.eval.scoring as s; "
                             "print(ratune.WHERE, ratune.eval.WHERE, s.WHERE)"], tmp_path, "import").decode().split()
    assert out == ["ratune", "eval", "scoring"]
    assert (tree / "eval" / "scoring" / "__init__.py").read_text() == "WHERE = 'eval/scoring'\n"
    assert not (shadow / "ratune" / "eval").is_symlink() and (shadow / "ratune" / "eval" / "scoring").is_symlink()


@pytest.mark.slow
def test_behaviour_hashes_record_then_check(apibench_tiny, tiny_model_dir, tmp_path, capsys):
    """bench/behaviour_hashes.py --out with a tiny model records every probe family (5 data modes x
    2 splits, the 8 released TorchHub response files, 4 eval settings, one dry run per sweep file,
    the catalog, training, export, sweep report, compare and --help probes) and no failure; --check
    of some families on this machine is identical, and a record with one hash changed exits 1
    naming that probe."""
    import json

    bh = _load("behaviour_hashes")
    record = tmp_path / "before.json"
    common = ["--apibench", str(apibench_tiny), "--model", str(tiny_model_dir), "--n-questions", "2",
              "--work", str(tmp_path / "work")]
    assert bh.main([*common, "--out", str(record)]) == 0
    hashes = json.loads(record.read_text())
    sweeps = sorted(p.name for p in (bh.ROOT / "configs" / "sweeps").glob("*.yaml"))
    responses = sorted(p.name for p in (apibench_tiny / "responses").glob("response_torchhub_*.jsonl"))
    assert len(responses) == 8
    old = ({f"data/{m}/{s}" for m in bh.MODES for s in ("train", "eval")} | {"data/manifest.json"}
           | {f"scores/{f}" for f in responses} | {f"eval/{s}" for s in bh.EVAL_SETTINGS}
           | {f"eval/{s}/metrics.json" for s in bh.EVAL_SETTINGS} | {f"sweep_dry_run/{f}" for f in sweeps})
    assert old <= set(hashes) and not any(k.endswith("/FAILED") for k in hashes)
    for probe in ("catalog/folder/apis.jsonl", "catalog/folder/pairs/train.jsonl", "catalog/data/oracle/train",
                  "catalog/eval/0_shot/responses.jsonl", "catalog/eval/0_shot/metrics.json",
                  "train/model/model.safetensors", "train/adapter/adapter_model.safetensors", "train/manifest.json",
                  "export/model.safetensors", "export/README.md", "export/config.json",
                  "sweep/report/torchhub/table2.md", "sweep/report/torchhub/table2.json",
                  "report_eval/table2.csv", "compare/released_gorilla.txt", "compare/released_strict.json",
                  "help/ratune", "help/ratune data build", "help/ratune catalog import"):
        assert probe in hashes, probe
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in hashes.values())
    capsys.readouterr()
    only = ["--only", "help,compare,scores"]
    n = sum(k.split("/")[0] in ("help", "compare", "scores") for k in hashes)
    assert bh.main([*common, *only, "--check", str(record)]) == 0
    assert f"{n} of {n} probes identical" in capsys.readouterr().out
    hashes["compare/released_gorilla.txt"] = "0" * 64
    record.write_text(json.dumps(hashes))
    assert bh.main([*common, *only, "--check", str(record)]) == 1
    out = capsys.readouterr().out
    assert "CHANGED compare/released_gorilla.txt:" in out and f"{'0' * 16}\n" in out
    assert f"{n - 1} of {n} probes identical" in out


@pytest.mark.slow
def test_behaviour_hashes_against_head_is_identical(apibench_tiny, tmp_path, capsys):
    """--against HEAD --head HEAD --quick: two worktrees of one commit, each run through its own
    shadow package on the same inputs, give identical hashes for every probe of every family (the
    determinism check of every probe)."""
    bh = _load("behaviour_hashes")
    assert bh.main(["--against", "HEAD", "--head", "HEAD", "--quick", "--apibench", str(apibench_tiny),
                    "--n-questions", "2", "--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    families = [line.split()[0] for line in out.splitlines() if line.endswith(" identical") and " of " in line
                and not line.endswith("probes identical")]
    assert families == sorted([f for f, _ in bh.FAMILIES] + ["report_eval"])  # the sweep family reports twice
    assert "CHANGED" not in out and "MISSING" not in out and "FAILED" not in out
    total = out.split(" probes identical")[0].splitlines()[-1].split()
    assert total[0] == total[2] and int(total[0]) > 100


# ------------------------------------------------------------------ resume_soak


def test_resume_soak_compares_every_tensor(tmp_path):
    import torch
    from safetensors.torch import save_file

    soak = _load("resume_soak")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    save_file({"w": torch.ones(2), "v": torch.zeros(1)}, str(a / "model.safetensors"))
    save_file({"w": torch.ones(2), "v": torch.full((1,), 1e-7)}, str(b / "model.safetensors"))
    assert soak.compare_weights(a, a) == [] and soak.compare_weights(a, b) == ["v"]  # bit for bit, not close


@pytest.mark.slow
def test_resume_soak_survives_kills_to_identical_weights(tmp_path):
    """Two kills (one at a random moment, one inside a checkpoint's save), then the identical weights."""
    import json

    from conftest import real_apibench_or_skip

    soak = _load("resume_soak")
    out = tmp_path / "soak.json"
    assert soak.main(["--apibench", str(real_apibench_or_skip()), "--kills", "2", "--steps", "4",
                      "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["kills"], result["in_save"], result["restarts_failed"], result["identical"]) == (2, 1, 0, True)
    assert result["rounds"] >= 1 and result["rounds_identical"] == result["rounds"]


def test_house_figures_count_docstrings_comments_and_long_functions_by_hand(tmp_path, capsys):
    hf = _load("house_figures")
    module = tmp_path / "m.py"
    module.write_text('"""Module.\n\nSecond paragraph."""\n'   # lines 1-3: a 3-line docstring
                      "# a comment\n"                          # line 4
                      "def short():\n"                         # lines 5-7: 3 lines, 1 docstring line
                      '    """Short."""\n'
                      "    return 1  # trailing comment\n"
                      "\n"
                      "def long():\n"                          # lines 9-13: 5 lines
                      + "    x = 1\n" * 3 + "    return x\n")
    figures = hf.module_figures(module)
    assert figures["lines"] == 13
    assert figures["docstrings"] == 4
    assert figures["comments"] == 2
    assert sorted(figures["functions"]) == [("long", 9, 5), ("short", 5, 3)]
    assert {p.name for p in hf.package_dirs()} >= {"ratune", "train", "eval", "catalog"}
    hf.main(["--max-function", "1000", "--max-module", "100000"])
    out = capsys.readouterr().out
    assert "functions over 1000 lines: 0" in out and "modules over 100000 lines: 0" in out
