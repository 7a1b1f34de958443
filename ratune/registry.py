"""The names ratune knows, each typed once: retrievers, test-time settings, train-time modes,
experiment settings and BM25 backends; everything else derives its names from here
(docs/pipeline.md#names-one-registry; the BM25 names: docs/retrieval.md). Data only, no stage imports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RetrieverSpec:
    """One retriever name: its ``kind`` (what builds it, retrieval/retrievers.py), a one-line
    ``summary``, whether it ``needs_model`` (a finetuned folder), the released questions file
    ``source`` of a ``precomputed`` one and the ``components`` of a ``fusion``."""

    name: str
    kind: Literal["none", "oracle", "bm25", "dense", "precomputed", "fusion"]
    summary: str
    needs_model: bool = False
    source: str | None = None
    components: tuple[str, ...] = ()

    @property
    def ranks(self) -> bool:
        """Whether it ranks the API database for any query (so gives top-k lists)."""
        return self.kind in ("bm25", "dense", "fusion")

    @property
    def precomputed(self) -> bool:
        """Whether it replays the paper's released documents (APIBench hubs only)."""
        return self.kind == "precomputed"

    @property
    def trains(self) -> bool:
        """Whether a train-time mode of this name exists (released documents cover eval questions only)."""
        return self.kind != "precomputed"


#: Retrievers, in the order reports list them (retrieval/retrievers.py builds each kind).
RETRIEVER_SPECS: tuple[RetrieverSpec, ...] = (
    RetrieverSpec("none", "none", "no document (0-shot)"),
    RetrieverSpec("oracle", "oracle", "the gold API document"),
    RetrieverSpec("bm25", "bm25", "ours: rank-bm25 over each document's JSON, lower-case word tokens"),
    RetrieverSpec("bm25_replica", "bm25", "rank-bm25 set up like the paper's BM25 retriever (str(dict), whitespace "
                  "tokens, no dedup)"),
    RetrieverSpec("dense", "dense", "sentence-transformers bi-encoder (all-MiniLM-L6-v2 offline)"),
    RetrieverSpec("dense_ft", "dense", "our bi-encoder finetuned on the hub's training split "
                  "(`ratune retrieval train`)", needs_model=True),
    RetrieverSpec("hybrid", "fusion", "reciprocal-rank fusion of bm25 and dense", components=("bm25", "dense")),
    RetrieverSpec("hybrid_ft", "fusion", "reciprocal-rank fusion of bm25 and dense_ft", needs_model=True,
                  components=("bm25", "dense_ft")),
    RetrieverSpec("gpt_index", "precomputed", "the paper's GPT-Index documents (released question files)",
                  source="gpt_index"),
    RetrieverSpec("released_bm25", "precomputed", "the paper's BM25 documents (released question files)",
                  source="bm25"),
)
RETRIEVERS: dict[str, RetrieverSpec] = {r.name: r for r in RETRIEVER_SPECS}


@dataclass(frozen=True)
class TestSetting:
    """One test-time retrieval setting (a Table 2 column): its ``retriever``, whether it is a
    ``default`` of ``ratune eval run`` and a ``paper`` column, and the ``released`` Gorilla-7B
    response files' suffix with its documents (or None)."""

    __test__ = False  # not a pytest test class
    name: str
    retriever: str
    default: bool = False
    paper: bool = False
    released: str | None = None


#: Test-time settings, in Table 2 column order.
TEST_SETTING_SPECS: tuple[TestSetting, ...] = (
    TestSetting("0_shot", "none", default=True, paper=True, released="0_shot"),
    TestSetting("bm25", "bm25", default=True),
    TestSetting("dense", "dense", default=True),
    TestSetting("gpt_index", "gpt_index", default=True, paper=True, released="gpt_index"),
    TestSetting("released_bm25", "released_bm25", paper=True, released="bm25"),
    TestSetting("oracle", "oracle", default=True, paper=True, released="oracle"),
    TestSetting("dense_ft", "dense_ft"),
    TestSetting("hybrid", "hybrid"),
    TestSetting("hybrid_ft", "hybrid_ft"),
)
TEST_SETTINGS: dict[str, TestSetting] = {s.name: s for s in TEST_SETTING_SPECS}
#: Every retrieval setting's name, in column order.
TABLE_SETTINGS: tuple[str, ...] = tuple(TEST_SETTINGS)
#: What ``ratune eval run`` runs without ``--settings``.
DEFAULT_SETTINGS: tuple[str, ...] = tuple(s.name for s in TEST_SETTING_SPECS if s.default)
#: The setting without documents (a model trained without them is chosen on it, eval/selection.py).
ZERO_SHOT_SETTING: str = next(s.name for s in TEST_SETTING_SPECS if RETRIEVERS[s.retriever].kind == "none")
#: The settings that replay the paper's documents, which exist for its eval questions only.
PRECOMPUTED_SETTINGS: tuple[str, ...] = tuple(s.name for s in TEST_SETTING_SPECS
                                              if RETRIEVERS[s.retriever].precomputed)
