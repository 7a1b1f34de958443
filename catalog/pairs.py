"""User-brought instruction pairs for a catalog: loading, validation, and the train/eval split.

A pairs file is JSON lines, one object per line (blank lines ignored)::

    {"instruction": "Show me ten pets from the store", "api_name": "petstore.list_pets",
     "api_call": "petstore.list_pets(limit=10)", "explanation": "...", "code": "..."}

Fields (:data:`PAIR_FIELDS`; any other field is an error, so a misspelt ``api_cal`` is not
silently ignored):

* ``instruction`` (str, required, not blank): the user's request;
* ``api_name`` (str, required): a catalog API (an unknown name is an error that suggests the
  closest names, by :mod:`difflib`);
* ``api_call`` (str, optional): the gold call with this instruction's argument values; it must be
  one call expression that *identifies its own api_name* under the catalog's identity rules
  (:mod:`ratune.catalog.scoring`). Default: the document's ``api_call``;
* ``explanation``, ``code`` (str, optional): the answer's other fields. The answer's ``domain``
  and ``api_provider`` always come from the catalog document, so those fields are refused here.

Duplicates: two lines whose instructions are equal after :func:`ratune.sources.validate.normalise`
(case-folded, whitespace collapsed) are an error by default (``duplicates="error"``); with
``duplicates="drop"`` the later line is dropped and reported when both name the same API. The same
instruction for two different APIs is a conflicting label and always an error.

Split (:func:`split_pairs`): API-stratified and seeded. Each API's pairs (in file order) are
shuffled with their own generator, seeded by ``(seed, api_name)``, and cut so that both splits hold
every API that has at least 2 pairs: ``n_eval = round_half_up(k * eval_fraction)`` clamped to
``1 .. k - 1`` for an API with k >= 2 pairs; **an API with a single pair goes to train**. A given
API's split does not depend on the other APIs in the file. Then the leakage check of the
APIBench build (:func:`ratune.sources.validate.find_leakage`: exact, normalised and near-duplicate
instructions) runs on the two splits under one of :data:`~ratune.sources.validate.LEAKAGE_POLICIES`.

``ratune catalog pairs`` (:func:`write_pairs`) writes the split into the catalog folder:
``CATALOG/pairs/train.jsonl`` and ``eval.jsonl`` (one :func:`pair_record` per line) and
``CATALOG/pairs/manifest.json`` (the source file's hash, fraction, seed, counts, the dropped
duplicates and the leaks); :mod:`ratune.hubs` reads them back as the catalog's examples.
"""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ratune.args import bounded, input_dir, input_file
from ratune.catalog.folder import read_catalog_manifest
from ratune.catalog.schema import APIS_FILE, load_catalog
from ratune.catalog.scoring import CatalogIndex, parse_call
from ratune.config import Seed
from ratune.sources.validate import (LEAKAGE_POLICIES, LEAK_KINDS, MAX_PAIRS_IN_MESSAGE, NEAR_DUPLICATE_JACCARD,
                                  find_leakage, normalise, stratified_holdout)
from ratune.errors import InputError, RatuneError
from ratune.io import iter_jsonl, read_json_object, sha256_file, write_json, write_text
from ratune.manifest import base_manifest
from ratune.output import StageOutput
from ratune.registry import SPLITS


#: The stage name of ``ratune catalog instruct`` (its sidecar manifest's ``command`` and ``kind``).
INSTRUCT_STAGE = "catalog instruct"
#: The sidecar manifest of an output file: ``FILE`` + this suffix (``gen.jsonl.manifest.json``).
SIDECAR_SUFFIX = ".manifest.json"
#: The fields a pair line may carry: required first, then optional.
REQUIRED_PAIR_FIELDS = ("instruction", "api_name")
OPTIONAL_PAIR_FIELDS = ("api_call", "explanation", "code")
PAIR_FIELDS = REQUIRED_PAIR_FIELDS + OPTIONAL_PAIR_FIELDS

#: What :func:`load_pairs` does with a repeated instruction for the same API.
DUPLICATE_POLICIES = ("error", "drop")

