"""Generated instruction pairs (ratune.catalog.instruct, ``ratune catalog instruct``): output
parsing, each filter with its count, seeds validation, the prompt, the output and its sidecar with
a fake generator (worked out by hand), the overwrite rules, and one end-to-end run of the CLI with
the tiny random model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ratune.catalog.folder import import_catalog
from ratune.catalog.instruct import (DROP_REASONS, EXAMPLE_TEMPLATE, MIN_WORDS, PROMPT_TEMPLATE, SEEDS_PER_PROMPT,
                                     api_names_of, check_output, choose_seeds, filter_candidates, instruct_catalog,
                                     names_api, parse_lines, render_prompt, sidecar_path)
from ratune.catalog.pairs import Pair, load_pairs, write_pairs
from ratune.catalog.schema import load_catalog
from ratune.cli import main
from ratune.sources.prompt import serialize_document
from ratune.errors import InputError, RatuneError

ROOT = Path(__file__).resolve().parent.parent
TOOLBOX = ROOT / "examples" / "catalogs" / "hand-written" / "toolbox.jsonl"

SEEDS = [{"instruction": "Give me a checksum object for verifying a download", "api_name": "hashlib.new.md5"},
         {"instruction": "Duplicate report.txt as report_backup.txt", "api_name": "shutil.copyfile"}]


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _write(path: Path, lines) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines), encoding="utf-8")
    return path


@pytest.fixture()
def catalog(tmp_path):
    folder = tmp_path / "toolbox"
    import_catalog("jsonl", TOOLBOX, folder)
    return folder


@pytest.fixture()
def seeds(tmp_path):
    return _write(tmp_path / "seeds.jsonl", SEEDS)


def _docs(catalog) -> dict:
    return {d["api_name"]: d for d in load_catalog(catalog)}


def _target(prompt: str, docs: dict) -> str:
    """The API a prompt asks about: the document serialized last in it (the seeds' come first)."""
    return max(docs, key=lambda name: prompt.rfind(serialize_document(docs[name])))


# --------------------------------------------------------------------------------------------
# parsing and filters


def test_parse_lines_strips_numbers_bullets_labels_and_quotes_and_skips_blank_lines():
    text = ("1. Sort my list of numbers\n"
            "\n"
            "2) Wrap this paragraph at forty columns\n"
            "   \n"
            "- Copy my notes to a backup\n"
            "* Second bullet here\n"
            "\u2022 Third bullet here\n"
            "+ Fourth bullet here\n"
            "(7) Parenthesised number\n"
            "8: Colon number\n"
            "9.\n"
            "10.Tight number\n"
            "1.5 kilograms of flour in grams\n"
            "## A heading line\n"
            "Request: \"Hash these bytes with SHA-256\"\n"
            "  \u201cCurly quoted request\u201d  \n")
    assert parse_lines(text) == [
        "Sort my list of numbers", "Wrap this paragraph at forty columns", "Copy my notes to a backup",
        "Second bullet here", "Third bullet here", "Fourth bullet here", "Parenthesised number", "Colon number",
        "", "Tight number", "1.5 kilograms of flour in grams", "A heading line", "Hash these bytes with SHA-256",
        "Curly quoted request"]
    assert parse_lines("") == [] and parse_lines("\n \n") == []


def test_names_api_matches_the_api_name_and_the_callees_last_part_as_whole_words(catalog):
    docs = _docs(catalog)
    sha, copy = docs["hashlib.new.sha256"], docs["shutil.copyfile"]
    assert api_names_of(sha) == ("hashlib.new.sha256", "new")  # callee hashlib.new
    assert api_names_of(copy) == ("shutil.copyfile", "copyfile")
    assert names_api("Make a NEW hasher", sha) and names_api("call hashlib.new.sha256 on it", sha)
    assert not names_api("renew my hash subscription", sha) and not names_api("newly hashed bytes", sha)
    assert names_api("CopyFile the notes", copy) and names_api("run shutil.copyfile(a, b)", copy)
    assert not names_api("copy the file a to b", copy) and not names_api("my copyfiles folder", copy)


def test_each_filter_drops_and_counts_its_own_case():
    def doc(name, call):
        return {"api_name": name, "api_call": call}

    wrap = doc("textwrap.wrap", "textwrap.wrap(text, width=70)")
    copy = doc("shutil.copyfile", "shutil.copyfile(src, dst)")
    seeds = [Pair("Copy the file a.txt to b.txt", "shutil.copyfile", "shutil.copyfile(src, dst)", None, None,
                  "seeds.jsonl", 1)]
    candidates = [
        (wrap, ["",                                                   # empty
                "Wrap this text at forty columns",                    # names_api ("wrap")
                "Too short here",                                     # too_short (3 words)
                "Break this paragraph into short lines",              # kept
                "break this  paragraph INTO short lines",             # duplicate (same API)
                "Fold my essay into lines of sixty characters",       # kept
                "Split the poem into lines of width ten"]),           # beyond_per_api (2 kept already)
        (copy, ["copy the file a.txt to  b.txt",                      # copies_seed
                "Break this paragraph into short lines",              # duplicate (another API's)
                "Use shutil.copyfile on my notes",                    # names_api
                "Back up my notes",                                   # kept: exactly MIN_WORDS words
                "Duplicate my notes file into a backup file"]),       # kept
    ]
    assert MIN_WORDS == 4
    result = filter_candidates(candidates, seeds, per_api=2)
    assert result.kept == [("textwrap.wrap", "Break this paragraph into short lines"),
                           ("textwrap.wrap", "Fold my essay into lines of sixty characters"),
                           ("shutil.copyfile", "Back up my notes"),
                           ("shutil.copyfile", "Duplicate my notes file into a backup file")]
    assert [(d.api_name, d.reason) for d in result.dropped] == [
        ("textwrap.wrap", "empty"), ("textwrap.wrap", "names_api"), ("textwrap.wrap", "too_short"),
        ("textwrap.wrap", "duplicate"), ("textwrap.wrap", "beyond_per_api"), ("shutil.copyfile", "copies_seed"),
        ("shutil.copyfile", "duplicate"), ("shutil.copyfile", "names_api")]
    assert result.counts() == {"generated": 12, "kept": 4, "dropped": {
        "empty": 1, "names_api": 2, "too_short": 1, "copies_prompt": 0, "copies_seed": 1, "duplicate": 2,
        "beyond_per_api": 1}}
    assert tuple(result.counts()["dropped"]) == DROP_REASONS
    assert result.per_api == {"textwrap.wrap": {"generated": 7, "kept": 2},
                              "shutil.copyfile": {"generated": 5, "kept": 2}}


# --------------------------------------------------------------------------------------------
# seeds and the prompt


def _never(prompts):  # pragma: no cover - must not be reached
    raise AssertionError("generate called")


@pytest.mark.parametrize("line, where", [
    ({"instruction": "Wrap it", "api_name": "textwrap.wrapp"}, "field 'api_name': unknown API 'textwrap.wrapp'; "
                                                               "did you mean 'textwrap.wrap'"),
    ({"instruction": "  ", "api_name": "textwrap.wrap"}, "field 'instruction': empty"),
    ("{not json", "not a JSON object"),
])
def test_a_bad_seed_line_is_an_error_naming_file_and_line(tmp_path, catalog, line, where):
    path = _write(tmp_path / "bad_seeds.jsonl", [SEEDS[0], line])
    with pytest.raises(InputError) as info:
        instruct_catalog(catalog, path, tmp_path / "gen.jsonl", generate=_never, generator={"model": "fake"},
                         progress=False)
    assert str(info.value).startswith(f"{path}:2:") and where in str(info.value)
    assert not (tmp_path / "gen.jsonl").exists() and not sidecar_path(tmp_path / "gen.jsonl").exists()


def test_the_prompt_holds_the_seeds_and_the_target_document_and_no_other(catalog, seeds, tmp_path):
    docs = _docs(catalog)
    prompts = []

    def record(batch):
        prompts.extend(batch)
        return [""] * len(batch)

    instruct_catalog(catalog, seeds, tmp_path / "gen.jsonl", generate=record, generator={"model": "fake"},
                     per_api=7, batch_size=2, progress=False)
    assert len(prompts) == 5 and [_target(p, docs) for p in prompts] == list(docs)
    wrap = prompts[3]  # textwrap.wrap: both seeds are shown (fewer than SEEDS_PER_PROMPT), in file order
    assert SEEDS_PER_PROMPT == 3
    assert wrap == (
        "You write requests that a user gives to a programming assistant. Each request describes a task that one "
        "API solves.\n\n"
        "Examples of requests and the API document each one needs:\n\n"
        "Request: Give me a checksum object for verifying a download\n"
        f"API document: {serialize_document(docs['hashlib.new.md5'])}\n\n"
        "Request: Duplicate report.txt as report_backup.txt\n"
        f"API document: {serialize_document(docs['shutil.copyfile'])}\n\n"
        f"The API document to write requests for: {serialize_document(docs['textwrap.wrap'])}\n\n"
        "Write 7 different requests a user could give that this API solves. Write one request per line. Do not "
        "name the API or its function in a request.")
    for other in ("hashlib.new.sha256", "huggingface_hub.hf_hub_download.gpt2"):
        assert serialize_document(docs[other]) not in wrap
    assert wrap == render_prompt(docs["textwrap.wrap"], [(s["instruction"], docs[s["api_name"]]) for s in SEEDS], 7)
    assert "{" not in PROMPT_TEMPLATE.replace("{examples}", "").replace("{document}", "").replace("{n}", "")
    assert EXAMPLE_TEMPLATE.startswith("Request: ")


def test_choose_seeds_draws_per_api_in_file_order_and_reproducibly():
    seeds = [Pair(f"instruction {i}", "a", "a()", None, None, "s.jsonl", i + 1) for i in range(6)]
    first = choose_seeds(seeds, "petstore.list_pets", 0)
    assert len(first) == 3 and [s.line for s in first] == sorted(s.line for s in first)
    assert choose_seeds(seeds, "petstore.list_pets", 0) == first  # the same draw every time
    assert len({tuple(s.line for s in choose_seeds(seeds, "petstore.list_pets", k)) for k in range(20)}) > 1
    assert choose_seeds(seeds[:2], "x", 0) == seeds[:2]  # fewer seeds than SEEDS_PER_PROMPT: all of them


# --------------------------------------------------------------------------------------------
# the output, its sidecar, and `catalog pairs` copying the record

FAKE_OUTPUTS = {
    "hashlib.new.sha256": "1. Compute a SHA-256 digest of my file\n2. Make a new SHA-256 hasher\n"
                          "3. Give me a checksum object for verifying a download\n",
    "hashlib.new.md5": "- Produce an MD5 checksum of these bytes\n- Quick md5\n\n"
                       "- Produce an md5 checksum of these  bytes",
    "huggingface_hub.hf_hub_download.gpt2": "Fetch the gpt2 config file from the model hub\n"
                                            "Download config.json of gpt2 into my cache\n"
                                            "Use hf_hub_download to get gpt2\n"
                                            "Grab the gpt2 tokenizer config from the hub",
    "textwrap.wrap": "",
    "shutil.copyfile": "1) Back up settings.ini to settings.bak\n2)\n3) Copy the contents of notes.txt into draft.txt",
}
EXPECTED_PAIRS = [
    ("Compute a SHA-256 digest of my file", "hashlib.new.sha256", "hashlib.new('sha256', data=b'')"),
    ("Produce an MD5 checksum of these bytes", "hashlib.new.md5", "hashlib.new('md5')"),
    ("Fetch the gpt2 config file from the model hub", "huggingface_hub.hf_hub_download.gpt2",
     "huggingface_hub.hf_hub_download(repo_id='gpt2', filename='config.json')"),
    ("Download config.json of gpt2 into my cache", "huggingface_hub.hf_hub_download.gpt2",
     "huggingface_hub.hf_hub_download(repo_id='gpt2', filename='config.json')"),
    ("Back up settings.ini to settings.bak", "shutil.copyfile", "shutil.copyfile(src, dst)"),
    ("Copy the contents of notes.txt into draft.txt", "shutil.copyfile", "shutil.copyfile(src, dst)"),
]


def _fake(docs):
    def generate(batch):
        return [FAKE_OUTPUTS[_target(p, docs)] for p in batch]
    return generate


def test_fake_generator_output_sidecar_and_catalog_pairs_record(catalog, seeds, tmp_path):
    docs = _docs(catalog)
    out = tmp_path / "gen.jsonl"
    manifest = instruct_catalog(catalog, seeds, out, generate=_fake(docs), generator={"model": "fake"},
                                sampling={"temperature": 0.5}, per_api=2, seed=4, batch_size=3, progress=False)
    lines = [json.loads(l) for l in out.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"instruction": i, "api_name": n, "api_call": c} for i, n, c in EXPECTED_PAIRS]
    assert [(p.instruction, p.api_name, p.api_call) for p in load_pairs(out, list(docs.values()))] == EXPECTED_PAIRS
    # 13 candidates: 6 kept; empty 1 ("2)"), names_api 2 ("new", "hf_hub_download"), too_short 1 ("Quick md5"),
    # copies_seed 1, duplicate 1 (md5 again), beyond_per_api 1 (a third gpt2 instruction with per_api 2)
    assert manifest["counts"] == {
        "apis": 5, "generated": 13, "kept": 6,
        "dropped": {"empty": 1, "names_api": 2, "too_short": 1, "copies_prompt": 0, "copies_seed": 1, "duplicate": 1,
                    "beyond_per_api": 1},
        "per_api": {"hashlib.new.sha256": {"generated": 3, "kept": 1}, "hashlib.new.md5": {"generated": 3, "kept": 1},
                    "huggingface_hub.hf_hub_download.gpt2": {"generated": 4, "kept": 2},
                    "textwrap.wrap": {"generated": 0, "kept": 0}, "shutil.copyfile": {"generated": 3, "kept": 2}}}
    assert manifest["dropped"][:2] == [
        {"api_name": "hashlib.new.sha256", "text": "Make a new SHA-256 hasher", "reason": "names_api"},
        {"api_name": "hashlib.new.sha256", "text": "Give me a checksum object for verifying a download",
         "reason": "copies_seed"}]
    sidecar = json.loads(sidecar_path(out).read_text(encoding="utf-8"))
    assert sidecar == manifest and sidecar_path(out).name == "gen.jsonl.manifest.json"
    assert sidecar["command"] == sidecar["kind"] == "catalog instruct"
    assert sidecar["output"] == {"path": str(out), "sha256": _sha256(out), "pairs": 6}
    assert sidecar["seeds"] == {"path": str(seeds), "sha256": _sha256(seeds), "count": 2}
    assert sidecar["prompt"] == {"template": PROMPT_TEMPLATE, "example_template": EXAMPLE_TEMPLATE,
                                 "seeds_per_prompt": 3, "per_api": 2}
    assert sidecar["sampling"] == {"temperature": 0.5, "seed": 4, "batch_size": 3}
    assert sidecar["generator"] == {"model": "fake"}
    assert sidecar["catalog"] == {"name": "toolbox", "path": str(catalog.resolve()),
                                  "apis_sha256": _sha256(catalog / "apis.jsonl")}
    assert "versions" in sidecar and "git_commit" in sidecar

    split = write_pairs(catalog, out, eval_fraction=0.5, seed=0)
    assert (split["counts"]["train"], split["counts"]["eval"]) == (4, 2)  # gpt2 and copyfile: one each to eval
    generation = split["generation"]
    assert generation["pairs_unchanged"] is True and generation["counts"] == manifest["counts"]
    assert generation["sidecar"] == {"path": str(sidecar_path(out)), "sha256": _sha256(sidecar_path(out))}
    assert generation["prompt"]["template"] == PROMPT_TEMPLATE and generation["seeds"]["sha256"] == _sha256(seeds)
    assert "dropped" not in generation  # it stays in the sidecar, whose hash is recorded
    assert json.loads((catalog / "pairs" / "manifest.json").read_text())["generation"] == generation

    with out.open("a", encoding="utf-8") as fh:  # a hand edit after generation
        fh.write(json.dumps({"instruction": "Clone my thesis into a safe place", "api_name": "shutil.copyfile"}) + "\n")
    assert write_pairs(catalog, out, eval_fraction=0.5, seed=0)["generation"]["pairs_unchanged"] is False
    own = _write(tmp_path / "own.jsonl", [{"instruction": i, "api_name": n} for i, n, _ in EXPECTED_PAIRS])
    assert write_pairs(catalog, own, eval_fraction=0.5, seed=0)["generation"] is None  # no sidecar


