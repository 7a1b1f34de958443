"""The optional vLLM backend (eval/vllm_backend.py): a clear error where it cannot run, the same
prompt ids and greedy settings as the HF backend, and one shared answer cut, so HF (which stops at
the api_provider line) and vLLM (which runs on and is cut afterwards) store identical answers."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from ratune.errors import RatuneError

FULL = ("<<<domain>>>: Classification\n<<<api_call>>>: torch.hub.load('pytorch/vision', 'resnet18')\n"
        "<<<api_provider>>>: PyTorch\n<<<explanation>>>: Load the model.\n<<<code>>>: import torch\n")
STOPPED = FULL[:FULL.index("<<<explanation>>>")]  # where HF's stopping criterion fires: the line is complete
CUT = FULL[:FULL.index("\n<<<explanation>>>")]


def _without_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_missing_vllm_is_a_clear_error(monkeypatch, tmp_path):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.eval.vllm_backend import load_llm, require_vllm

    _without_vllm(monkeypatch)
    with pytest.raises(RatuneError, match=r"needs the vllm package, which is not installed: pip install -e '\.\[vllm\]'"):
        require_vllm()
    with pytest.raises(RatuneError, match="not installed"):
        load_llm(tmp_path)
    # eval run refuses before loading questions or writing any cell
    out = tmp_path / "eval"
    with pytest.raises(RatuneError, match="not installed"):
        evaluate_checkpoint(tmp_path / "no_checkpoint", hub="torchhub", apibench_dir=tmp_path, out_dir=out,
                            settings=EvalSettings(settings=["0_shot"], backend="vllm"), progress=False)
    assert not out.exists()
    with pytest.raises(RatuneError, match="unknown generation backend 'tgi'"):
        evaluate_checkpoint(tmp_path, hub="torchhub", apibench_dir=tmp_path, out_dir=out,
                            settings=EvalSettings(backend="tgi"), progress=False)


def test_no_cuda_is_a_clear_error(monkeypatch):
    import torch

    from ratune.eval.vllm_backend import require_vllm

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RatuneError, match="needs a CUDA GPU and none is available here.*backend: hf"):
        require_vllm()


def test_shared_cut_on_fixed_strings():
    """An answer stopped at the api_provider line (HF) and the same answer run on to the end (vLLM)
    are stored identically; without stop_after_api_call the whole answer is kept."""
    from ratune.eval.generate import finish_answer

    assert finish_answer(STOPPED, stop_after_api_call=True) == CUT
    assert finish_answer(FULL, stop_after_api_call=True) == CUT
    assert finish_answer(FULL + "more text that vLLM kept generating", stop_after_api_call=True) == CUT
    assert finish_answer(FULL, stop_after_api_call=False) == FULL.strip()
    # the line ends at a following marker on the same line too
    assert finish_answer("<<<api_provider>>>: PyTorch<<<explanation>>>: x", stop_after_api_call=True) == \
        "<<<api_provider>>>: PyTorch"
    # never completed (cut by max_new_tokens): kept as generated, by both
    partial = FULL[:FULL.index("PyTorch") + 3]
    assert finish_answer(partial, stop_after_api_call=True) == partial.strip()


def test_shared_decode_on_token_ids(smol_tokenizer):
    """The same cut from token ids: HF's stopped row (then EOS padding) and vLLM's full row (ending
    in EOS) decode to the same answer."""
    from ratune.eval.generate import decode_answer

    tok = smol_tokenizer
    full = tok(FULL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    stopped = tok(STOPPED, add_special_tokens=False)["input_ids"]
    hf_row = stopped + [tok.pad_token_id] * (len(full) - len(stopped))  # padded while the batch ran on
    assert decode_answer(tok, hf_row, stop_after_api_call=True) == CUT
    assert decode_answer(tok, full, stop_after_api_call=True) == CUT
    assert decode_answer(tok, full, stop_after_api_call=False) == FULL.strip()


def test_vllm_backend_passes_prompt_ids_and_greedy_settings(monkeypatch, smol_tokenizer):
    """With a stand-in vllm module: prompts go in as token ids, decoding is greedy with the HF
    limit and EOS, answers come back in prompt order through the shared cut."""
    from ratune.eval.vllm_backend import vllm_generate_all

    tok = smol_tokenizer
    fake = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    fake.SamplingParams = SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    answer = tok(FULL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    calls = []

    class LLM:
        def generate(self, inputs, params, use_tqdm=True):
            calls.append((inputs, params.kw))
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=answer[:len(x["prompt_token_ids"]) * 9])])
                    for x in inputs]

    prompts = [[1, 2, 3], [4] * 40, [5, 6]]
    texts = vllm_generate_all(LLM(), tok, prompts, max_new_tokens=17, stop_after_api_call=True, chunk_size=2)
    assert [c[0] for c in calls] == [[{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4] * 40}],
                                     [{"prompt_token_ids": [5, 6]}]]
    assert calls[0][1] == {"temperature": 0.0, "max_tokens": 17, "stop_token_ids": [tok.eos_token_id],
                           "skip_special_tokens": True}
    expect = [tok.decode(answer[:n * 9], skip_special_tokens=True).strip() for n in (3, 40, 2)]
    assert texts[1] == CUT  # the long prompt got the whole answer: cut at the api_provider line
    assert texts[0] == expect[0] and texts[2] == expect[2]  # short ones never completed the line: kept