#: How many close api_names an unknown-name error suggests.
MAX_SUGGESTIONS = 3


def sidecar_path(pairs_path: str | os.PathLike) -> Path:
    """The sidecar manifest of an output pairs file: ``FILE`` + :data:`SIDECAR_SUFFIX`."""
    path = Path(pairs_path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def instruct_sidecar(out: Path) -> dict | None:
    """The sidecar manifest of ``out`` when ``catalog instruct`` wrote it, else None."""
    sidecar = sidecar_path(out)
    if not sidecar.is_file():
        return None
    manifest = read_json_object(sidecar)
    return manifest if manifest.get("command") == INSTRUCT_STAGE else None


def generation_record(pairs_path: str | os.PathLike) -> dict | None:
    """What ``ratune catalog pairs`` copies into ``pairs/manifest.json`` about a generated pairs
    file: None unless its sidecar is a ``catalog instruct`` manifest; else the sidecar's
    ``generator``, ``prompt``, ``seeds``, ``sampling``, ``filters``, ``counts``, ``catalog``,
    ``versions`` and ``git_commit``, plus ``sidecar`` (``path``, ``sha256``: its list of dropped
    candidates stays there) and ``pairs_unchanged`` (whether the pairs file's sha256 is still the
    one recorded, False after a hand edit).

    Raises:
        InputError: a sidecar that is not a JSON object (naming it).
    """
    manifest = instruct_sidecar(Path(pairs_path))
    if manifest is None:
        return None
    sidecar = sidecar_path(pairs_path)
    keys = ("generator", "prompt", "seeds", "sampling", "filters", "counts", "catalog", "versions", "git_commit")
    return {**{k: manifest.get(k) for k in keys},
            "sidecar": {"path": str(sidecar), "sha256": sha256_file(sidecar)},
            "pairs_unchanged": (manifest.get("output") or {}).get("sha256") == sha256_file(pairs_path)}


@dataclass(frozen=True)
class Pair:
    """One instruction pair.

    Attributes:
        instruction: the user's request, as written (stripped of surrounding whitespace).
        api_name: the catalog API it asks for.
        api_call: the gold call (the line's, else the document's api_call).
        explanation: the answer's explanation, or None.
        code: the answer's code, or None.
        path: the file it came from.
        line: its 1-based line in that file.
    """

    instruction: str
    api_name: str
    api_call: str
    explanation: str | None
    code: str | None
    path: str
    line: int


def _suggest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=MAX_SUGGESTIONS, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return f" (the catalog has {len(names)} APIs)"


def _optional_string(path: str, number: int, obj: dict, field: str) -> str | None:
    value = obj.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(path, number, field, f"expected a string, got {type(value).__name__}")
    return value


def load_pairs(path: str | os.PathLike, documents: Sequence[dict], *, duplicates: str = "error",
               dropped: list | None = None) -> list[Pair]:
    """Read and validate a pairs file against a catalog (format in the module docstring).

    Args:
        path: the JSON-lines file.
        documents: the catalog's API documents (plain dicts, the catalog schema).
        duplicates: one of :data:`DUPLICATE_POLICIES` for a line whose normalised instruction and
            api_name repeat an earlier line's.
        dropped: receives ``(line, first_line)`` for each line dropped under ``duplicates="drop"``.
    Returns:
        The pairs in file order.
    Raises:
        RatuneError: the file does not exist, an unknown policy, a catalog that
            :class:`~ratune.catalog.scoring.CatalogIndex` refuses.
        InputError: naming file, line and field: a line that is not a JSON object, an unknown
            field, a missing or blank instruction, a missing or unknown api_name (with the closest
            names), an api_call that is not one call or does not identify its api_name, a
            non-string optional field, a duplicate instruction (policy ``error``, or a different
            api_name), or a file without pairs.
    """
    if duplicates not in DUPLICATE_POLICIES:
        raise RatuneError(f"unknown duplicates policy {duplicates!r}: expected one of {', '.join(DUPLICATE_POLICIES)}")
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: pairs file not found")
    where = str(path)
    index = CatalogIndex(documents)
    names = index.api_names
    pairs: list[Pair] = []
    seen: dict[str, tuple[int, str]] = {}
    for number, obj in iter_jsonl(path):
        for field in obj:
            if field not in PAIR_FIELDS:
                if field in ("domain", "api_provider", "provider"):
                    reason = "comes from the catalog document and cannot be set per pair"
                else:
                    close = difflib.get_close_matches(field, PAIR_FIELDS, n=1, cutoff=0.6)
                    reason = "unknown field" + (f"; did you mean {close[0]!r}?" if close else
                                                f" (expected {', '.join(PAIR_FIELDS)})")
                raise InputError(where, number, field, reason)
        instruction = obj.get("instruction")
        if not isinstance(instruction, str):
            raise InputError(where, number, "instruction",
                             "missing" if instruction is None else f"expected a string, got {type(instruction).__name__}")
        instruction = instruction.strip()
        if not instruction:
            raise InputError(where, number, "instruction", "empty")
        api_name = obj.get("api_name")
        if not isinstance(api_name, str):
            raise InputError(where, number, "api_name",
                             "missing" if api_name is None else f"expected a string, got {type(api_name).__name__}")
        if api_name not in index.documents:
            raise InputError(where, number, "api_name", f"unknown API {api_name!r}{_suggest(api_name, names)}")
        api_call = _optional_string(where, number, obj, "api_call")
        if api_call is None:
            api_call = index.documents[api_name]["api_call"]
        else:
            try:
                call = parse_call(api_call)
            except ValueError as exc:
                raise InputError(where, number, "api_call", f"{api_call!r}: {exc}") from None
            named = index.identify(call)
            if api_name not in named:
                what = (f"names {', '.join(repr(n) for n in named)} instead" if named
                        else "names no catalog API")
                raise InputError(where, number, "api_call",
                                 f"{api_call!r} does not identify {api_name!r}: it {what} "
                                 f"(the catalog's call for it is {index.documents[api_name]['api_call']!r})")
            api_call = api_call.strip()
        explanation = _optional_string(where, number, obj, "explanation")
        code = _optional_string(where, number, obj, "code")
        key = normalise(instruction)
        if key in seen:
            first_line, first_api = seen[key]
            if first_api != api_name:
                raise InputError(where, number, "instruction",
                                 f"same instruction as line {first_line} (after normalisation) but for "
                                 f"{api_name!r}, not {first_api!r}: conflicting labels")
            if duplicates == "error":
                raise InputError(where, number, "instruction",
                                 f"duplicate of line {first_line} (same API, same instruction after "
                                 "normalisation); remove it, or load with duplicates='drop'")
            if dropped is not None:
                dropped.append((number, first_line))
            continue
        seen[key] = (number, api_name)
        pairs.append(Pair(instruction, api_name, api_call, explanation, code, where, number))
    if not pairs:
        raise InputError(where, None, None, "no pairs (the file is empty)")
    return pairs


@dataclass(frozen=True)
class _Row:
    """What :func:`ratune.sources.validate.find_leakage` reads: an instruction and a unique line
    (here the pair's position in the input, so pairs from several files cannot collide)."""

    instruction: str
    line: int


@dataclass(frozen=True)
class PairLeak:
    """An eval pair whose instruction is also in the training split.

    Attributes:
        train: the training pair.
        eval: the eval pair.
        kind: one of LEAK_KINDS.
        similarity: token-set Jaccard similarity of the two instructions.
    """

    train: Pair
    eval: Pair
    kind: str
    similarity: float


def split_pairs(pairs: Sequence[Pair], eval_fraction: float, seed: int, *, leakage: str = "error",
                near_threshold: float | None = NEAR_DUPLICATE_JACCARD,
                leaks: list | None = None) -> tuple[list[Pair], list[Pair]]:
    """API-stratified, seeded train/eval split with the leakage check (module docstring).

    Args:
        pairs: the pairs (:func:`load_pairs`).
        eval_fraction: the share of each API's pairs that goes to eval, in (0, 1); an API with
            k >= 2 pairs puts ``round_half_up(k * eval_fraction)`` of them in eval, at least 1 and
            at most k - 1; an API with one pair goes to train.
        seed: the split's seed; the same pairs and seed give the same split on every machine.
        leakage: one of LEAKAGE_POLICIES: ``error`` raises on any leaked instruction, ``drop``
            removes the leaked training pairs (the eval split is never changed), ``allow`` keeps
            them; under ``drop`` and ``allow`` the leaks are reported in ``leaks``.
        near_threshold: token-set Jaccard at or above which two instructions are near-duplicates
            (:data:`~ratune.sources.validate.NEAR_DUPLICATE_JACCARD`); None checks exact and
            normalised equality only.
        leaks: receives a :class:`PairLeak` per (train, eval) pair found.
    Returns:
        ``(train, eval)``, each in input order.
    Raises:
        RatuneError: eval_fraction outside (0, 1), an unknown policy, or leakage under policy
            ``error`` (the message names ``file:line`` of both pairs, at most
            MAX_PAIRS_IN_MESSAGE of them).
    """
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) or not 0.0 < eval_fraction < 1.0:
        raise RatuneError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")
    if leakage not in LEAKAGE_POLICIES:
        raise RatuneError(f"unknown leakage policy {leakage!r}: expected one of {', '.join(LEAKAGE_POLICIES)}")
    eval_positions = stratified_holdout([pair.api_name for pair in pairs], eval_fraction, seed)
    train_pos = [i for i in range(len(pairs)) if i not in eval_positions]
    eval_pos = sorted(eval_positions)
    found = find_leakage([_Row(pairs[i].instruction, i) for i in train_pos],
                         [_Row(pairs[i].instruction, i) for i in eval_pos], near_threshold=near_threshold)
    pair_leaks = [PairLeak(pairs[p.train_line], pairs[p.eval_line], p.kind, p.similarity) for p in found]
    if leaks is not None:
        leaks.extend(pair_leaks)
    if pair_leaks and leakage == "error":
        counts = Counter(p.kind for p in pair_leaks)
        summary = ", ".join(f"{counts[k]} {k}" for k in LEAK_KINDS if counts[k])
        listed = [f"  {p.train.path}:{p.train.line} (train) <-> {p.eval.path}:{p.eval.line} (eval) "
                  f"({p.kind}, jaccard {p.similarity:.2f})" for p in pair_leaks[:MAX_PAIRS_IN_MESSAGE]]
        if len(pair_leaks) > MAX_PAIRS_IN_MESSAGE:
            listed.append(f"  ... and {len(pair_leaks) - MAX_PAIRS_IN_MESSAGE} more")
        raise RatuneError(
            f"train/eval leakage in the pair split: {len(pair_leaks)} pair(s) ({summary}; near = token-set "
            f"Jaccard >= {near_threshold}):\n" + "\n".join(listed) +
            "\nReword or remove one of each, or choose the leakage policy 'drop' (remove the leaked "
            "training pairs) or 'allow' (keep them, report only)")
    dropped = {p.train_line for p in found} if leakage == "drop" else set()  # input positions
    train = [pairs[i] for i in train_pos if i not in dropped]
    return train, [pairs[i] for i in eval_pos]


