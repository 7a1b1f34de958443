"""Supervised finetuning with completion-only loss: TRL's SFTTrainer on pre-tokenized rows.

Rows are tokenized here with :func:`ratune.data.labels.tokenize_row` (labels = -100 on the
prompt, the answer's ids plus EOS on the completion) and handed to SFTTrainer as ``input_ids``
and ``labels``, which TRL uses as they are; its collator pads labels with -100, so the loss mask
never depends on the pad id (pad == EOS is safe).

Run folder (``output_dir``)::

    config.yaml        the resolved config
    manifest.json      versions, git commit, data manifest hash, hub (name; a catalog's record),
                       resolved batch, seeds, counts
    trainer/           HF Trainer checkpoints (for --resume-from)
    model/             the final model: safetensors, tokenizer, generation config; LoRA merged
                       (not written for QLoRA, see below)
    adapter/           the LoRA adapter alone (when LoRA is on)
    log_history.json   the Trainer's log history (loss, learning rate, tokens per step)
    training_curves.png   loss and learning rate against the optimizer step (ratune.train.curves)
    tensorboard/       TensorBoard event files (report_to: [tensorboard])
    .complete          written last

Every save is checked when it is made (:mod:`ratune.train.checks`): each Trainer checkpoint,
``adapter/`` and ``model/`` must reload with ``from_pretrained`` (adapters with peft on a fresh
base), hold no empty tensor, hold the in-memory model's weights bit for bit, and give its logits
on two fixed prompts on the same device, kernels and autocast within the tolerance of the compute
dtype; an empty, partial or wrong save is a RatuneError at save time. Under ZeRO-3 the weights are gathered for
saving (the DeepSpeed JSON must set ``stage3_gather_16bit_weights_on_model_save: true``, checked
before training). The LoRA ``model/`` is the saved ``adapter/`` merged into a freshly loaded base,
so it is exactly what a user rebuilds from the adapter.

QLoRA (``load_in_4bit: true``): only ``adapter/`` is saved, no ``model/``: merging into a 4-bit
base (``merge_and_unload``) would round the merged weights to 4 bits again, a lossy model that
is not the one trained. The run manifest records the base (``model_path``) and
``config.load_in_4bit``; ``ratune eval run RUN`` evaluates the adapter merged into the
UNQUANTIZED base, and ``ratune export RUN --merge-lora`` writes that merge as a model folder
(:func:`ratune.train.layout.resolve_checkpoint`, :func:`ratune.models.load_adapter_merged`);
:func:`train` returns the adapter folder. The save check reloads the adapter on a fresh 4-bit
base (GPU only). QLoRA under ZeRO-3 is refused by the config (:class:`TrainConfig`).

Distributed runs (``accelerate launch``): the process count the trainer actually sees, its
distributed type and the DeepSpeed ZeRO stage are recorded in the manifest (``distributed``).
WORLD_SIZE disagreeing with the trainer's process count, a config naming DeepSpeed while the
trainer does not run DeepSpeed, a ZeRO stage other than the JSON's, and ``accelerate launch --cpu
--num_processes N>1`` (which starts ONE process) are errors, never a silent fallback. DeepSpeed on
CPU (the tests' path): ``deepspeed.init_distributed(dist_backend="gloo")`` runs before the
training arguments are built and they say ``use_cpu``; launch two processes with
``accelerate launch --config_file configs/accelerate/cpu_2proc_deepspeed.yaml`` (torchrun; the
MULTI_CPU config cpu_2proc.yaml starts one process unless MPI is used).

Before any data or model is loaded: a GPU launch (:func:`gpu_launch_evidence`) where torch sees
no CUDA device is refused (:func:`check_cuda_launch`; never a silent CPU run), and so is an
attention implementation that cannot run here (:func:`ratune.models.check_attention`:
flash_attention_2 without flash-attn or CUDA). The manifest records the device trained on
(``device``: type, GPU name and count on CUDA, torch version and its CUDA build).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from ratune.args import RatuneArgumentParser, input_file, latest_or_dir
from ratune.config import ON_UNFINISHED, key_line, load_config
from ratune.hubs import manifest_hub_record, resolve_hub
from ratune.data.labels import AnswerMerge, NoTrainableTokens, built_answer_tokenization, tokenize_row
from ratune.sources.prompt import require_chat_template, use_chat_template
from ratune.errors import RatuneError
from ratune.io import open_file_modes, read_json, read_json_object, sha256_file, write_json, write_text
from ratune.manifest import TRAIN_STAGE, base_manifest, host_facts, is_complete
from ratune.output import StageOutput, built_beside, reserve_sibling
from ratune.models import (check_attention, load_model, load_tokenizer, merge_adapter, require_model_files,
                           resolve_model_path, set_torch_threads)
from ratune.train import checks
from ratune.train.config import TrainConfig, read_deepspeed_config
from ratune.train.layout import (TRAINER_DIR, checkpoint_folders, complete_checkpoint_folders,
                                 require_complete_checkpoint)
from ratune.train.tokens import check_packing_attention, shares_for_rows


_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _num_processes() -> int:
    """The process count the launcher set (torchrun: WORLD_SIZE; mpirun: its own variables); 1 without one."""
    for key in _WORLD_SIZE_VARS:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def check_launcher() -> None:
    """Refuse a launcher that silently started fewer processes than asked.

    ``accelerate launch --cpu --num_processes N`` (N > 1) and a MULTI_CPU config without an MPI
    hostfile (configs/accelerate/cpu_2proc.yaml) run ONE process with no WORLD_SIZE/RANK, but set
    MASTER_ADDR/MASTER_PORT as for a distributed run (accelerate 1.15, simple launcher); that
    combination is detected here.

    Raises:
        RatuneError: naming the launcher to use instead.
    """
    env = os.environ
    if (env.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in env
            and not any(k in env for k in _WORLD_SIZE_VARS) and "RANK" not in env):
        raise RatuneError(
            "accelerate started a single process although more than one was asked for (MASTER_ADDR is set, "
            "WORLD_SIZE is not): `accelerate launch --cpu --num_processes N` runs ONE process; use "
            "`accelerate launch --config_file configs/accelerate/cpu_2proc_deepspeed.yaml` (torchrun; with or "
            "without DeepSpeed) or an MPI launch (--mpirun_hostfile)")


#: accelerate launch sets these in every process it starts (accelerate 1.15, all launchers).
_ACCELERATE_LAUNCH_VARS = ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_MIXED_PRECISION")
_TRUE = ("1", "true", "yes", "on")


def gpu_launch_evidence(env=None) -> str | None:
    """Why this process's ``accelerate launch`` asked for a GPU run; None when it asked for the
    CPU, gave no sign either way, or the process was not started by ``accelerate launch``.

    What accelerate 1.15 hands its processes (accelerate/utils/launch.py): the simple launcher
    (``distributed_type: "NO"``, MULTI_CPU, or no config) sets ``ACCELERATE_USE_CPU`` to
    ``True`` for ``--cpu`` / ``use_cpu: true`` and ``False`` otherwise; the torchrun launchers
    (MULTI_GPU, DEEPSPEED, FSDP configs) never set it and drop ``use_cpu``, so there only the
    mixed precision tells: ``bf16``/``fp16``/``fp8`` (configs/accelerate/8gpu_zero3.yaml,
    multinode_zero3.yaml) is a GPU launch, ``no`` (configs/accelerate/cpu_2proc_deepspeed.yaml,
    the CPU torchrun launch) is not. ``ACCELERATE_USE_CPU=true`` in the environment always means CPU.

    Args:
        env: the environment (default ``os.environ``).
    Returns:
        A short reason naming the variable and value, or None.
    """
    env = os.environ if env is None else env
    if not any(k in env for k in _ACCELERATE_LAUNCH_VARS + ("ACCELERATE_USE_CPU",)):
        return None  # not started by accelerate launch (python -m ratune.train, the demo, tests)
    use_cpu = env.get("ACCELERATE_USE_CPU")
    if use_cpu is not None:
        if use_cpu.strip().lower() in _TRUE:
            return None
        return (f"ACCELERATE_USE_CPU={use_cpu}: neither `accelerate launch --cpu` nor `use_cpu: true` in the "
                "accelerate config")
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision in ("bf16", "fp16", "fp8"):
        return f"ACCELERATE_MIXED_PRECISION={precision} under a torchrun launch (a MULTI_GPU/DEEPSPEED config)"
    return None


def check_cuda_launch(env=None) -> None:
    """Refuse a GPU launch that would silently train on the CPU because torch sees no CUDA device
    (a CPU-only torch build, or a CUDA build newer than the driver).

    The launch counts as a GPU launch by :func:`gpu_launch_evidence`; plain ``python -m
    ratune.train`` and CPU launches (configs/accelerate/cpu_*.yaml, ``accelerate launch --cpu``)
    are never refused here.

    Raises:
        RatuneError: one line naming torch.__version__, torch.version.cuda, the launch's evidence
            and what to install (or how to ask for the CPU on purpose).
    """
    reason = gpu_launch_evidence(env)
    if reason is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        fix = ("this torch is a CPU-only build: install a CUDA build of torch (make setup TORCH=torch, or pip install "
               "torch --index-url https://download.pytorch.org/whl/cu128 with the CUDA version your driver supports)")
    else:
        fix = (f"this torch is built for CUDA {torch.version.cuda} but finds no usable GPU: check nvidia-smi and "
               "CUDA_VISIBLE_DEVICES, and install a torch build whose CUDA version the driver supports")
    raise RatuneError(f"accelerate launch asked for a GPU run ({reason}) but torch {torch.__version__} "
                      f"(torch.version.cuda {torch.version.cuda}) sees no CUDA device; {fix}; to train on the CPU on "
                      "purpose use `accelerate launch --cpu`, configs/accelerate/cpu_1proc.yaml or "
                      "cpu_2proc_deepspeed.yaml, or export ACCELERATE_USE_CPU=true")


def device_facts(device) -> dict:
    """The device a run trains on, for the manifest: ``{"type": "cuda"|"cpu", "torch", "cuda_build"}``
    plus, on CUDA, ``"name"`` (the GPU's) and ``"count"`` (GPUs this process sees)."""
    import torch

    kind = getattr(device, "type", str(device).split(":")[0])
    facts = {"type": kind, "torch": torch.__version__, "cuda_build": torch.version.cuda}
    if kind == "cuda":
        index = getattr(device, "index", None)
        facts.update(name=torch.cuda.get_device_name(index if index is not None else 0),
                     count=torch.cuda.device_count())
    return facts


def deepspeed_settings(path: str | None) -> dict | None:
    """Read a DeepSpeed JSON and check what the save-time checks rely on.

    Returns:
        ``{"path", "zero_stage"}`` (stage 0 when the JSON has no ``zero_optimization``), or None
        when ``path`` is None.
    Raises:
        RatuneError: see :func:`read_deepspeed_config`; or it is ZeRO-3 without
            ``stage3_gather_16bit_weights_on_model_save: true`` (its saves would hold only each
            rank's empty partitions).
    """
    if path is None:
        return None
    zero = read_deepspeed_config(path)["zero_optimization"]
    stage = zero["stage"]
    if stage == 3 and zero.get("stage3_gather_16bit_weights_on_model_save") is not True:
        raise RatuneError(f"{path}: ZeRO-3 needs \"stage3_gather_16bit_weights_on_model_save\": true in "
                          "zero_optimization, or the saved model holds empty partitions")
    return {"path": str(path), "zero_stage": stage}


def init_deepspeed_on_cpu(config: TrainConfig) -> bool:
    """On a machine without CUDA, initialise DeepSpeed's process group with gloo before the
    training arguments are built (otherwise accelerate counts 1 process where DeepSpeed counts
    WORLD_SIZE, and DeepSpeed's train_batch_size assertion fails). A process started without a
    distributed launcher is set up as rank 0 of 1 (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, only where unset).

    Returns:
        True when it initialised DeepSpeed here (the training arguments must then say use_cpu).
    Raises:
        RatuneError: deepspeed is not installed.
    """
    import torch

    if not config.deepspeed or torch.cuda.is_available():
        return False
    try:
        import deepspeed
    except ImportError:
        raise RatuneError(f"deepspeed: {config.deepspeed} needs the deepspeed package: pip install -e '.[deepspeed]' "
                          "(make setup installs it)") from None
    if "RANK" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port)}.items():
            os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    return True


