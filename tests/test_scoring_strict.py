"""The strict metric: correct only when the extracted call names the question's own gold API.

Each rule (docs/scoring.md) is checked with real eval rows; question ids are 1-based lines of
the hub's eval file, whose api_data.api_call is quoted in each comment.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from ratune.data.apibench import resolve_apibench_dir
from ratune.eval.scoring import Scorer, load_responses, normalize_call

APIBENCH = resolve_apibench_dir(None)


@lru_cache(maxsize=None)
def scorer(hub: str) -> Scorer:
    return Scorer.from_apibench(hub, APIBENCH)


def strict(hub: str, call: str, question_id: int) -> str:
    marker = {"torchhub": "api_call: {} api_provider",
              "huggingface": "<<<api_call>>>: {}\n<<<api_provider>>>: Hugging Face Transformers",
              "tensorflowhub": "<<<api_call>>>: {}, <<<api_provider>>>: TensorFlow Hub"}[hub]
    return scorer(hub).score_text(marker.format(call), question_id).strict


# TorchHub. q1: repo_or_dir='facebookresearch/pytorchvideo', model='slow_r50'.
# q132: pytorch/vision alexnet. q36: NVIDIA/DeepLearningExamples:torchhub nvidia_ssd.
# q16: ('szq0214/MEAL-V2', 'meal_v2', model='mealv2_resnest50_380x380'). q35: pytorch/fairseq only.
@pytest.mark.parametrize("call,qid,want", [
    ("torch.hub.load('facebookresearch/pytorchvideo', 'slow_r50', pretrained=True)", 1, "correct"),
    ("torch.hub.load(repo_or_dir='facebookresearch/pytorchvideo', model='slow_r50')", 1, "correct"),
    ("torch.hub.load(model='slow_r50', repo_or_dir='facebookresearch/pytorchvideo')", 1, "correct"),
    ('torch.hub.load("facebookresearch/pytorchvideo", "slow_r50")', 1, "correct"),
    ("model = torch.hub.load('facebookresearch/pytorchvideo', 'slow_r50')", 1, "correct"),
    # the :ref tag is ignored on both sides
    ("torch.hub.load('pytorch/vision:v0.10.0', 'alexnet', pretrained=True)", 132, "correct"),
    ("torch.hub.load('NVIDIA/DeepLearningExamples:torchhub', 'nvidia_ssd')", 36, "correct"),
    ("torch.hub.load('NVIDIA/DeepLearningExamples', 'nvidia_ssd')", 36, "correct"),
    # the last positional string names the model (MEAL-V2's variant)
    ("torch.hub.load('szq0214/MEAL-V2', 'meal_v2', 'mealv2_resnest50_380x380', pretrained=True)", 16, "correct"),
    ("torch.hub.load('szq0214/MEAL-V2', 'meal_v2', 'mealv2_resnest50', pretrained=True)", 16, "error"),
    # a repo-only gold entry is named by any call on that repo
    ("torch.hub.load('pytorch/fairseq', 'transformer.wmt19.en-de')", 35, "correct"),
    # another database API (domain-equal under gorilla) is an error
    ("torch.hub.load('pytorch/vision', 'alexnet', pretrained=True)", 1, "error"),
    ("torch.hub.load('pytorch/vision', 'wide_resnet50_2', pretrained=True)", 132, "error"),
    # nothing the database knows
    ("torch.hub.load('pytorch/vision', 'resnet9000')", 132, "hallucination"),
    ("torch.hub.load('facebookresearch/pytorchvideo')", 1, "hallucination"),
    ("torch.load('facebookresearch/pytorchvideo', 'slow_r50')", 1, "hallucination"),
    ("hub.load('facebookresearch/pytorchvideo', 'slow_r50')", 1, "hallucination"),
])
def test_torchhub_rules(call, qid, want):
    assert strict("torchhub", call, qid) == want


# HuggingFace. q1: AutoModel.from_pretrained('princeton-nlp/unsup-simcse-roberta-base').
# q347: pipeline('text-to-image', model='prompthero/openjourney-v4'). q39: pipeline(model=
# 'martin-ha/toxic-comment-model') (no task). q303: pipeline('text-generation',
# 'PygmalionAI/pygmalion-1.3b'). q527: ./run.sh ... mio/amadeus (a shell line).
@pytest.mark.parametrize("call,qid,want", [
    ("AutoModel.from_pretrained('princeton-nlp/unsup-simcse-roberta-base')", 1, "correct"),
    ("RobertaModel.from_pretrained('princeton-nlp/unsup-simcse-roberta-base')", 1, "correct"),
    ("AutoModel.from_pretrained(pretrained_model_name_or_path='princeton-nlp/unsup-simcse-roberta-base')", 1, "correct"),
    ("pipeline('feature-extraction', model='princeton-nlp/unsup-simcse-roberta-base')", 1, "correct"),
    ("AutoModel.from_pretrained('YituTech/conv-bert-base')", 1, "error"),
    ("AutoModel.from_pretrained('princeton-nlp/not-a-model')", 1, "hallucination"),
    ("AutoModel.from_pretrained()", 1, "hallucination"),
    ("pipeline('text-to-image', model='prompthero/openjourney-v4')", 347, "correct"),
    ("pipeline(task='text-to-image', model='prompthero/openjourney-v4')", 347, "correct"),
    # the gold is a pipeline with a task: the task is part of the identity
    ("pipeline('image-to-image', model='prompthero/openjourney-v4')", 347, "error"),
    ("StableDiffusionPipeline.from_pretrained('prompthero/openjourney-v4')", 347, "error"),
    ("pipeline('text-to-image', model='prompthero/openjourney-v5')", 347, "hallucination"),
    # the gold pipeline has no task: the model id alone names it
    ("pipeline('text-classification', model='martin-ha/toxic-comment-model')", 39, "correct"),
    ("pipeline('text-generation', model='PygmalionAI/pygmalion-1.3b')", 303, "correct"),
    ("pipeline('text-generation', 'PygmalionAI/pygmalion-1.3b')", 303, "correct"),
    ("./run.sh --skip_data_prep false --skip_train true --download_model mio/amadeus", 527, "correct"),
])
def test_huggingface_rules(call, qid, want):
    assert strict("huggingface", call, qid) == want


def test_huggingface_prose_mentions_before_the_call():
    # Real FT/oracle question 257: the prose names 'AutoModel.from_pretrained()' before the code.
    responses = {r["question_id"]: r for r in load_responses(
        APIBENCH / "responses" / "response_huggingface_Gorilla_FT_oracle.jsonl")}
    text = responses[257]["text"]
    assert "api_call" not in text and "'AutoModel.from_pretrained()'" in text
    assert scorer("huggingface").score_text(text, 257).strict == "correct"


# TensorFlow Hub. q1: hub.KerasLayer('.../mobilenet_v2_100_224/feature_vector/4').
# q6: hub.load('https://tfhub.dev/tensorflow/ssd_mobilenet_v2/2'). q228: tf.keras.Sequential(
# [hub.KerasLayer('https://tfhub.dev/google/tf2-preview/mobilenet_v2/classification/4')]).
# q113 writes its URL in double quotes.
URL1 = "https://tfhub.dev/google/imagenet/mobilenet_v2_100_224/feature_vector/4"


@pytest.mark.parametrize("call,qid,want", [
    (f"hub.KerasLayer('{URL1}')", 1, "correct"),
    (f"hub.KerasLayer('{URL1}', input_shape=[224, 224, 3], trainable=False)", 1, "correct"),
    (f"hub.KerasLayer(handle='{URL1}', output_shape = [1280])", 1, "correct"),
    (f'hub.KerasLayer("{URL1}")', 1, "correct"),
    (f"hub.KerasLayer('{URL1}/')", 1, "correct"),
    (f"model = tf.keras.Sequential([hub.KerasLayer('{URL1}')])", 1, "correct"),
    (f"hub.KerasLayer('{URL1}')", 113, "correct"),
    ("hub.KerasLayer('https://tfhub.dev/google/tf2-preview/mobilenet_v2/classification/4')", 228, "correct"),
    # the loader is part of the identity: a known handle with the other loader is an error
    (f"hub.load('{URL1}')", 1, "error"),
    ("hub.KerasLayer('https://tfhub.dev/tensorflow/ssd_mobilenet_v2/2')", 6, "error"),
    ("hub.load('https://tfhub.dev/tensorflow/ssd_mobilenet_v2/2')", 6, "correct"),
    ("hub.load('https://tfhub.dev/google/universal-sentence-encoder/4')", 6, "error"),
    ("hub.load('https://tfhub.dev/tensorflow/ssd_mobilenet_v2/99')", 6, "hallucination"),
    # another known API (gorilla: hallucination, its entry wants output_shape=[1280] verbatim)
    ("hub.KerasLayer('https://tfhub.dev/google/tf2-preview/mobilenet_v2/feature_vector/4', "
     "output_shape = [1280])", 1, "error"),
    (f"'{URL1}'", 1, "hallucination"),  # a bare URL names no call
    (f"ub.KerasLayer('{URL1}')", 1, "hallucination"),  # extraction lost the first character
])
def test_tensorflowhub_rules(call, qid, want):
    assert strict("tensorflowhub", call, qid) == want


def test_escaped_quotes_are_undone():
    # TorchHub FT responses quote the call with escaped quotes inside the text.
    raw = "\\\"model = torch.hub.load(\\'pytorch/vision\\', \\'alexnet\\', pretrained=True)"
    assert normalize_call(raw) == "model = torch.hub.load('pytorch/vision', 'alexnet', pretrained=True)"
    text = "{'domain': 'Classification', 'api_call': " + raw + "\\\", 'api_provider': 'PyTorch'}"
    result = scorer("torchhub").score_text(text, 132)
    assert (result.gorilla, result.strict) == ("correct", "correct")


def test_strict_counts_released_torchhub():
    # Regression values of our own metric on the released TorchHub files (docs/scoring.md).
    want = {("FT", "0_shot"): (18, 14, 154), ("FT", "oracle"): (144, 18, 24),
            ("RT", "0_shot"): (0, 0, 186), ("RT", "oracle"): (182, 0, 4)}
    sc = scorer("torchhub")
    for (mode, setting), expected in want.items():
        path = APIBENCH / "responses" / f"response_torchhub_Gorilla_{mode}_{setting}.jsonl"
        block = sc.score(load_responses(path, sc.n_questions))["strict"]
        assert (block["correct_n"], block["hallucination_n"], block["error_n"]) == expected


def test_strict_never_exceeds_exact_gold_naming():
    # Every strict-correct TorchHub FT/0_shot answer names the gold repo and model.
    sc = scorer("torchhub")
    path = APIBENCH / "responses" / "response_torchhub_Gorilla_FT_0_shot.jsonl"
    for response in load_responses(path):
        result = sc.score_text(response["text"], response["question_id"])
        if result.strict == "correct":
            gold = sc.eval_api_data[response["question_id"] - 1]["api_call"]
            repo = gold.split("repo_or_dir='")[1].split("'")[0].split(":")[0]
            assert repo in result.api_call
            if "model='" in gold:
                assert gold.split("model='")[1].split("'")[0] in result.api_call
