"""The catalog folder format: ``apis.jsonl``, one API document per line, and ``manifest.json``
(docs/catalogs.md, "The catalog folder"); the checks of a document and of a folder.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import os
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl
from ratune.sources.formats import dotted_name

APIS_FILE = "apis.jsonl"
MANIFEST_FILE = "manifest.json"
#: ``manifest.json``'s ``kind`` in a catalog folder.
CATALOG_KIND = "catalog"
#: The stage name of ``ratune catalog import`` (its manifest's ``command``, its owner marker).
IMPORT_STAGE = "catalog import"
#: Bumped when the document schema changes (recorded in the manifest).
SCHEMA_VERSION = 1

API_NAME = "api_name"
API_CALL = "api_call"
DESCRIPTION = "description"
DOMAIN = "domain"
PROVIDER = "provider"
ARGUMENTS = "arguments"
EXAMPLE_CODE = "example_code"
IDENTIFYING_ARGUMENTS = "identifying_arguments"

#: Every field of an API document, in the order ratune writes them.
DOCUMENT_FIELDS = (API_NAME, API_CALL, DESCRIPTION, DOMAIN, PROVIDER, ARGUMENTS, EXAMPLE_CODE,
                   IDENTIFYING_ARGUMENTS)
#: The fields a JSON-lines source must give (the others have defaults, :mod:`ratune.catalog.jsonl`).
REQUIRED_SOURCE_FIELDS = (API_NAME, API_CALL, DESCRIPTION)

ARG_NAME = "name"
ARG_TYPE = "type"
ARG_REQUIRED = "required"
ARG_DEFAULT = "default"
ARG_DESCRIPTION = "description"
#: Every field of an ``arguments`` entry, in the order ratune writes them.
ARGUMENT_FIELDS = (ARG_NAME, ARG_TYPE, ARG_REQUIRED, ARG_DEFAULT, ARG_DESCRIPTION)

#: ``domain`` of a document whose source names none (OpenAPI without tags, JSON lines without it).
DEFAULT_DOMAIN = "default"


def parse_api_call(text: str) -> tuple[str, ast.Call]:
    """``(callee dotted path, call node)`` of an ``api_call``, one Python call on a dotted callee;
    only :func:`ast.parse` runs. ValueError says why the text is not such a call."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty; expected a Python call such as pkg.func(arg)")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a Python expression ({exc.msg}); expected a call such as pkg.func(arg)") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes; nesting past the parser's limits
        raise ValueError(f"not a Python expression ({type(exc).__name__}); expected a call such as "
                         "pkg.func(arg)") from None
    call = tree.body
    if not isinstance(call, ast.Call):
        kind = type(call).__name__
        raise ValueError(f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind} expression, not a call; expected pkg.func(arg)")
    callee = dotted_name(call.func)
    if callee is None:
        raise ValueError("the callee is not a dotted name (a.b.c); expected pkg.func(arg)")
    return callee, call


def is_identifier(text: str) -> bool:
    """Whether ``text`` can name a Python keyword argument or a catalog client (not a keyword)."""
    return isinstance(text, str) and text.isidentifier() and not keyword.iskeyword(text)


