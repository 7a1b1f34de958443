"""The optional vLLM backend (eval/vllm_backend.py): a clear error where it cannot run, the same
prompt ids and greedy settings as the HF backend, and one shared answer cut, so HF (which stops at
the api_provider line) and vLLM (which runs on and is cut afterwards) store identical answers."""

from __future__ import annotations

import importlib.util
import re
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
    # an unknown backend is refused where the settings are made, before any eval work
    with pytest.raises(RatuneError, match=r"EvalSettings\.backend: Input should be 'hf' or 'vllm' \(got 'tgi'\)"):
        EvalSettings(backend="tgi")


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


#: The vllm release whose signatures the stand-ins below copy (vllm/entrypoints/llm.py LLM.__init__ and
#: LLM.generate, vllm/sampling_params.py SamplingParams, vllm/engine/arg_utils.py EngineArgs; read from the
#: vllm-0.30.0 wheel, and the same for every argument ratune passes in vllm-0.27.0).
VLLM_SIGNATURE_VERSION = "0.30.0"


class FakeSamplingParams:
    """vllm 0.30.0 ``SamplingParams`` (a msgspec Struct): its public fields, in order, with their
    defaults (``output_kind`` stands for ``RequestOutputKind.CUMULATIVE``). No catch-all: a name
    vLLM does not have is a TypeError, as it is there."""

    def __init__(self, n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0,
                 watermarking=True, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None, stop_token_ids=None,
                 ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, prompt_logprobs=None,
                 logprob_token_ids=None, flat_logprobs=False, detokenize=True, skip_special_tokens=True,
                 spaces_between_special_tokens=True, include_stop_str_in_output=False, output_kind="CUMULATIVE",
                 stream_interval=None, skip_clone=False, output_text_buffer_length=0, structured_outputs=None,
                 logit_bias=None, allowed_token_ids=None, extra_args=None, bad_words=None,
                 skip_reading_prefix_cache=None, thinking_token_budget=None, repetition_detection=None,
                 routed_experts_prompt_start=0, trace_decode_token_ids=None):
        self.temperature, self.max_tokens, self.stop_token_ids = temperature, max_tokens, stop_token_ids
        self.ignore_eos, self.skip_special_tokens, self.stop = ignore_eos, skip_special_tokens, stop


class FakeLLM:
    """vllm 0.30.0 ``LLM``: ``__init__``'s named parameters with their defaults, and, where vLLM
    has ``**kwargs`` (handed to ``EngineArgs``, which refuses unknown names), the two engine
    arguments ratune passes, with EngineArgs' defaults. ``generate`` as vLLM's. The answer to
    every prompt is ``answer`` cut to 9 tokens per prompt token, and within ``max_tokens``."""

    made: list = []
    answer: list = []

    def __init__(self, model, *, runner="auto", convert="auto", tokenizer=None, tokenizer_mode="auto",
                 skip_tokenizer_init=False, trust_remote_code=False, allowed_local_media_path="",
                 allowed_media_domains=None, tensor_parallel_size=1, dtype="auto", quantization=None, revision=None,
                 tokenizer_revision=None, chat_template=None, seed=0, gpu_memory_utilization=0.92, cpu_offload_gb=0,
                 offload_group_size=0, offload_num_in_group=1, offload_prefetch_step=1, offload_params=None,
                 enforce_eager=False, enable_return_routed_experts=False, return_sampling_mask=False,
                 disable_custom_all_reduce=False, hf_token=None, hf_overrides=None, mm_processor_kwargs=None,
                 pooler_config=None, structured_outputs_config=None, profiler_config=None, attention_config=None,
                 kv_cache_memory_bytes=None, compilation_config=None, quantization_config=None,
                 logits_processors=None, spec_method=None, spec_model=None, spec_tokens=None,
                 generation_config="auto", max_model_len=None):
        self.model, self.dtype, self.seed, self.trust_remote_code = model, dtype, seed, trust_remote_code
        self.generation_config, self.max_model_len = generation_config, max_model_len
        self.calls = []
        FakeLLM.made.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(params) == len(prompts)  # vLLM pairs a list one by one with the prompts
        self.calls.append((prompts, params, use_tqdm))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(
                    token_ids=self.answer[:min(len(x["prompt_token_ids"]) * 9, sp.max_tokens)])])
                for x, sp in zip(prompts, params)]


