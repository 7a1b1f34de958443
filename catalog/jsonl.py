"""Catalog source 1: a JSON-lines file of API documents, one object per line, optional fields
defaulted and unknown ones counted (docs/catalogs.md, "Source 1: JSON lines").
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ratune.catalog.schema import (API_CALL, API_NAME, ARG_DEFAULT, ARG_DESCRIPTION, ARG_NAME, ARG_REQUIRED,
                                   ARG_TYPE, ARGUMENT_FIELDS, ARGUMENTS, DEFAULT_DOMAIN, DESCRIPTION,
                                   DOCUMENT_FIELDS, DOMAIN, EXAMPLE_CODE, IDENTIFYING_ARGUMENTS, PROVIDER,
                                   REQUIRED_SOURCE_FIELDS, Imported, argument, validate_document)
from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, sha256_file

#: The manifest's ``source.kind`` of this source.
KIND = "jsonl"


def _arguments(value, *, path: str, line: int, ignored: Counter) -> list[dict]:
    """Normalise a line's ``arguments`` (every key of an entry filled in)."""
    if not isinstance(value, list):
        raise InputError(path, line, ARGUMENTS, f"expected a list of objects, got {type(value).__name__}")
    out = []
    for index, arg in enumerate(value):
        field = f"{ARGUMENTS}[{index}]"
        if not isinstance(arg, dict):
            raise InputError(path, line, field, f"expected an object with a name, got {type(arg).__name__}")
        for key in sorted(set(arg) - set(ARGUMENT_FIELDS)):
            ignored[f"{ARGUMENTS}[].{key}"] += 1
        name = arg.get(ARG_NAME)
        if not isinstance(name, str) or not name.strip():
            raise InputError(path, line, f"{field}.{ARG_NAME}", "missing or not a non-empty string")
        required = arg.get(ARG_REQUIRED, False)
        if not isinstance(required, bool):
            raise InputError(path, line, f"{field}.{ARG_REQUIRED}", f"expected true or false, got {required!r}")
        out.append(argument(name, type=arg.get(ARG_TYPE), required=required, default=arg.get(ARG_DEFAULT),
                            description="" if arg.get(ARG_DESCRIPTION) is None else arg[ARG_DESCRIPTION]))
    return out


def read_jsonl_source(path: str | os.PathLike, *, name: str) -> Imported:
    """Read a JSON-lines file into catalog documents located ``FILE:LINE``; ``name`` is the
    ``provider`` of lines that give none.

    Raises:
        RatuneError: the file does not exist or is a folder.
        InputError: naming file, line and field: bad JSON, a field missing, ill-typed or invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: no such JSON-lines file")
    imported = Imported(source={"kind": KIND, "path": str(path), "sha256": sha256_file(path)})
    ignored: Counter = Counter()
    for number, obj in iter_jsonl(path):
        for key in REQUIRED_SOURCE_FIELDS:
            if key not in obj or obj[key] is None:
                raise InputError(str(path), number, key, "missing (required: " + ", ".join(REQUIRED_SOURCE_FIELDS) + ")")
        for key in sorted(set(obj) - set(DOCUMENT_FIELDS)):
            ignored[key] += 1

        def given(key, default):
            return default if obj.get(key) is None else obj[key]

        doc = {API_NAME: obj[API_NAME], API_CALL: obj[API_CALL], DESCRIPTION: obj[DESCRIPTION],
               DOMAIN: given(DOMAIN, DEFAULT_DOMAIN), PROVIDER: given(PROVIDER, name),
               ARGUMENTS: _arguments(given(ARGUMENTS, []), path=str(path), line=number, ignored=ignored),
               EXAMPLE_CODE: given(EXAMPLE_CODE, ""), IDENTIFYING_ARGUMENTS: given(IDENTIFYING_ARGUMENTS, [])}
        validate_document(doc, path=path, line=number)
        imported.entries.append((f"{path}:{number}", doc))
    imported.notes["ignored_fields"] = dict(sorted(ignored.items()))
    return imported
