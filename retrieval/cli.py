"""The ``ratune retrieval eval`` and ``ratune retrieval index`` commands (their flags are in ratune/cli.py;
``ratune retrieval train`` is retrieval/finetune.py)."""

from __future__ import annotations

import json
import time

from ratune.sources.apibench import HUBS, input_hashes
from ratune.hubs import resolve_hub
from ratune.errors import RatuneError
from ratune.io import write_json, write_text
from ratune.manifest import package_versions
from ratune.output import StageOutput
from ratune.registry import BM25_RETRIEVERS, RELEASED_BM25, RETRIEVERS
from ratune.retrieval.metrics import evaluate_retriever, retrieval_chart, retrieval_markdown, top1_agreement
from ratune.retrieval.bm25 import BM25Retriever, saved_index_metadata
from ratune.retrieval.retrievers import make_retriever


#: The stage name in a ``retrieval eval --out`` folder's owner marker.
EVAL_STAGE = "retrieval eval"


def cli_eval(args) -> int:
    """``ratune retrieval eval``: top-1, recall@k and NDCG@k of retrievers on a hub's eval questions (``args``
    from its parser, ratune/cli.py); prints the tables (``--json``: one object), and with ``--out`` writes
    ``retrieval_{hub}.{json,md,png}``. Returns 0.

    Raises:
        RatuneError: a finetuned retriever without ``--dense-model`` or for several hubs; ``--bm25-index``
            for a retriever that is not BM25 or for several hubs; ``--out`` a non-empty folder ratune
            did not make (:class:`ratune.output.StageOutput`).
    """
    hubs = list(HUBS) if args.hub == "all" else [args.hub]
    sources = [resolve_hub(h, args.apibench) for h in hubs]
    finetuned = [r.name for r in RETRIEVERS.values() if r.needs_model]
    names = [r.name for r in RETRIEVERS.values() if r.name != "none" and not r.needs_model] \
        if args.retriever == "all" else [args.retriever]
    if args.dense_model and not any(n in finetuned for n in names):  # the folder's own retriever joins the report
        names += finetuned if args.retriever == "all" else [n for n in finetuned if RETRIEVERS[n].kind == "dense"]
    if any(n in finetuned for n in names) and not args.dense_model:
        raise RatuneError(f"--retriever {args.retriever} needs --dense-model DIR (a `ratune retrieval train` output)")
    if any(n in finetuned for n in names) and len(hubs) > 1:
        raise RatuneError("a finetuned retriever (--dense-model) serves the one hub it was trained for: give --hub")
    if args.bm25_index and not any(n in BM25_RETRIEVERS for n in names):
        raise RatuneError(f"--bm25-index is for the BM25 retrievers ({', '.join(BM25_RETRIEVERS)}), "
                          f"not {', '.join(names)}")
    if args.bm25_index and len(hubs) > 1:
        raise RatuneError("a saved BM25 index serves the one hub it was built for: give --hub")
    output = StageOutput(args.out, EVAL_STAGE) if args.out else None
    if output:  # a folder ratune did not make is refused before anything is computed
        output.check()
    index_variant = _index_variant(args.bm25_index)
    reports = {s.name: _hub_report(args, s, names, index_variant) for s in sources}
    hubs = list(reports)  # the hubs' names (a catalog's name, not its path)
    if output:
        with output.writing() as out:
            versions = package_versions()
            for hub, (results, agreement, markdown, inputs) in reports.items():
                write_json(out / f"retrieval_{hub}.json", {"results": results, "agreement": agreement,
                                                           "inputs": inputs, "versions": versions})
                write_text(out / f"retrieval_{hub}.md", markdown)
            chart = out / ("retrieval.png" if len(hubs) > 1 else f"retrieval_{hubs[0]}.png")
            retrieval_chart({hub: r[0] for hub, r in reports.items()}, chart)
            if len(hubs) > 1:
                write_text(out / "retrieval.md", "\n".join(r[2] for r in reports.values()))
    if args.json:
        slim = {hub: [{k: v for k, v in r.items() if k != "misses"} for r in results]
                for hub, (results, agreement, _, _) in reports.items()}
        if len(hubs) == 1:
            results, agreement = slim[hubs[0]], reports[hubs[0]][1]
            print(json.dumps(results[0] if len(results) == 1 else {"results": results, "agreement": agreement},
                             sort_keys=True))
        else:
            print(json.dumps({hub: {"results": slim[hub], "agreement": reports[hub][1]} for hub in hubs},
                             sort_keys=True))
    else:
        print("\n".join(r[2] for r in reports.values()))
    return 0


def _hub_report(args, source, names: list[str], index_variant: str | None) -> tuple[list, list, str, dict]:
    """One hub's (a :class:`ratune.hubs.Hub`) retrieval results, paper-BM25
    agreement, markdown and input hashes. With ``--retriever all`` a catalog leaves out the
    precomputed retrievers (APIBench only); naming one is make_retriever's error."""
    if args.retriever == "all" and not source.has_precomputed:
        names = [n for n in names if RETRIEVERS[n].kind != "precomputed"]
    examples = source.load_examples("eval")
    retrievers = {}
    for n in names:
        # a named BM25 retriever takes the index (refused if built for another variant); with
        # --retriever all, the index serves the variant it was built for
        index = args.bm25_index if n in BM25_RETRIEVERS and (
            args.retriever != "all" or index_variant == n) else None
        retrievers[n] = make_retriever(n, hub=source, bm25_backend=args.bm25_backend, bm25_index=index,
                                       **({"dense_model": args.dense_model} if RETRIEVERS[n].needs_model else {}))
    results = [evaluate_retriever(r, examples) for r in retrievers.values()]
    agreement = [top1_agreement(retrievers[n], retrievers[RELEASED_BM25], examples)
                 for n in BM25_RETRIEVERS if n in retrievers and RELEASED_BM25 in retrievers]
    markdown = retrieval_markdown(results, hub=source.name) + "".join(
        f"\nTop-1 agreement of `{a['a']}` with the paper's BM25 documents: {a['agree']} of {a['n']} "
        f"({100 * a['rate']:.1f} %)." for a in agreement) + ("\n" if agreement else "")
    files = source.input_files(["eval"])
    if source.has_precomputed:
        files += [p for p in (source.questions_file(r.source) for r in RETRIEVERS.values()
                              if r.kind == "precomputed") if p.exists()]
    return results, agreement, markdown, input_hashes(files)


def _index_variant(index_dir) -> str | None:
    """The BM25 variant a saved index folder was built for (None without a folder)."""
    if not index_dir:
        return None
    return saved_index_metadata(index_dir).get("variant")


def cli_index(args) -> int:
    """``ratune retrieval index``: build and save a bm25s index of a hub's API documents (``args`` from its
    parser, ratune/cli.py). Returns 0."""
    source = resolve_hub(args.hub, args.apibench)
    start = time.perf_counter()
    retriever = BM25Retriever(source.load_api_database(), hub=source.name, variant=args.retriever, backend="bm25s")
    out = retriever.save(args.out)
    print(f"indexed {len(retriever.corpus)} {source.name} API documents ({args.retriever}, bm25s) in "
          f"{time.perf_counter() - start:.2f} s; wrote {out}")
    return 0
