"""Hubs: where a stage gets its API documents and its examples, one class per kind.

Two kinds ship (docs/development.md says where a new one goes): :class:`APIBenchHub` (``torchhub``, ``huggingface``,
``tensorflowhub``, read from the APIBench folder by :mod:`ratune.data.apibench`) and
:class:`CatalogHub` (a folder ``ratune catalog import`` wrote, named by its path). Each class owns
what differs between kinds: its files, loaders, precomputed documents, default test settings, which
test settings it has, its scorer's registry name, what manifests record and how reports and model
cards name it. Stages ask the hub; they never test its kind. :data:`HUB_KINDS` is the registry
(:func:`register_hub_kind` adds one); :func:`resolve_hub` turns ``--hub`` text into a hub.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Sequence

from ratune.catalog.folder import read_catalog_manifest
from ratune.catalog.pairs import PAIRS_MANIFEST, SPLIT_FILES, load_pairs, pairs_dir
from ratune.catalog.schema import APIS_FILE, load_catalog
from ratune.data.apibench import (HUBS, Answer, Example, ParseReport, api_database_path, examples_path,
                                  load_api_database, load_examples, questions_path, released_responses_path,
                                  resolve_apibench_dir)
from ratune.errors import RatuneError
from ratune.io import read_json_object, sha256_file
from ratune.registry import (CONSTRAINTS_PREFIX, DEFAULT_SETTINGS, RETRIEVERS,
                             TEST_SETTINGS, setting_retriever)

#: :attr:`Hub.kind` of an APIBench hub.
APIBENCH = "apibench"
#: :attr:`Hub.kind` of a catalog folder.
CATALOG = "catalog"
#: :attr:`~ratune.data.apibench.Example.layout` of a catalog example.
CATALOG_LAYOUT = "catalog"
#: The Hugging Face dataset id of APIBench (model cards' ``datasets``).
APIBENCH_DATASET_ID = "gorilla-llm/APIBench"


@dataclass(frozen=True)
class Hub(ABC):
    """One hub: its ``name`` (what examples, manifests, metrics and report folders call it) and
    the folder it is read from. Subclasses set the class attributes and implement the loaders."""

    name: str

    #: The kind's name in :data:`HUB_KINDS` and in records (``hub_kind``).
    kind: ClassVar[str]
    #: Whether the paper's precomputed documents (``gpt_index``, ``released_bm25``) exist for it.
    has_precomputed: ClassVar[bool] = False
    #: Whether the released Gorilla-7B responses (``ratune compare`` against them) exist for it.
    has_released_responses: ClassVar[bool] = False
    #: The key of its scorer in the eval stage's scorer registry (ratune/eval/hub_scoring.py).
    scorer: ClassVar[str]
    #: What ``--hub`` takes, for messages.
    choices_text: ClassVar[str]

    @classmethod
    @abstractmethod
    def claims(cls, text: str) -> bool:
        """Whether ``--hub`` text names a hub of this kind."""

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
        """A split's examples in file order (``lenient``/``report``: rows set aside instead of refused,
        where the kind allows it).

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
        """Refuse, before anything is computed, a split whose example file is missing (``purpose``:
        why it is needed, for the message).

        Raises:
            RatuneError: naming the file and how to make it.
        """
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


#: The kinds of hub, in the order ``--hub`` text is tried (:func:`register_hub_kind`).
HUB_KINDS: dict[str, type[Hub]] = {}


def register_hub_kind(cls: type[Hub]) -> type[Hub]:
    """Add a kind of hub to :data:`HUB_KINDS` (a class decorator); a kind registered later is
    tried after the earlier ones."""
    if cls.kind in HUB_KINDS and HUB_KINDS[cls.kind] is not cls:
        raise RatuneError(f"hub kind {cls.kind!r} is registered already")
    HUB_KINDS[cls.kind] = cls
    return cls


