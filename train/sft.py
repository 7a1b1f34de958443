"""Supervised finetuning with completion-only loss: TRL's SFTTrainer on pre-tokenized rows; the
recipe (:func:`train`) and the command line (:func:`main`). The run folder: docs/pipeline.md#train;
what every run checks, DeepSpeed and QLoRA: docs/scale-out.md."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ratune.args import RatuneArgumentParser, input_file, latest_or_dir
from ratune.config import ON_UNFINISHED, load_config
from ratune.sources.prompt import require_chat_template, use_chat_template
from ratune.errors import RatuneError
from ratune.io import open_file_modes, read_json, sha256_file, write_json, write_text
from ratune.manifest import TRAIN_STAGE, base_manifest, host_facts
from ratune.output import built_beside, reserve_sibling
from ratune.models import (check_attention, load_model, load_tokenizer, merge_adapter, require_model_files,
                           resolve_model_path, set_torch_threads)
from ratune.train import checks, launch, preflight, resume
from ratune.train.config import TrainConfig
from ratune.train.layout import TRAINER_DIR
from ratune.train.tokens import check_packing_attention, shares_for_rows


def train(config: TrainConfig, *, resume_from: str | None = None, on_unfinished: str | None = None,
          config_path: str | None = None) -> Path:
    """Train one model into ``config.output_dir`` under the folder's lock (rank 0 only); returns the final
    model's folder (``adapter/`` for QLoRA). ``resume_from``: None (a fresh run), ``latest`` or a
    checkpoint folder; ``on_unfinished``: instead, ``resume`` or ``restart`` an unfinished run, decided
    under the lock; ``config_path`` is recorded in the manifest.

    Raises:
        RatuneError: a bad launch, batch, data, output folder or resume point, or a bad save.
        LockHeld: another process is writing ``output_dir``.
    """
    with resume.run_output(config).writing():
        return _train(config, resume_from=resume_from, on_unfinished=on_unfinished, config_path=config_path)


def _train(config: TrainConfig, *, resume_from: str | None, on_unfinished: str | None, config_path: str | None) -> Path:
    """The body of :func:`train`, under the run folder's lock."""
    plan = _preflight(config, resume_from=resume_from, on_unfinished=on_unfinished, config_path=config_path)
    import torch
    from datasets import Dataset
    from transformers import set_seed
    from trl import SFTTrainer

    set_seed(config.seed)
    columns, stats = preflight.load_training_rows(config, plan.tokenizer)
    stats["token_shares"] = shares_for_rows(columns, micro_batch_size=plan.per_device, packing=config.packing,
                                            max_length=config.max_length, seed=config.seed,
                                            padding_free=config.padding_free)
    preflight.check_save_schedule(config, stats["examples"], plan.nproc)
    # the training arguments before the model: under ZeRO-3 they make from_pretrained load it partitioned
    use_cpu = launch.init_deepspeed_on_cpu(config) or not torch.cuda.is_available()
    args = _training_arguments(config, plan, use_cpu=use_cpu)
    model, load_base, partitioned_load = _setup_model(config, plan.model_path)
    if config.packing or config.padding_free:
        stats["attn_implementation"] = check_packing_attention(model, trust_remote_code=config.trust_remote_code)
    # accelerate's bf16 autocast (DeepSpeed casts the weights instead); the save checks use it too
    autocast_dtype = torch.bfloat16 if config.bf16 and not config.deepspeed else None
    save_checks: list[dict] = []
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns),
                         processing_class=plan.tokenizer,
                         callbacks=_callbacks(config, plan, load_base, autocast_dtype, save_checks))
    facts = launch.distributed_facts(trainer)
    launch.check_distributed(facts, expected_processes=plan.nproc, deepspeed=plan.ds_settings)
    manifest = _run_manifest(config, plan, trainer, model, stats=stats, facts=facts,
                             partitioned_load=partitioned_load, autocast_dtype=autocast_dtype)
    main_process = trainer.is_world_process_zero()
    if main_process:
        write_text(plan.out / "config.yaml", yaml.safe_dump(config.model_dump(), sort_keys=True))
        write_json(plan.out / "manifest.json", manifest)

    resumed_step = _resumed_step(plan.resume)  # read now: the Trainer may rotate that checkpoint away
    result = trainer.train(resume_from_checkpoint=plan.resume)

    final = _save_final(config, plan, trainer, load_base, autocast_dtype, save_checks, main_process)
    if main_process:
        _finish(config, plan.out, final, trainer, result, manifest, save_checks, resumed_step)
    trainer.accelerator.wait_for_everyone()
    return final


@dataclass
class _Plan:
    """What the preflight of a run settled (:func:`_preflight`)."""

    nproc: int
    per_device: int
    accumulation: int
    ds_settings: dict | None
    hub_record: dict
    model_path: Path
    tokenizer: object
    out: Path
    resume: str | None
    rows_sha256: str | None
    config_path: str | None


