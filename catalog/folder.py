"""``ratune catalog import``: one of the three sources in, one catalog folder out (docs/catalogs.md)."""

from __future__ import annotations

import os
from pathlib import Path

from ratune.args import checked, output_dir
from ratune.catalog import jsonl, openapi, pyapi
from ratune.catalog.schema import (APIS_FILE, API_NAME, CATALOG_KIND, IMPORT_STAGE, MANIFEST_FILE, SCHEMA_VERSION,
                                   Imported, document_line, is_identifier)
from ratune.errors import RatuneError
from ratune.io import read_json_object, sha256_file, write_json, write_text
from ratune.manifest import base_manifest
from ratune.output import StageOutput

#: ``--from`` values, each a source module's reader.
SOURCES = (jsonl.KIND, openapi.KIND, pyapi.KIND)
#: Rejects and duplicates the command prints (all of them are in the manifest).
PRINTED_PROBLEMS = 10


def check_catalog_name(name: str) -> str:
    """Return ``name`` if it is a Python identifier (a catalog name), else raise RatuneError."""
    if not is_identifier(name):
        raise RatuneError(f"catalog name {name!r}: expected a Python identifier such as petstore or my_sdk")
    return name


def check_source_text(text: str) -> str:
    """Return ``text`` if it is an existing file or a dotted module path (which wins over a folder
    of that name); RatuneError for an empty text, a missing path or a folder."""
    if not text:
        raise RatuneError("an empty source; give a file (jsonl, openapi) or a module path (python)")
    path = Path(text)
    if path.is_file() or pyapi.MODULE_PATH.fullmatch(text):
        return text
    if path.is_dir():
        raise RatuneError(f"{path}: is a folder; give a JSON-lines or OpenAPI file, or a Python module path")
    raise RatuneError(f"{path}: no such file (and not a Python module path such as json)")


def split_duplicates(entries: list[tuple[str, dict]]) -> tuple[list[dict], list[dict]]:
    """``(kept documents, duplicates)``: the first document of each ``api_name`` in source order,
    and ``{"api_name", "location", "first_location"}`` of each one left out."""
    first: dict[str, str] = {}
    kept, duplicates = [], []
    for location, doc in entries:
        name = doc[API_NAME]
        if name in first:
            duplicates.append({"api_name": name, "location": location, "first_location": first[name]})
            continue
        first[name] = location
        kept.append(doc)
    return kept, duplicates


def _read(source_kind: str, source: str, name: str | None, methods: bool) -> tuple[Imported, str]:
    """The source's documents and the catalog name (given, or the source's default)."""
    if source_kind == jsonl.KIND:
        name = name or openapi.default_client_name(Path(source).stem)
        return jsonl.read_jsonl_source(source, name=name), name
    if source_kind == openapi.KIND:
        imported = openapi.read_openapi_source(source, name=name)
        return imported, imported.source["client"]
    imported = pyapi.read_python_source(source, methods=methods)
    return imported, name or source.replace(".", "_")


def _output(out_dir: str | os.PathLike) -> StageOutput:
    return StageOutput(out_dir, IMPORT_STAGE, resolve=True, command=IMPORT_STAGE)


def _write_catalog(out_dir: Path, documents: list[dict], manifest: dict) -> None:
    with _output(out_dir).writing() as out:
        write_text(out / APIS_FILE, "".join(document_line(doc) + "\n" for doc in documents))
        manifest["files"] = {APIS_FILE: sha256_file(out / APIS_FILE)}
        write_json(out / MANIFEST_FILE, manifest)  # last: a folder with a manifest is a finished import


def import_catalog(source_kind: str, source: str | os.PathLike, out_dir: str | os.PathLike, name: str | None = None,
                   *, methods: bool = False) -> dict:
    """Read ``source`` as ``source_kind`` (:data:`SOURCES`) into the catalog folder ``out_dir``
    and return the manifest written; ``name`` defaults from the source, ``methods`` (python only)
    adds the public methods of public classes.

    Raises:
        RatuneError: an unknown kind, a bad name, ``methods`` off python, an ``out_dir`` ratune
            did not make (checked before reading), no document, a module that does not import.
        InputError: from the source's reader.
        LockHeld: another process writes ``out_dir``.
    """
    if source_kind not in SOURCES:
        raise RatuneError(f"unknown catalog source {source_kind!r}: expected one of {', '.join(SOURCES)}")
    if name is not None:
        check_catalog_name(name)
    if methods and source_kind != pyapi.KIND:
        raise RatuneError(f"methods (--methods) lists a Python module's class methods; not for --from {source_kind}")
    _output(out_dir).check()
    imported, name = _read(source_kind, str(source), name, methods)
    documents, duplicates = split_duplicates(imported.entries)
    rejects = [r.to_json() for r in imported.rejects]
    if not documents:
        shown = "; ".join(f"{r['location']}: {r['reason']}" for r in rejects[:3])
        raise RatuneError(f"{source}: no API documents to import" + (f" ({len(rejects)} rejected: {shown}"
                                                                       f"{'; ...' if len(rejects) > 3 else ''})"
                                                                       if rejects else ""))
    manifest = {**base_manifest(IMPORT_STAGE), "kind": CATALOG_KIND, "schema_version": SCHEMA_VERSION, "name": name,
                "source": imported.source,
                "counts": {"documents": len(documents), "duplicates": len(duplicates), "rejects": len(rejects)},
                "duplicates": duplicates, "rejects": rejects, "notes": imported.notes}
    _write_catalog(Path(out_dir), documents, manifest)
    return manifest


