"""Paired comparison of two response files scored on the same questions (``ratune compare``;
docs/pipeline.md#reading-intervals-and-comparisons). Unpaired question sets are refused.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

from ratune.args import add_apibench_argument, bounded, input_path
from ratune.config import Seed
from ratune.sources.apibench import HUBS, resolve_apibench_dir
from ratune.hubs import hub_argument_type, recorded_hub_kind, resolve_hub
from ratune.errors import RatuneError
from ratune.eval.hub_scoring import recorded_answer_format, scoring_for
from ratune.eval.scoring.scorer import METRICS
from ratune.eval.stats import (DEFAULT_RESAMPLES, DEFAULT_SEED, contingency, mcnemar_exact, mean_bootstrap,
                               paired_bootstrap, wilson_interval)
from ratune.registry import RELEASED_MODELS, TEST_SETTINGS

#: Name of the responses file inside an eval cell folder (``{eval_dir}/{setting}/``).
CELL_RESPONSES = "responses.jsonl"

#: The outcome of a BFCL category's entry (BFCL's own verdict), the metric of two BFCL cells compared.
BFCL_METRIC = "bfcl"
COMPARE_METRICS = METRICS


def resolve_responses_path(path: str | os.PathLike) -> Path:
    """A response file, or an eval cell folder holding ``responses.jsonl``, as a file path.

    Raises:
        RatuneError: the path does not exist, or is a folder without responses.jsonl.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / CELL_RESPONSES).is_file():
            raise RatuneError(f"{p}: a folder without {CELL_RESPONSES}; pass a response file or an eval "
                              f"cell folder (e.g. EVAL_DIR/oracle)")
        return p / CELL_RESPONSES
    if not p.is_file():
        raise RatuneError(f"{p}: response file not found")
    return p


def compare_outcomes(per_question_a: list[dict], per_question_b: list[dict], *, metric: str = "gorilla",
                     resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                     labels: tuple[str, str] = ("A", "B")) -> dict:
    """Compare two scored outcome lists (``per_question`` of :meth:`Scorer.score`), paired by
    question_id; a question is correct when its ``metric`` outcome is ``"correct"``. ``labels``
    name A and B in errors. Returns ``{"metric", "n", "a", "b", "contingency", "mcnemar_p",
    "difference"}`` (fractions; 95 % intervals).

    Raises:
        RatuneError: unknown metric, empty lists, or the question_id sets differ (unpaired).
    """
    if metric not in (*COMPARE_METRICS, BFCL_METRIC):
        raise RatuneError(f"unknown metric {metric!r}: expected one of {', '.join(COMPARE_METRICS)}")
    outcome = {}
    for label, rows in zip(labels, (per_question_a, per_question_b)):
        outcome[label] = {q["question_id"]: q[metric] == "correct" for q in rows}
    ids_a, ids_b = set(outcome[labels[0]]), set(outcome[labels[1]])
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)

        def some(ids):
            return ", ".join(map(str, ids[:5])) + (", ..." if len(ids) > 5 else "")

        raise RatuneError(
            f"unpaired comparison refused: {labels[0]} has {len(ids_a)} questions, {labels[1]} has {len(ids_b)}, "
            f"{len(ids_a & ids_b)} in common; {len(only_a)} only in {labels[0]}"
            + (f" ({some(only_a)})" if only_a else "") + f", {len(only_b)} only in {labels[1]}"
            + (f" ({some(only_b)})" if only_b else "")
            + ". Compare responses to the same questions (same hub, same --n-questions)")
    if not ids_a:
        raise RatuneError("nothing to compare: both response sets are empty")
    ids = sorted(ids_a)
    a = [outcome[labels[0]][q] for q in ids]
    b = [outcome[labels[1]][q] for q in ids]
    n = len(ids)
    table = contingency(a, b)
    diff, low, high = paired_bootstrap(a, b, resamples=resamples, seed=seed)
    side = {}
    for key, values in (("a", a), ("b", b)):
        k = sum(values)
        side[key] = {"correct_n": k, "accuracy": k / n, "accuracy_ci": list(wilson_interval(k, n))}
    return {"metric": metric, "n": n, **side, "contingency": table,
            "mcnemar_p": mcnemar_exact(table["only_a"], table["only_b"]),
            "difference": {"value": diff, "low": low, "high": high, "resamples": resamples, "seed": seed}}


