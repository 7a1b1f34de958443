"""APIBench parsing (Patil et al., 2023, section 3.1): the released files in, typed records out
(docs/pipeline.md#data). The ``code`` layouts: ``pseudo_dict`` (torchhub_train), ``hash_dict``
(torchhub_eval), ``hash_markers`` (huggingface_eval, tensorflow_eval); none is JSON or eval'd."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, sha256_file

#: Hub names as the api/, questions/ and responses/ files use them (apibench/ says ``tensorflow``).
HUBS = ("torchhub", "huggingface", "tensorflowhub")

_EXAMPLE_PREFIX = {"torchhub": "torchhub", "huggingface": "huggingface", "tensorflowhub": "tensorflow"}

#: Environment variable naming the APIBench folder when ``--apibench`` is not given.
APIBENCH_ENV = "RATUNE_APIBENCH"

#: The answer fields, in the order the canonical answer text lists them (paper, Figure 3).
ANSWER_FIELDS = ("domain", "api_call", "api_provider", "explanation", "code")

#: Fields an API document must have (api_call names the API; the official scorer compares domain).
REQUIRED_DOC_FIELDS = ("domain", "api_call")


@dataclass(frozen=True)
class Answer:
    """The assistant turn's content: the five fields of a Gorilla answer."""

    domain: str
    api_call: str
    api_provider: str
    explanation: str
    code: str


@dataclass(frozen=True)
class Example:
    """One APIBench example.

    Attributes:
        hub: one of HUBS.
        split: ``train`` or ``eval``.
        line: 1-based line in the source file; for eval files this is the paper's question_id.
        instruction: the user's request (with its ``###Input:`` part when the row has one).
        api: the gold API document (the row's ``api_data``).
        layout: which ``code`` layout the row used.
        tools, calls, system: a tool set's row: the tools it offers (JSON schemas), the calls
            that answer it (``[{"name", "arguments"}]``; empty: none fits), its system message.
    """

    hub: str
    split: str
    line: int
    instruction: str
    api: dict
    answer: Answer
    layout: str
    tools: tuple = ()
    calls: tuple = ()
    system: str | None = None

    @property
    def oracle_documents(self) -> list[dict]:
        """What the oracle shows: a tool set row's own tools, else the gold API document."""
        return list(self.tools) or [self.api]


@dataclass
class ParseReport:
    """What a lenient parse set aside: ``(file, line, field, reason)`` per rejected row."""

    rejects: list[tuple[str, int, str | None, str]] = field(default_factory=list)


def resolve_apibench_dir(apibench: str | os.PathLike | None) -> Path:
    """The APIBench folder: the argument, else $RATUNE_APIBENCH, else ../shared/apibench.

    Raises:
        RatuneError: when the folder does not exist or lacks the api/ and apibench/ folders.
    """
    candidates = [apibench] if apibench else []
    if not candidates and os.environ.get(APIBENCH_ENV):
        candidates = [os.environ[APIBENCH_ENV]]
    if not candidates:
        here = Path(__file__).resolve().parent.parent
        candidates = [here.parent / "shared" / "apibench", Path.cwd().parent / "shared" / "apibench"]
    for cand in candidates:
        path = Path(cand)
        if (path / "api").is_dir() and (path / "apibench").is_dir():
            return path
    raise RatuneError(
        f"APIBench folder not found (tried {', '.join(str(c) for c in candidates)}): pass --apibench DIR "
        f"or set {APIBENCH_ENV}; the folder must hold api/ and apibench/ as released by the Gorilla authors"
    )


def check_hub(hub: str) -> str:
    """Return ``hub`` if it is a known hub, else raise RatuneError listing the valid ones."""
    if hub not in HUBS:
        raise RatuneError(f"unknown hub {hub!r}: expected one of {', '.join(HUBS)}")
    return hub


def api_database_path(apibench_dir: str | os.PathLike, hub: str) -> Path:
    """Path of a hub's API database (``api/{hub}_api.jsonl``)."""
    return Path(apibench_dir) / "api" / f"{check_hub(hub)}_api.jsonl"


def examples_path(apibench_dir: str | os.PathLike, hub: str, split: str) -> Path:
    """Path of a hub's example file (``apibench/{torchhub,huggingface,tensorflow}_{split}.json``)."""
    return Path(apibench_dir) / "apibench" / f"{_EXAMPLE_PREFIX[check_hub(hub)]}_{split}.json"


