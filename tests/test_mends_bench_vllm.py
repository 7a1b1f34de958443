"""bench/eval_throughput.py ``measure_vllm`` runs vLLM the way ``ratune eval run --backend vllm``
does (eval/vllm_backend.py): the engine in eval's CUDA dtype with max_model_len = the model's
positions, greedy with exactly the HF backend's stop ids, and the shared length policy; and it is
skipped with the backend's own reason where the backend refuses to run.

vllm is not installed here: the stand-ins of tests/test_vllm_backend.py (vllm 0.30.0's
signatures) take its place.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from test_vllm_backend import FULL, FakeLLM, _fake_vllm, _without_vllm

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _eval_throughput():
    spec = importlib.util.spec_from_file_location("bench_eval_throughput", BENCH / "eval_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_vllm_goes_through_the_eval_backend(monkeypatch, tiny_model_dir, smol_tokenizer):
    from ratune.eval.generate import stop_token_ids

    et = _eval_throughput()
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


def test_measure_vllm_is_skipped_with_the_backends_reason(monkeypatch, tiny_model_dir, smol_tokenizer):
    et = _eval_throughput()
    _without_vllm(monkeypatch)
    r = et.measure_vllm(tiny_model_dir, smol_tokenizer, [[1, 2, 3]], max_new_tokens=8)
    assert list(r) == ["skipped"]
    assert r["skipped"].startswith("the vLLM backend needs the vllm package, which is not installed: pip install")
