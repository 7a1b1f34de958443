"""The APIBench hubs as a kind of hub: ``torchhub``, ``huggingface``, ``tensorflowhub``, read from
the APIBench folder by :mod:`ratune.sources.apibench`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from ratune.errors import RatuneError
from ratune.hubs.base import Hub, register_hub_kind
from ratune.sources.apibench import (HUBS, Example, ParseReport, api_database_path, examples_path, load_api_database,
                                     load_examples, questions_path, released_responses_path, resolve_apibench_dir)

#: :attr:`~ratune.hubs.base.Hub.kind` of an APIBench hub.
APIBENCH = "apibench"
#: The Hugging Face dataset id of APIBench (model cards' ``datasets``).
APIBENCH_DATASET_ID = "gorilla-llm/APIBench"


@register_hub_kind
@dataclass(frozen=True)
class APIBenchHub(Hub):
    """An APIBench hub (:data:`~ratune.sources.apibench.HUBS`), read from the APIBench folder: the one
    given, else the one :func:`~ratune.sources.apibench.resolve_apibench_dir` finds when first needed.
    A name in HUBS is always this kind; write a catalog folder of that name as a path (``./torchhub``)."""

    apibench_dir: str | os.PathLike | None = field(default=None, compare=False)

    kind: ClassVar[str] = APIBENCH
    has_precomputed: ClassVar[bool] = True
    has_released_responses: ClassVar[bool] = True
    scorer: ClassVar[str] = APIBENCH
    choices_text: ClassVar[str] = ", ".join(HUBS)
    card_datasets: ClassVar[list[str] | None] = [APIBENCH_DATASET_ID]

    @classmethod
    def claims(cls, text: str) -> bool:
        return text in HUBS

    @classmethod
    def claims_name(cls, name):
        return name is None or name in HUBS  # no name: the default hub, torchhub

    @classmethod
    def from_ref(cls, text: str, apibench_dir=None) -> "APIBenchHub":
        return cls(name=text, apibench_dir=apibench_dir)

    @cached_property
    def root(self) -> Path:
        return resolve_apibench_dir(self.apibench_dir)

    @property
    def ref(self) -> str:
        return self.name

    @property
    def api_database_file(self) -> Path:
        return api_database_path(self.root, self.name)

    def examples_file(self, split: str) -> Path:
        return examples_path(self.root, self.name, split)

    def questions_file(self, setting: str) -> Path:
        return questions_path(self.root, self.name, setting)

    def released_responses_file(self, model: str, setting: str) -> Path:
        return released_responses_path(self.root, self.name, model, setting)

    def load_api_database(self) -> list[dict]:
        return load_api_database(self.api_database_file)

    def load_examples(self, split: str, *, lenient: bool = False, report: ParseReport | None = None) -> list[Example]:
        return load_examples(self.root, self.name, split, lenient=lenient, report=report)

    def require_split(self, split: str, purpose: str) -> None:
        path = self.examples_file(split)
        if not path.exists():
            words = {"train": "training"}.get(split, split)
            raise RatuneError(f"{path}: no {words} split for {self.name} ({purpose}; this APIBench copy lacks "
                              f"{path.name})")

    @property
    def has_constraints(self) -> bool:
        return self.name == "torchhub"

    @classmethod
    def card_trained_on(cls, name, record):
        return f"on APIBench {name}"

    @classmethod
    def card_files_label(cls, name, record):
        return f"[{APIBENCH_DATASET_ID}](https://huggingface.co/datasets/{APIBENCH_DATASET_ID}) files"

    @classmethod
    def card_measured(cls, name):
        return (f"Measured on APIBench {name or ''} eval questions (AST sub-tree match, the official Gorilla "
                "metric; 95 % Wilson score intervals; n = questions per cell):").replace("  ", " ")

    @classmethod
    def card_dataset(cls, name):
        return {"dataset_type": APIBENCH_DATASET_ID, "dataset_name": f"APIBench {name or ''}".strip(),
                "dataset_config": name}