# --------------------------------------------------------------------------------------------
# ``ratune catalog pairs``: the split written into the catalog folder

#: The folder of a catalog that ``ratune catalog pairs`` writes (beside ``apis.jsonl``).
PAIRS_DIR = "pairs"
#: The split files in :data:`PAIRS_DIR`, one pair per line (the fields of :data:`PAIR_FIELDS`).
SPLIT_FILES = {split: f"{split}.jsonl" for split in SPLITS}
#: The pairs folder's manifest (never the catalog's own ``manifest.json``, which the import rewrites).
PAIRS_MANIFEST = "manifest.json"
#: The stage name of ``ratune catalog pairs`` (its manifest's ``command``, its owner marker).
PAIRS_STAGE = "catalog pairs"


def pairs_dir(catalog_dir: str | os.PathLike) -> Path:
    """The pairs folder of a catalog folder (``CATALOG_DIR/pairs``)."""
    return Path(catalog_dir) / PAIRS_DIR


def pair_record(pair: Pair) -> dict:
    """One line of a split file: ``{"instruction", "api_name", "api_call", "explanation", "code"}``
    (``explanation`` and ``code`` null when the pair gave none); :func:`load_pairs` reads it back
    as the same pair (but for its path and line)."""
    return {"instruction": pair.instruction, "api_name": pair.api_name, "api_call": pair.api_call,
            "explanation": pair.explanation, "code": pair.code}


