"""The training config: one YAML file per run, validated before any model is loaded. Its keys:
docs/configs.md#training-configs-trainconfig."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ratune.config import SCHEMA_CONFIG, Count, MaxLength, PositiveFloat, Seed, Threads
from ratune.sources.prompt import CHAT_TEMPLATE_NAMES
from ratune.errors import InputError, RatuneError
from ratune.io import read_json_object
from ratune.registry import TRAIN_MODES


class LoraSettings(BaseModel):
    """PEFT LoRA settings (Hu et al., 2021). ``enabled: false`` trains all weights."""

    model_config = SCHEMA_CONFIG
    enabled: bool = False
    r: int = Field(16, ge=1, description="LoRA rank")
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | str = "all-linear"


class TrainConfig(BaseModel):
    """A training run. The batch and schedule defaults are the paper's 7B recipe (Gorilla, appendix:
    lr 2e-5, global batch 64, 5 epochs, warmup ratio 0.03, max length 2048)."""

    model_config = SCHEMA_CONFIG

    model: str
    data_dir: str
    train_retriever: str
    output_dir: str
    hub: str = "torchhub"  # dumped as given: sweeps hash the dump
    max_length: MaxLength = 2048
    global_batch_size: Count = 64
    per_device_batch_size: Count = 1
    gradient_accumulation_steps: Count | None = None
    learning_rate: PositiveFloat = 2e-5
    num_epochs: float = Field(5.0, gt=0)
    max_steps: Count | None = None
    max_examples: Count | None = None
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    weight_decay: float = Field(0.0, ge=0)
    lora: LoraSettings = LoraSettings()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    bf16: bool = False
    gradient_checkpointing: bool = False
    deepspeed: str | None = None
    packing: bool = False
    padding_free: bool = False
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    seed: Seed = 42
    torch_threads: Threads | None = None
    logging_steps: Count = 1
    save_steps: Count | None = None
    save_strategy: Literal["no", "steps", "epoch"] | None = None
    save_total_limit: int | None = Field(None, ge=1)
    chat_template: Literal[CHAT_TEMPLATE_NAMES] | None = None
    trust_remote_code: bool = False
    load_in_4bit: bool = False
    verify_saves: bool = True
    report_to: list[Literal["tensorboard", "wandb"]] = []

    @field_validator("train_retriever")
    @classmethod
    def _train_mode(cls, value: str) -> str:
        import re

        if value not in TRAIN_MODES and not re.fullmatch(r"mix-[a-z0-9][a-z0-9_]*", value):
            raise ValueError(f"expected one of {', '.join(TRAIN_MODES)} or mix-NAME (a mixture built with "
                             f"`ratune data build --mixture NAME:...`), got {value!r}")
        return value

    @field_validator("hub")
    @classmethod
    def _hub(cls, value: str) -> str:
        from ratune.hubs import check_hub_ref

        try:
            return check_hub_ref(value)
        except RatuneError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _check(self):
        if self.bf16 and self.dtype == "float16":
            raise ValueError("bf16: true contradicts dtype: float16")
        if self.packing and self.padding_free:
            raise ValueError("packing: true and padding_free: true are exclusive: packing already runs padding-free "
                             "(choose padding_free to keep counting examples per batch)")
        if self.load_in_4bit and not self.lora.enabled:
            raise ValueError("load_in_4bit: true (QLoRA) needs lora.enabled: true; 4-bit weights cannot be trained")
        if self.load_in_4bit and self.deepspeed:
            if read_deepspeed_config(self.deepspeed)["zero_optimization"]["stage"] == 3:
                raise ValueError(
                    f"load_in_4bit: true (QLoRA) with the ZeRO-3 DeepSpeed config {self.deepspeed} is not supported: "
                    "peft's guide 'Use PEFT QLoRA and DeepSpeed with ZeRO3' (huggingface.co/docs/peft/accelerate/"
                    "deepspeed) needs the 4-bit weights stored in the compute dtype (BitsAndBytesConfig "
                    "bnb_4bit_quant_storage=bfloat16, and from_pretrained's dtype the same), the model loaded "
                    "without a device_map so that deepspeed.zero.Init partitions it (accelerate zero3_init_flag: "
                    "true), and bitsandbytes>=0.43.3; ratune's 4-bit load (train/sft.py _load_4bit) keeps the "
                    "default uint8 storage and places the whole model on each rank's GPU with a device_map. Use "
                    "QLoRA without deepspeed or with ZeRO-2 (configs/deepspeed/zero2.json), or LoRA under ZeRO-3 "
                    "(lora.enabled: true, load_in_4bit: false, deepspeed: configs/deepspeed/zero3.json)")
        if self.dtype != "float32" and not self.lora.enabled and not self.deepspeed:
            raise ValueError(
                f"dtype: {self.dtype} with a full finetune (lora.enabled: false) and no deepspeed keeps no fp32 "
                f"master weights: at learning_rate {self.learning_rate:g} most updates round away in {self.dtype}; "
                "use dtype: float32 with bf16: true (bf16 autocast, fp32 weights), or LoRA (lora.enabled: true), "
                "or DeepSpeed (deepspeed: configs/deepspeed/zero3.json keeps fp32 master weights)")
        if self.save_strategy == "steps" and self.save_steps is None:
            raise ValueError("save_strategy: steps needs save_steps")
        if self.save_strategy in ("no", "epoch") and self.save_steps is not None:
            raise ValueError(f"save_steps: {self.save_steps} contradicts save_strategy: {self.save_strategy} "
                             "(save_steps is used only with save_strategy: steps)")
        return self

    @property
    def resolved_save_strategy(self) -> str:
        """``save_strategy``, or where it is null ``steps`` when ``save_steps`` is set, else ``no``."""
        if self.save_strategy is not None:
            return self.save_strategy
        return "steps" if self.save_steps is not None else "no"

    def optimizer_steps_bound(self, examples: int, num_processes: int) -> int:
        """An upper bound on the Trainer's optimizer steps over ``examples`` rows (exact without packing):
        ``max_steps`` when set, else ``ceil(num_epochs x ceil(ceil(examples / (per_device x processes)) /
        accumulation))``. Raises as :meth:`resolve_batch`."""
        import math

        if self.max_steps is not None:
            return self.max_steps
        per_device, accumulation = self.resolve_batch(num_processes)
        micro_batches = math.ceil(examples / (per_device * num_processes))
        return math.ceil(self.num_epochs * math.ceil(micro_batches / accumulation))

    def resolve_batch(self, num_processes: int) -> tuple[int, int]:
        """``(per_device_batch_size, gradient_accumulation_steps)`` for ``num_processes``.

        Raises:
            RatuneError: global batch is not per-device x accumulation x processes (naming the numbers).
        """
        per_step = self.per_device_batch_size * num_processes
        if self.gradient_accumulation_steps is None:
            if self.global_batch_size % per_step:
                raise RatuneError(
                    f"global_batch_size {self.global_batch_size} is not divisible by per_device_batch_size "
                    f"{self.per_device_batch_size} x {num_processes} processes = {per_step}")
            return self.per_device_batch_size, self.global_batch_size // per_step
        if per_step * self.gradient_accumulation_steps != self.global_batch_size:
            raise RatuneError(
                f"global_batch_size {self.global_batch_size} != per_device_batch_size {self.per_device_batch_size} "
                f"x gradient_accumulation_steps {self.gradient_accumulation_steps} x {num_processes} processes "
                f"= {per_step * self.gradient_accumulation_steps}")
        return self.per_device_batch_size, self.gradient_accumulation_steps


#: ZeRO stages DeepSpeed has.
ZERO_STAGES = (0, 1, 2, 3)


def read_deepspeed_config(path: str | os.PathLike) -> dict:
    """A DeepSpeed JSON whose ``zero_optimization`` is an object with an integer ``stage`` (0 when absent).

    Raises:
        RatuneError: naming the file: unreadable, not a JSON object, or a bad ``zero_optimization``.
    """
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"deepspeed: {path}: cannot read the DeepSpeed config "
                          f"({'a folder' if path.is_dir() else 'no such file'}; see configs/deepspeed/)")
    ds = read_json_object(path)
    zero = ds.get("zero_optimization")
    if zero is None:
        zero = {}
    if not isinstance(zero, dict):
        raise InputError(str(path), None, "zero_optimization", f"expected an object, got {type(zero).__name__}")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise InputError(str(path), None, "zero_optimization.stage",
                         f"expected one of {', '.join(map(str, ZERO_STAGES))} (an integer), got {stage!r}")
    return {**ds, "zero_optimization": {**zero, "stage": int(stage)}}
