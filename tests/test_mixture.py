"""Mixed retrieval training data (data/mixture.py): parsing, deterministic draws,
the multi-document format, and a real TorchHub build whose pure mixtures equal the plain modes."""

from __future__ import annotations

import json

import pytest

from ratune.sources.apibench import api_identity
from ratune.data.mixture import MIXTURE_COMPONENTS, Mixture, draw_documents, realised_shares
from ratune.sources.prompt import REFERENCE_PHRASE, serialize_document
from ratune.errors import RatuneError


def doc(i: int) -> dict:
    return {"domain": "Classification", "api_call": f"torch.hub.load('r/x', 'm{i}')", "api_name": f"m{i}"}


DATABASE = [doc(i) for i in range(20)] + [doc(3)]  # a repeated API counts once in the distractor pool


def test_parse_and_errors():
    m = Mixture.parse("rat_mix:none=0.2,oracle=0.3,top1=0.1,distractors=0.4", distractors=2, seed=7)
    assert m.mode == "mix-rat_mix"
    assert m.metadata()["weights"] == {"none": 0.2, "oracle": 0.3, "top1": 0.1, "distractors": 0.4, "irrelevant": 0.0}
    assert (m.distractors, m.seed, m.top1_retriever) == (2, 7, "bm25")
    with pytest.raises(RatuneError, match="probabilities sum to 0.9, not 1"):
        Mixture.parse("a:none=0.5,oracle=0.4")
    with pytest.raises(RatuneError, match=r"unknown component\(s\) gold"):
        Mixture.parse("a:gold=1")
    with pytest.raises(RatuneError, match="expected NAME:component=probability"):
        Mixture.parse("none=1")
    with pytest.raises(RatuneError, match="'oracle' is not component=probability"):
        Mixture.parse("a:oracle")
    with pytest.raises(RatuneError, match="mixture name 'Bad-Name'"):
        Mixture.parse("Bad-Name:none=1")
    with pytest.raises(RatuneError, match="top1 retriever 'gpt_index'"):
        Mixture.parse("a:top1=1", top1_retriever="gpt_index")


def test_draws_are_deterministic_and_follow_the_weights():
    n = 4000
    gold = [doc(i % 20) for i in range(n)]
    top1 = [[doc((i + 1) % 20)] for i in range(n)]
    m = Mixture.parse("m:none=0.1,oracle=0.2,top1=0.3,distractors=0.4", distractors=3, seed=1)
    golds = [[g] for g in gold]
    docs, comps = draw_documents(m, split="train", gold_docs=golds, top1_docs=top1, database=DATABASE)
    again = draw_documents(m, split="train", gold_docs=golds, top1_docs=top1, database=DATABASE)
    assert (docs, comps) == again
    other_seed = draw_documents(Mixture.parse("m:none=0.1,oracle=0.2,top1=0.3,distractors=0.4", seed=2),
                                split="train", gold_docs=golds, top1_docs=top1, database=DATABASE)[1]
    assert other_seed != comps
    other_split = draw_documents(m, split="eval", gold_docs=golds, top1_docs=top1, database=DATABASE)[1]
    assert other_split != comps
    shares = realised_shares(comps)
    # binomial sd at n = 4000 is at most 0.8 points: 3 points is > 3.5 sd
    for component, p in zip(MIXTURE_COMPONENTS, (0.1, 0.2, 0.3, 0.4)):
        assert abs(shares[component]["share"] - p) < 0.03
    assert sum(s["n"] for s in shares.values()) == n
    positions = []
    for g, t, d, c in zip(gold, top1, docs, comps):
        if c == "none":
            assert d == []
        elif c == "oracle":
            assert d == [g]
        elif c == "top1":
            assert d == t[:1]
        else:
            ids = [api_identity(x) for x in d]
            assert len(d) == 4 and len(set(ids)) == 4 and ids.count(api_identity(g)) == 1
            positions.append(d.index(g))
    assert set(positions) == {0, 1, 2, 3}  # the gold document is not always first


def test_irrelevant_component_and_abstention_rows():
    from ratune.sources.prompt import ABSTAIN_API_CALL, abstain_answer, format_answer, is_abstention

    database = [doc(i) for i in range(5)] + [{"domain": "Audio", "api_call": "torch.hub.load('a/b', 'w')"}]
    m = Mixture.parse("irr:irrelevant=1")
    docs, comps = draw_documents(m, split="train", gold_docs=[[doc(0)]] * 3, top1_docs=[[doc(1)]] * 3,
                                 database=database)
    assert comps == ["irrelevant"] * 3 and all(d == [database[-1]] for d in docs)  # the only other domain
    with pytest.raises(RatuneError, match="no API outside the domain 'Classification'"):
        draw_documents(m, split="train", gold_docs=[[doc(0)]], top1_docs=[[doc(1)]], database=database[:5])
    text = format_answer(abstain_answer(None))
    assert f"<<<api_call>>>: {ABSTAIN_API_CALL}\n" in text and is_abstention(" no_api_fits ")
    assert not is_abstention(None) and not is_abstention("torch.hub.load('a/b', 'w')")


