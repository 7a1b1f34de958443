"""A catalog folder is a hub: ``ratune catalog pairs`` writes the
split, :func:`ratune.hubs.resolve_hub` reads it, and ``ratune data build`` and
``ratune retrieval eval`` run on it, on the real OpenAPI petstore (examples/catalogs/) with the
hand-written pairs examples/catalogs/petstore_pairs.jsonl; APIBench hubs resolve to exactly the
paths and records of :mod:`ratune.sources.apibench`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from ratune.catalog.folder import import_catalog
from ratune.catalog.pairs import load_pairs, write_pairs
from ratune.catalog.schema import load_catalog
from ratune.cli import main
from ratune.sources.apibench import (HUBS, Answer, api_database_path, examples_path, load_api_database, load_examples,
                                  questions_path)
from ratune.hubs import APIBENCH, CATALOG, CatalogHub, check_hub_ref, resolve_hub
from ratune.sources.prompt import REFERENCE_PHRASE, serialize_document
from ratune.errors import InputError, RatuneError

ROOT = Path(__file__).resolve().parent.parent
PETSTORE = ROOT / "examples" / "catalogs" / "openapi-spec-validator" / "petstore.yaml"
PAIRS = ROOT / "examples" / "catalogs" / "petstore_pairs.jsonl"
LIST, CREATE, SHOW = "petstore.list_pets", "petstore.create_pets", "petstore.show_pet_by_id"


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _import(folder: Path, name: str = "petstore") -> Path:
    import_catalog("openapi", PETSTORE, folder, name)
    return folder


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    """The petstore catalog with the pairs split at eval fraction 0.2, seed 0."""
    folder = _import(tmp_path_factory.mktemp("hub") / "petstore")
    write_pairs(folder, PAIRS, eval_fraction=0.2, seed=0)
    return folder


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ catalog pairs


def test_the_hand_written_pairs_cover_every_petstore_api_ten_times(catalog):
    documents = load_catalog(catalog)
    pairs = load_pairs(PAIRS, documents)
    assert len(pairs) == 30
    assert sorted(d["api_name"] for d in documents) == sorted([LIST, CREATE, SHOW])
    assert {name: sum(p.api_name == name for p in pairs) for name in (LIST, CREATE, SHOW)} == {
        LIST: 10, CREATE: 10, SHOW: 10}
    # no instruction names its API (neither the operation nor the client)
    for p in pairs:
        low = p.instruction.lower()
        assert "petstore" not in low and p.api_name.split(".")[1] not in low.replace(" ", "_")


def test_pairs_writes_the_split_and_its_manifest_and_leaves_the_catalog_manifest_alone(tmp_path, capsys):
    folder = _import(tmp_path / "petstore")
    catalog_manifest = (folder / "manifest.json").read_bytes()
    apis = (folder / "apis.jsonl").read_bytes()
    rc = main(["catalog", "pairs", "--catalog", str(folder), "--pairs", str(PAIRS), "--eval-fraction", "0.2",
               "--seed", "0"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[0] == ("pairs for catalog petstore: 30 read, 0 duplicates dropped; train 24, eval 6 "
                                   "(3 APIs, 3 in both splits)")
    assert (folder / "manifest.json").read_bytes() == catalog_manifest
    assert (folder / "apis.jsonl").read_bytes() == apis
    pairs_dir = folder / "pairs"
    manifest = json.loads((pairs_dir / "manifest.json").read_text())
    # 10 pairs per API: round_half_up(10 x 0.2) = 2 in eval, 8 in train
    assert manifest["counts"] == {"read": 30, "duplicates_dropped": 0, "leaked_train_dropped": 0, "train": 24,
                                  "eval": 6, "apis": {n: {"train": 8, "eval": 2} for n in sorted([LIST, CREATE, SHOW])}}
    assert manifest["command"] == manifest["kind"] == "catalog pairs"
    assert manifest["source"] == {"path": str(PAIRS), "sha256": _sha256(PAIRS)}
    assert manifest["catalog"] == {"name": "petstore", "apis_sha256": _sha256(folder / "apis.jsonl")}
    assert (manifest["eval_fraction"], manifest["seed"]) == (0.2, 0)
    assert manifest["leakage"] == {"policy": "error", "near_threshold": 0.9, "pairs": []}
    assert manifest["duplicates"] == {"policy": "error", "dropped": []}
    assert manifest["files"] == {"train.jsonl": _sha256(pairs_dir / "train.jsonl"),
                                 "eval.jsonl": _sha256(pairs_dir / "eval.jsonl")}
    assert "versions" in manifest and "git_commit" in manifest
    train, eval_ = _read_jsonl(pairs_dir / "train.jsonl"), _read_jsonl(pairs_dir / "eval.jsonl")
    assert set(train[0]) == {"instruction", "api_name", "api_call", "explanation", "code"}
    source = {p["instruction"]: p for p in _read_jsonl(PAIRS)}
    for row in train + eval_:  # every line is the user's pair, fields as given (code absent -> null)
        assert row == {**source[row["instruction"]], "code": None}
    assert len({r["instruction"] for r in train} | {r["instruction"] for r in eval_}) == 30
    # the split files load back as pairs against the catalog
    assert len(load_pairs(pairs_dir / "eval.jsonl", load_catalog(folder))) == 6
    # a second run with another seed replaces the split (the folder is ratune's own)
    assert main(["catalog", "pairs", "--catalog", str(folder), "--pairs", str(PAIRS), "--seed", "1"]) == 0
    assert json.loads((pairs_dir / "manifest.json").read_text())["seed"] == 1


def test_pairs_refuses_what_is_not_a_catalog_and_splits_without_eval(tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine\n")
    with pytest.raises(RatuneError, match=r"plain: not a catalog folder \(no manifest.json\); make one with "
                                          r"`ratune catalog import`"):
        write_pairs(plain, PAIRS)
    assert sorted(p.name for p in plain.iterdir()) == ["notes.txt"]
    folder = _import(tmp_path / "petstore")
    single = tmp_path / "single.jsonl"  # one pair per API: all go to train, nothing to evaluate
    single.write_text("".join(json.dumps(p) + "\n" for p in _read_jsonl(PAIRS)[::10]), encoding="utf-8")
    with pytest.raises(RatuneError, match="no eval pairs: every API has a single pair"):
        write_pairs(folder, single)
    assert not (folder / "pairs").exists()
    # a pairs folder someone else made is never written into
    (folder / "pairs").mkdir()
    (folder / "pairs" / "train.jsonl").write_text("theirs\n")
    rc = main(["catalog", "pairs", "--catalog", str(folder), "--pairs", str(PAIRS)])
    err = capsys.readouterr().err
    assert rc == 2 and "not a ratune catalog pairs output" in err
    assert (folder / "pairs" / "train.jsonl").read_text() == "theirs\n"


def test_pairs_leakage_is_refused_by_default_and_dropped_on_request(tmp_path):
    folder = _import(tmp_path / "petstore")
    rows = _read_jsonl(PAIRS)
    # two near-identical instructions for one API (Jaccard 1.0 after normalisation: case only)
    leaky = tmp_path / "leaky.jsonl"
    extra = {**rows[20], "instruction": rows[20]["instruction"].upper()}
    leaky.write_text("".join(json.dumps(r) + "\n" for r in rows + [extra]), encoding="utf-8")
    with pytest.raises(InputError, match="duplicate of line 21"):
        write_pairs(folder, leaky)  # the loader's duplicate check comes first
    manifest = write_pairs(folder, leaky, duplicates="drop")
    assert manifest["duplicates"]["dropped"] == [{"line": 31, "first_line": 21}]
    assert manifest["counts"]["read"] == 30 and manifest["counts"]["duplicates_dropped"] == 1


# ------------------------------------------------------------------------------ resolve_hub


def test_resolve_hub_apibench_is_todays_paths_and_loaders(apibench):
    for hub in HUBS:
        source = resolve_hub(hub, apibench)
        assert (source.name, source.kind, source.root, isinstance(source, CatalogHub)) == (hub, APIBENCH, Path(apibench), False)
        assert source.has_precomputed
        assert source.api_database_file == api_database_path(apibench, hub)
        assert source.examples_file("eval") == examples_path(apibench, hub, "eval")
        assert source.questions_file("gpt_index") == questions_path(apibench, hub, "gpt_index")
        assert source.input_files(["eval"]) == [api_database_path(apibench, hub), examples_path(apibench, hub, "eval")]
        assert source.manifest_record() is None
    source = resolve_hub("torchhub", apibench)
    assert source.load_examples("eval") == load_examples(apibench, "torchhub", "eval")
    assert source.load_api_database() == load_api_database(api_database_path(apibench, "torchhub"))


def test_resolve_hub_catalog_examples_are_the_pairs_with_the_gold_document(catalog):
    source = resolve_hub(str(catalog))
    assert (source.name, source.kind, source.root) == ("petstore", CATALOG, catalog)
    assert isinstance(source, CatalogHub) and not source.has_precomputed
    assert source.api_database_file == catalog / "apis.jsonl"
    assert source.examples_file("train") == catalog / "pairs" / "train.jsonl"
    assert source.load_api_database() == load_catalog(catalog)
    docs = {d["api_name"]: d for d in load_catalog(catalog)}
    eval_rows = _read_jsonl(catalog / "pairs" / "eval.jsonl")
    examples = source.load_examples("eval")
    assert [e.line for e in examples] == list(range(1, 7))
    assert [e.instruction for e in examples] == [r["instruction"] for r in eval_rows]
    first = next(e for e in examples if e.instruction == "Show me the first 5 animals available in the shop.")
    assert (first.hub, first.split, first.layout) == ("petstore", "eval", "catalog")
    assert first.api == docs[LIST]
    assert first.answer == Answer(domain="pets", api_call="petstore.list_pets(limit=5)",
                                  api_provider="Swagger Petstore",
                                  explanation="Lists the store's pets, at most 5 of them.", code="")
    assert len(source.load_examples("train")) == 24
    assert source.input_files(["train", "eval"]) == [catalog / "apis.jsonl", catalog / "pairs" / "train.jsonl",
                                                    catalog / "pairs" / "eval.jsonl"]
    record = source.manifest_record()
    assert record["name"] == "petstore" and record["kind"] == "catalog"
    assert record["pairs"] == {"source": {"path": str(PAIRS), "sha256": _sha256(PAIRS)}, "eval_fraction": 0.2,
                               "seed": 0}
    assert record["import_source"]["sha256"] == _sha256(PETSTORE)
    with pytest.raises(RatuneError, match="a catalog has no precomputed question files"):
        source.questions_file("gpt_index")


def test_resolve_hub_errors(tmp_path):
    listing = ("torchhub, huggingface, tensorflowhub, or a tool-set folder (ratune tools import), or a catalog folder "
               "(ratune catalog import)")
    with pytest.raises(RatuneError, match=r"unknown hub 'pytorch': expected one of " + listing.replace("(", r"\(")
                       .replace(")", r"\)") + r" \(pytorch: no such folder\)"):
        resolve_hub("pytorch")
    with pytest.raises(RatuneError, match="unknown hub 'pytorch'"):
        check_hub_ref("pytorch")
    assert check_hub_ref("torchhub") == "torchhub"
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(RatuneError, match=r"plain: not a catalog folder \(no manifest.json\)"):
        resolve_hub(str(plain))
    (plain / "manifest.json").write_text(json.dumps({"command": "data build", "hub": "torchhub"}))
    with pytest.raises(RatuneError, match=r"not a catalog manifest \(kind None, expected 'catalog'\)"):
        resolve_hub(str(plain))
    # a catalog may not pass for an APIBench hub
    _import(tmp_path / "named", name="torchhub")
    with pytest.raises(RatuneError, match="the catalog is named 'torchhub', an APIBench hub's name; re-import it "
                                          "with another --name"):
        resolve_hub(str(tmp_path / "named"))
    # a catalog without pairs: the examples tell the user what to run
    folder = _import(tmp_path / "petstore")
    source = resolve_hub(str(folder))
    with pytest.raises(RatuneError, match=r"no eval pairs for catalog petstore; split your instruction pairs first: "
                                          r"ratune catalog pairs --catalog .*petstore --pairs PAIRS.jsonl"):
        source.load_examples("eval")
    # pairs split against an earlier import are refused once apis.jsonl changes
    write_pairs(folder, PAIRS)
    assert len(source.load_examples("eval")) == 6
    _import(folder, name="pets")  # re-import: api names pets.*, so the pairs no longer fit
    with pytest.raises(RatuneError, match=r"apis.jsonl changed since the pairs were split"):
        resolve_hub(str(folder)).load_examples("train")


# ------------------------------------------------------------------------------ data build


@pytest.fixture(scope="module")
def built(catalog, tmp_path_factory, smol_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset

    out = tmp_path_factory.mktemp("catalog_data") / "data"
    manifest = build_dataset(apibench_dir=None, hub=str(catalog), out_dir=out, tokenizer=smol_tokenizer,
                             tokenizer_name="smol", modes=["none", "oracle", "bm25", "dense"], progress=False,
                             settings=BuildSettings(max_length=512))
    return out, manifest


def _rows(out: Path, mode: str) -> dict:
    from datasets import load_from_disk

    dd = load_from_disk(str(out / mode))
    return {split: list(dd[split]) for split in dd}


def test_data_build_on_a_catalog_rows_and_manifest(built, catalog):
    out, manifest = built
    docs = {d["api_name"]: d for d in load_catalog(catalog)}
    assert manifest["hub"] == "petstore"
    assert manifest["splits"] == {"train": 24, "eval": 6}
    assert manifest["modes"] == ["none", "oracle", "bm25", "dense"]
    for mode in manifest["modes"]:
        for split, n in (("train", 24), ("eval", 6)):
            assert manifest["counts"][split][mode]["rows"] == n and manifest["counts"][split][mode]["dropped"] == 0
    assert manifest["inputs"] == {"apis.jsonl": _sha256(catalog / "apis.jsonl"),
                                  "train.jsonl": _sha256(catalog / "pairs" / "train.jsonl"),
                                  "eval.jsonl": _sha256(catalog / "pairs" / "eval.jsonl")}
    assert manifest["catalog"]["pairs"]["source"]["sha256"] == _sha256(PAIRS)
    assert manifest["catalog"]["path"] == str(catalog.resolve())
    assert manifest["validation"]["leakage"]["pairs"] == 0
    assert manifest["retrievers"]["bm25"]["hub"] == "petstore" and manifest["retrievers"]["bm25"]["corpus_size"] == 3
    assert manifest["retrievers"]["dense"]["corpus_size"] == 3
    assert (out / ".complete").exists()

    none, oracle = _rows(out, "none"), _rows(out, "oracle")
    row = next(r for r in oracle["eval"] if r["instruction"] == "Show me the first 5 animals available in the shop.")
    assert row["hub"] == "petstore" and row["train_retriever"] == "oracle"
    assert row["user_turn"] == f"{row['instruction']}\n{REFERENCE_PHRASE}{serialize_document(docs[LIST])}"
    assert row["document_api_calls"] == ["petstore.list_pets()"] and row["gold_api_call"] == "petstore.list_pets()"
    assert row["completion"] == ("<<<domain>>>: pets\n<<<api_call>>>: petstore.list_pets(limit=5)\n"
                                 "<<<api_provider>>>: Swagger Petstore\n"
                                 "<<<explanation>>>: Lists the store's pets, at most 5 of them.\n<<<code>>>: ")
    plain = next(r for r in none["eval"] if r["line"] == row["line"])
    assert plain["user_turn"] == row["instruction"] and plain["document_api_calls"] == []
    assert REFERENCE_PHRASE not in plain["user_turn"] and "petstore.list_pets()" not in plain["user_turn"]
    assert plain["completion"] == row["completion"]
    # every oracle row holds its own gold document, never another API's
    for split in ("train", "eval"):
        for r in oracle[split]:
            assert len(r["document_api_calls"]) == 1 and r["document_api_calls"][0] == r["gold_api_call"]
    # bm25 and dense rows carry one retrieved catalog document each
    calls = {d["api_call"] for d in docs.values()}
    for mode in ("bm25", "dense"):
        for r in _rows(out, mode)["eval"]:
            assert len(r["document_api_calls"]) == 1 and r["document_api_calls"][0] in calls


# ------------------------------------------------------------------------------ retrieval eval


def _okapi_scores(query: str, texts: list[str]) -> list[float]:
    """rank-bm25's BM25Okapi (k1 1.5, b 0.75, idf floor 0.25 x mean idf), written out here."""
    import re

    docs = [re.findall(r"\w+", t.lower()) for t in texts]
    n, avgdl = len(docs), sum(len(d) for d in docs) / len(docs)
    df: dict[str, int] = {}
    for d in docs:
        for term in dict.fromkeys(d):
            df[term] = df.get(term, 0) + 1
    idf = {t: math.log(n - f + 0.5) - math.log(f + 0.5) for t, f in df.items()}
    floor = 0.25 * sum(idf.values()) / len(idf)
    idf = {t: (v if v >= 0 else floor) for t, v in idf.items()}
    out = []
    for d in docs:
        score = 0.0
        for term in re.findall(r"\w+", query.lower()):
            tf = d.count(term)
            score += idf.get(term, 0.0) * tf * 2.5 / (tf + 1.5 * (0.25 + 0.75 * len(d) / avgdl))
        out.append(score)
    return out


