"""ratune's strict metric: does the response name the question's own gold API? Outcomes and each
hub's rules: docs/scoring.md#the-strict-metric-ours."""

from __future__ import annotations

import re

from ratune.eval.scoring.hub_rules import HubRules
from ratune.eval.scoring.parse import WHITESPACE, encode, iter_calls, parse

#: Characters parsed from each loader name on; longer calls do not occur in APIBench, and the
#: bound keeps 1 MB responses cheap.
STRICT_WINDOW = 1000

#: Loader-name occurrences tried per response before giving up.
STRICT_MAX_TRIES = 50

_ESCAPED_QUOTE = re.compile(r"\\+(['\"])")
_ESCAPED_NEWLINE = re.compile(r"\\+n")


def normalize_call(api_call: str) -> str:
    """The extracted api_call as the strict metric parses it: escaped quotes and newlines undone,
    ``<<<api_provider>>>`` remains, whitespace and quotes stripped (docs/scoring.md#what-is-parsed)."""
    text = _ESCAPED_QUOTE.sub(r"\1", api_call)
    text = _ESCAPED_NEWLINE.sub("\n", text)
    text = text.strip().rstrip("<,").strip()  # remains of "\n<<<api_provider>>>" and separators
    return text.strip("'\"").strip()


def text_key(text: str) -> tuple:
    """The key of a call that names no loader: its whitespace-free text."""
    return ("text", WHITESPACE.sub(b"", encode(text)))


class StrictIndex:
    """A hub's API database as the strict metric knows it: ``database_keys`` (every key an entry
    names; secondary keys where :attr:`HubRules.database_extra_keys`) and ``loaders`` (the
    database's extra loader functions).
    """

    def __init__(self, api_database: list[dict], rules: HubRules):
        self.rules = rules
        self.database_keys: set = set()
        self.loaders: set = set()
        for doc in api_database:
            primary, extras, fn = self.identity_of_reference(doc["api_call"])
            self.database_keys.add(primary)
            if rules.database_extra_keys:
                self.database_keys.update(extras)
            if fn:
                self.loaders.add(fn)
        self._loader_re = rules.loader_pattern(self.loaders)

    def identity_of_reference(self, api_call: str):
        """``(primary_key, extra_keys, loader_function)`` of a database or gold api_call: its
        first call (outermost, textually first) that names an API, else its whitespace-free
        text."""
        root, src = parse(api_call)
        for call in iter_calls(root):
            ident = self.rules.call_identity(call, src)
            if ident is not None:
                return ident[0], ident[1], self.rules.loader_function(call, src)
        return text_key(normalize_call(api_call)), (), None

    def api_key(self, api_call: str) -> tuple:
        """The primary key that a database or gold api_call names."""
        return self.identity_of_reference(api_call)[0]

    def keys(self, api_call: str, parsed=None) -> set:
        """The API keys a response's extracted api_call names: the first loader call with arguments in a
        window of :data:`STRICT_WINDOW` characters at each loader name, else the first without
        arguments, else the whitespace-free text (docs/scoring.md#what-is-parsed). ``parsed``:
        ``(root, source)`` of ``api_call`` when already parsed.
        """
        norm = normalize_call(api_call)
        fallback = None
        for tries, match in enumerate(self._loader_re.finditer(norm)):
            if tries == STRICT_MAX_TRIES:
                break
            window = norm[match.start():match.start() + STRICT_WINDOW]
            if parsed is not None and window == api_call:
                root, src = parsed
            else:
                root, src = parse(window)
            keys, has_args = self._response_keys(root, src)
            if has_args:
                return keys
            if fallback is None and keys is not None:
                fallback = keys
        return fallback if fallback is not None else {text_key(norm)}

    def _response_keys(self, root, src: bytes):
        """``(keys, has_arguments)`` of the first loader call of a window, ``(None, False)``
        when it holds none."""
        for call in iter_calls(root):
            if not self.rules.is_loader(call, src, self.loaders):
                continue
            ident = self.rules.call_identity(call, src)
            if ident is None:
                continue
            args = call.child_by_field_name("arguments")
            return {ident[0], *ident[1]}, bool(args is not None and args.named_child_count)
        return None, False

    def outcome(self, keys: set, gold) -> str:
        """``correct`` when ``keys`` hold the gold key, ``error`` when they hold another key the
        database names, else ``hallucination``."""
        if gold in keys:
            return "correct"
        if keys & self.database_keys:
            return "error"
        return "hallucination"
