"""``ratune export``: a trained checkpoint as a self-contained Hugging Face model folder, optionally
pushed to the hub (folder layout, card and push: docs/pipeline.md#export)."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Sequence

from ratune.args import input_dir, input_file, output_dir
from ratune.errors import InputError, RatuneError
from ratune.eval.report import make_cell, with_intervals
from ratune.eval.results import finished_cells
from ratune.export.card import DEFAULT_LICENSE, card_body, model_card, recipe_of
from ratune.export.checks import check_out_folder
from ratune.export.merge import load_export_model
from ratune.export.push import hub_token, push_folder
from ratune.io import read_json, read_json_object, sha256_file, write_json
from ratune.manifest import EXPORT_STAGE, is_complete, package_versions
from ratune.output import StageOutput
from ratune.train.layout import model_folder

#: Hub id of the base model behind each ratune model alias (ratune/models.py).
BASE_MODEL_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
EXPORT_MANIFEST = "ratune_export.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _read_json(path: Path) -> dict:
    return read_json(path)


def _source(checkpoint: Path) -> tuple[Path, dict | None]:
    """``(model folder, run manifest or None)`` of a run folder (``adapter/`` for a QLoRA run) or a
    plain model folder."""
    if not checkpoint.exists():
        raise RatuneError(f"{checkpoint}: checkpoint does not exist")
    folder = model_folder(checkpoint)
    if folder in (checkpoint / "model", checkpoint / "adapter") and (checkpoint / "manifest.json").exists():
        if not is_complete(checkpoint):
            raise RatuneError(f"{checkpoint}: training run is not complete (no .complete marker); "
                              "finish or resume it before exporting")
        return folder, _read_json(checkpoint / "manifest.json")
    if (folder / "ratune_manifest.json").exists():  # a run's model/ given directly carries the run manifest
        return folder, _read_json(folder / "ratune_manifest.json")
    return folder, None


def _resolve_base_model_id(manifest: dict | None, base_model: str | None) -> str | None:
    """The card's ``base_model`` hub id: explicit, else the alias's, else the config's hub-id-like
    ``model``; None when unknown."""
    if base_model:
        return base_model
    if not manifest:
        return None
    name = str(manifest.get("config", {}).get("model", ""))
    if name in BASE_MODEL_IDS:
        return BASE_MODEL_IDS[name]
    if _HUB_ID.match(name) and not Path(name).exists():
        return name
    return None


def _data_hashes(manifest: dict | None) -> tuple[dict | None, str]:
    """``(inputs {file: sha256} or None, note)`` from the training data manifest, if unchanged since training."""
    if not manifest:
        return None, "not a ratune run folder: training data unknown"
    data_dir = manifest.get("config", {}).get("data_dir")
    path = Path(data_dir) / "manifest.json" if data_dir else None
    if path is None or not path.exists():
        return None, f"data manifest {path} not reachable from here"
    recorded = manifest.get("data_manifest_sha256")
    if recorded and sha256_file(path) != recorded:
        return None, f"{path} changed since training (sha256 differs from the run manifest)"
    return dict(_read_json(path).get("inputs", {})), "from the training data manifest"


def _table2_list(path, table: dict) -> list[dict]:
    """A table2.json's ``cells``, each a JSON object.

    Raises:
        InputError: naming the file and the field.
    """
    cells = table.get("cells", [])
    if not isinstance(cells, list):
        raise InputError(str(path), None, "cells", f"expected a list of cells, got {type(cells).__name__}")
    for i, c in enumerate(cells):
        if not isinstance(c, dict):
            raise InputError(str(path), None, f"cells[{i}]", f"expected a JSON object, got {type(c).__name__}")
    return cells


#: Why an export's model card refuses a cell of validation questions.
_NOT_TEST = ("scored on the {split} questions (ratune eval run --split {split}); a model card reports the test "
             "questions: evaluate the checkpoint on them (no --split) and export with that")


def _table2_cell(path, i: int, cell: dict) -> dict:
    """One cell of a table2.json with its intervals (:func:`ratune.eval.report.with_intervals`).

    Raises:
        InputError: no ``test_retriever``, a cell of validation questions (``split``), ``n`` not a
            count, or rates that give no interval.
    """
    if not isinstance(cell.get("test_retriever"), str):
        raise InputError(str(path), None, f"cells[{i}].test_retriever", "missing or not a string")
    if "split" in cell:
        raise InputError(str(path), None, f"cells[{i}].split", _NOT_TEST.format(split=cell["split"]))
    n = cell.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(str(path), None, f"cells[{i}].n", f"expected the number of questions (an integer >= 0), "
                         f"got {n!r}")
    try:
        return with_intervals(cell)
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(str(path), None, f"cells[{i}]", f"not a Table 2 cell ({exc})") from None


def _table2_cells(train_retriever: str | None, table2: str | os.PathLike | None,
                  eval_dirs: Sequence[str | os.PathLike] | None, model_folder: Path) -> tuple[list[dict], str | None]:
    """Measured cells of this checkpoint's Table 2 row and the hub they were measured on."""
    if (table2 or eval_dirs) and not train_retriever:
        raise RatuneError("a Table 2 row needs the checkpoint's train_retriever: export a ratune run folder")
    cells, hub = [], None
    if table2:
        table = read_json_object(Path(table2))
        hub = table.get("hub")
        found = [_table2_cell(table2, i, c) for i, c in enumerate(_table2_list(table2, table))
                 if c.get("train_retriever") == train_retriever]
        if not found:
            raise RatuneError(f"{table2}: no cell with train_retriever {train_retriever!r} "
                              f"(the table has {sorted({str(c.get('train_retriever')) for c in table.get('cells', [])})})")
        cells += found
    for folder in eval_dirs or ():
        folder, before = Path(folder), len(cells)
        for cell in finished_cells(folder):
            ident = cell.identity()
            if ident is not None:
                if ident.get("checkpoint") and Path(ident["checkpoint"]) != model_folder.resolve():
                    raise RatuneError(f"{cell.folder}: measured on {ident['checkpoint']}, not on {model_folder.resolve()}")
                hub = ident.get("hub", hub)
            cells.append(make_cell(train_retriever, cell.setting, cell.metrics))
            if "split" in cells[-1]:
                raise RatuneError(f"{cell.metrics_path}: " + _NOT_TEST.format(split=cells[-1]["split"]))
        if len(cells) == before:
            raise RatuneError(f"{folder}: no complete eval cells ({{setting}}/metrics.json with .complete)")
    seen, unique = set(), []
    for c in cells:  # an eval folder and table2.json may hold the same cell: keep the first
        if c["test_retriever"] not in seen:
            seen.add(c["test_retriever"])
            unique.append(c)
    return unique, hub


