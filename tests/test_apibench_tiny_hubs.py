"""The HuggingFace and TensorFlow Hub parts of the synthetic APIBench (the ``apibench_tiny`` fixture,
tests/conftest.py) through the data, retrieval and scoring stages, with every count worked out by
hand from tests/fixtures/make_apibench_tiny.py.

The real files of these two hubs are tested only where ../shared/apibench exists (the
``apibench_data`` tests); these tests run everywhere. Each hub's own rules (docs/scoring.md,
docs/official_semantics.md "semantics §N") are exercised by at least one response:

* both hubs parse a response text without ``api_call`` whole (TorchHub scores it error unparsed);
* HuggingFace: every argument of a database call is a reference argument (a ``torch_dtype`` value
  included), a call without arguments is skipped by the gorilla metric, and the strict metric
  names a ``from_pretrained`` model whatever its class and a pipeline by its task and model;
* TensorFlow Hub: every argument's full text is a reference argument (``output_shape=[1280]``
  verbatim, a double-quoted URL keeps its quotes), the loader is part of the API, and the first of
  two identical database calls decides the gorilla domain.
"""

from __future__ import annotations

import json

import pytest

from ratune.cli import main
from ratune.sources.apibench import api_identity, examples_path, load_api_database, load_examples
from ratune.errors import RatuneError
from ratune.eval.compare import compare_files
from ratune.eval.scoring import Scorer, extract_api_call, load_responses
from ratune.retrieval.metrics import evaluate_retriever
from ratune.retrieval.retrievers import Query, make_retriever

SETTINGS = ("0_shot", "bm25", "gpt_index", "oracle")
HUBS = ("huggingface", "tensorflowhub")
URL0 = "https://tfhub.dev/google/imagenet/mobilenet_v2_100_224/feature_vector/4"
URL1 = "https://tfhub.dev/google/tf2-preview/mobilenet_v2/feature_vector/4"
USE = "https://tfhub.dev/google/universal-sentence-encoder/4"


def _responses(apibench_tiny, hub, model, setting):
    return apibench_tiny / "responses" / f"response_{hub}_Gorilla_{model}_{setting}.jsonl"


def test_the_fixture_holds_the_released_layouts_of_all_three_hubs(apibench_tiny):
    files = sorted(str(p.relative_to(apibench_tiny)) for p in apibench_tiny.rglob("*") if p.is_file())
    hubs = ("huggingface", "tensorflowhub", "torchhub")
    # no HuggingFace or TensorFlow Hub train file, and the TensorFlow Hub eval file says "tensorflow"
    assert files == sorted([f"api/{h}_api.jsonl" for h in hubs]
                           + ["apibench/huggingface_eval.json", "apibench/tensorflow_eval.json",
                              "apibench/torchhub_eval.json", "apibench/torchhub_train.json"]
                           + [f"questions/questions_{h}_{s}.jsonl" for h in hubs for s in SETTINGS]
                           + [f"responses/response_{h}_Gorilla_{m}_{s}.jsonl" for h in hubs
                              for m in ("FT", "RT") for s in SETTINGS])
    assert examples_path(apibench_tiny, "tensorflowhub", "eval").name == "tensorflow_eval.json"


def test_databases_and_their_api_identities(apibench_tiny):
    hf = load_api_database(apibench_tiny / "api" / "huggingface_api.jsonl")
    tf = load_api_database(apibench_tiny / "api" / "tensorflowhub_api.jsonl")
    assert (len(hf), len(tf)) == (6, 6)
    # TensorFlow Hub lines 5 and 6 are one call under two domains: 5 distinct APIs
    assert (len({api_identity(d) for d in hf}), len({api_identity(d) for d in tf})) == (6, 5)
    assert [d["domain"] for d in tf[4:]] == ["Text embedding", "Text preprocessing"]
    assert hf[4]["api_call"] == "SentimentModel()" and hf[1]["example_code"] is None
    for hub in HUBS:
        with pytest.raises(RatuneError, match="no train file"):
            load_examples(apibench_tiny, hub, "train")