def distributed_facts(trainer) -> dict:
    """What the trainer actually runs: ``{"world_size", "accelerator_num_processes",
    "distributed_type", "deepspeed", "zero_stage"}`` (zero_stage None without DeepSpeed)."""
    acc = trainer.accelerator
    ds = bool(getattr(trainer, "is_deepspeed_enabled", False))
    stage = None
    if ds:
        plugin = acc.state.deepspeed_plugin
        stage = int(plugin.zero_stage) if plugin is not None and plugin.zero_stage is not None else None
    return {"world_size": int(trainer.args.world_size), "accelerator_num_processes": int(acc.num_processes),
            "distributed_type": str(getattr(acc.distributed_type, "value", acc.distributed_type)),
            "deepspeed": ds, "zero_stage": stage}


def check_distributed(facts: dict, *, expected_processes: int, deepspeed: dict | None) -> None:
    """Refuse a silent fallback to fewer processes or to training without DeepSpeed.

    Args:
        facts: :func:`distributed_facts`.
        expected_processes: WORLD_SIZE from the launcher (1 without one).
        deepspeed: :func:`deepspeed_settings` of the config.
    Raises:
        RatuneError: naming the expected and the actual value.
    """
    seen = {facts["world_size"], facts["accelerator_num_processes"]}
    if seen != {expected_processes}:
        raise RatuneError(f"the launcher started {expected_processes} process(es) (WORLD_SIZE) but the trainer sees "
                          f"world_size {facts['world_size']} and accelerator num_processes "
                          f"{facts['accelerator_num_processes']} ({facts['distributed_type']}); refusing to train "
                          "with a batch arithmetic that does not hold")
    if deepspeed is not None:
        if not facts["deepspeed"] or facts["distributed_type"] != "DEEPSPEED":
            raise RatuneError(f"deepspeed: {deepspeed['path']} is configured but the trainer runs "
                              f"{facts['distributed_type']} without DeepSpeed; refusing a silent fallback")
        if facts["zero_stage"] != deepspeed["zero_stage"]:
            raise RatuneError(f"{deepspeed['path']} asks for ZeRO stage {deepspeed['zero_stage']} but the trainer "
                              f"runs stage {facts['zero_stage']}")


