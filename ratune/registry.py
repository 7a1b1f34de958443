"""The names ratune knows, each typed once: retrievers, test-time settings, train-time modes,
experiment settings and BM25 backends.

Every other place (CLI choices, the sweep schema, ``TrainConfig``, the data builder,
the eval stage, report column and row order, docs tables) derives its names from here, so adding
a retriever or a test-time setting is one entry below plus its implementation
(:func:`ratune.retrieval.retrievers.make_retriever` builds a retriever from its :class:`RetrieverSpec`).

This module is data only (no imports of the stages), so every stage may import it without a cycle.

Three BM25 names, told apart:

* ``bm25``: ours (JSON of each document, lower-case word tokens, deduplicated corpus);
* ``bm25_replica``: our rank-bm25 set up to replicate the paper's BM25 retriever (Python
  ``str(dict)`` of each document, whitespace tokens, every database line kept); its top-1 agrees
  with the paper's released documents on 167 of 186 TorchHub questions (docs/retrieval.md);
* ``released_bm25``: the paper's own BM25 documents, replayed from the released
  ``questions_{hub}_bm25.jsonl`` (eval questions only), like ``gpt_index`` replays
  ``questions_{hub}_gpt_index.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RetrieverSpec:
    """One retriever name.

    Attributes:
        name: the name users type (CLI, configs, sweep files) and manifests record.
        kind: which implementation builds it: ``none``, ``oracle``, ``bm25`` (a BM25 variant of
            retrieval/bm25.py BM25_VARIANTS, keyed by ``name``), ``dense``
            (sentence-transformers), ``precomputed`` (the paper's released documents, read from
            ``questions_{hub}_{source}.jsonl``) or ``fusion`` (reciprocal-rank fusion of
            ``components``, retrieval/fusion.py).
        summary: one line for help texts and docs.
        needs_model: needs a finetuned retriever folder (``dense_model``): left out of
            ``ratune retrieval eval --retriever all`` unless that folder is given.
        source: for ``precomputed``, the released question file's setting (``bm25`` or
            ``gpt_index``).
        components: for ``fusion``, the retrievers whose rankings are fused.
    """

    name: str
    kind: Literal["none", "oracle", "bm25", "dense", "precomputed", "fusion"]
    summary: str
    needs_model: bool = False
    source: str | None = None
    components: tuple[str, ...] = ()

    @property
    def ranks(self) -> bool:
        """Whether it ranks the API database for any query (so it can retrieve for training
        examples and give top-k lists): not none, oracle or the replayed released documents."""
        return self.kind in ("bm25", "dense", "fusion")

    @property
    def precomputed(self) -> bool:
        """Whether it replays the paper's precomputed documents (the released question files of
        the APIBench hubs; a catalog has none)."""
        return self.kind == "precomputed"

    @property
    def trains(self) -> bool:
        """Whether a train-time mode of this name exists (released documents exist for eval
        questions only)."""
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
    """One test-time retrieval setting (a Table 2 column).

    Attributes:
        name: the setting's name (an eval cell's folder, a response file's suffix).
        retriever: the retriever that supplies its documents (a key of RETRIEVERS).
        default: run by ``ratune eval run`` when no ``--settings`` are given (the paper's Table 2
            columns plus our ``dense``).
        paper: the paper's own column (Gorilla, Table 2): 0-shot, BM25, GPT-Index, Oracle.
        released: the setting suffix of the released Gorilla-7B response files made with this
            setting's documents (``responses/response_{hub}_Gorilla_{FT,RT}_{released}.jsonl``),
            the counterpart a cell on all eval questions is compared with; None when there is none.
    """

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
#: What it runs without ``--settings`` on a catalog: the defaults whose retriever computes its
#: documents (a catalog has no precomputed ones: gpt_index and released_bm25 are APIBench's).
CATALOG_DEFAULT_SETTINGS: tuple[str, ...] = tuple(s for s in DEFAULT_SETTINGS if not RETRIEVERS[TEST_SETTINGS[s].retriever].precomputed)

#: The released Gorilla-7B models whose responses ship with APIBench (``responses/``): ``FT``
#: finetuned without retrieval, ``RT`` retriever-aware (Gorilla, Table 2 rows).
RELEASED_MODELS: tuple[str, ...] = ("FT", "RT")

#: Experiment settings, never Table 2 columns (docs/experiments.md): ``swap`` (another API's
#: document of the same domain) and ``irrelevant`` (a document of another domain), whose
#: retrievers are in retrieval/perturbed.py (scored by eval/swap.py and eval/abstain.py), and
#: ``constraints_{setting}`` (the constrained TorchHub questions under a retrieval setting,
#: eval/constraints.py).
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


#: A hub's example splits: training examples and the eval questions (APIBench's
#: ``{hub}_{split}.json``, sources/apibench.py examples_path; a catalog's ``pairs/{split}.jsonl``,
#: catalog/pairs.py SPLIT_FILES).
SPLITS = ("train", "eval")

#: Train-time retrieval modes (a data build's folders): every retriever that can supply a
#: training example's document, in RETRIEVERS order; mixtures add ``mix-NAME`` (data/mixture.py).
TRAIN_MODES: tuple[str, ...] = tuple(r.name for r in RETRIEVER_SPECS if r.trains)
#: Modes whose documents are a ranking's top_k (``--force-gold`` applies to them; a mixture's
#: ``top1`` component draws from one of them).
RETRIEVED_MODES: tuple[str, ...] = tuple(r.name for r in RETRIEVER_SPECS if r.ranks)
#: What ``ratune data build`` builds without ``--modes`` (the paper's Table 2 rows plus ``dense``).
DEFAULT_MODES: tuple[str, ...] = ("none", "oracle", "bm25", "dense")

#: BM25 implementations: ``rank_bm25`` (the reference, one query at a time in Python) and
#: ``bm25s`` (sparse precomputed scores, batched queries); the same rankings
#: (tests/test_bm25_backends.py).
BM25_BACKENDS: tuple[str, ...] = ("rank_bm25", "bm25s")
#: The backend used unless one is named.
DEFAULT_BM25_BACKEND = BM25_BACKENDS[0]
#: The retriever that replays the paper's BM25 documents (their top-1 agreement with our BM25
#: variants is reported by ``ratune retrieval eval``).
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
        ValueError: with :func:`unknown_name`'s message (callers turn it into their error type:
            pydantic names the field, argparse the flag).
    """
    if value not in known:
        raise ValueError(unknown_name(kind, value, known))
    return value
