"""The name registry (ratune/registry.py): every stage derives its names from it, an
unknown name is refused with the known ones everywhere a name is read, and the released_bm25 test
setting replays the paper's BM25 documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from source_tree import source_files

from ratune import registry
from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent
SOURCES = source_files()


def _help(argv: list[str], capsys) -> str:
    from ratune.cli import main

    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_derived_name_lists_follow_the_specs():
    """Each derived list is its rule applied to the spec tables, in spec order; the names users rely
    on stay in them."""
    retrievers, settings = registry.RETRIEVER_SPECS, registry.TEST_SETTING_SPECS

    def in_order(names, table):  # a sub-list of the table's names, in the table's order
        return list(names) == [n for n in table if n in names] and len(set(names)) == len(names)

    # train-time modes: every retriever but the replayed released documents
    assert in_order(registry.TRAIN_MODES, registry.RETRIEVERS)
    assert set(registry.TRAIN_MODES) == {r.name for r in retrievers if r.kind != "precomputed"}
    assert {"none", "oracle"} <= set(registry.TRAIN_MODES) and set(registry.DEFAULT_MODES) <= set(registry.TRAIN_MODES)
    # retrieved modes: the train-time modes that rank the database (not none or oracle)
    assert in_order(registry.RETRIEVED_MODES, registry.TRAIN_MODES)
    assert set(registry.RETRIEVED_MODES) == {r.name for r in retrievers if r.kind in ("bm25", "dense", "fusion")}
    assert not {"none", "oracle"} & set(registry.RETRIEVED_MODES)
    # BM25 retrievers: exactly the variants retrieval/bm25.py implements
    from ratune.retrieval.bm25 import BM25_VARIANTS

    assert in_order(registry.BM25_RETRIEVERS, registry.RETRIEVERS)
    assert set(registry.BM25_RETRIEVERS) == set(BM25_VARIANTS) == {r.name for r in retrievers if r.kind == "bm25"}
    # test-time settings: the table's columns in order, the defaults among them
    assert registry.TABLE_SETTINGS == tuple(s.name for s in settings)
    assert registry.DEFAULT_SETTINGS == tuple(s.name for s in settings if s.default)
    assert registry.DEFAULT_SETTINGS == ("0_shot", "bm25", "dense", "gpt_index", "oracle")  # as before the registry
    assert {s.name for s in settings if s.paper} <= set(registry.TABLE_SETTINGS)
    # experiments: swap, irrelevant, then one constraints_ experiment per column
    assert registry.EXPERIMENT_SETTINGS == ("swap", "irrelevant",
                                            *(f"constraints_{s}" for s in registry.TABLE_SETTINGS))
    assert registry.EVAL_SETTINGS == registry.TABLE_SETTINGS + registry.EXPERIMENT_SETTINGS
    assert len(set(registry.EVAL_SETTINGS)) == len(registry.EVAL_SETTINGS) == 2 * len(registry.TABLE_SETTINGS) + 2
    assert registry.setting_retriever("constraints_released_bm25") == "released_bm25"
    assert registry.setting_retriever("0_shot") == "none"
    with pytest.raises(KeyError):
        registry.setting_retriever("swap")
    # every setting's retriever exists
    assert all(s.retriever in registry.RETRIEVERS for s in registry.TEST_SETTING_SPECS)
    assert all(c in registry.RETRIEVERS for r in registry.RETRIEVER_SPECS for c in r.components)
    # a fused retriever needs the finetuned folder exactly when one of its components does
    assert all(r.needs_model == any(registry.RETRIEVERS[c].needs_model for c in r.components)
               for r in registry.RETRIEVER_SPECS if r.kind == "fusion")


def _between(text: str, start: str, end: str) -> str:
    """The text from the first ``start`` to the next ``end`` after it (both must be there)."""
    i = text.index(start)
    return text[i:text.index(end, i + len(start))]


def _names(text: str) -> list[str]:
    """The names written in backticks, in order (flags, paths and code left out)."""
    return re.findall(r"`([a-z0-9][a-z0-9_]*)`", text)


def _bullet_names(text: str) -> list[str]:
    return re.findall(r"^- `([a-z0-9_]+)`", text, flags=re.M)


def test_docs_name_lists_equal_the_registry():
    """docs/pipeline.md and docs/retrieval.md write the registry's names out in prose and tables;
    each list is the registry's, so adding or renaming a name fails here until the docs follow."""
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    modes = _between(pipeline, "**Train-time retrieval modes**", "`--modes` defaults to")
    assert sorted(set(_names(modes))) == sorted(registry.TRAIN_MODES)
    assert re.search(r"`--modes` defaults to `([^`]+)`", pipeline).group(1).split() == list(registry.DEFAULT_MODES)
    bm25_table = _between(pipeline, "The three BM25 names:", "An unknown name is refused")
    assert re.findall(r"^\| `([a-z0-9_]+)` \|", bm25_table, flags=re.M) == [*registry.BM25_RETRIEVERS,
                                                                          registry.RELEASED_BM25]
    interface = _between(pipeline, "One interface, `Retriever.retrieve", "\n\n")
    assert sorted(set(_names(interface))) == sorted(registry.RETRIEVERS)
    defaults = _between(pipeline, "under the test settings", "by default")
    assert _names(defaults) == list(registry.DEFAULT_SETTINGS)
    on_request = _between(pipeline, "by default, and on request", "Per setting:")
    assert sorted(_names(defaults) + _names(on_request)) == sorted(registry.TABLE_SETTINGS)

    retrieval = (ROOT / "docs" / "retrieval.md").read_text()
    assert _bullet_names(_between(retrieval, "## BM25 variants", "\n## ")) == list(registry.BM25_RETRIEVERS)
    assert _bullet_names(_between(retrieval, "## BM25 backends", "\n## ")) == list(registry.BM25_BACKENDS)
    fused = re.findall(r"`([a-z0-9_]+)` (?:fuses the rankings of|those of) `([a-z0-9_]+)` and `([a-z0-9_]+)`",
                       _between(retrieval, "## Hybrid retrievers", "\n## "))
    assert {name: tuple(parts) for name, *parts in fused} == \
        {r.name: r.components for r in registry.RETRIEVER_SPECS if r.kind == "fusion"}


