"""Training curves: a run's loss and learning rate against the optimizer step, drawn from the
Trainer's log history into ``training_curves.png``."""

from __future__ import annotations

import os
from pathlib import Path

from ratune.io import atomic_write


def curve_points(log_history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "learning_rate": [...]}`` from a Trainer log history's per-step
    training logs (entries with ``loss``); steps are optimizer steps."""
    points: dict[str, list[tuple[int, float]]] = {"loss": [], "learning_rate": []}
    for entry in log_history:
        if "loss" not in entry or "step" not in entry:
            continue
        for key in points:
            if key in entry:
                points[key].append((int(entry["step"]), float(entry[key])))
    return points


def plot_training_curves(log_history: list[dict], out: str | os.PathLike, title: str = "") -> Path | None:
    """Draw loss and learning rate against the optimizer step into the PNG ``out``, atomically; returns
    ``out``, or None (nothing written) when the history holds no training log."""
    points = curve_points(log_history)
    if not points["loss"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True)
    steps, loss = zip(*points["loss"])
    top.plot(steps, loss, marker="o" if len(steps) < 30 else None, lw=1.2)
    top.set_ylabel("training loss")
    top.grid(alpha=0.3)
    if points["learning_rate"]:
        lr_steps, lr = zip(*points["learning_rate"])
        bottom.plot(lr_steps, lr, color="tab:orange", lw=1.2)
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("optimizer step")
    bottom.grid(alpha=0.3)
    if title:
        top.set_title(title)
    fig.tight_layout()
    out = Path(out)
    with atomic_write(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out