def test_huggingface_eval_parses_in_its_marker_layout(apibench_tiny):
    examples = load_examples(apibench_tiny, "huggingface", "eval")
    assert len(examples) == 6 and [e.line for e in examples] == [1, 2, 3, 4, 5, 6]
    assert {e.layout for e in examples} == {"hash_markers"}
    first = examples[0]
    assert first.instruction == ("Group our support tickets by how alike their sentences are; we need a vector "
                                 "for every sentence.")
    assert first.answer.domain == "Natural Language Processing Feature Extraction"
    assert first.answer.api_call == "AutoModel.from_pretrained('bert-base-cased')"
    assert first.answer.api_provider == "Hugging Face Transformers"
    assert first.answer.explanation == ("1. Import the loader.\n2. Load bert-base-cased with the call above and "
                                        "run it on the input.")
    assert first.answer.code == ("from transformers import AutoModel\n"
                                 "model = AutoModel.from_pretrained('bert-base-cased')")
    # line 3 keeps its ###Input part in the instruction
    assert examples[2].instruction == ("Shorten this news story to one sentence for our newsletter.\n###Input: The "
                                       "city council voted on Tuesday to open two new public libraries next spring.")
    # line 6's provider is its row's "provider" (the record's framework says "Hugging Face")
    assert examples[5].answer.api_provider == "Hugging Face"
    assert examples[5].api["api_name"] == "runwayml/stable-diffusion-v1-5"


def test_tensorflowhub_eval_parses_in_its_comma_layout(apibench_tiny):
    examples = load_examples(apibench_tiny, "tensorflowhub", "eval")
    assert len(examples) == 6
    assert [e.layout for e in examples] == ["hash_markers"] * 4 + ["hash_dict", "hash_markers"]
    first = examples[0]
    assert first.answer.api_call == f"hub.KerasLayer('{URL0}')"
    # the comma-separated markers: the explanation runs up to <<<code>>>, the code to the end
    assert first.answer.explanation == ("This call loads imagenet_mobilenet_v2_100_224_feature_vector "
                                        "from TensorFlow Hub.")
    assert first.answer.code == f"import tensorflow_hub as hub\nmodel = hub.KerasLayer('{URL0}')"
    # line 2's answer text says "image-feature-vector": the domain is the row's api_data.domain
    assert examples[1].answer.domain == "Image feature vector"
    # line 5 answers in free text: no explanation or code, the ###Input kept in the instruction
    free = examples[4]
    assert free.instruction == "Turn this sentence into a vector.\n###Input: My dog likes the park"
    assert (free.answer.explanation, free.answer.code) == ("", "")
    assert free.answer.api_call == f"hub.load('{USE}')" and free.answer.domain == "Text embedding"
    assert examples[5].answer.domain == "Text preprocessing"


@pytest.mark.parametrize("hub,ids", [("huggingface", [1, 3, 4, 5, 6]), ("tensorflowhub", [1, 2, 4, 5, 6])])
def test_question_and_response_files_skip_a_question_as_released(apibench_tiny, hub, ids):
    for setting in SETTINGS:
        rows = [json.loads(line) for line in
                (apibench_tiny / "questions" / f"questions_{hub}_{setting}.jsonl").read_text().splitlines()]
        assert [r["question_id"] for r in rows] == ids
        for model in ("FT", "RT"):
            assert [r["question_id"] for r in load_responses(_responses(apibench_tiny, hub, model, setting))] == ids


def test_question_texts_are_in_the_released_form(apibench_tiny):
    def texts(hub, setting):
        path = apibench_tiny / "questions" / f"questions_{hub}_{setting}.jsonl"
        return {r["question_id"]: r["text"] for r in map(json.loads, path.read_text().splitlines())}

    # the instruction's newline and the end of the question are a literal backslash-n
    assert texts("huggingface", "0_shot")[3] == (" Shorten this news story to one sentence for our newsletter.\\n"
                                                 "###Input: The city council voted on Tuesday to open two new "
                                                 "public libraries next spring.\\n")
    bm25 = texts("tensorflowhub", "bm25")[1]
    assert bm25.startswith(" Cluster our photos of street signs; I need a feature vector for every image.\\n \n"
                           " Use this API documentation for reference: [Document(page_content='{\\'domain\\': ")
    assert bm25.endswith("', metadata={})]")
    # the oracle document is the gold record as JSON with one more closing brace
    for hub, eval_file in (("huggingface", "huggingface_eval.json"), ("tensorflowhub", "tensorflow_eval.json")):
        lines = (apibench_tiny / "apibench" / eval_file).read_text().splitlines()
        gold = [json.loads(line)["api_data"] for line in lines]
        for qid, text in texts(hub, "oracle").items():
            document = text.split("Use this API documentation for reference:  ", 1)[1]
            assert document.endswith("}}") and json.loads(document[:-1]) == gold[qid - 1]