def questions_path(apibench_dir: str | os.PathLike, hub: str, setting: str) -> Path:
    """Path of the paper's eval question file for a test setting (0_shot, bm25, gpt_index, oracle)."""
    return Path(apibench_dir) / "questions" / f"questions_{check_hub(hub)}_{setting}.jsonl"


def released_responses_path(apibench_dir: str | os.PathLike, hub: str, model: str, setting: str) -> Path:
    """Path of a released Gorilla-7B response file, ``responses/response_{hub}_Gorilla_{model}_{setting}.jsonl``."""
    return Path(apibench_dir) / "responses" / f"response_{check_hub(hub)}_Gorilla_{model}_{setting}.jsonl"


def load_api_database(path: str | os.PathLike) -> list[dict]:
    """Load an API database: one API document (JSON object) per line, in file order.

    Raises:
        RatuneError: the file does not exist.
        InputError: a line that is not a JSON object, a document without a string ``domain`` or
            ``api_call`` (naming file, line and field), or no document at all.
    """
    if not Path(path).is_file():
        raise RatuneError(f"{path}: no API database there")
    docs = []
    for number, obj in iter_jsonl(path):
        for key in REQUIRED_DOC_FIELDS:
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise InputError(str(path), number, key, "missing or not a non-empty string")
        docs.append(obj)
    if not docs:
        raise InputError(str(path), None, None, "no API documents (the file is empty)")
    return docs


def api_identity(doc: dict) -> str:
    """The identity of an API: its ``api_call`` with all whitespace removed (a tool's: its ``name``),
    so documents with the same call are the same API whatever their other fields."""
    return re.sub(r"\s+", "", document_name(doc))


def document_name(doc: dict) -> str:
    """What names a document: an API document's ``api_call``, a tool's ``name``."""
    return doc["api_call"] if "api_call" in doc else doc["name"]


# --------------------------------------------------------------------------------------------
# The three ``code`` layouts.

_HASH_INSTRUCTION = re.compile(r"^\s*###\s*Instruction:\s*", re.S)
_HASH_OUTPUT = re.compile(r"\n\s*###\s*Output:\s*")
_PSEUDO_INSTRUCTION = re.compile(r"^\s*\{\s*'Instruction':\s*", re.S)
_PSEUDO_NEXT = re.compile(r",\s*'(Input|Output)':\s*")
_MARKER = re.compile(r"<<<(domain|api_call|api_provider|explanation|code)>>>:?")


