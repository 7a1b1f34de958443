"""The ``ratune`` command: one sub-command per stage.

    ratune data build       APIBench -> chats per train-time retrieval mode (datasets + manifest)
    ratune data utility     per-example document utility: answer loss without minus with the document
    ratune retrieval eval   retrieval quality (top-1, recall@k, NDCG@k) per retriever
    ratune retrieval index  build and save a BM25 index (bm25s) that refuses another hub or corpus
    ratune retrieval train  finetune the dense retriever on a hub's train pairs (dense_ft)
    ratune plan             per-GPU memory (weights, gradients, optimizer, activations) and ideal hours
    ratune train            supervised finetuning from a YAML config (also: accelerate launch -m ratune.train)
    ratune eval run         generate + score a checkpoint under test-time retrieval settings
    ratune eval score       score a response file (official gorilla metric and strict metric)
    ratune eval bfcl        generate + score a checkpoint on BFCL, offline, by BFCL's own checker
    ratune eval select      choose a checkpoint on a validation learning curve by a declared rule
    ratune sweep            expand a sweep file into cells and run them (local or slurm)
    ratune report           the Table 2 matrix from a sweep folder or eval folders
    ratune export           safetensors + tokenizer + generation config + model card; --push-to-hub
    ratune compare          paired comparison of two response files (McNemar, paired bootstrap)
    ratune demo             the CPU demo: the whole pipeline on TorchHub with SmolLM2-135M
    ratune catalog import   your own API catalog (JSON lines, OpenAPI 3, a Python module) -> a catalog folder
    ratune catalog instruct instructions per API from a local instruction-following model (Gorilla 3.1)
    ratune catalog pairs    your instruction pairs -> the catalog's train/eval split (then --hub CATALOG_DIR)
    ratune tools import     function-calling rows (xLAM, chat, BFCL) -> a tool-set folder (then --hub TOOLS_DIR)

User errors (bad input, bad config, a bad flag value) print one message naming file, line, field or
flag on stderr and exit with status 2, without a traceback (:func:`ratune.boundary.run_guarded` states the
policy).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

from ratune.boundary import run_guarded
from ratune.eval.settings import BFCL_OPTIONS, EVAL_OPTIONS, BfclSettings, EvalSettings
from ratune.options import add_arguments


def _handler(target: str) -> Callable[[argparse.Namespace], int]:
    """The handler ``"module:function"`` of a sub-command, imported only when the command runs (the
    stages import torch and transformers; ``ratune --help`` should not)."""
    module, name = target.split(":")

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    run.__name__ = name
    return run


def _train(args) -> int:
    from ratune.train.sft import main

    argv = ["--config", args.config] + (["--resume-from", args.resume_from] if args.resume_from else []) \
        + (["--on-unfinished", args.on_unfinished] if args.on_unfinished else [])
    return main(argv)


def _report(args) -> int:
    from ratune.errors import RatuneError

    if args.against and not args.bfcl:
        raise RatuneError("--against NAME names a --bfcl model; give --bfcl NAME=DIR too")
    if args.bfcl:
        from ratune.eval.bfcl_report import cli_bfcl_report

        given = [flag for flag, value in (("SWEEP_DIR", args.sweep_dir), ("--eval", args.eval), ("--pair", args.pair),
                                          ("--hub", args.hub), ("--model", args.model)) if value]
        if given or not args.out:
            raise RatuneError("ratune report --bfcl NAME=DIR ... takes --out and --against only"
                              + (f" (not {', '.join(given)})" if given else "; give --out"))
        return cli_bfcl_report(args)
    if args.sweep_dir:
        from ratune.sweep import cli_report_sweep

        if args.eval:
            raise RatuneError("give either SWEEP_DIR or --eval folders, not both")
        ignored = [flag for flag, value in (("--hub", args.hub), ("--model", args.model)) if value is not None]
        if ignored:  # a sweep report takes each cell's hub and model from the cell itself
            raise RatuneError(f"{' and '.join(ignored)}: for --eval folders only; a sweep report takes every "
                              "cell's hub and model from its cell.json (one table per hub)")
        return cli_report_sweep(args.sweep_dir, out=args.out, pair_args=args.pair)
    from ratune.eval.cli import cli_report

    return cli_report(args)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the ``ratune`` command: one ``_add_*`` per stage, in help order."""
    from ratune.args import RatuneArgumentParser

    parser = RatuneArgumentParser(prog="ratune", description="Retriever-aware training (RAT) for API calling.")
    stages = parser.add_subparsers(dest="stage", required=True)
    for add in (_add_data, _add_retrieval, _add_train, _add_eval, _add_report, _add_delegated, _add_demo, _add_tools,
                _add_catalog):
        add(stages)
    return parser