def test_too_few_distractors():
    m = Mixture.parse("m:distractors=1", distractors=5)
    with pytest.raises(RatuneError, match="5 distractors asked, but the database has only 2 other APIs"):
        draw_documents(m, split="train", gold_docs=[[doc(0)]], top1_docs=[[doc(1)]], database=[doc(0), doc(1), doc(2)])


def test_a_tool_set_row_draws_around_all_its_own_tools():
    """A tool-set row's oracle documents are all its tools: oracle shows them all, distractors adds
    others around them, irrelevant shows one tool that is none of them (tools have no domain)."""
    tools = [{"name": f"t{i}", "description": "", "parameters": {}} for i in range(8)]
    own = tools[:2]
    for spec, check in (("o:oracle=1", lambda d: d == own),
                        ("d:distractors=1", lambda d: len(d) == 5 and sorted(x["name"] for x in d if x in own) == ["t0", "t1"]
                         and len({x["name"] for x in d}) == 5),
                        ("i:irrelevant=1", lambda d: len(d) == 1 and d[0] not in own)):
        docs, _ = draw_documents(Mixture.parse(spec, distractors=3), split="train", gold_docs=[own] * 50,
                                 top1_docs=[[tools[2]]] * 50, database=tools)
        assert all(check(d) for d in docs), spec
    irrelevant, _ = draw_documents(Mixture.parse("i:irrelevant=1"), split="train", gold_docs=[own] * 200,
                                   top1_docs=[[tools[2]]] * 200, database=tools)
    assert {d[0]["name"] for d in irrelevant} == {f"t{i}" for i in range(2, 8)}


@pytest.fixture(scope="module")
def mixed_build(tmp_path_factory, apibench, smol_tokenizer):
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset

    out = tmp_path_factory.mktemp("mix") / "data"
    mixtures = [Mixture.parse("pure_oracle:oracle=1"), Mixture.parse("pure_none:none=1"),
                Mixture.parse("rat:none=0.25,oracle=0.25,top1=0.25,distractors=0.25", distractors=2, seed=3),
                Mixture.parse("abstain:oracle=0.5,irrelevant=0.5", seed=1)]
    manifest = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer,
                             tokenizer_name="smol", modes=["none", "oracle"], progress=False, mixtures=mixtures,
                             settings=BuildSettings(max_length=1024, max_document_tokens=96))
    return out, manifest, {m: load_from_disk(str(out / m))["train"] for m in
                           ("none", "oracle", "mix-pure_oracle", "mix-pure_none", "mix-rat", "mix-abstain")}


def test_pure_mixtures_equal_the_plain_modes(mixed_build):
    _, manifest, ds = mixed_build
    assert manifest["modes"] == ["none", "oracle", "mix-pure_oracle", "mix-pure_none", "mix-rat", "mix-abstain"]
    assert ds["mix-pure_oracle"]["user_turn"] == ds["oracle"]["user_turn"]
    assert ds["mix-pure_none"]["user_turn"] == ds["none"]["user_turn"]
    assert set(ds["mix-pure_oracle"]["doc_component"]) == {"oracle"}


def test_mixed_rows_and_manifest(mixed_build):
    out, manifest, ds = mixed_build
    rows = ds["mix-rat"]
    record = manifest["mixtures"]["mix-rat"]
    kept = record["realised"]["train"]["kept"]
    assert sum(v["n"] for v in kept.values()) == len(rows) == manifest["counts"]["train"]["mix-rat"]["rows"]
    assert {c: kept[c]["n"] for c in MIXTURE_COMPONENTS} == \
        {c: sum(x == c for x in rows["doc_component"]) for c in MIXTURE_COMPONENTS}
    for c in MIXTURE_COMPONENTS[:4]:  # 837 draws at 0.25 each: sd 1.5 points
        assert abs(record["realised"]["train"]["drawn"][c]["share"] - 0.25) < 0.06
    assert record["weights"] == {"none": 0.25, "oracle": 0.25, "top1": 0.25, "distractors": 0.25, "irrelevant": 0.0}
    assert (record["distractors"], record["seed"], record["top1_retriever"]) == (2, 3, "bm25")
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["mixtures"]["mix-rat"]["realised"] == record["realised"]

    for row in rows:
        turn = row["user_turn"]
        if row["doc_component"] == "none":
            assert REFERENCE_PHRASE not in turn and row["document_api_calls"] == []
            continue
        assert turn.count(REFERENCE_PHRASE) == 1
        documents = turn.split(REFERENCE_PHRASE, 1)[1].split("\n")
        if row["doc_component"] == "distractors":
            # one document per line, each the same serialization; the gold one among them
            assert len(documents) == 3 == len(row["document_api_calls"])
            assert row["gold_api_call"] in row["document_api_calls"]
        else:
            assert len(documents) == 1
        if row["doc_component"] == "oracle":
            assert row["document_api_calls"] == [row["gold_api_call"]]