def test_cli_sweep_demo_and_train_config_accept_exactly_the_registry(capsys, tmp_path):
    from ratune.sweep import SweepData, SweepEval, load_sweep
    from ratune.train.config import TrainConfig

    eval_help = _help(["eval", "run"], capsys)
    assert "{" + ",".join(registry.EVAL_SETTINGS) + "}" in eval_help
    build_help = _help(["data", "build"], capsys)
    assert "{" + ",".join(registry.TRAIN_MODES) + "}" in build_help
    assert "{" + ",".join(registry.RETRIEVED_MODES) + "}" in build_help  # --top1-retriever
    assert "{" + ",".join(("all", *(n for n in registry.RETRIEVERS if n != "none"))) + "}" in \
        _help(["retrieval", "eval"], capsys)
    assert SweepEval(settings=list(registry.EVAL_SETTINGS)).settings == list(registry.EVAL_SETTINGS)
    assert set(load_sweep(ROOT / "configs" / "demo.yaml").config.eval.settings) <= set(registry.EVAL_SETTINGS)
    # the demo is a sweep file: its eval settings are checked against the registry, which the refusal lists
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    demo["eval"]["settings"] = ["0_shot", "nonesuch"]
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(demo))
    with pytest.raises(RatuneError) as refused:
        load_sweep(tmp_path / "demo.yaml")
    assert f"eval.settings.1: Value error, unknown test setting 'nonesuch': expected one of " \
        f"{', '.join(registry.EVAL_SETTINGS)} (got 'nonesuch')" in str(refused.value)
    assert SweepEval().settings == list(registry.DEFAULT_SETTINGS)
    for mode in registry.RETRIEVED_MODES:
        assert SweepData(top1_retriever=mode).top1_retriever == mode
    for mode in registry.TRAIN_MODES:
        assert TrainConfig(model="m", data_dir="d", train_retriever=mode, output_dir="o").train_retriever == mode
    schema = SweepEval.model_json_schema()
    assert schema["properties"]["settings"]["items"]["enum"] == list(registry.EVAL_SETTINGS)


