"""A catalog folder (``ratune catalog import``, docs/catalogs.md) as a kind of hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ratune.catalog.folder import read_catalog_manifest
from ratune.catalog.pairs import PAIRS_MANIFEST, SPLIT_FILES, load_pairs, pairs_dir
from ratune.catalog.schema import APIS_FILE, load_catalog
from ratune.errors import RatuneError
from ratune.hubs.base import FolderHub, register_hub_kind
from ratune.io import read_json_object, sha256_file
from ratune.sources.apibench import HUBS, Answer, Example, ParseReport

#: :attr:`~ratune.hubs.base.Hub.kind` of a catalog folder.
CATALOG = "catalog"
#: :attr:`~ratune.sources.apibench.Example.layout` of a catalog example.
CATALOG_LAYOUT = "catalog"


@register_hub_kind
@dataclass(frozen=True)
class CatalogHub(FolderHub):
    """A catalog folder (docs/catalogs.md), named by its path: documents ``apis.jsonl``, examples
    the ``pairs/{train,eval}.jsonl`` of ``ratune catalog pairs`` (the answer's ``domain`` and
    ``api_provider`` the document's ``domain`` and ``provider``)."""

    kind: ClassVar[str] = CATALOG
    scorer: ClassVar[str] = CATALOG
    choices_text: ClassVar[str] = "a catalog folder (ratune catalog import)"
    card_tags: ClassVar[tuple[str, ...]] = ("api-catalog",)

    @classmethod
    def claims(cls, text: str) -> bool:
        return bool(text) and Path(text).is_dir()

    @classmethod
    def claims_name(cls, name):
        return name is not None  # records made before hub kinds were recorded: any other name

    @classmethod
    def from_ref(cls, text: str, apibench_dir=None) -> "CatalogHub":
        path = Path(text)
        name = read_catalog_manifest(path)["name"]
        if name in HUBS:  # manifests, reports and finetuned retrievers name a hub by its name
            raise RatuneError(f"{path}: the catalog is named {name!r}, an APIBench hub's name; re-import it with "
                              "another --name")
        return cls(name=name, folder=path)

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
