"""Choosing a checkpoint on a learning curve by a declared rule (docs/pipeline.md): each rule of
:data:`SELECTION_RULES` turns one checkpoint's curve rows (one per test setting) into a score, and
:func:`choose_checkpoint` takes the highest, ties to the earlier step. Meant for curves on the
validation questions; the chosen checkpoint's test questions are read once after."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Callable, Sequence

from ratune.errors import RatuneError
from ratune.hubs import Hub, ToolSetHub
from ratune.io import read_json_object
from ratune.registry import ZERO_SHOT_SETTING, unknown_name
from ratune.train.layout import TRAINER_DIR


def correct_count(row: dict, metric: str) -> int | None:
    """A curve row's correct count by ``metric`` (None: the curve has no such metric)."""
    return row[f"{metric}_correct"]


def worse_answer_kind(row: dict, metric: str) -> float | None:
    """The lower strict accuracy of a tool-set row's questions whose reference answer calls a tool
    and those whose reference answer is ``[]`` (``by_answer``, :func:`ratune.eval.curve.curve_row`; a kind with no
    questions is left out); None: no such counts (not a tool set, or ``metric`` not strict)."""
    by_answer = row.get("by_answer")
    if by_answer is None or metric != "strict":
        return None
    return min((kind["correct_n"] / kind["n"] for kind in by_answer.values() if kind["n"]), default=0.0)


@dataclass(frozen=True)
class SelectionRule:
    """A way to score a checkpoint from its curve rows.

    Attributes:
        name: the rule's name (``--rule``, a sweep's ``selection.rule``).
        summary: one line for help texts, reports and docs.
        aggregate: the score of a checkpoint from its settings' row scores.
        setting: the one test setting the rule reads (None: every setting of the curve).
        row_score: one row's score for a metric (None when the row cannot give it).
        needs: what a curve must hold for ``row_score``, for the error when it does not.
        hub_kinds: the kinds of hub whose curves give ``row_score`` (None: every kind).
    """

    name: str
    summary: str
    aggregate: Callable[[Sequence[float]], float]
    setting: str | None = None
    row_score: Callable[[dict, str], float | None] = correct_count
    needs: str = "{metric} metric (a catalog or tool set is scored by strict only)"
    hub_kinds: tuple[str, ...] | None = None

    def check_hub(self, hub: Hub, metric: str, where: str) -> None:
        """Refuse, before any training, a hub or metric whose curves this rule cannot read.

        Raises:
            RatuneError: naming ``where``, the hub and the kinds the rule reads, or the metric.
        """
        if self.hub_kinds is None:
            return
        if hub.kind not in self.hub_kinds:
            raise RatuneError(f"{where}: selection rule {self.name} reads the curves of a {' or '.join(self.hub_kinds)} "
                              f"hub only (it needs {self.needs.format(metric='strict')}); hub {hub.name} is of kind {hub.kind}")
        if metric != "strict":
            raise RatuneError(f"{where}: selection rule {self.name} reads strict counts only; use selection metric strict, "
                              f"not {metric}")


#: The rules by name. ``zero_shot`` is the rule of a model trained without documents; ``oracle`` of
#: one trained with the gold document; ``worst_case`` of a mixture, which should hold up under every
#: retriever it may meet; ``balanced`` of a tool-calling model, which should both call and abstain
#: (docs/function_calling.md#choosing-the-checkpoint).
SELECTION_RULES: dict[str, SelectionRule] = {r.name: r for r in (
    SelectionRule("zero_shot", f"most correct answers at {ZERO_SHOT_SETTING}", min, setting=ZERO_SHOT_SETTING),
    SelectionRule("oracle", "most correct answers at oracle (the gold document)", min, setting="oracle"),
    SelectionRule("worst_case", "most correct answers in the checkpoint's worst setting", min),
    SelectionRule("mean", "most correct answers on average over the settings", fmean),
    SelectionRule("balanced", "highest strict accuracy on the worse of the questions whose reference answer calls a "
                  "tool and those whose answer is [], in the worst setting", min, row_score=worse_answer_kind,
                  needs="strict counts by reference answer (by_answer: a tool set's curve, --metric strict; a curve "
                        "scored before ratune counted them lacks them)",
                  hub_kinds=(ToolSetHub.kind,)),
)}


def get_selection_rule(name: str) -> SelectionRule:
    """The rule called ``name``.

    Raises:
        RatuneError: an unknown name, listing the known ones.
    """
    if name not in SELECTION_RULES:
        raise RatuneError(unknown_name("selection rule", name, tuple(SELECTION_RULES)))
    return SELECTION_RULES[name]


