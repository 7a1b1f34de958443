"""Supervised finetuning with completion-only loss: TRL's SFTTrainer on pre-tokenized rows.

Rows are tokenized here with :func:`ratune.train.labels.tokenize_row` (labels = -100 on the
prompt, the answer's ids plus EOS on the completion) and handed to SFTTrainer as ``input_ids``
and ``labels``, which TRL uses as they are; its collator pads labels with -100, so the loss mask
never depends on the pad id (pad == EOS is safe).

Run folder (``output_dir``)::

    config.yaml        the resolved config
    manifest.json      versions, git commit, data manifest hash, resolved batch, seeds, counts
    trainer/           HF Trainer checkpoints (for --resume-from)
    model/             the final model: safetensors, tokenizer, generation config; LoRA merged
    adapter/           the LoRA adapter alone (when LoRA is on)
    log_history.json   the Trainer's log history (loss, learning rate per step)
    .complete          written last
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from ratune.errors import RatuneError
from ratune.train.config import TrainConfig


def _num_processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def load_training_rows(config: TrainConfig, tokenizer) -> tuple[dict, dict]:
    """Tokenize the built training split for ``config.train_retriever``.

    Returns:
        ``({"input_ids": [...], "labels": [...]}, stats)``.
    Raises:
        RatuneError: data folder missing or incomplete, a row longer than max_length, or a row
            with no trainable token.
    """
    from datasets import load_from_disk

    from ratune.manifest import is_complete
    from ratune.train.labels import NoTrainableTokens, tokenize_row

    data_dir = Path(config.data_dir)
    if not is_complete(data_dir):
        raise RatuneError(f"{data_dir}: not a complete `ratune data build` output (no .complete marker)")
    split = load_from_disk(str(data_dir / config.train_retriever))["train"]
    if config.max_examples is not None and config.max_examples < len(split):
        split = split.shuffle(seed=config.seed).select(range(config.max_examples))
    input_ids, labels, real, trainable = [], [], 0, 0
    for i, row in enumerate(split):
        try:
            tok = tokenize_row(tokenizer, row["user_turn"], row["completion"])
        except NoTrainableTokens as exc:
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


def _load_4bit(model_path, config: TrainConfig):
    """The base model in 4-bit NF4 with double quantization and bf16 compute, prepared for k-bit
    training (peft), as in QLoRA."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), quantization_config=quant, dtype=torch.bfloat16,
        trust_remote_code=config.trust_remote_code, use_safetensors=True,
        device_map={"": int(os.environ.get("LOCAL_RANK", "0"))})
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing)


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _prepare_output_dir(config: TrainConfig, resume_from: str | None) -> Path:
    out = Path(config.output_dir)
    # only the main process checks: the others would see the folder it has just started writing
    if resume_from is None and _is_main_process() and out.exists() and any(out.iterdir()):
        raise RatuneError(f"{out}: output folder exists from an earlier run; pass --resume-from latest to "
                          "continue it, or choose another output_dir")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _resolve_resume(out: Path, resume_from: str | None) -> str | None:
    if resume_from is None:
        return None
    if resume_from == "latest":
        ckpts = sorted((out / "trainer").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        if not ckpts:
            raise RatuneError(f"{out / 'trainer'}: --resume-from latest, but there is no checkpoint to resume")
        return str(ckpts[-1])
    if not Path(resume_from).is_dir():
        raise RatuneError(f"{resume_from}: --resume-from path does not exist")
    return resume_from


def train(config: TrainConfig, *, resume_from: str | None = None, config_path: str | None = None) -> Path:
    """Train one model and save its run folder (see the module docstring).

    Args:
        config: the validated config.
        resume_from: None (fresh run; the output folder must be new or empty), ``latest`` or a
            checkpoint folder.
        config_path: recorded in the manifest.
    Returns:
        The folder of the final model (``output_dir/model``).
    """
    import torch
    from datasets import Dataset
    from transformers import set_seed
    from trl import SFTConfig, SFTTrainer

    from ratune.io import write_json, write_text
    from ratune.manifest import base_manifest, mark_complete
    from ratune.train.model import load_model, load_tokenizer, resolve_model_path, set_torch_threads

    set_torch_threads(config.torch_threads)
    if config.load_in_4bit:
        require_qlora()  # before any folder is made or model loaded
    nproc = _num_processes()
    per_device, accumulation = config.resolve_batch(nproc)
    out = _prepare_output_dir(config, resume_from)
    resume = _resolve_resume(out, resume_from)
    set_seed(config.seed)

    model_path = resolve_model_path(config.model)
    tokenizer = load_tokenizer(model_path, trust_remote_code=config.trust_remote_code,
                               chat_template=config.chat_template)
    columns, stats = load_training_rows(config, tokenizer)
    dataset = Dataset.from_dict(columns)

    if config.load_in_4bit:
        model = _load_4bit(model_path, config)
    else:
        model = load_model(model_path, dtype=config.dtype, trust_remote_code=config.trust_remote_code)
    if config.lora.enabled:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
            target_modules=config.lora.target_modules, task_type="CAUSAL_LM"))

    use_cpu = not torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        learning_rate=config.learning_rate,
        num_train_epochs=config.num_epochs,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a ratio of total steps (transformers 5)
        lr_scheduler_type=config.lr_scheduler,
        weight_decay=config.weight_decay,
        logging_steps=config.logging_steps,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        bf16=config.bf16,
        gradient_checkpointing=config.gradient_checkpointing,
        deepspeed=config.deepspeed,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=use_cpu,
        report_to=[],
        max_length=config.max_length,
        packing=config.packing,
        completion_only_loss=True,
        dataset_num_proc=None,
        dataloader_num_workers=0,
        save_only_model=False,
    )
    manifest = base_manifest("train")
    manifest.update({
        "config_path": config_path, "config": config.model_dump(), "model_path": str(model_path),
        "num_processes": nproc, "per_device_batch_size": per_device, "gradient_accumulation_steps": accumulation,
        "global_batch_size": per_device * accumulation * nproc, "seed": config.seed, "data": stats,
        "resumed_from": resume,
    })
    data_manifest = Path(config.data_dir) / "manifest.json"
    if data_manifest.exists():
        from ratune.io import read_json, sha256_file

        manifest["data_manifest_sha256"] = sha256_file(data_manifest)
        # the evaluator renders prompts with the document budget the model was trained with
        manifest["prompt"] = {"max_document_tokens": read_json(data_manifest)["settings"]["max_document_tokens"]}
    if _is_main_process():
        write_text(out / "config.yaml", yaml.safe_dump(config.model_dump(), sort_keys=True))
        write_json(out / "manifest.json", manifest)

    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    result = trainer.train(resume_from_checkpoint=resume)

    final = out / "model"
    tmp = out / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    trained = trainer.model
    if config.lora.enabled:
        trained.save_pretrained(str(out / "adapter"))
        trained = trained.merge_and_unload()
    if trainer.is_world_process_zero():
        trained.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        manifest["train_result"] = {k: float(v) for k, v in result.metrics.items()}
        manifest["steps"] = trainer.state.global_step
        write_json(tmp / "ratune_manifest.json", manifest)  # the checkpoint carries its run manifest
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        write_json(out / "manifest.json", manifest)
        write_json(out / "log_history.json", trainer.state.log_history)
        mark_complete(out)
    return final


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ratune.train`` / ``accelerate launch -m ratune.train``."""
    import argparse

    from ratune.config import load_config

    parser = argparse.ArgumentParser(prog="ratune.train", description="Train one RAT model from a YAML config.")
    parser.add_argument("--config", required=True, help="training config (YAML)")
    parser.add_argument("--resume-from", default=None, help="'latest' or a checkpoint folder; never implicit")
    args = parser.parse_args(argv)
    config = load_config(TrainConfig, args.config)
    path = train(config, resume_from=args.resume_from, config_path=args.config)
    print(json.dumps({"model": str(path)}))
    return 0