def _template_label(name: str | None) -> str:
    return name if name is not None else "null (the tokenizer's own)"


def check_data_chat_template(config: TrainConfig) -> None:
    """Refuse a config whose ``chat_template`` is not the one the data was built with (the data
    manifest's ``settings.chat_template``, written by ``ratune data build --chat-template``): the
    rows' lengths were measured with that template and eval renders prompts with it. A manifest
    from before templates were recorded is not checked.

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
    """The hub of the run, checked against the data manifest (``data_dir/manifest.json``, which
    ``ratune data build`` writes: ``hub``, the hub's name, and for a catalog a ``catalog`` record).

    The config's ``hub`` (an APIBench hub name or a catalog folder,
    :func:`ratune.hubs.resolve_hub`) must name the hub the data was built from: the same
    name, and a catalog exactly when the data manifest has a ``catalog`` record. Without a data
    manifest (or one from before hubs were recorded) nothing is compared.

    Returns:
        What the run manifest records: ``{"hub": name}``, plus for a catalog ``"catalog"``: the
        data manifest's record (``kind``, ``path``, ``name``, ``import_source``, ``pairs``;
        :meth:`ratune.hubs.Hub.manifest_record` of the catalog when there is no data
        manifest).
    Raises:
        RatuneError: one line naming the config file (``config_path``, with the line of its
            ``hub:`` when it sets one; "the training config" without one), the field ``hub``, its value (and whether it is the default
            ``torchhub``, not set in the file) and the data manifest's hub; or
            :func:`~ratune.hubs.resolve_hub`'s error for a catalog folder that is no longer one.
    """
    source = resolve_hub(config.hub, locate=False)  # its folder is not needed here
    name = source.name
    data_manifest = Path(config.data_dir) / "manifest.json"
    built = read_json_object(data_manifest) if data_manifest.is_file() else {}
    built_name, (_, built_record) = built.get("hub"), manifest_hub_record(built)
    record = source.manifest_record()  # None: the hub records only its name
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
    """Refuse training data that cannot serve this config, before any folder is made or model loaded.

    Raises:
        RatuneError: one line naming the data folder: missing or incomplete (no .complete
            marker), the config's ``train_retriever`` not built there (naming the modes that
            are), a mode without a train split, another chat template
            (:func:`check_data_chat_template`) or another hub (:func:`check_data_hub`).
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
    """Tokenize the built training split for ``config.train_retriever``.

    Returns:
        ``({"input_ids": [...], "labels": [...]}, stats)``.
    Raises:
        RatuneError: see :func:`check_training_data`; an empty train split, a row longer than
            max_length, or a row with no trainable token.
    """
    from datasets import load_from_disk

    data_dir = Path(config.data_dir)
    check_training_data(config)
    split = load_from_disk(str(data_dir / config.train_retriever))["train"]
    built = data_dir / "manifest.json"  # the rows are tokenized as the data build measured them
    answer_tokenization = built_answer_tokenization(read_json_object(built).get("settings") or {}
                                                    if built.is_file() else {})
    if len(split) == 0:
        raise RatuneError(f"{data_dir}/{config.train_retriever}: the train split has no rows; nothing to train on")
    if config.max_examples is not None and config.max_examples < len(split):
        split = split.shuffle(seed=config.seed).select(range(config.max_examples))
    input_ids, labels, real, trainable = [], [], 0, 0
    for i, row in enumerate(split):
        try:
            tok = tokenize_row(tokenizer, row["user_turn"], row["completion"], system=row.get("system"),
                               answer_tokenization=answer_tokenization)
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
    """Refuse ``save_steps`` larger than the run's optimizer steps: such a run writes no Trainer
    checkpoint, so a preempted run has nothing to resume (TorchHub's 837 examples at batch 64 for
    5 epochs are about 66 steps).

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
    """Refuse a ``report_to`` logger whose package is missing, before any data or model is loaded.

    Raises:
        RatuneError: naming the config field, the package and how to install it.
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
        device_map={"": int(os.environ.get("LOCAL_RANK", "0"))},
        **({"attn_implementation": config.attn_implementation} if config.attn_implementation else {}))
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing)


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _prepare_output_dir(config: TrainConfig, resume_from: str | None) -> Path:
    output = _run_output(config)
    out = output.out
    # only the main process checks: the others would see the folder it has just started writing
    if resume_from is None and _is_main_process() and out.exists() and any(out.iterdir()):
        output.check(action="write into")  # a folder ratune did not make: say so, not "resume"
        raise RatuneError(f"{out}: output folder exists from an earlier run; pass --resume-from latest to "
                          "continue it, or choose another output_dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # another rank: the main process removed the folder meanwhile and remakes it
        if _is_main_process():
            raise
    if resume_from is None and _is_main_process():
        output.claim()  # from here on a ratune train output (ratune.manifest.output_stage)
    return out


def prepare_unfinished(out: Path, policy: str) -> str | None:
    """Apply ``--on-unfinished`` (ratune/config.py OnUnfinished) to the output folder ``out``;
    returns the ``--resume-from`` value the run then takes: ``latest`` to resume, None to start
    fresh. Called under the output folder's lock (:func:`train`), so a running training of the
    same folder is never deleted under it.

    - no folder, or an empty one: a fresh run (None);
    - a folder ratune did not make, or a finished run (``.complete``): refused;
    - ``resume`` and the run saved a Trainer checkpoint: ``latest``;
    - otherwise (``restart``, or ``resume`` with no checkpoint to resume): the unfinished run is
      deleted (by the main process, and only when it is a ratune train output) and None returned.
    Only the main process checks and deletes; the others answer from the checkpoints alone, which
    gives the same answer: the main process deletes only a run without the checkpoints they look
    for, or under ``restart``, whose answer is None whatever they see.

    Raises:
        RatuneError: a finished run; a folder ratune did not make (:meth:`ratune.output.StageOutput.check`).
    """
    try:
        resumable = policy == "resume" and bool(complete_checkpoint_folders(out, say=False))
    except OSError:  # another rank, while the main process deletes a run without checkpoints
        resumable = False
    if not _is_main_process():  # the main process checks and deletes (a folder it deletes has no checkpoint
        return "latest" if resumable else None  # the others look for, or the answer is None anyway)
    if not out.exists() or not any(out.iterdir()):
        return None
    StageOutput(out, TRAIN_STAGE).check(action="resume or restart")  # never a folder ratune did not make
    if is_complete(out):
        raise RatuneError(f"{out}: a finished training run (.complete); --on-unfinished {policy} acts on unfinished "
                          "runs only: choose another output_dir")
    if resumable:
        return "latest"
    why = "--on-unfinished restart" if policy == "restart" else "it saved no complete checkpoint to resume"
    print(f"ratune: note: {out}: starting the unfinished run over ({why}); its files are deleted", file=sys.stderr)
    shutil.rmtree(out)  # an unfinished ratune training run (checked above), under its lock
    return None


def train_rows_sha256(data_dir: Path, mode: str) -> str | None:
    """One sha256 over the Arrow files of ``DATA/MODE/train`` (the rows a run trains on; ``datasets``
    writes the same bytes for the same rows), by file name; None when there are none."""
    import hashlib

    files = sorted((data_dir / mode / "train").glob("*.arrow"))
    if not files:
        return None
    return hashlib.sha256("".join(f"{f.name} {sha256_file(f)}\n" for f in files).encode()).hexdigest()


def check_same_data(out: Path, data_dir: Path, mode: str) -> str | None:
    """Refuse to resume a run whose training rows changed since the run began: its
    ``manifest.json`` (written at the start, :func:`train`) records :func:`train_rows_sha256`, and a
    rebuild with another setting or input file (data/build.py ``build_request``) writes other rows,
    so the remaining steps would train on other rows than the checkpoint's (and a sweep's table
    would mix builds). A rebuild to the same rows passes; so do runs from before it was recorded.

    Returns:
        The rows' sha256 now (what the run's manifest records next), so they are hashed once.
    Raises:
        RatuneError: the two sha256 differ, naming the folder, the run's manifest and how to start over.
    """
    recorded = read_json_object(out / "manifest.json").get("train_rows_sha256") \
        if (out / "manifest.json").is_file() else None
    now = train_rows_sha256(data_dir, mode)
    if recorded is None or now is None or now == recorded:
        return now
    raise RatuneError(f"{data_dir / mode / 'train'}: the training rows changed since the run in {out} began (sha256 "
                      f"{now[:12]}; {out / 'manifest.json'} records train_rows_sha256 {recorded[:12]}): resuming "
                      f"would train its remaining steps on other rows. Start it over (ratune train --on-unfinished "
                      f"restart; in a sweep, delete {out} and rerun the sweep) or resume with the data it began with")


def _resolve_resume(out: Path, resume_from: str | None) -> str | None:
    if resume_from is None:
        return None
    if resume_from == "latest":
        ckpts = complete_checkpoint_folders(out, say=_is_main_process())  # a partial one is passed over
        if not ckpts:
            n_partial = len(checkpoint_folders(out))
            partial = f" ({n_partial} partial)" if n_partial else ""
            raise RatuneError(f"{out / TRAINER_DIR}: --resume-from latest, but there is no checkpoint to resume"
                              f"{partial}; start over with --on-unfinished restart")
        return str(ckpts[-1])
    if not Path(resume_from).is_dir():
        raise RatuneError(f"{resume_from}: --resume-from path does not exist")
    require_complete_checkpoint(resume_from)
    return resume_from


def _run_output(config: TrainConfig) -> StageOutput:
    """The run folder as an output: locked by the main process only; its ownership is checked by
    :func:`_prepare_output_dir` and :func:`prepare_unfinished`, which know a fresh run from a resume."""
    return StageOutput(config.output_dir, TRAIN_STAGE, command=TRAIN_STAGE, known=True, claim=False,
                       lock=_is_main_process())


def train(config: TrainConfig, *, resume_from: str | None = None, on_unfinished: str | None = None,
          config_path: str | None = None) -> Path:
    """Train one model and save its run folder (see the module docstring), holding the run folder's
    lock (on rank 0 only) throughout.

    Args:
        config: the validated config.
        resume_from: None (fresh run; the output folder must be new or empty), ``latest`` or a
            checkpoint folder.
        on_unfinished: instead of ``resume_from``: ``resume`` or ``restart`` an unfinished run in
            the output folder (:func:`prepare_unfinished`; what a sweep passes, so the choice is
            made under this lock).
        config_path: recorded in the manifest.
    Returns:
        The folder of the final model (``output_dir/model``; ``output_dir/adapter`` for QLoRA).
    Raises:
        RatuneError: bad launcher or process count, DeepSpeed configured but not running, a
            save that does not reload (see :mod:`ratune.train.checks`), and the errors of the
            helpers (batch arithmetic, output folder, resume path, data).
        LockHeld: another process is writing ``output_dir``.
    """
    with _run_output(config).writing():
        return _train(config, resume_from=resume_from, on_unfinished=on_unfinished, config_path=config_path)


def _train(config: TrainConfig, *, resume_from: str | None, on_unfinished: str | None, config_path: str | None) -> Path:
    """The body of :func:`train`, under the run folder's lock: check everything, set up the data,
    the model and the trainer, train, save, check the saves."""
    plan = _preflight(config, resume_from=resume_from, on_unfinished=on_unfinished, config_path=config_path)
    import torch
    from datasets import Dataset
    from transformers import set_seed
    from trl import SFTTrainer

    set_seed(config.seed)
    columns, stats = load_training_rows(config, plan.tokenizer)
    # share of processed positions that are real / carry loss, under this run's batching
    stats["token_shares"] = shares_for_rows(columns, micro_batch_size=plan.per_device, packing=config.packing,
                                            max_length=config.max_length, seed=config.seed,
                                            padding_free=config.padding_free)
    check_save_schedule(config, stats["examples"], plan.nproc)
    # The training arguments come before the model: under ZeRO-3 they register DeepSpeed's config,
    # so from_pretrained loads the model partitioned (deepspeed.zero.Init) instead of holding the
    # whole model on every rank first. DeepSpeed on CPU: its gloo process group must exist before
    # the training arguments are built.
    args = _training_arguments(config, plan, use_cpu=init_deepspeed_on_cpu(config) or not torch.cuda.is_available())
    model, load_base, partitioned_load = _setup_model(config, plan.model_path)
    if config.packing or config.padding_free:  # examples concatenated into one row must not see each other
        stats["attn_implementation"] = check_packing_attention(model, trust_remote_code=config.trust_remote_code)
    # accelerate runs the trained model's forward under bf16 autocast (not under DeepSpeed, which
    # casts the weights instead); the save checks run the reloaded model under the same autocast
    autocast_dtype = torch.bfloat16 if config.bf16 and not config.deepspeed else None
    save_checks: list[dict] = []
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns),
                         processing_class=plan.tokenizer,
                         callbacks=_callbacks(config, plan, load_base, autocast_dtype, save_checks))
    facts = distributed_facts(trainer)
    check_distributed(facts, expected_processes=plan.nproc, deepspeed=plan.ds_settings)
    manifest = _run_manifest(config, plan, trainer, model, stats=stats, facts=facts,
                             partitioned_load=partitioned_load, autocast_dtype=autocast_dtype)
    main_process = trainer.is_world_process_zero()
    if main_process:
        write_text(plan.out / "config.yaml", yaml.safe_dump(config.model_dump(), sort_keys=True))
        write_json(plan.out / "manifest.json", manifest)

    result = trainer.train(resume_from_checkpoint=plan.resume)

    final = _save_final(config, plan, trainer, load_base, autocast_dtype, save_checks, main_process)
    if main_process:
        _finish(config, plan.out, final, trainer, result, manifest, save_checks)
    trainer.accelerator.wait_for_everyone()
    return final


