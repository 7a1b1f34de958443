"""Does a `make reproduce` run give the committed report's numbers? Compares every eval cell of a
sweep run of configs/sweeps/reproduce_torchhub.yaml (finished or not) with the cell of the same
arm, checkpoint and setting committed under docs/reproduction/, response by response.

    python docs/reproduction/scripts/check_reproduce.py [SWEEP_DIR] [--json]   # SWEEP_DIR: runs/reproduce/sweep

    python docs/reproduction/scripts/check_reproduce.py SWEEP_DIR --exact   # fail unless every text is equal

Run from the repository root. Prints one row per eval cell: the sweep's correct counts (gorilla
metric / strict), the committed cell's, how many of the 186 responses have the same text and, where
some differ, the exact McNemar p of each metric on the same questions (ratune.eval.stats). A cell's
status is `same` (every response text equal), `close` (some texts differ, but neither metric's
paired difference is significant: p >= ALPHA for both), `differs` (p < ALPHA for one of them),
`new` (nothing committed for it: the sweep adds it) or `not run yet`. Exits 1 when any cell
differs (with --exact: differs or is close), else 0. fp32 training on another processor gives
other bits, and a few answers of a model trained for epochs can change with them
(docs/reproduction/README.md, "make reproduce from a fresh clone"); `close` is a reproduction of
the numbers, `same` one of the bits. The arms were committed one at a time
(docs/reproduction/README.md), so the committed counterpart of a sweep cell is found through
SWEEP_ARMS in arms.py."""
import argparse
import json
import sys
from pathlib import Path

from ratune.errors import RatuneError
from ratune.eval.curve import step_folder
from ratune.eval.stats import mcnemar_exact
from ratune.io import iter_jsonl, read_json
from ratune.manifest import is_complete
from ratune.sweep.schema import SAVED_SWEEP_FILE, Sweep, load_saved_sweep
from ratune.train.layout import trainer_checkpoints

from arms import DOCS, SWEEP_ARMS

FINAL = "final"
#: A differing cell is `close` when both metrics' paired McNemar p are at least this.
ALPHA = 0.05
METRICS = ("gorilla", "strict")


def responses(cell: Path) -> dict[int, str]:
    """question_id -> response text of an eval cell folder (its responses.jsonl)."""
    return {obj["question_id"]: obj["text"] for _, obj in iter_jsonl(cell / "responses.jsonl")}


def counts(cell: Path) -> tuple[int, int]:
    """(gorilla metric correct, strict correct) from the cell's metrics.json."""
    metrics = read_json(cell / "metrics.json")
    return metrics["gorilla"]["correct_n"], metrics["strict"]["correct_n"]


def paired_p(ours: Path, theirs: Path) -> dict[str, float]:
    """``{metric: exact McNemar p}`` for METRICS between two cells, from their metrics.json
    ``per_question`` outcomes (a question is right when its outcome is ``"correct"``) on the
    questions both answered.

    Raises:
        KeyError: a cell's metrics.json has no ``per_question`` list.
    """
    a, b = ({r["question_id"]: r for r in read_json(c / "metrics.json")["per_question"]} for c in (ours, theirs))
    out = {}
    for metric in METRICS:
        pairs = [(a[q][metric] == "correct", b[q][metric] == "correct") for q in a.keys() & b.keys()]
        out[metric] = mcnemar_exact(sum(x and not y for x, y in pairs), sum(y and not x for x, y in pairs))
    return out


def committed(arm: str, point: str | int, setting: str, last_step: int | None, docs: Path = DOCS) -> Path | None:
    """The committed cell of sweep arm ``arm`` at ``point`` (FINAL: the trained model; an int: the
    checkpoint of that optimizer step) under ``setting``, or None. The final model is also the
    checkpoint of the last step (``last_step``), so either names the same cell."""
    folders = SWEEP_ARMS[arm]
    is_final = point in (FINAL, last_step)
    steps = [s for s in (point, last_step if point == FINAL else None) if isinstance(s, int)]
    candidates = [docs / folders[FINAL] / setting] if is_final and FINAL in folders else []
    candidates += [docs / folders[FINAL] / f"curve_step{s}" / setting for s in steps if FINAL in folders]
    candidates += [docs / folders[s] / setting for s in steps if s in folders]
    return next((c for c in candidates if (c / "responses.jsonl").is_file()), None)


