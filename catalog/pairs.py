"""Instruction pairs for a catalog: the pairs file checked against the catalog, the seeded
API-stratified train/eval split, and ``ratune catalog pairs`` (docs/catalogs.md, "Step 2";
docs/catalog_scoring.md, "User-brought pairs").
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
    """What ``ratune catalog pairs`` records of a ``catalog instruct`` sidecar of ``pairs_path``
    (its settings and counts, the sidecar's hash, ``pairs_unchanged``), or None without one;
    InputError for a sidecar that is not a JSON object."""
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
    """One instruction pair; ``api_call`` is the gold call (the line's, else the document's),
    ``line`` is 1-based in ``path``."""

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


def _check_fields(path: str, number: int, obj: dict) -> None:
    for field in obj:
        if field not in PAIR_FIELDS:
            if field in ("domain", "api_provider", "provider"):
                reason = "comes from the catalog document and cannot be set per pair"
            else:
                close = difflib.get_close_matches(field, PAIR_FIELDS, n=1, cutoff=0.6)
                reason = "unknown field" + (f"; did you mean {close[0]!r}?" if close else
                                            f" (expected {', '.join(PAIR_FIELDS)})")
            raise InputError(path, number, field, reason)


def _required_string(path: str, number: int, obj: dict, field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str):
        raise InputError(path, number, field,
                         "missing" if value is None else f"expected a string, got {type(value).__name__}")
    return value


def _gold_call(path: str, number: int, obj: dict, api_name: str, index: CatalogIndex) -> str:
    """The line's ``api_call``, checked to identify ``api_name``, else the document's."""
    api_call = _optional_string(path, number, obj, "api_call")
    if api_call is None:
        return index.documents[api_name]["api_call"]
    try:
        call = parse_call(api_call)
    except ValueError as exc:
        raise InputError(path, number, "api_call", f"{api_call!r}: {exc}") from None
    named = index.identify(call)
    if api_name not in named:
        what = (f"names {', '.join(repr(n) for n in named)} instead" if named
                else "names no catalog API")
        raise InputError(path, number, "api_call",
                         f"{api_call!r} does not identify {api_name!r}: it {what} "
                         f"(the catalog's call for it is {index.documents[api_name]['api_call']!r})")
    return api_call.strip()


def _read_pair(path: str, number: int, obj: dict, index: CatalogIndex) -> Pair:
    """One line of a pairs file as a :class:`Pair`; InputError naming the field at fault."""
    _check_fields(path, number, obj)
    instruction = _required_string(path, number, obj, "instruction").strip()
    if not instruction:
        raise InputError(path, number, "instruction", "empty")
    api_name = _required_string(path, number, obj, "api_name")
    if api_name not in index.documents:
        raise InputError(path, number, "api_name", f"unknown API {api_name!r}{_suggest(api_name, index.api_names)}")
    api_call = _gold_call(path, number, obj, api_name, index)
    explanation = _optional_string(path, number, obj, "explanation")
    code = _optional_string(path, number, obj, "code")
    return Pair(instruction, api_name, api_call, explanation, code, path, number)


def load_pairs(path: str | os.PathLike, documents: Sequence[dict], *, duplicates: str = "error",
               dropped: list | None = None) -> list[Pair]:
    """The pairs of a pairs file checked against a catalog's documents, in file order.

    ``duplicates`` (:data:`DUPLICATE_POLICIES`) decides a repeated instruction for the same API;
    ``dropped`` receives ``(line, first_line)`` of each line dropped under ``"drop"``.

    Raises:
        RatuneError: no such file, an unknown policy, a catalog :class:`CatalogIndex` refuses.
        InputError: naming file, line and field: a bad line, field, instruction, api_name (with
            the closest names) or api_call, a repeated instruction, a file without pairs.
    """
    if duplicates not in DUPLICATE_POLICIES:
        raise RatuneError(f"unknown duplicates policy {duplicates!r}: expected one of {', '.join(DUPLICATE_POLICIES)}")
    path = Path(path)
    if not path.is_file():
        raise RatuneError(f"{path}: pairs file not found")
    where = str(path)
    index = CatalogIndex(documents)
    pairs: list[Pair] = []
    seen: dict[str, tuple[int, str]] = {}
    for number, obj in iter_jsonl(path):
        pair = _read_pair(where, number, obj, index)
        key = normalise(pair.instruction)
        if key in seen:
            first_line, first_api = seen[key]
            if first_api != pair.api_name:
                raise InputError(where, number, "instruction",
                                 f"same instruction as line {first_line} (after normalisation) but for "
                                 f"{pair.api_name!r}, not {first_api!r}: conflicting labels")
            if duplicates == "error":
                raise InputError(where, number, "instruction",
                                 f"duplicate of line {first_line} (same API, same instruction after "
                                 "normalisation); remove it, or load with duplicates='drop'")
            if dropped is not None:
                dropped.append((number, first_line))
            continue
        seen[key] = (number, pair.api_name)
        pairs.append(pair)
    if not pairs:
        raise InputError(where, None, None, "no pairs (the file is empty)")
    return pairs


@dataclass(frozen=True)
class _Row:
    """What :func:`ratune.sources.validate.find_leakage` reads; ``line`` is the input position."""

    instruction: str
    line: int


@dataclass(frozen=True)
class PairLeak:
    """An eval pair whose instruction is also in training: ``kind`` of LEAK_KINDS, Jaccard ``similarity``."""

    train: Pair
    eval: Pair
    kind: str
    similarity: float


def split_pairs(pairs: Sequence[Pair], eval_fraction: float, seed: int, *, leakage: str = "error",
                near_threshold: float | None = NEAR_DUPLICATE_JACCARD,
                leaks: list | None = None) -> tuple[list[Pair], list[Pair]]:
    """API-stratified, seeded ``(train, eval)`` split with the leakage check, each in input order
    (docs/catalog_scoring.md, "User-brought pairs").

    ``eval_fraction`` in (0, 1) of each API's pairs go to eval (a single pair stays in train);
    ``leakage`` (LEAKAGE_POLICIES) raises on, drops or keeps leaked training pairs, each reported
    in ``leaks``; ``near_threshold`` is the near-duplicate Jaccard (None: exact and normalised only).

    Raises:
        RatuneError: a bad fraction or policy, or leakage under ``error`` (naming both lines).
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


#: The folder of a catalog that ``ratune catalog pairs`` writes (beside ``apis.jsonl``).
PAIRS_DIR = "pairs"
#: The split files in :data:`PAIRS_DIR`, one :func:`pair_record` per line.
SPLIT_FILES = {split: f"{split}.jsonl" for split in SPLITS}
#: The pairs folder's manifest (never the catalog's own ``manifest.json``, which the import rewrites).
PAIRS_MANIFEST = "manifest.json"
#: The stage name of ``ratune catalog pairs`` (its manifest's ``command``, its owner marker).
PAIRS_STAGE = "catalog pairs"


def pairs_dir(catalog_dir: str | os.PathLike) -> Path:
    """The pairs folder of a catalog folder (``CATALOG_DIR/pairs``)."""
    return Path(catalog_dir) / PAIRS_DIR


def pair_record(pair: Pair) -> dict:
    """One line of a split file, which :func:`load_pairs` reads back as the same pair."""
    return {"instruction": pair.instruction, "api_name": pair.api_name, "api_call": pair.api_call,
            "explanation": pair.explanation, "code": pair.code}


def _api_counts(train: Sequence[Pair], eval_: Sequence[Pair]) -> dict[str, dict[str, int]]:
    """``{api_name: {"train", "eval"}}`` of the APIs with a pair, in name order."""
    per_api: dict[str, dict[str, int]] = {}
    for split, chosen in (("train", train), ("eval", eval_)):
        for pair in chosen:
            per_api.setdefault(pair.api_name, {"train": 0, "eval": 0})[split] += 1
    return {name: per_api[name] for name in sorted(per_api)}


def _write_splits(folder: Path, train: Sequence[Pair], eval_: Sequence[Pair]) -> dict[str, str]:
    """Write the split files into ``folder``; ``{file name: sha256}``."""
    files = {}
    for split, chosen in (("train", train), ("eval", eval_)):
        name = SPLIT_FILES[split]
        write_text(folder / name, "".join(json.dumps(pair_record(p), ensure_ascii=False) + "\n" for p in chosen))
        files[name] = sha256_file(folder / name)
    return files


def write_pairs(catalog_dir: str | os.PathLike, pairs_path: str | os.PathLike, *, eval_fraction: float = 0.2,
                seed: int = 0, leakage: str = "error", duplicates: str = "error",
                near_threshold: float | None = NEAR_DUPLICATE_JACCARD) -> dict:
    """Check a pairs file against a catalog, split it (:func:`split_pairs`) and write
    ``CATALOG_DIR/pairs/``, swapped in when complete; returns the manifest written
    (docs/catalogs.md, "Step 2").

    Raises:
        RatuneError: not a catalog folder, a ``pairs`` folder ratune did not write, an empty
            split, or the errors of :func:`load_pairs` and :func:`split_pairs`.
        InputError: a bad pairs line or catalog document.
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
    leaked_train = {p.train.line for p in leaks} if leakage == "drop" else set()
    manifest = {
        **base_manifest(PAIRS_STAGE), "kind": PAIRS_STAGE,
        "catalog": {"name": catalog["name"], "apis_sha256": sha256_file(Path(catalog_dir) / APIS_FILE)},
        "source": {"path": str(pairs_path), "sha256": sha256_file(pairs_path)},
        "eval_fraction": eval_fraction, "seed": seed,
        "counts": {"read": len(pairs), "duplicates_dropped": len(dropped),
                   "leaked_train_dropped": len(leaked_train), "train": len(train), "eval": len(eval_),
                   "apis": _api_counts(train, eval_)},
        "duplicates": {"policy": duplicates, "dropped": [{"line": line, "first_line": first}
                                                         for line, first in dropped]},
        "leakage": {"policy": leakage, "near_threshold": near_threshold,
                    "pairs": [{"train_line": p.train.line, "eval_line": p.eval.line, "kind": p.kind,
                               "similarity": round(p.similarity, 6)} for p in leaks]},
        "generation": generation_record(pairs_path),
    }
    with output.writing() as tmp:
        manifest["files"] = _write_splits(tmp, train, eval_)
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
