"""The layout of a ``ratune train`` run folder (docs/pipeline.md#train) and what a checkpoint path
loads as: training writes the folder, eval and export read it through this module."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ratune.errors import RatuneError
from ratune.io import read_json_object
from ratune.manifest import is_complete
from ratune.models import is_hub_id


#: The Trainer's folder in a run (``RUN/trainer``), and the name of its checkpoints in it.
TRAINER_DIR = "trainer"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_folders(run: str | os.PathLike) -> list[Path]:
    """The folders ``RUN/trainer/checkpoint-STEP`` by increasing step, whatever they hold; other names
    are ignored. Empty when there are none."""
    trainer = Path(run) / TRAINER_DIR
    found = [(int(m.group(1)), p) for p in (trainer.iterdir() if trainer.is_dir() else ())
             if (m := _CHECKPOINT_NAME.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


#: The file the Trainer writes last in a checkpoint, after the weights, optimizer, scheduler and RNG
#: states (transformers ``Trainer._save_checkpoint``): a checkpoint is complete when it is readable.
TRAINER_STATE = "trainer_state.json"


def checkpoint_gap(folder: str | os.PathLike) -> str | None:
    """What a Trainer checkpoint lacks to be complete (None: nothing): no readable
    :data:`TRAINER_STATE`, as a save cut short by a full disk or a kill leaves it."""
    state = Path(folder) / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE}: its save was cut short"
    try:
        ok = isinstance(json.loads(state.read_bytes()), dict)
    except (OSError, ValueError):
        ok = False
    return None if ok else f"{TRAINER_STATE} is cut short: its save was interrupted"


def complete_checkpoint_folders(run: str | os.PathLike, *, say: bool = True) -> list[Path]:
    """:func:`checkpoint_folders` that are complete (:func:`checkpoint_gap`); with ``say``, one line
    on stderr for each partial one passed over."""
    complete = []
    for folder in checkpoint_folders(run):
        gap = checkpoint_gap(folder)
        if gap is None:
            complete.append(folder)
        elif say:
            sys.stderr.write(f"ratune: note: passing over the partial checkpoint {folder} ({gap})\n")
    return complete


def require_complete_checkpoint(folder: str | os.PathLike) -> None:
    """Refuse a partial Trainer checkpoint (:func:`checkpoint_gap`): RatuneError naming what it lacks."""
    gap = checkpoint_gap(folder)
    if gap is not None:
        run = Path(folder).parent.parent
        raise RatuneError(f"{folder}: a partial Trainer checkpoint ({gap}); use a complete one ("
                          f"--resume-from latest takes the newest, {run / TRAINER_DIR}/checkpoint-STEP with a "
                          f"{TRAINER_STATE})")


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint loads as (:func:`resolve_checkpoint`).

    Attributes:
        folder: the weights and the tokenizer: a model folder, or a QLoRA run's ``adapter/``.
        base: for an adapter, the base it was trained on (the run manifest's ``model_path``); else None.
        base_in_4bit: the adapter was trained on a 4-bit base (it loads on the unquantized one).
        run: a Trainer checkpoint's run folder, whose manifest describes it; else None.
        step: a Trainer checkpoint's optimizer step; else None.
    """

    folder: Path
    base: str | None = None
    base_in_4bit: bool = False
    run: Path | None = None
    step: int | None = None


def adapter_base(manifest: dict, source: str | os.PathLike, *, hint: str = "") -> str:
    """The base model of a run's adapter: the manifest's ``model_path``, resolved when it is a local
    folder, as it is when it is a hub id.

    Raises:
        RatuneError: no ``model_path``, or a gone base folder; ``hint`` ends the message.
    """
    recorded = manifest.get("model_path")
    if not isinstance(recorded, str) or not recorded:
        raise RatuneError(f"{source}: records no model_path (the base model the adapter was trained on){hint}")
    path = Path(recorded)
    if (path / "config.json").is_file():
        return str(path.resolve())
    if not path.exists() and not path.is_absolute() and is_hub_id(recorded):
        return recorded
    raise RatuneError(f"{recorded}: the base model folder recorded in {source} is gone (no config.json); the "
                      f"adapter loads only on it{hint}")


def _trainer_checkpoint(path: Path) -> Checkpoint | None:
    """A run's Trainer checkpoint ``RUN/trainer/checkpoint-STEP`` (full weights or a LoRA adapter); None
    for any other folder. Raises RatuneError for one without weights or whose base is gone."""
    match = _CHECKPOINT_NAME.fullmatch(path.name)
    run = path.parent.parent
    if not match or path.parent.name != TRAINER_DIR or not (run / "manifest.json").is_file():
        return None
    step = int(match.group(1))
    require_complete_checkpoint(path)
    if (path / "config.json").exists():
        return Checkpoint(path, run=run, step=step)
    if (path / "adapter_config.json").exists():
        manifest = read_json_object(run / "manifest.json")
        config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        return Checkpoint(path, base=adapter_base(manifest, run / "manifest.json"),
                          base_in_4bit=config.get("load_in_4bit") is True, run=run, step=step)
    raise RatuneError(f"{path}: this Trainer checkpoint holds no model weights (no config.json, no "
                      "adapter_config.json; a DeepSpeed ZeRO-3 run saves them only with "
                      "stage3_gather_16bit_weights_on_model_save: true): evaluate the run's model/ instead")


