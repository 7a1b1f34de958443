"""What a training run checks about its data, loggers, QLoRA and save schedule before any folder is
made or model loaded, and its training rows, tokenized and checked as they load."""

from __future__ import annotations

import os
from pathlib import Path

from ratune.config import key_line
from ratune.data.labels import AnswerMerge, NoTrainableTokens, built_answer_tokenization, tokenize_built_row
from ratune.errors import RatuneError
from ratune.hubs import manifest_hub_record, resolve_hub
from ratune.io import read_json, read_json_object
from ratune.manifest import is_complete
from ratune.train.config import TrainConfig


def _template_label(name: str | None) -> str:
    return name if name is not None else "null (the tokenizer's own)"


def check_data_chat_template(config: TrainConfig) -> None:
    """Refuse a ``chat_template`` other than the one the data was built with (the data manifest's
    ``settings.chat_template``; a manifest without it is not checked).

    Raises:
        RatuneError: one line naming both values and the data folder.
    """
    data_manifest = Path(config.data_dir) / "manifest.json"
    if not data_manifest.exists():
        return
    settings = read_json(data_manifest).get("settings") or {}
    if "chat_template" not in settings or settings["chat_template"] == config.chat_template:
        return
    built = settings["chat_template"]
    rebuild = (f"--chat-template {config.chat_template}" if config.chat_template is not None
               else "no --chat-template")
    raise RatuneError(f"chat_template: {_template_label(config.chat_template)} in the training config, but "
                      f"{config.data_dir} was built with chat template {_template_label(built)}; set chat_template: "
                      f"{built if built is not None else 'null'} or rebuild the data with {rebuild}")


def check_data_hub(config: TrainConfig, config_path: str | os.PathLike | None = None) -> dict:
    """The run's hub for its manifest (``{"hub": name}``, plus a catalog's record under its kind), which
    must be the data manifest's, when there is one: the same name, and a catalog exactly when the data
    was built from one.

    Raises:
        RatuneError: naming the config file (``config_path``), the line of its ``hub:`` and the data
            manifest's hub; or :func:`~ratune.hubs.resolve_hub`'s error.
    """
    source = resolve_hub(config.hub, locate=False)
    name = source.name
    data_manifest = Path(config.data_dir) / "manifest.json"
    built = read_json_object(data_manifest) if data_manifest.is_file() else {}
    built_name, (_, built_record) = built.get("hub"), manifest_hub_record(built)
    record = source.manifest_record()
    if built_name is not None and (built_name != name or (record is None) != (built_record is None)):
        given = f"hub: {config.hub}" + (f" ({source.kind} {name!r})" if record is not None else "") + (
            " (the default: the config does not set hub)" if "hub" not in config.model_fields_set else "")
        if built_record is not None:
            found, fix = f"the {built_record.get('kind')} folder {built_record.get('path')}", built_record.get("path")
        else:
            found, fix = "an APIBench hub", built_name
        line = key_line(config_path, "hub") if config_path is not None else None
        where = (f"{config_path}:{line}" if line else str(config_path)) if config_path is not None else \
            "the training config"
        raise RatuneError(f"{where}: {given} is not the hub the data was built from: "
                          f"{data_manifest} says hub: {built_name} ({found}); set hub: {fix}, or train on data built "
                          f"with `ratune data build --hub {config.hub}`")
    out: dict = {"hub": name}
    if record is not None:
        out[source.kind] = built_record if built_record is not None else record
    return out


def check_training_data(config: TrainConfig) -> None:
    """Refuse training data that cannot serve this config.

    Raises:
        RatuneError: naming the data folder: missing or incomplete, the mode not built (naming those
            that are), no train split, another chat template or hub.
    """
    data_dir = Path(config.data_dir)
    if not data_dir.is_dir():
        raise RatuneError(f"data_dir: {data_dir}: no such folder; build it with `ratune data build --out {data_dir}`")
    if not is_complete(data_dir):
        raise RatuneError(f"{data_dir}: not a complete `ratune data build` output (no .complete marker)")
    manifest = data_dir / "manifest.json"
    listed = read_json_object(manifest).get("modes") if manifest.is_file() else None
    mode = config.train_retriever
    split_file = data_dir / mode / "dataset_dict.json"
    if not split_file.is_file() or (isinstance(listed, list) and mode not in listed):
        built = listed if isinstance(listed, list) else sorted(
            p.name for p in data_dir.iterdir() if (p / "dataset_dict.json").is_file())
        raise RatuneError(f"train_retriever: {mode}: {data_dir} has no such mode (built: "
                          f"{', '.join(built) if built else 'no mode'}); rebuild the data with --modes ... {mode}, "
                          "or train on a built mode")
    splits = read_json_object(split_file).get("splits")
    if not isinstance(splits, list) or "train" not in splits:
        raise RatuneError(f"{data_dir / mode}: no train split (splits: {splits}); the hub's APIBench copy has no "
                          "training file, so there is nothing to train on")
    check_data_chat_template(config)
    check_data_hub(config)