def _hub_ref() -> dict:
    """The type and metavar of every ``--hub``: an APIBench hub, a tool-set or a catalog folder (hubs/)."""
    from ratune.hubs import hub_argument_type

    return {"type": hub_argument_type(), "metavar": "HUB"}


def _mode() -> dict:
    from ratune.args import registered
    from ratune.registry import TRAIN_MODES

    return registered("train-time retrieval mode", TRAIN_MODES)


def _finetuned() -> str:
    from ratune.registry import RETRIEVERS

    return " ".join(r.name for r in RETRIEVERS.values() if r.needs_model)


def _add_data(stages) -> None:
    from ratune.args import add_apibench_argument, bounded, checked, input_dir, input_file, model_ref, output_dir, setting
    from ratune.config import Count, FiniteFloat
    from ratune.data.build import BUILD_OPTIONS, BuildSettings
    from ratune.data.mixture import MIXTURE_OPTIONS, Mixture
    from ratune.hubs import hub_choices_text
    from ratune.models import DEMO_MODEL_ALIAS
    from ratune.registry import DEFAULT_MODES, SPLITS
    from ratune.sources.prompt import CHAT_TEMPLATE_NAMES
    from ratune.sources.validate import LEAKAGE_POLICIES

    hub_ref, mode, finetuned = _hub_ref(), _mode(), _finetuned()
    mixture_spec = checked(Mixture.parse, "mixture", good="rat_mix:none=0.5,oracle=0.5", bad=("x", "m:none=0.5"))
    data = stages.add_parser("data", help="build training chats").add_subparsers(dest="action", required=True)
    b = data.add_parser("build", help="APIBench -> chats per train-time retrieval mode")
    add_apibench_argument(b)
    b.add_argument("--hub", required=True, **hub_ref,
                   help=f"{hub_choices_text()}, with its pairs split (`ratune catalog pairs`)")
    b.add_argument("--out", required=True, type=output_dir, help="output folder")
    b.add_argument("--tokenizer", default=DEMO_MODEL_ALIAS, type=model_ref,
                   help="model folder whose tokenizer measures lengths")
    b.add_argument("--chat-template", choices=CHAT_TEMPLATE_NAMES, default=None,
                   help="chat template for a tokenizer without one (base LLaMA; gorilla_v0 is the paper's format); "
                        "replaces a tokenizer's own; recorded in the manifest, training needs the same "
                        "chat_template (docs/prompts.md)")
    b.add_argument("--modes", nargs="*", default=list(DEFAULT_MODES), **mode,
                   help=f"train-time retrieval modes (default {' '.join(DEFAULT_MODES)}; {finetuned} needs --dense-model; "
                        "`--modes` alone: none, with --mixture)")
    b.add_argument("--mixture", action="append", metavar="NAME:COMPONENT=P,...", type=mixture_spec,
                   help="also build the mode mix-NAME, each example's document drawn from the mixture, e.g. "
                        "rat_mix:none=0.25,oracle=0.25,top1=0.25,distractors=0.25 (repeatable; data/mixture.py)")
    add_arguments(b, Mixture, MIXTURE_OPTIONS)
    add_arguments(b, BuildSettings, BUILD_OPTIONS)
    b.add_argument("--lenient", action="store_true", help="write unparseable rows to rejects.jsonl instead of failing")
    b.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    b.add_argument("--reuse-if-same", action="store_true",
                   help="keep an existing complete build made with the same request (every mode asked for; the "
                        "same settings, tokenizer, mixtures, leakage policy and input files), else replace it as "
                        "--overwrite does (what a sweep passes; with --overwrite too, a same build is still kept)")
    b.add_argument("--leakage", choices=LEAKAGE_POLICIES, default="error",
                   help="eval instructions found in the training data: fail (default), drop those training rows, "
                        "or keep them; always reported in the manifest")
    b.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    b.add_argument("--utility-file", default=None, metavar="FILE", type=input_file,
                   help="utility.jsonl of `ratune data utility`: keep a mixture's oracle/top1 document only "
                        "where its utility exceeds --min-utility")
    b.add_argument("--min-utility", type=bounded(FiniteFloat), default=None,
                   help="threshold in nats per answer token")
    b.set_defaults(func=_handler("ratune.data.build:cli_build"))

    u = data.add_parser("utility", help="document utility: answer loss without minus with the document")
    u.add_argument("--data", required=True, type=input_dir,
                   help="a `ratune data build` folder with mode none and the document modes")
    u.add_argument("--modes", nargs="+", default=["oracle"], **mode,
                   help="document modes to measure (default oracle)")
    u.add_argument("--model", default=DEMO_MODEL_ALIAS, type=model_ref, help="model folder (or the demo alias)")
    u.add_argument("--out", required=True, type=output_dir,
                   help="output folder (utility.jsonl, utility.json, utility.png)")
    u.add_argument("--split", default="train", choices=SPLITS, help="the split to measure (default train)")
    u.add_argument("--max-examples", type=bounded(Count), default=None, help="the first N examples only")
    u.add_argument("--batch-size", type=setting(EvalSettings, "batch_size"), default=8)
    u.add_argument("--threads", type=setting(EvalSettings, "torch_threads"), default=None, help="torch threads")
    u.set_defaults(func=_handler("ratune.data.utility:cli_utility"))


