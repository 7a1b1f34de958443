"""The synthetic APIBench (the ``apibench_tiny`` fixture, tests/conftest.py) through the data, retrieval and scoring
stages, with every count worked out by hand from tests/fixtures/make_apibench_tiny.py.

These tests need no ../shared: they are what runs of the pipeline's APIBench paths on a machine
without the real data (tests/conftest.py skips the ``apibench_data`` tests there).
"""

from __future__ import annotations

import pytest

from ratune.sources.apibench import load_api_database, load_examples
from ratune.eval.compare import compare_files
from ratune.eval.scoring import Scorer, load_responses
from ratune.retrieval.retrievers import Query, make_retriever


def test_the_fixture_holds_the_released_file_layout(apibench_tiny):
    files = sorted(str(p.relative_to(apibench_tiny)) for p in apibench_tiny.rglob("*")
                   if p.is_file() and "torchhub" in p.name)  # the other hubs: test_apibench_tiny_hubs.py
    assert files == (["api/torchhub_api.jsonl", "apibench/torchhub_eval.json", "apibench/torchhub_train.json"]
                     + [f"questions/questions_torchhub_{s}.jsonl" for s in ("0_shot", "bm25", "gpt_index", "oracle")]
                     + [f"responses/response_torchhub_Gorilla_{m}_{s}.jsonl" for m in ("FT", "RT")
                        for s in ("0_shot", "bm25", "gpt_index", "oracle")])


def test_examples_parse_in_both_released_layouts(apibench_tiny):
    train = load_examples(apibench_tiny, "torchhub", "train")
    evaluation = load_examples(apibench_tiny, "torchhub", "eval")
    assert (len(train), len(evaluation)) == (12, 6)
    assert {e.layout for e in train} != {e.layout for e in evaluation}  # pseudo-dict vs ###Instruction
    first = evaluation[0]
    assert first.line == 1 and first.instruction == ("What API labels a photo with one of the ImageNet classes "
                                                     "using a residual network?")
    # the answer's call is the row's api_call (the database form), not the code field's assignment
    assert first.answer.api_call == "torch.hub.load(repo_or_dir='pytorch/vision', model='resnet18', pretrained=True)"
    assert first.api["api_name"] == "ResNet18" and first.answer.domain == "Image Classification"
    # training line 4 is the second of API 1 (two lines per API, in API order)
    assert train[3].line == 4 and train[3].api["api_name"] == "MobileNetV2"
    assert train[3].instruction == "Which model recognises objects in photos on a mobile device with little memory?"
    assert len(load_api_database(apibench_tiny / "api" / "torchhub_api.jsonl")) == 6


# (gorilla correct, gorilla hallucinated, strict correct, strict hallucinated) of each released-style
# file, by hand from make_apibench_tiny.RESPONSES against gold APIs 0-5 (docs/official_semantics.md §5-6:
# the gorilla metric matches the database entry by repo and model substrings and then compares only
# the domain, so another API of the gold's domain is correct; the strict metric needs the gold API):
#   FT 0_shot [0,0,2,3,x,5]: q2 names ResNet18 for MobileNetV2 (same domain: gorilla only); q5 a
#     model no API has (hallucination in both)                                  -> 5, 1, 4, 1
#   FT bm25   [0,0,3,3,4,2]: q2, q3 same-domain; q6 YOLOv5s for a video question -> 5, 0, 3, 0
#   FT/RT gpt_index [0,1,2,2,4,5]: q4 same-domain                                -> 6, 0, 5, 0
#   FT oracle [0,1,2,3,4,x]: q6 hallucinated                                     -> 5, 1, 5, 1
#   RT 0_shot: no api_call at all: neither, never parsed (semantics §3)          -> 0, 0, 0, 0
#   RT oracle: every gold API                                                    -> 6, 0, 6, 0
SCORES = {
    ("FT", "0_shot"): (5, 1, 4, 1), ("FT", "bm25"): (5, 0, 3, 0), ("FT", "gpt_index"): (6, 0, 5, 0),
    ("FT", "oracle"): (5, 1, 5, 1), ("RT", "0_shot"): (0, 0, 0, 0), ("RT", "bm25"): (5, 0, 3, 0),
    ("RT", "gpt_index"): (6, 0, 5, 0), ("RT", "oracle"): (6, 0, 6, 0),
}