def _preflight(config: TrainConfig, *, resume_from: str | None, on_unfinished: str | None,
               config_path: str | None) -> _Plan:
    """Every check before the heavy imports and before any folder is made or model loaded; then
    the run folder and the resume point."""
    launch.check_launcher()
    launch.check_cuda_launch()
    check_attention(config.attn_implementation)
    preflight.check_report_to(config.report_to)
    set_torch_threads(config.torch_threads)
    if config.load_in_4bit:
        preflight.require_qlora()
    ds_settings = launch.deepspeed_settings(config.deepspeed)
    nproc = launch.num_processes()
    per_device, accumulation = config.resolve_batch(nproc)
    preflight.check_data_chat_template(config)
    hub_record = preflight.check_data_hub(config, config_path)
    model_path = resolve_model_path(config.model)
    tokenizer = use_chat_template(load_tokenizer(model_path, trust_remote_code=config.trust_remote_code),
                                  config.chat_template)
    require_chat_template(tokenizer, source=str(model_path), hint="set chat_template: in the training config "
                          "(and give the data build the same --chat-template)")
    preflight.check_training_data(config)
    require_model_files(model_path)
    if on_unfinished is not None:
        if resume_from is not None:
            raise RatuneError("--resume-from and --on-unfinished exclude each other: give one")
        resume_from = resume.prepare_unfinished(Path(config.output_dir), on_unfinished)
    out = resume.prepare_output_dir(config, resume_from)
    resume_point = resume.resolve_resume(out, resume_from)
    data_dir = Path(config.data_dir)
    rows_sha256 = resume.check_same_data(out, data_dir, config.train_retriever) if resume_point is not None \
        else resume.train_rows_sha256(data_dir, config.train_retriever)
    return _Plan(nproc=nproc, per_device=per_device, accumulation=accumulation, ds_settings=ds_settings,
                 hub_record=hub_record, model_path=model_path, tokenizer=tokenizer, out=out, resume=resume_point,
                 rows_sha256=rows_sha256, config_path=config_path)


def _training_arguments(config: TrainConfig, plan: _Plan, *, use_cpu: bool):
    """TRL's ``SFTConfig`` of the run."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(plan.out / TRAINER_DIR),
        per_device_train_batch_size=plan.per_device,
        gradient_accumulation_steps=plan.accumulation,
        learning_rate=config.learning_rate,
        num_train_epochs=config.num_epochs,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a ratio of total steps (transformers 5)
        lr_scheduler_type=config.lr_scheduler,
        weight_decay=config.weight_decay,
        logging_steps=config.logging_steps,
        save_strategy=config.resolved_save_strategy,
        save_steps=config.save_steps or 500,  # read only with save_strategy "steps"
        save_total_limit=config.save_total_limit,
        bf16=config.bf16,
        activation_checkpointing=config.gradient_checkpointing,  # transformers 5.24's name; the old one warns
        deepspeed=config.deepspeed,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=use_cpu,
        report_to=[r for r in config.report_to if r != "tensorboard"],  # tensorboard: callback below
        # TRL refuses padding_free with a max_length; load_training_rows already refused longer rows
        max_length=None if config.padding_free else config.max_length,
        packing=config.packing,
        packing_strategy="bfd",  # "bfd" keeps rows whole ("wrapped" cuts them)
        padding_free=config.padding_free or config.packing,
        completion_only_loss=True,
        dataset_num_proc=None,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def _setup_model(config: TrainConfig, model_path: Path):
    """``(model, load_base, partitioned_load)``: the base (4-bit for QLoRA), with its LoRA adapter when
    asked; a function loading a fresh base; whether ZeRO-3 loaded it partitioned."""
    def load_base():
        if config.load_in_4bit:
            return _load_4bit(model_path, config)
        return load_model(model_path, dtype=config.dtype, trust_remote_code=config.trust_remote_code,
                          attn_implementation=config.attn_implementation)

    model = load_base()
    partitioned_load = any(hasattr(p, "ds_id") for p in model.parameters())
    if config.lora.enabled:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
            target_modules=config.lora.target_modules, task_type="CAUSAL_LM"))
    return model, load_base, partitioned_load


def _load_4bit(model_path, config: TrainConfig):
    """The QLoRA base: 4-bit NF4, double quantization, bf16 compute, prepared for k-bit training."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), quantization_config=quant, dtype=torch.bfloat16,
        trust_remote_code=config.trust_remote_code, use_safetensors=True,
        device_map={"": int(os.environ.get("LOCAL_RANK", "0"))},
        **({"attn_implementation": config.attn_implementation} if config.attn_implementation else {}))
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing)