@dataclass
class _Plan:
    """What the preflight of a training run settled: processes and batching, DeepSpeed settings,
    the hub record, the model folder and tokenizer, the run folder, what it resumes from, the
    training rows' sha256 and the config file."""

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
    """Every check before the heavy imports, any folder or any model: launcher, GPU launch,
    attention, loggers, QLoRA, batching, the data's chat template and hub, the tokenizer, the data,
    the model files; then the run folder and the resume point."""
    check_launcher()  # before the heavy imports: a wrong launcher fails in a second
    check_cuda_launch()  # a GPU launch where torch sees no GPU: refused, never a silent CPU run
    check_attention(config.attn_implementation)  # a missing flash-attn fails before any data or model (QLoRA too)
    check_report_to(config.report_to)
    set_torch_threads(config.torch_threads)
    if config.load_in_4bit:
        require_qlora()  # before any folder is made or model loaded
    ds_settings = deepspeed_settings(config.deepspeed)
    nproc = _num_processes()
    per_device, accumulation = config.resolve_batch(nproc)
    # before any folder is made or model loaded: the data's chat template, the tokenizer, the data
    # (complete, the mode built, a train split, the hub) and the model folder (safetensors weights)
    check_data_chat_template(config)
    hub_record = check_data_hub(config, config_path)  # the data manifest owns the hub; the config must agree
    model_path = resolve_model_path(config.model)
    tokenizer = use_chat_template(load_tokenizer(model_path, trust_remote_code=config.trust_remote_code),
                                  config.chat_template)
    require_chat_template(tokenizer, source=str(model_path), hint="set chat_template: in the training config "
                          "(and give the data build the same --chat-template)")
    check_training_data(config)
    require_model_files(model_path)  # safetensors weights (pickles are never loaded)
    if on_unfinished is not None:
        if resume_from is not None:
            raise RatuneError("--resume-from and --on-unfinished exclude each other: give one")
        resume_from = prepare_unfinished(Path(config.output_dir), on_unfinished)
    out = _prepare_output_dir(config, resume_from)
    resume = _resolve_resume(out, resume_from)
    data_dir = Path(config.data_dir)
    rows_sha256 = check_same_data(out, data_dir, config.train_retriever) if resume is not None \
        else train_rows_sha256(data_dir, config.train_retriever)
    return _Plan(nproc=nproc, per_device=per_device, accumulation=accumulation, ds_settings=ds_settings,
                 hub_record=hub_record, model_path=model_path, tokenizer=tokenizer, out=out, resume=resume,
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
        packing_strategy="bfd",  # the padding-free packing tests/test_packing.py checks ("wrapped" cuts rows)
        padding_free=config.padding_free or config.packing,
        completion_only_loss=True,
        dataset_num_proc=None,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def _setup_model(config: TrainConfig, model_path: Path):
    """``(model, load_base, partitioned_load)``: the base (4-bit for QLoRA) with its LoRA adapter
    when asked, the function that loads a fresh base, and whether ZeRO-3 loaded it partitioned."""
    def load_base():
        if config.load_in_4bit:
            return _load_4bit(model_path, config)
        return load_model(model_path, dtype=config.dtype, trust_remote_code=config.trust_remote_code,
                          attn_implementation=config.attn_implementation)

    model = load_base()
    partitioned_load = any(hasattr(p, "ds_id") for p in model.parameters())  # ZeRO-3: loaded partitioned
    if config.lora.enabled:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
            target_modules=config.lora.target_modules, task_type="CAUSAL_LM"))
    return model, load_base, partitioned_load