def write_pairs(catalog_dir: str | os.PathLike, pairs_path: str | os.PathLike, *, eval_fraction: float = 0.2,
                seed: int = 0, leakage: str = "error", duplicates: str = "error",
                near_threshold: float | None = NEAR_DUPLICATE_JACCARD) -> dict:
    """Validate a pairs file against a catalog, split it, and write ``CATALOG_DIR/pairs/``.

    Writes ``pairs/train.jsonl`` and ``pairs/eval.jsonl`` (:data:`SPLIT_FILES`, one
    :func:`pair_record` per line, in the input's order) and ``pairs/manifest.json``; the folder is
    built beside itself and swapped in when complete (:class:`ratune.output.StageOutput`),
    so a failed run leaves an earlier split as it was. The catalog's own ``manifest.json`` and
    ``apis.jsonl`` are never written.

    Args:
        catalog_dir: a folder ``ratune catalog import`` wrote.
        pairs_path: the user's pairs file (module docstring).
        eval_fraction, seed, leakage, near_threshold: as :func:`split_pairs`.
        duplicates: as :func:`load_pairs`.
    Returns:
        The manifest written: ``command``, ``kind`` (``"catalog pairs"``), ``catalog`` (``name``,
        ``apis_sha256``: the ``apis.jsonl`` the pairs were checked against), ``source`` (``path``,
        ``sha256``), ``eval_fraction``, ``seed``, ``counts`` (``read``: pairs kept by
        :func:`load_pairs`, ``duplicates_dropped``, ``leaked_train_dropped``, ``train``, ``eval``,
        ``apis``: ``{api_name: {"train", "eval"}}`` for every catalog API with a pair),
        ``duplicates`` (``policy``, ``dropped``: ``[{"line", "first_line"}]``), ``leakage``
        (``policy``, ``near_threshold``, ``pairs``: ``[{"train_line", "eval_line", "kind",
        "similarity"}]``, lines of the source file), ``files`` (sha256 of each split file),
        ``generation`` (a file ``ratune catalog instruct`` wrote: its generation record,
        :func:`generation_record`; None for pairs you wrote),
        ``versions``, ``git_commit``.
    Raises:
        RatuneError: ``catalog_dir`` is not a catalog folder
            (:func:`ratune.catalog.folder.read_catalog_manifest`), its ``pairs`` folder is not a
            ``catalog pairs`` output, a split would be empty (no API with two pairs: nothing to
            evaluate), or the errors of :func:`load_pairs` and :func:`split_pairs` (leakage under
            ``error``, a bad fraction or policy).
        InputError: a bad pairs line or catalog document (file, line, field).
        LockHeld: another process writes the pairs folder.
    """
    catalog = read_catalog_manifest(catalog_dir)
    out = pairs_dir(catalog_dir)
    output = StageOutput(out, PAIRS_STAGE, replace=True)
    output.check(action="write into")  # before reading anything
    documents = load_catalog(catalog_dir)
    dropped: list = []
    pairs = load_pairs(pairs_path, documents, duplicates=duplicates, dropped=dropped)
    leaks: list = []
    train, eval_ = split_pairs(pairs, eval_fraction, seed, leakage=leakage, near_threshold=near_threshold,
                               leaks=leaks)
    if not eval_:
        raise RatuneError(f"{pairs_path}: no eval pairs: every API has a single pair, and an API needs at least 2 "
                          "pairs to be in both splits; add pairs")
    if not train:
        raise RatuneError(f"{pairs_path}: no training pairs are left after the leakage policy {leakage!r}")
    per_api: dict[str, dict[str, int]] = {}
    for split, chosen in (("train", train), ("eval", eval_)):
        for pair in chosen:
            per_api.setdefault(pair.api_name, {"train": 0, "eval": 0})[split] += 1
    leaked_train = {p.train.line for p in leaks} if leakage == "drop" else set()
    manifest = {
        **base_manifest(PAIRS_STAGE), "kind": PAIRS_STAGE,
        "catalog": {"name": catalog["name"], "apis_sha256": sha256_file(Path(catalog_dir) / APIS_FILE)},
        "source": {"path": str(pairs_path), "sha256": sha256_file(pairs_path)},
        "eval_fraction": eval_fraction, "seed": seed,
        "counts": {"read": len(pairs), "duplicates_dropped": len(dropped),
                   "leaked_train_dropped": len(leaked_train), "train": len(train), "eval": len(eval_),
                   "apis": {name: per_api[name] for name in sorted(per_api)}},
        "duplicates": {"policy": duplicates, "dropped": [{"line": line, "first_line": first}
                                                         for line, first in dropped]},
        "leakage": {"policy": leakage, "near_threshold": near_threshold,
                    "pairs": [{"train_line": p.train.line, "eval_line": p.eval.line, "kind": p.kind,
                               "similarity": round(p.similarity, 6)} for p in leaks]},
        "generation": generation_record(pairs_path),
    }
    with output.writing() as tmp:
        files = {}
        for split, chosen in (("train", train), ("eval", eval_)):
            name = SPLIT_FILES[split]
            write_text(tmp / name, "".join(json.dumps(pair_record(p), ensure_ascii=False) + "\n" for p in chosen))
            files[name] = sha256_file(tmp / name)
        manifest["files"] = files
        write_json(tmp / PAIRS_MANIFEST, manifest)
    return manifest


