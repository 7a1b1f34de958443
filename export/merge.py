"""The model an export writes: a run's ``model/``, or its LoRA adapter merged into the unquantized
base (``--merge-lora``), with the training tokenizer and a greedy generation config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ratune.errors import RatuneError
from ratune.export.checks import check_vocabulary
from ratune.io import read_json
from ratune.models import load_model, load_tokenizer


@dataclass
class ExportModel:
    """What :func:`load_export_model` loaded."""

    model: object
    tokenizer: object
    generation: object
    vocab: dict
    merged_from_adapter: bool

    @property
    def eos(self) -> tuple[str, int]:
        return self.tokenizer.eos_token, self.generation.eos_token_id


def load_export_model(checkpoint: Path, folder: Path, manifest: dict | None, *, merge_lora: bool) -> ExportModel:
    """Load what :func:`ratune.export.checkpoint.export_checkpoint` writes, EOS the trained one.

    Raises:
        RatuneError: a QLoRA run (adapter only) without ``merge_lora``; a base model that is gone;
            a vocabulary mismatch (:func:`ratune.export.checks.check_vocabulary`); a tokenizer
            without an EOS token.
    """
    from transformers import GenerationConfig

    cfg = (manifest or {}).get("config", {})
    dtype, trust = cfg.get("dtype", "float32"), bool(cfg.get("trust_remote_code", False))
    adapter = checkpoint / "adapter"
    adapter_only = folder == adapter  # a QLoRA run: adapter/ and no model/
    if adapter_only and not merge_lora:
        raise RatuneError(f"{checkpoint}: this run saved only its LoRA adapter (QLoRA, load_in_4bit: true: no merged "
                          "model/ is written at train time); export it with --merge-lora, which merges the adapter "
                          "into the unquantized base")
    merged_from_adapter = bool(merge_lora and manifest and (adapter / "adapter_config.json").exists())
    if merged_from_adapter:
        # the adapter merged into the UNQUANTIZED base, in the run's dtype (QLoRA runs too: a merge into
        # their 4-bit base would round the merged weights to 4 bits again)
        from ratune.models import load_adapter_merged
        from ratune.train.layout import adapter_base

        base = adapter_base(manifest, checkpoint / "manifest.json",
                            hint="" if adapter_only else "; export without --merge-lora (model/ is already merged)")
        model = load_adapter_merged(base, adapter, dtype=dtype, trust_remote_code=trust)
    else:
        model = load_model(folder, dtype=dtype, trust_remote_code=trust)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust)  # the training tokenizer, saved with model/
    vocab = check_vocabulary(model, tokenizer, base_rows=_base_rows(manifest))
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise RatuneError(f"{folder}: the tokenizer has no EOS token; cannot tell where answers end")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    model.config.eos_token_id, model.config.pad_token_id = eos_id, pad_id
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id,
                                               pad_token_id=pad_id, do_sample=False)
    return ExportModel(model, tokenizer, model.generation_config, vocab, merged_from_adapter)


def _base_rows(manifest: dict | None) -> int | None:
    """The embedding rows of the run's base model (its config.json's vocab_size), when it is a local folder."""
    if not (manifest and manifest.get("model_path") and (Path(manifest["model_path"]) / "config.json").exists()):
        return None
    base_cfg = read_json(Path(manifest["model_path"]) / "config.json")
    return base_cfg.get("vocab_size") or (base_cfg.get("text_config") or {}).get("vocab_size")
