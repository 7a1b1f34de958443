"""Export a trained checkpoint as a self-contained Hugging Face model folder, optionally pushed to
the hub: ``ratune export CHECKPOINT --out DIR [--merge-lora] [--push-to-hub REPO_ID] [--private]``.

Exported folder (written into a new ratune-owned sibling ``.ratune-tmp.XXXXXXXX.DIR``, then
renamed to ``DIR``, under ``DIR``'s lock)::

    config.json, model.safetensors    the weights (safetensors only), LoRA merged
    generation_config.json            greedy decoding; eos_token_id = the EOS the model was trained
                                      to stop at (the training tokenizer's), pad_token_id set
    tokenizer files                   the training tokenizer (chat template included)
    README.md                         model card (huggingface_hub ModelCard): metadata, RAT recipe,
                                      data file hashes, versions, measured Table 2 row
    ratune_export.json                the same facts, machine-readable

A run trained on an API catalog (its run manifest records ``catalog``, :func:`ratune.train.sft.check_data_hub`)
gets a card that names the catalog (its name, that it is the user's own APIs imported with ``ratune
catalog import``, the import source's kind and sha256) and carries no APIBench dataset metadata.

The hub token is read with :func:`huggingface_hub.get_token` (``$HF_TOKEN``, then the token file
of ``hf auth login``); it is handed to :class:`huggingface_hub.HfApi` only and never written to
any file. A push requested without a token fails before anything is loaded or written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

from ratune.args import input_dir, input_file, output_dir
from ratune.hubs import manifest_hub_record, recorded_hub_kind
from ratune.errors import RatuneError
from ratune.eval.report import _axes, _complete, headline_metric, make_cell, metric_block
from ratune.io import open_file_modes, read_json, sha256_file, stale_temp_folders, temp_folder, write_json
from ratune.locks import locked_output
from ratune.manifest import EXPORT_STAGE, is_complete, package_versions
from ratune.models import load_model, load_tokenizer
from ratune.train.layout import model_folder

#: Hub id of the base model behind each ratune model alias (ratune/models.py).
BASE_MODEL_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
#: The training data on the hub (Gorilla's APIBench): the card's ``datasets`` of APIBench-trained runs only.
DEFAULT_LICENSE = "apache-2.0"
BASE_TAGS = ("ratune", "gorilla", "api-calling", "retriever-aware-training", "lora-merged")
EXPORT_MANIFEST = "ratune_export.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# ---------------------------------------------------------------------------------------------
# reading the checkpoint


def _read_json(path: Path) -> dict:
    return read_json(path)


def _source(checkpoint: Path) -> tuple[Path, dict | None]:
    """``(model folder, run manifest or None)`` of a run folder or a plain model folder; the model
    folder of a run that saved only ``adapter/`` (QLoRA) is that adapter folder
    (:func:`ratune.train.layout.resolve_checkpoint`)."""
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
    """The hub id for the card's ``base_model``: explicit, else the alias map, else the config's
    ``model`` when it looks like a hub id and is not a local folder; None when unknown."""
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
    """``(inputs {file: sha256} or None, note)`` from the training data manifest, checked against
    the data manifest hash the run recorded."""
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


def _table2_cells(train_retriever: str | None, table2: str | os.PathLike | None,
                  eval_dirs: Sequence[str | os.PathLike] | None, model_folder: Path) -> tuple[list[dict], str | None]:
    """Measured cells of this checkpoint's Table 2 row and the hub they were measured on."""
    if (table2 or eval_dirs) and not train_retriever:
        raise RatuneError("a Table 2 row needs the checkpoint's train_retriever: export a ratune run folder")
    cells, hub = [], None
    if table2:
        table = _read_json(Path(table2))
        hub = table.get("hub")
        found = [_complete(c) for c in table.get("cells", []) if c.get("train_retriever") == train_retriever]
        if not found:
            raise RatuneError(f"{table2}: no cell with train_retriever {train_retriever!r} "
                              f"(the table has {sorted({c.get('train_retriever') for c in table.get('cells', [])})})")
        cells += found
    for folder in eval_dirs or ():
        folder, before = Path(folder), len(cells)
        for cell in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else ():
            if not (is_complete(cell) and (cell / "metrics.json").exists()):
                continue
            identity = cell / "identity.json"
            if identity.exists():
                ident = _read_json(identity)
                if ident.get("checkpoint") and Path(ident["checkpoint"]) != model_folder.resolve():
                    raise RatuneError(f"{cell}: measured on {ident['checkpoint']}, not on {model_folder.resolve()}")
                hub = ident.get("hub", hub)
            cells.append(make_cell(train_retriever, cell.name, _read_json(cell / "metrics.json")))
        if len(cells) == before:
            raise RatuneError(f"{folder}: no complete eval cells ({{setting}}/metrics.json with .complete)")
    seen, unique = set(), []
    for c in cells:  # an eval folder and table2.json may hold the same cell: keep the first
        if c["test_retriever"] not in seen:
            seen.add(c["test_retriever"])
            unique.append(c)
    return unique, hub


