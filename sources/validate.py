"""Data checks across rows and files: duplicate examples, train/eval leakage, API calls listed under
several domains (docs/reliability.md#bad-input, with the counts on the released files)."""

from __future__ import annotations

import math
import random
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal, Sequence

from ratune.config import OpenFraction, Seed, check_fields
from ratune.errors import RatuneError
from ratune.options import Option
from ratune.sources.apibench import Example, api_identity

#: Token-set Jaccard at or above which an eval instruction near-duplicates a training one: one
#: word changed (why 0.9: docs/reliability.md#bad-input).
NEAR_DUPLICATE_JACCARD = 0.9

#: Kinds of leakage, strongest first; a (train, eval) pair is reported once, with its strongest kind.
LEAK_KINDS = ("exact", "normalised", "near")

#: What :func:`validate_splits` does with leaked training rows: raise, remove them, or only report.
LEAKAGE_POLICIES = ("error", "drop", "allow")

#: How many pairs an error message lists before "... and N more".
MAX_PAIRS_IN_MESSAGE = 5

#: The rule that decides the domain of an API listed with several domains.
DOMAIN_RULE = ("first entry in file order wins (as the official Gorilla scorer, which returns the first "
               "matching database entry)")

_TOKEN = re.compile(r"\w+")


def normalise(text: str) -> str:
    """Instruction text for duplicate and leakage checks: case-folded, whitespace runs -> one space, stripped."""
    return " ".join(text.casefold().split())


def tokens(text: str) -> frozenset[str]:
    """The set of case-folded word tokens (``\\w+``) of a text; punctuation and order are ignored."""
    return frozenset(_TOKEN.findall(text.casefold()))


def jaccard(a: frozenset | set, b: frozenset | set) -> float:
    """``|a & b| / |a | b|``; 0.0 when both are empty."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0




def find_duplicates(examples: Sequence[Example]) -> list[list[Example]]:
    """Groups (of two or more, in input order) of examples with the same :func:`normalise`'d
    instruction and the same API identity; :func:`dedupe` keeps each group's first."""
    groups: dict[tuple[str, str], list[Example]] = {}
    for ex in examples:
        groups.setdefault((normalise(ex.instruction), api_identity(ex.api)), []).append(ex)
    return [g for g in groups.values() if len(g) > 1]


def dedupe(examples: Sequence[Example]) -> tuple[list[Example], list[Example]]:
    """Remove duplicate examples (see :func:`find_duplicates`), keeping the first of each group.

    Returns:
        ``(kept, removed)``, both in input order.
    """
    seen: set[tuple[str, str]] = set()
    kept, removed = [], []
    for ex in examples:
        key = (normalise(ex.instruction), api_identity(ex.api))
        (removed if key in seen else kept).append(ex)
        seen.add(key)
    return kept, removed




@dataclass(frozen=True)
class LeakPair:
    """An eval instruction found in the training data: 1-based ``train_line`` and ``eval_line`` (its
    question_id), ``kind`` (one of :data:`LEAK_KINDS`) and the token-set Jaccard ``similarity``."""

    train_line: int
    eval_line: int
    kind: str
    similarity: float


def find_leakage(train_examples: Sequence[Example], eval_examples: Sequence[Example], *,
                 near_threshold: float | None = NEAR_DUPLICATE_JACCARD) -> list[LeakPair]:
    """Every (train, eval) pair whose instructions are equal, equal after normalisation, or near.

    Args:
        near_threshold: Jaccard threshold for ``near`` pairs; None checks exact and normalised only.
    Returns:
        Pairs sorted by (eval_line, train_line), each once with its strongest kind.

    Near pairs come from a prefix filter (Chaudhuri et al., 2006; Bayardo et al., 2007: sets with
    Jaccard >= t share a token among their ``n - ceil(t * n) + 1`` rarest), equal to all pairs.
    """
    pairs: dict[tuple[int, int], LeakPair] = {}
    exact: dict[str, list[int]] = defaultdict(list)
    normal: dict[str, list[int]] = defaultdict(list)
    train_tokens = [tokens(ex.instruction) for ex in train_examples]
    for ex in train_examples:
        exact[ex.instruction].append(ex.line)
        normal[normalise(ex.instruction)].append(ex.line)
    eval_tokens = [tokens(ex.instruction) for ex in eval_examples]
    train_tok_by_line = {ex.line: t for ex, t in zip(train_examples, train_tokens)}
    for ex, toks in zip(eval_examples, eval_tokens):
        for line in exact.get(ex.instruction, ()):
            pairs[(line, ex.line)] = LeakPair(line, ex.line, "exact", jaccard(train_tok_by_line[line], toks))
        for line in normal.get(normalise(ex.instruction), ()):
            if (line, ex.line) not in pairs:
                pairs[(line, ex.line)] = LeakPair(line, ex.line, "normalised",
                                                  jaccard(train_tok_by_line[line], toks))
    if near_threshold is not None:
        if not 0.0 < near_threshold <= 1.0:
            raise RatuneError(f"near-duplicate threshold must be in (0, 1], got {near_threshold}")
        for i, j, sim in similar_pairs(train_tokens, eval_tokens, near_threshold):
            key = (train_examples[i].line, eval_examples[j].line)
            if key not in pairs:
                pairs[key] = LeakPair(key[0], key[1], "near", sim)
    return sorted(pairs.values(), key=lambda p: (p.eval_line, p.train_line))