# (gorilla correct, hallucination, error), (strict correct, hallucination, error) of each file, by hand
# from make_apibench_tiny.HF_RESPONSES / TF_RESPONSES. n = 5 responses: the denominator is the file's
# responses, not the 6 eval questions (semantics §1).
#
# HuggingFace: questions 1, 3, 4, 5, 6 have gold APIs 0, 2, 3, 4, 5. Database lines (0-based):
# 0 AutoModel bert-base-cased, 1 AutoModel roberta-base (both Feature Extraction), 2 summarization
# pipeline (Summarization), 3 sentiment-analysis pipeline of distilbert...sst-2-english, 4
# SentimentModel() (both Text Classification), 5 StableDiffusionPipeline(sd-v1-5,
# torch_dtype=torch.float16) (Text-to-Image). The HuggingFace rules that decide:
#   [args]  gorilla keeps every positional argument and keyword value of a database call (semantics
#           §4) and finds them as substrings (§5): line 5 needs "torch.float16"; "...english-v2"
#           contains line 3's model id; line 4 has no argument, is skipped and never matches.
#   [fall]  gorilla: without a candidate keyed by the entry's function name, the last candidate is
#           searched (§5.3); for BertModel.from_pretrained(...) it is the attribute
#           "BertModel.from_pretrained", which holds no model id.
#   [names] strict: a from_pretrained call names its model id whatever the class; a pipeline with
#           a task names (task, model) and the model alone (so a known model with another task is an
#           error); SentimentModel() names its own text.
#   [text]  a text without "api_call" is parsed whole (TorchHub: error, unparsed); ours names no
#           model: hallucination in both.
#   FT 0_shot  [BertModel bert, 2, -v2, text, sd without dtype]: q1 h [fall] / c [names]; q3 c/c;
#              q4 c [args] / h; q5 h/h [text]; q6 h [args] / c            -> (2, 3, 0), (3, 2, 0)
#   FT bm25    [1, 2, 4, 4, 2]: q1 roberta for bert: c (same domain) / e; q3 c/c; q4 SentimentModel()
#              for the sst-2 pipeline: h [args] / e; q5 the same for its own question: h / c;
#              q6 summarization for text-to-image: e/e                    -> (2, 2, 1), (2, 0, 3)
#   FT gpt_index [0, 2, text-classification task, 3, sd without dtype]: q1 c/c; q3 c/c; q4 h (line 3
#              needs "sentiment-analysis") / e [names]; q5 sst-2 for the German question: c (same
#              domain) / e; q6 h/c                                       -> (3, 2, 0), (3, 0, 2)
#   FT oracle  [0, 2, text, 4, 5]: q1 c/c; q3 c/c; q4 h/h; q5 h/c; q6 c/c   -> (3, 2, 0), (4, 1, 0)
#   RT 0_shot  [1, 2, 3, 3, 5]: q1 c/e; q3, q4 c/c; q5 c/e; q6 c/c        -> (5, 0, 0), (3, 0, 2)
#   RT bm25    [1, 2, 4, 4, 5]: q1 c/e; q3 c/c; q4 h/e; q5 h/c; q6 c/c     -> (3, 2, 0), (3, 0, 2)
#   RT gpt_index [0, 2, 3, 3, sd without dtype]: q5 c/e; q6 h/c; others c/c -> (4, 1, 0), (4, 0, 1)
#   RT oracle  [0, 2, 3, 4, 5]: q5 h/c; others c/c                        -> (4, 1, 0), (5, 0, 0)
#
# TensorFlow Hub: questions 1, 2, 4, 5, 6 have gold APIs 0, 1, 3, 4, 5. Database lines: 0
# KerasLayer(URL0), 1 KerasLayer(URL1, output_shape=[1280]) (both Image feature vector), 2
# load(ssd) (Image object detection), 3 KerasLayer("URL3") in double quotes (Image
# classification), 4 and 5 load(USE) (Text embedding, then Text preprocessing). The rules:
#   [full]  gorilla keeps the full text of every argument (§4), only single quotes stripped: line 1
#           needs "output_shape=[1280]" verbatim, line 3 its double-quoted URL.
#   [first] gorilla: the first matching line decides the domain (§5.5): the USE call matches line
#           4, Text embedding, an error for question 6 (Text preprocessing); strict compares the
#           calls, which are identical: correct.
#   [loader] hub.KerasLayer and hub.load are different: KerasLayer(USE) matches nothing (h); strict:
#           the URL is a known API's: error.
#   [bare]  a bare URL string is the last candidate and holds line 0's URL: gorilla correct by the
#           fall-through; strict: no loader call, hallucination.
#   [cut]   "<<<api_call>>>:hub.load(...)" without a space loses its first letter (§2): "ub.load"
#           names nothing; a text without "api_call" is parsed whole: no URL, h/h.
#   [esc]   RT bm25 and gpt_index write the call's quotes as \' : the call node still holds the URL
#           for gorilla, and strict undoes the escapes.
#   FT 0_shot  [URL0 + input_shape, URL1 + "output_shape = [1280]", URL3 single-quoted, 4, 4]:
#              q1 c/c (extra arguments are ignored); q2 h [full] / c; q4 h [full] / c; q5 c/c;
#              q6 e [first] / c                                          -> (2, 2, 1), (5, 0, 0)
#   FT bm25    [text, 1, 3, 4, 4]: q1 h/h [cut]; q2, q4, q5 c/c; q6 e/c   -> (3, 1, 1), (4, 1, 0)
#   FT gpt_index [0, 0, 2, KerasLayer(USE), 5]: q1 c/c; q2 c (same domain) / e; q4 ssd for
#              inception: e/e; q5 h/e [loader]; q6 e/c                    -> (2, 1, 2), (2, 0, 3)
#   FT oracle  [bare URL0, 1, 3, 4, 5]: q1 c/h [bare]; q2, q4, q5 c/c; q6 e/c -> (4, 0, 1), (4, 1, 0)
#   RT 0_shot  [image_features, hub.model(...), text, no space, tf.keras.Sequential([Dense(1)])]:
#              nothing known                                             -> (0, 5, 0), (0, 5, 0)
#   RT bm25    [1, 1, 3, 4, 4] [esc]: q1 c/e; q2, q4, q5 c/c; q6 e/c     -> (4, 0, 1), (4, 0, 1)
#   RT gpt_index [0, 0, 2, 4, 5] [esc]: q1 c/c; q2 c/e; q4 e/e; q5 c/c; q6 e/c -> (3, 0, 2), (3, 0, 2)
#   RT oracle  [0, 1, 3, 4, 5]: q6 e/c; others c/c                        -> (4, 0, 1), (5, 0, 0)
SCORES = {
    ("huggingface", "FT", "0_shot"): ((2, 3, 0), (3, 2, 0)),
    ("huggingface", "FT", "bm25"): ((2, 2, 1), (2, 0, 3)),
    ("huggingface", "FT", "gpt_index"): ((3, 2, 0), (3, 0, 2)),
    ("huggingface", "FT", "oracle"): ((3, 2, 0), (4, 1, 0)),
    ("huggingface", "RT", "0_shot"): ((5, 0, 0), (3, 0, 2)),
    ("huggingface", "RT", "bm25"): ((3, 2, 0), (3, 0, 2)),
    ("huggingface", "RT", "gpt_index"): ((4, 1, 0), (4, 0, 1)),
    ("huggingface", "RT", "oracle"): ((4, 1, 0), (5, 0, 0)),
    ("tensorflowhub", "FT", "0_shot"): ((2, 2, 1), (5, 0, 0)),
    ("tensorflowhub", "FT", "bm25"): ((3, 1, 1), (4, 1, 0)),
    ("tensorflowhub", "FT", "gpt_index"): ((2, 1, 2), (2, 0, 3)),
    ("tensorflowhub", "FT", "oracle"): ((4, 0, 1), (4, 1, 0)),
    ("tensorflowhub", "RT", "0_shot"): ((0, 5, 0), (0, 5, 0)),
    ("tensorflowhub", "RT", "bm25"): ((4, 0, 1), (4, 0, 1)),
    ("tensorflowhub", "RT", "gpt_index"): ((3, 0, 2), (3, 0, 2)),
    ("tensorflowhub", "RT", "oracle"): ((4, 0, 1), (5, 0, 0)),
}


