"""The ``tool_calls`` answer format: the chat template's own tool calling (``tools=``, assistant
``tool_calls``), the registered ``chatml_tools`` template for tokenizers without it, answers read
back by a transformers ``response_template``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratune.errors import RatuneError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tools"

WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class _Row:
    """What the format reads of an example."""

    def __init__(self, instruction, calls, system=None):
        self.instruction, self.calls, self.system = instruction, tuple(calls), system


@pytest.fixture
def tools_tokenizer(smol_tokenizer_dir):
    from ratune.models import load_tokenizer
    from ratune.sources.prompt import use_chat_template

    return use_chat_template(load_tokenizer(smol_tokenizer_dir), "chatml_tools")


def test_chatml_tools_writes_the_tool_list_and_one_tag_per_call(tools_tokenizer):
    from ratune.sources.formats import get_answer_format
    from ratune.sources.prompt import prompt_text

    fmt = get_answer_format("tool_calls")
    row = _Row("Weather in Paris and in Rome?", [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                 {"name": "get_weather", "arguments": {"city": "Rome"}}])
    prompt = fmt.prompt(row, [WEATHER])
    assert prompt.tools == ({"type": "function", "function": WEATHER},) and prompt.system is None
    assert prompt_text(tools_tokenizer, prompt.user_turn, prompt.system, prompt.tools) == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
        "\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris and in Rome?<|im_end|>\n<|im_start|>assistant\n")
    assert fmt.completion(row, tokenizer=tools_tokenizer, prompt=prompt) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    # no call (and an irrelevant mixture row): the text answer
    assert fmt.completion(_Row("Hi", []), tokenizer=tools_tokenizer, prompt=prompt) == fmt.no_call
    assert fmt.completion(row, abstain=True, tokenizer=tools_tokenizer, prompt=prompt) == fmt.no_call
    # a row's own system message comes first in the system turn
    with_system = fmt.prompt(_Row("Hi", [], system="You call tools."), [WEATHER])
    assert prompt_text(tools_tokenizer, "Hi", with_system.system, with_system.tools).startswith(
        "<|im_start|>system\nYou call tools.\n\n# Tools\n")
    # without tools: plain ChatML
    assert prompt_text(tools_tokenizer, "Hi", None, ()) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_answers_read_back_into_the_calls_they_were_written_from(tools_tokenizer):
    from ratune.sources.formats import get_answer_format

    fmt = get_answer_format("tool_calls")
    calls = [{"name": "pkg.search", "arguments": {"q": "café ☕", "n": 3, "f": 0.5, "ok": True, "none": None,
                                                  "tags": ["a", "b"], "opts": {"deep": {"x": [1, 2]}}}},
             {"name": "get_weather", "arguments": {}}]
    row = _Row("Search", calls)
    prompt = fmt.prompt(row, [WEATHER])
    reader = fmt.reading(tools_tokenizer)
    assert reader.parse_calls(fmt.completion(row, tokenizer=tools_tokenizer, prompt=prompt)) == calls
    assert reader.parse_calls(fmt.no_call) == []  # a text answer calls nothing
    assert reader.parse_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1</tool_call>') is None  # bad JSON
    assert reader.parse_calls('<tool_call>\n{"arguments": {}}\n</tool_call>') is None  # no name
    assert reader.parse_calls('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>') is None
    assert reader.parse_calls('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 2}"}\n</tool_call>') == [
        {"name": "f", "arguments": {"a": 2}}]  # arguments written as a JSON string
    assert reader.parser_record().keys() == {"transformers_parse_response"}


def test_a_template_without_tool_calling_is_refused_in_one_line(smol_tokenizer_dir):
    from ratune.models import load_tokenizer
    from ratune.sources.formats import get_answer_format
    from ratune.sources.prompt import use_chat_template

    fmt = get_answer_format("tool_calls")
    own = load_tokenizer(smol_tokenizer_dir)  # SmolLM2's own template ignores tools=
    with pytest.raises(RatuneError, match=r"own chat template ignores tools=: the tool_calls answer format needs a "
                                          r"template with tool calling; build with --chat-template chatml_tools$"):
        fmt.check_tokenizer(own)
    with pytest.raises(RatuneError, match="^chat template chatml ignores tools="):
        fmt.check_tokenizer(use_chat_template(load_tokenizer(smol_tokenizer_dir), "chatml"))
    with pytest.raises(RatuneError, match="has none; use --chat-template chatml_tools"):
        fmt.reading(own)


#: A tokenizer's own tool-calling template of another layout (Mistral's: ``[TOOL_CALLS]`` and a JSON
#: list of calls) and the response template that reads it: the general path, no registry template.
OWN_TEMPLATE = (
    "{%- if tools -%}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}{{- '[TOOL_CALLS]' -}}"
    "{{- '[' -}}{%- for c in m['tool_calls'] -%}"
    "{{- '{\"name\": ' + (c['function']['name'] | tojson) + ', \"arguments\": ' + (c['function']['arguments'] | tojson)"
    " + '}' + ('' if loop.last else ', ') -}}"
    "{%- endfor -%}{{- ']' + eos_token -}}"
    "{%- else -%}{{- '[INST]' + m['content'] + '[/INST]' -}}{%- endif -%}"
    "{%- endfor -%}")
OWN_RESPONSE = {"start_anchor": "[/INST]", "fields": {
    "tool_calls": {"open": "[TOOL_CALLS]", "content": "json", "transform_each": True,
                   "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}}}}}


def test_the_tokenizers_own_tool_template_is_used_as_it_is(smol_tokenizer_dir):
    from ratune.data.labels import tokenize_row
    from ratune.models import load_tokenizer
    from ratune.sources.formats import get_answer_format

    tokenizer = load_tokenizer(smol_tokenizer_dir)
    tokenizer.chat_template, tokenizer.response_template = OWN_TEMPLATE, OWN_RESPONSE
    fmt = get_answer_format("tool_calls")
    fmt.check_tokenizer(tokenizer)
    row = _Row("Weather in Oslo?", [{"name": "get_weather", "arguments": {"city": "Oslo"}}])
    prompt = fmt.prompt(row, [WEATHER])
    completion = fmt.completion(row, tokenizer=tokenizer, prompt=prompt)
    assert completion == '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    tokenized = tokenize_row(tokenizer, prompt.user_turn, completion, tools=prompt.tools)
    answer = [t for t, m in zip(tokenized.input_ids, tokenized.completion_mask) if m]
    assert tokenizer.decode(answer) == completion + tokenizer.eos_token
    assert fmt.reading(tokenizer).parse_calls(completion) == list(row.calls)


def _tool_set(rows_file_dir: Path) -> Path:
    from ratune.sources.toolset import import_tool_set

    rows = rows_file_dir / "rows.jsonl"
    rows.write_text((FIXTURES / "xlam_rows.jsonl").read_text() + (FIXTURES / "chat_rows.jsonl").read_text())
    import_tool_set(rows_file_dir / "ts", rows_file=rows, eval_fraction=0.999)
    return rows_file_dir / "ts"


def test_data_build_writes_tool_calls_rows_whose_loss_is_the_answer(tmp_path, tools_tokenizer, smol_tokenizer):
    from datasets import load_from_disk

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.data.labels import tokenize_built_row

    folder = _tool_set(tmp_path)
    manifest = build_dataset(hub=str(folder), out_dir=tmp_path / "data", tokenizer=tools_tokenizer,
                             tokenizer_name="smol", modes=["oracle"], progress=False, leakage="allow",
                             settings=BuildSettings(max_length=1024, answer_format="tool_calls"))
    assert manifest["answer_format"] == "tool_calls" and manifest["settings"]["answer_format"] == "tool_calls"
    assert manifest["settings"]["chat_template"] == "chatml_tools"
    rows = load_from_disk(str(tmp_path / "data" / "oracle"))["eval"]
    convert = rows[1]
    schema = json.loads((FIXTURES / "xlam_rows.jsonl").read_text().splitlines()[1])["tools"][0]
    assert json.loads(convert["tools"]) == [{"type": "function", "function": schema}]
    assert convert["completion"] == (
        '<tool_call>\n{"name": "convert", "arguments": {"amount": 10, "to": "EUR"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "convert", "arguments": {"amount": 10, "to": "JPY"}}\n</tool_call>')
    assert rows[2]["completion"] == "None of the given functions can be used."  # a row that calls nothing
    tokenized = tokenize_built_row(tools_tokenizer, convert)
    answer = [t for t, m in zip(tokenized.input_ids, tokenized.completion_mask) if m]
    assert tools_tokenizer.decode(answer) == convert["completion"] + "<|im_end|>"
    assert tokenized.n_prompt_tokens == convert["n_prompt_tokens"]
    # the tokenizer's own template ignores tools: refused before anything is written
    with pytest.raises(RatuneError, match="ignores tools=.*--chat-template chatml_tools"):
        build_dataset(hub=str(folder), out_dir=tmp_path / "refused", tokenizer=smol_tokenizer, tokenizer_name="smol",
                      modes=["oracle"], progress=False, settings=BuildSettings(answer_format="tool_calls"))
    assert not (tmp_path / "refused").exists()


def test_a_hub_refuses_a_format_its_examples_cannot_be_written_in(tmp_path, apibench_tiny, tools_tokenizer):
    from ratune.data.build import BuildSettings, build_dataset

    with pytest.raises(RatuneError, match=r"^--answer-format tool_calls: hub torchhub \(apibench\) writes its rows "
                                          r"as apibench$"):
        build_dataset(apibench_dir=apibench_tiny, hub="torchhub", out_dir=tmp_path / "d", tokenizer=tools_tokenizer,
                      tokenizer_name="smol", modes=["none"], progress=False,
                      settings=BuildSettings(answer_format="tool_calls"))


def test_the_tool_set_scorer_reads_tool_calls_answers(tmp_path, tools_tokenizer):
    from ratune.eval.hub_scoring import scoring_for
    from ratune.hubs import resolve_hub
    from ratune.sources.formats import get_answer_format

    folder = _tool_set(tmp_path)
    scoring = scoring_for(resolve_hub(str(folder)), answer_format=get_answer_format("tool_calls").reading(tools_tokenizer))

    def tag(name, arguments):
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    answers = {
        1: tag("get_weather", {"unit": "celsius", "city": "Paris"}),  # correct
        2: tag("convert", {"to": "JPY", "amount": 10.0}) + "\n" + tag("convert", {"amount": 10, "to": "EUR"}),
        3: tag("send_email", {"to": "x"}),  # hallucination
        4: '<tool_call>\n{"name": "book_table", "arguments": {"people": 2</tool_call>',  # does not decode: error
        5: "None of the given functions can be used.",  # row 5 calls nothing: correct
    }
    scored = scoring.score([{"question_id": q, "text": t} for q, t in answers.items()])
    # rows 1, 2 and 4 call tools (1 and 2 answered right); rows 3 and 5 call nothing (5 answered right)
    assert scored["strict"] == {"accuracy": 0.6, "hallucination": 0.2, "error": 0.2, "correct_n": 3,
                                "hallucination_n": 1, "error_n": 1}
    assert scored["calls"] == {"format_adherence": 0.8, "call_rate": 0.6, "decoded_n": 4, "calling_n": 3,
                               "by_answer": {"call": {"n": 3, "correct_n": 2}, "no_call": {"n": 2, "correct_n": 1}}}
    assert scored["parser"].keys() == {"transformers_parse_response"}


def test_eval_run_writes_tool_calls_prompts_and_scores_them(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from ratune.eval.run import EvalSettings, evaluate_checkpoint

    folder = _tool_set(tmp_path)
    asked, seen = [], {}
    answer = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'

    def fake(backend, model, tokenizer, prompts, **kw):
        seen.update(kw)
        asked.extend(tokenizer.decode(ids) for ids in prompts)
        return [[(j, answer) for j in range(len(prompts))]]

    monkeypatch.setattr("ratune.eval.run.backend_batches", fake)
    settings = EvalSettings(settings=("oracle",), batch_size=2, max_new_tokens=8, torch_threads=1,
                            chat_template="chatml_tools", answer_format="tool_calls")
    results = evaluate_checkpoint(tiny_model_dir, hub=str(folder), apibench_dir=None, out_dir=tmp_path / "e",
                                  settings=settings, progress=False)
    assert seen["answer_format"] == "tool_calls"
    m = results["oracle"]
    assert m["strict"]["correct_n"] == 1 and m["calls"]["call_rate"] == 1.0
    assert m["generation"]["answer_format"] == "tool_calls" and m["generation"]["chat_template"] == "chatml_tools"
    assert sum('<tools>\n{"type": "function", "function": {"name": "get_weather"' in text for text in asked) == 1
    # scored again and compared from the cell alone: its identity says how to read the answers
    from ratune.cli import main

    capsys.readouterr()
    assert main(["eval", "score", "--hub", str(folder), "--responses", str(tmp_path / "e" / "oracle" / "responses.jsonl"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strict"]["correct_n"] == 1
    python_cell = tmp_path / "p" / "responses.jsonl"  # the same answers in python_calls: none decodes
    python_cell.parent.mkdir()
    python_cell.write_text((tmp_path / "e" / "oracle" / "responses.jsonl").read_text())
    assert main(["compare", str(tmp_path / "e" / "oracle"), str(python_cell), "--hub", str(folder), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert (compared["a"]["correct_n"], compared["b"]["correct_n"]) == (1, 0)
    with pytest.raises(RatuneError, match="ignores tools="):
        evaluate_checkpoint(tiny_model_dir, hub=str(folder), apibench_dir=None, out_dir=tmp_path / "r",
                            settings=EvalSettings(settings=("oracle",), answer_format="tool_calls"), progress=False)


@pytest.mark.bfcl
def test_eval_bfcl_in_tool_calls_hands_bfcls_checker_the_calls(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The functions go to the template as tools; a tool-call answer reaches BFCL's checker (and its
    result file) as the call list it means, the responses keep the model's text, and --responses
    scores them again the same way."""
    import ratune.eval.bfcl_run as bfcl_run_module
    from ratune.cli import main
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_calls
    from ratune.sources.formats import PythonCallsFormat, ToolCallsFormat

    entries = {e.id: e for c in ("simple_python", "irrelevance") for e in load_bfcl(bfcl_data_dir(), c)[:2]}
    asked = []

    def tags(calls):
        return "\n".join("<tool_call>\n" + json.dumps({"name": c["name"], "arguments": c["arguments"]}) +
                         "\n</tool_call>" for c in calls)

    def scripted(backend, model, tokenizer, prompts, **kw):
        texts = [tokenizer.decode(p) for p in prompts]
        asked.extend(texts)
        answers = []
        for j, text in enumerate(texts):
            entry = next(e for e in entries.values() if e.question[0][-1]["content"] in text)
            answers.append((j, tags(possible_answer_calls(entry.possible_answer, entry.functions))
                            if entry.possible_answer else ToolCallsFormat.no_call))
        return [answers]

    monkeypatch.setattr(bfcl_run_module, "backend_batches", scripted)
    out = tmp_path / "run"
    assert main(["eval", "bfcl", "--checkpoint", str(tiny_model_dir), "--categories", "simple_python", "irrelevance",
                 "--limit", "2", "--answer-format", "tool_calls", "--chat-template", "chatml_tools",
                 "--out", str(out)]) == 0
    assert len(asked) == 4 and all("<tools>\n{\"type\": \"function\", \"function\": {\"name\": " in t for t in asked)
    for category in ("simple_python", "irrelevance"):
        metrics = json.loads((out / category / "metrics.json").read_text())
        assert (metrics["n"], metrics["correct"]) == (2, 2), category
        assert metrics["generation"]["answer_format"] == "tool_calls"
        assert metrics["generation"]["response_template"]["fields"]["tool_calls"]["open"] == "<tool_call>"
    responses = [json.loads(line) for line in (out / "simple_python" / "responses.jsonl").read_text().splitlines()]
    assert all(r["text"].startswith("<tool_call>\n") for r in responses)
    result = (out / "bfcl" / "result").rglob("BFCL_v4_simple_python_result.json")
    assert [json.loads(line)["result"] for line in next(result).read_text().splitlines()] == [
        PythonCallsFormat.render_calls(possible_answer_calls(entries[r["id"]].possible_answer, entries[r["id"]].functions))
        for r in responses]
    # scored again from the responses alone: the identity says how to read them
    assert main(["eval", "bfcl", "--responses", str(out), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "simple_python" / "metrics.json").read_text())
    assert again["correct"] == 2
    capsys.readouterr()
    assert main(["eval", "bfcl", "--checkpoint", str(tiny_model_dir), "--categories", "irrelevance", "--limit", "1",
                 "--answer-format", "apibench", "--out", str(tmp_path / "refused")]) == 2
    assert "--answer-format apibench: BFCL's entries are function lists, written as python_calls or tool_calls" in (
        capsys.readouterr().err)