def _prefix(toks: frozenset[str], df: Counter, threshold: float) -> list[str]:
    ordered = sorted(toks, key=lambda t: (df[t], t))  # rarest first; ties by text (deterministic)
    n = len(ordered)
    keep = n - math.ceil(threshold * n - 1e-9) + 1  # rounding can only lengthen the prefix (safe)
    return ordered[:keep]


def similar_pairs(left: Sequence[frozenset], right: Sequence[frozenset], threshold: float):
    """``(i, j, jaccard)`` for every pair with Jaccard >= threshold (empty sets never match)."""
    df = Counter(t for s in (*left, *right) for t in s)
    index: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(left):
        if s:
            for t in _prefix(s, df, threshold):
                index[t].append(i)
    for j, s in enumerate(right):
        if not s:
            continue
        candidates = {i for t in _prefix(s, df, threshold) for i in index.get(t, ())}
        for i in sorted(candidates):
            sim = jaccard(left[i], s)
            if sim >= threshold:
                yield i, j, sim


def format_pairs(pairs: Sequence[LeakPair], train_path, eval_path, limit: int = MAX_PAIRS_IN_MESSAGE) -> str:
    """``train_file:line <-> eval_file:line (kind, jaccard)`` for the first ``limit`` pairs, one per line."""
    lines = [f"  {train_path}:{p.train_line} <-> {eval_path}:{p.eval_line} ({p.kind}, jaccard {p.similarity:.2f})"
             for p in pairs[:limit]]
    if len(pairs) > limit:
        lines.append(f"  ... and {len(pairs) - limit} more")
    return "\n".join(lines)


#: What a leakage error offers besides editing the training file (the data build's policies).
LEAKAGE_REMEDY = ("choose the leakage policy 'drop' (remove the leaked training rows) or 'allow' (keep them, "
                  "report only)")


def check_leakage(train_examples: Sequence[Example], eval_examples: Sequence[Example], *, train_path,
                  eval_path, allow: bool = False, near_threshold: float | None = NEAR_DUPLICATE_JACCARD,
                  remedy: str = LEAKAGE_REMEDY) -> list[LeakPair]:
    """The leakage pairs (:func:`find_leakage`); ``allow``: never raise; ``remedy``: the error's
    way out besides editing the training file.

    Raises:
        RatuneError: when pairs exist and ``allow`` is False (listing the first
            :data:`MAX_PAIRS_IN_MESSAGE`).
    """
    pairs = find_leakage(train_examples, eval_examples, near_threshold=near_threshold)
    if pairs and not allow:
        counts = Counter(p.kind for p in pairs)
        summary = ", ".join(f"{counts[k]} {k}" for k in LEAK_KINDS if counts[k])
        raise RatuneError(
            f"train/eval leakage: {len({p.eval_line for p in pairs})} eval instruction(s) also in the training data, "
            f"{len(pairs)} pair(s) ({summary}; near = token-set Jaccard >= {near_threshold}):\n{format_pairs(pairs, train_path, eval_path)}\n"
            f"Remove them from {train_path}, or {remedy}")
    return pairs


def drop_leaked(train_examples: Sequence[Example], eval_examples: Sequence[Example], *,
                near_threshold: float | None = NEAR_DUPLICATE_JACCARD) -> tuple[list[Example], list[LeakPair]]:
    """``(kept, dropped_pairs)``: the training examples in no leakage pair, and the pairs that caused a drop."""
    pairs = find_leakage(train_examples, eval_examples, near_threshold=near_threshold)
    leaked = {p.train_line for p in pairs}
    return [ex for ex in train_examples if ex.line not in leaked], pairs




