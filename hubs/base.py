"""The hub protocol (:class:`Hub`), the registry of kinds and the functions that turn ``--hub``
text or a recorded name into a hub or its kind."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

from ratune.errors import RatuneError
from ratune.registry import CONSTRAINTS_PREFIX, DEFAULT_SETTINGS, RETRIEVERS, TEST_SETTINGS, setting_retriever
from ratune.sources.apibench import Example, ParseReport
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT


@dataclass(frozen=True)
class Hub(ABC):
    """One hub: its ``name`` (as records call it) and the folder it is read from."""

    name: str

    #: The kind's name in :data:`HUB_KINDS` and in records (``hub_kind``).
    kind: ClassVar[str]
    #: Whether the paper's precomputed documents (``gpt_index``, ``released_bm25``) exist for it.
    has_precomputed: ClassVar[bool] = False
    #: Whether the released Gorilla-7B responses (``ratune compare`` against them) exist for it.
    has_released_responses: ClassVar[bool] = False
    #: The key of its scorer in the eval stage's scorer registry (eval/hub_scoring.py).
    scorer: ClassVar[str]
    #: What ``--hub`` takes, for messages.
    choices_text: ClassVar[str]
    #: How its rows' prompts and answers are written (:data:`ratune.sources.formats.ANSWER_FORMATS`).
    answer_format: ClassVar[str] = DEFAULT_ANSWER_FORMAT
    #: The other formats its rows can be written in (``ratune data build --answer-format``).
    other_answer_formats: ClassVar[tuple[str, ...]] = ()

    def choose_answer_format(self, name: str | None) -> str:
        """``name`` (None: :attr:`answer_format`) when this hub's rows can be written in it.

        Raises:
            RatuneError: a format the hub's examples cannot be written in.
        """
        allowed = (self.answer_format, *self.other_answer_formats)
        if name is not None and name not in allowed:
            raise RatuneError(f"--answer-format {name}: hub {self.name} ({self.kind}) writes its rows as "
                              f"{' or '.join(allowed)}")
        return name or self.answer_format

    @classmethod
    @abstractmethod
    def claims(cls, text: str) -> bool:
        """Whether ``--hub`` text names a hub of this kind."""

    @classmethod
    def claims_name(cls, name: str | None) -> bool:
        """Whether a record that names a hub but not its kind (older manifests and cells) is of this kind."""
        return False

    @classmethod
    @abstractmethod
    def from_ref(cls, text: str, apibench_dir: str | os.PathLike | None) -> "Hub":
        """The hub ``text`` names (``claims(text)`` holds).

        Raises:
            RatuneError: a folder that is not of this kind after all, a name it refuses.
        """

    @property
    @abstractmethod
    def root(self) -> Path:
        """The folder the hub is read from."""

    @property
    @abstractmethod
    def ref(self) -> str:
        """What ``--hub`` takes to name this hub again."""

    @property
    @abstractmethod
    def api_database_file(self) -> Path:
        """The file of the API documents."""

    @abstractmethod
    def examples_file(self, split: str) -> Path:
        """The example file of a split (``train`` or ``eval``); it may not exist."""

    @abstractmethod
    def load_api_database(self) -> list[dict]:
        """The API documents in file order.

        Raises:
            RatuneError, InputError: a missing file, a bad line named by file, line and field.
        """

    @abstractmethod
    def load_examples(self, split: str, *, lenient: bool = False, report: ParseReport | None = None
                      ) -> list[Example]:
        """A split's examples in file order (``lenient``: bad rows go to ``report`` where allowed).

        Raises:
            RatuneError: the split's file does not exist (the message says how to make it).
            InputError: a bad row (file, line, field).
        """

    def locate(self) -> "Hub":
        """Check that the hub's folder can be found now (an APIBench folder is looked for lazily)."""
        self.root
        return self

    def questions_file(self, setting: str) -> Path:
        """The paper's question file of a test setting.

        Raises:
            RatuneError: the hub has no precomputed question files.
        """
        raise RatuneError(f"{self.root}: a {self.kind} has no precomputed question files "
                          f"(questions_*_{setting}.jsonl are APIBench only)")

    def released_responses_file(self, model: str, setting: str) -> Path:
        """A released Gorilla-7B response file.

        Raises:
            RatuneError: the hub has none.
        """
        raise RatuneError(f"hub {self.name}: no released responses (APIBench only)")

    def input_files(self, splits: Sequence[str]) -> list[Path]:
        """The files whose sha256 manifests record: the API documents, then each split's example file."""
        return [self.api_database_file] + [self.examples_file(s) for s in splits]

    def manifest_record(self) -> dict | None:
        """What a manifest records about the hub beyond its name and file hashes (None: nothing)."""
        return None

    def require_split(self, split: str, purpose: str) -> None:
        """Refuse a split whose example file is missing (``purpose``: why it is needed).

        Raises:
            RatuneError: naming the file and how to make it.
        """
        if not self.examples_file(split).exists():
            self.load_examples(split)

    @property
    def default_settings(self) -> tuple[str, ...]:
        """The test settings ``ratune eval run`` runs without ``--settings``."""
        return tuple(s for s in DEFAULT_SETTINGS if self.setting_refusal(s) is None)

    def setting_refusal(self, setting: str) -> str | None:
        """Why the test or experiment ``setting`` does not exist for this hub (None: it does)."""
        if setting in TEST_SETTINGS and RETRIEVERS[setting_retriever(setting)].precomputed and not self.has_precomputed:
            return (f"test setting {setting}: it replays the paper's precomputed documents, which exist for the "
                    f"APIBench hubs only, not for {self.kind} {self.name} ({self.ref})")
        if setting.startswith(CONSTRAINTS_PREFIX) and not self.has_constraints:
            return f"test setting {setting}: constrained questions exist for torchhub only"
        return None

    def check_settings(self, settings: Sequence[str], where: str | None = None) -> None:
        """Refuse the test or experiment settings this hub does not have (the one place that does).

        Raises:
            RatuneError: the first one's :meth:`setting_refusal`; with ``where``, one line naming
                ``where``, the hub, every such setting and the defaults it has.
        """
        bad = [s for s in dict.fromkeys(settings) if self.setting_refusal(s) is not None]
        if bad and where is None:
            raise RatuneError(self.setting_refusal(bad[0]))
        if bad:
            raise RatuneError(f"{where} ({self.kind} {self.ref}): eval settings {', '.join(bad)} exist for the "
                              "APIBench hubs only (the paper's precomputed documents, the constrained TorchHub "
                              f"questions); set eval.settings, e.g. [{', '.join(self.default_settings)}]")

    @property
    def has_constraints(self) -> bool:
        """Whether the constrained questions (``constraints_*`` settings) exist for it."""
        return False

    # -- how records, reports and model cards name it (class-level: they read recorded names) --

    @classmethod
    def card_trained_on(cls, name: str, record: dict | None) -> str:
        """The words after "for API calling" in a model card: what the model was trained on."""
        return f"on {name}"

    @classmethod
    def card_training_data(cls, name: str, record: dict | None) -> list[str]:
        """Lines of the card's training-data section before the file hashes."""
        return []

    @classmethod
    def card_files_label(cls, name: str, record: dict | None) -> str:
        """How the card names the hashed data files."""
        return f"`{name}` files"

    @classmethod
    def card_measured(cls, name: str | None) -> str:
        """The sentence above the card's results table."""
        return f"Measured on the eval questions of {name} (95 % Wilson score intervals; n = questions per cell):"

    @classmethod
    def card_dataset(cls, name: str | None) -> dict:
        """The dataset fields of the card's ``EvalResult`` entries."""
        return {"dataset_type": name, "dataset_name": name, "dataset_config": None}

    #: The card's ``datasets`` (None: none to name) and extra tags.
    card_datasets: ClassVar[list[str] | None] = None
    card_tags: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True)
