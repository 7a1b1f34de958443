"""Catalog source 2: an OpenAPI 3.x document (JSON or YAML), one API document per operation
(docs/catalogs.md, "Source 2: OpenAPI 3"). Nothing in the file runs; only local ``$ref`` are followed.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.parse
from collections import Counter
from pathlib import Path

from ratune.catalog.schema import (API_CALL, API_NAME, ARGUMENTS, DEFAULT_DOMAIN, DESCRIPTION, DOMAIN, EXAMPLE_CODE,
                                   IDENTIFYING_ARGUMENTS, PROVIDER, Imported, argument, is_identifier,
                                   validate_document)
from ratune.config import parse_yaml
from ratune.errors import InputError, RatuneError
from ratune.io import sha256_file

#: The manifest's ``source.kind`` of this source.
KIND = "openapi"
#: The operations of a path item (OpenAPI 3.0 and 3.1).
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
#: Parameter locations that become arguments (``cookie`` is counted, not kept).
ARGUMENT_LOCATIONS = ("path", "query", "header")
PARAMETER_LOCATIONS = (*ARGUMENT_LOCATIONS, "cookie")
#: The placeholder of a required argument without example, default or enum, by its (first) type.
TYPED_PLACEHOLDERS = {"integer": 0, "number": 0.0, "boolean": True, "string": "string", "array": [], "object": {},
                      "null": None}
#: Longer example/default literals are replaced by the typed placeholder in ``api_call``.
MAX_PLACEHOLDER_CHARS = 200
#: References followed in a row, and schema levels entered, before giving up (cycles).
MAX_DEPTH = 32
#: JSON values copied from the document (defaults, examples) are cut off past this many nodes.
MAX_VALUE_NODES = 1000

#: Most values a YAML specification may hold, aliases expanded (ratune/config.py parse_yaml; configs: 100,000).
MAX_DOCUMENT_VALUES = 5_000_000


def escape_pointer_token(token) -> str:
    """One JSON-pointer token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return str(token).replace("~", "~0").replace("/", "~1")


def _ptr(base: str, *tokens) -> str:
    return base + "".join("/" + escape_pointer_token(t) for t in tokens)


def snake_case(text: str) -> str:
    """``listPets`` -> ``list_pets``, ``HTTPServer`` -> ``http_server``; other characters become ``_``."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", str(text))
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return re.sub(r"[^0-9A-Za-z]+", "_", s).strip("_").lower()


def _identifier(text: str, fallback: str) -> str:
    """``text`` as a Python identifier: snake-cased words, ``_`` before a digit, ``_`` after a keyword."""
    s = text if is_identifier(text) else snake_case(text)
    if not s:
        return fallback
    if s[0].isdigit():
        s = f"_{s}"
    return s if is_identifier(s) else f"{s}_"


def default_client_name(title: str) -> str:
    """The catalog name of an ``info.title``: ``"Swagger Petstore"`` -> ``swagger_petstore``, else ``api``."""
    s = snake_case(title)
    if s and s[0].isdigit():
        s = f"api_{s}"
    return _identifier(s, "api")


def operation_name(method: str, path: str, operation_id) -> str:
    """The OPERATION of ``CLIENT.OPERATION``: the snake-cased ``operationId``, else the method and
    path (``get /pets/{petId}`` -> ``get_pets_by_pet_id``)."""
    name = snake_case(operation_id) if isinstance(operation_id, str) else ""
    if not name:
        words = [method] + [re.sub(r"\{([^}]*)\}", r" by \1 ", seg) for seg in path.split("/") if seg]
        name = "_".join(w for w in (snake_case(w) for w in words) if w)
    if name[0].isdigit():
        name = f"op_{name}"
    return name if is_identifier(name) else f"{name}_"


def _first_paragraph(text) -> str:
    if not isinstance(text, str):
        return ""
    return " ".join(re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0].split())


class _NotJSON(Exception):
    pass


def _json_value(value, budget: list[int]):
    """``value`` as JSON (dates as ISO text, keys as strings); _NotJSON past the node budget or
    for values JSON cannot hold."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotJSON("too large")
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJSON("not finite")
        return value
    if hasattr(value, "isoformat"):  # YAML dates and timestamps
        return value.isoformat()
    if isinstance(value, list):
        return [_json_value(v, budget) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v, budget) for k, v in value.items()}
    raise _NotJSON(type(value).__name__)


