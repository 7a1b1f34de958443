"""Document utility (Toolformer, Schick et al. 2023, section 2): L(answer | instruction) -
L(answer | instruction + document), mean cross-entropy per answer token in nats, from a data
build's rows of mode ``none`` and the document mode (docs/experiments.md#document-utility)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from ratune.data.labels import ANSWER_TOKENIZATIONS, built_answer_tokenization, tokenize_row
from ratune.sources.prompt import require_chat_template, use_chat_template
from ratune.errors import InputError, RatuneError
from ratune.io import atomic_write, iter_jsonl, read_json_object, write_json
from ratune.manifest import base_manifest, is_complete
from ratune.output import StageOutput
from ratune.models import load_model, load_tokenizer, resolve_model_path, set_torch_threads

#: Which data-build mode measures the utility of each mixture component's document.
COMPONENT_MODE = {"oracle": "oracle", "top1": None}  # top1: the mixture's top1_retriever mode


def answer_losses(model, tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 8,
                  answer_tokenization: str = ANSWER_TOKENIZATIONS[0]) -> list[float]:
    """Mean cross-entropy per answer token (nats) of each ``(user_turn, completion)`` pair, tokenized
    as for training, in the order given.
    """
    import torch

    rows = [tokenize_row(tokenizer, u, c, answer_tokenization=answer_tokenization) for u, c in pairs]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    losses = [math.nan] * len(rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.eval()
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = max(len(rows[i].input_ids) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            labels = torch.full((len(idx), width), -100, dtype=torch.long)
            for b, i in enumerate(idx):
                r = rows[i]
                n = len(r.input_ids)
                ids[b, :n] = torch.tensor(r.input_ids)
                mask[b, :n] = 1
                labels[b, :n] = torch.tensor([t if m else -100 for t, m in zip(r.input_ids, r.completion_mask)])
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            # position t predicts token t + 1
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100,
                                                   reduction="none")
            counted = (labels[:, 1:] != -100).sum(dim=1)
            for b, i in enumerate(idx):
                losses[i] = float(ce[b].sum() / counted[b])
    return losses


def measure_utility(data_dir, modes: Sequence[str], model, tokenizer, *, split: str = "train",
                    max_examples: int | None = None, batch_size: int = 8, progress: bool = True) -> list[dict]:
    """Utility of each document mode's documents for the examples of a data build.

    Args:
        data_dir: a ``ratune data build`` folder holding mode ``none`` and each of ``modes``.
        max_examples: the first N examples (by line) only.

    Returns:
        One record per example present in both modes, sorted by mode then line.

    Raises:
        RatuneError: the folder is not a complete build, or lacks mode none or a requested mode.
    """
    from datasets import load_from_disk
    from tqdm.auto import tqdm

    data_dir = Path(data_dir)
    if not is_complete(data_dir):
        raise RatuneError(f"{data_dir}: not a complete `ratune data build` output (no .complete marker)")
    for mode in ("none", *modes):
        if not (data_dir / mode).is_dir():
            raise RatuneError(f"{data_dir}: mode {mode!r} was not built; rebuild with --modes none {' '.join(modes)}")
    tokenization = built_answer_tokenization(read_json_object(data_dir / "manifest.json").get("settings") or {}
                                             if (data_dir / "manifest.json").is_file() else {})
    base = {r["line"]: r for r in load_from_disk(str(data_dir / "none"))[split]}
    lines = sorted(base)[:max_examples] if max_examples else sorted(base)
    without = dict(zip(lines, answer_losses(model, tokenizer, [(base[x]["user_turn"], base[x]["completion"])
                                                               for x in lines], batch_size=batch_size,
                                                answer_tokenization=tokenization)))
    out = []
    for mode in tqdm(modes, desc="utility", disable=not progress):
        rows = {r["line"]: r for r in load_from_disk(str(data_dir / mode))[split] if r["line"] in without}
        keys = sorted(rows)
        with_doc = answer_losses(model, tokenizer, [(rows[x]["user_turn"], rows[x]["completion"]) for x in keys],
                                 batch_size=batch_size, answer_tokenization=tokenization)
        for line, loss in zip(keys, with_doc):
            out.append({"line": line, "mode": mode, "loss_without": without[line], "loss_with": loss,
                        "utility": without[line] - loss, "document_api_calls": rows[line]["document_api_calls"],
                        "gold_api_call": rows[line]["gold_api_call"]})
    return out


def summarize(records: Sequence[dict]) -> dict[str, dict]:
    """Per mode: ``n``, ``mean``, ``p10``, ``p50``, ``p90`` (nearest rank), ``share_positive`` and,
    when documents can be wrong, the mean utility of right (gold) vs wrong documents."""
    import numpy as np

    out = {}
    for mode in dict.fromkeys(r["mode"] for r in records):
        rs = [r for r in records if r["mode"] == mode]
        u = np.asarray([r["utility"] for r in rs])
        entry = {"n": len(rs), "mean": float(u.mean()),
                 **{f"p{q}": float(np.percentile(u, q, method="nearest")) for q in (10, 50, 90)},
                 "share_positive": float((u > 0).mean())}
        right = [r["utility"] for r in rs if r["gold_api_call"] in r["document_api_calls"]]
        wrong = [r["utility"] for r in rs if r["gold_api_call"] not in r["document_api_calls"]]
        entry["right_document"] = {"n": len(right), "mean": float(np.mean(right)) if right else None}
        entry["wrong_document"] = {"n": len(wrong), "mean": float(np.mean(wrong)) if wrong else None}
        out[mode] = entry
    return out


#: The stage name of ``ratune data utility`` (its manifest's command, its folder's owner marker).
UTILITY_STAGE = "data utility"


def write_utility(records: Sequence[dict], out_dir, *, meta: dict) -> dict:
    """Write utility.jsonl, utility.json and utility.png into ``out_dir``; returns the summary.

    Raises:
        RatuneError: ``out_dir`` is a file, or a non-empty folder ratune did not make.
    """
    import matplotlib

    matplotlib.use("Agg")
    output = StageOutput(out_dir, UTILITY_STAGE)
    with output.writing() as out:
        return _write_utility(output, out, records, meta)


def _write_utility(output: StageOutput, out: Path, records: Sequence[dict], meta: dict) -> dict:
    import matplotlib.pyplot as plt

    with atomic_write(out / "utility.jsonl") as fh:
        for r in records:
            fh.write(json.dumps(r, sort_keys=True) + "\n")
    summary = summarize(records)
    write_json(out / "utility.json", {**meta, "definition": "mean answer-token NLL without - with the document "
                                                            "(nats; > 0: the document helps)", "modes": summary})
    modes = list(summary)
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(4 * max(1, len(modes)), 3), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        ax.hist([r["utility"] for r in records if r["mode"] == mode], bins=40, color="tab:blue")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(f"{mode}: mean {summary[mode]['mean']:.2f}, >0 {100 * summary[mode]['share_positive']:.0f} %")
        ax.set_xlabel("utility (nats per answer token)")
    fig.tight_layout()
    with atomic_write(out / "utility.png", "wb") as fh:  # a unique temporary name, not a fixed one
        fig.savefig(fh, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    output.complete()
    return summary


def load_utility(path, *, min_utility: float) -> dict[tuple[int, str], bool]:
    """``{(line, mode): utility > min_utility}`` from a utility.jsonl file.

    Raises:
        InputError: a malformed line (file and line named).
    """
    keep = {}
    for lineno, row in iter_jsonl(path):
        try:
            keep[(int(row["line"]), str(row["mode"]))] = float(row["utility"]) > min_utility
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(path, lineno, "utility", f"expected line, mode and utility: {exc}") from None
    return keep


def cli_utility(args) -> int:
    """``ratune data utility``: measure each built row's document utility with a model and write it (``args`` from its parser, ratune/cli.py). Returns 0."""
    StageOutput(args.out, UTILITY_STAGE).check()  # refused before a model is loaded
    set_torch_threads(args.threads)
    model_path = resolve_model_path(args.model)
    built = Path(args.data) / "manifest.json"  # the rows' chat template (data build --chat-template)
    chat_template = (read_json_object(built).get("settings") or {}).get("chat_template") if built.exists() else None
    tokenizer = use_chat_template(load_tokenizer(model_path), chat_template)
    require_chat_template(tokenizer, source=str(model_path), hint="build the data with --chat-template (the "
                          "manifest gives it to this command)")
    model = load_model(model_path)
    records = measure_utility(args.data, args.modes, model, tokenizer, split=args.split,
                              max_examples=args.max_examples, batch_size=args.batch_size)
    meta = {**base_manifest(UTILITY_STAGE), "data": args.data, "model": str(model_path), "split": args.split,
            "max_examples": args.max_examples}
    summary = write_utility(records, args.out, meta=meta)
    for mode, s in summary.items():
        print(f"{mode:8s} n {s['n']:4d}  mean {s['mean']:+.3f}  p10 {s['p10']:+.3f}  p50 {s['p50']:+.3f}  "
              f"p90 {s['p90']:+.3f}  > 0: {100 * s['share_positive']:.1f} %")
    print(f"wrote {args.out}")
    return 0
