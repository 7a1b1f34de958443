"""Where training compute goes: the share of processed tokens that are real and that carry loss;
and the check that packing keeps examples apart (:func:`check_packing_attention`).

A training run processes ``processed_tokens`` token positions (every row of every micro-batch at
the batch's padded width); ``real_tokens`` of them are the examples' own tokens (prompt + answer +
EOS) and ``loss_tokens`` are the answer + EOS tokens that carry loss (``labels != -100``). Both
shares are fractions of ``processed_tokens``, so ``loss_token_share <= real_token_share <= 1``.

How many positions are processed depends on how rows are batched (``mode``):

- ``per_batch``: the default collator (``packing: false``): rows are taken ``micro_batch_size`` at
  a time in dataloader order and each micro-batch is right-padded to its longest row, so a
  micro-batch processes ``rows x longest row`` positions (the last, short micro-batch its own rows
  only).
- ``padding_free``: TRL's ``padding_free=True`` without packing: a micro-batch of
  ``micro_batch_size`` whole rows is concatenated into one row with ``position_ids``; nothing is
  padded (and no bins are made, so batch sizes keep counting examples).
- ``packing``: what TRL 1.16's SFTTrainer runs with ``packing=True`` (default ``packing_strategy
  "bfd"``): whole rows are packed into bins of at most ``max_length`` tokens and the bfd strategy
  turns on ``padding_free``, whose collator concatenates a micro-batch's bins into one row with
  ``position_ids`` and no padding. Processed positions are the real tokens, so the real-token
  share is 1.0; every row must fit ``max_length`` (ratune never truncates; bfd would cut it).

Multi-process runs pad each process's micro-batch separately; the per-batch figure over one order
is the same computation on that process's share of the rows, and over a random order it is the
same in expectation, so the whole-dataset figure is what the manifest records.
"""

from __future__ import annotations

import random
from typing import Literal, Sequence

Mode = Literal["per_batch", "padding_free", "packing"]
MODES = ("per_batch", "padding_free", "packing")


def seeded_order(n: int, seed: int) -> list[int]:
    """A seeded random permutation of ``range(n)``: a stand-in for the Trainer's shuffled
    dataloader order (its exact order is drawn inside the Trainer's sampler), for which the
    per-batch padding figure is representative."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def token_shares(lengths: Sequence[int], loss_tokens: Sequence[int], *, micro_batch_size: int, mode: Mode,
                 max_length: int | None = None, order: Sequence[int] | None = None) -> dict:
    """Share of processed token positions that are real and that carry loss, for one pass over the rows.

    Args:
        lengths: tokens per row (prompt + answer + EOS), one per training example.
        loss_tokens: loss-carrying tokens per row (answer + EOS; ``labels != -100``), same length.
        micro_batch_size: rows per micro-batch and process (``per_device_batch_size``).
        mode: ``per_batch`` (padding per micro-batch), ``padding_free`` (TRL padding-free, no bins)
            or ``packing`` (TRL bfd packing, padding-free); see the module docstring.
        max_length: bin size for ``packing`` (required there; every row must fit).
        order: dataloader order of the rows for ``per_batch`` (a permutation of their indices;
            default: dataset order). Ignored by the padding-free modes.
    Returns:
        ``{"real_token_share", "loss_token_share", "processed_tokens", "real_tokens", "loss_tokens"}``
        (shares in [0, 1]; 0.0 for no rows).
    Raises:
        ValueError: unknown mode, lengths/loss_tokens of different sizes, a row with more loss tokens
            than tokens or a negative count, micro_batch_size < 1, ``order`` not a permutation, or
            for ``packing`` a missing ``max_length`` or a row longer than it.
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
        processed = real  # padding-free: bins are concatenated, no pad position is processed
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
    """:func:`token_shares` of tokenized training rows as train/sft.py holds them.

    Args:
        columns: ``{"input_ids": [[int]], "labels": [[int]]}`` (labels -100 where no loss).
        micro_batch_size: rows per micro-batch and process.
        packing: the config's ``packing`` switch (``packing`` mode when true, else ``per_batch``
            over :func:`seeded_order` with ``seed``).
        max_length: the config's ``max_length`` (the packing bin size).
        seed: the run's seed.
        padding_free: TRL padding-free batching without packing (``padding_free`` mode).
    Returns:
        :func:`token_shares`'s dict plus ``"mode"``.
    """
    lengths = [len(ids) for ids in columns["input_ids"]]
    loss = [sum(1 for t in labels if t != -100) for labels in columns["labels"]]
    mode = "packing" if packing else "padding_free" if padding_free else "per_batch"
    out = token_shares(lengths, loss, micro_batch_size=micro_batch_size, mode=mode, max_length=max_length,
                       order=seeded_order(len(lengths), seed))
    return {"mode": mode, **out}


#: Attention implementations that keep packed examples apart in transformers 5.24 with TRL 1.16's
#: padding-free collator (position_ids restarting per example, no attention_mask): sdpa and eager
#: get a block-diagonal causal mask built from position_ids (masking_utils.find_packed_sequence_indices;
#: tests/test_packing.py checks both), flash attention takes the example boundaries from
#: cu_seq_lens / position_ids (varlen kernels; not testable on CPU).
PACKING_SAFE_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def check_packing_attention(model, *, trust_remote_code: bool = False) -> str:
    """Refuse packing where examples packed into one row could attend to each other.

    Args:
        model: the model about to be trained (a PreTrainedModel or a peft wrapper of one).
        trust_remote_code: the config's switch: remote modeling code may build its own attention
            mask and ignore position_ids, so packing is refused with it.
    Returns:
        The model's attention implementation (for the manifest).
    Raises:
        RatuneError: the implementation is not in :data:`PACKING_SAFE_ATTENTION`, or the model
            runs remote code; the message says to set ``packing: false``.
    """
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
