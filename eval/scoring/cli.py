"""``ratune eval score``'s arguments and the APIBench scorer's printed table (the command itself:
:func:`ratune.eval.cli.cli_score`)."""

from __future__ import annotations

import argparse

from ratune.args import add_apibench_argument, input_file
from ratune.sources.apibench import HUBS
from ratune.hubs import hub_argument_type
from ratune.eval.scoring.parse import PINNED_PARSER
from ratune.eval.scoring.scorer import METRICS

#: What ``--metric`` accepts.
METRIC_CHOICES = (*METRICS, "both")


def add_score_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``ratune eval score`` to ``parser`` (see :func:`ratune.eval.cli.cli_score`)."""
    parser.add_argument("--hub", required=True, type=hub_argument_type(), metavar="HUB",
                        help=f"an APIBench hub ({', '.join(HUBS)}), a catalog folder (its strict metric and "
                             "argument score; docs/catalogs.md) or a tool-set folder (its call match)")
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


def outcome_lines(result: dict, metrics) -> list[str]:
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
    lines += outcome_lines(result, metrics)
    parser = ", ".join(f"{k} {v}" for k, v in result["parser"].items())
    lines.append(f"parser: {parser}")
    if result["parser"] != PINNED_PARSER:
        lines.append(f"warning: gorilla numbers are only official with {PINNED_PARSER}")
    return "\n".join(lines)
