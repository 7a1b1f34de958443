"""``ratune eval bfcl`` (eval/bfcl_run.py): BFCL's prompts as ratune builds them (sources/bfcl.py) equal
BFCL's own for every entry; generation stops at the end of the call list; a run on a tiny model writes
every file, with metrics that follow from its verdicts; a rerun generates nothing, a killed one
continues; ``--responses`` scores without a model; refusals are one line. Tests marked ``bfcl`` need
.bfcl-venv (make bfcl-setup)."""

from __future__ import annotations

import csv
import json

import pytest

from ratune.cli import main
from ratune.eval.bfcl import BFCL_MODEL, CATEGORIES, bfcl_prompt_messages
from ratune.eval.generate import generate_batches
from ratune.eval.stats import wilson_interval
from ratune.io import sha256_file
from ratune.sources.bfcl import BFCL_EVAL_VERSION, bfcl_data_dir, bfcl_messages, load_bfcl
from ratune.sources.formats import PYTHON_HINT

pytestmark = pytest.mark.bfcl

#: The two categories of the runs below: one AST category, one where no call is right.
RUN_CATEGORIES = ("simple_python", "irrelevance")


def test_ratune_builds_bfcls_own_messages_for_every_entry():
    theirs = bfcl_prompt_messages(CATEGORIES)  # BFCL's own code, in its venv: one process
    data = bfcl_data_dir()
    for category in CATEGORIES:
        entries = load_bfcl(data, category)
        assert [e.id for e in entries] == [i for i, _ in theirs[category]], category
        for entry, (_, messages) in zip(entries, theirs[category]):
            assert json.dumps(bfcl_messages(entry), ensure_ascii=False) == json.dumps(messages, ensure_ascii=False), \
                entry.id
    # what the messages hold, on the first entry: the system prompt, then the question as given
    first = load_bfcl(data, "simple_python")[0]
    system, user = bfcl_messages(first)
    assert system["role"] == "system" and user == first.question[0][0]
    assert system["content"].startswith("You are an expert in composing functions.You are given a question")
    assert ("[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)].  You SHOULD "
            "NOT include any other text in the response.") in system["content"]
    tools = system["content"].split("Here is a list of functions in json format that you can invoke.\n", 1)[1]
    assert json.loads(tools) == [{**first.functions[0], "description": first.functions[0]["description"] + PYTHON_HINT}]
    # an entry with its own system message: BFCL's prompt goes in front of it, after a blank line
    own = next(e for e in load_bfcl(data, "live_simple") if e.question[0][0]["role"] == "system")
    merged = bfcl_messages(own)
    assert len(merged) == len(own.question[0]) and merged[0]["content"].endswith("\n\n" + own.question[0][0]["content"])