class FolderHub(Hub, ABC):
    """A hub read from the folder that names it (a catalog, a tool set)."""

    folder: Path = Path()

    @property
    def root(self) -> Path:
        return self.folder

    @property
    def ref(self) -> str:
        return str(self.folder)


#: The kinds of hub, in the order ``--hub`` text is tried (:func:`register_hub_kind`).
HUB_KINDS: dict[str, type[Hub]] = {}


def register_hub_kind(cls: type[Hub]) -> type[Hub]:
    """Add a kind of hub to :data:`HUB_KINDS` (a class decorator), tried after the earlier ones."""
    if cls.kind in HUB_KINDS and HUB_KINDS[cls.kind] is not cls:
        raise RatuneError(f"hub kind {cls.kind!r} is registered already")
    HUB_KINDS[cls.kind] = cls
    return cls


def hub_choices_text() -> str:
    """The hubs a ``--hub`` accepts, for messages."""
    return ", or ".join(cls.choices_text for cls in HUB_KINDS.values())


def resolve_hub(hub: "str | os.PathLike | Hub", apibench_dir: str | os.PathLike | None = None, *,
                locate: bool = True) -> Hub:
    """The :class:`Hub` that ``--hub`` text names (a hub is returned as it is).

    Args:
        apibench_dir: the APIBench folder for an APIBench hub (None: found when needed).
        locate: check that the hub's folder exists now (False: when first read).
    Raises:
        RatuneError: no kind claims ``hub``, the kind's own refusal, or its folder is not found.
    """
    if isinstance(hub, Hub):
        return hub
    text = str(hub)
    for cls in HUB_KINDS.values():
        if cls.claims(text):
            found = cls.from_ref(text, apibench_dir)
            return found.locate() if locate else found
    raise RatuneError(f"unknown hub {text!r}: expected one of {hub_choices_text()}"
                      + (f" ({text}: no such folder)" if text and not Path(text).exists() else ""))