def check_vocabulary(model, tokenizer, *, base_rows: int | None = None) -> dict:
    """Check that every token id the tokenizer can produce has an embedding row, and that the
    embedding matrix was not resized during training.

    The rule: the input (and, when untied, output) embedding rows must equal ``len(tokenizer)``;
    more rows than tokens is accepted only when the base model had exactly that many rows, i.e.
    the padding is the base model's own (many models pad the matrix to a multiple of 64 or 128;
    those rows are never indexed) and no vocabulary was added or removed during training. Fewer
    rows than tokens is always refused: token ids >= rows (e.g. a pad token added to the tokenizer
    without resizing the model) would index past the matrix. ratune itself never adds tokens
    (:func:`ratune.models.load_tokenizer` pads with EOS).

    Args:
        model: a causal LM.
        tokenizer: the tokenizer to export with it.
        base_rows: embedding rows of the base model before training (None when unknown: then any
            rows >= len(tokenizer) are accepted, the model's own config being the reference).
    Returns:
        ``{"embedding_rows", "tokenizer_length"}``.
    Raises:
        RatuneError: naming both numbers when the rows and the tokenizer length disagree as above.
    """
    rows = int(model.get_input_embeddings().weight.shape[0])
    out_emb = model.get_output_embeddings()
    n_tok = len(tokenizer)
    if out_emb is not None and int(out_emb.weight.shape[0]) != rows:
        raise RatuneError(f"vocabulary mismatch: input embeddings have {rows} rows but the output layer has "
                          f"{int(out_emb.weight.shape[0])}; refusing to export")
    if rows < n_tok:
        raise RatuneError(
            f"vocabulary mismatch: the model has {rows} embedding rows but the tokenizer has {n_tok} tokens "
            f"(tokens were added without resizing the embeddings); refusing to export a model that cannot "
            f"embed token ids {rows}..{n_tok - 1}")
    if rows > n_tok and base_rows is not None and rows != base_rows:
        raise RatuneError(
            f"vocabulary mismatch: the model has {rows} embedding rows but the tokenizer has {n_tok} tokens, "
            f"and the base model had {base_rows} rows (the embeddings were resized during training); "
            f"refusing to export")
    return {"embedding_rows": rows, "tokenizer_length": n_tok}


# ---------------------------------------------------------------------------------------------
# the model card


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _trained_hub(recipe: dict):
    """``(name, record, hub class)`` of the hub a run was trained on (its manifest's ``hub`` and
    hub record, :func:`ratune.hubs.recorded_hub_kind`)."""
    kind, record = manifest_hub_record(recipe)
    name = (record or {}).get("name") or recipe.get("hub")
    return name, record, recorded_hub_kind(name, kind)


def _results_hub(table_hub: str | None, recipe: dict):
    """``(hub, hub class)`` of the Table 2 row: the table's (or eval cells') hub, else the hub of a
    run whose manifest records one beyond its name (None: an APIBench hub not named)."""
    kind, record = manifest_hub_record(recipe)
    if table_hub is None and record is not None:
        return record.get("name"), recorded_hub_kind(record.get("name"), kind)
    return table_hub, recorded_hub_kind(table_hub)


def _main_block(cell: dict) -> dict:
    """A cell's headline metric: the gorilla rates at its top level (APIBench), else its ``strict``
    block (a catalog's cell has no gorilla metric: eval/report.py ``make_cell``)."""
    return metric_block(cell, headline_metric([cell]))


