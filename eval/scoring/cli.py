"""``ratune eval score``: score one response file and print the counts."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ratune.args import add_apibench_argument, input_file
from ratune.data.apibench import HUBS
from ratune.data.hubs import hub_argument_type, resolve_hub
from ratune.errors import InputError, RatuneError
from ratune.eval.catalog_scorer import GORILLA_APIBENCH_ONLY, CatalogEvalScorer
from ratune.eval.scoring.parse import PINNED_PARSER
from ratune.eval.scoring.responses import check_hub_matches, check_question_ids, load_responses
from ratune.eval.scoring.scorer import METRICS, Scorer

#: What ``--metric`` accepts.
METRIC_CHOICES = (*METRICS, "both")


def add_score_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``ratune eval score`` to ``parser`` (see :func:`cli_score`)."""
    parser.add_argument("--hub", required=True, type=hub_argument_type(), metavar="HUB",
                        help=f"an APIBench hub ({', '.join(HUBS)}) or a catalog folder (its strict metric and "
                             "argument score; docs/catalogs.md)")
    parser.add_argument("--responses", required=True, type=input_file,
                        help="response JSONL file (question_id, text per line)")
    add_apibench_argument(parser)
    parser.add_argument("--metric", choices=METRIC_CHOICES, default="both",
                        help="which metric to print (default both)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-hub-check", dest="no_hub_check", action="store_true",
                        help="score even if the responses look like another hub's")
    return parser


def summary(result: dict, metric: str = "both") -> dict:
    """The score result without ``per_question`` and without the metric not asked for."""
    out = {k: v for k, v in result.items() if k != "per_question"}
    if metric in METRICS:
        out.pop("strict" if metric == "gorilla" else "gorilla")
    return out


def _outcome_lines(result: dict, metrics) -> list[str]:
    """The header and one line per metric: count and percentage of each outcome."""
    lines = [f"{'metric':<8} {'correct':>16} {'hallucination':>16} {'error':>16}"]
    for m in metrics:
        block = result[m]
        cells = [f"{block[o + '_n']:>5} ({100 * block[k]:6.2f}%)"
                 for o, k in (("correct", "accuracy"), ("hallucination", "hallucination"), ("error", "error"))]
        lines.append(f"{m:<8} " + " ".join(f"{c:>16}" for c in cells))
    return lines


def format_table(result: dict, metric: str = "both", source: str = "") -> str:
    """A readable table of counts and percentages with the parser versions."""
    metrics = list(METRICS) if metric == "both" else [metric]
    lines = [f"hub {result['hub']}, {result['n']} responses" + (f" ({source})" if source else "")]
    lines += _outcome_lines(result, metrics)
    parser = ", ".join(f"{k} {v}" for k, v in result["parser"].items())
    lines.append(f"parser: {parser}")
    if result["parser"] != PINNED_PARSER:
        lines.append(f"warning: gorilla numbers are only official with {PINNED_PARSER}")
    return "\n".join(lines)


def cli_score(args) -> int:
    """``ratune eval score``: score one response file and print the result.

    ``args`` has ``hub``, ``responses``, ``apibench`` (None: default folder), ``metric``
    (gorilla|strict|both, default both), ``json`` (bool) and optionally ``no_hub_check``.
    With ``json`` prints one JSON object (:func:`summary` of :meth:`Scorer.score`), else a table.

    Returns:
        0.

    Raises:
        RatuneError / InputError: unknown hub, missing files, malformed response lines, a file
            for another hub, question ids out of range.
    """
    metric = getattr(args, "metric", None) or "both"
    if metric not in METRIC_CHOICES:
        raise RatuneError(f"unknown metric {metric!r}: expected gorilla, strict or both")
    if args.hub not in HUBS:
        return _cli_score_catalog(args, metric)
    scorer = Scorer.from_apibench(args.hub, getattr(args, "apibench", None))
    responses = load_responses(args.responses)
    if not getattr(args, "no_hub_check", False):
        check_hub_matches(scorer.hub, responses, scorer, path=args.responses)
    check_question_ids(responses, scorer.n_questions, path=args.responses)
    result = scorer.score(responses)
    if getattr(args, "json", False):
        print(json.dumps(summary(result, metric), sort_keys=True))
    else:
        print(format_table(result, metric, source=os.fspath(args.responses)))
    return 0


def _cli_score_catalog(args, metric: str) -> int:
    """:func:`cli_score` on a catalog folder: its strict metric and argument score
    (:class:`ratune.eval.catalog_scorer.CatalogEvalScorer`); question_ids are lines of the
    catalog's ``pairs/eval.jsonl``.

    Raises:
        RatuneError: ``--metric gorilla`` (APIBench only); a question_id that is not an eval
            line, naming the file and line; as :func:`load_responses`.
    """
    if metric == "gorilla":
        raise RatuneError(f"--metric gorilla: {GORILLA_APIBENCH_ONLY}; use --metric strict")
    scorer = CatalogEvalScorer.from_source(resolve_hub(args.hub))
    responses = load_responses(args.responses)
    for r in responses:
        if not scorer.has_question(r["question_id"]):
            raise InputError(os.fspath(args.responses), r["line"], "question_id",
                             f"question_id {r['question_id']} is not a line of catalog {scorer.hub}'s eval pairs "
                             f"(1..{scorer.n_questions})")
    result = scorer.score(responses)
    if getattr(args, "json", False):
        print(json.dumps({k: v for k, v in result.items() if k != "per_question"}, sort_keys=True))
        return 0
    n, arguments = result["n"], result["arguments"]
    lines = [f"catalog {result['hub']}, {n} responses ({os.fspath(args.responses)})",
             *_outcome_lines(result, ["strict"]),
             f"arguments: required present {arguments['required_present_n']} ({100 * arguments['required_present']:.2f}%), "
             f"values equal {arguments['values_equal_n']} ({100 * arguments['values_equal']:.2f}%) of {n}",
             "(no gorilla metric: it is APIBench's)"]
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:  # pragma: no cover - convenience entry point
    """``python -m ratune.eval.scoring --hub ... --responses ...`` (same as cli_score)."""
    parser = add_score_arguments(argparse.ArgumentParser(prog="ratune eval score"))
    args = parser.parse_args(argv)
    try:
        return cli_score(args)
    except RatuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