def test_retrieval_eval_on_a_catalog(catalog, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["retrieval", "eval", "--hub", str(catalog), "--retriever", "oracle", "--json"]) == 0
    oracle = json.loads(capsys.readouterr().out)
    assert (oracle["retriever"], oracle["n"], oracle["top1"], oracle["recall@10"], oracle["ndcg@10"]) == (
        "oracle", 6, 1.0, 1.0, 1.0)

    assert main(["retrieval", "eval", "--hub", str(catalog), "--retriever", "bm25", "--json", "--out", str(out)]) == 0
    bm25 = json.loads(capsys.readouterr().out)
    assert bm25["n"] == 6 and bm25["metadata"]["hub"] == "petstore"
    # by hand: the BM25 ranking of every eval query over the three documents' JSON
    docs = load_catalog(catalog)
    texts = [serialize_document(d) for d in docs]
    examples = resolve_hub(str(catalog)).load_examples("eval")
    ranks = []
    for ex in examples:
        scores = _okapi_scores(ex.instruction, texts)
        order = sorted(range(3), key=lambda i: (-round(scores[i], 9), i))
        ranks.append([docs[i]["api_name"] for i in order].index(ex.api["api_name"]) + 1)
    # eval file order: list_pets x2, create_pets x2, show_pet_by_id x2 (the input's order)
    assert [ex.api["api_name"] for ex in examples] == [LIST, LIST, CREATE, CREATE, SHOW, SHOW]
    assert ranks == [2, 2, 3, 2, 1, 2]
    assert bm25["top1"] == pytest.approx(1 / 6)
    assert bm25["recall@3"] == 1.0  # three APIs: the gold one is always in the top 3
    assert bm25["recall@1"] == pytest.approx(1 / 6)
    assert bm25["ndcg@3"] == pytest.approx((4 / math.log2(3) + 1 / math.log2(4) + 1) / 6)  # 0.6706
    # one query worked through: "Look up the details of pet 42." Of its words only 'pet', 'the' and
    # 'of' are in the documents. 'pet' is in two of the three (create_pets: "Create a pet";
    # show_pet_by_id: "Info for a specific pet"), so its Okapi idf log(1.5 / 2.5) is negative and
    # replaced by the floor 0.25 x mean idf, itself negative here (most JSON keys are in all three
    # documents); 'the' (twice) and 'of' are only in show_pet_by_id ("The id of the pet to
    # retrieve"), idf log(2.5 / 1.5) > 0. So show_pet_by_id > 0, list_pets = 0 (no shared word),
    # create_pets < 0: the gold API is first.
    look = [ex.instruction for ex in examples].index("Look up the details of pet 42.")
    scores = _okapi_scores(examples[look].instruction, texts)
    names = [d["api_name"] for d in docs]
    assert scores[names.index(SHOW)] > 0 == scores[names.index(LIST)] > scores[names.index(CREATE)]
    written = json.loads((out / "retrieval_petstore.json").read_text())
    assert written["results"][0]["top1"] == bm25["top1"]
    assert written["inputs"] == {"apis.jsonl": _sha256(catalog / "apis.jsonl"),
                                 "eval.jsonl": _sha256(catalog / "pairs" / "eval.jsonl")}
    assert (out / "retrieval_petstore.md").read_text().startswith("Retrieval on the petstore eval set")

    # --retriever all: every ranking retriever that needs no finetuned model, no precomputed one
    assert main(["retrieval", "eval", "--hub", str(catalog), "--json"]) == 0
    everything = json.loads(capsys.readouterr().out)
    names = [r["retriever"] for r in everything["results"]]
    assert names == ["oracle", "bm25", "bm25_replica", "dense", "hybrid"]
    dense = everything["results"][names.index("dense")]
    assert dense["n"] == 6 and dense["recall@3"] == 1.0 and everything["agreement"] == []
    assert 0.0 <= dense["top1"] <= 1.0 and dense["top1"] * 6 == round(dense["top1"] * 6)


