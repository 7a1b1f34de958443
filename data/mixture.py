"""Mixed retrieval training: per example, a document condition (component) drawn from a mixture,
after RAFT (Zhang et al. 2024); components and spec: docs/experiments.md#retrieval-mixtures."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from ratune.args import registered
from ratune.config import Count, Seed, Top1RetrieverName, check_fields
from ratune.sources.apibench import api_identity
from ratune.errors import RatuneError
from ratune.options import Option
from ratune.registry import RETRIEVED_MODES, unknown_name

#: The components a mixture draws from, in the order draws use (new ones go last, keeping old draws).
MIXTURE_COMPONENTS = ("none", "oracle", "top1", "distractors", "irrelevant")

#: Prefix of a mixture's train-time mode (its folder in the data build and its train_retriever).
MIXTURE_PREFIX = "mix-"

#: Retrievers that may supply the ``top1`` component: the ranking ones (ratune/registry.py).
TOP1_RETRIEVERS = RETRIEVED_MODES

_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


@dataclass(frozen=True)
class Mixture:
    """A mixture of document conditions for training.

    Attributes:
        name: ``[a-z0-9_]+``; the built mode is ``mix-{name}``.
        weights: ``{component: probability}`` over MIXTURE_COMPONENTS, summing to 1 (within 1e-6).
        top1_retriever: the ``top1`` component's retriever (one of TOP1_RETRIEVERS).
        distractors: how many other APIs' documents join the gold one in ``distractors``.
    """

    name: str
    weights: dict = field(default_factory=dict)
    top1_retriever: Top1RetrieverName = "bm25"
    distractors: Count = 3
    seed: Seed = 0

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise RatuneError(f"mixture name {self.name!r}: use lower-case letters, digits and _ (e.g. rat_mix)")
        unknown = sorted(set(self.weights) - set(MIXTURE_COMPONENTS))
        if unknown:
            raise RatuneError(f"mixture {self.name}: unknown component(s) {', '.join(unknown)}; "
                              f"expected {', '.join(MIXTURE_COMPONENTS)}")
        if any(not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in self.weights.values()):
            raise RatuneError(f"mixture {self.name}: probabilities must be finite numbers >= 0, got {self.weights}")
        total = sum(self.weights.values())
        if abs(total - 1.0) > 1e-6:
            raise RatuneError(f"mixture {self.name}: probabilities sum to {total:g}, not 1")
        if self.top1_retriever not in TOP1_RETRIEVERS:
            raise RatuneError(f"mixture {self.name}: "
                              + unknown_name("top1 retriever", self.top1_retriever, TOP1_RETRIEVERS))
        check_fields(self, f"mixture {self.name}")  # distractors >= 1, seed in numpy's range

    @property
    def mode(self) -> str:
        """The train-time mode this mixture builds: ``mix-{name}``."""
        return MIXTURE_PREFIX + self.name

    @classmethod
    def parse(cls, spec: str, *, top1_retriever: str = "bm25", distractors: int = 3, seed: int = 0) -> "Mixture":
        """``NAME:none=0.25,oracle=0.5,top1=0.25`` -> Mixture.

        Raises:
            RatuneError: malformed spec (naming the part), or an invalid mixture.
        """
        if ":" not in spec:
            raise RatuneError(f"--mixture {spec!r}: expected NAME:component=probability,... "
                              "(e.g. rat_mix:none=0.25,oracle=0.25,top1=0.25,distractors=0.25)")
        name, body = spec.split(":", 1)
        weights = {}
        for item in filter(None, (s.strip() for s in body.split(","))):
            key, sep, value = item.partition("=")
            try:
                weights[key.strip()] = float(value)
            except ValueError:
                raise RatuneError(f"--mixture {spec!r}: {item!r} is not component=probability") from None
            if not sep:
                raise RatuneError(f"--mixture {spec!r}: {item!r} is not component=probability")
        return cls(name=name.strip(), weights=weights, top1_retriever=top1_retriever, distractors=distractors,
                   seed=seed)

    def metadata(self) -> dict:
        """What the build manifest records about the mixture (before the realised shares)."""
        return {"name": self.name, "mode": self.mode,
                "weights": {c: self.weights.get(c, 0.0) for c in MIXTURE_COMPONENTS},
                "top1_retriever": self.top1_retriever, "distractors": self.distractors, "seed": self.seed,
                "draws": "random.Random(f'{seed}:{split}'), one draw per example in file order"}


#: The options of ``ratune data build`` that set every mixture's draws (ratune/options.py).
MIXTURE_OPTIONS: tuple[Option, ...] = (
    Option("seed", "--mixture-seed", command="always", help="seed of the mixture draws"),
    Option("distractors", "--distractors", command="always",
           help="other APIs' documents beside the gold one in the distractors component"),
    Option("top1_retriever", "--top1-retriever", command="always",
           cli=registered("top1 retriever", RETRIEVED_MODES), help="retriever of the top1 component"),
)


def draw_documents(mixture: Mixture, *, split: str, gold_docs: Sequence[Sequence[dict]],
                   top1_docs: Sequence[Sequence[dict]], database: Sequence[dict]) -> tuple[list[list[dict]], list[str]]:
    """Draw each example's component and documents.

    Args:
        split: the split name; each split has its own random stream.
        gold_docs, top1_docs: each example's oracle documents (its gold API; a tool-set row's own
            tools) and ``top1_retriever`` ranking.
        database: the hub's API documents (the distractor pool, one per API identity).

    Returns:
        ``(docs_per_example, components)``.

    Raises:
        RatuneError: fewer other APIs in the database than ``mixture.distractors``.
    """
    pool: dict[str, dict] = {}
    for doc in database:
        pool.setdefault(api_identity(doc), doc)
    identities = sorted(pool)
    rng = random.Random(f"{mixture.seed}:{split}")
    components = [c for c in MIXTURE_COMPONENTS if mixture.weights.get(c, 0) > 0]
    weights = [mixture.weights[c] for c in components]
    docs_out, drawn = [], []
    for gold, ranked in zip(gold_docs, top1_docs, strict=True):
        component = rng.choices(components, weights)[0]
        if component == "none":
            docs = []
        elif component == "oracle":
            docs = list(gold)
        elif component == "top1":
            docs = list(ranked[:1])
        elif component == "irrelevant":  # another domain's API; any other tool where there are no domains
            domain, gold_ids = gold[0].get("domain"), {api_identity(d) for d in gold}
            unrelated = [i for i in identities
                         if i not in gold_ids and (domain is None or pool[i].get("domain") != domain)]
            if not unrelated:
                raise RatuneError(f"mixture {mixture.name}: no API outside the domain {domain!r} to use as an "
                                  "irrelevant document")
            docs = [pool[rng.choice(unrelated)]]
        else:
            gold_ids = {api_identity(d) for d in gold}
            others = [i for i in identities if i not in gold_ids]
            if len(others) < mixture.distractors:
                raise RatuneError(f"mixture {mixture.name}: {mixture.distractors} distractors asked, but the "
                                  f"database has only {len(others)} other APIs")
            docs = [pool[i] for i in rng.sample(others, mixture.distractors)]
            for doc in gold:  # each at a random place among the others
                docs.insert(rng.randrange(len(docs) + 1), doc)
        docs_out.append(docs)
        drawn.append(component)
    return docs_out, drawn


def realised_shares(components: Sequence[str]) -> dict:
    """``{component: {"n": count, "share": fraction}}`` over MIXTURE_COMPONENTS, plus any other
    component that occurs (``none_low_utility``); share 0 when empty."""
    n = len(components)
    names = [*MIXTURE_COMPONENTS, *sorted(set(components) - set(MIXTURE_COMPONENTS))]
    return {c: {"n": sum(x == c for x in components), "share": (sum(x == c for x in components) / n) if n else 0.0}
            for c in names}


def apply_utility_filter(mixture: Mixture, lines: Sequence[int], docs: list[list[dict]], components: list[str],
                         keep: dict[tuple[int, str], bool]) -> tuple[list[list[dict]], list[str], dict]:
    """Drop an ``oracle`` or ``top1`` document whose measured utility ``keep`` refuses (keyed
    ``(line, mode)``; component ``none_low_utility``); others are left as drawn.

    Returns:
        ``(docs, components, {"filtered": n, "unmeasured": n})``.
    """
    stats = {"filtered": 0, "unmeasured": 0}
    docs, components = list(docs), list(components)
    for i, (line, component) in enumerate(zip(lines, components)):
        if component not in ("oracle", "top1"):
            continue
        key = (line, "oracle" if component == "oracle" else mixture.top1_retriever)
        if key not in keep:
            stats["unmeasured"] += 1
        elif not keep[key]:
            docs[i], components[i] = [], "none_low_utility"
            stats["filtered"] += 1
    return docs, components, stats
