"""Scoring responses against an API catalog: which API a call names, and its argument score.

The rules and worked examples are in docs/catalog_scoring.md. A response is parsed with :mod:`ast`
only: nothing in it is compiled, evaluated or executed.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from ratune.catalog.schema import dotted_name, parse_api_call
from ratune.errors import RatuneError

#: Verdicts, in report order (the same names as the APIBench metrics' OUTCOMES).
VERDICTS = ("correct", "error", "hallucination")

#: The argument-level measures :meth:`CatalogScorer.score` aggregates besides the verdicts.
ARGUMENT_MEASURES = ("args_required_present", "args_values_equal")

#: Characters of a response's api_call that are parsed (the rest: ``truncated``); bounds hostile input.
MAX_CALL_CHARS = 10_000

#: The marker that starts a full answer's api_call field (sources/prompt.py, ANSWER_MARKERS).
API_CALL_MARKER = "<<<api_call>>>"

#: Why a response has no parsed call (``CatalogScore.reason``).
REASONS = {
    "no_text": "the response has no text (missing or not a string)",
    "unparseable": "the api_call is not Python (a syntax error, a null byte, or nesting too deep "
                   "for the parser)",
    "no_call": "the api_call parses but holds no call",
}

_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)



def is_literal(node: ast.AST) -> bool:
    """Whether ``node`` is a plain literal: a constant, a signed number, or a tuple, list, set or
    dict of plain literals. Only such nodes are given to ``ast.literal_eval``."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Constant):
            continue
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            if not (isinstance(n.operand, ast.Constant) and type(n.operand.value) in (int, float, complex)):
                return False
            continue
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            stack.extend(n.elts)
            continue
        if isinstance(n, ast.Dict):
            if any(k is None for k in n.keys):  # {**x}
                return False
            stack.extend(n.keys)
            stack.extend(n.values)
            continue
        return False
    return True


_NOT_LITERAL = object()


def literal_value(node: ast.AST):
    """The Python value of a plain literal node (:func:`is_literal`), else a sentinel (:func:`has_value`)."""
    if not is_literal(node):
        return _NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return _NOT_LITERAL


def has_value(value) -> bool:
    """False for the sentinel :func:`literal_value` returns for a non-literal."""
    return value is not _NOT_LITERAL


def same_value(a, b) -> bool:
    """Literal equality with types (``1``, ``1.0`` and ``True`` differ), containers element by element."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif x != y:
            return False
    return True


def _as_string(node: ast.AST | None) -> str | None:
    """Identifying value of an argument node: a str literal's text, another literal's repr, else None."""
    if node is None:
        return None
    value = literal_value(node)
    if not has_value(value):
        return None
    return value if isinstance(value, str) else repr(value)


def _positional(call: ast.Call) -> list[ast.AST]:
    """The positional argument nodes up to the first ``*args`` (later ones cannot be placed)."""
    out = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            break
        out.append(arg)
    return out


def _keywords(call: ast.Call) -> dict[str, ast.AST]:
    """``{name: value_node}`` of a call's keywords (``**kw`` skipped, the first of a name kept)."""
    out: dict[str, ast.AST] = {}
    for kw in call.keywords:
        if kw.arg is not None:
            out.setdefault(kw.arg, kw.value)
    return out


def _argument_names(document: dict | None) -> list[str]:
    names = []
    for arg in (document or {}).get("arguments") or ():
        if isinstance(arg, dict) and isinstance(arg.get("name"), str):
            names.append(arg["name"])
    return names


def bound_arguments(call: ast.Call, document: dict | None) -> dict[str, ast.AST]:
    """``{argument name: value node}`` of a call, positional arguments named in the document's
    ``arguments`` order (past its end ``"#i"``); a keyword wins over a positional argument."""
    names = _argument_names(document)
    out: dict[str, ast.AST] = {}
    for i, node in enumerate(_positional(call)):
        out[names[i] if i < len(names) else f"#{i}"] = node
    out.update(_keywords(call))
    return out


def default_identifying(document: dict | None) -> list | None:
    """A document's ``identifying_arguments``, else the positions of string literals in its own
    ``api_call``; None without a document or a parseable api_call."""
    if not document:
        return None
    given = document.get("identifying_arguments")
    if given:
        return list(given)
    try:
        own = parse_call(document.get("api_call"))
    except ValueError:
        return None
    return [i for i, node in enumerate(_positional(own)) if isinstance(literal_value(node), str)]