def _callbacks(config: TrainConfig, plan: _Plan, load_base, autocast_dtype, save_checks: list) -> list:
    """The trainer's callbacks: the checkpoints' file modes, TensorBoard, the save checks."""
    callbacks = [checkpoint_modes_callback()]
    if "tensorboard" in config.report_to:
        from transformers.integrations import TensorBoardCallback

        tensorboard = TensorBoardCallback()
        tensorboard.logging_dir = str(plan.out / "tensorboard")  # rank 0 opens its writer at train begin
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
        "device": device_facts(trainer.args.device), "host": host_facts(),
        "compute": {"dtype": config.dtype, "autocast": "bfloat16" if autocast_dtype else None,
                    "deepspeed_bf16": bool(config.deepspeed and config.bf16),
                    "attn_implementation": checks.attn_implementation_of(model)},
        **plan.hub_record,  # "hub": its name; "catalog": the data manifest's record (catalog hubs only)
    })
    data_manifest = Path(config.data_dir) / "manifest.json"
    if data_manifest.exists():
        manifest["data_manifest_sha256"] = sha256_file(data_manifest)
        manifest["train_rows_sha256"] = plan.rows_sha256
        # the evaluator renders prompts with the document budget and chat template the model was trained with
        manifest["prompt"] = {"max_document_tokens": read_json(data_manifest)["settings"]["max_document_tokens"],
                              "chat_template": config.chat_template}
    return manifest