def test_precomputed_retrievers_are_apibench_only(catalog, capsys):
    from ratune.retrieval.retrievers import make_retriever

    for name, setting in (("gpt_index", "gpt_index"), ("released_bm25", "bm25")):
        with pytest.raises(RatuneError, match=rf"the {name} retriever is APIBench only: it replays the paper's "
                                              rf"released documents \(questions_{{hub}}_{setting}.jsonl\), and "
                                              r"catalog petstore has none"):
            make_retriever(name, hub=resolve_hub(str(catalog)))
    rc = main(["retrieval", "eval", "--hub", str(catalog), "--retriever", "gpt_index"])
    err = capsys.readouterr().err
    assert rc == 2 and "the gpt_index retriever is APIBench only" in err and err.count("\n") == 1


def test_retrieval_train_on_a_catalog_serves_that_catalog_only(catalog, tmp_path, capsys, apibench):
    from ratune.retrieval.retrievers import make_retriever

    ft = tmp_path / "ft"
    assert main(["retrieval", "train", "--hub", str(catalog), "--out", str(ft), "--epochs", "1", "--batch-size", "4",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["hub"], summary["n_pairs"], summary["epochs"]) == ("petstore", 24, 1)
    meta = json.loads((ft / "ratune_retriever.json").read_text())
    assert meta["hub"] == "petstore" and meta["n_apis"] == 3
    assert meta["train_sha256"] == _sha256(catalog / "pairs" / "train.jsonl")
    assert meta["eval_sha256"] == _sha256(catalog / "pairs" / "eval.jsonl")
    assert meta["api_database_sha256"] == _sha256(catalog / "apis.jsonl")
    assert meta["leakage_check"]["n_eval"] == 6 and meta["leakage_check"]["pairs"] == 0
    assert main(["retrieval", "eval", "--hub", str(catalog), "--retriever", "dense_ft", "--dense-model", str(ft),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["retriever"] == "dense_ft" and result["n"] == 6 and result["metadata"]["hub"] == "petstore"
    with pytest.raises(RatuneError, match="this retriever was finetuned for hub 'petstore', not 'torchhub'"):
        make_retriever("dense_ft", hub="torchhub", apibench_dir=apibench, dense_model=ft)


def test_cli_hub_flags_take_a_catalog_folder_and_refuse_other_folders(catalog, tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    for argv in (["data", "build", "--hub", str(plain), "--out", str(tmp_path / "o")],
                 ["retrieval", "eval", "--hub", str(plain)],
                 ["retrieval", "index", "--hub", str(plain), "--out", str(tmp_path / "i")]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "not a catalog folder (no manifest.json)" in err, (argv, err)
    rc = main(["retrieval", "index", "--hub", str(catalog), "--retriever", "bm25", "--out", str(tmp_path / "idx")])
    assert rc == 0 and "indexed 3 petstore API documents" in capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / "ratune_bm25_index.json").read_text())
    assert meta["hub"] == "petstore" and meta["n_documents"] == 3
    # the saved index serves the catalog it was built for
    assert main(["retrieval", "eval", "--hub", str(catalog), "--retriever", "bm25", "--bm25-index",
                 str(tmp_path / "idx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 6
