"""Hub sources: what every stage reads from a hub, for APIBench hubs and for API catalogs.

A *hub* is where a stage gets its API documents (the retrieval corpus and the gold documents) and
its examples (instructions with gold answers, per split). Two kinds exist:

* an **APIBench hub** (:data:`ratune.data.apibench.HUBS`: ``torchhub``, ``huggingface``,
  ``tensorflowhub``), read from the APIBench folder exactly as :mod:`ratune.data.apibench` does:
  ``api/{hub}_api.jsonl`` and ``apibench/{prefix}_{split}.json``. Only these have the paper's
  precomputed documents (``questions/questions_{hub}_{setting}.jsonl``, which the ``gpt_index``
  and ``released_bm25`` retrievers replay);
* a **catalog folder** (``ratune catalog import``, docs/catalogs.md), named by its path. Its
  documents are ``apis.jsonl`` (:func:`ratune.catalog.schema.load_catalog`; each has the
  ``domain`` and ``api_call`` that :data:`~ratune.data.apibench.REQUIRED_DOC_FIELDS` asks for), its
  examples the split files ``pairs/train.jsonl`` and ``pairs/eval.jsonl`` that
  ``ratune catalog pairs`` writes (:mod:`ratune.catalog.pairs`), read back with
  :func:`~ratune.catalog.pairs.load_pairs` (so each is checked against the catalog again) and made
  into :class:`~ratune.data.apibench.Example` records: ``hub`` the catalog name, ``line`` the
  1-based line in the split file, ``api`` the gold document, the answer's ``domain`` and
  ``api_provider`` the document's ``domain`` and ``provider``, its ``api_call`` the pair's, its
  ``explanation`` and ``code`` the pair's (empty when it gave none), layout ``"catalog"``.

A name in :data:`~ratune.data.apibench.HUBS` is always the APIBench hub; write a catalog folder of
that name as a path (``./torchhub``). :func:`resolve_hub` turns the text a user gives (``--hub``)
into a :class:`HubSource`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ratune.catalog.folder import read_catalog_manifest
from ratune.catalog.pairs import PAIRS_MANIFEST, SPLIT_FILES, load_pairs, pairs_dir
from ratune.catalog.schema import APIS_FILE, load_catalog
from ratune.data.apibench import (HUBS, Answer, Example, ParseReport, api_database_path, examples_path,
                                  load_api_database, load_examples, questions_path, resolve_apibench_dir)
from ratune.errors import RatuneError
from ratune.io import read_json_object, sha256_file

#: :attr:`HubSource.kind` of an APIBench hub.
APIBENCH = "apibench"
#: :attr:`HubSource.kind` of a catalog folder.
CATALOG = "catalog"
#: :attr:`~ratune.data.apibench.Example.layout` of a catalog example.
CATALOG_LAYOUT = "catalog"


@dataclass(frozen=True)
class HubSource:
    """One hub's inputs (see the module docstring).

    Attributes:
        name: the hub's name: the APIBench hub, or the catalog's ``name`` (its manifest); examples
            carry it as ``hub``, manifests and retriever metadata record it.
        kind: :data:`APIBENCH` or :data:`CATALOG`.
        root: the APIBench folder, or the catalog folder.
    """

    name: str
    kind: str
    root: Path

    @property
    def is_catalog(self) -> bool:
        """Whether this hub is a catalog folder."""
        return self.kind == CATALOG

    @property
    def has_precomputed(self) -> bool:
        """Whether the paper's precomputed documents (the released question files that
        ``gpt_index`` and ``released_bm25`` replay) can exist for this hub: APIBench hubs only."""
        return self.kind == APIBENCH

    @property
    def api_database_file(self) -> Path:
        """The file of the API documents: ``api/{hub}_api.jsonl`` or ``CATALOG/apis.jsonl``."""
        if self.is_catalog:
            return self.root / APIS_FILE
        return api_database_path(self.root, self.name)

    def examples_file(self, split: str) -> Path:
        """The example file of a split (``train`` or ``eval``); it may not exist."""
        if self.is_catalog:
            if split not in SPLIT_FILES:
                raise RatuneError(f"unknown split {split!r}: expected one of {', '.join(SPLIT_FILES)}")
            return pairs_dir(self.root) / SPLIT_FILES[split]
        return examples_path(self.root, self.name, split)

    def questions_file(self, setting: str) -> Path:
        """The paper's question file of a test setting (APIBench hubs only).

        Raises:
            RatuneError: for a catalog, which has no released question files.
        """
        if not self.has_precomputed:
            raise RatuneError(f"{self.root}: a catalog has no precomputed question files "
                              f"(questions_*_{setting}.jsonl are APIBench only)")
        return questions_path(self.root, self.name, setting)

    def load_api_database(self) -> list[dict]:
        """The API documents in file order (APIBench: :func:`~ratune.data.apibench.load_api_database`;
        a catalog: :func:`~ratune.catalog.schema.load_catalog`).

        Raises:
            RatuneError, InputError: as those functions (missing file, a bad line named by file,
                line and field).
        """
        if self.is_catalog:
            return load_catalog(self.root)
        return load_api_database(self.api_database_file)

    def load_examples(self, split: str, *, lenient: bool = False, report: ParseReport | None = None
                      ) -> list[Example]:
        """A split's examples in file order.

        Args:
            split: ``train`` or ``eval``.
            lenient, report: APIBench only (:func:`~ratune.data.apibench.load_examples`); a
                catalog's split files were validated when written and are read strictly.
        Raises:
            RatuneError: the split's file does not exist (for a catalog: run ``ratune catalog
                pairs``), or the catalog's ``apis.jsonl`` changed since the pairs were split.
            InputError: a bad row (file, line, field).
        """
        if not self.is_catalog:
            return load_examples(self.root, self.name, split, lenient=lenient, report=report)

        path = self.examples_file(split)
        if not path.is_file():
            raise RatuneError(f"{path}: no {split} pairs for catalog {self.name}; split your instruction pairs "
                              f"first: ratune catalog pairs --catalog {self.root} --pairs PAIRS.jsonl")
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
        path = pairs_dir(self.root) / PAIRS_MANIFEST
        if not path.is_file():
            raise RatuneError(f"{path}: missing; rerun `ratune catalog pairs --catalog {self.root} --pairs FILE`")
        recorded = (read_json_object(path).get("catalog") or {}).get("apis_sha256")
        if recorded != sha256_file(self.api_database_file):
            raise RatuneError(f"{self.api_database_file} changed since the pairs were split (re-imported?); rerun "
                              f"`ratune catalog pairs --catalog {self.root} --pairs FILE`")

    def input_files(self, splits: Sequence[str]) -> list[Path]:
        """The files whose sha256 manifests record (by file name,
        :func:`~ratune.data.apibench.input_hashes`): the API documents, then each split's example
        file. For a catalog the user's own pairs file and its hash are in :meth:`manifest_record`."""
        return [self.api_database_file] + [self.examples_file(s) for s in splits]

    def manifest_record(self) -> dict | None:
        """What a manifest records about a catalog hub beyond the file hashes (None for APIBench,
        whose manifests stay as they were): ``kind``, ``path``, ``name``, the import's ``source``,
        the pairs' ``source`` (path, sha256), ``eval_fraction`` and ``seed``."""
        if not self.is_catalog:
            return None

        pairs_manifest = pairs_dir(self.root) / PAIRS_MANIFEST
        pairs = read_json_object(pairs_manifest) if pairs_manifest.is_file() else {}
        return {"kind": CATALOG, "path": str(self.root.resolve()), "name": self.name,
                "import_source": read_catalog_manifest(self.root).get("source"),
                "pairs": {k: pairs.get(k) for k in ("source", "eval_fraction", "seed")}}


