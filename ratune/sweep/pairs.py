"""Chosen-pair comparisons inside a sweep report: paired tests between finished cells, once per
context (the dimensions neither selector names; docs/sweeps.md#seeds-and-chosen-pairs)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from ratune.errors import RatuneError
from ratune.eval.compare import compare_outcomes
from ratune.eval.scoring.scorer import METRICS
from ratune.eval.stats import DEFAULT_RESAMPLES
from ratune.io import read_json_object

#: Dimensions every eval cell has besides the sweep axes.
CELL_DIMENSIONS = ("hub", "train_retriever", "test_retriever")


def _norm(value: Any) -> str:
    """A dimension value as text, so that YAML ``2.0e-4`` and a stored ``0.0002`` compare equal."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class ComparePair(BaseModel):
    """One chosen pair: two selectors ``{dimension: value}``."""

    model_config = ConfigDict(extra="forbid")
    a: dict[str, Any]
    b: dict[str, Any]

    @field_validator("a", "b")
    @classmethod
    def _not_empty(cls, value: dict) -> dict:
        if not value:
            raise ValueError("a selector needs at least one dimension, e.g. {test_retriever: oracle}")
        return value


def parse_selector(text: str) -> dict[str, str]:
    """``"train_retriever=oracle,test_retriever=oracle"`` -> ``{"train_retriever": "oracle", ...}``.

    Raises:
        RatuneError: an item without ``=``, or an empty selector.
    """
    selector = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" not in item:
            raise RatuneError(f"--pair selector {text!r}: {item!r} is not KEY=VALUE "
                              "(e.g. train_retriever=oracle,test_retriever=oracle)")
        key, value = item.split("=", 1)
        selector[key.strip()] = value.strip()
    if not selector:
        raise RatuneError(f"--pair selector {text!r} is empty")
    return selector


def describe(selector: dict) -> str:
    """A selector as ``key=value, ...`` text (keys sorted)."""
    return ", ".join(f"{k}={_norm(v)}" for k, v in sorted(selector.items()))


def compare_pairs(cells: list[dict], pairs: list[ComparePair], *, n_resamples: int | None = None) -> list[dict]:
    """Run every chosen pair over the finished ``cells`` (``{"dims", "cell", "metrics_path"}`` each).

    Returns:
        One entry per (pair, context): ``{"pair", "a", "b", "context", "status"}``, status ``ok``
        (with ``a_cell``, ``b_cell``, ``metrics`` per metric), ``missing`` or ``refused`` (``reason``).
    Raises:
        RatuneError: a selector names a dimension no cell has (lists the known ones), or a
            context holds two cells for one side (the selectors are ambiguous).
    """
    resamples = n_resamples or DEFAULT_RESAMPLES
    known = sorted({k for c in cells for k in c["dims"]})
    results = []
    for index, pair in enumerate(pairs):
        for side in (pair.a, pair.b):
            unknown = sorted(set(side) - set(known))
            if unknown:
                raise RatuneError(f"compare pair {index + 1}: unknown dimension(s) {', '.join(unknown)}; "
                                  f"the sweep's cells have {', '.join(known)}")
        named = set(pair.a) | set(pair.b)
        context_keys = [k for k in known if k not in named]
        sides: dict[str, dict[tuple, list]] = {"a": {}, "b": {}}
        for c in cells:
            dims = {k: _norm(v) for k, v in c["dims"].items()}
            context = tuple((k, dims.get(k, "")) for k in context_keys)
            for label, selector in (("a", pair.a), ("b", pair.b)):
                if all(dims.get(k) == _norm(v) for k, v in selector.items()):
                    sides[label].setdefault(context, []).append(c)
        base = {"pair": index + 1, "a": describe(pair.a), "b": describe(pair.b)}
        contexts = sorted(set(sides["a"]) | set(sides["b"]))
        if not contexts:
            results.append({**base, "context": {}, "status": "missing", "missing": ["a", "b"]})
            continue
        for context in contexts:
            entry = {**base, "context": dict(context)}
            found = {label: sides[label].get(context, []) for label in ("a", "b")}
            for label, matched in found.items():
                if len(matched) > 1:
                    raise RatuneError(
                        f"compare pair {index + 1} ({label} = {describe(getattr(pair, label))}): "
                        f"{len(matched)} cells match in context {describe(dict(context))} "
                        f"({', '.join(m['cell'] for m in matched)}); name more dimensions")
            missing = [label for label, matched in found.items() if not matched]
            if missing:
                results.append({**entry, "status": "missing", "missing": missing})
                continue
            a, b = found["a"][0], found["b"][0]
            per_q = [read_json_object(x["metrics_path"]).get("per_question") for x in (a, b)]
            entry.update(a_cell=f"{a['cell']}/{a['dims']['test_retriever']}",
                         b_cell=f"{b['cell']}/{b['dims']['test_retriever']}")
            if not per_q[0] or not per_q[1]:
                results.append({**entry, "status": "refused",
                                "reason": "metrics.json without per_question outcomes (rerun `ratune eval run`)"})
                continue
            try:
                # a catalog's cells have no gorilla outcomes (eval/catalog_scorer.py): its strict only
                metrics = [m for m in METRICS if all(m in q for q in (*per_q[0], *per_q[1]))]
                entry["metrics"] = {m: compare_outcomes(per_q[0], per_q[1], metric=m, resamples=resamples,
                                                        labels=(entry["a_cell"], entry["b_cell"]))
                                    for m in metrics or METRICS}
            except RatuneError as err:
                results.append({**entry, "status": "refused", "reason": str(err)})
                continue
            results.append({**entry, "status": "ok"})
    return results