def test_overwrite_only_an_unedited_file_this_command_wrote(catalog, seeds, tmp_path):
    docs = _docs(catalog)
    out = tmp_path / "gen.jsonl"

    def run(path, **kwargs):
        return instruct_catalog(catalog, seeds, path, generate=_fake(docs), generator={"model": "fake"}, per_api=2,
                                progress=False, **kwargs)

    run(out)
    first = out.read_bytes()
    with pytest.raises(RatuneError, match=r"gen.jsonl: exists; give --overwrite to replace it"):
        run(out)
    run(out, overwrite=True)
    assert out.read_bytes() == first
    # the sidecar, written first, names the file it replaced: a run cut short after it may be rerun
    assert json.loads(sidecar_path(out).read_text())["output"]["replaces_sha256"] == _sha256(out)
    out.write_text(out.read_text() + "\n")  # edited since
    with pytest.raises(RatuneError, match=r"changed since `ratune catalog instruct` wrote it"):
        run(out, overwrite=True)
    user = _write(tmp_path / "mine.jsonl", [SEEDS[0]])
    with pytest.raises(RatuneError, match=r"mine.jsonl: not written by `ratune catalog instruct` \(no "
                                          r"mine.jsonl.manifest.json"):
        run(user, overwrite=True)
    assert user.read_text() == json.dumps(SEEDS[0]) + "\n"
    stray = tmp_path / "new.jsonl"
    sidecar_path(stray).write_text('{"command": "something else"}\n')
    with pytest.raises(RatuneError, match=r"new.jsonl.manifest.json: exists and is not a `ratune catalog instruct`"):
        check_output(stray)
    with pytest.raises(RatuneError, match=r"is a folder"):
        check_output(tmp_path)