def _strip_quotes(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return value.strip()


def _dict_fields(text: str) -> dict[str, str]:
    """Fields of a pseudo-dict answer, cut at the next known key: values nest unescaped quotes
    (``'api_call': 'torch.hub.load('a', 'b')'``)."""
    found = []
    for key in ANSWER_FIELDS:
        m = re.search(rf"'{key}':\s*", text)
        if m:
            found.append((m.start(), m.end(), key))
    found.sort()
    out = {}
    for i, (_, value_start, key) in enumerate(found):
        value_end = found[i + 1][0] if i + 1 < len(found) else len(text)
        raw = text[value_start:value_end].rstrip()
        if raw.endswith(","):
            raw = raw[:-1]
        if i + 1 == len(found):  # the last value runs into the dict's closing brace(s)
            raw = re.sub(r"\}\s*\}?\s*$", "", raw.rstrip())
        out[key] = _strip_quotes(raw)
    return out


def _marker_fields(text: str) -> dict[str, str]:
    """Fields of a ``<<<domain>>>: ...`` answer: the text between consecutive markers."""
    marks = list(_MARKER.finditer(text))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out.setdefault(m.group(1), text[m.end():end].strip())
    return out


def parse_code(code: str) -> tuple[str, str, dict[str, str]]:
    """Split an APIBench ``code`` text into ``(layout, instruction, answer_fields)`` (those of
    ANSWER_FIELDS the text carries).

    Raises:
        ValueError: when no instruction can be found.
    """
    m = _HASH_INSTRUCTION.match(code)
    if m:
        rest = code[m.end():]
        out = _HASH_OUTPUT.search(rest)
        instruction = (rest[:out.start()] if out else rest).strip()
        answer = rest[out.end():] if out else ""
        if "<<<" in answer and _MARKER.search(answer):
            layout, fields = "hash_markers", _marker_fields(answer)
        else:
            layout, fields = "hash_dict", _dict_fields(answer)
    else:
        m = _PSEUDO_INSTRUCTION.match(code)
        if not m:
            raise ValueError("no instruction marker ('###Instruction:' or \"{'Instruction':\")")
        rest = code[m.end():]
        nxt = _PSEUDO_NEXT.search(rest)
        instruction = (rest[:nxt.start()] if nxt else rest).strip()
        answer = ""
        if nxt is not None:
            tail = rest[nxt.end():]
            if nxt.group(1) == "Input":
                out = re.search(r",\s*'Output':\s*", tail)
                input_text = _strip_quotes(tail[:out.start()] if out else tail)
                instruction = f"{instruction}\n###Input: {input_text}"
                tail = tail[out.end():] if out else ""
            answer = tail
        layout, fields = "pseudo_dict", _dict_fields(answer)
    if not instruction:
        raise ValueError("empty instruction")
    return layout, instruction, fields


def load_examples(apibench_dir: str | os.PathLike, hub: str, split: str, *, lenient: bool = False,
                  report: ParseReport | None = None) -> list[Example]:
    """Parse every row of a hub's example file into :class:`Example` records, in file order.

    Args:
        split: ``train`` or ``eval`` (only TorchHub has a train file in the shared copy).
        lenient: unparseable rows go to ``report.rejects`` instead of raising.

    Raises:
        RatuneError: the file does not exist.
        InputError: a row that is not JSON, lacks ``code``/``api_call``/``api_data`` (or its
            ``domain``/``api_call``), or has no instruction (naming file, line and field); no
            example at all.
    """
    path = examples_path(apibench_dir, hub, split)
    if not path.exists():
        raise RatuneError(f"{path}: no {split} file for hub {hub} in {apibench_dir}")
    report = report if report is not None else ParseReport()
    skipped: list = []
    examples = []
    for number, row in iter_jsonl(path, lenient=lenient, skipped=skipped):
        try:
            examples.append(parse_row(row, hub=hub, split=split, path=str(path), line=number))
        except InputError as err:
            if not lenient:
                raise
            report.rejects.append((err.path, err.line, err.field, err.reason))
    report.rejects.extend((str(path), line, None, reason) for line, reason in skipped)
    if not examples:  # an empty split would build, train or evaluate nothing and be marked complete
        why = "every row was rejected (see the rejects)" if skipped or report.rejects else "the file has no rows"
        raise InputError(str(path), None, None, f"no {split} examples: {why}")
    return examples


def parse_row(row: dict, *, hub: str, split: str, path: str, line: int) -> Example:
    """Parse one example row (already JSON-decoded). See :func:`load_examples` for errors."""
    for key in ("code", "api_call", "api_data"):
        if key not in row:
            raise InputError(path, line, key, "required field is missing")
    if not isinstance(row["code"], str):
        raise InputError(path, line, "code", "expected a string")
    api = row["api_data"]
    if not isinstance(api, dict):
        raise InputError(path, line, "api_data", "expected a JSON object (the gold API document)")
    for key in REQUIRED_DOC_FIELDS:
        if not isinstance(api.get(key), str) or not api[key].strip():
            raise InputError(path, line, f"api_data.{key}", "missing or not a non-empty string")
    if not isinstance(row["api_call"], str) or not row["api_call"].strip():
        raise InputError(path, line, "api_call", "missing or not a non-empty string")
    try:
        layout, instruction, fields = parse_code(row["code"])
    except ValueError as exc:
        raise InputError(path, line, "code", str(exc)) from None
    answer = Answer(
        domain=api["domain"].strip(),
        api_call=row["api_call"].strip(),
        api_provider=str(row.get("provider") or api.get("framework") or "").strip(),
        explanation=fields.get("explanation", ""),
        code=fields.get("code", ""),
    )
    return Example(hub=hub, split=split, line=line, instruction=instruction, api=api, answer=answer,
                   layout=layout)


def input_hashes(paths) -> dict[str, str]:
    """``{file name: sha256}`` for the given input files (recorded in manifests)."""
    return {Path(p).name: sha256_file(p) for p in paths}