def _counts(block):
    return block["correct_n"], block["hallucination_n"], block["error_n"]


@pytest.mark.parametrize("hub,model,setting", sorted(SCORES))
def test_released_style_responses_score_as_worked_out(apibench_tiny, hub, model, setting):
    scorer = Scorer.from_apibench(hub, apibench_tiny)
    assert scorer.n_questions == 6
    result = scorer.score(load_responses(_responses(apibench_tiny, hub, model, setting), scorer.n_questions))
    assert result["n"] == 5
    assert (_counts(result["gorilla"]), _counts(result["strict"])) == SCORES[(hub, model, setting)]


def test_the_gorilla_metric_skips_the_huggingface_call_without_arguments(apibench_tiny):
    assert Scorer.from_apibench("huggingface", apibench_tiny).skipped_entries == [4]  # SentimentModel()
    assert Scorer.from_apibench("tensorflowhub", apibench_tiny).skipped_entries == []


# One response each where the hub's rule decides (see the tags above): the cut api_call, the database
# line the gorilla metric matches (0-based; None: none, a hallucination) and whether it matched through
# the fall-through, then both outcomes.
SD = "StableDiffusionPipeline.from_pretrained('runwayml/stable-diffusion-v1-5'"
CASES = [
    (("huggingface", "FT", "0_shot", 1), "BertModel.from_pretrained('bert-base-cased')",
     None, False, "hallucination", "correct"),  # [fall] / [names]
    (("huggingface", "FT", "0_shot", 4),
     "pipeline('sentiment-analysis', model='distilbert-base-uncased-finetuned-sst-2-english-v2')",
     3, False, "correct", "hallucination"),  # [args]: a substring of line 3's model id
    (("huggingface", "FT", "0_shot", 6), SD + ")", None, False, "hallucination", "correct"),  # no torch.float16
    (("huggingface", "FT", "oracle", 6), SD + ", torch_dtype=torch.float16)", 5, False, "correct", "correct"),
    (("huggingface", "FT", "bm25", 5), "SentimentModel()", None, False, "hallucination", "correct"),  # skipped
    (("huggingface", "FT", "gpt_index", 4),
     "pipeline('text-classification', model='distilbert-base-uncased-finetuned-sst-2-english')",
     None, False, "hallucination", "error"),  # the gold pipeline's task differs
    (("tensorflowhub", "FT", "0_shot", 2), f"hub.KerasLayer('{URL1}', output_shape = [1280])",
     None, False, "hallucination", "correct"),  # [full]
    (("tensorflowhub", "FT", "0_shot", 4),
     "hub.KerasLayer('https://tfhub.dev/google/imagenet/inception_v3/classification/5')",
     None, False, "hallucination", "correct"),  # [full]: the database writes "URL3"
    (("tensorflowhub", "FT", "0_shot", 6), f"hub.load('{USE}')", 4, False, "error", "correct"),  # [first]
    (("tensorflowhub", "FT", "gpt_index", 5), f"hub.KerasLayer('{USE}')", None, False, "hallucination", "error"),
    (("tensorflowhub", "FT", "oracle", 1), f"'{URL0}', <<", 0, True, "correct", "hallucination"),  # [bare]
    (("tensorflowhub", "RT", "0_shot", 5), f"ub.load('{USE}')", None, False, "hallucination", "hallucination"),
    (("tensorflowhub", "RT", "bm25", 1), f"hub.KerasLayer(\\'{URL1}\\', output_shape=[1280])",
     1, False, "correct", "error"),  # [esc]: line 1 is another Image feature vector API
]