# --------------------------------------------------------------------------------------------
# end to end: the CLI with the tiny random model


def test_cli_end_to_end_with_the_tiny_model_is_counted_and_reproducible(catalog, seeds, tmp_path, tiny_model_dir,
                                                                         capsys):
    def argv(out, *extra):
        return ["catalog", "instruct", "--catalog", str(catalog), "--model", str(tiny_model_dir), "--seeds", str(seeds),
                "--out", str(out), "--per-api", "3", "--max-new-tokens", "12", "--batch-size", "2", "--seed", "3",
                *extra]

    out = tmp_path / "gen.jsonl"
    assert main(argv(out)) == 0
    printed = capsys.readouterr().out
    sidecar = json.loads(sidecar_path(out).read_text(encoding="utf-8"))
    counts = sidecar["counts"]
    assert counts["generated"] == counts["kept"] + sum(counts["dropped"].values())
    assert counts["generated"] == sum(c["generated"] for c in counts["per_api"].values())
    assert counts["kept"] == sum(c["kept"] for c in counts["per_api"].values()) <= 5 * 3
    assert len(sidecar["dropped"]) == sum(counts["dropped"].values()) and counts["apis"] == 5
    assert f"instructions for catalog toolbox: {counts['generated']} generated, {counts['kept']} kept" in printed
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == counts["kept"] == sidecar["output"]["pairs"]
    if lines:
        assert len(load_pairs(out, load_catalog(catalog))) == counts["kept"]
    assert sidecar["generator"] == {
        "model": str(tiny_model_dir), "path": str(Path(tiny_model_dir).resolve()), "local": True,
        "config_sha256": _sha256(Path(tiny_model_dir) / "config.json"), "trust_remote_code": False,
        "dtype": "float32", "device": "cpu", "chat_template": "tokenizer"}
    assert sidecar["sampling"] == {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 1.0,
                                   "max_new_tokens": 12, "seed": 3, "batch_size": 2}
    assert sidecar["prompt"]["template"] == PROMPT_TEMPLATE and sidecar["prompt"]["per_api"] == 3

    again = tmp_path / "again.jsonl"
    assert main(argv(again)) == 0
    assert again.read_bytes() == out.read_bytes()
    assert json.loads(sidecar_path(again).read_text())["dropped"] == sidecar["dropped"]
    assert main(argv(out)) == 2
    assert "gen.jsonl: exists; give --overwrite" in capsys.readouterr().err
    assert main(argv(out, "--overwrite")) == 0
    assert _sha256(out) == sidecar["output"]["sha256"]


