"""Worst case across test-time retrievers: which trained model is best when you do not know the
retriever it will be served with (docs/experiments.md#worst-case-across-test-settings)."""

from __future__ import annotations

from typing import Sequence

from ratune.eval.report import METRIC_TITLES, metric_block

METRICS = tuple(METRIC_TITLES)


def _accuracy(cell: dict, metric: str) -> tuple[float | None, list | None]:
    block = metric_block(cell, metric)
    return block.get("accuracy"), block.get("accuracy_ci")


def worst_case(cells: Sequence[dict]) -> dict[str, dict]:
    """Per train_retriever of Table 2 ``cells``, the worst (with its setting and Wilson interval) and
    mean accuracy across its test settings, gorilla and strict, as fractions; ``complete`` is False
    when the row lacks a test setting some other row has (its minimum is then not comparable).
    """
    all_settings = sorted({c["test_retriever"] for c in cells})
    out: dict[str, dict] = {}
    for train in dict.fromkeys(c["train_retriever"] for c in cells):
        row = [c for c in cells if c["train_retriever"] == train]
        entry = {"settings": sorted(c["test_retriever"] for c in row),
                 "complete": {c["test_retriever"] for c in row} == set(all_settings)}
        for metric in METRICS:
            scored = [(acc, ci, c["test_retriever"]) for c in row for acc, ci in [_accuracy(c, metric)]
                      if acc is not None]
            if not scored:
                continue
            worst = min(scored, key=lambda x: (x[0], x[2]))
            entry[metric] = {"worst": worst[0], "worst_ci": worst[1], "worst_setting": worst[2],
                             "mean": sum(x[0] for x in scored) / len(scored)}
        out[train] = entry
    return out


def worst_case_markdown(summary: dict[str, dict]) -> str:
    """The worst cases as a markdown table (percent; 95 % Wilson interval of the worst cell).
    A metric no row has (the gorilla metric of a catalog's table) gets no columns."""
    metrics = [m for m in METRICS if any(e.get(m) for e in summary.values())] or list(METRICS)
    lines = ["| train | " + " | ".join(f"worst {m} (setting) | mean {m}" for m in metrics) + " | settings |",
             "|---" * (2 + 2 * len(metrics)) + "|"]
    for train, e in summary.items():
        cols = []
        for metric in metrics:
            m = e.get(metric)
            if not m:
                cols += ["-", "-"]
                continue
            ci = f" [{100 * m['worst_ci'][0]:.0f}-{100 * m['worst_ci'][1]:.0f}]" if m.get("worst_ci") else ""
            cols += [f"{100 * m['worst']:.1f}{ci} ({m['worst_setting']})", f"{100 * m['mean']:.1f}"]
        settings = f"{len(e['settings'])}" + ("" if e["complete"] else " (incomplete)")
        lines.append(f"| {train} | " + " | ".join(cols) + f" | {settings} |")
    return "\n".join(lines) + "\n"


def _rate(block: dict | None, key: str) -> dict | None:
    if not block or key not in block:
        return None
    return {"rate": block[key], "n": block.get("n"), "ci": block.get(f"{key}_ci")}


def experiment_rows(experiments: Sequence[dict], false_abstention: dict[str, dict]) -> list[dict]:
    """One row per trained cell with its experiment results (``swap``, ``irrelevant``,
    ``constraints_*``), each rate ``{"rate", "n", "ci"}`` or None when that experiment did not run.
    ``false_abstention``: ``{cell: abstention block of its oracle cell}``.
    """
    rows: dict[str, dict] = {}
    for e in experiments:
        row = rows.setdefault(e["cell"], {"cell": e["cell"], "train_retriever": e["train_retriever"],
                                          "axes": e["axes"], "follows_document": None, "follows_memory": None,
                                          "abstention": None, "false_abstention": None, "constraints": {}})
        m = e["metrics"]
        if e["setting"] == "swap":
            row["follows_document"] = _rate(m.get("document_swap"), "follows_document")
            row["follows_memory"] = _rate(m.get("document_swap"), "follows_memory")
        elif e["setting"] == "irrelevant":
            row["abstention"] = _rate(m.get("abstention"), "rate")
        else:
            c = m.get("constraints") or {}
            row["constraints"][e["setting"]] = {k: _rate(c, k) for k in ("both", "constraint_met", "task_gorilla")}
    for name, row in rows.items():
        row["false_abstention"] = _rate(false_abstention.get(name), "rate")
    return [rows[k] for k in sorted(rows)]


def experiments_markdown(rows: Sequence[dict]) -> str:
    """The experiment rows as markdown (percent, 95 % Wilson intervals; ``-`` = not run)."""
    def fmt(r):
        if not r:
            return "-"
        ci = f" [{100 * r['ci'][0]:.0f}-{100 * r['ci'][1]:.0f}]" if r.get("ci") else ""
        return f"{100 * r['rate']:.1f}{ci}"

    constraint_settings = sorted({s for r in rows for s in r["constraints"]})
    head = ["cell", "train", "swap: follows document", "swap: follows memory", "abstention (irrelevant)",
            "false abstention (oracle)", *(f"{s}: both" for s in constraint_settings)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [r["cell"], r["train_retriever"], fmt(r["follows_document"]), fmt(r["follows_memory"]),
                fmt(r["abstention"]), fmt(r["false_abstention"]),
                *(fmt((r["constraints"].get(s) or {}).get("both")) for s in constraint_settings)]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"
