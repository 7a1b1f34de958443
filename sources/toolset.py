"""A tool set: function-calling rows and the tools they offer, imported into a folder of their own
by ``ratune tools import`` and read as a hub (layout: docs/function_calling.md)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Iterable, Sequence

from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, read_json_object, sha256_file, write_json, write_text
from ratune.manifest import base_manifest
from ratune.output import StageOutput
from ratune.sources.tools import ToolRow, load_tool_rows

#: The stage name of ``ratune tools import`` (its manifest's ``command``).
TOOLS_IMPORT_STAGE = "tools import"
#: The manifest's ``kind``.
TOOL_SET_KIND = "tool_set"
TOOLS_FILE = "tools.jsonl"
MANIFEST_FILE = "manifest.json"
#: The row file of each split.
SPLIT_FILES = {"train": "train.jsonl", "eval": "eval.jsonl"}
#: The categories ``--bfcl`` reads whose rows call nothing.
BFCL_NO_CALL_CATEGORIES = ("irrelevance", "live_irrelevance")


def tool_key(tool: dict) -> str:
    """The key of a tool: sha256 of its compact JSON in its own key order (the order prompts show),
    first 16 hex digits."""
    text = json.dumps(tool, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def bfcl_tool_rows(categories: Sequence[str], data_dir: str | os.PathLike) -> tuple[list[tuple[str, ToolRow]], dict]:
    """BFCL's single-turn entries of ``categories`` as ``(entry id, row)``, with the answer key's
    first accepted answer as calls; multi-turn entries and unpassable keys are left out.

    Returns:
        ``(rows, skipped)``; ``skipped``: ``{"multi_turn": [ids], "unpassable": {id: reason}}``.
    Raises:
        RatuneError: a category with no answer key that is not an irrelevance category.
    """
    from ratune.sources.bfcl import load_bfcl, possible_answer_calls, unpassable_key

    rows, skipped = [], {"multi_turn": [], "unpassable": {}}
    for category in categories:
        for entry in load_bfcl(data_dir, category):
            if entry.possible_answer is None and category not in BFCL_NO_CALL_CATEGORIES:
                raise RatuneError(f"BFCL category {category}: no answer key to train on")
            messages = entry.question[0] if len(entry.question) == 1 else []
            roles = [m.get("role") for m in messages]
            if roles not in (["user"], ["system", "user"]):
                skipped["multi_turn"].append(entry.id)
                continue
            reason = unpassable_key(entry.possible_answer, entry.functions) if entry.possible_answer else None
            if reason is not None:
                skipped["unpassable"][entry.id] = reason
                continue
            calls = possible_answer_calls(entry.possible_answer, entry.functions) if entry.possible_answer else []
            rows.append((entry.id, ToolRow(line=entry.line, query=messages[-1]["content"], tools=entry.functions,
                                           calls=calls, shape="bfcl",
                                           system=messages[0]["content"] if len(messages) == 2 else None)))
    return rows, skipped


def split_rows(rows: Sequence[dict], eval_fraction: float, seed: int) -> dict[str, list[dict]]:
    """Split rows in linked groups (the same set of tool names, or queries the leakage check would
    flag), shuffled with ``random.Random(seed)``, giving eval ``round(eval_fraction * len(rows))``
    rows or more; rows keep their order within a split."""
    from ratune.sources.validate import NEAR_DUPLICATE_JACCARD, normalise, similar_pairs, tokens

    parent = list(range(len(rows)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        for key in (("tools", *sorted(row["tool_names"])), ("query", normalise(row["query"]))):
            if key in first:
                parent[find(i)] = find(first[key])
            else:
                first[key] = i
    queries = [tokens(row["query"]) for row in rows]
    for i, j, _ in similar_pairs(queries, queries, NEAR_DUPLICATE_JACCARD):
        if i != j:
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(find(i), []).append(i)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    target, held = round(eval_fraction * len(rows)), set()
    for members in order:
        if len(held) >= target:
            break
        held.update(members)
    return {"train": [r for i, r in enumerate(rows) if i not in held],
            "eval": [r for i, r in enumerate(rows) if i in held]}


def _records(rows: Iterable[tuple[str, ToolRow]], tools: dict[str, dict]) -> list[dict]:
    """Row records; each distinct tool is added to ``tools`` under its key."""
    out = []
    for row_id, row in rows:
        keys = []
        for tool in row.tools:
            key = tool_key(tool)
            tools.setdefault(key, tool)
            keys.append(key)
        out.append({"id": row_id, "query": row.query, **({"system": row.system} if row.system else {}),
                    "tools": keys, "tool_names": [t["name"] for t in row.tools], "calls": list(row.calls)})
    return out


def import_tool_set(out: str | os.PathLike, *, rows_file: str | os.PathLike | None = None,
                    bfcl: Sequence[str] = (), name: str | None = None, eval_fraction: float = 0.2,
                    seed: int = 0, bfcl_venv: str | os.PathLike | None = None) -> dict:
    """Import function-calling rows into the tool-set folder ``out``.

    Args:
        rows_file: JSON lines of xLAM or chat rows; bfcl: BFCL categories to read instead.
        name: the tool set's name (default: the file's stem, or ``bfcl``).
        eval_fraction: share of rows held out as eval.
    Returns:
        The manifest written.
    Raises:
        RatuneError: neither or both sources; a fraction outside [0, 1); a folder ratune did not make.
        InputError: a bad row, naming file, line and JSON pointer.
    """
    if (rows_file is None) == (not bfcl):
        raise RatuneError("give one source: a rows file or BFCL categories")
    if name is not None:
        check_tool_set_name(name)
    if not 0 <= eval_fraction < 1:
        raise RatuneError(f"--eval-fraction {eval_fraction}: expected a share in [0, 1)")
    output = StageOutput(out, TOOLS_IMPORT_STAGE, replace=True, command=TOOLS_IMPORT_STAGE)
    output.check()
    skipped: dict = {}
    if rows_file is not None:
        pairs = [(f"{Path(rows_file).name}:{r.line}", r) for r in load_tool_rows(rows_file)]
        source = {"kind": "rows", "path": str(rows_file), "sha256": sha256_file(rows_file)}
    else:
        from ratune.sources.bfcl import bfcl_data_dir, bfcl_version

        data = bfcl_data_dir(bfcl_venv)
        pairs, skipped = bfcl_tool_rows(bfcl, data)
        source = {"kind": "bfcl", "categories": list(bfcl), "bfcl_version": bfcl_version(bfcl_venv)}
    if not pairs:
        raise RatuneError(f"{rows_file or 'BFCL ' + ', '.join(bfcl)}: no rows to import")
    tools: dict[str, dict] = {}
    splits = split_rows(_records(pairs, tools), eval_fraction, seed)
    manifest = {**base_manifest(TOOLS_IMPORT_STAGE), "kind": TOOL_SET_KIND,
                "name": name or (Path(rows_file).stem if rows_file else "bfcl"), "source": source,
                "split": {"eval_fraction": eval_fraction, "seed": seed, "by": "tool_names_and_query"},
                "counts": {"tools": len(tools), **{s: len(r) for s, r in splits.items()},
                           "calls": sum(len(r["calls"]) for rs in splits.values() for r in rs),
                           "no_call_rows": sum(not r["calls"] for rs in splits.values() for r in rs)},
                "skipped": skipped}
    with output.writing() as folder:
        write_text(folder / TOOLS_FILE, "".join(json.dumps({"key": k, "tool": t}, ensure_ascii=False) + "\n"
                                                for k, t in tools.items()))
        for split, rows in splits.items():
            if rows:  # no file for an empty split: the hub then has no such split
                write_text(folder / SPLIT_FILES[split], "".join(
                    json.dumps({k: v for k, v in r.items() if k != "tool_names"}, ensure_ascii=False) + "\n"
                    for r in rows))
        manifest["files"] = {f.name: sha256_file(f) for f in sorted(folder.glob("*.jsonl"))}
        write_json(folder / MANIFEST_FILE, manifest)  # last; the folder is swapped in whole
    return manifest


def read_tool_set_manifest(folder: str | os.PathLike) -> dict:
    """The manifest of a tool-set folder.

    Raises:
        RatuneError: no such folder, no manifest, or a manifest of another kind.
    """
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise RatuneError(f"{folder}: not a tool set (no {MANIFEST_FILE}); make one with `ratune tools import`")
    manifest = read_json_object(path)
    if manifest.get("kind") != TOOL_SET_KIND:
        raise RatuneError(f"{path}: not a tool set's manifest (kind {manifest.get('kind')!r})")
    return manifest


def is_tool_set(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a tool set's manifest."""
    path = Path(folder) / MANIFEST_FILE
    try:
        return path.is_file() and read_json_object(path).get("kind") == TOOL_SET_KIND
    except (InputError, OSError, RatuneError):
        return False