def compare_files(responses_a, responses_b, *, hub, apibench_dir=None, metric: str | None = None,
                  resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, hub_check: bool = True,
                  scorer=None) -> dict:
    """Score two response files (or eval cell folders) by ``hub``'s scorer (``scorer``: one built
    already) and compare them paired by ``metric`` (default: the hub's headline metric).
    Returns :func:`compare_outcomes`'s dict plus ``"hub"`` and ``a.path`` / ``b.path``.

    Raises:
        RatuneError / InputError: unknown hub, a metric the hub is not scored by, missing files,
            malformed lines, ids that are not the hub's questions, a file for another hub (unless
            ``hub_check`` is False), unpaired question sets.
    """
    scoring = scoring_for(resolve_hub(hub, apibench_dir, locate=False))
    if scorer is not None:
        scoring.scorer = scorer
    metric = metric or scoring.main_metric
    scoring.require_metric(metric, fix="compare with")
    paths, scored = [], []
    for given in (responses_a, responses_b):
        path = resolve_responses_path(given)
        recorded = recorded_answer_format(path, scoring.hub)  # a cell in another format is read in it
        side = scoring if recorded is None else scoring_for(scoring.hub, answer_format=recorded)
        responses = side.load_responses(path, hub_check=hub_check)
        paths.append(path)
        scored.append(side.score(responses)["per_question"])
    try:
        result = compare_outcomes(scored[0], scored[1], metric=metric, resamples=resamples, seed=seed)
    except RatuneError as err:
        raise RatuneError(f"{err} [A = {paths[0]}, B = {paths[1]}]") from None
    result["hub"] = scoring.hub.name
    result["a"]["path"], result["b"]["path"] = os.fspath(paths[0]), os.fspath(paths[1])
    return result


#: What two BFCL category folders compared must share: one category, scored by one bfcl-eval and model key.
BFCL_PAIRED_KEYS = ("category", "bfcl_version", "bfcl_model")


@dataclass(frozen=True)
class BfclArm:
    """One arm's category folders of ``ratune eval bfcl`` (one per seed), read once
    (:func:`read_bfcl_arm`): ``meta`` is the first folder's ``metrics.json`` with its ``category``,
    ``verdicts`` each seed's ``{entry id: BFCL's checker accepted it}``."""

    cells: tuple[Path, ...]
    meta: dict
    verdicts: tuple[dict[str, bool], ...]

    @property
    def seeds(self) -> int:
        return len(self.cells)

    @cached_property
    def shares(self) -> dict[str, float]:
        """Each entry's share of the arm's seeds that BFCL's checker accepts (0 or 1 for one seed)."""
        return {q: sum(v[q] for v in self.verdicts) / self.seeds for q in self.verdicts[0]}


def read_bfcl_arm(cells: Sequence[str | os.PathLike]) -> BfclArm:
    """Read the verdicts of one arm's folders of a BFCL category (one per seed).

    Raises:
        RatuneError: a folder that is not a complete category; seeds that answered other entries, or
            that differ in :data:`BFCL_PAIRED_KEYS`.
        InputError: a malformed verdict line (file, line).
    """
    from ratune.eval.bfcl_run import bfcl_cell_outcomes

    metas, verdicts = [], []
    for cell in cells:
        meta, outcomes = bfcl_cell_outcomes(cell)
        metas.append((Path(cell), meta))
        verdicts.append({o["question_id"]: o["bfcl"] == "correct" for o in outcomes})
        if set(verdicts[-1]) != set(verdicts[0]):
            raise RatuneError(f"{cell}: its entries differ from those of {cells[0]}; the seeds of an arm answer "
                              "the same entries")
    _check_one_bfcl(metas)
    return BfclArm(tuple(c for c, _ in metas), metas[0][1], tuple(verdicts))


def _check_one_bfcl(metas: Sequence[tuple[Path, dict]]) -> None:
    """Refuse ``(folder, metrics)`` pairs that differ in :data:`BFCL_PAIRED_KEYS` (RatuneError)."""
    for key in BFCL_PAIRED_KEYS:
        values = {m.get(key) for _, m in metas}
        if len(values) > 1:
            raise RatuneError(f"the folders compared differ in {key} ({', '.join(sorted(map(str, values)))}: "
                              f"{', '.join(os.fspath(c) for c, _ in metas)}); compare one category scored by one BFCL")