def _table_row_markdown(cells: list[dict], hub: str | None, kind) -> str:
    """The card's Table 2 row: the headline metric's rates, and the strict accuracy beside them
    when the headline metric is another one (``kind``: the hub class, which names the data)."""
    _, cols = _axes(cells)
    by = {c["test_retriever"]: c for c in cells}
    strict_only = headline_metric(cells) == "strict"
    lines = [kind.card_measured(hub), ""]
    if strict_only:
        lines += ["| test-time retrieval | strict accuracy [95 % CI] | hallucination | error | n |", "|---|---|---|---|---|"]
    else:
        lines += ["| test-time retrieval | accuracy [95 % CI] | hallucination | error | strict accuracy | n |",
                  "|---|---|---|---|---|---|"]
    for col in cols:
        c = by[col]
        main = _main_block(c)
        ci = main.get("accuracy_ci")
        acc = _pct(main["accuracy"]) + (f" [{_pct(ci[0])}-{_pct(ci[1])}]" if ci else "")
        strict = c.get("strict") or {}
        s_acc = "-"
        if "accuracy" in strict:
            sci = strict.get("accuracy_ci")
            s_acc = _pct(strict["accuracy"]) + (f" [{_pct(sci[0])}-{_pct(sci[1])}]" if sci else "")
        rates = f"| {col} | {acc} | {_pct(main.get('hallucination', 0.0))} | {_pct(main.get('error', 0.0))} "
        lines.append(rates + (f"| {c['n']} |" if strict_only else f"| {s_acc} | {c['n']} |"))
    return "\n".join(lines)


def _recipe(manifest: dict | None) -> dict:
    if not manifest:
        return {}
    cfg = manifest.get("config", {})
    lora = cfg.get("lora", {}) or {}
    recipe = {
        # the hub's name: the run manifest's (train/sft.py check_data_hub), else the config's (older runs)
        "train_retriever": cfg.get("train_retriever"), "hub": manifest.get("hub", cfg.get("hub")),
        "learning_rate": cfg.get("learning_rate"), "lr_scheduler": cfg.get("lr_scheduler"),
        "warmup_ratio": cfg.get("warmup_ratio"), "weight_decay": cfg.get("weight_decay"),
        "global_batch_size": manifest.get("global_batch_size", cfg.get("global_batch_size")),
        "per_device_batch_size": manifest.get("per_device_batch_size"),
        "gradient_accumulation_steps": manifest.get("gradient_accumulation_steps"),
        "num_processes": manifest.get("num_processes"),
        "num_epochs": cfg.get("num_epochs"), "max_steps": cfg.get("max_steps"), "steps": manifest.get("steps"),
        "max_examples": cfg.get("max_examples"), "max_length": cfg.get("max_length"),
        "max_document_tokens": (manifest.get("prompt") or {}).get("max_document_tokens"),
        "dtype": cfg.get("dtype"), "bf16": cfg.get("bf16"), "seed": cfg.get("seed"),
        "lora": ({k: lora.get(k) for k in ("r", "alpha", "dropout", "target_modules")}
                 if lora.get("enabled") else None),
        "load_in_4bit": bool(cfg.get("load_in_4bit")),  # QLoRA: trained on a 4-bit base, merged into the 16/32-bit one
        "examples": (manifest.get("data") or {}).get("examples"),
        "train_tokens": (manifest.get("data") or {}).get("tokens"),
    }
    kind, record = manifest_hub_record(manifest)
    if record is not None:  # a hub recorded beyond its name (a catalog), under its kind; no local paths
        source = record.get("import_source") or {}
        recipe[kind] = {"name": record.get("name"),
                        "import_source": {k: source[k] for k in ("kind", "module", "sha256") if k in source}}
    return recipe


