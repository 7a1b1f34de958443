"""Which BFCL entries a tool set has already shown a model (``ratune eval bfcl --unseen-by``,
docs/function_calling.md): an entry is seen when a tool it offers (distractors included) matches a
tool of the set by signature, or its query is a near duplicate of one of the set's queries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from ratune.sources.toolset import SPLIT_FILES, load_rows, load_tools
from ratune.sources.validate import NEAR_DUPLICATE_JACCARD, normalise, similar_pairs, tokens


def tool_signature(tool: Mapping) -> tuple[str, frozenset[str]]:
    """A tool's name without its namespace (``math.hypot`` -> ``hypot``), case-folded, and the set of
    its parameter names: two tools with the same signature count as the same tool."""
    name = str(tool.get("name", "")).rsplit(".", 1)[-1].casefold()
    properties = (tool.get("parameters") or {}).get("properties") if isinstance(tool.get("parameters"), dict) else None
    return name, frozenset(properties) if isinstance(properties, dict) else frozenset()


def entry_query(entry) -> str:
    """The user text of a single-turn BFCL entry (its user messages, one per line)."""
    return "\n".join(m["content"] for m in entry.question[0] if m.get("role") == "user")


def seen_entries(entries: Sequence, folder: str | os.PathLike) -> dict[str, str]:
    """``{entry id: why}`` for the ``entries`` the tool set in ``folder`` has seen: ``tool NAME``
    (a tool whose :func:`tool_signature` one of the set's tools has) or ``query`` (its
    :func:`entry_query` normalised-equal to, or with a token Jaccard of at least
    :data:`~ratune.sources.validate.NEAR_DUPLICATE_JACCARD` with, a query of the set's rows, both
    splits).

    Raises:
        RatuneError, InputError: ``folder`` is not a readable tool set (sources/toolset.py).
    """
    tools = load_tools(folder)
    signatures = {tool_signature(t) for t in tools.values()}
    queries = [row["query"] for split in SPLIT_FILES if (Path(folder) / SPLIT_FILES[split]).is_file()
               for _, row in load_rows(folder, split, tools)]
    seen: dict[str, str] = {}
    for entry in entries:
        matched = next((fn for fn in entry.functions if tool_signature(fn) in signatures), None)
        if matched is not None:
            seen[entry.id] = f"tool {matched.get('name')}"
    exact = {normalise(q) for q in queries}
    texts = [entry_query(e) for e in entries]
    for entry, text in zip(entries, texts):
        if entry.id not in seen and normalise(text) in exact:
            seen[entry.id] = "query"
    for _, j, _ in similar_pairs([tokens(q) for q in queries], [tokens(t) for t in texts], NEAR_DUPLICATE_JACCARD):
        seen.setdefault(entries[j].id, "query")
    return seen