def choose_checkpoint(rows: Sequence[dict], rule: str, *, metric: str = "strict") -> dict:
    """The checkpoint ``rule`` chooses on curve ``rows`` (:func:`ratune.eval.curve.curve_row`) by
    ``metric`` (the rule's row score: a correct count, or for ``balanced`` an accuracy): the highest
    score, ties to the earlier step.

    Returns:
        ``{"rule", "summary", "metric", "setting", "step", "epoch", "score", "scores": [{"step",
        "epoch", "score"}]}`` (``scores`` by step).
    Raises:
        RatuneError: an unknown rule; no rows; the rule's setting missing at a step; a metric or
            counts the curve does not have (a catalog has no ``gorilla``; only a tool set's curve
            has ``by_answer``).
    """
    chosen_rule = get_selection_rule(rule)
    if not rows:
        raise RatuneError("no learning-curve rows to choose a checkpoint from")
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    scores = []
    for step in sorted(by_step):
        part = by_step[step]
        if chosen_rule.setting is not None:
            part = [r for r in part if r["setting"] == chosen_rule.setting]
            if not part:
                raise RatuneError(f"selection rule {rule}: the curve has no {chosen_rule.setting} cell at step {step}; "
                                  f"evaluate the curve with --settings {chosen_rule.setting}")
        counts = [chosen_rule.row_score(r, metric) for r in part]
        if any(c is None for c in counts):
            raise RatuneError(f"selection rule {rule}: the curve has no " + chosen_rule.needs.format(metric=metric))
        scores.append({"step": step, "epoch": part[0]["epoch"], "score": chosen_rule.aggregate(counts)})
    best = max(scores, key=lambda s: (s["score"], -s["step"]))
    return {"rule": rule, "summary": chosen_rule.summary, "metric": metric, "setting": chosen_rule.setting,
            "step": best["step"], "epoch": best["epoch"], "score": best["score"], "scores": scores}


def select_from_curve(curve_dir: str | os.PathLike, rule: str, *, metric: str = "strict") -> dict:
    """:func:`choose_checkpoint` on a curve folder (``ratune eval run --all-checkpoints``) made on the
    validation questions; adds ``checkpoint`` (the chosen Trainer checkpoint's folder) and ``curve``.

    Raises:
        RatuneError: no curve there; a curve of the eval (test) questions; see :func:`choose_checkpoint`.
    """
    from ratune.eval.curve import read_curve, step_folder

    rows = read_curve(curve_dir)
    chosen = choose_checkpoint(rows, rule, metric=metric)
    cell = step_folder(curve_dir, chosen["step"]) / rows[0]["setting"] / "metrics.json"
    split = read_json_object(cell).get("split", "eval") if cell.is_file() else None
    if split != "validation":
        raise RatuneError(f"{curve_dir}: a learning curve of the {split or 'unknown'} questions ({cell}); choose on "
                          "the validation questions (ratune eval run --all-checkpoints --split validation), and read "
                          "the test questions once, for the chosen checkpoint")
    run = Path(read_json_object(Path(curve_dir) / "curve.json")["run"])
    return {**chosen, "curve": str(Path(curve_dir).resolve()),
            "checkpoint": str(run / TRAINER_DIR / f"checkpoint-{chosen['step']}")}


def _check_replaceable(path: Path) -> None:
    """Refuse to replace a file that is not an earlier choice (ratune overwrites only its own files).

    Raises:
        RatuneError: naming the file.
    """
    if not path.exists():
        return
    try:
        earlier = read_json_object(path)
    except RatuneError:
        earlier = {}
    if not {"rule", "curve", "checkpoint"} <= set(earlier):
        raise RatuneError(f"--out {path}: exists and is not a ratune eval select choice; not overwritten")


def cli_select(args) -> int:
    """``ratune eval select CURVE --rule R [--metric M] [--out FILE] [--json | --checkpoint-only]``:
    print the chosen checkpoint (``--checkpoint-only``: its folder alone, for a script); ``--out``
    also writes the choice as JSON."""
    import json

    from ratune.io import write_json

    chosen = select_from_curve(args.curve, args.rule, metric=args.metric)
    if args.out:
        _check_replaceable(Path(args.out))
        write_json(args.out, chosen)
    if args.checkpoint_only:
        print(chosen["checkpoint"])
    elif args.json:
        print(json.dumps(chosen, sort_keys=True))
    else:
        epoch = "" if chosen["epoch"] is None else f", epoch {chosen['epoch']:g}"
        print(f"step {chosen['step']}{epoch}: {chosen['summary']} ({chosen['metric']}, score {chosen['score']:g}) "
              f"by rule {chosen['rule']}\ncheckpoint: {chosen['checkpoint']}")
    return 0