def _check_export_arguments(checkpoint, out_dir, *, push_to_hub, private) -> None:
    """The checks of :func:`export_checkpoint` before it takes ``out_dir``'s lock (a refusal writes nothing).

    Raises:
        RatuneError: see :func:`ratune.export.push.hub_token` and :func:`ratune.export.checks.check_out_folder`.
    """
    hub_token(push_to_hub, private)
    check_out_folder(Path(checkpoint), Path(out_dir).resolve())


def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, merge_lora: bool = False,
                      push_to_hub: str | None = None, private: bool = False,
                      eval_dirs: Sequence[str | os.PathLike] | None = None,
                      table2: str | os.PathLike | None = None, base_model: str | None = None,
                      license: str = DEFAULT_LICENSE) -> Path:
    """Export ``checkpoint`` (a run folder or a model folder) to the new folder ``out_dir`` and return
    it; the push, if any, runs before the folder is swapped in (docs/pipeline.md#export).

    Args:
        merge_lora: merge the run's ``adapter/`` into its unquantized base (a QLoRA run needs it).
        push_to_hub, private: ``OWNER/NAME`` to create (exist_ok, private if asked) and upload to.
        eval_dirs, table2: eval folders or a ``table2.json`` whose cells of this run go into the card.
        base_model, license: the card's ``base_model`` hub id (a push needs one) and license.
    Raises:
        RatuneError: bad arguments or no hub token (before any work); a missing or unfinished
            checkpoint; a refused ``out_dir``; no Table 2 row for this run; a failed upload (the
            export is kept); as :func:`ratune.export.merge.load_export_model`.
        LockHeld: another process is writing ``out_dir``.
    """
    _check_export_arguments(checkpoint, out_dir, push_to_hub=push_to_hub, private=private)
    checkpoint = Path(checkpoint)
    output = StageOutput(out_dir, EXPORT_STAGE, replace=True, marker=False, command=EXPORT_STAGE)
    refused = None
    with output.writing() as tmp:  # the record file ratune_export.json is the export's marker
        loaded, card, record = _prepare_export(checkpoint, output.out, merge_lora=merge_lora, push_to_hub=push_to_hub,
                                               eval_dirs=eval_dirs, table2=table2, base_model=base_model,
                                               license=license)
        check_out_folder(checkpoint, output.out)  # again: it may have changed while the model loaded
        _write_folder(tmp, loaded, card, record)
        if push_to_hub:  # before the swap: a push cut short leaves no DIR, so the same command pushes again
            try:
                push_folder(tmp, push_to_hub, token=hub_token(push_to_hub, private), private=private, kept=output.out)
            except RatuneError as exc:  # the hub refused or cannot be reached: the export is kept in DIR
                refused = exc
    if refused is not None:
        raise refused
    return output.out