def _add_retrieval(stages) -> None:
    from ratune.args import add_apibench_argument, checked, input_dir, output_dir, registered
    from ratune.hubs import check_hub_ref, hub_choices_text
    from ratune.registry import BM25_BACKENDS, BM25_RETRIEVERS, DEFAULT_BM25_BACKEND, RETRIEVERS

    hub_ref, finetuned = _hub_ref(), _finetuned()
    backend = registered("BM25 backend", BM25_BACKENDS)
    hub_or_all = {"type": checked(lambda text: text == "all" or check_hub_ref(text), "hub", good="all",
                                  bad=("no_such_hub", "folder")), "metavar": "HUB"}
    retrieval = stages.add_parser("retrieval", help="retrieval quality").add_subparsers(dest="action", required=True)
    r = retrieval.add_parser("eval", help="top-1, recall@k, NDCG@k on a hub's eval set")
    add_apibench_argument(r)
    r.add_argument("--hub", required=True, **hub_or_all,
                   help=f"{hub_choices_text()}; or all: the report for the three APIBench hubs (retrieval.md, "
                        "retrieval.png)")
    r.add_argument("--retriever", default="all", **registered("retriever", [n for n in RETRIEVERS if n != "none"], "all"))
    r.add_argument("--dense-model", default=None, metavar="DIR", type=input_dir,
                   help=f"a finetuned retriever folder (`ratune retrieval train`); adds {finetuned} to the report")
    r.add_argument("--bm25-backend", **backend, default=DEFAULT_BM25_BACKEND,
                   help="BM25 implementation (same rankings; bm25s is much faster on large catalogs)")
    r.add_argument("--bm25-index", default=None, metavar="DIR", type=input_dir,
                   help="a saved index (`ratune retrieval index`) for the BM25 retriever it was built for; "
                        "refused when built for another hub, variant or corpus")
    r.add_argument("--out", type=output_dir, help="also write retrieval_{hub}.json, .md and a bar chart (.png) here")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_handler("ratune.retrieval.cli:cli_eval"))
    ri = retrieval.add_parser("index", help="build and save a BM25 index (bm25s) for a hub's API database")
    add_apibench_argument(ri)
    ri.add_argument("--hub", required=True, **hub_ref, help=hub_choices_text())
    ri.add_argument("--retriever", **registered("BM25 variant", BM25_RETRIEVERS), default="bm25", help="BM25 variant")
    ri.add_argument("--out", required=True, type=output_dir, help="index folder (arrays.npz + ratune_bm25_index.json)")
    ri.set_defaults(func=_handler("ratune.retrieval.cli:cli_index"))
    from ratune.retrieval.finetune import add_train_arguments, run_train

    rt = retrieval.add_parser("train", help="finetune the dense retriever on a hub's training split (in-batch negatives)")
    add_train_arguments(rt)
    rt.set_defaults(func=run_train)