@dataclass(frozen=True)
class DomainConflict:
    """One API call listed in the database under more than one domain: its 1-based ``entries`` and
    distinct ``domains`` in file order; ``domain`` and ``decided_by`` are the first, by ``rule``."""

    api_call: str
    identity: str
    entries: tuple[int, ...]
    domains: tuple[str, ...]
    domain: str
    decided_by: int
    rule: str = DOMAIN_RULE


def conflicting_domains(api_database: Sequence[dict], *, lines: Sequence[int] | None = None) -> list[DomainConflict]:
    """One :class:`DomainConflict` per call the database (in file order; ``lines``: when not 1..n)
    lists with different (stripped) ``domain`` values, ordered by first entry."""
    if lines is None:
        lines = range(1, len(api_database) + 1)
    by_call: dict[str, list[tuple[int, dict]]] = {}
    for line, doc in zip(lines, api_database):
        by_call.setdefault(api_identity(doc), []).append((line, doc))
    out = []
    for identity, entries in by_call.items():
        domains = tuple(dict.fromkeys(doc.get("domain", "").strip() for _, doc in entries))
        if len(domains) > 1:
            out.append(DomainConflict(api_call=entries[0][1]["api_call"], identity=identity,
                                      entries=tuple(line for line, _ in entries), domains=domains,
                                      domain=domains[0], decided_by=entries[0][0]))
    return out




@dataclass
class ValidationReport:
    """What the data checks found and did, for the data manifest (:meth:`to_manifest`);
    ``leakage_policy`` is None when there was nothing to compare."""

    duplicate_groups: list[list[int]] = field(default_factory=list)
    duplicates_removed: int = 0
    leakage_policy: str | None = None
    near_threshold: float | None = NEAR_DUPLICATE_JACCARD
    leak_pairs: list[LeakPair] = field(default_factory=list)
    leaked_train_rows_dropped: int = 0
    domain_conflicts: list[DomainConflict] = field(default_factory=list)

    def leak_counts(self) -> dict[str, int]:
        """Pairs per kind (all of :data:`LEAK_KINDS`, zeros included)."""
        counts = Counter(p.kind for p in self.leak_pairs)
        return {k: counts[k] for k in LEAK_KINDS}

    def to_manifest(self) -> dict:
        """A JSON-serialisable summary, deterministic for the same inputs."""
        return {
            "duplicates": {"removed": self.duplicates_removed, "groups": len(self.duplicate_groups),
                           "group_lines": [list(g) for g in self.duplicate_groups]},
            "leakage": {"policy": self.leakage_policy, "near_threshold": self.near_threshold,
                        "pairs": len(self.leak_pairs), "by_kind": self.leak_counts(),
                        "eval_lines": len({p.eval_line for p in self.leak_pairs}),
                        "train_rows_dropped": self.leaked_train_rows_dropped,
                        "pair_list": [asdict(p) for p in self.leak_pairs]},
            "domain_conflicts": {"calls": len(self.domain_conflicts),
                                 "entries": sum(len(c.entries) for c in self.domain_conflicts),
                                 "rule": DOMAIN_RULE,
                                 "list": [{"api_call": c.api_call, "entries": list(c.entries),
                                           "domains": list(c.domains), "domain": c.domain,
                                           "decided_by": c.decided_by} for c in self.domain_conflicts]},
        }

    def split_leakage(self) -> dict:
        """What a ``validation_split`` record drawn after these checks says of the training rows eval
        instructions leak into: ``leakage: drop`` when they were dropped first; ``leakage: allow`` and
        ``leaked_rows_kept`` when some were kept (a finetuned retriever never trains on them, so none
        holds out the same split: :func:`ratune.retrieval.dense.require_held_out`); else nothing."""
        if self.leakage_policy == "drop":
            return {"leakage": "drop"}
        kept = len({p.train_line for p in self.leak_pairs})
        return {"leakage": "allow", "leaked_rows_kept": kept} if self.leakage_policy == "allow" and kept else {}

    def summary(self) -> str:
        """One line for the printed build summary."""
        lc = self.leak_counts()
        return (f"duplicates removed {self.duplicates_removed}; leakage {len(self.leak_pairs)} pair(s) "
                f"(exact {lc['exact']}, normalised {lc['normalised']}, near {lc['near']}; policy "
                f"{self.leakage_policy}, train rows dropped {self.leaked_train_rows_dropped}); "
                f"API calls with conflicting domains {len(self.domain_conflicts)} ({DOMAIN_RULE.split(' (')[0]})")


