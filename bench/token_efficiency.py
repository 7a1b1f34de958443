"""Token efficiency of training batches: how much of the processed work is real tokens.

Usage:
    python bench/token_efficiency.py [--apibench DIR] [--modes none,oracle,bm25] [--max-length 2048]
                                     [--max-document-tokens N] [--batch-size 8] [--seed 0] [--json]

Builds the TorchHub training set (the real APIBench rows, duplicates removed as ``ratune data
build`` does) with the demo model's tokenizer under each train-time retrieval mode
(:func:`ratune.data.build.retrieve_for_mode` + :func:`ratune.data.build.build_rows`, so lengths and
the over-length policy are exactly the builder's) and reports, per way of batching, the share of
processed tokens that are real (not padding) and the share that carry loss (answer + EOS):

- ``max_length``: every row padded to ``max_length`` (FastChat-style pipelines);
- ``per_batch``: rows in a seeded random order, in batches of ``batch_size``, each batch padded to
  its longest row (the default collator);
- ``length_grouped``: the order of transformers' ``LengthGroupedSampler`` (its own
  ``get_length_grouped_indices``: seeded random megabatches of ``50 * batch_size`` rows, or fewer
  so that there are 4 megabatches, each sorted by length), then padded per batch as above;
- ``packing``: rows packed whole into bins of at most ``max_length`` tokens by TRL's own
  ``trl.data_utils.pack_dataset(..., strategy="bfd")`` (best-fit decreasing; every row fits, so
  nothing is truncated), each bin counted as ``max_length`` processed tokens (fixed-shape
  bins: the conservative case, what a collator that pads bins to ``max_length`` processes);
- ``packing_padding_free``: the same bins as TRL's SFTTrainer processes them (``packing=True``
  with a bfd strategy turns on ``padding_free``: a batch is flattened into one sequence with
  ``position_ids``, no padding), so processed tokens are the bins' own tokens and the real-token
  share is 1.0 by construction; reported so the table shows what training actually runs.

Shares are over processed tokens (``batch rows x padded width``, summed over batches).

With ``--json`` prints one object::

    {"hub": "torchhub", "split": "train",
     "settings": {"max_length", "max_document_tokens", "batch_size", "seed", "tokenizer"},
     "modes": {MODE: {"rows", "dropped", "shortened", "real_tokens", "loss_tokens",
                      "mean_length", "max_row_length",
                      "max_length": STRATEGY, "per_batch": STRATEGY,
                      "length_grouped": STRATEGY, "packing": STRATEGY,
                      "packing_padding_free": STRATEGY}}}

where ``STRATEGY`` is ``{"real_token_share", "loss_token_share", "processed_tokens",
"real_tokens", "loss_tokens", "batches"}`` (``batches``: padded batches, or bins for packing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STRATEGIES = ("max_length", "per_batch", "length_grouped", "packing", "packing_padding_free")
DEFAULT_MODES = ("none", "oracle", "bm25")


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def strategy_result(processed: int, lengths: Sequence[int], loss_lengths: Sequence[int], batches: int) -> dict:
    """One strategy's numbers: real and loss-carrying tokens as shares of ``processed`` tokens."""
    real, loss = int(sum(lengths)), int(sum(loss_lengths))
    return {"real_token_share": _share(real, processed), "loss_token_share": _share(loss, processed),
            "processed_tokens": int(processed), "real_tokens": real, "loss_tokens": loss, "batches": int(batches)}


def padded_to_max_length(lengths: Sequence[int], max_length: int) -> int:
    """Processed tokens when every row is padded to ``max_length``."""
    if any(n > max_length for n in lengths):
        raise ValueError("a row is longer than max_length")
    return len(lengths) * max_length


def padded_per_batch(lengths: Sequence[int], order: Sequence[int], batch_size: int) -> tuple[int, int]:
    """Processed tokens when rows are taken in ``order`` and each batch is padded to its longest row.

    Returns:
        ``(processed tokens, number of batches)``.
    """
    processed, batches = 0, 0
    for start in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[start:start + batch_size]]
        processed += len(batch) * max(batch)
        batches += 1
    return processed, batches