def _card_body(*, title: str, base_model: str | None, base_note: str | None, recipe: dict, hashes: dict | None,
               hash_note: str, versions: dict, vocab: dict, eos: tuple[str, int], cells: list[dict],
               table_hub: str | None, merged_from_adapter: bool) -> str:
    r = recipe
    hub, record, kind = _trained_hub(r)
    out = [f"# {title}", ""]
    if r:
        trained_on = kind.card_trained_on(hub, record)
        out += [f"A retriever-aware-training (RAT) finetune, after Gorilla (Patil et al., NeurIPS 2024, "
                f"arXiv 2305.15334), of `{base_model or base_note or 'an unknown base model'}` for API calling "
                f"{trained_on}, trained with **train-time retrieval `{r.get('train_retriever')}`** "
                "(loss on the answer and EOS only), exported by ratune.", ""]
    else:
        out += ["A model exported by ratune (not from a ratune training run folder: recipe unknown).", ""]
    out += ["## Prompt", "",
            "One user turn, rendered with the tokenizer's chat template: the instruction, plus, when a "
            "document is retrieved, `\\nUse this API documentation for reference: <document as compact JSON>`. "
            "The answer has the fields `<<<domain>>>`, `<<<api_call>>>`, `<<<api_provider>>>`, "
            f"`<<<explanation>>>`, `<<<code>>>` and ends with `{eos[0]}` (id {eos[1]}), the generation config's "
            "eos_token_id. Decode greedily.", ""]
    if r:
        lora = r.get("lora")
        steps = r.get("steps")
        epochs = (f"{steps} optimizer step{'s' if steps != 1 else ''}" if steps is not None else "?") + (
            f" (max_steps {r['max_steps']})" if r.get("max_steps") else f" ({r.get('num_epochs')} epochs)")
        out += ["## RAT recipe", "", "| setting | value |", "|---|---|",
                f"| train-time retrieval | `{r.get('train_retriever')}` |",
                f"| learning rate | {r.get('learning_rate')} ({r.get('lr_scheduler')}, warmup ratio "
                f"{r.get('warmup_ratio')}) |",
                f"| global batch | {r.get('global_batch_size')} = {r.get('per_device_batch_size')} per device x "
                f"{r.get('gradient_accumulation_steps')} accumulation x {r.get('num_processes')} processes |",
                f"| training length | {epochs} |",
                f"| examples | {r.get('examples')}" + (f" (max_examples {r['max_examples']})" if r.get("max_examples")
                                                        else "") + " |",
                f"| max length | {r.get('max_length')} tokens (documents cut to {r.get('max_document_tokens')}) |",
                "| LoRA | " + (("QLoRA (trained on the base in 4-bit NF4), " if r.get("load_in_4bit") else "")
                               + f"rank {lora['r']}, alpha {lora['alpha']}, dropout {lora['dropout']}, modules "
                               f"{lora['target_modules']}; merged into the "
                               + ("unquantized " if r.get("load_in_4bit") else "") + "base"
                               + (" at export" if merged_from_adapter else " after training")
                               if lora else "no (full finetune)") + " |",
                f"| dtype | {r.get('dtype')} (bf16 {r.get('bf16')}) |",
                f"| seed | {r.get('seed')} |", ""]
    out += ["## Training data", ""]
    out += kind.card_training_data(hub, record)
    if hashes:
        out += [f"{kind.card_files_label(hub, record)} ({hash_note}):", "",
                "| file | sha256 |", "|---|---|"] + [f"| {k} | `{v}` |" for k, v in sorted(hashes.items())] + [""]
    else:
        out += [f"Data file hashes unavailable: {hash_note}.", ""]
    out += ["## Results (Table 2 row)", ""]
    if cells:
        out += [_table_row_markdown(cells, *_results_hub(table_hub, r)), ""]
    else:
        out += ["Not measured at export (pass `--table2 FILE` to include this checkpoint's row).", ""]
    out += ["## Export", "",
            f"Embedding rows {vocab['embedding_rows']}, tokenizer length {vocab['tokenizer_length']}.", "",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())), ""]
    return "\n".join(out)