def validate_splits(splits: dict[str, list[Example]], api_database: Sequence[dict] | None, *, train_path=None,
                    eval_path=None, dedupe_train: bool = True, leakage: str = "error",
                    near_threshold: float | None = NEAR_DUPLICATE_JACCARD
                    ) -> tuple[dict[str, list[Example]], ValidationReport]:
    """Run every check on one hub's ``{"train", "eval"}`` splits (``api_database`` None: not
    checked); return the splits (``train`` deduplicated if ``dedupe_train``, then leakage-handled)
    and the report.

    Raises:
        RatuneError: unknown policy, leakage under policy ``error``, or a train split without an
            eval split to check it against (policies ``error`` and ``drop``).
    """
    if leakage not in LEAKAGE_POLICIES:
        raise RatuneError(f"unknown leakage policy {leakage!r}: expected one of {', '.join(LEAKAGE_POLICIES)}")
    if "train" in splits and "eval" not in splits:
        if leakage != "allow":
            raise RatuneError(f"{eval_path or 'the eval split'}: missing, and the training data's leakage check "
                              "needs the eval questions; restore the eval file, or pass --leakage allow to build "
                              "without the check (recorded in the manifest)")
    out = dict(splits)
    report = ValidationReport(near_threshold=near_threshold)
    if "train" in out:
        report.duplicate_groups = [[ex.line for ex in g] for g in find_duplicates(out["train"])]
        if dedupe_train:
            out["train"], removed = dedupe(out["train"])
            report.duplicates_removed = len(removed)
    if "train" in out and "eval" in out:
        report.leakage_policy = leakage
        if leakage == "drop":
            out["train"], report.leak_pairs = drop_leaked(out["train"], out["eval"], near_threshold=near_threshold)
            report.leaked_train_rows_dropped = len({p.train_line for p in report.leak_pairs})
        else:
            report.leak_pairs = check_leakage(out["train"], out["eval"], train_path=train_path, eval_path=eval_path,
                                              allow=leakage == "allow", near_threshold=near_threshold)
    elif "train" in out:
        report.leakage_policy = "allow (not checked: no eval split)"
    if api_database is not None:
        report.domain_conflicts = conflicting_domains(api_database)
    return out, report


def round_half_up(x: float) -> int:
    return int(x + 0.5 + 1e-9)


def stratified_holdout(keys: Sequence[str], fraction: float, seed: int) -> set[int]:
    """Positions held out per key (an API): of k >= 2, ``round_half_up(k * fraction)`` clipped to
    1 .. k - 1, by a seeded shuffle per key; a key with one position holds out none."""
    by_key: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        by_key.setdefault(key, []).append(position)
    held: set[int] = set()
    for key, positions in by_key.items():
        if len(positions) < 2:
            continue
        order = list(positions)
        random.Random(f"{seed}:{key}").shuffle(order)
        held.update(order[:min(len(positions) - 1, max(1, round_half_up(len(positions) * fraction)))])
    return held


def grouped_holdout(keys: Sequence[str], fraction: float, seed: int) -> set[int]:
    """Positions of whole keys (API groups) held out, in a seeded key order, each one that brings the
    count closer to ``round_half_up(len(keys) * fraction)`` (a key larger than twice what is missing
    is passed over), until it is reached; at least one key stays in."""
    by_key: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        by_key.setdefault(key, []).append(position)
    order = sorted(by_key)
    random.Random(f"{seed}:grouped").shuffle(order)
    target, held = round_half_up(len(keys) * fraction), set()
    for key in order[:-1]:
        if len(held) >= target:
            break
        if abs(len(held) + len(by_key[key]) - target) < target - len(held):
            held.update(by_key[key])
    return held


def example_identities(example: Example) -> set[str]:
    """The API identities an example's rows can show: its gold API and, for a tool set's row, every
    tool it offers."""
    return {api_identity(example.api), *(api_identity(t) for t in example.tools)}