def test_a_model_trained_on_tool_calls_rows_is_evaluated_in_them(tmp_path, tools_tokenizer, tiny_model_dir,
                                                                  monkeypatch):
    """Training tokenizes the rows with their tools; the run records the format and template, and
    ``eval run`` of the run writes its prompts in them with no flag; the saved tokenizer keeps the
    template and the response template that reads its answers."""
    import yaml

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.models import load_tokenizer
    from ratune.train.sft import main

    from ratune.sources.toolset import import_tool_set

    folder = _tool_set(tmp_path)  # every row in eval
    trained = tmp_path / "trained"  # every row in train
    import_tool_set(trained, rows_file=tmp_path / "rows.jsonl", eval_fraction=0)
    build_dataset(hub=str(trained), out_dir=tmp_path / "data", tokenizer=tools_tokenizer, tokenizer_name="smol",
                  modes=["oracle"], progress=False, leakage="allow",
                  settings=BuildSettings(max_length=1024, answer_format="tool_calls"))
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "hub": str(trained), "data_dir": str(tmp_path / "data"),
        "train_retriever": "oracle", "output_dir": str(tmp_path / "run"), "max_length": 1024,
        "chat_template": "chatml_tools", "global_batch_size": 5, "per_device_batch_size": 5,
        "max_steps": 1, "warmup_ratio": 0.0, "lr_scheduler": "constant"}))
    assert main(["--config", str(config)]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["prompt"]["answer_format"] == "tool_calls" and manifest["prompt"]["chat_template"] == "chatml_tools"
    saved = load_tokenizer(tmp_path / "run" / "model")
    assert saved.response_template["fields"]["tool_calls"]["open"] == "<tool_call>"
    seen = {}

    def fake(backend, model, tokenizer, prompts, **kw):
        seen.update(kw, prompt=tokenizer.decode(prompts[0]))
        return [[(j, "None of the given functions can be used.") for j in range(len(prompts))]]

    monkeypatch.setattr("ratune.eval.run.backend_batches", fake)
    results = evaluate_checkpoint(tmp_path / "run", hub=str(folder), apibench_dir=None, out_dir=tmp_path / "e",
                                  settings=EvalSettings(settings=("oracle",), torch_threads=1), progress=False)
    assert seen["answer_format"] == "tool_calls" and "<tools>" in seen["prompt"]
    assert results["oracle"]["strict"]["correct_n"] == 2  # the two rows that call nothing