def _save_final(config: TrainConfig, plan: _Plan, trainer, load_base, autocast_dtype, save_checks: list,
                main_process: bool) -> Path:
    """Save the adapter and/or the model (merged for LoRA; none for QLoRA), each checked to reload to
    the trained model; returns the final model's folder. trainer.save_model gathers ZeRO-3
    partitions (all ranks call it; rank 0 writes)."""
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
        final = out / "adapter"  # no merged model/ for QLoRA (module docstring)
    elif config.lora.enabled:
        merged = {}

        def write_merged(tmp):
            if main_process:  # the saved adapter merged into a fresh base: what a user rebuilds from adapter/
                with checks.plain_loading():  # rank 0 alone: no ZeRO-3 partitioning of the fresh base
                    merged["model"] = merge_adapter(load_base(), out / "adapter", base=plan.model_path)
                merged["model"].save_pretrained(str(tmp), safe_serialization=True)
                tokenizer.save_pretrained(str(tmp))
        _save_folder(final, write_merged, main_process, trainer)
        # its weights are the merge's, bit for bit; its logits the trained adapter model's, within the
        # tolerance of the dtype (merged weights compute in another floating-point order)
        verify(final, adapter=False, expected=merged.pop("model", None), expected_on_rank0_only=True)
    else:
        _save_folder(final, lambda tmp: trainer.save_model(str(tmp)), main_process, trainer)
        verify(final, adapter=False)
    return final