def _is_json_value(value, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json_value(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_value(v, depth + 1) for k, v in value.items())
    return False


def _text(doc: dict, key: str, where: tuple, *, empty: bool) -> None:
    value = doc.get(key)
    if not isinstance(value, str):
        raise InputError(*where, key, "missing" if key not in doc else f"expected a string, got {type(value).__name__}")
    if not empty and not value.strip():
        raise InputError(*where, key, "empty; expected a non-empty string")


def validate_argument(arg, *, path: str, line: int | None, index: int) -> None:
    """Check one ``arguments`` entry; InputError naming file, line and ``arguments[INDEX].KEY``."""
    field = f"{ARGUMENTS}[{index}]"
    if not isinstance(arg, dict):
        raise InputError(path, line, field, f"expected an object, got {type(arg).__name__}")
    unknown = sorted(set(arg) - set(ARGUMENT_FIELDS))
    if unknown:
        raise InputError(path, line, f"{field}.{unknown[0]}", f"unknown key (an argument holds {', '.join(ARGUMENT_FIELDS)})")
    for key in ARGUMENT_FIELDS:
        if key not in arg:
            raise InputError(path, line, f"{field}.{key}", "missing")
    if not isinstance(arg[ARG_NAME], str) or not arg[ARG_NAME]:
        raise InputError(path, line, f"{field}.{ARG_NAME}", "expected a non-empty string")
    if arg[ARG_TYPE] is not None and not isinstance(arg[ARG_TYPE], str):
        raise InputError(path, line, f"{field}.{ARG_TYPE}", "expected a string or null")
    if not isinstance(arg[ARG_REQUIRED], bool):
        raise InputError(path, line, f"{field}.{ARG_REQUIRED}", "expected true or false")
    if not _is_json_value(arg[ARG_DEFAULT]):
        raise InputError(path, line, f"{field}.{ARG_DEFAULT}", "expected a JSON value")
    if not isinstance(arg[ARG_DESCRIPTION], str):
        raise InputError(path, line, f"{field}.{ARG_DESCRIPTION}", "expected a string")


def check_identifying_arguments(value, call: ast.Call, *, path: str, line: int | None) -> None:
    """Check ``identifying_arguments`` against the parsed ``api_call`` (keywords it passes,
    positional indexes it has); InputError naming file, line and field."""
    if not isinstance(value, list):
        raise InputError(path, line, IDENTIFYING_ARGUMENTS, f"expected a list, got {type(value).__name__}")
    keywords = {k.arg for k in call.keywords if k.arg is not None}
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise InputError(path, line, IDENTIFYING_ARGUMENTS, f"{item!r}: expected a keyword name or a positional index")
        if isinstance(item, int) and not 0 <= item < len(call.args):
            raise InputError(path, line, IDENTIFYING_ARGUMENTS,
                             f"{item}: api_call has {len(call.args)} positional argument(s)")
        if isinstance(item, str) and item not in keywords:
            raise InputError(path, line, IDENTIFYING_ARGUMENTS, f"{item!r}: not a keyword argument of api_call")


def validate_document(doc, *, path: str | os.PathLike, line: int | None) -> dict:
    """Return ``doc`` if it is a valid API document, else raise InputError naming path, line and field."""
    where = (str(path), line)
    if not isinstance(doc, dict):
        raise InputError(*where, None, f"expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(DOCUMENT_FIELDS))
    if unknown:
        raise InputError(*where, unknown[0], f"unknown field (an API document holds {', '.join(DOCUMENT_FIELDS)})")
    for key in (API_NAME, API_CALL, DOMAIN, PROVIDER):
        _text(doc, key, where, empty=False)
    for key in (DESCRIPTION, EXAMPLE_CODE):
        _text(doc, key, where, empty=True)
    try:
        _, call = parse_api_call(doc[API_CALL])
    except ValueError as exc:
        raise InputError(*where, API_CALL, f"{doc[API_CALL]!r}: {exc}") from None
    if ARGUMENTS not in doc:
        raise InputError(*where, ARGUMENTS, "missing")
    if not isinstance(doc[ARGUMENTS], list):
        raise InputError(*where, ARGUMENTS, f"expected a list, got {type(doc[ARGUMENTS]).__name__}")
    for index, arg in enumerate(doc[ARGUMENTS]):
        validate_argument(arg, path=str(path), line=line, index=index)
    if IDENTIFYING_ARGUMENTS not in doc:
        raise InputError(*where, IDENTIFYING_ARGUMENTS, "missing")
    check_identifying_arguments(doc[IDENTIFYING_ARGUMENTS], call, path=str(path), line=line)
    return doc


def load_catalog(catalog_dir: str | os.PathLike) -> list[dict]:
    """The checked API documents of a catalog folder's ``apis.jsonl``, in file order.

    Raises:
        RatuneError: no such folder, or no ``apis.jsonl``.
        InputError: naming file and line: a bad document, a repeated ``api_name``, an empty file.
    """
    folder = Path(catalog_dir)
    path = folder / APIS_FILE
    if not folder.is_dir():
        raise RatuneError(f"{folder}: no such catalog folder")
    if not path.is_file():
        raise RatuneError(f"{folder}: not a catalog folder (no {APIS_FILE}); make one with `ratune catalog import`")
    docs, first_line = [], {}
    for number, obj in iter_jsonl(path):
        validate_document(obj, path=path, line=number)
        name = obj[API_NAME]
        if name in first_line:
            raise InputError(str(path), number, API_NAME,
                             f"duplicate api_name {name!r} (first on line {first_line[name]})")
        first_line[name] = number
        docs.append(obj)
    if not docs:
        raise InputError(str(path), None, None, "no API documents (the file is empty)")
    return docs


def document_line(doc: dict) -> str:
    """One document as the line ``apis.jsonl`` holds: fields in :data:`DOCUMENT_FIELDS` order."""
    return json.dumps({key: doc[key] for key in DOCUMENT_FIELDS}, ensure_ascii=False)


def argument(name: str, *, type: str | None = None, required: bool = False, default=None,
             description: str = "") -> dict:
    """One ``arguments`` entry with every field of :data:`ARGUMENT_FIELDS`."""
    return {ARG_NAME: name, ARG_TYPE: type, ARG_REQUIRED: required, ARG_DEFAULT: default,
            ARG_DESCRIPTION: description}


@dataclass(frozen=True)
class Reject:
    """An entry of a source that became no API document: its ``location`` and a one-line ``reason``."""

    location: str
    reason: str

    def to_json(self) -> dict:
        return {"location": self.location, "reason": self.reason}


@dataclass
class Imported:
    """What a source gave: ``entries`` ``(location, document)`` in source order (repeated names
    not yet removed), ``rejects``, and the manifest's ``source`` and ``notes``."""

    entries: list[tuple[str, dict]] = dataclass_field(default_factory=list)
    rejects: list[Reject] = dataclass_field(default_factory=list)
    source: dict = dataclass_field(default_factory=dict)
    notes: dict = dataclass_field(default_factory=dict)
