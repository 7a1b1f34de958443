"""The parser stack both APIBench metrics share: tree-sitter's Python grammar and the small
readers of its nodes. Nothing is executed or eval'd. Only :data:`PINNED_PARSER` reproduces the
official outcomes (docs/scoring.md, "Parser pin"), so :func:`parser_versions` goes with every result.
"""

from __future__ import annotations

import re
from importlib import metadata

from ratune.errors import RatuneError

#: Distributions whose versions decide the parse.
PARSER_DISTRIBUTIONS = ("tree-sitter", "tree-sitter-languages")

#: The versions that reproduce the official outcomes exactly.
PINNED_PARSER = {"tree-sitter": "0.20.1", "tree-sitter-languages": "1.9.1"}

_PARSER = None

#: Whitespace runs, removed from expression text that the strict metric compares.
WHITESPACE = re.compile(rb"\s+")
_STRING_PREFIX = re.compile(rb"^[rRbBuU]*")


def parser_versions() -> dict:
    """``{distribution: version}`` of the parser stack (``"not installed"`` when missing)."""
    out = {}
    for dist in PARSER_DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _parser():
    """The shared tree-sitter Python parser (created once; the official scripts create one per
    call, which gives the same trees because every parse starts from scratch)."""
    global _PARSER
    if _PARSER is None:
        try:
            from tree_sitter_languages import get_parser
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise RatuneError(
                "the scorer needs tree-sitter==0.20.1 and tree-sitter-languages==1.9.1 "
                f"(pip install tree-sitter==0.20.1 tree-sitter-languages==1.9.1): {exc}") from None
        _PARSER = get_parser("python")
    return _PARSER


def encode(text: str) -> bytes:
    """UTF-8 bytes of ``text`` as the parser reads them; lone surrogates become ``?`` (the official
    ``bytes(s, 'utf8')`` would raise)."""
    return text.encode("utf-8", errors="replace")


def parse(text: str):
    """Parse ``text`` as Python; returns ``(root_node, source_bytes)``. Never fails."""
    src = encode(text)
    return _parser().parse(src).root_node, src


def iter_calls(root):
    """``call`` nodes of a tree in textual pre-order (outer before inner). Iterative."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "call":
            yield node
        if node.child_count:
            stack.extend(reversed(node.children))


def string_value(node, src: bytes) -> bytes | None:
    """Content of a plain string literal node (no f-string interpolation), else None."""
    if node.type != "string":
        return None
    for child in node.children:
        if child.type == "interpolation":
            return None
    text = src[node.start_byte:node.end_byte]
    text = text[_STRING_PREFIX.match(text).end():]
    for quote in (b'"""', b"'''", b'"', b"'"):
        if text.startswith(quote) and text.endswith(quote) and len(text) >= 2 * len(quote):
            return text[len(quote):-len(quote)]
    return None


def value(node, src: bytes) -> bytes:
    """A string literal's content, else the expression's source text without whitespace (so the
    database's unquoted ``from_pretrained(runwayml/stable-diffusion-v1-5)`` still names a model)."""
    text = string_value(node, src)
    if text is None:
        text = WHITESPACE.sub(b"", src[node.start_byte:node.end_byte])
    return text.strip()


def call_parts(call, src: bytes):
    """``(function_text, positional_nodes, {keyword: value_node})`` of a ``call`` node; the
    function text has no whitespace, the first of repeated keywords wins, comments and ``*``/``**``
    splats are left out."""
    fn = call.child_by_field_name("function")
    args = call.child_by_field_name("arguments")
    fn_text = WHITESPACE.sub(b"", src[fn.start_byte:fn.end_byte]) if fn is not None else b""
    positional, keywords = [], {}
    if args is not None and args.type == "argument_list":
        for child in args.named_children:
            if child.type == "keyword_argument":
                name = child.child_by_field_name("name")
                val = child.child_by_field_name("value")
                if name is not None and val is not None:
                    keywords.setdefault(src[name.start_byte:name.end_byte], val)
            elif child.type not in ("comment", "list_splat", "dictionary_splat"):
                positional.append(child)
    return fn_text, positional, keywords