def _finish(config: TrainConfig, out: Path, final: Path, trainer, result, manifest: dict, save_checks: list) -> None:
    """Rank 0: the run manifest completed (result, throughput, steps, save checks) in the run folder
    and the final model's, the log history, the training curves, and ``.complete``."""
    manifest["train_result"] = {k: float(v) for k, v in result.metrics.items()}
    manifest["throughput"] = throughput(trainer.state.log_history, result.metrics)
    manifest["steps"] = trainer.state.global_step
    manifest["save_checks"] = [{**c, "folder": os.path.relpath(c["folder"], out)} for c in save_checks]
    write_json(final / "ratune_manifest.json", manifest)  # the checkpoint carries its run manifest
    write_json(out / "manifest.json", manifest)
    write_json(out / "log_history.json", trainer.state.log_history)
    from ratune.train.curves import plot_training_curves

    plot_training_curves(trainer.state.log_history, out / "training_curves.png",
                         title=f"{out.name}: {config.train_retriever}, lr {config.learning_rate:g}")
    _run_output(config).complete(out)


def throughput(log_history: list[dict], metrics: dict) -> dict:
    """Training throughput of a run: ``{"tokens", "train_runtime_s", "tokens_per_s"}``.

    ``tokens`` is TRL's ``num_tokens`` (the non-padding tokens seen, summed over processes) at
    the last log; ``train_runtime_s`` the Trainer's wall time of ``train()`` (a resumed run
    counts only its own part, and its tokens from the resumed step's count). None where the
    history has no token count.
    """
    tokens = next((e["num_tokens"] for e in reversed(log_history) if "num_tokens" in e), None)
    runtime = metrics.get("train_runtime")
    rate = float(tokens) / runtime if tokens is not None and runtime else None
    return {"tokens": None if tokens is None else int(tokens), "train_runtime_s": runtime, "tokens_per_s": rate}


