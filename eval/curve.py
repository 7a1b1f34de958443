"""Learning curves: every Trainer checkpoint of a run evaluated under the same test settings.

``ratune eval run --checkpoint RUN --all-checkpoints --out OUT --settings 0_shot ...`` evaluates
each ``RUN/trainer/checkpoint-STEP`` (:func:`ratune.train.layout.trainer_checkpoints`; train with
``save_strategy: epoch`` or ``save_steps``) into ``OUT/step{STEP}/`` exactly as ``ratune eval run``
evaluates one checkpoint (same generation settings, same cells, resumable per question), then
writes the curve::

    OUT/step{STEP}/{setting}/...       one eval output per checkpoint (:func:`evaluate_checkpoint`)
    OUT/curve.json                     {"run", "hub", "rows": [...], "versions"}
    OUT/curve.csv, OUT/curve.md        one row per (checkpoint, setting)
    OUT/curve.png                      strict and gorilla accuracy (95 % Wilson intervals) by epoch

A row: ``step``, ``epoch`` (from the checkpoint's ``trainer_state.json``; None when absent),
``setting``, ``n``, and per metric (``strict``, ``gorilla``) ``{metric}_correct`` (count),
``{metric}_accuracy`` and ``{metric}_hallucination`` (fractions of n) and ``{metric}_ci``
(Wilson interval of the accuracy, :func:`ratune.eval.stats.wilson_interval`); a tool set's rows
also carry ``by_answer`` (strict counts apart for questions whose reference answer calls a tool and is ``[]``,
:class:`ratune.eval.tool_scorer.ToolSetScorer`), None elsewhere. The question "has
0-shot accuracy stopped rising?" is read off the table: compare the last checkpoints' counts and
their intervals.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from ratune.hubs import as_hub_source
from ratune.errors import RatuneError
from ratune.eval.run import evaluate_checkpoint
from ratune.eval.settings import EvalSettings
from ratune.io import atomic_write, read_json_object, write_json, write_text
from ratune.manifest import package_versions
from ratune.output import StageOutput
from ratune.train.layout import checkpoint_epoch, trainer_checkpoints

#: The stage name in OUT's owner marker (:class:`ratune.output.StageOutput`).
STAGE = "eval curve"
#: The metrics of a curve row, in the order the table lists them (docs/scoring.md).
METRICS = ("strict", "gorilla")
#: Columns of curve.csv, in order.
COLUMNS = ("step", "epoch", "setting", "n", *(f"{m}_{k}" for m in METRICS
                                             for k in ("correct", "accuracy", "hallucination", "ci")))


def step_folder(out_dir: str | os.PathLike, step: int) -> Path:
    """``OUT/step{STEP}``: where the checkpoint of optimizer step ``step`` is evaluated."""
    return Path(out_dir) / f"step{step}"


def curve_row(step: int, epoch: float | None, setting: str, metrics: dict) -> dict:
    """One row of the curve from a cell's ``metrics.json`` (:func:`evaluate_checkpoint`'s output).

    A metric the cell does not have (``gorilla`` for a catalog, :mod:`ratune.eval.catalog_scorer`)
    has None in each of its fields.

    The rates and the interval are the cell's own (its 95 % Wilson interval,
    :func:`ratune.eval.stats.rate_intervals`), copied, not recomputed.

    Raises:
        KeyError: ``metrics`` lacks ``n``, or a metric block lacks ``correct_n``, ``accuracy``,
            ``hallucination`` or ``accuracy_ci``.
    """
    row = {"step": step, "epoch": epoch, "setting": setting, "n": metrics["n"]}
    for metric in METRICS:
        block = metrics.get(metric)
        if block is None:
            row.update({f"{metric}_{k}": None for k in ("correct", "accuracy", "hallucination", "ci")})
            continue
        row[f"{metric}_correct"] = block["correct_n"]
        row[f"{metric}_accuracy"] = block["accuracy"]
        row[f"{metric}_hallucination"] = block["hallucination"]
        row[f"{metric}_ci"] = list(block["accuracy_ci"])
    by_answer = (metrics.get("calls") or {}).get("by_answer")  # a tool set's cells only
    row["by_answer"] = None if by_answer is None else {k: dict(v) for k, v in by_answer.items()}
    return row


def evaluate_curve(run: str | os.PathLike, *, hub, apibench_dir, out_dir: str | os.PathLike, settings: EvalSettings,
                   model_name: str | None = None, progress: bool = True) -> list[dict]:
    """Evaluate every Trainer checkpoint of ``run`` under ``settings`` and write the curve files.

    Each checkpoint's responses name the model ``{model_name}-step{STEP}`` (``model_name``
    defaults to the run folder's name). Finished checkpoints and settings are skipped (each
    ``OUT/step{STEP}`` resumes as ``ratune eval run`` does), so an interrupted curve continues
    where it stopped.

    Returns:
        the rows, by step then in the order of ``settings.settings``.
    Raises:
        RatuneError: ``run`` is not a run folder or has no Trainer checkpoints; ``out_dir`` exists
            and is not a ratune curve output; anything :func:`evaluate_checkpoint` raises.
    """
    source = as_hub_source(hub, apibench_dir)  # an APIBench name, a catalog folder or a Hub
    checkpoints = trainer_checkpoints(run)
    if not checkpoints:
        raise RatuneError(f"{run}: no Trainer checkpoints (trainer/checkpoint-STEP) to draw a learning curve from; "
                          "train with save_strategy: epoch or save_steps: N, and without save_total_limit "
                          "(it deletes older checkpoints)")
    rows = []
    with StageOutput(out_dir, STAGE, action="replace").writing() as out:
        for number, checkpoint in enumerate(checkpoints, start=1):
            if progress:
                print(f"[curve] checkpoint {number}/{len(checkpoints)}: step {checkpoint.step}", flush=True)
            results = evaluate_checkpoint(checkpoint.folder, hub=source, apibench_dir=apibench_dir,
                                          out_dir=step_folder(out, checkpoint.step), settings=settings,
                                          progress=progress,
                                          model_name=f"{model_name}-step{checkpoint.step}" if model_name else None)
            epoch = checkpoint_epoch(checkpoint)
            rows += [curve_row(checkpoint.step, epoch, s, results[s]) for s in settings.settings]
        write_curve(out, rows, run=str(run), hub=source.name)
    return rows


def read_curve(out_dir: str | os.PathLike) -> list[dict]:
    """The rows of a finished curve (``OUT/curve.json``).

    Raises:
        RatuneError: no curve.json there; InputError: a torn or foreign file, naming it.
    """
    path = Path(out_dir) / "curve.json"
    if not path.is_file():
        raise RatuneError(f"{out_dir}: no learning curve (curve.json) there; run `ratune eval run --all-checkpoints`")
    rows = read_json_object(path).get("rows")
    if not isinstance(rows, list):
        from ratune.errors import InputError

        raise InputError(str(path), None, "rows", "missing or not a list: not a ratune learning curve")
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def curve_markdown(rows: list[dict]) -> str:
    """The curve as a markdown table: one row per (checkpoint, setting), counts with Wilson intervals."""
    lines = ["| step | epoch | setting | n | strict correct (%) [95 % CI] | strict halluc. % "
             "| gorilla correct (%) [95 % CI] | gorilla halluc. % |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        epoch = "" if r["epoch"] is None else f"{r['epoch']:g}"
        cells = []
        for metric in METRICS:
            if r[f"{metric}_ci"] is None:  # not this hub's metric
                cells += ["-", "-"]
                continue
            low, high = r[f"{metric}_ci"]
            cells.append(f"{r[f'{metric}_correct']} ({_pct(r[f'{metric}_accuracy'])}) [{_pct(low)}-{_pct(high)}]")
            cells.append(_pct(r[f"{metric}_hallucination"]))
        lines.append(f"| {r['step']} | {epoch} | {r['setting']} | {r['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curve_csv(rows: list[dict]) -> str:
    """The curve as CSV (:data:`COLUMNS`; an interval as ``low;high``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([";".join(f"{v:.6g}" for v in r[c]) if c.endswith("_ci") and r[c] is not None else
                         ("" if r[c] is None else r[c]) for c in COLUMNS])
    return buffer.getvalue()


def curve_xticks(xs: list[float], most: int = 12) -> list[float] | None:
    """The x-axis ticks of a learning curve: the measured epochs (or steps) themselves, sorted, when
    there are at most ``most`` of them, so a curve of whole epochs reads 1, 2, 3 and not 1.25, 1.5...;
    None (matplotlib's own ticks) for more points."""
    ticks = sorted(set(xs))
    return ticks if len(ticks) <= most else None


def plot_curve(rows: list[dict], out: str | os.PathLike, title: str = "") -> Path | None:
    """Accuracy (%) against epoch (or step, when an epoch is missing) per setting and metric, with
    the 95 % Wilson intervals as error bars, into ``out`` (PNG, written atomically); None when
    there are no rows."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use_epoch = all(r["epoch"] is not None for r in rows)
    metrics = [m for m in METRICS if any(r[f"{m}_accuracy"] is not None for r in rows)]  # a catalog: strict only
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), sharey=True, squeeze=False)
    axes = axes[0]
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    def x_of(row: dict) -> float:
        return row["epoch"] if use_epoch else row["step"]

    ticks = curve_xticks([x_of(r) for r in rows])
    for ax, metric in zip(axes, metrics):
        if ticks is not None:
            ax.set_xticks(ticks)
        for setting in settings:
            part = [r for r in rows if r["setting"] == setting and r[f"{metric}_accuracy"] is not None]
            x = [x_of(r) for r in part]
            y = [100 * r[f"{metric}_accuracy"] for r in part]
            err = [[100 * (r[f"{metric}_accuracy"] - r[f"{metric}_ci"][0]) for r in part],
                   [100 * (r[f"{metric}_ci"][1] - r[f"{metric}_accuracy"]) for r in part]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, lw=1.2, label=setting)
        ax.set_title(f"{metric} metric")
        ax.set_xlabel("epoch" if use_epoch else "optimizer step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("correct (%)")
    axes[-1].legend(title="test setting")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return Path(out)


def write_curve(out_dir: str | os.PathLike, rows: list[dict], *, run: str, hub: str) -> None:
    """Write curve.json, curve.csv, curve.md and curve.png into ``out_dir``."""
    out = Path(out_dir)
    write_json(out / "curve.json", {"run": run, "hub": hub, "rows": rows, "versions": package_versions()})
    write_text(out / "curve.csv", curve_csv(rows))
    write_text(out / "curve.md", curve_markdown(rows))
    plot_curve(rows, out / "curve.png", title=f"learning curve: {Path(run).name} ({hub})")


def curves_markdown(curves: dict[str, list[dict]]) -> str:
    """Several runs' curves (``{label: rows}``, e.g. one per sweep cell), one table each under its label."""
    return "\n".join(f"### {label}\n\n{curve_markdown(rows)}" for label, rows in curves.items())


def write_curves_report(curves: dict[str, list[dict]], out_dir: str | os.PathLike) -> None:
    """``learning_curve.{md,csv,png}`` in ``out_dir`` for several runs' curves (``{label: rows}``):
    the tables one per label, the CSV with a leading ``run`` column, and one panel per metric with
    a line per (run, setting)."""
    out = Path(out_dir)
    write_text(out / "learning_curve.md", curves_markdown(curves))
    buffer = io.StringIO()
    for number, (label, rows) in enumerate(curves.items()):
        lines = curve_csv(rows).splitlines()
        if number == 0:
            buffer.write(f"run,{lines[0]}\n")
        buffer.writelines(f"{label},{line}\n" for line in lines[1:])
    write_text(out / "learning_curve.csv", buffer.getvalue())
    labelled = [{**r, "setting": f"{label} {r['setting']}"} for label, rows in curves.items() for r in rows]
    plot_curve(labelled, out / "learning_curve.png", title="learning curves")