def resolve_checkpoint(checkpoint: str | os.PathLike) -> Checkpoint:
    """What ``checkpoint`` loads as: a run folder's ``model/``, a run's Trainer checkpoint, a model
    folder, or a finished QLoRA run's ``adapter/`` on its base.

    Raises:
        RatuneError: none of these; a Trainer checkpoint without weights; an unfinished adapter-only
            run, or one whose base is gone.
    """
    path = Path(checkpoint)
    trainer_checkpoint = _trainer_checkpoint(path)
    if trainer_checkpoint is not None:
        return trainer_checkpoint
    if (path / "model" / "config.json").exists():
        return Checkpoint(path / "model")
    if (path / "config.json").exists():
        return Checkpoint(path)
    if (path / "adapter" / "adapter_config.json").exists():
        if not is_complete(path) or not (path / "manifest.json").is_file():
            raise RatuneError(f"{path}: training run is not complete (no .complete marker; adapter/ but no model/): "
                              "finish or resume it first")
        manifest = read_json_object(path / "manifest.json")
        config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        return Checkpoint(path / "adapter", base=adapter_base(manifest, path / "manifest.json"),
                          base_in_4bit=config.get("load_in_4bit") is True)
    raise RatuneError(f"{path}: not a checkpoint (no config.json, no model/config.json of a ratune run, and no "
                      "adapter/adapter_config.json of a QLoRA run)")


def model_folder(checkpoint: str | os.PathLike) -> Path:
    """The weights' and tokenizer's folder of a checkpoint (:func:`resolve_checkpoint`, raising as it does)."""
    return resolve_checkpoint(checkpoint).folder


def trained_document_budget(checkpoint: str | os.PathLike) -> int | None:
    """The max_document_tokens the checkpoint's training data was built with, if recorded."""
    manifest = Path(checkpoint) / "manifest.json"
    if manifest.exists():
        prompt = read_json_object(manifest).get("prompt") or {}
        return prompt.get("max_document_tokens") if isinstance(prompt, dict) else None
    return None


def _run_manifest_of(checkpoint: str | os.PathLike) -> dict | None:
    """The run manifest a checkpoint was trained under: a run folder's ``manifest.json`` or a model
    folder's ``ratune_manifest.json``; None when there is none (a model from elsewhere)."""
    path = Path(checkpoint)
    for manifest in (path / "manifest.json", path / "ratune_manifest.json", path / "model" / "ratune_manifest.json"):
        if manifest.exists():
            return read_json_object(manifest)
    return None


def trained_chat_template(checkpoint: str | os.PathLike) -> str | None:
    """The chat template name the checkpoint was trained with (its run manifest's
    ``prompt.chat_template``, else ``config.chat_template``); None: not recorded."""
    data = _run_manifest_of(checkpoint) or {}
    prompt = data.get("prompt") if isinstance(data.get("prompt"), dict) else {}
    if "chat_template" in prompt:
        return prompt["chat_template"]
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    return config.get("chat_template")


def trained_data_dir(checkpoint: str | os.PathLike) -> Path | None:
    """The data build the checkpoint was trained on (its run manifest's ``config.data_dir``); None
    when not recorded (a model from elsewhere)."""
    data = _run_manifest_of(checkpoint) or {}
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    return Path(config["data_dir"]) if isinstance(config.get("data_dir"), str) else None


def trained_answer_format(checkpoint: str | os.PathLike) -> str | None:
    """The answer format the checkpoint's training rows were written in (its run manifest's
    ``prompt.answer_format``, copied from the data manifest); None: not recorded, the hub's own."""
    data = _run_manifest_of(checkpoint) or {}
    prompt = data.get("prompt") if isinstance(data.get("prompt"), dict) else {}
    return prompt.get("answer_format")


def trainer_checkpoints(run: str | os.PathLike) -> list[Checkpoint]:
    """A run's complete Trainer checkpoints by increasing step, each as :func:`resolve_checkpoint` loads
    it; a partial one is passed over with a line on stderr.

    Raises:
        RatuneError: ``run`` has no ``manifest.json``, or a checkpoint holds no weights.
    """
    run = Path(run)
    if not (run / "manifest.json").is_file():
        raise RatuneError(f"{run}: not a ratune train run folder (no manifest.json)")
    return [c for c in map(_trainer_checkpoint, complete_checkpoint_folders(run)) if c is not None]


def checkpoint_epoch(checkpoint: Checkpoint) -> float | None:
    """The epoch a Trainer checkpoint was saved at (its ``trainer_state.json``), or None."""
    state = Path(checkpoint.folder) / "trainer_state.json"
    if not state.is_file():
        return None
    epoch = read_json_object(state).get("epoch")
    return float(epoch) if isinstance(epoch, (int, float)) else None