@pytest.mark.parametrize("model,setting", sorted(SCORES))
def test_released_style_responses_score_as_worked_out(apibench_tiny, model, setting):
    scorer = Scorer.from_apibench("torchhub", apibench_tiny)
    path = apibench_tiny / "responses" / f"response_torchhub_Gorilla_{model}_{setting}.jsonl"
    result = scorer.score(load_responses(path, scorer.n_questions))
    got = (result["gorilla"]["correct_n"], result["gorilla"]["hallucination_n"],
           result["strict"]["correct_n"], result["strict"]["hallucination_n"])
    assert result["n"] == 6 and got == SCORES[(model, setting)]


def test_ft_against_rt_at_0_shot_is_paired_by_question(apibench_tiny):
    responses = apibench_tiny / "responses"
    result = compare_files(responses / "response_torchhub_Gorilla_FT_0_shot.jsonl",
                           responses / "response_torchhub_Gorilla_RT_0_shot.jsonl",
                           hub="torchhub", apibench_dir=apibench_tiny, metric="strict")
    # FT is right on q1, q3, q4, q6 and RT on none: 4 discordant questions, all FT's;
    # exact McNemar p = 2 x (1/2)^4 = 0.125; difference 4/6
    assert (result["contingency"]["only_a"], result["contingency"]["only_b"]) == (4, 0)
    assert result["mcnemar_p"] == pytest.approx(0.125)
    assert result["difference"]["value"] == pytest.approx(4 / 6)


@pytest.mark.parametrize("name,expected", [
    # make_apibench_tiny.PAPER_GPT_INDEX / PAPER_BM25: question id -> API index of the paper's document
    ("gpt_index", ["ResNet18", "MobileNetV2", "YOLOv5s", "YOLOv5s", "DeepLabV3", "slow_r50"]),
    ("released_bm25", ["ResNet18", "ResNet18", "SSD", "SSD", "DeepLabV3", "YOLOv5s"]),
])
def test_the_papers_documents_map_back_to_database_records(apibench_tiny, name, expected):
    retriever = make_retriever(name, hub="torchhub", apibench_dir=apibench_tiny)
    got = retriever.retrieve([Query(text="ignored", question_id=q) for q in range(1, 7)])
    assert [docs[0]["api_name"] for docs in got] == expected
    assert retriever.metadata()["unmapped"] == retriever.metadata()["mapped_by_name"] == 0


def test_data_build_on_the_fixture(tmp_path, apibench_tiny, smol_tokenizer):
    from datasets import load_from_disk

    from ratune.data.build import build_dataset

    manifest = build_dataset(apibench_dir=apibench_tiny, hub="torchhub", out_dir=tmp_path / "data",
                             tokenizer=smol_tokenizer, tokenizer_name="smol", modes=("none", "oracle"),
                             progress=False)
    counts = {(split, mode): manifest["counts"][split][mode]["rows"] for split in ("train", "eval")
              for mode in ("none", "oracle")}
    assert counts == {("train", "none"): 12, ("train", "oracle"): 12, ("eval", "none"): 6, ("eval", "oracle"): 6}
    oracle = load_from_disk(str(tmp_path / "data" / "oracle" / "train"))
    none = load_from_disk(str(tmp_path / "data" / "none" / "train"))
    assert "Use this API documentation for reference:" in oracle[0]["user_turn"]
    assert "Use this API documentation for reference:" not in none[0]["user_turn"]
    # each oracle row's one document is its own gold API
    assert [row["document_api_calls"] for row in oracle] == [[row["gold_api_call"]] for row in oracle]
    assert [row["document_api_calls"] for row in none] == [[]] * 12
    assert oracle[0]["gold_api_call"] == "torch.hub.load(repo_or_dir='pytorch/vision', model='resnet18', pretrained=True)"