def hub_name(hub: str | os.PathLike) -> str:
    """The name of a hub reference (as records call it).

    Raises:
        RatuneError: as :func:`resolve_hub`.
    """
    return resolve_hub(hub, locate=False).name


def recorded_hub_kind(name: str | None, kind: str | None = None) -> type[Hub]:
    """The class of a hub that a record names: its recorded ``kind``, else the first kind that
    claims the recorded name (:meth:`Hub.claims_name`).

    Raises:
        RatuneError: a recorded kind that is not registered, or a name no kind claims.
    """
    if kind is not None:
        if kind not in HUB_KINDS:
            raise RatuneError(f"hub kind {kind!r} is not one of {', '.join(HUB_KINDS)}")
        return HUB_KINDS[kind]
    found = next((cls for cls in HUB_KINDS.values() if cls.claims_name(name)), None)
    if found is None:
        raise RatuneError(f"hub {name!r}: no kind of hub claims this recorded name")
    return found


def manifest_hub_record(manifest: dict) -> tuple[str | None, dict | None]:
    """``(kind, record)`` of the hub record a manifest holds under its kind's key, or ``(None, None)``."""
    return next(((kind, manifest[kind]) for kind in HUB_KINDS if isinstance(manifest.get(kind), dict)), (None, None))


def check_hub_ref(text: str) -> str:
    """Return ``text`` if :func:`resolve_hub` could resolve it, else raise its RatuneError."""
    resolve_hub(text, locate=False)
    return text


def hub_argument_type():
    """The argparse type of every ``--hub`` (:func:`check_hub_ref`, keeping the text)."""
    from ratune.args import checked

    return checked(check_hub_ref, "hub", good="torchhub", bad=("no_such_hub", "folder"))


def as_hub_source(hub: "str | Hub", apibench_dir: str | os.PathLike | None = None) -> Hub:
    """``hub`` itself when it is a :class:`Hub`, else :func:`resolve_hub` of it (folder found when read)."""
    return resolve_hub(hub, apibench_dir, locate=False)
