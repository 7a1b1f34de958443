"""``ratune catalog import`` on real files: the OpenAPI Initiative's petstore
(via openapi-spec-validator, Apache-2.0), openapi-core's richer petstore (BSD-3-Clause), their
Swagger 2.0 petstore, a hand-written JSON-lines catalog (examples/catalogs/) and the standard
library's ``json`` package; and malformed inputs made from them, each error naming the file and
the line, field or JSON pointer.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from ratune.catalog.folder import import_catalog, split_duplicates
from ratune.catalog.jsonl import read_jsonl_source
from ratune.catalog.openapi import default_client_name, operation_name, read_openapi_source, snake_case
from ratune.catalog.pyapi import read_python_source
from ratune.catalog.schema import (APIS_FILE, DOCUMENT_FIELDS, MANIFEST_FILE, load_catalog, parse_api_call,
                                   validate_document)
from ratune.cli import main
from ratune.errors import InputError, RatuneError
from ratune.manifest import claim_folder

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "catalogs"
PETSTORE = EXAMPLES / "openapi-spec-validator" / "petstore.yaml"
SWAGGER2 = EXAMPLES / "openapi-spec-validator" / "swagger-2.0-petstore.yaml"
PETSTORE_CORE = EXAMPLES / "openapi-core" / "petstore.yaml"
TOOLBOX = EXAMPLES / "hand-written" / "toolbox.jsonl"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _docs(imported) -> dict:
    return {doc["api_name"]: doc for _, doc in imported.entries}


def _arg(name, type=None, required=False, default=None, description=""):
    return {"name": name, "type": type, "required": required, "default": default, "description": description}


# ------------------------------------------------------------------------------------- the schema


def test_parse_api_call_accepts_one_dotted_call_and_names_what_else_it_got():
    callee, call = parse_api_call("petstore.list_pets(limit=10)")
    assert callee == "petstore.list_pets" and [k.arg for k in call.keywords] == ["limit"]
    assert parse_api_call("json.dumps(obj)")[0] == "json.dumps"
    cases = {"json.dumps": "not a call", "f()()": "callee is not a dotted name", "x[0](1)": "callee is not a dotted name",
             "a(1); b(2)": "not a Python expression", "x = f(1)": "not a Python expression", "": "empty",
             "(" * 5000 + ")" * 5000: "not a Python expression", "f(1) + g(2)": "not a call"}
    for text, reason in cases.items():
        with pytest.raises(ValueError, match=reason):
            parse_api_call(text)


def test_an_api_call_is_parsed_never_run(tmp_path):
    """A call that would write a file if executed: importing and loading the catalog leaves none."""
    target = tmp_path / "written-if-executed"
    source = tmp_path / "hostile.jsonl"
    source.write_text(json.dumps({"api_name": "open", "api_call": f"builtins.open({str(target)!r}, 'w')",
                                  "description": "opens a file"}) + "\n")
    import_catalog("jsonl", source, tmp_path / "cat")
    assert load_catalog(tmp_path / "cat")[0]["api_call"] == f"builtins.open({str(target)!r}, 'w')"
    assert not target.exists()
    with pytest.raises(ValueError, match="callee is not a dotted name"):
        parse_api_call("__import__('os').system('true')")


def test_validate_document_names_the_field():
    good = {"api_name": "a.b", "api_call": "a.b(x='1')", "description": "", "domain": "d", "provider": "p",
            "arguments": [_arg("x", "str", True)], "example_code": "", "identifying_arguments": ["x"]}
    assert validate_document(copy.deepcopy(good), path="f.jsonl", line=3) == good
    bad = {"api_name": ("", "f.jsonl:3: field 'api_name': empty"),
           "domain": (None, "f.jsonl:3: field 'domain': expected a string, got NoneType"),
           "arguments": ([{"name": "x"}], "f.jsonl:3: field 'arguments[0].type': missing"),
           "identifying_arguments": ([1], "f.jsonl:3: field 'identifying_arguments': 1: api_call has 0 positional"),
           "extra": ("x", "f.jsonl:3: field 'extra': unknown field")}
    for key, (value, message) in bad.items():
        doc = {**copy.deepcopy(good), key: value}
        with pytest.raises(InputError) as err:
            validate_document(doc, path="f.jsonl", line=3)
        assert str(err.value).startswith(message), str(err.value)


# ------------------------------------------------------------------------------------- OpenAPI


def test_openapi_petstore_one_document_per_operation():
    imported = read_openapi_source(PETSTORE, name="petstore")
    assert [loc for loc, _ in imported.entries] == [f"{PETSTORE}#/paths/~1pets/get", f"{PETSTORE}#/paths/~1pets/post",
                                                    f"{PETSTORE}#/paths/~1pets~1{{petId}}/get"]
    docs = _docs(imported)
    assert docs["petstore.list_pets"] == {
        "api_name": "petstore.list_pets", "api_call": "petstore.list_pets()", "description": "List all pets",
        "domain": "pets", "provider": "Swagger Petstore",
        "arguments": [_arg("limit", "integer", False, None, "How many items to return at one time (max 100)")],
        "example_code": "", "identifying_arguments": []}
    # the request body ($ref Pet) gives the top-level properties; id and name are required
    assert docs["petstore.create_pets"]["api_call"] == "petstore.create_pets(id=0, name='string')"
    assert docs["petstore.create_pets"]["arguments"] == [_arg("id", "integer", True), _arg("name", "string", True),
                                                         _arg("tag", "string", False)]
    assert docs["petstore.show_pet_by_id"]["api_call"] == "petstore.show_pet_by_id(petId='string')"
    assert imported.rejects == [] and imported.source["sha256"] == _sha256(PETSTORE)
    assert imported.source["openapi"] == "3.0.0" and imported.source["client"] == "petstore"
    # default client name from info.title
    assert _docs(read_openapi_source(PETSTORE)).keys() == {
        "swagger_petstore.list_pets", "swagger_petstore.create_pets", "swagger_petstore.show_pet_by_id"}


def test_openapi_core_petstore_parameters_bodies_and_placeholders():
    imported = read_openapi_source(PETSTORE_CORE, name="petstore")
    docs = _docs(imported)
    assert len(docs) == 8
    list_pets = docs["petstore.list_pets"]
    assert list_pets["api_call"] == "petstore.list_pets(limit=0)"  # the one required query parameter
    by_name = {a["name"]: a for a in list_pets["arguments"]}
    assert [a["name"] for a in list_pets["arguments"]] == ["page", "limit", "search", "ids", "order", "tags",
                                                           "coordinates", "color"]
    assert by_name["page"] == _arg("page", "integer", False, 1)
    assert by_name["search"] == _arg("search", "string", False, "", "Search query")
    assert by_name["order"]["type"] == "string|integer"  # oneOf
    assert by_name["tags"]["type"] == "array[string]"  # items: $ref Tag (a string enum)
    assert by_name["coordinates"]["type"] == "object"  # content instead of schema
    create = docs["petstore.create_pets"]
    # header api-key -> api_key; cookies left out; body PetCreate = allOf(PartOne, PartTwo);
    # name's placeholder comes from the media type's example {name: "Pet", wings: []}
    assert create["api_call"] == "petstore.create_pets(api_key='string', name='Pet')"
    assert [a["name"] for a in create["arguments"]] == ["api_key", "name", "tag", "address", "position", "healthy"]
    assert create["description"] == "Create a pet. Creates new pet entry"
    assert imported.notes == {"skipped": {"cookie_parameters": 2}}
    # a binary body is one argument "body"; a body that is not required makes no property required
    assert docs["petstore.create_pet_photo_by_id"]["api_call"] == "petstore.create_pet_photo_by_id(petId=0, body='string')"
    assert docs["petstore.delete_tag"]["api_call"] == "petstore.delete_tag()"
    assert [a["name"] for a in docs["petstore.delete_tag"]["arguments"]] == ["x_delete_force", "ids"]
    assert docs["petstore.list_tags"]["domain"] == "tags"


def test_operation_names_and_client_names():
    assert operation_name("get", "/pets/{petId}", None) == "get_pets_by_pet_id"
    assert operation_name("get", "/pets/{petId}", "showPetById") == "show_pet_by_id"
    assert operation_name("post", "/", None) == "post"
    assert operation_name("get", "/x", "import") == "import_"
    assert operation_name("get", "/x", "2fa-verify") == "op_2fa_verify"
    assert snake_case("HTTPServerList") == "http_server_list"
    assert default_client_name("Swagger Petstore") == "swagger_petstore"
    assert default_client_name("3D Print API") == "api_3_d_print_api"  # a digit before a capital splits
    assert default_client_name("!!!") == "api"


def _spec(tmp_path: Path, mutate, *, suffix=".yaml", base=PETSTORE) -> Path:
    doc = yaml.safe_load(base.read_text())
    mutate(doc)
    out = tmp_path / f"spec{suffix}"
    out.write_text(json.dumps(doc, indent=1) if suffix == ".json" else yaml.safe_dump(doc, sort_keys=False))
    return out


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises((InputError, RatuneError)) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_openapi_json_reads_like_yaml_and_refs_resolve_in_path_items(tmp_path):
    as_json = _spec(tmp_path, lambda d: None, suffix=".json")
    assert _docs(read_openapi_source(as_json, name="p")) == _docs(read_openapi_source(PETSTORE, name="p"))

    def path_item_ref(doc):  # OpenAPI 3.1: a path item by reference; no operationId -> method + path
        item = doc["paths"]["/pets/{petId}"]
        del item["get"]["operationId"]
        doc["components"]["pathItems"] = {"PetPath": item}
        doc["paths"]["/pets/{petId}"] = {"$ref": "#/components/pathItems/PetPath"}

    docs = _docs(read_openapi_source(_spec(tmp_path, path_item_ref), name="p"))
    assert docs["p.get_pets_by_pet_id"]["api_call"] == "p.get_pets_by_pet_id(petId='string')"


def test_openapi_a_property_named_ref_is_a_property(tmp_path):
    """openapi-spec-validator's own petstore has a Pet property called "$ref"; it is a name there."""
    spec = _spec(tmp_path, lambda d: d["components"]["schemas"]["Pet"]["properties"].update({"$ref": {"type": "string"}}))
    create = _docs(read_openapi_source(spec, name="p"))["p.create_pets"]
    assert [a["name"] for a in create["arguments"]] == ["id", "name", "tag", "ref"]


