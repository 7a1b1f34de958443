"""The model card of an exported checkpoint: the RAT recipe, the training data, the measured Table 2
row and the card's metadata (:class:`huggingface_hub.ModelCard`); the hub kind names the data."""

from __future__ import annotations

from ratune.eval.report import headline_metric, metric_block, table_axes
from ratune.hubs import manifest_hub_record, recorded_hub_kind

#: The card's license unless given (a finetune keeps its base model's terms).
DEFAULT_LICENSE = "apache-2.0"
BASE_TAGS = ("ratune", "gorilla", "api-calling", "retriever-aware-training", "lora-merged")


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
    _, cols = table_axes(cells)
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


def recipe_of(manifest: dict | None) -> dict:
    """The training recipe a card shows, from a run manifest ({} without one); no local paths."""
    if not manifest:
        return {}
    cfg = manifest.get("config", {})
    lora = cfg.get("lora", {}) or {}
    recipe = {
        # the hub's name: the run manifest's (train/preflight.py check_data_hub), else the config's (older runs)
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


def card_body(*, title: str, base_model: str | None, base_note: str | None, recipe: dict, hashes: dict | None,
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


def model_card(*, model_name: str, base_model: str | None, license: str, recipe: dict, cells: list[dict],
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