def checkpoint_modes_callback():
    """A ``transformers.TrainerCallback`` whose ``on_save`` gives each Trainer checkpoint's files
    (``args.output_dir/checkpoint-<global_step>``) the mode ``open()`` would
    (:func:`ratune.io.open_file_modes`): safetensors 0.8 writes its weights 0600. Run by each
    node's local main process (the checkpoint is on its disk)."""
    from transformers import TrainerCallback

    class OpenFileModes(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_local_process_zero and folder.is_dir():
                open_file_modes(folder)
            return control

    return OpenFileModes()


def _save_folder(final: Path, write, main_process: bool, trainer) -> Path:
    """Write ``final`` atomically: ``write(tmp)`` on every rank (rank 0 writes), then swap it in.

    Rank 0 makes the temporary sibling (:func:`ratune.output.reserve_sibling`) and broadcasts its
    token, so every rank names the same folder. Drops the Trainer's pickled ``training_args.bin``
    (model folders hold safetensors and JSON only).
    """
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
    """``--resume-from`` and ``--on-unfinished`` (one or the other) of ``ratune train`` and
    ``python -m ratune.train``."""
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
        # each rank leaves the process group before the interpreter exits: a gloo group left to
        # the exit handlers once aborted rank 1 after training had finished ("terminate called
        # without an active exception", exit -6) and failed a launch that had succeeded
        dist.destroy_process_group()
    print(json.dumps({"model": str(path)}))
    return 0