def _callbacks(config: TrainConfig, plan: _Plan, load_base, autocast_dtype, save_checks: list) -> list:
    """The trainer's callbacks: the checkpoints' file modes, TensorBoard, the save checks."""
    callbacks = [checkpoint_modes_callback()]
    if "tensorboard" in config.report_to:
        from transformers.integrations import TensorBoardCallback

        tensorboard = TensorBoardCallback()
        tensorboard.logging_dir = str(plan.out / "tensorboard")
        callbacks.append(tensorboard)
    if config.verify_saves:
        callbacks.append(checks.make_save_callback(plan.tokenizer, adapter=config.lora.enabled, load_base=load_base,
                                                   autocast_dtype=autocast_dtype, record=save_checks))
    return callbacks


def _run_manifest(config: TrainConfig, plan: _Plan, trainer, model, *, stats: dict, facts: dict,
                  partitioned_load: bool, autocast_dtype) -> dict:
    """The run manifest written before training (completed by :func:`_finish`)."""
    manifest = base_manifest(TRAIN_STAGE)
    manifest.update({
        "config_path": plan.config_path, "config": config.model_dump(), "model_path": str(plan.model_path),
        "num_processes": plan.nproc, "per_device_batch_size": plan.per_device,
        "gradient_accumulation_steps": plan.accumulation,
        "global_batch_size": plan.per_device * plan.accumulation * plan.nproc, "seed": config.seed, "data": stats,
        "resumed_from": plan.resume, "distributed": {**facts, "partitioned_load": partitioned_load},
        "device": launch.device_facts(trainer.args.device), "host": host_facts(),
        "compute": {"dtype": config.dtype, "autocast": "bfloat16" if autocast_dtype else None,
                    "deepspeed_bf16": bool(config.deepspeed and config.bf16),
                    "attn_implementation": checks.attn_implementation_of(model)},
        **plan.hub_record,
    })
    data_manifest = Path(config.data_dir) / "manifest.json"
    if data_manifest.exists():
        manifest["data_manifest_sha256"] = sha256_file(data_manifest)
        manifest["train_rows_sha256"] = plan.rows_sha256
        built = read_json(data_manifest)
        manifest["prompt"] = {"max_document_tokens": built["settings"]["max_document_tokens"],
                              "chat_template": config.chat_template,
                              **({"answer_format": built["answer_format"]} if "answer_format" in built else {})}
    return manifest


def _save_final(config: TrainConfig, plan: _Plan, trainer, load_base, autocast_dtype, save_checks: list,
                main_process: bool) -> Path:
    """Save and check the adapter and/or the model (LoRA: merged; QLoRA: none); returns the final
    model's folder. Every rank calls it (``trainer.save_model`` gathers ZeRO-3 partitions)."""
    out, tokenizer, device = plan.out, plan.tokenizer, trainer.args.device
    reference = checks.prompt_logits(trainer.model, tokenizer, device=device, autocast_dtype=autocast_dtype) \
        if config.verify_saves else None

    def verify(folder, **kwargs):
        if config.verify_saves:
            save_checks.append(checks.verify_saved(folder, trainer.model, tokenizer, device=device,
                                                   autocast_dtype=autocast_dtype, reference=reference, **kwargs))

    if config.lora.enabled:
        adapter = _save_folder(out / "adapter", lambda tmp: trainer.save_model(str(tmp)), main_process, trainer)
        verify(adapter, adapter=True, load_base=load_base)
    final = out / "model"
    if config.load_in_4bit:
        final = out / "adapter"
    elif config.lora.enabled:
        merged = {}

        def write_merged(tmp):
            if main_process:
                with checks.plain_loading():
                    merged["model"] = merge_adapter(load_base(), out / "adapter", base=plan.model_path)
                merged["model"].save_pretrained(str(tmp), safe_serialization=True)
                tokenizer.save_pretrained(str(tmp))
        _save_folder(final, write_merged, main_process, trainer)
        verify(final, adapter=False, expected=merged.pop("model", None), expected_on_rank0_only=True)
    else:
        _save_folder(final, lambda tmp: trainer.save_model(str(tmp)), main_process, trainer)
        verify(final, adapter=False)
    return final


def _finish(config: TrainConfig, out: Path, final: Path, trainer, result, manifest: dict, save_checks: list,
            resumed_step: int | None) -> None:
    """Rank 0: complete the run manifest (also into the final model's folder), write the log history,
    the training curves and ``.complete``."""
    manifest["train_result"] = train_result(result.metrics, trainer.state.log_history, resumed_step=resumed_step)
    manifest["throughput"] = throughput(trainer.state.log_history, result.metrics, resumed_step=resumed_step)
    manifest["steps"] = trainer.state.global_step
    manifest["save_checks"] = [{**c, "folder": os.path.relpath(c["folder"], out)} for c in save_checks]
    write_json(final / "ratune_manifest.json", manifest)
    write_json(out / "manifest.json", manifest)
    write_json(out / "log_history.json", trainer.state.log_history)
    from ratune.train.curves import plot_training_curves

    plot_training_curves(trainer.state.log_history, out / "training_curves.png",
                         title=f"{out.name}: {config.train_retriever}, lr {config.learning_rate:g}")
    resume.run_output(config).complete(out)