def compare_bfcl_cells(cell_a, cell_b, *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> dict:
    """Two category folders of ``ratune eval bfcl`` compared paired by entry id, by BFCL's own
    verdicts: :func:`compare_outcomes`'s dict (metric ``bfcl``) plus ``hub``, each side's ``path``
    and ``model``, ``bfcl_version`` and ``bfcl_model``.

    Raises:
        RatuneError: as :func:`compare_read_bfcl_arms`.
    """
    return compare_read_bfcl_arms(read_bfcl_arm([cell_a]), read_bfcl_arm([cell_b]), resamples=resamples, seed=seed)


def compare_read_bfcl_arms(a: BfclArm, b: BfclArm, *, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = DEFAULT_SEED) -> dict:
    """Two arms of one BFCL category compared paired by entry id. One seed each:
    :func:`compare_outcomes`'s dict (the exact McNemar test) with each side's ``path`` and ``model``.
    Otherwise each entry counts the share of an arm's seeds that BFCL's checker accepts;
    ``contingency`` holds the entries where A's share is higher (``only_a``), B's (``only_b``) or
    neither (``tied``); ``mcnemar_p`` is the two-sided sign test on ``only_a`` and ``only_b``;
    ``difference`` is the mean share A - B with its paired bootstrap interval over entries;
    ``a``/``b`` give ``seeds``, ``correct_n`` (the mean over seeds), ``accuracy`` and ``paths``.
    Both add ``hub``, ``bfcl_version`` and ``bfcl_model``.

    Raises:
        RatuneError: the arms differ in :data:`BFCL_PAIRED_KEYS`; unpaired entries.
    """
    _check_one_bfcl([(a.cells[0], a.meta), (b.cells[0], b.meta)])
    common = {"hub": f"BFCL {a.meta['category']}", "bfcl_version": a.meta.get("bfcl_version"),
              "bfcl_model": a.meta.get("bfcl_model")}
    if a.seeds == b.seeds == 1:
        outcomes = [[{"question_id": q, BFCL_METRIC: "correct" if right else "wrong"} for q, right in arm.verdicts[0].items()]
                    for arm in (a, b)]
        try:
            result = compare_outcomes(*outcomes, metric=BFCL_METRIC, resamples=resamples, seed=seed)
        except RatuneError as err:
            raise RatuneError(f"{err} [A = {a.cells[0]}, B = {b.cells[0]}]") from None
        for key, arm in (("a", a), ("b", b)):
            result[key].update(path=os.fspath(arm.cells[0]), model=arm.meta.get("model"))
        return {**result, **common}
    shares = {"a": a.shares, "b": b.shares}
    if set(shares["a"]) != set(shares["b"]):
        raise RatuneError(f"unpaired comparison refused: A ({a.cells[0]}) has {len(shares['a'])} entries, B "
                          f"({b.cells[0]}) {len(shares['b'])}, {len(set(shares['a']) & set(shares['b']))} in common")
    ids = sorted(shares["a"])
    d = [shares["a"][q] - shares["b"][q] for q in ids]
    only_a, only_b = sum(x > 0 for x in d), sum(x < 0 for x in d)
    mean, low, high = mean_bootstrap(d, resamples=resamples, seed=seed)
    n = len(ids)
    side = {}
    for key, arm in (("a", a), ("b", b)):
        correct = sum(shares[key].values())  # a mean over seeds; a whole count for one seed
        side[key] = {"seeds": arm.seeds, "correct_n": round(correct) if arm.seeds == 1 else correct,
                     "accuracy": correct / n, "paths": [os.fspath(c) for c in arm.cells]}
    return {"metric": BFCL_METRIC, "n": n, **side, **common,
            "contingency": {"only_a": only_a, "only_b": only_b, "tied": n - only_a - only_b},
            "mcnemar_p": mcnemar_exact(only_a, only_b), "test": "sign test on each entry's share of seeds right",
            "difference": {"value": mean, "low": low, "high": high, "resamples": resamples, "seed": seed}}


def format_compare(result: dict) -> str:
    """The comparison as readable text (percent; intervals 95 %)."""
    n, t, d = result["n"], result["contingency"], result["difference"]

    def side(key):
        s = result[key]
        lo, hi = s["accuracy_ci"]
        return (f"{key.upper()}: {s['correct_n']}/{n} correct = {100 * s['accuracy']:.1f} % "
                f"[{100 * lo:.1f}-{100 * hi:.1f}]  {s.get('path', '')}")

    discordant = t["only_a"] + t["only_b"]
    lines = [f"{result.get('hub', '')} {result['metric']} metric, {n} paired questions".strip(),
             side("a"), side("b"), "",
             f"{'':<12}{'B correct':>10}{'B wrong':>10}",
             f"{'A correct':<12}{t['both']:>10}{t['only_a']:>10}",
             f"{'A wrong':<12}{t['only_b']:>10}{t['neither']:>10}", "",
             f"exact McNemar test (two-sided sign test on the {discordant} discordant questions, "
             f"{t['only_a']} only A vs {t['only_b']} only B): p = {result['mcnemar_p']:.3g}",
             f"difference A - B: {100 * d['value']:+.1f} points, 95 % paired bootstrap interval "
             f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] ({d['resamples']} resamples, seed {d['seed']})",
             "accuracy intervals: 95 % Wilson score intervals"]
    return "\n".join(lines)


