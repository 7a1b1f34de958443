"""sources/unseen.py: the BFCL entries a tool set has seen (a tool with the same signature, or a
near-duplicate query), worked out on hand-written entries."""

from __future__ import annotations

import json

import pytest

from ratune.sources.bfcl import BfclEntry

QUERY = "Find the three nearest vegan restaurants to the central station in Berlin tonight"
SEARCH = {"name": "search_restaurants", "description": "Search restaurants",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "diet": {"type": "string"}},
                         "required": ["city"]}}


def _entry(entry_id: str, query: str, *functions) -> BfclEntry:
    return BfclEntry(id=entry_id, category="simple_python", question=[[{"role": "user", "content": query}]],
                     functions=list(functions), possible_answer=None, line=1)


def _tool_set(tmp_path):
    from ratune.sources.toolset import import_tool_set

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"query": QUERY, "tools": [SEARCH],
                                "answers": [{"name": "search_restaurants", "arguments": {"city": "Berlin"}}]}) + "\n")
    import_tool_set(tmp_path / "ts", rows_file=rows, eval_fraction=0)
    return tmp_path / "ts"


def test_an_entry_is_seen_by_a_tool_signature_or_a_near_duplicate_query(tmp_path):
    from ratune.sources.unseen import seen_entries, tool_signature

    assert tool_signature({"name": "places.Search_Restaurants", "parameters": SEARCH["parameters"]}) == (
        "search_restaurants", frozenset({"city", "diet"}))
    other = {"name": "search_restaurants", "parameters": {"type": "object", "properties": {"city": {}}}}
    entries = [
        _entry("namespaced", "Where can I eat?", {"name": "calc.add", "parameters": {}},  # a distractor
               {**SEARCH, "name": "places.search_restaurants"}),  # the same tool under a namespace: seen
        _entry("other_parameters", "Where can I eat?", other),  # same name, other parameters: unseen
        _entry("same_query", "  find the THREE nearest vegan restaurants to the central station in berlin tonight"),
        _entry("near_query", QUERY + " please"),  # 13 of 14 tokens shared: Jaccard 0.93 >= 0.9
        _entry("far_query", "Find vegan restaurants near me"),
    ]
    assert seen_entries(entries, _tool_set(tmp_path)) == {"namespaced": "tool places.search_restaurants",
                                                          "same_query": "query", "near_query": "query"}


@pytest.mark.bfcl
def test_eval_bfcl_leaves_out_the_entries_a_tool_set_has_seen(tmp_path, capsys):
    """simple_python_0's tool is in the tool set: --unseen-by leaves it out, the first two entries
    left are scored, and the cell records what was removed and why."""
    from ratune.cli import main
    from ratune.sources.bfcl import bfcl_data_dir, load_bfcl

    entry = load_bfcl(bfcl_data_dir(), "simple_python")[0]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"query": "Area of a triangle?", "tools": entry.functions, "answers": []}) + "\n")
    from ratune.sources.toolset import import_tool_set

    import_tool_set(tmp_path / "ts", rows_file=rows, eval_fraction=0)
    given = tmp_path / "given" / "simple_python"
    given.mkdir(parents=True)
    given.joinpath("responses.jsonl").write_text("".join(
        json.dumps({"id": f"simple_python_{i}", "text": "[]", "model": "m"}) + "\n" for i in range(4)))
    out = tmp_path / "out"
    assert main(["eval", "bfcl", "--responses", str(tmp_path / "given"), "--unseen-by", str(tmp_path / "ts"),
                 "--limit", "2", "--out", str(out)]) == 0
    metrics = json.loads((out / "simple_python" / "metrics.json").read_text())
    assert metrics["n"] == 2 and metrics["unseen_by"]["removed"] == {"simple_python_0": "tool calculate_triangle_area"}
    assert [json.loads(line)["id"] for line in (out / "simple_python" / "verdicts.jsonl").read_text().splitlines()] == [
        "simple_python_1", "simple_python_2"]
    identity = json.loads((out / "simple_python" / "identity.json").read_text())
    assert identity["unseen_by"] == {"tool_set": str((tmp_path / "ts").resolve()), "removed": ["simple_python_0"]}
    capsys.readouterr()
    assert main(["eval", "bfcl", "--responses", str(tmp_path / "given"), "--unseen-by", str(tmp_path),
                 "--out", str(tmp_path / "refused")]) == 2
    assert "--unseen-by " + str(tmp_path) + ": not a tool-set folder" in capsys.readouterr().err


def test_a_sweeps_bfcl_section_passes_the_tool_set_on(tmp_path):
    import ratune.sweep as sw
    from ratune.sweep.commands import bfcl_command
    from test_sweep import write_sweep

    sweep = sw.load_sweep(write_sweep(tmp_path, bfcl={"categories": ["multiple"], "unseen_by": "runs/tools/live"}))
    command = bfcl_command(sweep, sw.expand(sweep)[0])
    assert command[command.index("--unseen-by"):] == ["--unseen-by", "runs/tools/live"]