def sweep_cells(sweep: Sweep):
    """Yield (arm, point, setting, folder, last step) for every eval cell the saved sweep file asks
    for, run or not: the final model's settings, and the curve's settings at every Trainer checkpoint
    the arm's training run has saved so far (train/layout.py ``trainer_checkpoints``); an arm whose
    cell folder does not exist yet gets its final settings only, with folder None. The last step is
    None until the training run is complete."""
    sweep_dir, settings, curve_settings = sweep.out_dir, sweep.config.eval.settings, sweep.config.eval.curve_settings
    seen = set()
    for cell in sorted((sweep_dir / "cells").glob("*/cell.json")):
        arm = read_json(cell)["axes"]["train_retriever"]
        seen.add(arm)
        root = cell.parent
        train = root / "train"  # its checkpoints so far are the curve's points, evaluated or not
        steps = [c.step for c in trainer_checkpoints(train)] if (train / "manifest.json").is_file() else []
        last = steps[-1] if steps and is_complete(train) else None  # the final model's step, once trained
        for setting in settings:
            yield arm, FINAL, setting, root / "eval" / setting, last
        for step in steps:
            for setting in curve_settings:
                yield arm, step, setting, step_folder(root / "curve", step) / setting, last
    for arm in sweep.config.axes.get("train_retriever", []):
        if arm not in seen:
            for setting in settings:
                yield arm, FINAL, setting, None, None


def check(sweep_dir: Path, docs: Path = DOCS) -> list[dict]:
    """One record per eval cell of the sweep in ``sweep_dir`` (its sweep.yaml names the settings).

    Raises:
        RatuneError: ``sweep_dir`` has no saved sweep file (not a sweep folder) or it does not
            validate (ratune.sweep.schema.load_saved_sweep).
        KeyError: for an arm that SWEEP_ARMS does not name.
    """
    sweep = load_saved_sweep(sweep_dir)
    if sweep is None:
        raise RatuneError(f"{sweep_dir}: no {SAVED_SWEEP_FILE}; not a folder a sweep ran in")
    rows = []
    for arm, point, setting, folder, last in sweep_cells(sweep):
        ours = folder if folder is not None and (folder / "metrics.json").is_file() else None
        theirs = committed(arm, point, setting, last, docs)
        row = {"arm": arm, "checkpoint": point if point == FINAL else f"step{point}", "setting": setting,
               "sweep": list(counts(ours)) if ours else None,
               "committed": list(counts(theirs)) if theirs else None,
               "committed_cell": str(theirs) if theirs else None, "same_texts": None, "n": None, "p": None}
        if ours and theirs:
            a, b = responses(ours), responses(theirs)
            row["n"] = len(a.keys() | b.keys())
            row["same_texts"] = sum(a.get(q) == b.get(q) for q in a.keys() | b.keys())
            if row["same_texts"] == row["n"]:
                row["status"] = "same"
            else:
                row["p"] = paired_p(ours, theirs)
                row["status"] = "close" if min(row["p"].values()) >= ALPHA else "differs"
        else:
            row["status"] = "not run yet" if not ours else "new"
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The records as a markdown table."""
    fmt = lambda c: f"{c[0]} / {c[1]}" if c else "-"
    same = lambda r: "-" if r["n"] is None else f"{r['same_texts']} / {r['n']}"
    paired = lambda r: "-" if r["p"] is None else " / ".join(f"{r['p'][m]:.2g}" for m in METRICS)
    lines = ["| arm | checkpoint | setting | sweep (gorilla / strict) | committed | same texts | McNemar p "
             "(gorilla / strict) | status |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['checkpoint']} | {r['setting']} | {fmt(r['sweep'])} | {fmt(r['committed'])} | "
              f"{same(r)} | {paired(r)} | {r['status']} |" for r in rows]
    tally = {s: sum(r["status"] == s for r in rows) for s in ("same", "close", "differs", "new", "not run yet")}
    return "\n".join(lines + ["", ", ".join(f"{v} {k}" for k, v in tally.items())])


def main(argv=None, docs: Path = DOCS) -> int:
    """The command line; ``docs``: the committed cells' folder. Returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", nargs="?", default="runs/reproduce/sweep", type=Path)
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    parser.add_argument("--exact", action="store_true",
                        help="exit 1 unless every cell run so far has the committed texts (a `close` cell fails too)")
    args = parser.parse_args(argv)
    rows = check(args.sweep_dir, docs)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    failing = {"differs", "close"} if args.exact else {"differs"}
    return 1 if any(r["status"] in failing for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