def _model_card(*, model_name: str, base_model: str | None, license: str, recipe: dict, cells: list[dict],
                table_hub: str | None, body: str):
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    tags = list(BASE_TAGS)
    if recipe.get("train_retriever"):
        tags.append(f"train-retriever-{recipe['train_retriever']}")
    if recipe.get("hub"):
        tags.append(recipe["hub"])  # a catalog's name for a catalog-trained run
    _, _, trained_kind = _trained_hub(recipe)
    tags += trained_kind.card_tags
    if not recipe.get("lora"):
        tags.remove("lora-merged")
    hub, kind = _results_hub(table_hub, recipe)
    dataset = kind.card_dataset(hub)
    results = [EvalResult(task_type="text-generation", task_name="API call generation", **dataset, dataset_split="eval",
                          metric_type="accuracy",
                          metric_name=f"{'AST' if 'accuracy' in c else 'strict API'} accuracy ({c['test_retriever']} retrieval)",
                          metric_value=round(float(_main_block(c)["accuracy"]), 6),
                          metric_config=c["test_retriever"])
               for c in cells]
    data = ModelCardData(base_model=base_model, datasets=list(trained_kind.card_datasets or []) or None,
                         library_name="transformers",
                         license=license, tags=tags, pipeline_tag="text-generation", language=["en"],
                         model_name=model_name, eval_results=results or None)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


# ---------------------------------------------------------------------------------------------
# export


def _hub_token(push_to_hub: str | None, private: bool) -> str | None:
    if push_to_hub is None:
        if private:
            raise RatuneError("--private only applies with --push-to-hub REPO_ID")
        return None
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(push_to_hub)
    except HFValidationError as exc:
        raise RatuneError(f"--push-to-hub {push_to_hub!r}: not a valid repo id ({exc})") from None
    if "/" not in push_to_hub:
        raise RatuneError(f"--push-to-hub {push_to_hub!r}: give the full repo id, OWNER/NAME")
    token = get_token()
    if not token:
        raise RatuneError(f"--push-to-hub {push_to_hub}: no Hugging Face token found; set $HF_TOKEN or run "
                          "`hf auth login`, then rerun (nothing was exported)")
    return token


def _check_export_arguments(checkpoint, out_dir, *, push_to_hub, private, **_) -> None:
    """What :func:`export_checkpoint` checks before it takes ``out_dir``'s lock, so that a refusal
    writes nothing (no lock file either): the push's repo id and hub token (:func:`_hub_token`)
    and the export folder (:func:`_check_out`).

    Raises:
        RatuneError: see :func:`_hub_token` and :func:`_check_out`.
    """
    _hub_token(push_to_hub, private)
    _check_out(Path(checkpoint), Path(out_dir).resolve())