@register_hub_kind
@dataclass(frozen=True)
class APIBenchHub(Hub):
    """An APIBench hub (:data:`~ratune.data.apibench.HUBS`), read from the APIBench folder: the one
    given, else the one :func:`~ratune.data.apibench.resolve_apibench_dir` finds when first needed.
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


@register_hub_kind
@dataclass(frozen=True)
class CatalogHub(Hub):
    """A catalog folder (``ratune catalog import``, docs/catalogs.md), named by its path: documents
    ``apis.jsonl`` (:func:`~ratune.catalog.schema.load_catalog`), examples the split files
    ``pairs/{train,eval}.jsonl`` of ``ratune catalog pairs``, read back with
    :func:`~ratune.catalog.pairs.load_pairs` into :class:`~ratune.data.apibench.Example` records
    (``line`` the 1-based line of the split file; the answer's ``domain`` and ``api_provider`` the
    document's ``domain`` and ``provider``; layout ``"catalog"``)."""

    folder: Path = Path()

    kind: ClassVar[str] = CATALOG
    scorer: ClassVar[str] = CATALOG
    choices_text: ClassVar[str] = "a catalog folder (ratune catalog import)"
    card_tags: ClassVar[tuple[str, ...]] = ("api-catalog",)

    @classmethod
    def claims(cls, text: str) -> bool:
        return bool(text) and Path(text).is_dir()

    @classmethod
    def from_ref(cls, text: str, apibench_dir=None) -> "CatalogHub":
        path = Path(text)
        name = read_catalog_manifest(path)["name"]
        if name in HUBS:  # manifests, reports and finetuned retrievers name a hub by its name
            raise RatuneError(f"{path}: the catalog is named {name!r}, an APIBench hub's name; re-import it with "
                              "another --name")
        return cls(name=name, folder=path)

    @property
    def root(self) -> Path:
        return self.folder

    @property
    def ref(self) -> str:
        return str(self.folder)

    @property
    def api_database_file(self) -> Path:
        return self.folder / APIS_FILE

    def examples_file(self, split: str) -> Path:
        if split not in SPLIT_FILES:
            raise RatuneError(f"unknown split {split!r}: expected one of {', '.join(SPLIT_FILES)}")
        return pairs_dir(self.folder) / SPLIT_FILES[split]

    def load_api_database(self) -> list[dict]:
        return load_catalog(self.folder)

    def load_examples(self, split: str, *, lenient: bool = False, report: ParseReport | None = None) -> list[Example]:
        """The split file's pairs, checked against the catalog again (``lenient`` is not used: the
        split files were validated when written)."""
        path = self.examples_file(split)
        if not path.is_file():
            raise RatuneError(f"{path}: no {split} pairs for catalog {self.name}; split your instruction pairs "
                              f"first: ratune catalog pairs --catalog {self.folder} --pairs PAIRS.jsonl")
        self._check_pairs_current()
        documents = self.load_api_database()
        by_name = {doc["api_name"]: doc for doc in documents}
        examples = []
        for pair in load_pairs(path, documents):
            doc = by_name[pair.api_name]
            answer = Answer(domain=doc["domain"], api_call=pair.api_call, api_provider=doc["provider"],
                            explanation=pair.explanation or "", code=pair.code or "")
            examples.append(Example(hub=self.name, split=split, line=pair.line, instruction=pair.instruction,
                                    api=doc, answer=answer, layout=CATALOG_LAYOUT))
        return examples

    def _check_pairs_current(self) -> None:
        """Refuse pairs split against an earlier ``apis.jsonl`` (the catalog was re-imported since)."""
        path = pairs_dir(self.folder) / PAIRS_MANIFEST
        if not path.is_file():
            raise RatuneError(f"{path}: missing; rerun `ratune catalog pairs --catalog {self.folder} --pairs FILE`")
        recorded = (read_json_object(path).get("catalog") or {}).get("apis_sha256")
        if recorded != sha256_file(self.api_database_file):
            raise RatuneError(f"{self.api_database_file} changed since the pairs were split (re-imported?); rerun "
                              f"`ratune catalog pairs --catalog {self.folder} --pairs FILE`")

    def manifest_record(self) -> dict:
        """``kind``, ``path``, ``name``, the import's ``source``, the pairs' ``source`` (path, sha256),
        ``eval_fraction`` and ``seed``."""
        pairs_manifest = pairs_dir(self.folder) / PAIRS_MANIFEST
        pairs = read_json_object(pairs_manifest) if pairs_manifest.is_file() else {}
        return {"kind": CATALOG, "path": str(self.folder.resolve()), "name": self.name,
                "import_source": read_catalog_manifest(self.folder).get("source"),
                "pairs": {k: pairs.get(k) for k in ("source", "eval_fraction", "seed")}}

    @classmethod
    def card_trained_on(cls, name, record):
        return f"on the API catalog `{name}` (the user's own APIs, imported with `ratune catalog import`)"

    @classmethod
    def card_training_data(cls, name, record):
        source = (record or {}).get("import_source") or {}
        how = f" --from {source['kind']}" if source.get("kind") else ""
        what = (f" (source sha256 `{source['sha256']}`)" if source.get("sha256") else
                f" (module `{source['module']}`)" if source.get("module") else "")
        return [f"The API catalog `{name}`: the user's own APIs, imported with `ratune catalog import{how}`"
                f"{what}, with the user's instruction pairs split by `ratune catalog pairs` (no benchmark data).", ""]

    @classmethod
    def card_files_label(cls, name, record):
        return f"Catalog `{name}` files"

    @classmethod
    def card_measured(cls, name):
        return (f"Measured on the eval pairs of the API catalog `{name}` (scored with the catalog's own metric, "
                "docs/catalog_scoring.md; 95 % Wilson score intervals; n = questions per cell):")

    @classmethod
    def card_dataset(cls, name):
        return {"dataset_type": name, "dataset_name": f"API catalog {name}", "dataset_config": None}


#: The base class under its earlier name.
HubSource = Hub


def hub_choices_text() -> str:
    """The hubs a ``--hub`` accepts, for messages."""
    return ", or ".join(cls.choices_text for cls in HUB_KINDS.values())


def resolve_hub(hub: "str | os.PathLike | Hub", apibench_dir: str | os.PathLike | None = None, *,
                locate: bool = True) -> Hub:
    """The :class:`Hub` that ``--hub`` text names (a hub is returned as it is).

    Args:
        hub: a hub name or folder of a kind in :data:`HUB_KINDS`, or a hub.
        apibench_dir: the APIBench folder for an APIBench hub (None: found when needed).
        locate: check that the hub's folder exists now (False: when first read).
    Raises:
        RatuneError: no kind claims ``hub`` (the message lists what ``--hub`` takes), the kind's own
            refusal, or (``locate``) its folder is not found.
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
    """The name of a hub reference (what manifests, metrics, report folders and sweep data folders call it).

    Raises:
        RatuneError: as :func:`resolve_hub`.
    """
    return resolve_hub(hub, locate=False).name


def recorded_hub_kind(name: str | None, kind: str | None = None) -> type[Hub]:
    """The class of a hub that a manifest, metrics file or report names: its recorded ``kind``
    (``hub_kind``; a catalog record's ``kind``), else APIBench's for an APIBench name or none (the
    default hub), else a catalog's.

    Raises:
        RatuneError: a recorded kind that is not registered.
    """
    if kind is not None:
        if kind not in HUB_KINDS:
            raise RatuneError(f"hub kind {kind!r} is not one of {', '.join(HUB_KINDS)}")
        return HUB_KINDS[kind]
    if name is None or APIBenchHub.claims(name):  # no name: the default hub, torchhub
        return APIBenchHub
    return CatalogHub


def manifest_hub_record(manifest: dict) -> tuple[str | None, dict | None]:
    """``(kind, record)`` of the hub record a manifest holds under its kind's key
    (:meth:`Hub.manifest_record`, written as ``manifest[hub.kind]``); ``(None, None)`` when it holds
    none (an APIBench hub records only its name)."""
    return next(((kind, manifest[kind]) for kind in HUB_KINDS if isinstance(manifest.get(kind), dict)), (None, None))


def check_hub_ref(text: str) -> str:
    """Return ``text`` if :func:`resolve_hub` could resolve it (the APIBench folder itself is looked
    for later), else raise its RatuneError. The argparse type of ``--hub``."""
    resolve_hub(text, locate=False)
    return text


def hub_argument_type():
    """The argparse type of every ``--hub``: :func:`check_hub_ref` at the edge, keeping the text
    (:func:`ratune.args.checked`)."""
    from ratune.args import checked

    return checked(check_hub_ref, "hub", good="torchhub", bad=("no_such_hub", "folder"))


def as_hub_source(hub: "str | Hub", apibench_dir: str | os.PathLike | None = None) -> Hub:
    """``hub`` itself when it is a :class:`Hub`, else :func:`resolve_hub` of it, its folder looked for
    when first read (the stages' entry points; the commands look for it first)."""
    return resolve_hub(hub, apibench_dir, locate=False)