def _add_train(stages) -> None:
    from ratune.args import input_file
    from ratune.train.sft import add_resume_arguments

    t = stages.add_parser("train", help="finetune from a YAML config")
    t.add_argument("--config", required=True, type=input_file)
    add_resume_arguments(t)
    t.set_defaults(func=_train)


def _add_eval(stages) -> None:
    from ratune.args import add_apibench_argument, bounded, input_dir, model_ref, output_dir, output_file, registered
    from ratune.config import Count
    from ratune.eval.scoring import add_score_arguments
    from ratune.eval.selection import SELECTION_RULES
    from ratune.hubs import hub_choices_text
    from ratune.models import DEMO_MODEL_ALIAS

    hub_ref = _hub_ref()
    ev = stages.add_parser("eval", help="generate and score").add_subparsers(dest="action", required=True)
    e = ev.add_parser("run", help="generate answers under test settings and score them")
    e.add_argument("--checkpoint", required=True, type=input_dir, help="a ratune train run folder or a model folder")
    e.add_argument("--hub", required=True, **hub_ref, help=f"{hub_choices_text()} (a catalog: strict metric and "
                                                          "argument score, docs/catalog_scoring.md)")
    add_apibench_argument(e)
    e.add_argument("--out", required=True, type=output_dir)
    add_arguments(e, EvalSettings, EVAL_OPTIONS)
    e.add_argument("--all-checkpoints", action="store_true",
                   help="a learning curve: evaluate every Trainer checkpoint of the run folder --checkpoint "
                        "(trainer/checkpoint-STEP) into OUT/stepSTEP/ and write OUT/curve.{json,csv,md,png} "
                        "(eval/curve.py)")
    e.add_argument("--model-name", default=None,
                   help="the model's name in each response line and metrics.json (default: the run folder's name, "
                        "with -stepSTEP for a Trainer checkpoint; with --all-checkpoints NAME-stepSTEP)")
    e.set_defaults(func=_handler("ratune.eval.cli:cli_run"))
    s = ev.add_parser("score", help="score a response file (gorilla and strict metrics)")
    add_score_arguments(s)
    s.set_defaults(func=_handler("ratune.eval.cli:cli_score"))
    sel = ev.add_parser("select", help="choose a checkpoint on a learning curve of the validation questions by a rule")
    sel.add_argument("curve", metavar="CURVE", type=input_dir,
                     help="a curve folder: ratune eval run --all-checkpoints --split validation --out CURVE")
    sel.add_argument("--rule", required=True, **registered("selection rule", tuple(SELECTION_RULES)),
                     help="; ".join(f"{r.name}: {r.summary}" for r in SELECTION_RULES.values()))
    sel.add_argument("--metric", choices=("strict", "gorilla"), default="strict", help="the counts compared")
    sel.add_argument("--out", metavar="FILE", type=output_file, help="also write the choice as JSON to FILE")
    shown = sel.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the choice as one JSON object")
    shown.add_argument("--checkpoint-only", action="store_true", help="print the chosen checkpoint's folder alone")
    sel.set_defaults(func=_handler("ratune.eval.selection:cli_select"))
    from ratune.eval.bfcl import CATEGORIES as BFCL_CATEGORIES

    bf = ev.add_parser("bfcl", help="generate answers to BFCL's questions and score them by BFCL's own checker "
                                    "(docs/function_calling.md)")
    bf.add_argument("--checkpoint", type=model_ref, default=None,
                    help=f"a ratune train run folder, a Trainer checkpoint, a model folder or {DEMO_MODEL_ALIAS}")
    bf.add_argument("--responses", type=input_dir, default=None, metavar="DIR",
                    help="score an earlier output's CATEGORY/responses.jsonl instead of generating (no model loads)")
    bf.add_argument("--categories", nargs="+", default=None,
                    **{**registered("BFCL category", BFCL_CATEGORIES), "metavar": "CATEGORY"},
                    help=f"of {' '.join(BFCL_CATEGORIES)} (default: all; with --responses: those DIR holds)")
    bf.add_argument("--out", required=True, type=output_dir)
    bf.add_argument("--limit", type=bounded(Count), default=None, help="the first N entries of each category")
    bf.add_argument("--unseen-by", type=input_dir, default=None, metavar="TOOLS_DIR",
                    help="leave out the entries a tool set has seen: a tool with the same name (namespace aside) "
                         "and parameter names, or a near-duplicate query (sources/unseen.py); counted per category")
    add_arguments(bf, BfclSettings, BFCL_OPTIONS)
    bf.set_defaults(func=_handler("ratune.eval.bfcl_run:cli_bfcl"))


