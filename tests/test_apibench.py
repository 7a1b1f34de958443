"""APIBench parsing on the real files: counts, the three code layouts, errors with file:line:field."""

from __future__ import annotations

import json

import pytest

from ratune.sources.apibench import (api_database_path, api_identity, load_api_database, load_examples,
                                  parse_code, ParseReport)
from ratune.errors import InputError


@pytest.mark.parametrize("hub,split,n", [("torchhub", "train", 837), ("torchhub", "eval", 186),
                                         ("huggingface", "eval", 911), ("tensorflowhub", "eval", 688)])
def test_every_row_parses(apibench, hub, split, n):
    examples = load_examples(apibench, hub, split)
    assert len(examples) == n
    assert [e.line for e in examples] == list(range(1, n + 1))
    assert all(e.instruction and e.answer.api_call and e.answer.domain for e in examples)


@pytest.mark.parametrize("hub,n", [("torchhub", 94), ("huggingface", 936), ("tensorflowhub", 696)])
def test_api_databases(apibench, hub, n):
    assert len(load_api_database(api_database_path(apibench, hub))) == n


def test_layout_pseudo_dict_real_row(apibench):
    ex = load_examples(apibench, "torchhub", "train")[0]
    assert ex.layout == "pseudo_dict"
    assert ex.instruction == ("I need an API that can estimate the relative depth of objects from a single image. "
                              "The output should be an inverse depth map.")
    assert ex.answer.explanation == ("Load the pretrained MiDaS model for estimating relative depth from a single "
                                     "image, which outputs an inverse depth map.")
    assert ex.answer.code == 'import torch\nmodel = torch.hub.load("intel-isl/MiDaS", "DPT_Hybrid", pretrained=True)'
    assert ex.answer.api_call == "torch.hub.load(repo_or_dir='intel-isl/MiDaS', model='DPT_Hybrid', pretrained=True)"
    assert ex.answer.api_provider == "PyTorch"


def test_layout_hash_dict_real_row(apibench):
    ex = load_examples(apibench, "torchhub", "eval")[0]
    assert ex.layout == "hash_dict"
    assert ex.instruction == "What is an API that can be used to classify sports activities in videos?"
    assert ex.answer.domain == "Video Classification"
    assert ex.answer.code == ("import torch\nmodel = torch.hub.load('facebookresearch/pytorchvideo', 'slow_r50', "
                              "pretrained=True)")
    # a row with an ###Input part keeps it in the instruction, as the paper's question files do
    ex57 = load_examples(apibench, "torchhub", "eval")[56]
    assert ex57.instruction == ('Translate the given English text to French using machine learning API.\n'
                                '###Input: {"text": "I like playing basketball."}')


def test_layout_hash_markers_real_row(apibench):
    ex = load_examples(apibench, "huggingface", "eval")[0]
    assert ex.layout == "hash_markers"
    assert ex.answer.domain == "Natural Language Processing Sentence Similarity"
    assert ex.answer.api_call == "AutoModel.from_pretrained('princeton-nlp/unsup-simcse-roberta-base')"
    assert ex.answer.explanation.startswith("1. We first import the necessary classes")
    assert ex.answer.code.startswith("from transformers import AutoTokenizer, AutoModel\n")


def test_instruction_with_quotes_braces_and_markers():
    code = ("###Instruction: Say \"hi\" {x}: with '###Output' and <<<api_call>>> inside\n"
            "###Output: <<<domain>>>: D\n<<<api_call>>>: f('a')\n<<<api_provider>>>: P\n"
            "<<<explanation>>>: E\n<<<code>>>: C")
    layout, instruction, fields = parse_code(code)
    assert layout == "hash_markers"
    assert instruction == "Say \"hi\" {x}: with '###Output' and <<<api_call>>> inside"
    assert fields == {"domain": "D", "api_call": "f('a')", "api_provider": "P", "explanation": "E", "code": "C"}


def _write(tmp_path, rows):
    folder = tmp_path / "apibench"
    (folder / "apibench").mkdir(parents=True)
    (folder / "api").mkdir()
    path = folder / "apibench" / "torchhub_eval.json"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return folder, path


GOOD = {"code": "###Instruction: do x\n###Output: {'domain': 'D', 'api_call': 'f()'}", "api_call": "f()",
        "provider": "P", "api_data": {"domain": "D", "api_call": "f()"}}


def test_missing_field_names_file_line_field(tmp_path):
    bad = dict(GOOD)
    del bad["api_data"]
    folder, path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(InputError) as err:
        load_examples(folder, "torchhub", "eval")
    assert str(err.value) == f"{path}:2: field 'api_data': required field is missing"


def test_no_instruction_marker_is_an_error(tmp_path):
    folder, path = _write(tmp_path, [dict(GOOD, code="just some text")])
    with pytest.raises(InputError, match=r"torchhub_eval.json:1: field 'code': no instruction marker"):
        load_examples(folder, "torchhub", "eval")


def test_truncated_last_line_and_lenient_rejects(tmp_path):
    folder, path = _write(tmp_path, [GOOD, "", json.dumps(GOOD)[:40]])
    with pytest.raises(InputError, match=r"torchhub_eval.json:3: not a JSON object"):
        load_examples(folder, "torchhub", "eval")
    report = ParseReport()
    examples = load_examples(folder, "torchhub", "eval", lenient=True, report=report)
    assert len(examples) == 1 and len(report.rejects) == 1 and report.rejects[0][1] == 3


def test_api_identity_ignores_whitespace():
    assert api_identity({"api_call": "f(a, b)"}) == api_identity({"api_call": "f(a,b)"}) == "f(a,b)"