def _resumed_step(checkpoint: str | None) -> int | None:
    """The global step a resumed run started from (its checkpoint's ``trainer_state.json``); None for a
    fresh run."""
    if checkpoint is None:
        return None
    return int(read_json(Path(checkpoint) / "trainer_state.json")["global_step"])


def train_result(metrics: dict, log_history: list[dict], *, resumed_step: int | None = None) -> dict:
    """The Trainer's train metrics as floats. In a resumed run the Trainer's ``train_loss`` covers only
    the steps this invocation ran (0.0 when it resumed from the last checkpoint), so it is replaced by the
    mean logged ``loss`` over the whole run, each log weighted by the steps it covers (equal to the
    Trainer's for an uninterrupted run logged every step); absent when no loss was logged."""
    out = {k: float(v) for k, v in metrics.items()}
    if resumed_step is not None:
        out.pop("train_loss", None)
        total, steps, previous = 0.0, 0, 0
        for entry in log_history:
            if "loss" in entry:
                total += float(entry["loss"]) * (entry["step"] - previous)
                steps += entry["step"] - previous
                previous = entry["step"]
        if steps:
            out["train_loss"] = total / steps
    return out


def throughput(log_history: list[dict], metrics: dict, *, resumed_step: int | None = None) -> dict:
    """``{"tokens", "train_runtime_s", "tokens_per_s"}``: TRL's ``num_tokens`` at the last log (summed
    over processes) and the Trainer's ``train_runtime``, both this invocation's (TRL's count restarts at a
    resume; logs up to ``resumed_step`` came from the earlier invocation); None where this invocation
    logged no token count."""
    tokens = next((e["num_tokens"] for e in reversed(log_history)
                   if "num_tokens" in e and (resumed_step is None or e.get("step", 0) > resumed_step)), None)
    runtime = metrics.get("train_runtime")
    rate = float(tokens) / runtime if tokens is not None and runtime else None
    return {"tokens": None if tokens is None else int(tokens), "train_runtime_s": runtime, "tokens_per_s": rate}


def checkpoint_modes_callback():
    """A TrainerCallback giving each checkpoint's files the modes ``open()`` would
    (:func:`ratune.io.open_file_modes`; safetensors 0.8 writes 0600), on each node's local main process."""
    from transformers import TrainerCallback

    class OpenFileModes(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_local_process_zero and folder.is_dir():
                open_file_modes(folder)
            return control

    return OpenFileModes()


def _save_folder(final: Path, write, main_process: bool, trainer) -> Path:
    """Write ``final`` atomically: ``write(tmp)`` on every rank (rank 0 writes) into a sibling named by
    rank 0's broadcast draw, then swap it in; drops the pickled ``training_args.bin``."""
    import torch
    from accelerate.utils import broadcast

    draw = int(reserve_sibling(final), 16) if main_process else 0
    draw = int(broadcast(torch.tensor([draw], dtype=torch.int64, device=trainer.accelerator.device)).item())
    with built_beside(final, f"{draw:08x}", writer=main_process) as tmp:
        write(tmp)
        if main_process:
            (tmp / "training_args.bin").unlink(missing_ok=True)
    trainer.accelerator.wait_for_everyone()
    return final


def add_resume_arguments(parser) -> None:
    """``--resume-from`` or ``--on-unfinished``, of ``ratune train`` and ``python -m ratune.train``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume-from", default=None, type=latest_or_dir,
                       help="'latest' or a checkpoint folder; never implicit")
    group.add_argument("--on-unfinished", default=None, choices=ON_UNFINISHED,
                       help="an unfinished run in output_dir: resume from its latest checkpoint (start over "
                            "when it saved none), or restart it; a finished run is refused (what a sweep passes)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ratune.train`` / ``accelerate launch -m ratune.train``."""
    parser = RatuneArgumentParser(prog="ratune.train", description="Train one RAT model from a YAML config.")
    parser.add_argument("--config", required=True, type=input_file, help="training config (YAML)")
    add_resume_arguments(parser)
    args = parser.parse_args(argv)
    config = load_config(TrainConfig, args.config)
    path = train(config, resume_from=args.resume_from, on_unfinished=args.on_unfinished, config_path=args.config)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # leave the gloo group before exit: left to the exit handlers it once aborted rank 1 (exit -6)
        dist.destroy_process_group()
    print(json.dumps({"model": str(path)}))
    return 0