def read_catalog_manifest(catalog_dir: str | os.PathLike) -> dict:
    """The ``manifest.json`` of a catalog folder that ``ratune catalog import`` wrote.

    Raises:
        RatuneError: not a folder, no manifest, or not a catalog import's (``kind``, ``name``).
        InputError: the manifest is not a JSON object.
    """
    folder = Path(catalog_dir)
    if not folder.is_dir():
        raise RatuneError(f"{folder}: no such catalog folder")
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise RatuneError(f"{folder}: not a catalog folder (no {MANIFEST_FILE}); make one with "
                          "`ratune catalog import`")
    manifest = read_json_object(path)
    if manifest.get("kind") != CATALOG_KIND:
        raise RatuneError(f"{path}: not a catalog manifest (kind {manifest.get('kind')!r}, expected "
                          f"{CATALOG_KIND!r}); make a catalog folder with `ratune catalog import`")
    name = manifest.get("name")
    if not isinstance(name, str) or not is_identifier(name):
        raise RatuneError(f"{path}: field 'name': {name!r} is not a catalog name (a Python identifier)")
    return manifest


def add_import_arguments(parser) -> None:
    """The arguments of ``ratune catalog import`` (docs/catalogs.md)."""
    parser.add_argument("--from", dest="source_kind", required=True, choices=SOURCES,
                        help="jsonl: a JSON-lines file of API documents; openapi: an OpenAPI 3 document (JSON or "
                             "YAML); python: a module path whose public callables are listed (imported, never called)")
    parser.add_argument("source", metavar="SOURCE", type=checked(check_source_text, "source", good="file",
                                                                  bad=("", "missing", "folder")),
                        help="the JSON-lines or OpenAPI file, or the Python module path (e.g. json)")
    parser.add_argument("--out", required=True, type=output_dir, help="the catalog folder (apis.jsonl, manifest.json)")
    parser.add_argument("--name", default=None, type=checked(check_catalog_name, "catalog name", good="petstore",
                                                             bad=("1x", "a-b", "class")),
                        help="catalog name, a Python identifier: the client of OpenAPI calls (CLIENT.operation(...)), "
                             "the provider of JSON lines without one (default: from the file name, info.title or "
                             "the module path)")
    parser.add_argument("--methods", action="store_true",
                        help="--from python: also the public methods of public classes (MODULE.Class.method)")


def cli_import(args) -> int:
    """``ratune catalog import``: import, then print the counts, the duplicates and the rejects."""
    manifest = import_catalog(args.source_kind, args.source, args.out, args.name, methods=args.methods)
    counts = manifest["counts"]
    print(f"catalog {manifest['name']}: {counts['documents']} API documents, {counts['duplicates']} duplicates, "
          f"{counts['rejects']} rejects (from {args.source_kind} {args.source})")
    for dup in manifest["duplicates"][:PRINTED_PROBLEMS]:
        print(f"  duplicate {dup['api_name']} at {dup['location']} (kept the one at {dup['first_location']})")
    for rej in manifest["rejects"][:PRINTED_PROBLEMS]:
        print(f"  rejected {rej['location']}: {rej['reason']}")
    more = max(0, counts["duplicates"] - PRINTED_PROBLEMS) + max(0, counts["rejects"] - PRINTED_PROBLEMS)
    if more:
        print(f"  ... {more} more in {Path(args.out) / MANIFEST_FILE}")
    for key, values in manifest["notes"].items():
        if values:
            print(f"  {key.replace('_', ' ')}: " + ", ".join(f"{k} ({v})" for k, v in values.items()))
    print(f"wrote {args.out}")
    return 0
