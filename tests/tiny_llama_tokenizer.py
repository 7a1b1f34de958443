"""Small LLaMA-style tokenizers built from nothing (no download, no sentencepiece model), for models
with random weights: tests/conftest.py's and bench/gpu_smoke.py's (which loads this file by path)."""

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
    """Write a LLaMA-style tokenizer into the existing ``folder`` (LlamaTokenizerFast; BOS added, not EOS;
    no pad token, no chat template): BPE with byte fallback, ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, the
    bytes 3..258, then each of ``pieces`` and the prefixes its left-to-right merges pass through,
    ranked in ``merge_order`` (indices into ``pieces``; a piece's chain must come before any merge
    that could fire inside it). ``metaspace``: sentencepiece's :data:`SPACE` for " ", one before the
    text. Raises IndexError for an index of ``merge_order`` outside ``pieces``."""
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