def _add_report(stages) -> None:
    from ratune.args import checked, input_dir, key_equals_dir, output_dir
    from ratune.sweep.pairs import parse_selector

    hub_ref = _hub_ref()
    selector = checked(parse_selector, "selector", good="train_retriever=oracle", bad=("oracle", ","))
    rp = stages.add_parser("report", help="Table 2 from a sweep folder or from eval folders; a BFCL table from "
                                          "`ratune eval bfcl` outputs")
    rp.add_argument("sweep_dir", nargs="?", default=None, type=input_dir, help="a `ratune sweep` output folder")
    rp.add_argument("--eval", action="append", metavar="TRAIN_RETRIEVER=EVAL_DIR", type=key_equals_dir)
    rp.add_argument("--hub", **hub_ref, help="with --eval, optional check: the hub the cells were evaluated on "
                                            "(their metrics.json record it; an APIBench hub, a catalog or a tool-set folder)")
    rp.add_argument("--bfcl", action="append", metavar="NAME=BFCL_DIR", type=key_equals_dir,
                    help="a `ratune eval bfcl` output and the name its row gets (repeatable; a name given again "
                         "adds a seed to that model): bfcl.{md,csv,json,png} in --out, each model compared with the "
                         "first (or --against), paired by entry id")
    rp.add_argument("--against", action="append", metavar="NAME",
                    help="with --bfcl: compare every other model with this one (repeatable; default: the first)")
    rp.add_argument("--model", help="with --eval: the model's name in the table")
    rp.add_argument("--out", type=output_dir)
    rp.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"), type=selector,
                    help="with SWEEP_DIR: compare the cells selected by A and B (key=value,... e.g. "
                         "train_retriever=oracle,test_retriever=oracle); repeatable; replaces the sweep "
                         "file's compare list")
    rp.set_defaults(func=_report)