#: What it runs without ``--settings`` on a catalog (which has no precomputed documents).
CATALOG_DEFAULT_SETTINGS: tuple[str, ...] = tuple(s for s in DEFAULT_SETTINGS if not RETRIEVERS[TEST_SETTINGS[s].retriever].precomputed)

#: The released Gorilla-7B models whose responses ship with APIBench (Gorilla, Table 2 rows).
RELEASED_MODELS: tuple[str, ...] = ("FT", "RT")

#: Experiment settings, never Table 2 columns (docs/experiments.md).
CONSTRAINTS_PREFIX = "constraints_"
EXPERIMENT_SETTINGS: tuple[str, ...] = ("swap", "irrelevant", *(CONSTRAINTS_PREFIX + s for s in TABLE_SETTINGS))
#: Every name ``ratune eval run --settings`` accepts.
EVAL_SETTINGS: tuple[str, ...] = TABLE_SETTINGS + EXPERIMENT_SETTINGS


def setting_retriever(setting: str) -> str:
    """The retriever of a retrieval setting or of a ``constraints_{setting}`` experiment.

    Raises:
        KeyError: for ``swap``, ``irrelevant`` or an unknown name.
    """
    base = setting[len(CONSTRAINTS_PREFIX):] if setting.startswith(CONSTRAINTS_PREFIX) else setting
    return TEST_SETTINGS[base].retriever


#: A hub's example splits (APIBench's ``{hub}_{split}.json``; a catalog's ``pairs/{split}.jsonl``).
SPLITS = ("train", "eval")

#: Train-time retrieval modes (a data build's folders); mixtures add ``mix-NAME`` (data/mixture.py).
TRAIN_MODES: tuple[str, ...] = tuple(r.name for r in RETRIEVER_SPECS if r.trains)
#: Modes whose documents are a ranking's top_k (``--force-gold`` applies to them).
RETRIEVED_MODES: tuple[str, ...] = tuple(r.name for r in RETRIEVER_SPECS if r.ranks)
#: What ``ratune data build`` builds without ``--modes`` (the paper's Table 2 rows plus ``dense``).
DEFAULT_MODES: tuple[str, ...] = ("none", "oracle", "bm25", "dense")

#: BM25 implementations, with the same rankings (tests/test_bm25_backends.py).
BM25_BACKENDS: tuple[str, ...] = ("rank_bm25", "bm25s")
#: The backend used unless one is named.
DEFAULT_BM25_BACKEND = BM25_BACKENDS[0]
#: The retriever that replays the paper's BM25 documents.
RELEASED_BM25 = "released_bm25"
#: The retrievers that are BM25 variants.
BM25_RETRIEVERS: tuple[str, ...] = tuple(r.name for r in RETRIEVER_SPECS if r.kind == "bm25")

def unknown_name(kind: str, value: str, known: tuple[str, ...] | list[str]) -> str:
    """The message for a name that is not ``known``.

    >>> unknown_name("train-time retrieval mode", "bm25", ("none", "bm25_replica"))
    "unknown train-time retrieval mode 'bm25': expected one of none, bm25_replica"
    """
    return f"unknown {kind} {value!r}: expected one of {', '.join(known)}"


def check_name(kind: str, value: str, known: tuple[str, ...] | list[str]) -> str:
    """``value`` if it is one of ``known``.

    Raises:
        ValueError: with :func:`unknown_name`'s message.
    """
    if value not in known:
        raise ValueError(unknown_name(kind, value, known))
    return value