UNKNOWN_NAME_CASES = [
    (["data", "build", "--hub", "torchhub", "--out", "OUT", "--modes", "bm25_paper"],
     "argument --modes: unknown train-time retrieval mode 'bm25_paper': expected one of none, "),
    (["data", "build", "--hub", "torchhub", "--out", "OUT", "--top1-retriever", "bm25_paper"],
     "argument --top1-retriever: unknown top1 retriever 'bm25_paper': expected one of "),
    (["retrieval", "eval", "--hub", "torchhub", "--retriever", "paper_bm25"],
     "argument --retriever: unknown retriever 'paper_bm25': expected one of "),
    (["retrieval", "index", "--hub", "torchhub", "--out", "OUT", "--retriever", "bm25_paper"],
     "argument --retriever: unknown BM25 variant 'bm25_paper': expected one of "),
    (["eval", "run", "--checkpoint", ".", "--hub", "torchhub", "--out", "OUT", "--settings", "0_shot", "bm26"],
     "argument --settings: unknown test setting 'bm26': expected one of 0_shot, bm25, dense, gpt_index, "
     "released_bm25, oracle, dense_ft, hybrid, hybrid_ft, swap, irrelevant"),
]


@pytest.mark.parametrize("argv,message", UNKNOWN_NAME_CASES)
def test_cli_refuses_an_unknown_name_with_the_list(argv, message, tmp_path, capsys):
    from ratune.cli import main

    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratune: error: ") and message in err and "Traceback" not in err


def test_schemas_and_stages_refuse_an_unknown_name(apibench, smol_tokenizer, tmp_path):
    from ratune.config import validate
    from ratune.data.build import build_dataset
    from ratune.data.mixture import Mixture
    from ratune.retrieval.retrievers import make_retriever
    from ratune.sweep import SweepEval
    from ratune.train.config import TrainConfig

    with pytest.raises(RatuneError, match=r"sweep\.yaml: eval: settings\.1: Value error, unknown test setting 'paper_bm25': "
                                          r"expected one of 0_shot, "):
        validate(SweepEval, {"settings": ["0_shot", "paper_bm25"]}, "sweep.yaml: eval")
    with pytest.raises(RatuneError, match=r"train\.yaml: train_retriever: .*expected one of none, .* or mix-NAME .*got 'bm25_paper'"):
        validate(TrainConfig, {"model": "m", "data_dir": "d", "train_retriever": "bm25_paper", "output_dir": "o"},
                 "train.yaml")
    with pytest.raises(RatuneError, match="unknown retriever 'paper_bm25': expected one of "):
        make_retriever("paper_bm25", hub="torchhub", apibench_dir=apibench)
    with pytest.raises(RatuneError, match="mixture m: unknown top1 retriever 'bm25_paper': expected one of "):
        Mixture.parse("m:top1=1", top1_retriever="bm25_paper")
    with pytest.raises(RatuneError, match="unknown train-time retrieval mode 'bm25_paper': expected one of none, "):
        build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=tmp_path / "d", tokenizer=smol_tokenizer,
                      tokenizer_name="smol", modes=["bm25_paper"])
    assert not (tmp_path / "d").exists()


def test_a_saved_index_loads_under_its_variant_and_is_refused_under_another(apibench, tmp_path):
    """A saved bm25s index records its variant: loaded as that variant it ranks like a fresh one;
    one whose record names another variant is refused, naming both."""
    from ratune.sources.apibench import api_database_path, load_api_database
    from ratune.io import read_json, write_json
    from ratune.retrieval.retrievers import BM25_INDEX_METADATA, BM25Retriever, Query, make_retriever

    corpus = load_api_database(api_database_path(apibench, "torchhub"))
    saved = BM25Retriever(corpus, hub="torchhub", variant="bm25_replica", backend="bm25s").save(tmp_path / "index")
    loaded = make_retriever("bm25_replica", hub="torchhub", apibench_dir=apibench, bm25_index=saved)
    fresh = make_retriever("bm25_replica", hub="torchhub", apibench_dir=apibench)
    q = [Query("Load a pretrained image classifier from PyTorch Hub")]
    assert [d["api_call"] for d in loaded.retrieve(q, top_k=5)[0]] == [d["api_call"] for d in fresh.retrieve(q, top_k=5)[0]]
    meta = read_json(saved / BM25_INDEX_METADATA)
    write_json(saved / BM25_INDEX_METADATA, {**meta, "variant": "bm25_paper", "name": "bm25_paper"})
    with pytest.raises(RatuneError, match="this index was built for variant 'bm25_paper', not 'bm25_replica'"):
        make_retriever("bm25_replica", hub="torchhub", apibench_dir=apibench, bm25_index=saved)


