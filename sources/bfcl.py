"""BFCL's shipped data read from ratune's side (found in BFCL's own virtual environment, never
imported), and its answer keys turned into answer text (docs/function_calling.md)."""

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
    """One BFCL entry: ``question`` (turns of messages), ``functions`` (JSON schemas),
    ``possible_answer`` (``[{func_name: {param: [accepted values]}}]`` or None) and its ``line``."""

    id: str
    category: str
    question: list
    functions: list
    possible_answer: list | None
    line: int


def bfcl_venv(venv: str | os.PathLike | None = None) -> Path:
    """BFCL's virtual environment: the argument, else $RATUNE_BFCL_VENV, else a .bfcl-venv.

    Raises:
        RatuneError: none of these holds a Python with bfcl_eval installed.
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
    """A category's entries in question-file order, joined with its answer key by id where one exists.

    Raises:
        RatuneError: no question file for ``category``.
        InputError: naming file, line and field: a malformed line, ``id``, ``question``,
            ``function`` or ``ground_truth``, a duplicate id, an answer without a question or
            calling a function not offered, or a question without an answer.
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
    """The messages BFCL's prompting mode sends for a single-turn Python entry (as
    bfcl_eval/model_handler/local_inference/base_oss_handler.py ``_pre_query_processing_prompting``).

    Raises:
        RatuneError: an entry with more than one turn (a multi-turn category).
    """
    return bfcl_chat(entry, PythonCallsFormat())[0]


@dataclass(frozen=True)
class Shot:
    """A worked example shown before a BFCL question: a tool set's row (its ``line`` in the train split)."""

    line: int
    query: str
    functions: tuple
    calls: tuple


def bfcl_chat(entry: BfclEntry, answer_format, shots: tuple[Shot, ...] = ()) -> tuple[list[dict], tuple | None]:
    """A single-turn entry as ``answer_format`` shows it: ``(messages, tools)``; ``shots`` come as
    earlier turns right after the system message (``python_calls`` only).

    Raises:
        RatuneError: an entry with more than one turn (a multi-turn category).
    """
    if len(entry.question) != 1:
        raise RatuneError(f"BFCL entry {entry.id}: {len(entry.question)} turns; only single-turn entries are prompted here")
    messages, tools = answer_format.chat(entry.question[0], entry.functions)
    if shots:
        turns = [t for shot in shots for t in answer_format.shot_turns(shot.functions, shot.query, shot.calls)]
        messages[1:1] = turns
    return messages, tools


def encode_bfcl_prompt(tokenizer, entry: BfclEntry, answer_format=None, shots: tuple[Shot, ...] = ()) -> list[int]:
    """Token ids of :func:`bfcl_chat` in ``answer_format`` (None: ``python_calls``).

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    return encode_messages(tokenizer, *bfcl_chat(entry, answer_format or PythonCallsFormat(), shots))



def possible_answer_text(possible_answer: list[dict], functions: list[dict]) -> str:
    """BFCL's prompting answer for an answer key, ``[f(a=1, b='x'), g(c=[1, 2])]`` (``[]``: no call)."""
    return PythonCallsFormat.render_calls(possible_answer_calls(possible_answer, functions))


def possible_answer_calls(possible_answer: list[dict], functions: list[dict]) -> list[dict]:
    """One answer an answer key accepts, as calls ``[{"name", "arguments"}]``: per parameter the
    first accepted value, ``""`` meaning left out (rules: docs/function_calling.md).

    Args:
        possible_answer: the entry's ``ground_truth``.
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
    unnamed or without accepted value, or an unknown parameter that may not be left out."""
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
    """``value``, with dicts in answer-key form converted where ``schema`` says ``dict``."""
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