def test_serialization_is_the_single_document_one():
    d = doc(5)
    from ratune.sources.prompt import build_user_turn

    assert build_user_turn("q", "\n".join(serialize_document(x) for x in [d, doc(6)])) == \
        f"q\n{REFERENCE_PHRASE}{serialize_document(d)}\n{serialize_document(doc(6))}"


def test_cli_builds_only_the_mixture(tmp_path, apibench, smol_tokenizer_dir, capsys):
    from ratune.cli import main

    out = tmp_path / "data"
    argv = ["data", "build", "--apibench", str(apibench), "--hub", "torchhub", "--out", str(out), "--tokenizer",
            str(smol_tokenizer_dir), "--max-length", "1024", "--max-document-tokens", "64", "--modes"]
    assert main([*argv, "--mixture", "half:none=0.5,top1=0.5", "--mixture-seed", "5"]) == 0
    printed = capsys.readouterr().out
    assert "mix-half: none " in printed and "train mix-half rows" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["modes"] == ["mix-half"] and sorted(p.name for p in out.iterdir() if p.is_dir()) == ["mix-half"]
    assert manifest["mixtures"]["mix-half"]["seed"] == 5
    assert main([*argv[:-1], "--modes", "--out", str(tmp_path / "other")]) == 2
    assert "nothing to build: give --modes and/or --mixture" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--mixture", "bad:none=0.7"]) == 2
    assert "mixture bad: probabilities sum to 0.7, not 1" in capsys.readouterr().err


def test_abstention_rows_in_a_real_build(mixed_build):
    from ratune.sources.prompt import ABSTAIN_API_CALL

    _, _, ds = mixed_build
    rows = ds["mix-abstain"]
    oracle = {r["line"]: r for r in ds["oracle"]}
    irrelevant = [r for r in rows if r["doc_component"] == "irrelevant"]
    assert 0.4 < len(irrelevant) / len(rows) < 0.6
    for r in irrelevant:
        assert f"<<<api_call>>>: {ABSTAIN_API_CALL}" in r["completion"]
        assert r["gold_api_call"] not in r["document_api_calls"]
    for r in rows:
        if r["doc_component"] == "oracle":
            assert r["completion"] == oracle[r["line"]]["completion"]


def test_force_gold_in_train_time_retrieval(tmp_path, apibench, smol_tokenizer):
    """--force-gold: every bm25 training row has its gold document among its top-2 (replacing the
    lowest-ranked one where BM25 missed it, as many as BM25 missed); eval rows are unchanged."""
    from datasets import load_from_disk

    from ratune.sources.apibench import api_identity
    from ratune.data.build import BuildSettings, build_dataset
    from ratune.retrieval.retrievers import Query, make_retriever

    built = {}
    for force in (False, True):
        out = tmp_path / f"force_{force}"
        manifest = build_dataset(apibench_dir=apibench, hub="torchhub", out_dir=out, tokenizer=smol_tokenizer,
                                 tokenizer_name="smol", modes=["bm25"], progress=False,
                                 settings=BuildSettings(max_length=1536, max_document_tokens=96, top_k=2,
                                                        force_gold=force))
        built[force] = (manifest, load_from_disk(str(out / "bm25")))
    manifest, ds = built[True]
    train = ds["train"]
    assert all(r["gold_api_call"] in r["document_api_calls"] and len(r["document_api_calls"]) == 2 for r in train)
    # how many BM25 missed, counted independently
    examples = load_examples_for_test(apibench)
    ranked = make_retriever("bm25", hub="torchhub", apibench_dir=apibench).retrieve(
        [Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples], top_k=2)
    missed = sum(api_identity(e.api) not in {api_identity(d) for d in docs} for e, docs in zip(examples, ranked))
    assert manifest["counts"]["train"]["bm25"]["forced_gold"] == missed > 0
    assert manifest["counts"]["eval"]["bm25"]["forced_gold"] == 0 and manifest["settings"]["force_gold"] is True
    assert built[False][1]["eval"]["user_turn"] == ds["eval"]["user_turn"]
    unforced = {r["line"]: r for r in built[False][1]["train"]}
    for r in train:  # rows BM25 got right are untouched; the others keep their top-1 and gain the gold
        before = unforced[r["line"]]["document_api_calls"]
        if r["gold_api_call"] in before:
            assert r["document_api_calls"] == before
        else:
            assert r["document_api_calls"] == [before[0], r["gold_api_call"]]


def load_examples_for_test(apibench):
    """The TorchHub training examples the build keeps (duplicates removed; the released file has none)."""
    from ratune.sources.apibench import load_examples

    return load_examples(apibench, "torchhub", "train")