def api_groups(examples: Sequence[Example]) -> list[str]:
    """Each example's group for a grouped split: the connected component of the identities that
    examples show together (:func:`example_identities`), named by its smallest identity. An
    APIBench example shows one API, so its group is its API."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    shown = [sorted(example_identities(ex)) for ex in examples]
    for ids in shown:
        for other in ids[1:]:
            a, b = root(ids[0]), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the smaller identity names the merged group
    return [root(ids[0]) for ids in shown]


@dataclass(frozen=True)
class HoldoutKind:
    """How ``ratune data build --validation-by`` draws a held-out split: ``positions(examples, fraction,
    seed)`` are the examples held out; ``unseen`` says no held-out API is trained on, so the identities
    only held-out examples show are kept out of training rows (their retrieved distractors too)."""

    name: str
    help: str
    positions: Callable[[Sequence[Example], float, int], set[int]]
    unseen: bool


HOLDOUTS = {k.name: k for k in (
    HoldoutKind("api_stratified", "a share of each API's examples: every validation API is also trained on",
                lambda examples, fraction, seed: stratified_holdout([api_identity(ex.api) for ex in examples],
                                                                     fraction, seed), unseen=False),
    HoldoutKind("api_grouped", "whole groups of the APIs and tools examples show together: none is trained on "
                "(unseen APIs)", lambda examples, fraction, seed: grouped_holdout(api_groups(examples), fraction,
                                                                                  seed), unseen=True),
)}
HOLDOUT_KINDS = tuple(HOLDOUTS)


def hold_out(examples: Sequence[Example], fraction: float, *, by: str, seed: int
             ) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)`` of ``examples`` (each in input order), drawn by the :data:`HOLDOUTS` kind ``by``.

    Raises:
        RatuneError: an unknown ``by``, a fraction outside (0, 1), or nothing held out (too few examples or APIs).
    """
    if by not in HOLDOUTS:
        raise RatuneError(f"unknown validation split {by!r}: expected one of {', '.join(HOLDOUTS)}")
    if not 0.0 < fraction < 1.0:
        raise RatuneError(f"validation fraction must be in (0, 1), got {fraction!r}")
    held = HOLDOUTS[by].positions(examples, fraction, seed)
    if not held:
        keys = {api_identity(ex.api) for ex in examples}
        raise RatuneError(f"validation fraction {fraction} ({by}) holds out none of the {len(examples)} training "
                          f"examples of {len(keys)} APIs: raise it, or hold out by another rule")
    return ([ex for i, ex in enumerate(examples) if i not in held], [ex for i, ex in enumerate(examples) if i in held])


@dataclass(frozen=True)
class HoldoutSettings:
    """Which training examples are held out as the validation split (:func:`hold_out`): the data
    build's ``--validation-*`` settings, which the finetuned retriever takes too so that it never
    trains on the questions choices are made on.

    Attributes:
        validation_fraction: share of the training examples held out; None: none.
        validation_by, validation_seed: the :data:`HOLDOUT_KINDS` rule and its seed.
    """

    validation_fraction: OpenFraction | None = None
    validation_by: Literal[HOLDOUT_KINDS] = "api_stratified"
    validation_seed: Seed = 0

    def __post_init__(self):
        check_fields(self)

    def holdout_flags(self) -> list[str]:
        """The flags that give the validation split's settings to a command (none without a fraction)."""
        if self.validation_fraction is None:
            return []
        return [f for o in HOLDOUT_OPTIONS for f in (o.flag, str(getattr(self, o.field)))]

    def draw(self, examples: Sequence[Example]) -> tuple[list[Example], list[Example], dict]:
        """``(train, held_out, record)`` of ``examples`` by these settings (:func:`hold_out`); the
        ``validation_split`` record holds ``fraction``, ``by``, ``seed``, ``n`` and the held-out ``lines``.

        Raises:
            RatuneError: no fraction set, or the errors of :func:`hold_out`.
        """
        if self.validation_fraction is None:
            raise RatuneError("no validation split asked for (validation_fraction is None)")
        train, held = hold_out(examples, self.validation_fraction, by=self.validation_by, seed=self.validation_seed)
        return train, held, {"fraction": self.validation_fraction, "by": self.validation_by,
                             "seed": self.validation_seed, "n": len(held), "lines": [e.line for e in held]}


#: The flags of :class:`HoldoutSettings` (``ratune data build`` and ``ratune retrieval train``).
HOLDOUT_OPTIONS: tuple[Option, ...] = (
    Option("validation_fraction", "--validation-fraction",
           help="hold out this share of the training examples as a validation split, for choices made "
                "without the test questions (default none)"),
    Option("validation_by", "--validation-by",
           help="; ".join(f"{k.name}: {k.help}" for k in HOLDOUTS.values())),
    Option("validation_seed", "--validation-seed", help="the validation split's seed"),
)


def near_duplicate_rate(train_examples: Sequence[Example], held_out: Sequence[Example]) -> float:
    """The share of ``held_out`` examples that :func:`find_leakage` pairs with a training one (0.0 for none)."""
    if not held_out:
        return 0.0
    return len({p.eval_line for p in find_leakage(train_examples, held_out)}) / len(held_out)