def _add_delegated(stages) -> None:
    # Stages whose arguments and entry point live beside their code: (name, help, module, adder, runner).
    delegated = (
        ("compare", "paired comparison of two response files or eval cells", "ratune.eval.compare",
         "add_compare_arguments", "cli_compare"),
        ("sweep", "run (or --dry-run, or --launcher slurm) an ablation sweep", "ratune.sweep",
         "add_sweep_arguments", "cli_sweep"),
        ("plan", "per-GPU memory and ideal time of a training config", "ratune.train.plan",
         "add_plan_arguments", "cli_plan"),
        ("export", "merged safetensors checkpoint + model card; push when asked", "ratune.export.checkpoint",
         "add_export_arguments", "cli_export"),
    )
    for name, help_text, module_name, adder, runner in delegated:
        module = importlib.import_module(module_name)
        sub = stages.add_parser(name, help=help_text)
        getattr(module, adder)(sub)
        sub.set_defaults(func=getattr(module, runner))


def _add_demo(stages) -> None:
    from ratune.args import APIBENCH_DEFAULT, add_apibench_argument, input_file, output_dir

    d = stages.add_parser("demo", help="the CPU demo (TorchHub, SmolLM2-135M)")
    d.add_argument("--config", default=None, type=input_file, help="the demo's sweep file (default configs/demo.yaml)")
    d.add_argument("--out", default=None, type=output_dir, help="output folder (default from the config: runs/demo)")
    add_apibench_argument(d, default_text=f"the config's apibench key, {APIBENCH_DEFAULT}")
    d.add_argument("--rerun-changed", action="store_true",
                   help="delete and rerun arms whose resolved config changed since they ran (as ratune sweep)")
    d.set_defaults(func=_handler("ratune.demo:cli_demo"))


def _add_tools(stages) -> None:
    from ratune.sources.toolset import add_import_arguments as add_tools_import_arguments

    tools = stages.add_parser("tools", help="function-calling rows and their JSON-schema tools as a hub "
                                            "(docs/function_calling.md)").add_subparsers(dest="action", required=True)
    ti = tools.add_parser("import", help="xLAM or chat rows, or BFCL's categories -> a tool-set folder "
                                         "(tools.jsonl, train.jsonl, eval.jsonl)")
    add_tools_import_arguments(ti)
    ti.set_defaults(func=_handler("ratune.sources.toolset:cli_import"))


def _add_catalog(stages) -> None:
    from ratune.catalog.folder import add_import_arguments

    catalog = stages.add_parser("catalog", help="your own API catalog as a hub (docs/catalogs.md)").add_subparsers(
        dest="action", required=True)
    ci = catalog.add_parser("import", help="a JSON-lines file, an OpenAPI 3 document or a Python module -> a "
                                           "catalog folder (apis.jsonl + manifest.json)")
    add_import_arguments(ci)
    ci.set_defaults(func=_handler("ratune.catalog.folder:cli_import"))
    from ratune.catalog.pairs import add_pairs_arguments

    cp = catalog.add_parser("pairs", help="your instruction pairs, validated against a catalog and split into "
                                          "CATALOG/pairs/train.jsonl and eval.jsonl")
    add_pairs_arguments(cp)
    cp.set_defaults(func=_handler("ratune.catalog.pairs:cli_pairs"))
    from ratune.catalog.instruct import add_instruct_arguments, cli_instruct
    from ratune.models import resolve_model_path  # the model alias

    cg = catalog.add_parser("instruct", help="instructions for each catalog API written by a model from seed "
                                             "examples (Gorilla 3.1, self-instruct) -> a pairs file for `catalog pairs`")
    add_instruct_arguments(cg)
    cg.set_defaults(func=lambda args: cli_instruct(args, resolve_model=resolve_model_path))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ratune`` console command; returns the exit status (2 for a bad
    argument, which the parser reports in one line; 0 after ``--help``)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: a bad argument (its one line is printed) or --help
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    return run_guarded(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
