"""Where training compute goes, the shares of token positions that are real and carry loss
(docs/training.md#token-shares), and the check that packing keeps examples apart."""

from __future__ import annotations

import random
from typing import Literal, Sequence

Mode = Literal["per_batch", "padding_free", "packing"]
MODES = ("per_batch", "padding_free", "packing")


def seeded_order(n: int, seed: int) -> list[int]:
    """A seeded permutation of ``range(n)``, a stand-in for the Trainer's shuffled dataloader order."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def token_shares(lengths: Sequence[int], loss_tokens: Sequence[int], *, micro_batch_size: int, mode: Mode,
                 max_length: int | None = None, order: Sequence[int] | None = None) -> dict:
    """Shares of processed token positions that are real and that carry loss, over one pass over rows of
    ``lengths`` tokens, ``loss_tokens`` of them with loss, ``micro_batch_size`` rows per micro-batch
    and process; ``max_length`` is the ``packing`` bin size, ``order`` the ``per_batch`` dataloader
    order (default: dataset order). The modes: docs/training.md#token-shares.

    Returns:
        ``{"real_token_share", "loss_token_share", "processed_tokens", "real_tokens", "loss_tokens"}``.
    Raises:
        ValueError: an unknown mode, inconsistent counts, micro_batch_size < 1, ``order`` not a
            permutation, or for ``packing`` no ``max_length`` or a row longer than it.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    if len(lengths) != len(loss_tokens):
        raise ValueError(f"{len(lengths)} lengths but {len(loss_tokens)} loss-token counts")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    for i, (n, k) in enumerate(zip(lengths, loss_tokens)):
        if n < 0 or k < 0 or k > n:
            raise ValueError(f"row {i}: {k} loss tokens in {n} tokens")
    real, loss = sum(lengths), sum(loss_tokens)
    if mode == "packing":
        if max_length is None:
            raise ValueError("packing needs max_length (the bin size)")
        too_long = [i for i, n in enumerate(lengths) if n > max_length]
        if too_long:
            raise ValueError(f"rows {too_long[:5]} are longer than max_length {max_length}")
        processed = real
    elif mode == "padding_free":
        processed = real
    else:
        order = list(range(len(lengths))) if order is None else list(order)
        if sorted(order) != list(range(len(lengths))):
            raise ValueError("order must be a permutation of the row indices")
        processed = 0
        for start in range(0, len(order), micro_batch_size):
            batch = order[start:start + micro_batch_size]
            processed += len(batch) * max(lengths[i] for i in batch)
    return {"real_token_share": real / processed if processed else 0.0,
            "loss_token_share": loss / processed if processed else 0.0,
            "processed_tokens": processed, "real_tokens": real, "loss_tokens": loss}


def shares_for_rows(columns: dict, *, micro_batch_size: int, packing: bool, max_length: int, seed: int,
                    padding_free: bool = False) -> dict:
    """:func:`token_shares`, plus ``"mode"``, of tokenized rows (``{"input_ids", "labels"}``) under a run's
    batching: ``packing``, ``padding_free``, else ``per_batch`` over :func:`seeded_order` with ``seed``."""
    lengths = [len(ids) for ids in columns["input_ids"]]
    loss = [sum(1 for t in labels if t != -100) for labels in columns["labels"]]
    mode = "packing" if packing else "padding_free" if padding_free else "per_batch"
    out = token_shares(lengths, loss, micro_batch_size=micro_batch_size, mode=mode, max_length=max_length,
                       order=seeded_order(len(lengths), seed))
    return {"mode": mode, **out}


#: Attention implementations that keep packed examples apart under TRL 1.16's padding-free collator
#: (transformers 5.24): sdpa and eager build a block-diagonal mask from position_ids
#: (masking_utils.find_packed_sequence_indices; tests/test_packing.py), flash attention varlen kernels.
PACKING_SAFE_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def check_packing_attention(model, *, trust_remote_code: bool = False) -> str:
    """Refuse packing where packed examples could attend to each other: an attention implementation
    not in :data:`PACKING_SAFE_ATTENTION`, or remote modeling code, which may ignore position_ids
    (RatuneError saying to set ``packing: false``). Returns the implementation, for the manifest."""
    from ratune.errors import RatuneError

    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if trust_remote_code:
        raise RatuneError("packing: true with trust_remote_code: true: remote modeling code may ignore the "
                          "per-example position_ids and attend across packed examples; set packing: false")
    if impl not in PACKING_SAFE_ATTENTION:
        raise RatuneError(f"packing: true needs an attention implementation that keeps packed examples apart "
                          f"({', '.join(PACKING_SAFE_ATTENTION)}); this model uses {impl!r}; set packing: false "
                          "or load it with one of those")
    return impl
