"""BFCL's shipped data read from ratune's side, and its answer keys turned into answer text.

BFCL (bfcl-eval) lives in a virtual environment of its own (``make bfcl-setup``; see
docs/function_calling.md, "Scoring on BFCL"). Nothing here imports it: the data files are found
under the venv's site-packages (:func:`bfcl_data_dir`) and its version is read from its
installed metadata (:func:`bfcl_version`). Questions (``data/BFCL_v4_<category>.json``) and answer
keys (``data/possible_answer/BFCL_v4_<category>.json``) hold one JSON object a line and are
joined by entry id (:func:`load_bfcl`). :func:`bfcl_messages` gives the messages BFCL's prompting mode
sends for an entry (its system prompt, with the functions as JSON), :func:`encode_bfcl_prompt` their
token ids through a chat template. :func:`possible_answer_text` renders an answer key as BFCL's
prompting answer, ``[f(a=1, b='x'), g(c=[1, 2])]``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl
from ratune.sources.formats import PythonCallsFormat
from ratune.sources.prompt import encode_messages

#: Environment variable naming BFCL's virtual environment (default: the checkout's .bfcl-venv).
BFCL_VENV_ENV = "RATUNE_BFCL_VENV"
#: The file-name prefix of BFCL's data files.
BFCL_PREFIX = "BFCL_v4"
#: The bfcl-eval release that bfcl-requirements.txt pins.
BFCL_EVAL_VERSION = "2026.3.23"


@dataclass(frozen=True)
class BfclEntry:
    """One BFCL entry: ``question`` (turns of ``{role, content}`` messages), ``functions`` (the JSON
    schemas offered), ``possible_answer`` (``[{func_name: {param: [accepted values]}}]``, None for a
    category without an answer key) and the 1-based ``line`` of the question file."""

    id: str
    category: str
    question: list
    functions: list
    possible_answer: list | None
    line: int


def bfcl_venv(venv: str | os.PathLike | None = None) -> Path:
    """BFCL's virtual environment: the argument, else $RATUNE_BFCL_VENV, else the checkout's (or the
    working folder's) .bfcl-venv.

    Raises:
        RatuneError: none of these holds a Python with bfcl_eval installed ("run make bfcl-setup").
    """
    if venv:
        candidates = [Path(venv)]
    elif os.environ.get(BFCL_VENV_ENV):
        candidates = [Path(os.environ[BFCL_VENV_ENV])]
    else:
        candidates = [Path(__file__).resolve().parent.parent / ".bfcl-venv", Path.cwd() / ".bfcl-venv"]
    for cand in candidates:
        if (cand / "bin" / "python").exists() and _site_packages(cand) is not None:
            return cand
    raise RatuneError(f"BFCL's virtual environment not found (tried {', '.join(map(str, candidates))}): "
                      f"run make bfcl-setup (or set {BFCL_VENV_ENV})")


def _site_packages(venv: Path) -> Path | None:
    """The site-packages folder of ``venv`` that holds bfcl_eval, or None."""
    found = sorted(glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "bfcl_eval")))
    return Path(found[0]).parent if found else None


def bfcl_data_dir(venv: str | os.PathLike | None = None) -> Path:
    """``bfcl_eval/data`` inside BFCL's venv (:func:`bfcl_venv`), found without importing bfcl_eval."""
    return _site_packages(bfcl_venv(venv)) / "bfcl_eval" / "data"


def bfcl_version(venv: str | os.PathLike | None = None) -> str:
    """The installed bfcl-eval version, read from its metadata in BFCL's venv (no import)."""
    site = _site_packages(bfcl_venv(venv))
    dist = next(importlib.metadata.distributions(name="bfcl-eval", path=[str(site)]), None)
    if dist is None:
        raise RatuneError(f"{site}: bfcl-eval's metadata is missing: run make bfcl-setup")
    return dist.version


def question_path(data_dir: str | os.PathLike, category: str) -> Path:
    """``<data>/BFCL_v4_<category>.json``."""
    return Path(data_dir) / f"{BFCL_PREFIX}_{category}.json"


def answer_path(data_dir: str | os.PathLike, category: str) -> Path:
    """``<data>/possible_answer/BFCL_v4_<category>.json`` (absent for the relevance categories)."""
    return Path(data_dir) / "possible_answer" / f"{BFCL_PREFIX}_{category}.json"


def load_bfcl(data_dir: str | os.PathLike, category: str) -> list[BfclEntry]:
    """A category's entries in question-file order, each joined with its answer key by id when
    BFCL ships one for the category.

    Raises:
        RatuneError: no question file for ``category``.
        InputError: naming file, line and field: a line that is not a JSON object, a missing or
            malformed ``id``, ``question``, ``function`` or ``ground_truth``, a duplicate id, an answer
            whose id has no question, or a call to a function the entry does not offer; a question
            without an answer (named by its id and line) where the category has an answer key.
    """
    qpath, apath = question_path(data_dir, category), answer_path(data_dir, category)
    if not qpath.is_file():
        raise RatuneError(f"{qpath}: no BFCL question file for category {category!r}")
    questions: dict[str, tuple[int, dict]] = {}
    for line, obj in iter_jsonl(qpath):
        entry_id = _entry_id(qpath, line, obj, questions)
        if not isinstance(obj.get("question"), list):
            raise InputError(str(qpath), line, "question", "expected a list of turns")
        functions = obj.get("function")
        if not isinstance(functions, list):
            raise InputError(str(qpath), line, "function", "expected a list of function schemas")
        for i, fn in enumerate(functions):
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise InputError(str(qpath), line, f"function[{i}].name", "missing or not a non-empty string")
            if not isinstance(fn.get("parameters"), dict):
                raise InputError(str(qpath), line, f"function[{i}].parameters", "expected a JSON object")
        questions[entry_id] = (line, obj)
    answers: dict[str, list] = {}
    if apath.is_file():
        for line, obj in iter_jsonl(apath):
            entry_id = _entry_id(apath, line, obj, answers)
            if entry_id not in questions:
                raise InputError(str(apath), line, "id", f"no question with id {entry_id!r} in {qpath.name}")
            names = {fn["name"] for fn in questions[entry_id][1]["function"]}
            answers[entry_id] = _check_ground_truth(apath, line, obj.get("ground_truth"), names)
        for entry_id, (line, _) in questions.items():
            if entry_id not in answers:
                raise InputError(str(apath), None, "id", f"no possible answer for {entry_id!r} ({qpath.name} line {line})")
    return [BfclEntry(id=entry_id, category=category, question=obj["question"], functions=obj["function"],
                      possible_answer=answers.get(entry_id), line=line)
            for entry_id, (line, obj) in questions.items()]


def _entry_id(path: Path, line: int, obj: dict, seen: dict) -> str:
    entry_id = obj.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        raise InputError(str(path), line, "id", "missing or not a non-empty string")
    if entry_id in seen:
        raise InputError(str(path), line, "id", f"duplicate id {entry_id!r}")
    return entry_id


def _check_ground_truth(path: Path, line: int, calls, names: set[str]) -> list:
    """``calls`` when it is ``[{func_name: {param: [accepted values]}}]`` naming offered functions."""
    if not isinstance(calls, list):
        raise InputError(str(path), line, "ground_truth", "expected a list of calls")
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or len(call) != 1:
            raise InputError(str(path), line, f"ground_truth[{i}]", "expected {function name: {param: [values]}}")
        (name, params), = call.items()
        if name not in names:
            raise InputError(str(path), line, f"ground_truth[{i}]", f"calls {name!r}, which the entry does not offer")
        if not isinstance(params, dict):
            raise InputError(str(path), line, f"ground_truth[{i}].{name}", "expected {param: [accepted values]}")
        for param, accepted in params.items():
            if not isinstance(accepted, list):
                raise InputError(str(path), line, f"ground_truth[{i}].{name}.{param}",
                                 "expected a list of accepted values")
    return calls


def bfcl_messages(entry: BfclEntry) -> list[dict]:
    """The messages BFCL's prompting mode sends for a single-turn Python entry (``bfcl generate``,
    bfcl_eval/model_handler/local_inference/base_oss_handler.py ``_pre_query_processing_prompting``):
    the system prompt of :meth:`~ratune.sources.formats.PythonCallsFormat.system_prompt` over the
    functions
    appended to each description, put before the entry's first message, or in front of the entry's
    own system message (separated by a blank line), then the entry's messages as they are.

    Raises:
        RatuneError: an entry with more than one turn (a multi-turn category).
    """
    return bfcl_chat(entry, PythonCallsFormat())[0]


def bfcl_chat(entry: BfclEntry, answer_format) -> tuple[list[dict], tuple | None]:
    """A single-turn entry as ``answer_format`` shows it: ``(messages, tools)``
    (:meth:`~ratune.sources.formats.AnswerFormat.chat`; ``python_calls``: :func:`bfcl_messages`).

    Raises:
        RatuneError: an entry with more than one turn (a multi-turn category).
    """
    if len(entry.question) != 1:
        raise RatuneError(f"BFCL entry {entry.id}: {len(entry.question)} turns; only single-turn entries are prompted here")
    return answer_format.chat(entry.question[0], entry.functions)


def encode_bfcl_prompt(tokenizer, entry: BfclEntry, answer_format=None) -> list[int]:
    """Token ids of :func:`bfcl_chat` in ``answer_format`` (None: ``python_calls``, BFCL's own
    prompting messages; :func:`ratune.sources.prompt.encode_messages`).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    return encode_messages(tokenizer, *bfcl_chat(entry, answer_format or PythonCallsFormat()))


def possible_answer_text(possible_answer: list[dict], functions: list[dict]) -> str:
    """BFCL's prompting answer for an answer key, ``[f(a=1, b='x'), g(c=[1, 2])]`` (``[]`` for no
    call): :func:`possible_answer_calls` rendered by
    :meth:`ratune.sources.formats.PythonCallsFormat.render_calls`."""
    return PythonCallsFormat.render_calls(possible_answer_calls(possible_answer, functions))


def possible_answer_calls(possible_answer: list[dict], functions: list[dict]) -> list[dict]:
    """One answer an answer key accepts, as calls ``[{"name", "arguments"}]``.

    Per parameter the first accepted value. ``""`` among the accepted
    values means "may be left out" (ast_checker's rule), so such a parameter is left out, unless the function's schema requires
    it: then its first value other than ``""`` is given (``''`` when ``""`` is all there is). A
    parameter with no accepted value at all (``[]``, in a few live entries) is left out: no answer
    passes the checker there. A
    parameter whose schema type is ``dict`` (or an ``array`` of ``dict`` items) has accepted values in
    answer-key form again (``{key: [accepted values]}``), converted by the same rule.

    Args:
        possible_answer: the entry's ``ground_truth`` (:attr:`BfclEntry.possible_answer`).
        functions: the entry's function schemas (for ``required`` and the parameter types).

    Raises:
        ValueError: a call to a function not among ``functions``.
    """
    schemas = {fn["name"]: fn for fn in functions}
    calls = []
    for call in possible_answer:
        (name, params), = call.items()
        if name not in schemas:
            raise ValueError(f"the answer calls {name!r}, which is not among the entry's functions")
        schema = schemas[name].get("parameters", {})
        properties, required = schema.get("properties", {}), set(schema.get("required", []))
        values = {param: _first_value(accepted, param in required) for param, accepted in params.items()}
        calls.append({"name": name, "arguments": {param: _answer_value(value, properties.get(param, {}))
                                                  for param, value in values.items() if value is not _LEFT_OUT}})
    return calls


def unpassable_key(possible_answer: list[dict], functions: list[dict]) -> str | None:
    """Why no answer can pass an answer key under ``ast_checker``, or None: a required parameter
    the key does not name, or names with no accepted value, or a parameter the function does not
    have that the key does not let be left out (no ``""``). tests/test_bfcl_scoring.py checks that
    these are exactly the keys whose converted answer the checker refuses."""
    schemas = {fn["name"]: fn for fn in functions}
    for call in possible_answer:
        (name, params), = call.items()
        schema = schemas[name].get("parameters", {})
        properties, required = schema.get("properties", {}), schema.get("required", [])
        for param in required:
            if param not in params:
                return f"{name}: required parameter {param!r} is not in the key"
            if not params[param]:
                return f"{name}: required parameter {param!r} has no accepted value"
        for param, accepted in params.items():
            if param not in properties and "" not in accepted:
                return f"{name}: parameter {param!r} is not the function's"
    return None


_LEFT_OUT = object()


def _first_value(accepted: list, required: bool):
    """The value to give for one accepted-values list, or _LEFT_OUT."""
    if not accepted or ("" in accepted and not required):
        return _LEFT_OUT
    return next((v for v in accepted if v != ""), "")


def _answer_value(value, schema: dict):
    """``value``, or, when ``schema`` says ``dict`` (or ``array`` of ``dict``), the dict (or dicts) in
    answer-key form converted (:func:`_answer_dict`)."""
    kind = schema.get("type")
    if kind == "dict" and isinstance(value, dict):
        return _answer_dict(value)
    if kind == "array" and schema.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_answer_dict(v) if isinstance(v, dict) else v for v in value]
    return value


def _answer_dict(form: dict) -> dict:
    """``{key: [accepted values]}`` -> ``{key: first value}``, keys whose list holds ``""`` left out."""
    out = {}
    for key, accepted in form.items():
        value = _first_value(accepted, False) if isinstance(accepted, list) else accepted
        if value is not _LEFT_OUT:
            out[key] = value
    return out