def _fake_vllm(monkeypatch, version: str = VLLM_SIGNATURE_VERSION):
    """vllm 'installed' at ``version`` on a machine with CUDA: the stand-ins above as its module."""
    import importlib.metadata

    import torch

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "vllm" else real_version(name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(FakeLLM, "made", [])


def test_vllm_backend_passes_prompt_ids_and_greedy_settings(monkeypatch, smol_tokenizer):
    """Prompts go in as token ids; decoding is greedy with the HF limit; vLLM stops at exactly the
    HF backend's stop ids (ignore_eos turns off its own EOS and generation-config stops); answers
    come back in prompt order through the shared cut."""
    from ratune.eval.generate import stop_token_ids
    from all_answers import vllm_generate_all

    tok = smol_tokenizer
    _fake_vllm(monkeypatch)
    llm = FakeLLM("folder")
    FakeLLM.answer = tok(FULL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompts = [[1, 2, 3], [4] * 40, [5, 6]]
    texts = vllm_generate_all(llm, tok, prompts, max_new_tokens=400, max_positions=2048, stop_after_api_call=True,
                              chunk_size=2)
    assert [c[0] for c in llm.calls] == [[{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4] * 40}],
                                         [{"prompt_token_ids": [5, 6]}]]
    assert all(use_tqdm is False for _, _, use_tqdm in llm.calls)
    params = llm.calls[0][1][0]
    assert stop_token_ids(tok) == [tok.eos_token_id]
    assert (params.temperature, params.max_tokens, params.stop_token_ids, params.ignore_eos,
            params.skip_special_tokens) == (0.0, 400, [tok.eos_token_id], True, True)
    answer = FakeLLM.answer
    expect = [tok.decode(answer[:n * 9], skip_special_tokens=True).strip() for n in (3, 40, 2)]
    assert texts[1] == CUT  # the long prompt got the whole answer: cut at the api_provider line
    assert texts[0] == expect[0] and texts[2] == expect[2]  # short ones never completed the line: kept


def test_load_llm_uses_bf16_the_model_positions_and_no_generation_config(monkeypatch, tiny_model_dir):
    """vLLM is built in eval's CUDA dtype (bfloat16 unless asked), with max_model_len = the
    folder's max_position_embeddings, and vLLM's neutral sampling defaults."""
    from ratune.eval.vllm_backend import load_llm

    _fake_vllm(monkeypatch)
    llm = load_llm(tiny_model_dir)
    assert (llm.model, llm.dtype, llm.max_model_len, llm.generation_config) == (
        str(tiny_model_dir), "bfloat16", 2048, "vllm")
    assert load_llm(tiny_model_dir, dtype="float32", max_positions=64).max_model_len == 64
    assert FakeLLM.made[-1].dtype == "float32"


def test_a_vllm_outside_the_tested_range_is_refused(monkeypatch):
    from ratune.eval.vllm_backend import SUPPORTED_VLLM, require_vllm

    assert SUPPORTED_VLLM == ">=0.27.0,<0.31"
    for ok in ("0.27.0", "0.30.0", "0.30.0+cu128"):
        _fake_vllm(monkeypatch, ok)
        require_vllm()
    for bad in ("0.26.0", "0.31.0", "0.33.0", "0.7.3"):
        _fake_vllm(monkeypatch, bad)
        with pytest.raises(RatuneError, match=rf"vllm {re.escape(bad)} is installed, but the vLLM backend is "
                                              r"written against vllm>=0\.27\.0,<0\.31 .*pip install -e"):
            require_vllm()


def test_the_vllm_extra_pins_the_tested_range():
    """pyproject.toml's extra and the backend's check name the same releases."""
    import tomllib
    from pathlib import Path

    from ratune.eval.vllm_backend import SUPPORTED_VLLM

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm"] == [f"vllm{SUPPORTED_VLLM}"]


def test_the_stand_ins_have_no_catch_all():
    """vllm is not installed here, so the stand-ins' explicit signatures are the check: neither
    takes *args or **kwargs, and a name vllm 0.30.0 does not have is a TypeError."""
    import inspect

    for fn in (FakeLLM.__init__, FakeLLM.generate, FakeSamplingParams.__init__):
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
        assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, fn.__qualname__
    with pytest.raises(TypeError, match="max_new_tokens"):
        FakeSamplingParams(max_new_tokens=5)  # HF's name; vLLM's is max_tokens
    with pytest.raises(TypeError, match="torch_dtype"):
        FakeLLM("folder", torch_dtype="bfloat16")  # transformers' name; vLLM's is dtype
    with pytest.raises(TypeError, match="sampling"):
        FakeLLM.generate(object(), [], sampling=None)
    assert FakeSamplingParams(max_tokens=5).max_tokens == 5


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_stand_ins_take_only_what_the_installed_vllm_takes():
    """Where vllm is installed: every parameter of the stand-ins exists in the real classes."""
    import inspect

    import vllm
    from vllm.engine.arg_utils import EngineArgs

    llm = set(inspect.signature(vllm.LLM.__init__).parameters) | set(inspect.signature(EngineArgs).parameters)
    assert set(inspect.signature(FakeLLM.__init__).parameters) <= llm
    assert set(inspect.signature(FakeLLM.generate).parameters) <= set(inspect.signature(vllm.LLM.generate).parameters)
    assert set(inspect.signature(FakeSamplingParams.__init__).parameters) - {"self"} <= set(
        vllm.SamplingParams.__struct_fields__)


def test_eval_run_with_vllm_passes_dtype_positions_and_limits(monkeypatch, apibench, tiny_model_dir, tmp_path,
                                                              smol_tokenizer):
    """`ratune eval run --backend vllm` (stand-ins): bfloat16 on CUDA, max_model_len and the
    per-question limits from the model's positions, answers stored as the HF backend stores them."""
    import json

    import torch

    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    _fake_vllm(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a stand-in GPU")  # torch's signature
    FakeLLM.answer = smol_tokenizer(FULL, add_special_tokens=False)["input_ids"] + [smol_tokenizer.eos_token_id]
    metrics = evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                                  settings=EvalSettings(settings=["0_shot"], n_questions=3, backend="vllm",
                                                        max_new_tokens=64, stop_after_api_call=True),
                                  progress=False)["0_shot"]
    (llm,) = FakeLLM.made
    assert (llm.dtype, llm.max_model_len, llm.generation_config) == ("bfloat16", 2048, "vllm")
    (prompts, params, _), = llm.calls
    assert len(prompts) == 3 and [p.max_tokens for p in params] == [64, 64, 64]
    assert metrics["generation"]["dtype"] == "bfloat16" and metrics["generation"]["device"] == "cuda"
    assert metrics["generation_limit"] == {"max_positions": 2048, "capped": []}
    rows = [json.loads(line) for line in (tmp_path / "eval" / "0_shot" / "responses.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == [CUT] * 3


def _short_model(tokenizer, positions: int):
    """A tiny random Llama with only ``positions`` positions (seeded; large weights, varied tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, initializer_range=0.5)
    return LlamaForCausalLM(config).eval()


def test_one_length_policy_for_both_backends(monkeypatch, smol_tokenizer):
    """Prompt plus answer never pass the model's positions: a prompt near them gets the rest (HF's
    batched answer equals the one generated alone with that limit; vLLM is asked for the same
    limit), and one that fills them is an error naming it."""
    from all_answers import generate_all
    from ratune.eval.generate import generation_limits, max_positions_of
    from all_answers import vllm_generate_all

    tok = smol_tokenizer
    model = _short_model(tok, 40)
    assert max_positions_of(model.config) == 40
    long, short = [tok.bos_token_id] + list(range(300, 334)), [tok.bos_token_id, 400, 401]  # 35 and 3 tokens
    assert generation_limits([35, 3], max_new_tokens=10, max_positions=40) == [5, 10]
    assert generation_limits([35, 3], max_new_tokens=10, max_positions=None) == [10, 10]
    capped = generate_all(model, tok, [long, short], batch_size=2, max_new_tokens=10, prefill="padded")
    alone = [generate_all(model, tok, [long], batch_size=1, max_new_tokens=5)[0],
             generate_all(model, tok, [short], batch_size=1, max_new_tokens=10)[0]]
    assert capped == alone
    run_on = generate_all(model, tok, [long], batch_size=1, max_new_tokens=10, max_positions=10_000)[0]
    assert run_on != alone[0] and run_on.startswith(alone[0])  # HF alone would have gone on past position 40
    assert len(tok(alone[1], add_special_tokens=False)["input_ids"]) > 5  # the short prompt was not capped

    _fake_vllm(monkeypatch)
    llm = FakeLLM("folder")
    FakeLLM.answer = list(range(500, 600))
    vllm_generate_all(llm, tok, [long, short], max_new_tokens=10, max_positions=40)
    assert [p.max_tokens for p in llm.calls[0][1]] == [5, 10]

    with pytest.raises(RatuneError, match=r"prompt 0: the prompt has 40 tokens, and the model has 40 positions"):
        generate_all(model, tok, [long + [1] * 5, short], max_new_tokens=10)
    with pytest.raises(RatuneError, match=r"prompt 1: the prompt has 41 tokens"):
        vllm_generate_all(llm, tok, [short, long + [1] * 6], max_new_tokens=10, max_positions=40)


def test_hf_stops_at_the_tokenizer_eos_not_at_other_generation_config_ids(smol_tokenizer):
    """A model folder's generation config may list more EOS ids; the HF backend stops at
    stop_token_ids (the tokenizer's EOS) alone, as the vLLM backend does."""
    from all_answers import generate_all

    tok = smol_tokenizer
    model = _short_model(tok, 2048)
    prompt = [tok.bos_token_id, 400, 401, 402]
    import torch

    full = generate_all(model, tok, [prompt], batch_size=1, max_new_tokens=8)[0]
    first = int(model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=1, do_sample=False,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, -1])
    assert first != tok.eos_token_id and full
    model.generation_config.eos_token_id = [tok.eos_token_id, first]  # would end the answer at its first token
    assert generate_all(model, tok, [prompt], batch_size=1, max_new_tokens=8)[0] == full