def load_tools(folder: str | os.PathLike) -> dict[str, dict]:
    """The tools of a tool set by key, in file order.

    Raises:
        InputError: a line that is not ``{"key", "tool"}``, naming file and line.
    """
    path = Path(folder) / TOOLS_FILE
    tools = {}
    for line, obj in iter_jsonl(path):
        if not isinstance(obj.get("key"), str) or not isinstance(obj.get("tool"), dict):
            raise InputError(str(path), line, None, 'expected {"key": str, "tool": {...}}')
        tools[obj["key"]] = obj["tool"]
    return tools


def load_rows(folder: str | os.PathLike, split: str, tools: dict[str, dict]) -> list[tuple[int, dict]]:
    """A split's rows as ``(line, row)`` with each row's ``tools`` resolved to the tools.

    Raises:
        InputError: a row naming a tool key that ``tools`` lacks, or missing a field (file, line, field).
    """
    path = Path(folder) / SPLIT_FILES[split]
    out = []
    for line, obj in iter_jsonl(path):
        for field in ("id", "query", "tools", "calls"):
            if field not in obj:
                raise InputError(str(path), line, field, "missing")
        missing = [k for k in obj["tools"] if k not in tools]
        if missing:
            raise InputError(str(path), line, "tools", f"no tool with key {missing[0]} in {TOOLS_FILE}")
        out.append((line, {**obj, "tools": [tools[k] for k in obj["tools"]]}))
    return out