def random_order(n: int, seed: int) -> list[int]:
    """A seeded random permutation of ``range(n)`` (the default sampler's shuffle)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int) -> list[int]:
    """The order transformers' ``LengthGroupedSampler`` yields (its ``get_length_grouped_indices``)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed)
    return [int(i) for i in get_length_grouped_indices(list(lengths), batch_size, generator=generator)]


def pack_bins(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Pack rows whole into bins of at most ``max_length`` tokens with TRL's ``pack_dataset`` (BFD).

    Each row is given as ``input_ids`` of its length together with a ``row`` column holding its
    index, packed in one ``map`` batch (so bins may mix any rows), and the bins are read back.

    Returns:
        Per bin, the indices of the rows in it (in TRL's order).
    Raises:
        ValueError: when a row is longer than ``max_length`` (TRL would truncate it).
    """
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    if any(n > max_length for n in lengths):
        raise ValueError("a row is longer than max_length: packing would truncate it")
    if not lengths:
        return []
    keep = [i for i, n in enumerate(lengths) if n > 0]
    ds = Dataset.from_dict({"input_ids": [[1] * lengths[i] for i in keep], "row": [[i] * lengths[i] for i in keep]})
    packed = pack_dataset(ds, max_length, strategy="bfd", map_kwargs={"batch_size": len(ds)})
    bins = []
    for rows, seq_lengths in zip(packed["row"], packed["seq_lengths"]):
        members, pos = [], 0
        for n in seq_lengths:
            members.append(int(rows[pos]))
            pos += n
        bins.append(members)
    return bins


def efficiency(lengths: Sequence[int], loss_lengths: Sequence[int], *, max_length: int, batch_size: int,
               seed: int = 0) -> dict:
    """Real-token and loss-token shares for every strategy in :data:`STRATEGIES`.

    Args:
        lengths: tokens per row (prompt + answer + EOS).
        loss_lengths: tokens per row that carry loss (answer + EOS).
        max_length: the row limit (and the packing bin size).
        batch_size: rows per batch for the padded strategies.
        seed: the shuffle seed for ``per_batch`` and ``length_grouped``.
    Returns:
        ``{strategy: strategy_result(...)}``.
    """
    lengths, loss_lengths = list(lengths), list(loss_lengths)
    out = {"max_length": strategy_result(padded_to_max_length(lengths, max_length), lengths, loss_lengths,
                                         -(-len(lengths) // batch_size))}
    for name, order in (("per_batch", random_order(len(lengths), seed)),
                        ("length_grouped", length_grouped_order(lengths, batch_size, seed))):
        processed, batches = padded_per_batch(lengths, order, batch_size)
        out[name] = strategy_result(processed, lengths, loss_lengths, batches)
    bins = pack_bins(lengths, max_length)
    out["packing"] = strategy_result(len(bins) * max_length, lengths, loss_lengths, len(bins))
    packed_tokens = sum(lengths[i] for b in bins for i in b)
    out["packing_padding_free"] = strategy_result(packed_tokens, lengths, loss_lengths, len(bins))
    return out


def build_mode_lengths(mode: str, *, examples, apibench_dir, tokenizer, max_length: int,
                       max_document_tokens: int | None, retriever_cache: dict) -> tuple[list[int], list[int], dict]:
    """Token lengths of the TorchHub training rows (``examples``) built under ``mode``.

    Returns:
        ``(lengths, loss_lengths, counts)`` with ``counts`` from :func:`ratune.data.build.build_rows`.
    """
    from ratune.data.build import BuildSettings, build_rows, retrieve_for_mode

    settings = BuildSettings(max_length=max_length, max_document_tokens=max_document_tokens)
    docs = retrieve_for_mode(mode, examples, hub="torchhub", apibench_dir=apibench_dir, top_k=settings.top_k,
                             retriever_cache=retriever_cache)
    rows, counts = build_rows(examples, docs, mode=mode, tokenizer=tokenizer, settings=settings)
    lengths = [r["n_prompt_tokens"] + r["n_completion_tokens"] for r in rows]
    return lengths, [r["n_completion_tokens"] for r in rows], counts


def load_train_examples(apibench_dir) -> list:
    """TorchHub training examples after the builder's validation (duplicates removed, leakage checked)."""
    from ratune.sources.apibench import api_database_path, examples_path, load_api_database, load_examples
    from ratune.sources.validate import validate_splits

    from ratune.registry import SPLITS

    splits = {s: load_examples(apibench_dir, "torchhub", s) for s in SPLITS}
    splits, _ = validate_splits(splits, load_api_database(api_database_path(apibench_dir, "torchhub")),
                                train_path=examples_path(apibench_dir, "torchhub", "train"),
                                eval_path=examples_path(apibench_dir, "torchhub", "eval"))
    return splits["train"]


def run(*, apibench_dir=None, modes: Sequence[str] = DEFAULT_MODES, max_length: int = 2048,
        max_document_tokens: int | None = None, batch_size: int = 8, seed: int = 0, tokenizer=None) -> dict:
    """Build each mode's training rows and measure every strategy; returns the ``--json`` object."""
    from ratune.sources.apibench import resolve_apibench_dir
    from ratune.models import DEMO_MODEL_ALIAS, ensure_demo_model, load_tokenizer

    apibench_dir = resolve_apibench_dir(apibench_dir)
    if tokenizer is None:
        tokenizer = load_tokenizer(ensure_demo_model())
    examples = load_train_examples(apibench_dir)
    cache: dict = {}
    result = {"hub": "torchhub", "split": "train",
              "settings": {"max_length": max_length, "max_document_tokens": max_document_tokens,
                           "batch_size": batch_size, "seed": seed, "tokenizer": DEMO_MODEL_ALIAS},
              "modes": {}}
    for mode in modes:
        lengths, loss_lengths, counts = build_mode_lengths(
            mode, apibench_dir=apibench_dir, tokenizer=tokenizer, max_length=max_length,
            max_document_tokens=max_document_tokens, retriever_cache=cache, examples=examples)
        entry = {"rows": len(lengths), "dropped": counts["dropped"], "shortened": counts["shortened"],
                 "real_tokens": int(sum(lengths)), "loss_tokens": int(sum(loss_lengths)),
                 "mean_length": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
                 "max_row_length": max(lengths, default=0)}
        entry.update(efficiency(lengths, loss_lengths, max_length=max_length, batch_size=batch_size, seed=seed))
        result["modes"][mode] = entry
    return result


def format_table(result: dict) -> str:
    """The readable table: per mode and strategy, real- and loss-token shares in percent."""
    s = result["settings"]
    lines = [f"TorchHub train, tokenizer {s['tokenizer']}, max_length {s['max_length']}, "
             f"max_document_tokens {s['max_document_tokens']}, batch size {s['batch_size']}, seed {s['seed']}",
             "",
             f"{'mode':<8} {'rows':>5} {'mean len':>8} {'strategy':<20} {'real %':>7} {'loss %':>7} "
             f"{'processed':>10} {'batches':>7}"]
    for mode, entry in result["modes"].items():
        for strategy in STRATEGIES:
            r = entry[strategy]
            lines.append(f"{mode:<8} {entry['rows']:>5} {entry['mean_length']:>8} {strategy:<20} "
                         f"{100 * r['real_token_share']:>7.2f} {100 * r['loss_token_share']:>7.2f} "
                         f"{r['processed_tokens']:>10} {r['batches']:>7}")
        lines.append(f"{'':<8} real tokens {entry['real_tokens']}, loss tokens {entry['loss_tokens']} "
                     f"({100 * _share(entry['loss_tokens'], entry['real_tokens']):.1f} % of real), "
                     f"dropped {entry['dropped']}, shortened {entry['shortened']}")
    lines.append("")
    lines.append("packing: TRL pack_dataset(strategy='bfd'), each bin counted as max_length tokens; "
                 "packing_padding_free: the same bins flattened without padding (TRL's SFTTrainer with packing); "
                 "length_grouped: transformers get_length_grouped_indices (LengthGroupedSampler)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    from ratune.errors import RatuneError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--apibench", default=None, help="APIBench folder (default: ../shared/apibench)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma-separated train retrieval modes")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--max-document-tokens", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    import datasets

    datasets.disable_progress_bars()
    try:
        result = run(apibench_dir=args.apibench, modes=modes, max_length=args.max_length,
                     max_document_tokens=args.max_document_tokens, batch_size=args.batch_size, seed=args.seed)
    except RatuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