@pytest.mark.parametrize("where,api_call,matched,fell_through,gorilla,strict", CASES,
                         ids=[f"{h}-{m}-{s}-q{q}" for (h, m, s, q), *_ in CASES])
def test_where_the_hubs_rule_decides(apibench_tiny, where, api_call, matched, fell_through, gorilla, strict):
    hub, model, setting, qid = where
    scorer = Scorer.from_apibench(hub, apibench_tiny)
    text = next(r["text"] for r in load_responses(_responses(apibench_tiny, hub, model, setting))
                if r["question_id"] == qid)
    result = scorer.score_text(text, qid)
    assert (result.api_call, result.matched_index, result.gorilla, result.strict) == (api_call, matched, gorilla,
                                                                                       strict)
    assert scorer.gorilla_match(api_call) == (matched, fell_through)


def test_a_text_without_the_marker_is_parsed_on_these_hubs_only(apibench_tiny):
    # HuggingFace FT oracle question 4 answers in free text (no "api_call"): HuggingFace and TensorFlow
    # Hub parse it whole and find no API (hallucination); TorchHub scores it error without parsing.
    text = next(r["text"] for r in load_responses(_responses(apibench_tiny, "huggingface", "FT", "oracle"))
                if r["question_id"] == 4)
    assert "api_call" not in text
    assert extract_api_call(text, "huggingface") == extract_api_call(text, "tensorflowhub") == text
    assert extract_api_call(text, "torchhub") is None
    for hub, outcome in (("huggingface", "hallucination"), ("tensorflowhub", "hallucination"), ("torchhub", "error")):
        score = Scorer.from_apibench(hub, apibench_tiny).score_text(text, 4)
        assert (score.gorilla, score.strict) == (outcome, outcome)