#: What ``ratune tools import --from`` reads.
IMPORT_SOURCES = ("rows", "bfcl")


def check_source(text: str) -> str:
    """Return ``text`` if it can be a source (an existing file, or a BFCL category); else RatuneError."""
    path = Path(text)
    if path.is_file() or re.fullmatch(r"[a-z][a-z0-9_]*", text):
        return text
    if not text:
        raise RatuneError("an empty source; give a rows file (--from rows) or BFCL categories (--from bfcl)")
    if path.is_dir():
        raise RatuneError(f"{path}: is a folder; give a JSON-lines rows file, or BFCL category names")
    raise RatuneError(f"{path}: no such file (and not a BFCL category name such as simple_python)")


def check_tool_set_name(name: str) -> str:
    """Return ``name`` if it can name a tool set (letters, digits, ``_-.``; no APIBench hub's); else RatuneError."""
    from ratune.sources.apibench import HUBS

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise RatuneError(f"tool set name {name!r}: use letters, digits, _, - and .")
    if name in HUBS:
        raise RatuneError(f"tool set name {name!r}: an APIBench hub's name; choose another")
    return name


def add_import_arguments(parser) -> None:
    """The arguments of ``ratune tools import`` (docs/function_calling.md)."""
    from typing import Annotated

    from pydantic import Field

    from ratune.args import bounded, checked, output_dir
    from ratune.config import Seed

    parser.add_argument("--from", dest="source_kind", required=True, choices=IMPORT_SOURCES,
                        help="rows: a JSON-lines file of xLAM (query, tools, answers) or chat (messages with "
                             "tool_calls, tools) rows; bfcl: BFCL's shipped categories (make bfcl-setup), answers "
                             "from their answer keys")
    parser.add_argument("sources", metavar="SOURCE", nargs="+",
                        type=checked(check_source, "source", good="file", bad=("", "missing", "folder")),
                        help="the rows file, or the BFCL categories (e.g. simple_python multiple irrelevance)")
    parser.add_argument("--out", required=True, type=output_dir, help="the tool-set folder")
    parser.add_argument("--name", default=None, type=checked(check_tool_set_name, "tool set name", good="mytools",
                                                             bad=("", "a b", "torchhub")),
                        help="the tool set's name (default: the rows file's stem, or bfcl)")
    parser.add_argument("--eval-fraction", default=0.2,
                        type=bounded(Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)], "eval fraction"),
                        help="share of rows held out as eval (default 0.2); rows that offer the same tool names or "
                             "ask near-duplicate queries stay on one side")
    parser.add_argument("--seed", type=bounded(Seed, "seed"), default=0, help="the split's seed (default 0)")


def cli_import(args) -> int:
    """``ratune tools import``: import, then print the counts."""
    if args.source_kind == "rows" and len(args.sources) != 1:
        raise RatuneError(f"--from rows: one rows file, got {len(args.sources)} sources")
    rows = args.sources[0] if args.source_kind == "rows" else None
    manifest = import_tool_set(args.out, rows_file=rows, bfcl=args.sources if rows is None else (), name=args.name,
                               eval_fraction=args.eval_fraction, seed=args.seed)
    counts, skipped = manifest["counts"], manifest["skipped"]
    print(f"tool set {manifest['name']}: {counts['tools']} tools; {counts['train']} train and {counts['eval']} eval "
          f"rows ({counts['no_call_rows']} call nothing)")
    for reason, items in skipped.items():
        if items:
            print(f"  left out ({reason.replace('_', ' ')}): {len(items)}")
    print(f"wrote {args.out}")
    return 0


def draw_shots(folder: str | os.PathLike, k: int, seed: int) -> tuple[Shot, ...]:
    """``k`` rows of a tool set's train split that call at least one tool, drawn with ``seed``, in file order.

    Raises:
        RatuneError: ``folder`` is no tool set, or its train split has fewer than ``k`` such rows.
    """
    from ratune.sources.bfcl import Shot

    if not is_tool_set(folder):
        raise RatuneError(f"--shots-from {folder}: not a tool-set folder (ratune tools import)")
    rows = [(line, row) for line, row in load_rows(folder, "train", load_tools(folder)) if row["calls"]]
    if len(rows) < k:
        raise RatuneError(f"--shots {k}: tool set {folder} has {len(rows)} training rows that call a tool")
    drawn = sorted(random.Random(seed).sample(range(len(rows)), k))
    return tuple(Shot(line=rows[i][0], query=rows[i][1]["query"], functions=tuple(rows[i][1]["tools"]),
                      calls=tuple(rows[i][1]["calls"])) for i in drawn)