def _prepare_export(checkpoint: Path, out: Path, *, merge_lora: bool, push_to_hub: str | None,
                    eval_dirs: Sequence[str | os.PathLike] | None, table2: str | os.PathLike | None,
                    base_model: str | None, license: str) -> tuple:
    """The loaded model, the card and the record of :func:`export_checkpoint` (its checks done)."""
    folder, manifest = _source(checkpoint)
    cfg = (manifest or {}).get("config", {})
    base_id = _resolve_base_model_id(manifest, base_model)
    if push_to_hub and not base_id:
        raise RatuneError(f"{checkpoint}: the base model {cfg.get('model') or '(unknown)'} is not a hub id; pass "
                          "--base-model OWNER/NAME so the card's base_model metadata is valid on the hub")
    cells, table_hub = _table2_cells(cfg.get("train_retriever"), table2, eval_dirs, folder)
    loaded = load_export_model(checkpoint, folder, manifest, merge_lora=merge_lora)

    recipe = recipe_of(manifest)
    hashes, hash_note = _data_hashes(manifest)
    versions = dict((manifest or {}).get("versions") or {})
    export_versions = _export_versions()
    model_name = push_to_hub.split("/")[-1] if push_to_hub else out.name
    base_note = None if base_id else (f"a local base model ({Path(cfg['model']).name}; no hub id given)"
                                      if cfg.get("model") else None)
    body = card_body(title=model_name, base_model=base_id, base_note=base_note, recipe=recipe, hashes=hashes,
                     hash_note=hash_note, versions=versions or export_versions, vocab=loaded.vocab,
                     eos=loaded.eos, cells=cells, table_hub=table_hub,
                     merged_from_adapter=loaded.merged_from_adapter)
    card = model_card(model_name=model_name, base_model=base_id, license=license, recipe=recipe, cells=cells,
                      table_hub=table_hub, body=body)
    record = {
        "command": EXPORT_STAGE, "source": {"checkpoint_name": checkpoint.name, "run": manifest is not None,
                                        "merged_lora_at_export": loaded.merged_from_adapter},
        "base_model": base_id, "recipe": recipe, "data_inputs": hashes, "data_note": hash_note,
        "data_manifest_sha256": (manifest or {}).get("data_manifest_sha256"),
        "training_versions": versions, "export_versions": export_versions, "vocabulary": loaded.vocab,
        "eos_token_id": loaded.generation.eos_token_id, "pad_token_id": loaded.generation.pad_token_id,
        "table2_cells": cells, "table2_hub": table_hub, "git_commit": (manifest or {}).get("git_commit"),
    }
    return loaded, card, record


def _export_versions() -> dict:
    """The package versions at export, huggingface_hub's included."""
    versions = package_versions()
    try:
        from importlib.metadata import version

        versions["huggingface_hub"] = version("huggingface_hub")
    except Exception:  # pragma: no cover - huggingface_hub is a transformers dependency
        pass
    return versions


def _write_folder(tmp: Path, loaded, card, record: dict) -> None:
    """Write the export into ``tmp``, the folder :class:`ratune.output.StageOutput` swaps in."""
    import torch

    with torch.no_grad():
        loaded.model.save_pretrained(str(tmp), safe_serialization=True)
    loaded.tokenizer.save_pretrained(str(tmp))
    loaded.generation.save_pretrained(str(tmp))
    card.save(str(tmp / "README.md"))
    write_json(tmp / EXPORT_MANIFEST, record)
    for stray in tmp.glob("*.bin"):  # safetensors only
        stray.unlink()


def add_export_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``ratune export`` to ``parser`` (see :func:`cli_export`)."""
    parser.add_argument("checkpoint", metavar="CHECKPOINT", type=input_dir,
                        help="a ratune train run folder or a model folder")
    parser.add_argument("--out", required=True, type=output_dir, help="output folder (must not exist or be empty)")
    parser.add_argument("--merge-lora", dest="merge_lora", action="store_true",
                        help="merge the run's adapter/ into its base model (default: export model/, merged at train)")
    parser.add_argument("--push-to-hub", dest="push_to_hub", default=None, metavar="REPO_ID",
                        help="upload the exported folder to this hub model repo (token: $HF_TOKEN or hf auth login)")
    parser.add_argument("--private", action="store_true", help="create the hub repo private")
    parser.add_argument("--table2", default=None, metavar="FILE", type=input_file,
                        help="table2.json whose row for this run's train_retriever goes into the model card")
    parser.add_argument("--eval", dest="eval_dirs", action="append", default=None, metavar="EVAL_DIR", type=input_dir,
                        help="an eval run folder of this checkpoint whose cells go into the card (repeatable)")
    parser.add_argument("--base-model", dest="base_model", default=None, metavar="REPO_ID",
                        help="hub id of the base model for the card metadata (default from the run config)")
    parser.add_argument("--license", default=DEFAULT_LICENSE, help=f"card license (default {DEFAULT_LICENSE})")
    return parser


def cli_export(args) -> int:
    """``ratune export``: run :func:`export_checkpoint`, print ``{"out", "pushed_to"}`` as JSON."""
    out = export_checkpoint(args.checkpoint, args.out, merge_lora=args.merge_lora, push_to_hub=args.push_to_hub,
                            private=args.private, eval_dirs=args.eval_dirs, table2=args.table2,
                            base_model=args.base_model, license=args.license)
    print(json.dumps({"out": str(out), "pushed_to": args.push_to_hub}))
    return 0