_MISSING = object()


def _json_or_missing(value):
    if value is _MISSING:
        return _MISSING
    try:
        return _json_value(value, [MAX_VALUE_NODES])
    except _NotJSON:
        return _MISSING


def load_openapi(path: str | os.PathLike) -> dict:
    """Read an OpenAPI 3.x document: JSON for a ``.json`` file, else YAML.

    Raises:
        RatuneError: the file does not exist.
        InputError: naming the file (line or pointer): not UTF-8, JSON or YAML, not a mapping, not 3.x.
    """
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: no such OpenAPI file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), raw[:exc.start].count(b"\n") + 1, None, "not UTF-8") from None
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(str(path), exc.lineno, None, f"not valid JSON ({exc.msg}, column {exc.colno})") from None
        except RecursionError:
            raise InputError(str(path), None, None, "not valid JSON (nested too deeply)") from None
    else:
        try:  # the one YAML loader's guards: plain data, no duplicate key, bounded nesting and aliases
            doc = parse_yaml(text, str(path), max_values=MAX_DOCUMENT_VALUES, what="an OpenAPI document ratune reads",
                             noun="the document")
        except RecursionError:
            raise InputError(str(path), None, None, "not valid YAML (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), None, None, f"not an OpenAPI document (the top level is a "
                         f"{type(doc).__name__}, expected a mapping with 'openapi: 3.x')")
    if "swagger" in doc:
        raise InputError(str(path), None, "/swagger", f"Swagger {doc['swagger']} (OpenAPI 2) is not supported: convert "
                         "it to OpenAPI 3 (e.g. with swagger2openapi or editor.swagger.io) and import that")
    version = doc.get("openapi")
    version = str(version) if isinstance(version, (str, int, float)) and not isinstance(version, bool) else None
    if version is None or not re.fullmatch(r"3\.\d+(\.\d+)?(-.*)?", version):
        got = "missing" if "openapi" not in doc else f"{doc['openapi']!r}"
        raise InputError(str(path), None, "/openapi", f"{got}: expected an OpenAPI 3.x document ('openapi: 3.0.3', "
                         "'3.1.0', ...)")
    return doc


class _Spec:
    """The document with its reference resolver; errors name the file and a JSON pointer."""

    def __init__(self, doc: dict, path: Path):
        self.doc, self.path = doc, path

    def error(self, pointer: str, message: str) -> InputError:
        return InputError(str(self.path), None, pointer or "/", message)

    def lookup(self, ref: str, at: str):
        """The node a local reference points to (its fragment is a URI-encoded JSON pointer)."""
        fragment = urllib.parse.unquote(ref[1:])
        if fragment == "":
            return self.doc
        if not fragment.startswith("/"):
            raise self.error(at, f"$ref {ref!r}: expected '#/' followed by a JSON pointer")
        node = self.doc
        for raw in fragment[1:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise self.error(at, f"$ref {ref!r} does not resolve: no {token!r} there")
        return node

    def resolve(self, node, pointer: str):
        """Follow ``$ref`` to ``(node, its pointer)``; InputError for a bad, non-local or circular one."""
        seen: list[str] = []
        while isinstance(node, dict) and "$ref" in node:
            ref, at = node["$ref"], _ptr(pointer, "$ref")
            if not isinstance(ref, str):
                raise self.error(at, f"expected a string, got {type(ref).__name__}")
            if not ref.startswith("#"):
                raise self.error(at, f"{ref!r}: only local references ('#/...') are followed; bundle the "
                                 "document into one file first")
            if ref in seen or len(seen) >= MAX_DEPTH:
                raise self.error(at, f"circular $ref: {' -> '.join([*seen, ref])}")
            seen.append(ref)
            node, pointer = self.lookup(ref, at), urllib.parse.unquote(ref[1:])
        return node, pointer

    def schema_type(self, schema, pointer: str, depth: int = 0) -> str | None:
        """The ``type`` text of a schema (``array[string]``, ``string|integer``), None when it names none."""
        if schema is None or depth > MAX_DEPTH:
            return None
        schema, pointer = self.resolve(schema, pointer)
        if not isinstance(schema, dict):
            return None
        kind = schema.get("type")
        if isinstance(kind, list):
            return "|".join(k for k in kind if isinstance(k, str)) or None
        if kind == "array":
            items = self.schema_type(schema.get("items"), _ptr(pointer, "items"), depth + 1)
            return f"array[{items}]" if items else "array"
        if isinstance(kind, str):
            return kind
        for key in ("oneOf", "anyOf"):
            if isinstance(schema.get(key), list):
                types = [self.schema_type(s, _ptr(pointer, key, i), depth + 1) for i, s in enumerate(schema[key])]
                if types and all(types):
                    return "|".join(dict.fromkeys(types))
        if isinstance(schema.get("allOf"), list):
            for i, member in enumerate(schema["allOf"]):
                found = self.schema_type(member, _ptr(pointer, "allOf", i), depth + 1)
                if found:
                    return found
        return "object" if isinstance(schema.get("properties"), dict) else None

    def object_properties(self, schema, pointer: str, stack: tuple = ()) -> tuple[list, set]:
        """``([(name, schema, pointer)], required names)`` of an object schema, ``allOf`` members
        first; InputError for a bad ``properties`` or ``allOf``, or a circular ``allOf``."""
        schema, pointer = self.resolve(schema, pointer)
        if not isinstance(schema, dict):
            return [], set()
        if pointer in stack or len(stack) > MAX_DEPTH:
            raise self.error(pointer, f"circular allOf: {' -> '.join([*stack, pointer])}")
        props, required = [], {r for r in schema.get("required") or [] if isinstance(r, str)}
        members = schema.get("allOf")
        if members is not None and not isinstance(members, list):
            raise self.error(_ptr(pointer, "allOf"), f"expected a list, got {type(members).__name__}")
        for i, member in enumerate(members or []):
            more, req = self.object_properties(member, _ptr(pointer, "allOf", i), (*stack, pointer))
            props += more
            required |= req
        own = schema.get("properties")
        if own is not None and not isinstance(own, dict):
            raise self.error(_ptr(pointer, "properties"), f"expected a mapping, got {type(own).__name__}")
        props += [(str(k), v, _ptr(pointer, "properties", k)) for k, v in (own or {}).items()]
        return props, required

    def is_object(self, schema, pointer: str) -> bool:
        schema, _ = self.resolve(schema, pointer)
        return isinstance(schema, dict) and (schema.get("type") == "object" or "properties" in schema
                                             or "allOf" in schema)


def _schema_example(schema: dict):
    if "example" in schema:
        return schema["example"]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    return _MISSING


def _placeholder(arg: dict, example, enum) -> str:
    """The Python literal of a required argument in ``api_call``: example, default, enum, typed placeholder."""
    candidates = [_json_or_missing(example)]
    if arg["default"] is not None:
        candidates.append(arg["default"])
    if isinstance(enum, list) and enum:
        candidates.append(_json_or_missing(enum[0]))
    for value in candidates:
        if value is not _MISSING:
            text = repr(value)
            if len(text) <= MAX_PLACEHOLDER_CHARS:
                return text
    first = re.split(r"[|\[]", arg["type"] or "")[0]
    return repr(TYPED_PLACEHOLDERS.get(first))


class _Operation:
    """Collects one operation's arguments and placeholders, giving each a unique Python name."""

    def __init__(self):
        self.arguments: list[dict] = []
        self.placeholders: dict[str, str] = {}

    def add(self, raw_name: str, location: str, *, type, required: bool, default, description: str,
            example=_MISSING, enum=None) -> None:
        taken = {a["name"] for a in self.arguments}
        name = _identifier(raw_name, "arg")
        base = name if name not in taken else f"{name}_{location}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        default = _json_or_missing(default)
        arg = argument(name, type=type, required=required, default=None if default is _MISSING else default,
                       description=description if isinstance(description, str) else "")
        self.arguments.append(arg)
        if required:
            self.placeholders[name] = _placeholder(arg, example, enum)


def _parameters(spec: _Spec, items, pointer: str) -> list[tuple[dict, str]]:
    """``(parameter, pointer)`` of a ``parameters`` list, references resolved and checked."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise spec.error(pointer, f"expected a list of parameters, got {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        param, at = spec.resolve(item, _ptr(pointer, i))
        if not isinstance(param, dict):
            raise spec.error(at, f"expected a parameter object, got {type(param).__name__}")
        name = param.get("name")
        if not isinstance(name, str) or not name:
            raise spec.error(_ptr(at, "name"), "missing or not a non-empty string")
        if param.get("in") not in PARAMETER_LOCATIONS:
            raise spec.error(_ptr(at, "in"), f"{param.get('in')!r}: expected one of {', '.join(PARAMETER_LOCATIONS)}")
        out.append((param, at))
    return out


def _add_parameter(spec: _Spec, op: _Operation, param: dict, at: str) -> None:
    schema, schema_at = param.get("schema"), _ptr(at, "schema")
    if schema is None and isinstance(param.get("content"), dict) and param["content"]:
        media_type, media = next(iter(param["content"].items()))
        schema_at = _ptr(at, "content", media_type, "schema")
        schema = media.get("schema") if isinstance(media, dict) else None
    resolved = spec.resolve(schema, schema_at)[0] if schema is not None else None
    resolved = resolved if isinstance(resolved, dict) else {}
    example = param["example"] if "example" in param else _MISSING
    if example is _MISSING and isinstance(param.get("examples"), dict) and param["examples"]:
        key, value = next(iter(param["examples"].items()))
        first = spec.resolve(value, _ptr(at, "examples", key))[0]
        example = first["value"] if isinstance(first, dict) and "value" in first else _MISSING
    if example is _MISSING:
        example = _schema_example(resolved)
    description = param.get("description") or resolved.get("description") or ""
    op.add(param["name"], param["in"], type=spec.schema_type(schema, schema_at),
           required=param.get("required") is True or param["in"] == "path",
           default=resolved.get("default", _MISSING), description=description, example=example,
           enum=resolved.get("enum"))


def _add_body(spec: _Spec, op: _Operation, body, at: str, notes: Counter) -> None:
    body, at = spec.resolve(body, at)
    if not isinstance(body, dict):
        raise spec.error(at, f"expected a request body object, got {type(body).__name__}")
    content = body.get("content")
    if not isinstance(content, dict) or not content:
        raise spec.error(_ptr(at, "content"), "missing or not a mapping of media types")
    json_types = [t for t in content if str(t).split(";")[0].strip() == "application/json"] + \
        [t for t in content if re.search(r"[/+]json\b", str(t))]
    media_type = (json_types or list(content))[0]
    media, media_at = content[media_type], _ptr(at, "content", media_type)
    media = media if isinstance(media, dict) else {}
    required_body = body.get("required") is True
    schema, schema_at = media.get("schema"), _ptr(media_at, "schema")
    media_example = media.get("example", _MISSING)
    if schema is not None and spec.is_object(schema, schema_at):
        props, required = spec.object_properties(schema, schema_at)
        seen = set()
        for name, prop, prop_at in props:
            if name in seen:
                continue  # an allOf member's property restated by a later one: the first stays
            seen.add(name)
            resolved = spec.resolve(prop, prop_at)[0]
            resolved = resolved if isinstance(resolved, dict) else {}
            if resolved.get("readOnly") is True:
                notes["read_only_properties"] += 1
                continue
            example = _schema_example(resolved)
            if example is _MISSING and isinstance(media_example, dict) and name in media_example:
                example = media_example[name]
            op.add(name, "body", type=spec.schema_type(prop, prop_at), required=required_body and name in required,
                   default=resolved.get("default", _MISSING), description=resolved.get("description") or "",
                   example=example, enum=resolved.get("enum"))
        return
    resolved = spec.resolve(schema, schema_at)[0] if schema is not None else {}
    resolved = resolved if isinstance(resolved, dict) else {}
    example = media_example if media_example is not _MISSING else _schema_example(resolved)
    op.add("body", "body", type=spec.schema_type(schema, schema_at) if schema is not None else None,
           required=required_body, default=resolved.get("default", _MISSING),
           description=body.get("description") or resolved.get("description") or "", example=example,
           enum=resolved.get("enum"))


def read_openapi_source(path: str | os.PathLike, *, name: str | None = None) -> Imported:
    """One catalog document per operation, located ``FILE#POINTER``; ``name`` is the client of
    every ``api_call`` (default from ``info.title``).

    Raises:
        RatuneError: the file does not exist; ``name`` is not a Python identifier.
        InputError: naming the file and a JSON pointer (or line): a malformed document or ``$ref``.
    """
    path = Path(path)
    doc = load_openapi(path)
    spec = _Spec(doc, path)
    info = doc.get("info")
    title = info.get("title") if isinstance(info, dict) else None
    if not isinstance(title, str) or not title.strip():
        raise spec.error("/info/title", "missing or not a non-empty string (it is the documents' provider)")
    client = default_client_name(title) if name is None else name
    if not is_identifier(client):
        raise RatuneError(f"catalog name {client!r}: not a Python identifier (it is the client of every api_call)")
    version = info.get("version")
    imported = Imported(source={"kind": KIND, "path": str(path), "sha256": sha256_file(path),
                                "openapi": str(doc["openapi"]), "title": title.strip(),
                                "version": None if version is None else str(version), "client": client})
    notes: Counter = Counter()
    paths = doc.get("paths")
    if paths is not None and not isinstance(paths, dict):
        raise spec.error("/paths", f"expected a mapping of paths, got {type(paths).__name__}")
    for route, item in (paths or {}).items():
        item, item_at = spec.resolve(item, _ptr("/paths", route))
        if not isinstance(item, dict):
            raise spec.error(item_at, f"expected a path item (a mapping), got {type(item).__name__}")
        shared = _parameters(spec, item.get("parameters"), _ptr(item_at, "parameters"))
        for method in HTTP_METHODS:
            if method not in item:
                continue
            operation, at = item[method], _ptr(item_at, method)
            if not isinstance(operation, dict):
                raise spec.error(at, f"expected an operation (a mapping), got {type(operation).__name__}")
            own = _parameters(spec, operation.get("parameters"), _ptr(at, "parameters"))
            merged = {(p["name"], p["in"]): (p, a) for p, a in shared}
            merged.update({(p["name"], p["in"]): (p, a) for p, a in own})
            op = _Operation()
            for param, param_at in merged.values():
                if param["in"] == "cookie":
                    notes["cookie_parameters"] += 1
                    continue
                _add_parameter(spec, op, param, param_at)
            if operation.get("requestBody") is not None:
                _add_body(spec, op, operation["requestBody"], _ptr(at, "requestBody"), notes)
            op_name = operation_name(method, str(route), operation.get("operationId"))
            tags = operation.get("tags")
            domain = tags[0].strip() if isinstance(tags, list) and tags and isinstance(tags[0], str) \
                and tags[0].strip() else DEFAULT_DOMAIN
            summary = " ".join(operation["summary"].split()) if isinstance(operation.get("summary"), str) else ""
            paragraph = _first_paragraph(operation.get("description"))
            if summary and paragraph and paragraph != summary:
                description = f"{summary}{'' if summary[-1] in '.!?:' else '.'} {paragraph}"
            else:
                description = summary or paragraph
            call = f"{client}.{op_name}(" + ", ".join(f"{k}={v}" for k, v in op.placeholders.items()) + ")"
            document = {API_NAME: f"{client}.{op_name}", API_CALL: call, DESCRIPTION: description, DOMAIN: domain,
                        PROVIDER: title.strip(), ARGUMENTS: op.arguments, EXAMPLE_CODE: "", IDENTIFYING_ARGUMENTS: []}
            location = f"{path}#{_ptr('/paths', route, method)}"
            validate_document(document, path=location, line=None)
            imported.entries.append((location, document))
    if isinstance(doc.get("webhooks"), dict) and doc["webhooks"]:
        notes["webhooks"] = len(doc["webhooks"])
    imported.notes["skipped"] = dict(sorted(notes.items()))
    return imported