@pytest.mark.parametrize("hub,model,setting", [("huggingface", "FT", "0_shot"), ("tensorflowhub", "FT", "gpt_index")])
def test_ratune_eval_score_json(apibench_tiny, capsys, hub, model, setting):
    path = _responses(apibench_tiny, hub, model, setting)
    assert main(["eval", "score", "--hub", hub, "--responses", str(path), "--apibench", str(apibench_tiny),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["hub"], out["n"]) == (hub, 5) and "per_question" not in out
    assert (_counts(out["gorilla"]), _counts(out["strict"])) == SCORES[(hub, model, setting)]
    gorilla_correct = SCORES[(hub, model, setting)][0][0]
    assert out["gorilla"]["accuracy"] == pytest.approx(gorilla_correct / 5)  # 2/5 both


def test_ratune_eval_score_refuses_the_other_hubs_file(apibench_tiny, capsys):
    # HuggingFace FT 0_shot: q1 and q6 call a from_pretrained, q3 and q4 a pipeline, q5 is free text:
    # 4 of 5 responses call HuggingFace's loader and none TensorFlow Hub's (at least 3, and a majority)
    path = _responses(apibench_tiny, "huggingface", "FT", "0_shot")
    assert main(["eval", "score", "--hub", "tensorflowhub", "--responses", str(path),
                 "--apibench", str(apibench_tiny), "--json"]) == 2
    err = capsys.readouterr().err
    assert ("this looks like a huggingface response file, not tensorflowhub: 4 of 5 responses call "
            "huggingface's loader, 0 call tensorflowhub's") in err


def test_ft_against_rt_at_0_shot_is_paired_over_the_five_questions(apibench_tiny):
    result = compare_files(_responses(apibench_tiny, "tensorflowhub", "FT", "0_shot"),
                           _responses(apibench_tiny, "tensorflowhub", "RT", "0_shot"),
                           hub="tensorflowhub", apibench_dir=apibench_tiny, metric="strict")
    # strict: FT right on all 5 questions, RT on none: 5 discordant, all FT's; exact McNemar
    # p = 2 x (1/2)^5 = 0.0625; difference 5/5
    assert result["n"] == 5
    assert (result["contingency"]["only_a"], result["contingency"]["only_b"]) == (5, 0)
    assert result["mcnemar_p"] == pytest.approx(0.0625)
    assert result["difference"]["value"] == pytest.approx(1.0)


# The paper's documents (make_apibench_tiny.{HF,TF}_PAPER_{BM25,GPT_INDEX}) mapped back to database
# records, for question ids 1-6: the question the files skip gets no document (None). HuggingFace
# gpt_index question 6's document has the paper's older call (no torch_dtype): it maps back by its
# api_name, to the record with the released call. TensorFlow Hub's two universal-sentence-encoder
# records share one call, so a document of either maps to the first (Text embedding).
HF_NAMES = ["bert-base-cased", "roberta-base", "facebook/bart-large-cnn",
            "distilbert-base-uncased-finetuned-sst-2-english", "oliverguhr/german-sentiment-bert",
            "runwayml/stable-diffusion-v1-5"]
TF_NAMES = ["imagenet_mobilenet_v2_100_224_feature_vector", "tf2-preview_mobilenet_v2_feature_vector",
            "ssd_mobilenet_v2", "inception_v3", "universal-sentence-encoder", "universal-sentence-encoder"]
RETRIEVED = [
    # hub, retriever, API index per question id 1-6, mapped by name, top-1 (gold API identity; q2 / q3
    # count as misses), the missed question ids
    ("huggingface", "gpt_index", [0, None, 2, 3, 3, 5], 1, 4 / 6, [2, 5]),
    ("huggingface", "released_bm25", [1, None, 2, 4, 4, 2], 0, 2 / 6, [1, 2, 4, 6]),
    # q6's document is record 5's call = record 4's: a hit for the gold API 5
    ("tensorflowhub", "gpt_index", [0, 0, None, 2, 4, 4], 0, 3 / 6, [2, 3, 4]),
    ("tensorflowhub", "released_bm25", [1, 1, None, 3, 4, 4], 0, 4 / 6, [1, 3]),
]


@pytest.mark.parametrize("hub,name,apis,by_name,top1,misses", RETRIEVED, ids=[f"{r[0]}-{r[1]}" for r in RETRIEVED])
def test_the_papers_documents_map_back_to_database_records(apibench_tiny, hub, name, apis, by_name, top1, misses):
    retriever = make_retriever(name, hub=hub, apibench_dir=apibench_tiny)
    got = retriever.retrieve([Query(text="ignored", question_id=q) for q in range(1, 7)])
    names = HF_NAMES if hub == "huggingface" else TF_NAMES
    assert [docs[0]["api_name"] if docs else None for docs in got] == [None if i is None else names[i] for i in apis]
    assert (retriever.metadata()["mapped_by_name"], retriever.metadata()["unmapped"]) == (by_name, 0)
    database = load_api_database(apibench_tiny / "api" / f"{hub}_api.jsonl")
    assert [docs[0] if docs else None for docs in got] == [None if i is None else database[i] for i in apis]
    result = evaluate_retriever(retriever, load_examples(apibench_tiny, hub, "eval"))
    assert result["n"] == 6 and result["top1"] == pytest.approx(top1)
    assert [m["question_id"] for m in result["misses"]] == misses


def test_the_older_huggingface_call_maps_to_the_released_record(apibench_tiny):
    retriever = make_retriever("gpt_index", hub="huggingface", apibench_dir=apibench_tiny)
    assert retriever.mapped_by_name == [6]
    assert retriever.by_question[6]["api_call"] == ("StableDiffusionPipeline.from_pretrained("
                                                    "'runwayml/stable-diffusion-v1-5', torch_dtype=torch.float16)")
    # TensorFlow Hub bm25 question 5's document is record 5 (Text preprocessing); it maps to record 4
    tf = make_retriever("released_bm25", hub="tensorflowhub", apibench_dir=apibench_tiny)
    assert tf.by_question[5]["domain"] == "Text embedding"