def load_training_rows(config: TrainConfig, tokenizer) -> tuple[dict, dict]:
    """``({"input_ids", "labels"}, stats)``: the built training split of ``config.train_retriever``,
    tokenized as the data build measured it (labels -100 outside the completion).

    Raises:
        RatuneError: see :func:`check_training_data`; an empty split, a row longer than max_length or
            with no trainable token.
    """
    from datasets import load_from_disk

    data_dir = Path(config.data_dir)
    check_training_data(config)
    split = load_from_disk(str(data_dir / config.train_retriever))["train"]
    built = data_dir / "manifest.json"
    answer_tokenization = built_answer_tokenization(read_json_object(built).get("settings") or {}
                                                    if built.is_file() else {})
    if len(split) == 0:
        raise RatuneError(f"{data_dir}/{config.train_retriever}: the train split has no rows; nothing to train on")
    if config.max_examples is not None and config.max_examples < len(split):
        split = split.shuffle(seed=config.seed).select(range(config.max_examples))
    input_ids, labels, real, trainable = [], [], 0, 0
    for i, row in enumerate(split):
        try:
            tok = tokenize_built_row(tokenizer, row, answer_tokenization=answer_tokenization)
        except (NoTrainableTokens, AnswerMerge) as exc:
            raise RatuneError(f"{data_dir}/{config.train_retriever} row {i} (line {row['line']}): {exc}") from None
        if len(tok.input_ids) > config.max_length:
            raise RatuneError(
                f"{data_dir}/{config.train_retriever} row {i} (line {row['line']}): {len(tok.input_ids)} tokens > "
                f"max_length {config.max_length}; rebuild the data with the same tokenizer and --max-length")
        input_ids.append(tok.input_ids)
        labels.append([t if m else -100 for t, m in zip(tok.input_ids, tok.completion_mask)])
        real += len(tok.input_ids)
        trainable += tok.n_completion_tokens
    stats = {"examples": len(input_ids), "tokens": real, "loss_tokens": trainable,
             "loss_token_share": trainable / real if real else 0.0}
    return {"input_ids": input_ids, "labels": labels}, stats


def check_save_schedule(config: TrainConfig, examples: int, num_processes: int) -> None:
    """Refuse ``save_steps`` above the run's optimizer steps: no checkpoint would exist to resume from.

    Raises:
        RatuneError: naming save_steps, the step count and how it follows from the data.
    """
    if config.resolved_save_strategy != "steps":
        return
    steps = config.optimizer_steps_bound(examples, num_processes)
    if config.save_steps > steps:
        how = (f"max_steps {config.max_steps}" if config.max_steps is not None else
               f"{examples} examples / global batch {config.global_batch_size} x {config.num_epochs:g} epochs")
        raise RatuneError(f"save_steps {config.save_steps} > the {steps} optimizer steps of this run ({how}): no "
                          "checkpoint would be written, and a preempted run could not resume; use save_strategy: "
                          f"epoch, or save_steps of at most {steps}")


#: The package each ``report_to`` logger needs, and how to get it.
_REPORT_TO_PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"),
                       "wandb": ("wandb", "pip install wandb, then wandb login")}


def check_report_to(report_to: list[str]) -> None:
    """Refuse a ``report_to`` logger whose package is missing.

    Raises:
        RatuneError: naming the field, the package and how to install it.
    """
    import importlib.util

    for name in report_to:
        package, install = _REPORT_TO_PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise RatuneError(f"report_to: {name} needs the {package} package, which is not installed: {install}")


def require_qlora() -> None:
    """Check that QLoRA (``load_in_4bit: true``) can run here: bitsandbytes installed and CUDA present.

    Raises:
        RatuneError: naming what is missing and how to get it.
    """
    import importlib.util

    import torch

    if importlib.util.find_spec("bitsandbytes") is None:
        raise RatuneError("load_in_4bit: true (QLoRA) needs bitsandbytes, which is not installed: "
                          "pip install -e '.[qlora]' on a machine with a CUDA GPU, or use a LoRA config "
                          "(configs/train/llama7b_rat_paper_lora.yaml)")
    if not torch.cuda.is_available():
        raise RatuneError("load_in_4bit: true (QLoRA) needs a CUDA GPU (bitsandbytes 4-bit), and none is "
                          "available here; use a LoRA config (configs/train/llama7b_rat_paper_lora.yaml) on CPU")
