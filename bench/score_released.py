"""Score all 24 released Gorilla response files with both metrics and time it.

Usage:
    python bench/score_released.py [--apibench DIR] [--json]

Prints, per file, the gorilla and strict counts (correct / hallucination / error), the seconds
spent and responses per second, then the totals (the one-off database parsing included). With
--json prints one JSON object instead. The official scripts take about 33 s for all 24 files;
the counts must equal theirs (docs/official_semantics.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ratune.sources.apibench import HUBS, released_responses_path, resolve_apibench_dir
from ratune.errors import RatuneError
from ratune.eval.scoring import Scorer, load_responses, parser_versions
from ratune.registry import RELEASED_MODELS as MODES
from ratune.registry import TEST_SETTING_SPECS

#: The released files' setting suffixes, in Table 2 column order.
SETTINGS = tuple(s.released for s in TEST_SETTING_SPECS if s.released)


def run(apibench_dir) -> dict:
    """Score every released file; returns ``{"files": [...], "total": {...}, "parser": {...}}``."""
    apibench_dir = resolve_apibench_dir(apibench_dir)
    files, start_all, total_n = [], time.perf_counter(), 0
    for hub in HUBS:
        start = time.perf_counter()
        scorer = Scorer.from_apibench(hub, apibench_dir)
        build_s = time.perf_counter() - start
        for mode in MODES:
            for setting in SETTINGS:
                path = released_responses_path(apibench_dir, hub, mode, setting)
                start = time.perf_counter()
                responses = load_responses(path, scorer.n_questions)
                result = scorer.score(responses)
                seconds = time.perf_counter() - start
                total_n += result["n"]
                files.append({
                    "hub": hub, "mode": mode, "setting": setting, "n": result["n"],
                    "gorilla": {k: result["gorilla"][k] for k in ("correct_n", "hallucination_n", "error_n",
                                                                 "accuracy", "hallucination", "error")},
                    "strict": {k: result["strict"][k] for k in ("correct_n", "hallucination_n", "error_n",
                                                               "accuracy", "hallucination", "error")},
                    "seconds": round(seconds, 4), "database_seconds": round(build_s, 4),
                    "responses_per_second": round(result["n"] / seconds, 1) if seconds else None,
                })
                build_s = 0.0
    seconds = time.perf_counter() - start_all
    return {"files": files, "total": {"files": len(files), "responses": total_n,
                                      "seconds": round(seconds, 3),
                                      "responses_per_second": round(total_n / seconds, 1)},
            "parser": parser_versions()}


def _counts(block: dict) -> str:
    return f"{block['correct_n']}/{block['hallucination_n']}/{block['error_n']}"


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apibench", default=None, help="APIBench folder (default ../shared/apibench)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        out = run(args.apibench)
    except RatuneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"{'hub':<14} {'mode':<4} {'setting':<9} {'n':>4}  {'gorilla c/h/e':>14} {'acc%':>6} "
          f"{'hal%':>6}  {'strict c/h/e':>13} {'acc%':>6}  {'s':>6} {'resp/s':>8}")
    for f in out["files"]:
        g, s = f["gorilla"], f["strict"]
        print(f"{f['hub']:<14} {f['mode']:<4} {f['setting']:<9} {f['n']:>4}  {_counts(g):>14} "
              f"{100 * g['accuracy']:6.2f} {100 * g['hallucination']:6.2f}  {_counts(s):>13} "
              f"{100 * s['accuracy']:6.2f}  {f['seconds']:6.2f} {f['responses_per_second']:8.0f}")
    t = out["total"]
    print(f"total: {t['files']} files, {t['responses']} responses in {t['seconds']:.2f} s "
          f"({t['responses_per_second']:.0f} responses/s, database parsing included)")
    print("parser: " + ", ".join(f"{k} {v}" for k, v in out["parser"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
