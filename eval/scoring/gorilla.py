"""The official Gorilla metric (AST sub-tree matching), reproduced quirk for quirk.

The official APIBench AST evaluation (gorilla/eval/eval-scripts/ast_eval_{th,hf,tf}.py at commit
6ea5797), as specified by docs/official_semantics.md and summarised in
docs/scoring.md (cited as "semantics §N"): the api_call cut (§2, :func:`extract_api_call`), the
right-to-left depth-first candidate list keyed by each node's first child (§3,
:func:`candidates`), the per-hub selection of reference arguments with single-quote stripping
and skipped entries (§4, :func:`reference`), and the candidate loop that falls through to the
last candidate, substring matching and first-match-wins (§5, :class:`GorillaIndex`). The domain
comparison (§6) and the denominator (§1) are the scorer's (eval/scoring/scorer.py). The hub's
part of each rule is its :class:`~ratune.eval.scoring.hub_rules.HubRules`.
"""

from __future__ import annotations

from ratune.eval.scoring.hub_rules import HubRules, rules_for
from ratune.eval.scoring.parse import parse

_NO_MATCH = 1 << 62


def extract_api_call(text, hub: str) -> str | None:
    """Cut the api_call string out of a response text exactly as the official scripts do.

    Semantics §2: split on the literal ``api_call``; without it, TorchHub gives None (the
    response is "error" and is never parsed) while HuggingFace / TensorFlow Hub use the whole
    text (:attr:`~ratune.eval.scoring.hub_rules.HubRules.parses_text_without_marker`). Otherwise
    take the piece up to the next ``api_call``, cut it at ``api_provider``, and slice from the
    first ``:`` + 2 (0 + 2 without a colon) to the last ``)`` inclusive (or to the last character
    exclusive without a ``)``).

    Args:
        text: the response's ``text``; a non-string (missing text) gives None.
        hub: one of HUBS.

    Returns:
        The api_call string, or None when there is nothing to parse.

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
    """The official candidate list, reduced to what matching reads (semantics §3 and §5).

    The official walk pops a stack (root first; a child is pushed only if it has children), so
    nodes are visited parent first, siblings right to left; each node's key is the text of its
    first child. Matching only ever uses the *first* candidate with a given key and the *last*
    candidate (fall-through), so this returns ``(first_node_by_key, last_node)``. Iterative: no
    recursion limit applies to deep trees.
    """
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
    None when the entry is skipped (no children, or no kept arguments; semantics §4).

    ``args`` are bytes with single quotes stripped from both ends (double quotes are kept); which
    arguments are kept is the hub's rule (:meth:`HubRules.reference_argument`). The official
    scripts crash on an empty api_call, a call node without a second child or a positional
    argument that their keyword branch cannot index; none occurs in APIBench, and here they are
    skipped (first two) or kept as full text (the last) instead.
    """
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
    """A hub's API database as the gorilla metric matches against it (semantics §4 and §5).

    Every database api_call is parsed once. References are deduplicated: a later entry with the
    same ``(api_name, args)`` can never match when the earlier one did not, so only the first is
    kept (same result, fewer checks; TensorFlow Hub lists universal-sentence-encoder/4 220
    times).

    Args:
        api_database: the documents in file order (``api_call``).
        rules: the hub's rules.

    Attributes:
        skipped_entries: 0-based database lines the official scripts skip (semantics §4).
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
        """``(matched_index, fell_through)`` of a parsed api_call (semantics §5).

        ``matched_index`` is the 0-based database line of the first entry that matches, None
        when none does (a hallucination); ``fell_through`` is True when the match was made on the
        last candidate because no candidate carried the entry's api_name (semantics §5.3).
        """
        first, last = candidates(root, src)
        # Entries are grouped by api_name (groups ordered by their first entry), so the searched
        # node's text is sliced once per group; the smallest matching index wins, exactly as the
        # official file-order loop (§5.5).
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