def add_pairs_arguments(parser) -> None:
    """The arguments of ``ratune catalog pairs`` (docs/catalogs.md)."""
    from typing import Annotated

    from pydantic import Field

    parser.add_argument("--catalog", required=True, type=input_dir,
                        help="a catalog folder (`ratune catalog import`); the split goes to CATALOG/pairs/")
    parser.add_argument("--pairs", required=True, type=input_file,
                        help="JSON lines: instruction, api_name, optional api_call, explanation, code")
    parser.add_argument("--eval-fraction", type=bounded(Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)],
                                                        "eval fraction"), default=0.2,
                        help="share of each API's pairs that goes to eval (default 0.2; an API with one pair "
                             "goes to train)")
    parser.add_argument("--seed", type=bounded(Seed, "seed"), default=0, help="seed of the split (default 0)")
    parser.add_argument("--leakage", choices=LEAKAGE_POLICIES, default="error",
                        help="eval instructions (near-)duplicated in train: fail (default), drop those training "
                             "pairs, or keep them; always recorded in pairs/manifest.json")
    parser.add_argument("--duplicates", choices=DUPLICATE_POLICIES, default="error",
                        help="a repeated instruction for the same API: fail (default) or drop the later line")


def cli_pairs(args) -> int:
    """``ratune catalog pairs``: validate, split, write; print the counts."""
    manifest = write_pairs(args.catalog, args.pairs, eval_fraction=args.eval_fraction, seed=args.seed,
                           leakage=args.leakage, duplicates=args.duplicates)
    counts = manifest["counts"]
    in_both = sum(1 for c in counts["apis"].values() if c["train"] and c["eval"])
    print(f"pairs for catalog {manifest['catalog']['name']}: {counts['read']} read, {counts['duplicates_dropped']} "
          f"duplicates dropped; train {counts['train']}, eval {counts['eval']} ({len(counts['apis'])} APIs, "
          f"{in_both} in both splits)")
    leaks = manifest["leakage"]["pairs"]
    if leaks:
        print(f"  leakage: {len(leaks)} pair(s) (policy {args.leakage}, {counts['leaked_train_dropped']} training "
              "pairs dropped)")
    print(f"wrote {pairs_dir(args.catalog)}")
    return 0