def test_openapi_malformed_inputs_name_file_and_pointer(tmp_path):
    body_ref = "/paths/~1pets/post/requestBody/content/application~1json/schema/$ref"

    def broken_ref(doc):
        doc["paths"]["/pets"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] = \
            "#/components/schemas/Nope"

    spec = _spec(tmp_path, broken_ref)
    assert _error(read_openapi_source, spec) == (f"{spec}: field '{body_ref}': $ref '#/components/schemas/Nope' "
                                                 "does not resolve: no 'Nope' there")

    def cycle(doc):
        doc["components"]["schemas"].update({"A": {"$ref": "#/components/schemas/B"},
                                             "B": {"$ref": "#/components/schemas/A"}})
        doc["paths"]["/pets"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] = \
            "#/components/schemas/A"

    message = _error(read_openapi_source, _spec(tmp_path, cycle))
    assert "circular $ref: #/components/schemas/A -> #/components/schemas/B -> #/components/schemas/A" in message

    def allof_cycle(doc):
        doc["components"]["schemas"]["Pet"]["allOf"] = [{"$ref": "#/components/schemas/Pet"}]

    assert "field '/components/schemas/Pet': circular allOf" in _error(read_openapi_source, _spec(tmp_path, allof_cycle))

    def no_name(doc):
        del doc["paths"]["/pets"]["get"]["parameters"][0]["name"]

    spec = _spec(tmp_path, no_name)
    assert _error(read_openapi_source, spec) == (f"{spec}: field '/paths/~1pets/get/parameters/0/name': missing or "
                                                 "not a non-empty string")

    def external(doc):
        doc["paths"]["/pets"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] = "pet.yaml#/Pet"

    assert "only local references" in _error(read_openapi_source, _spec(tmp_path, external))

    def bad_in(doc):
        doc["paths"]["/pets"]["get"]["parameters"][0]["in"] = "body"

    assert "field '/paths/~1pets/get/parameters/0/in': 'body': expected one of path, query, header, cookie" in \
        _error(read_openapi_source, _spec(tmp_path, bad_in))

    message = _error(read_openapi_source, SWAGGER2)
    assert message.startswith(f"{SWAGGER2}: field '/swagger': Swagger 2.0 (OpenAPI 2) is not supported")
    assert "convert it to OpenAPI 3" in message
    spec = _spec(tmp_path, lambda d: d.update(openapi="2.5"))
    assert _error(read_openapi_source, spec).startswith(f"{spec}: field '/openapi': '2.5': expected an OpenAPI 3.x")
    spec = _spec(tmp_path, lambda d: d["info"].pop("title"))
    assert _error(read_openapi_source, spec).startswith(f"{spec}: field '/info/title': missing")

    truncated = tmp_path / "truncated.json"
    truncated.write_text(json.dumps(yaml.safe_load(PETSTORE.read_text()), indent=1)[:300])
    assert _error(read_openapi_source, truncated).startswith(f"{truncated}:")
    assert "not valid JSON" in _error(read_openapi_source, truncated)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text(PETSTORE.read_text().replace("    get:\n      summary: List", "    get: [\n      summary: List", 1))
    assert _error(read_openapi_source, bad_yaml).startswith(f"{bad_yaml}:")