@locked_output("out_dir", command=EXPORT_STAGE, resolve=True, check=_check_export_arguments)
def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, merge_lora: bool = False,
                      push_to_hub: str | None = None, private: bool = False,
                      eval_dirs: Sequence[str | os.PathLike] | None = None,
                      table2: str | os.PathLike | None = None, base_model: str | None = None,
                      license: str = DEFAULT_LICENSE) -> Path:
    """Export a checkpoint as a Hugging Face model folder (see the module docstring).

    The arguments, the hub token and ``out_dir`` are checked first (:func:`_check_export_arguments`,
    writing nothing); then ``out_dir``'s lock is taken (resolved; :func:`ratune.locks.locked_output`)
    before any model is loaded, so a second export of the same folder is refused at once, and held
    to the end.

    Args:
        checkpoint: a ``ratune train`` run folder (preferred: its manifest gives the recipe, the
            data hashes and the base model) or a plain model folder holding config.json (a run's
            ``model/`` that carries ``ratune_manifest.json`` gives the recipe too; that file, which
            holds local paths, is not exported).
        out_dir: the folder to create; refused when it exists and is not empty, and when it is
            inside the checkpoint or holds it (both paths resolved first, so ``..`` is fine).
            Written into a new ratune-owned temporary sibling (:func:`ratune.io.temp_folder`)
            and renamed; nothing else beside it is touched.
        merge_lora: when the run has ``adapter/``, load the base model (the run manifest's
            ``model_path``, unquantized, in the run's ``dtype``) and merge the adapter into it with
            peft's ``merge_and_unload`` (:func:`ratune.models.load_adapter_merged`); without
            an adapter (full finetune, or a plain model folder) the model is exported as it is.
            Without this flag ``model/`` (already merged by training) is exported. A QLoRA run
            (``load_in_4bit: true``) saves only ``adapter/`` and needs this flag.
        push_to_hub: ``OWNER/NAME``: after a successful export, create the model repo (exist_ok)
            and upload the folder with :class:`huggingface_hub.HfApi`.
        private: create the repo private (only with ``push_to_hub``; an existing repo keeps its
            visibility).
        eval_dirs: ``ratune eval run`` output folders of this checkpoint; their complete
            ``{setting}/metrics.json`` cells go into the card (a cell measured on another
            checkpoint, per its identity.json, is refused).
        table2: a ``table2.json``; its cells whose ``train_retriever`` equals this run's go into
            the card (the caller vouches that they were measured on this checkpoint).
        base_model: hub id for the card's ``base_model`` metadata; default: the demo alias's hub
            id or the config's ``model`` when that is a hub id. A push needs one; a local export
            without one leaves ``base_model`` out of the metadata and says so in the card.
        license: the card's license (default apache-2.0; a finetune keeps its base model's terms).
    Returns:
        The exported folder.
    Raises:
        RatuneError: bad arguments or missing hub token (before any work); missing or incomplete
            checkpoint; a QLoRA run without --merge-lora; --merge-lora whose base model folder is
            gone, or is a quantized checkpoint; existing non-empty
            ``out_dir``, or one inside the checkpoint (or holding it); vocabulary mismatch
            (:func:`check_vocabulary`); a Table 2 file without this run's row; a failed upload
            (the local export is kept).
        LockHeld: another process is writing ``out_dir`` (:mod:`ratune.locks`).
    """
    checkpoint, out = Path(checkpoint), Path(out_dir).resolve()
    token = _hub_token(push_to_hub, private)  # checked before the lock (_check_export_arguments); read here
    folder, manifest = _source(checkpoint)
    cfg = (manifest or {}).get("config", {})
    base_id = _resolve_base_model_id(manifest, base_model)
    if push_to_hub and not base_id:
        raise RatuneError(f"{checkpoint}: the base model {cfg.get('model') or '(unknown)'} is not a hub id; pass "
                          "--base-model OWNER/NAME so the card's base_model metadata is valid on the hub")
    cells, table_hub = _table2_cells(cfg.get("train_retriever"), table2, eval_dirs, folder)

    import torch
    from transformers import GenerationConfig

    dtype = cfg.get("dtype", "float32")
    trust = bool(cfg.get("trust_remote_code", False))
    adapter = checkpoint / "adapter"
    adapter_only = folder == adapter  # a QLoRA run: adapter/ and no model/
    if adapter_only and not merge_lora:
        raise RatuneError(f"{checkpoint}: this run saved only its LoRA adapter (QLoRA, load_in_4bit: true: no merged "
                          "model/ is written at train time); export it with --merge-lora, which merges the adapter "
                          "into the unquantized base")
    merged_from_adapter = bool(merge_lora and manifest and (adapter / "adapter_config.json").exists())
    base_rows = None
    if manifest and manifest.get("model_path") and (Path(manifest["model_path"]) / "config.json").exists():
        base_cfg = _read_json(Path(manifest["model_path"]) / "config.json")
        base_rows = base_cfg.get("vocab_size") or (base_cfg.get("text_config") or {}).get("vocab_size")
    if merged_from_adapter:
        # the adapter merged into the UNQUANTIZED base, in the run's dtype (QLoRA runs too: a merge into
        # their 4-bit base would round the merged weights to 4 bits again)
        from ratune.train.layout import adapter_base
        from ratune.models import load_adapter_merged

        base = adapter_base(manifest, checkpoint / "manifest.json",
                            hint="" if adapter_only else "; export without --merge-lora (model/ is already merged)")
        model = load_adapter_merged(base, adapter, dtype=dtype, trust_remote_code=trust)
    else:
        model = load_model(folder, dtype=dtype, trust_remote_code=trust)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust)  # the training tokenizer, saved with model/
    vocab = check_vocabulary(model, tokenizer, base_rows=base_rows)

    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise RatuneError(f"{folder}: the tokenizer has no EOS token; cannot tell where answers end")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    model.config.eos_token_id, model.config.pad_token_id = eos_id, pad_id
    gen = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=pad_id,
                           do_sample=False)
    model.generation_config = gen

    recipe = _recipe(manifest)
    hashes, hash_note = _data_hashes(manifest)
    versions = dict((manifest or {}).get("versions") or {})
    export_versions = package_versions()
    try:
        from importlib.metadata import version

        export_versions["huggingface_hub"] = version("huggingface_hub")
    except Exception:  # pragma: no cover - huggingface_hub is a transformers dependency
        pass
    model_name = push_to_hub.split("/")[-1] if push_to_hub else out.name
    base_note = None if base_id else (f"a local base model ({Path(cfg['model']).name}; no hub id given)"
                                      if cfg.get("model") else None)
    body = _card_body(title=model_name, base_model=base_id, base_note=base_note, recipe=recipe, hashes=hashes,
                      hash_note=hash_note, versions=versions or export_versions, vocab=vocab,
                      eos=(tokenizer.eos_token, eos_id), cells=cells, table_hub=table_hub,
                      merged_from_adapter=merged_from_adapter)
    card = _model_card(model_name=model_name, base_model=base_id, license=license, recipe=recipe, cells=cells,
                       table_hub=table_hub, body=body)

    _check_out(checkpoint, out)  # again: it may have changed while the model loaded
    for stale in stale_temp_folders(out):  # a killed export's (under the lock: no live writer's)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temp_folder(out)  # unique and ratune's: a user's OUT.tmp is never touched
    try:
        with torch.no_grad():
            model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        gen.save_pretrained(str(tmp))
        card.save(str(tmp / "README.md"))
        write_json(tmp / EXPORT_MANIFEST, {
            "command": EXPORT_STAGE, "source": {"checkpoint_name": checkpoint.name, "run": manifest is not None,
                                            "merged_lora_at_export": merged_from_adapter},
            "base_model": base_id, "recipe": recipe, "data_inputs": hashes, "data_note": hash_note,
            "data_manifest_sha256": (manifest or {}).get("data_manifest_sha256"),
            "training_versions": versions, "export_versions": export_versions, "vocabulary": vocab,
            "eos_token_id": eos_id, "pad_token_id": pad_id, "table2_cells": cells, "table2_hub": table_hub,
            "git_commit": (manifest or {}).get("git_commit"),
        })
        for stray in tmp.glob("*.bin"):  # safetensors only
            stray.unlink()
        if out.exists():
            out.rmdir()  # empty (checked above)
        open_file_modes(tmp)  # safetensors writes 0600; the folder's other files have open()'s mode
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if push_to_hub:
        push_folder(out, push_to_hub, token=token, private=private)
    return out


