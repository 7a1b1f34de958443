"""A third kind of hub, defined here and registered in ratune.hubs.base.HUB_KINDS only, goes
through `ratune data build`, `ratune eval run` (tiny model, 2 questions), `ratune report` and
`ratune compare` with no edit anywhere else: stages ask the hub, never its kind.

The toy hub ("toy:FOLDER") keeps three petstore APIs in apis.jsonl (catalog schema, so it names
the catalog scorer) and its examples in its own format, {"q", "api", "call"} per line in
train.jsonl and eval.jsonl."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from ratune.cli import main
from ratune.sources.apibench import Answer, Example
from ratune.hubs import HUB_KINDS, Hub, register_hub_kind, resolve_hub
from ratune.io import iter_jsonl

ROOT = Path(__file__).resolve().parent.parent
PETSTORE = ROOT / "examples" / "catalogs" / "openapi-spec-validator" / "petstore.yaml"

TRAIN = [("List five pets.", "petstore.list_pets", "petstore.list_pets(limit=5)"),
         ("Show pet 7.", "petstore.show_pet_by_id", "petstore.show_pet_by_id(petId='7')")]
EVAL = [("Show me pet 42.", "petstore.show_pet_by_id", "petstore.show_pet_by_id(petId='42')"),
        ("List twenty pets.", "petstore.list_pets", "petstore.list_pets(limit=20)")]


@dataclass(frozen=True)
class ToyHub(Hub):
    """A hub kind of this test's own (module docstring)."""

    folder: Path = Path()

    kind: ClassVar[str] = "toy"
    scorer: ClassVar[str] = "catalog"
    choices_text: ClassVar[str] = "toy:FOLDER"

    @classmethod
    def claims(cls, text):
        return text.startswith("toy:")

    @classmethod
    def from_ref(cls, text, apibench_dir=None):
        folder = Path(text.removeprefix("toy:"))
        return cls(name="toy" + folder.name, folder=folder)

    @property
    def root(self):
        return self.folder

    @property
    def ref(self):
        return f"toy:{self.folder}"

    @property
    def api_database_file(self):
        return self.folder / "apis.jsonl"

    def examples_file(self, split):
        return self.folder / f"{split}.jsonl"

    def load_api_database(self):
        return [row for _, row in iter_jsonl(self.api_database_file)]

    def load_examples(self, split, *, lenient=False, report=None):
        docs = {d["api_name"]: d for d in self.load_api_database()}
        return [Example(hub=self.name, split=split, line=n, instruction=row["q"], api=docs[row["api"]],
                        answer=Answer(domain=docs[row["api"]]["domain"], api_call=row["call"],
                                      api_provider=docs[row["api"]]["provider"], explanation="", code=""),
                        layout="toy")
                for n, row in iter_jsonl(self.examples_file(split))]

    def manifest_record(self):
        return {"kind": self.kind, "path": str(self.folder.resolve()), "name": self.name}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    from ratune.catalog.folder import import_catalog

    monkeypatch.setattr("ratune.hubs.base.HUB_KINDS", dict(HUB_KINDS))  # registered for this test only
    register_hub_kind(ToyHub)
    import_catalog("openapi", PETSTORE, tmp_path / "petstore", "petstore")
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "apis.jsonl").write_text((tmp_path / "petstore" / "apis.jsonl").read_text())
    for split, rows in (("train", TRAIN), ("eval", EVAL)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"q": q, "api": a, "call": c}) + "\n"
                                                       for q, a, c in rows))
    return f"toy:{folder}"


def test_a_third_kind_of_hub_builds_evaluates_reports_and_compares(toy, tmp_path, smol_tokenizer_dir, tiny_model_dir,
                                                                      capsys):
    hub = resolve_hub(toy)
    assert (type(hub), hub.name, hub.default_settings) == (ToyHub, "toyshop", ("0_shot", "bm25", "dense", "oracle"))
    assert "replays the paper's precomputed documents" in hub.setting_refusal("gpt_index")

    data = tmp_path / "data"
    assert main(["data", "build", "--hub", toy, "--out", str(data), "--tokenizer", str(smol_tokenizer_dir),
                 "--modes", "none", "oracle"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert (manifest["hub"], manifest["toy"]["name"], manifest["splits"]) == ("toyshop", "toyshop",
                                                                               {"train": 2, "eval": 2})
    from datasets import load_from_disk

    train = list(load_from_disk(str(data / "oracle"))["train"])
    # the oracle row's user turn carries the gold document; the answer is the toy example's call
    assert [(r["hub"], r["instruction"]) for r in train] == [("toyshop", q) for q, _, _ in TRAIN]
    assert train[0]["user_turn"].startswith('List five pets.\nUse this API documentation for reference: '
                                            '{"api_name": "petstore.list_pets"')
    assert train[0]["completion"].startswith("<<<domain>>>: pets\n<<<api_call>>>: petstore.list_pets(limit=5)\n")

    capsys.readouterr()
    ev = tmp_path / "eval"
    assert main(["eval", "run", "--hub", toy, "--checkpoint", str(tiny_model_dir), "--out", str(ev),
                 "--settings", "0_shot", "oracle", "--n-questions", "2", "--max-new-tokens", "4",
                 "--device", "cpu", "--threads", "1"]) == 0
    for setting in ("0_shot", "oracle"):
        metrics = json.loads((ev / setting / "metrics.json").read_text())
        # the catalog scorer's cell: strict metric on top, argument score, no gorilla block, the toy kind
        assert (metrics["hub"], metrics["n"], metrics["metric"], metrics["hub_kind"]) == ("toyshop", 2, "strict", "toy")
        assert "gorilla" not in metrics and metrics["accuracy"] == metrics["strict"]["accuracy"]
        assert metrics["catalog"] == hub.manifest_record()

    report = tmp_path / "report"
    assert main(["report", "--eval", f"none={ev}", "--model", "tiny", "--out", str(report)]) == 0
    table = json.loads((report / "table2.json").read_text())
    assert table["hub"] == "toyshop" and {c["test_retriever"] for c in table["cells"]} == {"0_shot", "oracle"}

    capsys.readouterr()
    assert main(["compare", str(ev / "0_shot"), str(ev / "oracle"), "--hub", toy, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["hub"], result["metric"], result["n"]) == ("toyshop", "strict", 2)