def _squash(text: str) -> str:
    return re.sub(r"[\s\\'\"]", "", text)


def test_released_bm25_setting_replays_the_papers_bm25_documents(apibench):
    """Each question's document under released_bm25 is the one in the released
    questions_torchhub_bm25.jsonl: its api_call appears in that question's released text
    (quotes, backslashes and spaces ignored), and differs from our bm25's where the two disagree."""
    from ratune.sources.apibench import load_examples, questions_path
    from ratune.hubs import resolve_hub
    from ratune.eval.run import EvalSettings, _setting_plan
    from ratune.io import iter_jsonl

    examples = load_examples(apibench, "torchhub", "eval")
    released = {row["question_id"]: row["text"] for _, row in iter_jsonl(questions_path(apibench, "torchhub", "bm25"))}
    settings = EvalSettings(settings=("released_bm25",))
    source = resolve_hub("torchhub", apibench)
    asked, retriever, extra = _setting_plan("released_bm25", examples, source=source, settings=settings)
    assert asked == examples and extra == {}
    assert retriever.metadata() == {"name": "released_bm25", "hub": "torchhub", "mapped_by_name": 0, "unmapped": 0,
                                    "source": "questions_torchhub_bm25.jsonl"}
    from ratune.retrieval.retrievers import Query

    docs = retriever.retrieve([Query(e.instruction, e.api, e.line) for e in examples])
    assert len(docs) == 186 and all(len(d) == 1 for d in docs)
    for e, (doc,) in zip(examples, docs):
        assert _squash(doc["api_call"]) in _squash(released[e.line]), e.line
    # the replayed documents are not our BM25's: they agree on 97 of 186 top-1s (docs/retrieval.md)
    _, ours, _ = _setting_plan("bm25", examples, source=source, settings=settings)
    ours_docs = ours.retrieve([Query(e.instruction, e.api, e.line) for e in examples])
    same = sum(a[0]["api_call"] == b[0]["api_call"] for a, b in zip(docs, ours_docs))
    assert same == 97


def test_eval_run_under_released_bm25_records_its_source(apibench, tiny_model_dir, tmp_path):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    results = evaluate_checkpoint(tiny_model_dir, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                                  settings=EvalSettings(settings=("released_bm25",), n_questions=2, batch_size=2,
                                                        max_new_tokens=4, torch_threads=1), progress=False)
    assert list(results) == ["released_bm25"]
    metrics = json.loads((tmp_path / "eval" / "released_bm25" / "metrics.json").read_text())
    assert metrics["setting"] == "released_bm25" and metrics["n"] == 2
    assert metrics["retriever"]["source"] == "questions_torchhub_bm25.jsonl"
    lines = (tmp_path / "eval" / "released_bm25" / "responses.jsonl").read_text().splitlines()
    assert [json.loads(line)["question_id"] for line in lines] == [1, 2]


DISTINCT_NAMES = ("0_shot", "gpt_index", "released_bm25", "bm25_replica", "constraints_")


def test_distinct_names_are_typed_only_in_the_registry():
    """The names that mean one thing each appear as string literals only in ratune/registry.py
    (and the implementation of their kind: the finetuned retriever's own module names dense_ft;
    the BM25 variant table in retrieval/bm25.py keys its variants)."""
    allowed = {("retrieval/bm25.py", "bm25_replica")}
    found = []
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        if rel == "ratune/registry.py":
            continue
        text = path.read_text()
        for name in DISTINCT_NAMES:
            for m in re.finditer(r"""["']""" + re.escape(name), text):
                line = text.count("\n", 0, m.start()) + 1
                if (rel, name) not in allowed:
                    found.append(f"{rel}:{line}: {name}")
    assert found == []