def _check_out(checkpoint: Path, out: Path) -> None:
    """Refuse an export folder that exists and is not empty, or that is inside the checkpoint or
    holds it (compared resolved: symlinks and ``..`` followed).

    Raises:
        RatuneError: naming the folder and the reason.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RatuneError(f"{out}: output folder exists and is not empty; choose another --out")
    source = checkpoint.resolve()
    if out == source or source in out.parents:
        raise RatuneError(f"{out}: the export folder is inside the checkpoint {source}; choose an --out outside it")
    if out in source.parents:
        raise RatuneError(f"{out}: the export folder would hold the checkpoint {source}; choose another --out")


def push_folder(folder: str | os.PathLike, repo_id: str, *, token: str, private: bool = False) -> str:
    """Create ``repo_id`` (a model repo; exist_ok) and upload ``folder`` to it.

    Returns:
        The repo URL.
    Raises:
        RatuneError: when the hub refuses or cannot be reached (the local folder is kept).
    """
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="Upload model exported by ratune")
    except Exception as exc:  # network, auth, validation: all reported the same way
        raise RatuneError(f"push to {repo_id} failed ({type(exc).__name__}: {exc}); the export is kept in "
                          f"{folder}") from None
    return str(url)


# ---------------------------------------------------------------------------------------------
# CLI


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
    """``ratune export CHECKPOINT --out DIR ...``: run :func:`export_checkpoint`, print
    ``{"out": DIR, "pushed_to": REPO_ID or null}`` as JSON. Raises RatuneError like it."""
    out = export_checkpoint(args.checkpoint, args.out, merge_lora=args.merge_lora, push_to_hub=args.push_to_hub,
                            private=args.private, eval_dirs=args.eval_dirs, table2=args.table2,
                            base_model=args.base_model, license=args.license)
    print(json.dumps({"out": str(out), "pushed_to": args.push_to_hub}))
    return 0
