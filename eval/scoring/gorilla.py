"""The official Gorilla metric (AST sub-tree matching), reproduced quirk for quirk from
docs/official_semantics.md ("semantics §N"; summary and how it is computed: docs/scoring.md). The
domain comparison (§6) and the denominator (§1) are the scorer's.
"""

from __future__ import annotations

from ratune.eval.scoring.hub_rules import HubRules, rules_for
from ratune.eval.scoring.parse import parse

_NO_MATCH = 1 << 62


def extract_api_call(text, hub: str) -> str | None:
    """Cut the api_call string out of a response text exactly as the official scripts do
    (semantics §2); None when there is nothing to parse (no text; TorchHub without ``api_call``).

    Raises:
        RatuneError: unknown hub.
    """
    if not isinstance(text, str):
        return None
    parts = text.split("api_call")
    if len(parts) == 1:
        return text if rules_for(hub).parses_text_without_marker else None
    seg = parts[1].split("api_provider")[0]
    start = seg.index(":") if ":" in seg else 0
    end = seg.rindex(")") if ")" in seg else -2
    return seg[start + 2:end + 1]


def candidates(root, src: bytes):
    """``(first_node_by_key, last_node)`` of the official candidate list (semantics §3 and §5):
    all that matching reads of it."""
    first: dict[bytes, object] = {}
    last = root
    stack = [root]
    while stack:
        node = stack.pop()
        last = node
        children = node.children
        if children:
            c0 = children[0]
            key = src[c0.start_byte:c0.end_byte]
            if key not in first:
                first[key] = node
            for child in children:
                if child.child_count:
                    stack.append(child)
    return first, last


def reference(api_call: str, rules: HubRules):
    """``(api_name, args)`` of one database api_call as the official ``get_args`` reads it, or
    None when the entry is skipped (semantics §4); the hub's rule keeps the arguments."""
    root, src = parse(api_call)
    if not root.children:
        return None
    node = root.children[0].children[0] if root.children[0].children else None
    if node is None or node.child_count == 0:
        return None
    kids = node.children
    api_name = src[kids[0].start_byte:kids[0].end_byte]
    args: list[bytes] = []
    if len(kids) > 1:
        for child in kids[1].children:
            arg = rules.reference_argument(child, src[child.start_byte:child.end_byte], src)
            if arg is not None:
                args.append(arg)
    if not args:
        return None
    return api_name, tuple(a.strip(b"'") for a in args)


class GorillaIndex:
    """A hub's API database as the gorilla metric matches against it (semantics §4 and §5), each
    api_call parsed once and references deduplicated. ``skipped_entries``: 0-based database lines
    the official scripts skip.
    """

    def __init__(self, api_database: list[dict], rules: HubRules):
        refs, seen = [], set()
        self.skipped_entries: list[int] = []
        for index, doc in enumerate(api_database):
            ref = reference(doc["api_call"], rules)
            if ref is None:
                self.skipped_entries.append(index)
                continue
            if ref in seen:
                continue
            seen.add(ref)
            refs.append((index, ref[0], ref[1][0], ref[1][1:]))
        groups: dict = {}
        for index, api_name, head, rest in refs:
            groups.setdefault(api_name, []).append((index, head, rest))
        self._groups = sorted(((g[0][0], name, tuple(g)) for name, g in groups.items()), key=lambda item: item[0])

    def match(self, root, src: bytes) -> tuple[int | None, bool]:
        """``(matched_index, fell_through)`` of a parsed api_call (semantics §5): the first matching
        database line, None for none (a hallucination); ``fell_through`` when matched on the last
        candidate (§5.3).
        """
        first, last = candidates(root, src)
        # the smallest matching index wins, as in the official file-order loop (§5.5)
        best, best_fell, last_text = _NO_MATCH, False, None
        for min_index, api_name, group in self._groups:
            if min_index >= best:
                break
            node = first.get(api_name)
            if node is None:  # fall-through: the last candidate (§5.3)
                if last_text is None:
                    last_text = src[last.start_byte:last.end_byte]
                text = last_text
            else:
                text = src[node.start_byte:node.end_byte]
            for index, head, rest in group:
                if index >= best:
                    break
                if head in text:
                    for arg in rest:
                        if arg not in text:
                            break
                    else:
                        best, best_fell = index, node is None
                        break
        return (None, False) if best == _NO_MATCH else (best, best_fell)