def test_the_data_stage_module_imports_no_later_stage():
    """catalog/ is the data stage: the alias resolution comes from the CLI (ratune/cli.py passes
    ratune.models.resolve_model_path), never from an import of train/ or eval/ here."""
    import ast

    tree = ast.parse((ROOT / "catalog" / "instruct.py").read_text(encoding="utf-8"))
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    later = sorted(m for m in modules if m and m.split(".")[:2] in (["ratune", "train"], ["ratune", "eval"],
                                                                    ["ratune", "retrieval"]))
    assert later == [] and "ratune.sources.prompt" in modules and "ratune.catalog.pairs" in modules


def test_a_candidate_that_repeats_the_prompt_is_copies_prompt():
    from ratune.catalog.instruct import PROMPT_ECHO_WORDS, echoes_prompt, filter_candidates

    assert PROMPT_ECHO_WORDS == 5
    # what SmolLM2-135M wrote for the petstore (docs/catalogs.md): the prompt's own sentence
    assert echoes_prompt("Here are 10 different requests a user could give that this API solves:")
    assert echoes_prompt("1. 10 different requests a user could give")  # "different requests a user could"
    # four words of it are not enough, and words around a placeholder do not join
    assert not echoes_prompt("Show me different requests a user made today")  # 4: different requests a user
    assert not echoes_prompt("one request per line of the shop's inventory please")  # 4: one request per line
    assert not echoes_prompt("List the five newest pets in the store for me")
    assert echoes_prompt('{"api_name": "petstore.list_pets", "api_call": "petstore.list_pets()"}')  # a document
    document = {"api_name": "petstore.list_pets", "api_call": "petstore.list_pets()"}
    result = filter_candidates([(document, ["Write one request per line. Do not name it", "List every pet you sell"])],
                               [], per_api=10)
    assert result.kept == [("petstore.list_pets", "List every pet you sell")]
    assert [(d.text, d.reason) for d in result.dropped] == [("Write one request per line. Do not name it",
                                                             "copies_prompt")]