def call_identity(call: ast.Call, document: dict | None) -> tuple | None:
    """The identity key ``(callee dotted path, identifying values)`` of ``call`` under
    ``document``'s rule (None: the call's own positional string literals); None for a callee
    that is not a dotted name."""
    callee = dotted_name(call.func)
    if callee is None:
        return None
    identifying = default_identifying(document)
    if identifying is None:
        values = []
        for node in _positional(call):
            value = literal_value(node)
            if isinstance(value, str):
                values.append(value)
        return callee, tuple(values)
    names = _argument_names(document)
    positional, keywords = _positional(call), _keywords(call)
    values = []
    for ident in identifying:
        node = None
        if isinstance(ident, bool):  # JSON true/false is no index
            pass
        elif isinstance(ident, int):
            if ident < len(positional):
                node = positional[ident]
            elif ident < len(names):
                node = keywords.get(names[ident])
        elif isinstance(ident, str):
            node = keywords.get(ident)
            if node is None and ident in names and names.index(ident) < len(positional):
                node = positional[names.index(ident)]
        values.append(_as_string(node))
    return callee, tuple(values)


def iter_calls(tree: ast.AST) -> Iterable[ast.Call]:
    """The ``Call`` nodes of a tree in textual pre-order, iteratively (no recursion limit)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call):
            yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def parse_call(text: str) -> ast.Call:
    """The call node of an ``api_call`` of at most :data:`MAX_CALL_CHARS` characters
    (:func:`ratune.catalog.schema.parse_api_call`); ValueError with the reason."""
    if isinstance(text, str) and len(text) > MAX_CALL_CHARS:
        raise ValueError(f"longer than {MAX_CALL_CHARS} characters")
    return parse_api_call(text)[1]


class CatalogIndex:
    """Identity keys of a catalog's documents, built once; :meth:`identify` names a call's APIs.

    Raises:
        RatuneError: naming the API: a missing or repeated api_name, or a bad api_call.
    """

    def __init__(self, documents: Sequence[dict]):
        self.documents: dict[str, dict] = {}
        self.keys: dict[str, tuple] = {}
        self._by_callee: dict[str, list[tuple[str, tuple, dict]]] = {}
        for position, doc in enumerate(documents):
            name = doc.get("api_name") if isinstance(doc, dict) else None
            if not isinstance(name, str) or not name:
                raise RatuneError(f"catalog document {position + 1}: api_name missing or not a string")
            if name in self.documents:
                raise RatuneError(f"catalog document {position + 1}: api_name {name!r} repeated")
            try:
                call = parse_call(doc.get("api_call"))
            except ValueError as exc:
                raise RatuneError(f"catalog API {name!r}: api_call {doc.get('api_call')!r}: {exc}") from None
            key = call_identity(call, doc)
            self.documents[name] = doc
            self.keys[name] = key
            self._by_callee.setdefault(key[0], []).append((name, key, doc))

    @property
    def api_names(self) -> list[str]:
        """The catalog's api_names in document order."""
        return list(self.documents)

    def identify(self, call: ast.Call) -> tuple[str, ...]:
        """The api_names (document order) whose identity key ``call`` has under each one's rule."""
        callee = dotted_name(call.func)
        if callee is None:
            return ()
        return tuple(name for name, key, doc in self._by_callee.get(callee, ())
                     if call_identity(call, doc) == key)



def extract_call_text(text) -> str | None:
    """The api_call part of a response: after ``<<<api_call>>>`` (and a colon) up to the next
    ``<<<``, or the whole text when the marker is absent (a bare call); None for a non-string."""
    if not isinstance(text, str):
        return None
    start = text.find(API_CALL_MARKER)
    if start < 0:
        return text.strip()
    rest = text[start + len(API_CALL_MARKER):]
    end = rest.find("<<<")
    rest = rest if end < 0 else rest[:end]
    rest = rest.lstrip()
    if rest.startswith(":"):
        rest = rest[1:]
    return rest.strip()


def _candidates(call_text: str) -> list[str]:
    """The cuts tried, in order (docs/catalog_scoring.md, "What is parsed")."""
    out = [call_text]
    stripped = call_text.strip().rstrip("<,").strip().strip("`'\"").strip()
    if stripped != call_text:
        out.append(stripped)
    close = stripped.rfind(")")
    if close >= 0 and close + 1 != len(stripped):
        out.append(stripped[:close + 1])
    return out


def parse_response_calls(call_text: str) -> list[ast.Call] | None:
    """Every call of the first cut of ``call_text`` that parses as Python, or None when none parses."""
    for candidate in _candidates(call_text):
        try:
            tree = ast.parse(candidate, mode="exec")
        except _PARSE_ERRORS:
            continue
        try:
            return list(iter_calls(tree))
        except (RecursionError, MemoryError):  # pragma: no cover - the walk is iterative
            return None
    return None