def hub_choices_text() -> str:
    """The hubs a ``--hub`` accepts, for messages."""
    return f"{', '.join(HUBS)}, or a catalog folder (ratune catalog import)"


def resolve_hub(hub: str | os.PathLike, apibench_dir: str | os.PathLike | None = None) -> HubSource:
    """The :class:`HubSource` of ``hub``: an APIBench hub name or a catalog folder path.

    Args:
        hub: one of :data:`~ratune.data.apibench.HUBS`, or the path of a catalog folder.
        apibench_dir: the APIBench folder, for an APIBench hub (None:
            :func:`~ratune.data.apibench.resolve_apibench_dir` finds it); unused for a catalog.
    Raises:
        RatuneError: ``hub`` is neither (the message lists the APIBench hubs and "or a catalog
            folder"); a folder whose manifest is not a catalog import's
            (:func:`ratune.catalog.folder.read_catalog_manifest`); a catalog named like an APIBench
            hub (its retrievers and reports would pass for that hub's); for an APIBench hub without
            ``apibench_dir``, no APIBench folder found.
    """
    text = str(hub)
    if text in HUBS:
        root = Path(apibench_dir) if apibench_dir is not None else resolve_apibench_dir(None)
        return HubSource(name=text, kind=APIBENCH, root=root)
    path = Path(text)
    if text and path.is_dir():
        name = read_catalog_manifest(path)["name"]
        if name in HUBS:  # manifests, reports and finetuned retrievers name a hub by its name
            raise RatuneError(f"{path}: the catalog is named {name!r}, an APIBench hub's name; re-import it with "
                              "another --name")
        return HubSource(name=name, kind=CATALOG, root=path)
    raise RatuneError(f"unknown hub {text!r}: expected one of {hub_choices_text()}"
                      + (f" ({text}: no such folder)" if text and not path.exists() else ""))


def hub_name(hub: str | os.PathLike) -> str:
    """The name of a hub reference: an APIBench hub's own, a catalog folder's manifest ``name``
    (what manifests, metrics, report folders and sweep data folders call it).

    Raises:
        RatuneError: as :func:`resolve_hub` for a folder that is not a catalog.
    """
    text = str(hub)
    if text in HUBS:
        return text
    return resolve_hub(text).name


def check_hub_ref(text: str) -> str:
    """Return ``text`` if :func:`resolve_hub` could resolve it (an APIBench hub name, or a catalog
    folder; the APIBench folder itself is looked for later), else raise its RatuneError. The
    argparse type of ``--hub``."""
    if text not in HUBS:
        resolve_hub(text)
    return text


def hub_argument_type():
    """The argparse type of every ``--hub`` that takes an APIBench hub or a catalog folder:
    :func:`check_hub_ref` at the edge, keeping the text (:func:`ratune.args.checked`)."""
    from ratune.args import checked

    return checked(check_hub_ref, "hub", good="torchhub", bad=("no_such_hub", "folder"))


def as_hub_source(hub: "str | HubSource", apibench_dir: str | os.PathLike | None = None) -> HubSource:
    """``hub`` itself when it is a :class:`HubSource`, else :func:`resolve_hub` of it (callers
    that take a hub name or a source)."""
    return hub if isinstance(hub, HubSource) else resolve_hub(hub, apibench_dir)
