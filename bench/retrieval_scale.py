"""BM25 at catalog scale: index time and queries per second of rank_bm25 vs bm25s, side by side.

Usage:
    python bench/retrieval_scale.py [--apibench DIR] [--apis 20000] [--queries 300] [--seed 0] [--json]

Builds a synthetic API catalog of ``--apis`` documents from the real APIBench databases of all
three hubs (ToolBench has 16,464 APIs; internal catalogs more). Document i copies real document
``i mod R`` and varies it: its api_name and api_call get a variant suffix, and its description
gains the first sentence of another real document and one of a handful of deployment phrases, so
no two documents index the same text. Queries are real eval instructions (all hubs, in file
order). For each backend (the same BM25 variant ``bm25``) it prints the index time, the time to
score all queries and queries per second, and checks that both backends return the same top-10
for every query. With --json prints one object:
``{"catalog": {...}, "rank_bm25": {...}, "bm25s": {...}, "speedup": {...}, "top10_identical": n}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from ratune.sources.apibench import HUBS, api_database_path, load_api_database, load_examples, resolve_apibench_dir
from ratune.registry import BM25_BACKENDS
from ratune.retrieval.retrievers import BM25Retriever, Query, rank_scores

#: Phrases appended to descriptions so copies of one real document differ in more than a suffix.
PHRASES = ("Optimised for edge devices.", "Trained on a larger corpus.", "Distilled for low latency.",
           "Supports batch inference.", "Quantized to 8 bits.", "Fine-tuned for a regional dataset.",
           "Exported for server deployment.", "Includes a preprocessing pipeline.")


def synthetic_catalog(real: list[dict], n: int, seed: int = 0) -> list[dict]:
    """``n`` API documents derived from ``real`` (deterministic given ``seed``); see the module doc."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base, other = real[i % len(real)], real[rng.randrange(len(real))]
        doc = dict(base)
        suffix = f"v{i // len(real)}"
        doc["api_name"] = f"{base.get('api_name', 'api')}-{suffix}"
        doc["api_call"] = f"{base.get('api_call', '')}  # {suffix}"
        extra = str(other.get("description", "")).split(". ")[0]
        doc["description"] = f"{base.get('description', '')} {extra}. {rng.choice(PHRASES)}"
        out.append(doc)
    return out


def measure(corpus: list[dict], queries: list[Query], backend: str) -> tuple[dict, list[list[int]]]:
    """Index ``corpus`` and score ``queries`` with one backend; returns (timings, top-10 ids)."""
    start = time.perf_counter()
    retriever = BM25Retriever(corpus, hub="synthetic", variant="bm25", backend=backend)
    index_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = retriever.scores(queries)
    top10 = rank_scores(scores, 10)
    query_s = time.perf_counter() - start
    return {"index_seconds": index_s, "query_seconds": query_s,
            "queries_per_second": len(queries) / query_s if query_s else float("inf")}, top10


def run(apibench_dir, *, apis: int, queries: int, seed: int) -> dict:
    """The whole benchmark; returns the JSON object described in the module doc."""
    apibench_dir = resolve_apibench_dir(apibench_dir)
    real = [d for hub in HUBS for d in load_api_database(api_database_path(apibench_dir, hub))]
    corpus = synthetic_catalog(real, apis, seed)
    instructions = [e.instruction for hub in HUBS for e in load_examples(apibench_dir, hub, "eval")]
    qs = [Query(text=t) for t in instructions[:queries]]
    out = {"catalog": {"apis": len(corpus), "from_real_documents": len(real), "queries": len(qs), "seed": seed}}
    tops = {}
    for backend in BM25_BACKENDS:
        out[backend], tops[backend] = measure(corpus, qs, backend)
    ref, fast = out["rank_bm25"], out["bm25s"]
    out["speedup"] = {"index": ref["index_seconds"] / fast["index_seconds"],
                      "queries": fast["queries_per_second"] / ref["queries_per_second"]}
    out["top10_identical"] = sum(a == b for a, b in zip(tops["rank_bm25"], tops["bm25s"]))
    return out


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status (1 when the backends' top-10 lists differ)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apibench", default=None, help="APIBench folder (default ../shared/apibench)")
    parser.add_argument("--apis", type=int, default=20000, help="synthetic catalog size (default 20000)")
    parser.add_argument("--queries", type=int, default=300, help="eval instructions to score (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    out = run(args.apibench, apis=args.apis, queries=args.queries, seed=args.seed)
    same = out["top10_identical"] == out["catalog"]["queries"]
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0 if same else 1
    c = out["catalog"]
    print(f"synthetic catalog: {c['apis']} API documents from {c['from_real_documents']} real ones; "
          f"{c['queries']} eval instructions as queries")
    print(f"{'backend':<10} {'index s':>9} {'query s':>9} {'queries/s':>10}")
    for backend in BM25_BACKENDS:
        r = out[backend]
        print(f"{backend:<10} {r['index_seconds']:9.2f} {r['query_seconds']:9.2f} {r['queries_per_second']:10.1f}")
    s = out["speedup"]
    print(f"bm25s speed relative to rank_bm25: indexing {s['index']:.2f}x, queries {s['queries']:.1f}x; "
          f"top-10 identical for {out['top10_identical']} of {c['queries']} queries")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