def test_generation_stops_at_the_end_of_the_call_list(tiny_model_dir, smol_tokenizer):
    """A model made to write a call list and then prose is stopped once the list closes: fewer forward
    passes than tokens allowed, and the text cut at the bracket."""
    import torch
    from transformers import LlamaForCausalLM

    answer = "[get_weather(city='Paris', unit='celsius')]"
    script = smol_tokenizer(answer + " I hope this helps, and here is more prose." * 4,
                            add_special_tokens=False)["input_ids"]
    closes = next(k for k in range(1, len(script) + 1) if "]" in smol_tokenizer.decode(script[:k]))

    class Scripted(LlamaForCausalLM):
        """Writes ``script`` whatever the prompt: one forward pass per generated token."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            logits = torch.full_like(out.logits, float("-inf"))
            logits[:, -1, script[self.passes]] = 0.0
            self.passes += 1
            out.logits = logits
            return out

    model = Scripted.from_pretrained(tiny_model_dir)
    prompt = smol_tokenizer("What is the weather in Paris?")["input_ids"]
    for stop, text, passes in ((True, answer, closes),
                               (False, smol_tokenizer.decode(script).strip(), len(script))):
        model.passes = 0
        batches = list(generate_batches(model, smol_tokenizer, [prompt], batch_size=1, max_new_tokens=len(script),
                                        stop_after_api_call=stop, answer_format="python_calls"))
        assert (batches, model.passes) == ([[(0, text)]], passes)
    assert (closes, len(script)) == (14, 58)  # the list closes at token 14 of 58


def _run(argv, capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def bfcl_run(tiny_model_dir, tmp_path_factory):
    """``ratune eval bfcl`` of the tiny model on the first 2 entries of two categories."""
    out = tmp_path_factory.mktemp("bfcl") / "run"
    argv = ["eval", "bfcl", "--checkpoint", str(tiny_model_dir), "--categories", *RUN_CATEGORIES, "--limit", "2",
            "--max-new-tokens", "6", "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 0
    return out, argv


def test_a_run_writes_every_file_and_metrics_that_follow_from_the_verdicts(bfcl_run, tiny_model_dir):
    out, _ = bfcl_run
    data = bfcl_data_dir()
    results = {}
    for category in RUN_CATEGORIES:
        cell = out / category
        ids = [e.id for e in load_bfcl(data, category)[:2]]
        responses, verdicts = _lines(cell / "responses.jsonl"), _lines(cell / "verdicts.jsonl")
        assert [r["id"] for r in responses] == [v["id"] for v in verdicts] == ids
        assert {r["model"] for r in responses} == {tiny_model_dir.name}
        metrics = json.loads((cell / "metrics.json").read_text())
        correct = sum(v["correct"] for v in verdicts)
        assert metrics["n"] == 2 and metrics["correct"] == correct and metrics["accuracy"] == correct / 2
        assert metrics["accuracy_ci"] == list(wilson_interval(correct, 2))
        assert metrics["call_rate"] == sum(v["calls"] > 0 for v in verdicts) / 2
        assert metrics["format_adherence"] == sum(v["decoded"] for v in verdicts) / 2
        assert (metrics["bfcl_version"], metrics["bfcl_model"]) == (BFCL_EVAL_VERSION, BFCL_MODEL)
        assert metrics["checkpoint"] == str(tiny_model_dir.resolve())
        assert metrics["generation"] == {"answer_format": "python_calls", "backend": "hf", "batch_size": 2,
                                         "chat_template": None, "device": "cpu", "dtype": "float32", "greedy": True,
                                         "max_new_tokens": 6, "stop_at_answer_end": True}
        assert metrics["timing"]["generated"] == 2 and metrics["versions"]["transformers"]
        assert (cell / ".complete").exists()
        result = out / "bfcl" / "result" / BFCL_MODEL.replace("/", "_") / "non_live" / f"BFCL_v4_{category}_result.json"
        assert _lines(result) == [{"id": r["id"], "result": r["text"]} for r in responses]
        results[category] = (responses, verdicts, metrics)
    # six random tokens are no call list: the AST entries are wrong, the irrelevance ones right
    for category, right in (("simple_python", 0), ("irrelevance", 2)):
        responses, verdicts, metrics = results[category]
        assert not any(v["decoded"] for v in verdicts), responses
        assert (metrics["correct"], metrics["format_adherence"], metrics["call_rate"]) == (right, 0.0, 0.0)
    assert results["irrelevance"][2]["accuracy_ci"] == pytest.approx([0.3424, 1.0], abs=1e-4)  # Wilson, 2 of 2
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["category"], r["n"], r["correct"]) for r in rows] == [("simple_python", "2", "0"), ("irrelevance", "2", "2")]
    assert "| irrelevance | " in (out / "summary.md").read_text()
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "eval bfcl" and manifest["bfcl_version"] == BFCL_EVAL_VERSION
    assert manifest["categories"] == {c: sha256_file(out / c / "metrics.json") for c in RUN_CATEGORIES}


def test_a_rerun_generates_nothing_and_a_killed_run_continues(bfcl_run, tmp_path, monkeypatch, capsys):
    import ratune.eval.bfcl_run as bfcl_run_module

    out, argv = bfcl_run
    real = bfcl_run_module.backend_batches
    asked = []

    def spy(backend, model, tokenizer, prompts, **kwargs):
        asked.append(len(prompts))
        return real(backend, model, tokenizer, prompts, **kwargs)

    monkeypatch.setattr(bfcl_run_module, "backend_batches", spy)
    before = {c: (out / c / "metrics.json").read_text() for c in RUN_CATEGORIES}
    rc, printed, _ = _run(argv, capsys)
    assert rc == 0 and asked == [] and "| simple_python | " in printed
    assert {c: (out / c / "metrics.json").read_text() for c in RUN_CATEGORIES} == before

    # a run killed after its first batch, with a torn line at the end of its file, answers only the rest
    second = tmp_path / "killed"
    one = [*argv[:argv.index("--categories")], "--categories", "simple_python", "--limit", "2", "--max-new-tokens", "6",
           "--batch-size", "1", "--out", str(second)]

    def killed(backend, model, tokenizer, prompts, **kwargs):
        asked.append(len(prompts))
        yield next(iter(real(backend, model, tokenizer, prompts, **kwargs)))
        raise KeyboardInterrupt

    monkeypatch.setattr(bfcl_run_module, "backend_batches", killed)
    assert main(one) == 130  # interrupted
    path = second / "simple_python" / "responses.jsonl"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"id": "simple_python_1", "te')
    monkeypatch.setattr(bfcl_run_module, "backend_batches", spy)
    assert main(one) == 0
    assert asked == [2, 1]  # the killed run was given both prompts, the rerun the one left
    first = _lines(out / "simple_python" / "responses.jsonl")
    assert [(r["id"], r["text"]) for r in _lines(path)] == [(r["id"], r["text"]) for r in first]


def test_responses_are_scored_again_without_a_model(bfcl_run, tmp_path, monkeypatch, capsys):
    import ratune.eval.bfcl_run as bfcl_run_module

    def no_model(*args, **kwargs):
        raise AssertionError("--responses loads no model")

    monkeypatch.setattr(bfcl_run_module, "load_for_generation", no_model)
    monkeypatch.setattr(bfcl_run_module, "load_tokenizer", no_model)
    out, _ = bfcl_run
    again = tmp_path / "again"
    rc, _, err = _run(["eval", "bfcl", "--responses", str(out), "--out", str(again)], capsys)
    assert rc == 0, err
    for category in RUN_CATEGORIES:
        first, second = (json.loads((d / category / "metrics.json").read_text()) for d in (out, again))
        keys = ("n", "correct", "accuracy", "accuracy_ci", "call_rate", "format_adherence", "model", "checkpoint",
                "generation")
        assert {k: second[k] for k in keys} == {k: first[k] for k in keys}
        assert second["responses_from"] == str(out.resolve()) and "timing" not in second
        assert _lines(again / category / "verdicts.jsonl") == _lines(out / category / "verdicts.jsonl")
    # --limit keeps the first entries of each file
    rc, _, _ = _run(["eval", "bfcl", "--responses", str(out), "--categories", "irrelevance", "--limit", "1",
                     "--out", str(tmp_path / "one")], capsys)
    assert rc == 0 and json.loads((tmp_path / "one" / "irrelevance" / "metrics.json").read_text())["n"] == 1


@pytest.mark.parametrize("extra,env,message", [
    (["--categories", "simple_python", "java"], {},
     "argument --categories: unknown BFCL category 'java': expected one of simple_python, multiple, "),
    ([], {"RATUNE_BFCL_VENV": "EMPTY"}, "BFCL's virtual environment not found (tried EMPTY): run make bfcl-setup"),
    (["--checkpoint", "NOT_A_MODEL"], {}, "NOT_A_MODEL: not a checkpoint (no config.json"),
    (["--checkpoint", "smollm2-135m-instruct", "--responses", "OUT"], {}, "give --checkpoint (generate and score) or "
     "--responses"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, extra, env, message):
    for name in ("EMPTY", "NOT_A_MODEL", "OUT"):
        (tmp_path / name).mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, str(tmp_path / value))
    extra = [str(tmp_path / x) if x in ("NOT_A_MODEL", "OUT") else x for x in extra]
    if "--checkpoint" not in extra and "--responses" not in extra:
        extra += ["--checkpoint", "smollm2-135m-instruct"]
    rc, _, err = _run(["eval", "bfcl", *extra, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert message.replace("EMPTY", str(tmp_path / "EMPTY")).replace("NOT_A_MODEL", str(tmp_path / "NOT_A_MODEL")) in err
    assert not (tmp_path / "out").exists()


def test_full_answers_are_another_cell_and_recorded(bfcl_run, tmp_path, capsys):
    """--full-answers records that nothing was cut, and is refused on a folder made with the cut
    (its answers would mix two rules)."""
    out, argv = bfcl_run
    rc, _, err = _run([*argv, "--full-answers"], capsys)
    assert rc == 2 and "this eval cell was made with different settings (generation.stop_at_answer_end: " \
        "True then, False now)" in err
    fresh = tmp_path / "full"
    rc, _, _ = _run([*[a if a != str(out) else str(fresh) for a in argv], "--full-answers", "--categories",
                     "irrelevance"], capsys)
    metrics = json.loads((fresh / "irrelevance" / "metrics.json").read_text())
    assert rc == 0 and metrics["generation"]["stop_at_answer_end"] is False


def test_two_bfcl_cells_are_compared_by_entry_id(tmp_path, capsys):
    """Hand-written answers to the first 4 simple_python entries, scored by ``--responses``: A gets
    entries 0-2 right, B entry 0 only; paired, 1 both right, 2 only A, 1 neither, and the exact
    McNemar p of 2 against 0 discordant entries is 2 x 0.5^2 = 0.5."""
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text

    entries = load_bfcl(bfcl_data_dir(), "simple_python")[:4]
    right = [possible_answer_text(e.possible_answer, e.functions) for e in entries]
    for name, answers in (("a", [*right[:3], "no idea"]), ("b", [right[0], "[]", "[]", "no idea"])):
        given = tmp_path / f"given_{name}" / "simple_python"
        given.mkdir(parents=True)
        given.joinpath("responses.jsonl").write_text(
            "".join(json.dumps({"id": e.id, "text": t}) + "\n" for e, t in zip(entries, answers)))
        rc, _, err = _run(["eval", "bfcl", "--responses", str(given.parent), "--out", str(tmp_path / name)], capsys)
        assert rc == 0, err
    rc, out, err = _run(["compare", str(tmp_path / "a" / "simple_python"), str(tmp_path / "b" / "simple_python"),
                         "--json"], capsys)
    assert rc == 0, err
    result = json.loads(out)
    assert result["metric"] == "bfcl" and result["hub"] == "BFCL simple_python" and result["n"] == 4
    assert result["contingency"] == {"both": 1, "only_a": 2, "only_b": 0, "neither": 1}
    assert result["mcnemar_p"] == 0.5 and (result["a"]["correct_n"], result["b"]["correct_n"]) == (3, 1)
    assert result["bfcl_version"] == BFCL_EVAL_VERSION
    # another category, or --metric, is refused; response files still need --hub
    other = tmp_path / "b" / "irrelevance"
    other.mkdir()
    for name in ("metrics.json", "verdicts.jsonl", ".complete"):
        if (tmp_path / "b" / "simple_python" / name).exists():
            (other / name).write_bytes((tmp_path / "b" / "simple_python" / name).read_bytes())
    rc, _, err = _run(["compare", str(tmp_path / "a" / "simple_python"), str(other)], capsys)
    assert rc == 2 and "the folders compared differ in category (irrelevance, simple_python: " in err, err
    rc, _, err = _run(["compare", str(tmp_path / "a" / "simple_python"), str(tmp_path / "b" / "simple_python"),
                       "--metric", "strict"], capsys)
    assert rc == 2 and "--metric strict: two BFCL category folders are compared by BFCL's own verdict" in err
    rc, _, err = _run(["compare", str(tmp_path / "given_a" / "simple_python" / "responses.jsonl"),
                       str(tmp_path / "given_b" / "simple_python" / "responses.jsonl")], capsys)
    assert rc == 2 and "--hub is needed to score response files" in err


def test_the_bfcl_report_puts_models_side_by_side(tmp_path, capsys):
    """Two ``--responses`` outputs (the converted answer keys, and ``[]`` everywhere) for the first 3
    entries of simple_python and irrelevance: rows per model and category, and the second model
    compared with the first, paired by entry id."""
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text

    for name in ("keys", "empty"):
        for category in RUN_CATEGORIES:
            entries = load_bfcl(bfcl_data_dir(), category)[:3]
            given = tmp_path / f"given_{name}" / category
            given.mkdir(parents=True)
            texts = [possible_answer_text(e.possible_answer, e.functions) if name == "keys" and e.possible_answer
                     else "[]" for e in entries]
            given.joinpath("responses.jsonl").write_text(
                "".join(json.dumps({"id": e.id, "text": t}) + "\n" for e, t in zip(entries, texts)))
        assert _run(["eval", "bfcl", "--responses", str(tmp_path / f"given_{name}"), "--out",
                     str(tmp_path / name)], capsys)[0] == 0
    rc, out, err = _run(["report", "--bfcl", f"keys={tmp_path / 'keys'}", "--bfcl", f"empty={tmp_path / 'empty'}",
                         "--out", str(tmp_path / "report")], capsys)
    assert rc == 0, err
    report = json.loads((tmp_path / "report" / "bfcl.json").read_text())
    assert [(r["model"], r["category"], r["correct"]) for r in report["rows"]] == [
        ("keys", "simple_python", 3), ("keys", "irrelevance", 3), ("empty", "simple_python", 0),
        ("empty", "irrelevance", 3)]
    simple, irrelevance = report["comparisons"]
    assert (simple["holm_p"], irrelevance["holm_p"]) == (0.5, 1.0)
    assert (simple["a"]["model"], simple["b"]["model"], simple["category"]) == ("empty", "keys", "simple_python")
    assert simple["contingency"] == {"both": 0, "only_a": 0, "only_b": 3, "neither": 0}
    assert simple["mcnemar_p"] == 0.25  # 0 against 3 discordant: 2 x 0.5^3
    assert irrelevance["contingency"]["both"] == 3 and irrelevance["mcnemar_p"] == 1.0
    assert list(csv.DictReader((tmp_path / "report" / "bfcl.csv").open()))[2]["model"] == "empty"
    assert (tmp_path / "report" / "bfcl.png").read_bytes()[:4] == b"\x89PNG"
    assert "| simple_python | empty | keys | 3 | 0 | 3 | 0 | 3 | 0.25 | 0.5 |" in out  # Holm over 2 categories
    rc, _, err = _run(["report", "--bfcl", f"keys={tmp_path / 'keys'}", "--eval", f"none={tmp_path / 'keys'}",
                       "--out", str(tmp_path / "r2")], capsys)
    assert rc == 2 and "ratune report --bfcl NAME=DIR ... takes --out and --against only (not --eval)" in err


def test_the_bfcl_report_takes_seeds_and_references(tmp_path, capsys, monkeypatch):
    """Arm r has two seeds, answering the first 4 simple_python entries right on 0-2 and on 0-1; arm
    k one seed, right on entry 0. Per entry r's share of seeds right is 1, 1, 0.5, 0 and k's 1, 0,
    0, 0: r higher on 2 entries, k on none, so the sign test gives 2 x 0.5^2 = 0.5 (one category:
    Holm changes nothing), and the mean difference is (0 + 1 + 0.5 + 0) / 4 = 37.5 points. r's row:
    accuracy (0.75 + 0.5) / 2 = 62.5 %, sd 17.7 points, 2.5 right on average; its interval is the
    bootstrap over entries of the shares 1, 1, 0.5, 0. Enumerating the 256 equally likely resamples
    of 4 shares, the mean is at most 0.125 in 5 (2.0 %) and at most 0.25 in 19 (7.4 %), and below 1
    in 240 (93.8 %): the 2.5th and 97.5th percentiles are 0.25 and 1.0 (the pooled Wilson interval of
    5 of 8 answers, 30.6-86.3 %, was narrower)."""
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl, possible_answer_text

    entries = load_bfcl(bfcl_data_dir(), "simple_python")[:4]
    right = [possible_answer_text(e.possible_answer, e.functions) for e in entries]
    for name, n_right in (("r1", 3), ("r2", 2), ("k", 1), ("short", 3)):
        given = tmp_path / f"given_{name}" / "simple_python"
        given.mkdir(parents=True)
        texts = [*right[:n_right], *["[]"] * (4 - n_right)][:3 if name == "short" else 4]
        given.joinpath("responses.jsonl").write_text(
            "".join(json.dumps({"id": e.id, "text": t}) + "\n" for e, t in zip(entries, texts)))
        assert _run(["eval", "bfcl", "--responses", str(given.parent), "--out", str(tmp_path / name)], capsys)[0] == 0
    arms = ["--bfcl", f"k={tmp_path / 'k'}", "--bfcl", f"r={tmp_path / 'r1'}", "--bfcl", f"r={tmp_path / 'r2'}"]
    rc, out, err = _run(["report", *arms, "--out", str(tmp_path / "report")], capsys)
    assert rc == 0, err
    report = json.loads((tmp_path / "report" / "bfcl.json").read_text())
    (k_row, r_row), (comparison,) = report["rows"], report["comparisons"]
    assert (k_row["seeds"], k_row["correct"], r_row["seeds"], r_row["correct"], r_row["accuracy"]) == (1, 1, 2, 2.5,
                                                                                                       0.625)
    assert r_row["accuracy_sd"] == pytest.approx(0.1767767)
    assert (r_row["accuracy_low"], r_row["accuracy_high"]) == (0.25, 1.0)
    assert (k_row["accuracy_low"], k_row["accuracy_high"]) == pytest.approx((0.0456, 0.6994), abs=1e-4)  # Wilson 1 of 4
    assert (comparison["a"]["model"], comparison["b"]["model"], comparison["a"]["seeds"]) == ("r", "k", 2)
    assert comparison["contingency"] == {"only_a": 2, "only_b": 0, "tied": 2}
    assert comparison["mcnemar_p"] == comparison["holm_p"] == 0.5 and comparison["difference"]["value"] == 0.375
    assert "| simple_python | r | 4 | 62.5 ±17.7 sd (2 seeds) | 25.0-100.0 |" in out
    assert "| simple_python | r | k | 4 | 2.5 | 1 | 2 | 0 | 0.5 | 0.5 | +37.5 [" in out
    assert list(csv.DictReader((tmp_path / "report" / "bfcl.csv").open()))[1]["seeds"] == "2"
    # --against: k compared with r, the same test from the other side
    assert _run(["report", *arms, "--against", "r", "--out", str(tmp_path / "r_first")], capsys)[0] == 0
    (flipped,) = json.loads((tmp_path / "r_first" / "bfcl.json").read_text())["comparisons"]
    assert (flipped["a"]["model"], flipped["contingency"]["only_b"], flipped["mcnemar_p"]) == ("k", 2, 0.5)
    # each folder's verdicts are read once: k (the reference of r and of s), r's two seeds and s
    import ratune.eval.bfcl_run as bfcl_run

    read = []
    monkeypatch.setattr(bfcl_run, "bfcl_cell_outcomes",
                        lambda path, real=bfcl_run.bfcl_cell_outcomes: read.append(path) or real(path))
    assert _run(["report", *arms, "--bfcl", f"s={tmp_path / 'r1'}", "--out", str(tmp_path / "once")], capsys)[0] == 0
    assert sorted(str(p) for p in read) == sorted(str(tmp_path / n / "simple_python") for n in ("k", "r1", "r2", "r1"))
    for argv, message in ((["--against", "x"], "--against x: not a --bfcl name (given: k, r)"),
                          (["--bfcl", f"r={tmp_path / 'short'}"], "--bfcl r: its seeds scored simple_python on "
                                                                  "[3, 4] entries")):
        rc, _, err = _run(["report", *arms, *argv, "--out", str(tmp_path / "refused")], capsys)
        assert rc == 2 and message in err, err
    rc, _, err = _run(["report", "--against", "k", "--eval", f"none={tmp_path / 'k'}"], capsys)
    assert rc == 2 and "--against NAME names a --bfcl model" in err