def test_a_yaml_specification_goes_through_the_one_loader_s_guards(tmp_path):
    """A YAML OpenAPI document is read by ratune/config.py parse_yaml: a key given twice (PyYAML
    would keep the second silently) and an alias bomb are refused, naming the file and line."""
    from ratune.catalog.openapi import MAX_DOCUMENT_VALUES

    twice = tmp_path / "twice.yaml"
    twice.write_text(PETSTORE.read_text().replace("paths:\n", "paths:\n  /pets:\n    get: {}\n", 1))
    line = PETSTORE.read_text().splitlines().index("  /pets:") + 1 + 2  # two lines were added above it
    assert _error(read_openapi_source, twice) == f"{twice}:{line}: duplicate key '/pets' (first given on line " \
        f"{PETSTORE.read_text().splitlines().index('paths:') + 2})"
    bomb = tmp_path / "bomb.yaml"  # 10 levels of 10 aliases: 10^10 values once expanded, in 1 KB
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb.write_text("openapi: 3.0.0\n" + "\n".join(levels) + "\n")
    # level k (line k + 2) expands to (10^(k+2) - 1) / 9 values (its list and everything in it):
    # the first level over the bound is named (a6 on line 8 for 5,000,000)
    assert MAX_DOCUMENT_VALUES == 5_000_000
    first_over = next(k for k in range(10) if (10 ** (k + 2) - 1) // 9 > MAX_DOCUMENT_VALUES)
    assert _error(read_openapi_source, bomb) == (f"{bomb}:{first_over + 2}: aliases expand the document to more than "
                                                 f"{MAX_DOCUMENT_VALUES} values (an alias bomb?); write the values out")


# ------------------------------------------------------------------------------------- JSON lines


def test_jsonl_toolbox_documents_defaults_and_ignored_fields():
    imported = read_jsonl_source(TOOLBOX, name="toolbox")
    docs = _docs(imported)
    assert list(docs) == ["hashlib.new.sha256", "hashlib.new.md5", "huggingface_hub.hf_hub_download.gpt2",
                          "textwrap.wrap", "shutil.copyfile"]
    assert docs["textwrap.wrap"] == {
        "api_name": "textwrap.wrap", "api_call": "textwrap.wrap(text, width=70)",
        "description": "Wrap a paragraph into lines of at most width characters.", "domain": "default",
        "provider": "toolbox", "arguments": [_arg("text", "str", True), _arg("width", "int", False, 70)],
        "example_code": "", "identifying_arguments": []}
    assert docs["huggingface_hub.hf_hub_download.gpt2"]["identifying_arguments"] == ["repo_id"]
    assert docs["hashlib.new.sha256"]["provider"] == "Python standard library"
    assert imported.notes == {"ignored_fields": {"functionality": 2}}
    assert [loc for loc, _ in imported.entries][2] == f"{TOOLBOX}:3"
    assert imported.source == {"kind": "jsonl", "path": str(TOOLBOX), "sha256": _sha256(TOOLBOX)}


def _lines(tmp_path: Path, edit) -> Path:
    rows = [json.loads(line) for line in TOOLBOX.read_text().splitlines()]
    texts = [json.dumps(r) for r in rows]
    edit(rows, texts)
    out = tmp_path / "edited.jsonl"
    out.write_text("\n".join(t if isinstance(t, str) else json.dumps(t) for t in texts) + "\n")
    return out


def test_jsonl_malformed_lines_name_file_line_and_field(tmp_path):
    def bad_json(rows, texts):
        texts[2] = texts[2][:40]

    path = _lines(tmp_path, bad_json)
    assert _error(read_jsonl_source, path, name="t").startswith(f"{path}:3: not a JSON object")

    def missing(rows, texts):
        del rows[1]["description"]
        texts[1] = rows[1]

    path = _lines(tmp_path, missing)
    assert _error(read_jsonl_source, path, name="t").startswith(f"{path}:2: field 'description': missing")

    def not_a_call(rows, texts):
        rows[0]["api_call"] = "hashlib.sha256"
        texts[0] = rows[0]

    path = _lines(tmp_path, not_a_call)
    assert _error(read_jsonl_source, path, name="t") == (f"{path}:1: field 'api_call': 'hashlib.sha256': an Attribute "
                                                         "expression, not a call; expected pkg.func(arg)")

    edits = {"arguments": ("x", "field 'arguments': expected a list of objects, got str"),
             "identifying_arguments": (["filename2"], "field 'identifying_arguments': 'filename2': not a keyword"),
             "domain": (7, "field 'domain': expected a string, got int")}
    for key, (value, message) in edits.items():
        def edit(rows, texts, key=key, value=value):
            rows[2][key] = value
            texts[2] = rows[2]

        path = _lines(tmp_path, edit)
        assert _error(read_jsonl_source, path, name="t").startswith(f"{path}:3: {message}"), key

    def bad_required(rows, texts):
        rows[3]["arguments"][1]["required"] = "yes"
        texts[3] = rows[3]

    path = _lines(tmp_path, bad_required)
    assert _error(read_jsonl_source, path, name="t").startswith(f"{path}:4: field 'arguments[1].required'")


def test_duplicate_api_names_keep_the_first_and_are_reported(tmp_path):
    def duplicate(rows, texts):
        rows[4]["api_name"] = "textwrap.wrap"
        texts[4] = rows[4]

    path = _lines(tmp_path, duplicate)
    manifest = import_catalog("jsonl", path, tmp_path / "cat", "toolbox")
    assert manifest["counts"] == {"documents": 4, "duplicates": 1, "rejects": 0}
    assert manifest["duplicates"] == [{"api_name": "textwrap.wrap", "location": f"{path}:5",
                                       "first_location": f"{path}:4"}]
    kept = load_catalog(tmp_path / "cat")
    assert [d["api_name"] for d in kept][-1] == "textwrap.wrap" and kept[-1]["api_call"] == "textwrap.wrap(text, width=70)"
    assert split_duplicates([("a", {"api_name": "x"}), ("b", {"api_name": "x"}), ("c", {"api_name": "x"})])[1] == [
        {"api_name": "x", "location": "b", "first_location": "a"}, {"api_name": "x", "location": "c", "first_location": "a"}]


def test_load_catalog_refuses_a_duplicate_naming_both_lines(tmp_path):
    import_catalog("jsonl", TOOLBOX, tmp_path / "cat")
    apis = tmp_path / "cat" / APIS_FILE
    lines = apis.read_text().splitlines()
    apis.write_text("\n".join(lines + [lines[1]]) + "\n")
    assert _error(load_catalog, tmp_path / "cat") == (f"{apis}:6: field 'api_name': duplicate api_name "
                                                      "'hashlib.new.md5' (first on line 2)")
    apis.write_text(lines[0].replace('"api_call": "hashlib.new(', '"api_call": "hashlib.new)(') + "\n")
    assert _error(load_catalog, tmp_path / "cat").startswith(f"{apis}:1: field 'api_call':")
    assert _error(load_catalog, tmp_path / "nothing") == f"{tmp_path / 'nothing'}: no such catalog folder"
    (tmp_path / "empty").mkdir()
    assert _error(load_catalog, tmp_path / "empty").startswith(f"{tmp_path / 'empty'}: not a catalog folder (no apis.jsonl)")


# ------------------------------------------------------------------------------------- Python


def test_python_json_lists_its_public_api_without_calling_it():
    imported = read_python_source("json")
    docs = _docs(imported)
    assert set(docs) == {"json.dump", "json.dumps", "json.load", "json.loads", "json.JSONDecoder",
                         "json.JSONDecodeError", "json.JSONEncoder"}  # json.__all__
    dumps = docs["json.dumps"]
    assert dumps["api_call"] == "json.dumps(obj)" and docs["json.loads"]["api_call"] == "json.loads(s)"
    assert docs["json.dump"]["api_call"] == "json.dump(obj, fp)"
    assert docs["json.JSONDecodeError"]["api_call"] == "json.JSONDecodeError(msg, doc, pos)"
    assert docs["json.JSONEncoder"]["api_call"] == "json.JSONEncoder()"  # every constructor argument has a default
    assert dumps["description"] == "Serialize ``obj`` to a JSON formatted ``str``."
    assert dumps["domain"] == "json" and dumps["provider"] == "json"
    assert dumps["arguments"][0] == _arg("obj", None, True)
    assert _arg("skipkeys", None, False, False) in dumps["arguments"]
    assert _arg("**kw", None, False) == dumps["arguments"][-1]
    assert imported.rejects == [] and imported.source["module"] == "json"
    assert imported.source["sha256"] == _sha256(imported.source["file"])

    with_methods = _docs(read_python_source("json", methods=True))
    assert with_methods["json.JSONEncoder.encode"]["api_call"] == "json.JSONEncoder.encode(o)"
    assert with_methods["json.JSONDecoder.raw_decode"]["api_call"] == "json.JSONDecoder.raw_decode(s)"
    assert _arg("idx", None, False, 0) in with_methods["json.JSONDecoder.raw_decode"]["arguments"]


def test_python_without_all_lists_what_the_module_defines():
    # json.encoder has no __all__; its c_* and encode_basestring* come from the C module _json
    assert set(_docs(read_python_source("json.encoder"))) == {
        "json.encoder.py_encode_basestring", "json.encoder.py_encode_basestring_ascii", "json.encoder.JSONEncoder"}


def test_python_rejects_are_counted_and_an_empty_import_names_them(tmp_path):
    imported = read_python_source("json.scanner")  # __all__ = ["make_scanner"], the C type _json.Scanner
    assert imported.entries == []
    assert [r.location for r in imported.rejects] == ["json.scanner.make_scanner"]
    assert imported.rejects[0].reason.startswith("no signature to read")
    message = _error(import_catalog, "python", "json.scanner", tmp_path / "cat")
    assert message.startswith("json.scanner: no API documents to import (1 rejected: json.scanner.make_scanner: "
                              "no signature to read")
    assert not (tmp_path / "cat").exists()


def test_python_module_all_with_undefined_and_non_callable_names(tmp_path, monkeypatch):
    """A module written here: nothing of it is called (the marker file stays absent)."""
    marker = tmp_path / "called"
    (tmp_path / "ratune_catalog_probe.py").write_text(
        '"""A probe."""\n'
        f"MARKER = {str(marker)!r}\n"
        "__all__ = ['touch', 'Box', 'LIMIT', 'missing']\n"
        "LIMIT = 3\n"
        "def touch(path: str, *, mode: int = 0o644, tags=('a',)) -> None:\n"
        "    '''Create the file.\n\n    Details.'''\n"
        "    open(MARKER, 'w').close()\n"
        "class Box:\n"
        "    '''A box.'''\n"
        "    def __init__(self, size, *, label):\n"
        "        open(MARKER, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    imported = read_python_source("ratune_catalog_probe")
    docs = _docs(imported)
    assert docs["ratune_catalog_probe.touch"]["api_call"] == "ratune_catalog_probe.touch(path)"
    assert docs["ratune_catalog_probe.touch"]["description"] == "Create the file."
    assert docs["ratune_catalog_probe.touch"]["arguments"] == [
        _arg("path", "str", True), _arg("mode", "int", False, 420), _arg("tags", None, False, "('a',)")]
    assert docs["ratune_catalog_probe.Box"]["api_call"] == "ratune_catalog_probe.Box(size, label=label)"
    assert [r.to_json() for r in imported.rejects] == [
        {"location": "ratune_catalog_probe.LIMIT", "reason": "not a function or class (a int)"},
        {"location": "ratune_catalog_probe.missing",
         "reason": "listed in __all__, but getting it raised AttributeError: module 'ratune_catalog_probe' has no "
                   "attribute 'missing'"}]
    assert not marker.exists()


def test_python_unknown_module_and_file_path():
    assert _error(read_python_source, "no_such_module_for_ratune") == (
        "python module 'no_such_module_for_ratune': cannot import it (No module named 'no_such_module_for_ratune'); "
        "install it or put it on PYTHONPATH")
    assert "expected a dotted module path" in _error(read_python_source, "pkg/mod.py")


# ------------------------------------------------------------------------------------- the folder


def test_import_writes_a_catalog_that_loads_back(tmp_path):
    out = tmp_path / "petstore"
    manifest = import_catalog("openapi", PETSTORE, out, "petstore")
    docs = load_catalog(out)
    assert [d["api_name"] for d in docs] == ["petstore.list_pets", "petstore.create_pets", "petstore.show_pet_by_id"]
    assert all(list(d) == list(DOCUMENT_FIELDS) for d in docs)
    on_disk = json.loads((out / MANIFEST_FILE).read_text())
    assert on_disk == manifest
    assert on_disk["kind"] == "catalog" and on_disk["command"] == "catalog import" and on_disk["name"] == "petstore"
    assert on_disk["counts"] == {"documents": 3, "duplicates": 0, "rejects": 0}
    assert on_disk["source"]["sha256"] == _sha256(PETSTORE) and on_disk["source"]["path"] == str(PETSTORE)
    assert on_disk["files"] == {APIS_FILE: _sha256(out / APIS_FILE)}
    assert "ratune" in on_disk["versions"]
    # re-importing replaces the catalog's files and leaves any other file alone
    (out / "notes.txt").write_text("mine\n")
    import_catalog("jsonl", TOOLBOX, out)
    assert len(load_catalog(out)) == 5 and (out / "notes.txt").read_text() == "mine\n"


def test_import_refuses_folders_it_did_not_make(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "apis.jsonl").write_text("my own file\n")
    assert _error(import_catalog, "openapi", PETSTORE, user).startswith(
        f"{user}: not a ratune catalog import output (it has no .ratune-output marker)")
    assert (user / "apis.jsonl").read_text() == "my own file\n" and sorted(p.name for p in user.iterdir()) == ["apis.jsonl"]
    other = tmp_path / "train-run"
    other.mkdir()
    claim_folder(other, "train")
    assert "it is a ratune train output" in _error(import_catalog, "openapi", PETSTORE, other)
    assert not (other / APIS_FILE).exists()
    assert "--methods" in _error(import_catalog, "openapi", PETSTORE, tmp_path / "new", methods=True)
    assert "not a Python identifier" in _error(read_openapi_source, PETSTORE, name="pet-store")


# ------------------------------------------------------------------------------------- the CLI


def test_cli_catalog_import_end_to_end(tmp_path, capsys):
    out = tmp_path / "cat"
    rc = main(["catalog", "import", "--from", "openapi", str(PETSTORE_CORE), "--out", str(out), "--name", "petstore"])
    stdout = capsys.readouterr().out
    assert rc == 0
    assert stdout.splitlines()[0] == (f"catalog petstore: 8 API documents, 0 duplicates, 0 rejects "
                                      f"(from openapi {PETSTORE_CORE})")
    assert "  skipped: cookie_parameters (2)" in stdout
    assert len(load_catalog(out)) == 8

    rc = main(["catalog", "import", "--from", "python", "json.scanner", "--out", str(tmp_path / "scan")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ratune: error: json.scanner: no API documents")

    for argv, expected in (
            (["--from", "openapi", str(SWAGGER2)], f"ratune: error: {SWAGGER2}: field '/swagger': Swagger 2.0"),
            (["--from", "python", "no_such_module_for_ratune"], "ratune: error: python module 'no_such_module_for_ratune'"),
            (["--from", "jsonl", str(TOOLBOX), "--methods"], "ratune: error: methods (--methods)"),
            (["--from", "jsonl", str(TOOLBOX), "--name", "1x"], "ratune: error: catalog import: argument --name"),
            (["--from", "jsonl", str(tmp_path / "none" / "x.jsonl")], "ratune: error: catalog import: argument SOURCE")):
        rc = main(["catalog", "import", *argv, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and err.startswith(expected), (argv, err)
    assert not (tmp_path / "o").exists()


def test_cli_a_module_path_is_a_module_even_beside_a_folder_of_that_name(tmp_path, monkeypatch, capsys):
    """Run from a project root, ``--from python mypkg`` names the package, not its source folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "json").mkdir()
    assert main(["catalog", "import", "--from", "python", "json", "--out", "cat"]) == 0
    assert capsys.readouterr().out.startswith("catalog json: 7 API documents, 0 duplicates, 0 rejects")
    assert main(["catalog", "import", "--from", "jsonl", str(tmp_path / "json"), "--out", "cat"]) == 2
    assert "is a folder" in capsys.readouterr().err
