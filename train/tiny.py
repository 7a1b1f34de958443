"""Small LLaMA-style tokenizers built from nothing (no download, no sentencepiece model), for
models made from random weights: bench/gpu_smoke.py's byte-level tokenizer and tests/conftest.py's
LLaMA-1-shaped one (``build_llama1_tokenizer``, whose pieces and token ids
tests/test_chat_templates.py pins) are both :func:`build_llama_tokenizer`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

#: LLaMA's special tokens and their ids.
SPECIAL_TOKENS = {"<unk>": 0, "<s>": 1, "</s>": 2}
#: The id of the first byte-fallback token ``<0x00>``; ``<0xFF>`` is BYTE_OFFSET + 255 (258).
BYTE_OFFSET = len(SPECIAL_TOKENS)
#: sentencepiece's space, which LLaMA's tokenizer puts in place of " " (and before the text's start).
SPACE = "▁"


def build_llama_tokenizer(folder: str | os.PathLike, *, pieces: Sequence[str] = (),
                          merge_order: Sequence[int] | None = None, metaspace: bool = False) -> None:
    """Write a LLaMA-style tokenizer folder: ``tokenizer.json`` and ``tokenizer_config.json``
    (class LlamaTokenizerFast, ``add_bos_token`` true, ``add_eos_token`` false, no pad token, no
    chat template).

    The model is BPE with byte fallback: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, the 256 byte tokens
    ``<0x00>``..``<0xFF>`` (3..258), so every UTF-8 byte without a token of its own is one token,
    then one token per piece in ``pieces`` (259, 260, ...), and after them the prefixes and
    characters their merges pass through. Each piece is reached by merging it left to right one
    character at a time; the pieces' merges are ranked in ``merge_order`` (indices into
    ``pieces``; default their order), so a piece's chain must come before any other piece's merge
    that could fire inside it. BOS is added in front of every sequence (pairs: ``<s> A <s> B``).

    Args:
        folder: an existing folder to write into.
        pieces: the multi-character tokens (none: a byte-level tokenizer, one token per byte).
        merge_order: the order in which each piece's merges are ranked.
        metaspace: LLaMA's space handling: " " is written :data:`SPACE` and one is put before the
            text's start (sentencepiece's Metaspace), and decoding turns it back into spaces and
            drops the leading one. False: no pre-tokenizer, and bytes decode as they are.
    Raises:
        IndexError: an index of ``merge_order`` outside ``pieces``.
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import LlamaTokenizerFast

    vocab = {**SPECIAL_TOKENS, **{f"<0x{b:02X}>": BYTE_OFFSET + b for b in range(256)}}
    for piece in pieces:
        vocab[piece] = len(vocab)
    merges = []
    for index in range(len(pieces)) if merge_order is None else merge_order:
        piece = pieces[index]
        for k in range(1, len(piece)):
            for part in (piece[:k], piece[k]):
                vocab.setdefault(part, len(vocab))
            vocab.setdefault(piece[:k + 1], len(vocab))
            if (piece[:k], piece[k]) not in merges:
                merges.append((piece[:k], piece[k]))
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", SPECIAL_TOKENS["<s>"])])
    llama = LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    llama.save_pretrained(folder)
    config_path = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="LlamaTokenizerFast", add_bos_token=True, add_eos_token=False)
    config_path.write_text(json.dumps(config, indent=2))