def comparisons_markdown(results: list[dict]) -> str:
    """The comparisons as one markdown table per metric (percent; intervals 95 %)."""
    lines = []
    ok = [r for r in results if r["status"] == "ok"]
    present = [m for m in METRICS if any(m in r["metrics"] for r in ok)] or list(METRICS)
    for metric in present:
        lines += [f"### {metric} metric", "",
                  "| pair | context | A | B | n | A acc | B acc | both / only A / only B / neither "
                  "| A - B [95 % bootstrap] | McNemar p |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            context = describe(r["context"]) or "-"
            head = f"| {r['pair']} | {context} | {r['a']} | {r['b']} |"
            if r["status"] != "ok":
                why = f"{' and '.join(r['missing'])} not finished" if r["status"] == "missing" else r["reason"]
                lines.append(f"{head} - | - | - | {r['status']}: {why} | - | - |")
                continue
            m = r["metrics"].get(metric)
            if m is None:  # a catalog's pair: no gorilla metric
                lines.append(f"{head} - | - | - | not this hub's metric | - | - |")
                continue
            t, d = m["contingency"], m["difference"]
            lines.append(f"{head} {m['n']} | {100 * m['a']['accuracy']:.1f} | {100 * m['b']['accuracy']:.1f} | "
                         f"{t['both']} / {t['only_a']} / {t['only_b']} / {t['neither']} | "
                         f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] | "
                         f"{m['mcnemar_p']:.3g} |")
        lines.append("")
    if ok:
        d = next(iter(ok[0]["metrics"].values()))["difference"]
        lines.append(f"Exact McNemar test = two-sided sign test on the discordant questions; "
                     f"paired percentile bootstrap with {d['resamples']} resamples, seed {d['seed']}.")
    return "\n".join(lines) + "\n"


def comparisons_csv_rows(results: list[dict]) -> list[list]:
    """Header plus one row per (comparison, metric) for comparisons.csv (fractions, not percent)."""
    header = ["pair", "context", "a", "b", "status", "metric", "a_cell", "b_cell", "n", "a_accuracy",
              "b_accuracy", "both", "only_a", "only_b", "neither", "difference", "difference_low",
              "difference_high", "mcnemar_p", "resamples", "seed"]
    rows = [header]
    for r in results:
        head = [r["pair"], describe(r["context"]), r["a"], r["b"], r["status"]]
        if r["status"] != "ok":
            rows.append([*head, "", "", "", *[""] * (len(header) - 8)])
            continue
        for metric in METRICS:
            m = r["metrics"].get(metric)
            if m is None:  # a catalog's pair: no gorilla metric
                continue
            t, d = m["contingency"], m["difference"]
            rows.append([*head, metric, r["a_cell"], r["b_cell"], m["n"], f"{m['a']['accuracy']:.6f}",
                         f"{m['b']['accuracy']:.6f}", t["both"], t["only_a"], t["only_b"], t["neither"],
                         f"{d['value']:.6f}", f"{d['low']:.6f}", f"{d['high']:.6f}", f"{m['mcnemar_p']:.6g}",
                         d["resamples"], d["seed"]])
    return rows