#: Most bootstrap resamples ``--resamples`` accepts (its replicates are held in memory: 80 MB).
MAX_RESAMPLES = 10_000_000


def add_compare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of ``ratune compare`` to ``parser`` (see :func:`cli_compare`)."""
    from typing import Annotated

    from pydantic import Field

    resamples = Annotated[int, Field(ge=1, le=MAX_RESAMPLES)]

    parser.add_argument("responses_a", metavar="RESPONSES_A", type=input_path,
                        help="response JSONL file, or an eval cell folder holding responses.jsonl")
    parser.add_argument("responses_b", metavar="RESPONSES_B", type=input_path,
                        help="the same for B (same questions)")
    parser.add_argument("--hub", default=None, type=hub_argument_type(), metavar="HUB",
                        help=f"an APIBench hub ({', '.join(HUBS)}), a catalog or tool-set folder; not for two "
                             "category folders of `ratune eval bfcl` (paired by entry id, BFCL's verdicts)")
    add_apibench_argument(parser)
    parser.add_argument("--metric", choices=COMPARE_METRICS, default=None,
                        help="which outcome counts as correct (default gorilla; strict on a catalog)")
    parser.add_argument("--resamples", type=bounded(resamples, "resamples"), default=DEFAULT_RESAMPLES,
                        help=f"paired bootstrap resamples, 1 to {MAX_RESAMPLES} (default {DEFAULT_RESAMPLES})")
    parser.add_argument("--seed", type=bounded(Seed), default=DEFAULT_SEED,
                        help=f"paired bootstrap seed (default {DEFAULT_SEED})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-hub-check", dest="no_hub_check", action="store_true",
                        help="compare even if the responses look like another hub's")
    return parser


def cli_compare(args) -> int:
    """``ratune compare RESPONSES_A RESPONSES_B --hub HUB``: prints :func:`format_compare` or, with
    ``--json``, the result dict; two category folders of ``ratune eval bfcl`` need no ``--hub``
    (:func:`compare_bfcl_cells`). Returns 0.

    Raises:
        RatuneError / InputError: see :func:`compare_files`; resamples < 1.
    """
    resamples = getattr(args, "resamples", None)
    resamples = DEFAULT_RESAMPLES if resamples is None else resamples
    if resamples < 1:
        raise RatuneError(f"--resamples must be at least 1, got {resamples}")
    seed = DEFAULT_SEED if getattr(args, "seed", None) is None else args.seed
    from ratune.eval.bfcl_run import is_bfcl_cell

    if is_bfcl_cell(args.responses_a) and is_bfcl_cell(args.responses_b):
        if getattr(args, "metric", None) is not None:
            raise RatuneError(f"--metric {args.metric}: two BFCL category folders are compared by BFCL's own verdict")
        result = compare_bfcl_cells(args.responses_a, args.responses_b, resamples=resamples, seed=seed)
    elif getattr(args, "hub", None) is None:
        raise RatuneError("--hub is needed to score response files (it is not needed for two category folders of "
                          "`ratune eval bfcl`)")
    else:
        result = _compare_cli_files(args, resamples, seed)
    if getattr(args, "json", False):
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_compare(result))
    return 0


def _compare_cli_files(args, resamples: int, seed: int) -> dict:
    """:func:`compare_files` of ``ratune compare``'s arguments."""
    return compare_files(args.responses_a, args.responses_b, hub=args.hub, apibench_dir=getattr(args, "apibench", None),
                         metric=getattr(args, "metric", None), resamples=resamples, seed=seed,
                         hub_check=not getattr(args, "no_hub_check", False))