@dataclass(frozen=True)
class CatalogScore:
    """The score of one response (docs/catalog_scoring.md); ``reason`` is a key of :data:`REASONS`
    when no call was parsed, the argument fields are set for correct responses only."""

    verdict: str
    gold: str
    api_call: str | None
    named: tuple[str, ...] = ()
    reason: str | None = None
    truncated: bool = False
    required_present: bool = False
    values_equal: bool = False
    missing: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON-ready dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def argument_score(response: ast.Call, gold: ast.Call, document: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(missing, mismatched)`` argument names of a response call that names the gold API."""
    given = bound_arguments(response, document)
    specs = {a["name"]: a for a in document.get("arguments") or ()
             if isinstance(a, dict) and isinstance(a.get("name"), str)}
    missing = tuple(name for name, spec in specs.items() if spec.get("required") is True and name not in given)
    mismatched = []
    for name, gold_node in bound_arguments(gold, document).items():
        want = literal_value(gold_node)
        if not has_value(want):
            continue  # the gold call fixes no value here
        node = given.get(name)
        if node is None:
            spec = specs.get(name, {})
            default = spec.get("default")
            if spec.get("required") is not True and default is not None and same_value(
                    _jsonish(want), default):
                continue  # omitted, and the document's default is the gold value
            mismatched.append(name)
            continue
        got = literal_value(node)
        if not (has_value(got) and same_value(got, want)):
            mismatched.append(name)
    return missing, tuple(mismatched)


def _jsonish(value):
    """A literal as JSON would hold it (tuples as lists), to compare with a document default."""
    if isinstance(value, (tuple, list)):
        return [_jsonish(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonish(v) for k, v in value.items()}
    return value


class CatalogScorer:
    """Scores responses against one catalog's documents; RatuneError as :class:`CatalogIndex`."""

    def __init__(self, documents: Sequence[dict]):
        self.index = CatalogIndex(documents)
        self._gold_calls: dict[str, ast.Call] = {}

    def _gold_call(self, gold_api_name: str, gold_call: str | None) -> ast.Call:
        if gold_call is None:
            if gold_api_name not in self._gold_calls:
                self._gold_calls[gold_api_name] = parse_call(self.index.documents[gold_api_name]["api_call"])
            return self._gold_calls[gold_api_name]
        try:
            call = parse_call(gold_call)
        except ValueError as exc:
            raise RatuneError(f"gold api_call {gold_call!r} for {gold_api_name!r}: {exc}") from None
        if gold_api_name not in self.index.identify(call):
            raise RatuneError(f"gold api_call {gold_call!r} does not identify {gold_api_name!r}")
        return call

    def score_text(self, text, gold_api_name: str, gold_call: str | None = None) -> CatalogScore:
        """Score one response ``text`` (a full answer or a bare call) for ``gold_api_name``;
        ``gold_call`` (default the document's api_call) decides ``values_equal``.

        Raises:
            RatuneError: an unknown gold_api_name, or a gold_call that does not parse or identify it.
        """
        if gold_api_name not in self.index.documents:
            raise RatuneError(f"gold API {gold_api_name!r} is not in the catalog")
        gold = self._gold_call(gold_api_name, gold_call)
        call_text = extract_call_text(text)
        if call_text is None:
            return CatalogScore("error", gold_api_name, None, reason="no_text")
        truncated = len(call_text) > MAX_CALL_CHARS
        if truncated:
            call_text = call_text[:MAX_CALL_CHARS]
        calls = parse_response_calls(call_text)
        if calls is None or not calls:
            return CatalogScore("error", gold_api_name, call_text, truncated=truncated,
                                reason="unparseable" if calls is None else "no_call")
        named: dict[str, None] = {}
        first_gold = None
        for call in calls:
            names = self.index.identify(call)
            named.update(dict.fromkeys(names))
            if first_gold is None and gold_api_name in names:
                first_gold = call
        named_t = tuple(named)
        if first_gold is None:
            verdict = "error" if named_t else "hallucination"
            return CatalogScore(verdict, gold_api_name, call_text, named_t, truncated=truncated)
        missing, mismatched = argument_score(first_gold, gold, self.index.documents[gold_api_name])
        return CatalogScore("correct", gold_api_name, call_text, named_t, truncated=truncated,
                            required_present=not missing, values_equal=not mismatched,
                            missing=missing, mismatched=mismatched)

    def score(self, responses: Sequence[dict]) -> dict:
        """Score dicts of ``text``, ``api_name`` and optional ``api_call``: ``{"n", "counts",
        "percent", "per_response"}``, percentages of all n (docs/catalog_scoring.md, "Aggregates").

        Raises:
            RatuneError: as :meth:`score_text`.
        """
        measures = (*VERDICTS, *ARGUMENT_MEASURES)
        counts = dict.fromkeys(measures, 0)
        per_response = []
        for response in responses:
            result = self.score_text(response.get("text"), response.get("api_name"), response.get("api_call"))
            counts[result.verdict] += 1
            counts["args_required_present"] += result.required_present
            counts["args_values_equal"] += result.values_equal
            per_response.append(result.as_dict())
        n = len(responses)
        return {"n": n, "counts": counts,
                "percent": {m: 100.0 * counts[m] / n if n else 0.0 for m in measures},
                "per_response": per_response}