def compare_with_released(cell: str | os.PathLike, setting: str, *, hub: str, apibench_dir=None,
                          resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, scorer=None) -> list[dict]:
    """An eval cell against each released Gorilla-7B file made with the same documents
    (``TestSetting.released`` in ratune/registry.py), under both metrics: one :func:`compare_files`
    result per (released model, metric) with ``"released"`` and ``"setting"`` added; [] when the
    setting has no released counterpart.

    Raises:
        RatuneError: as :func:`compare_files` (a cell on a subset of the questions is unpaired and
            refused).
    """
    spec = TEST_SETTINGS.get(setting)
    if spec is None or spec.released is None:
        return []
    source = resolve_hub(hub, apibench_dir)
    scorer = scorer or scoring_for(source).scorer  # one scorer for the 4 comparisons
    apibench = source.root
    out = []
    for model in RELEASED_MODELS:
        released = source.released_responses_file(model, spec.released)
        for metric in COMPARE_METRICS:
            result = compare_files(cell, released, hub=hub, apibench_dir=apibench, metric=metric,
                                   resamples=resamples, seed=seed, scorer=scorer)
            out.append({**result, "released": model, "setting": setting})
    return out


def released_markdown(results: list[dict]) -> str:
    """:func:`compare_with_released` results (of one or more cells, each with a ``"cell"`` label)
    as one markdown table: ours vs released, counts, McNemar p and the paired bootstrap interval."""
    lines = ["| model | setting | metric | ours correct | released | released correct | only ours | only released "
             "| McNemar p | difference (points) [95 % CI] |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, d = r["contingency"], r["difference"]
        lines.append(f"| {r.get('cell', '')} | {r['setting']} | {r['metric']} | {r['a']['correct_n']}/{r['n']} | "
                     f"{r['released']} | {r['b']['correct_n']}/{r['n']} | {t['only_a']} | {t['only_b']} | "
                     f"{r['mcnemar_p']:.3g} | {100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
    return "\n".join(lines) + "\n"


def released_comparisons(cells: list[dict], apibench_dir=None) -> tuple[list[dict], list[dict]]:
    """:func:`compare_with_released` for ``cells`` (``{"cell", "path", "setting", "hub", "n"}``
    each): ``(results, skipped)``, skipped as ``{"cell", "setting", "reason"}`` where the released
    files cannot be paired (another hub, fewer questions)."""
    apibench = resolve_apibench_dir(apibench_dir)
    scorers: dict = {}  # one per hub, for the question count and every comparison
    results, skipped = [], []
    for c in cells:
        spec = TEST_SETTINGS.get(c["setting"])
        if spec is None or spec.released is None:
            continue
        if not recorded_hub_kind(c["hub"], c.get("hub_kind")).has_released_responses:
            skipped.append({"cell": c["cell"], "setting": c["setting"], "reason": "no released responses for this hub"})
            continue
        if c["hub"] not in scorers:
            scorers[c["hub"]] = scoring_for(resolve_hub(c["hub"], apibench)).scorer
        scorer = scorers[c["hub"]]
        if c["n"] != scorer.n_questions:
            skipped.append({"cell": c["cell"], "setting": c["setting"],
                            "reason": f"{c['n']} of the {scorer.n_questions} questions the released files answer"})
            continue
        results += [{**r, "cell": c["cell"]} for r in compare_with_released(
            c["path"], c["setting"], hub=c["hub"], apibench_dir=apibench, scorer=scorer)]
    return results, skipped
