"""Copy finished reproduction cells into docs/reproduction/ARM/ and write the comparisons:
same-setting released comparisons, our retrieved cells vs the released models' best retrieved cell
(gpt_index), each mixture arm against the pure arms (MIXTURE_VS) and the pairs VS names (full finetuning against LoRA
for the none and oracle arms, later epochs against earlier ones),
setting by setting. The cells already copied count too, so runs/ need hold only new cells.
Run from the repository root: python docs/reproduction/scripts/arm_comparisons.py ARM..."""
import json, os, shutil, sys
from pathlib import Path
from ratune.eval.compare import compare_files, released_comparisons, released_markdown
from ratune.sources.apibench import released_responses_path, resolve_apibench_dir
from ratune.eval.scoring import Scorer

from arms import DOCS, MIXTURE_VS, VS, label as label_of, sources

apibench = Path(os.path.relpath(resolve_apibench_dir(None)))  # relative: the committed files name no machine's paths
scorer = Scorer.from_apibench("torchhub", apibench)
RETRIEVED = ("bm25", "dense", "dense_ft")
FILES = ("metrics.json", "identity.json", "responses.jsonl")


def record(label, cell):
    """The cell as ratune.eval.compare's released_comparisons takes it (cell = a folder with metrics.json)."""
    m = json.loads((cell / "metrics.json").read_text())
    return {"cell": label, "path": cell, "setting": cell.name, "hub": "torchhub", "n": m["n"], "metrics": m}


def cells_of(arm):
    """The arm's eval cells: those already copied into docs/reproduction/ARM/, and every finished cell
    of its runs/ folders copied there (over a copied cell of the same setting: a rerun replaces it)."""
    label, dst = label_of(arm), DOCS / arm
    out = {c.name: record(label, c) for c in dst.iterdir() if (c / "metrics.json").exists()} if dst.is_dir() else {}
    copied = set()
    for cell in sorted(c for src in sources(arm) for c in src.iterdir() if c.is_dir()):
        if cell.name in copied or not (cell / ".complete").exists():
            continue
        copied.add(cell.name)
        (dst / cell.name).mkdir(parents=True, exist_ok=True)
        for f in FILES:
            shutil.copyfile(cell / f, dst / cell.name / f)
        out[cell.name] = record(label, dst / cell.name)
    return label, dst, dict(sorted(out.items()))


def row(r, label, setting, released):
    r = dict(r); r["cell"] = label; r["setting"] = setting; r["released"] = released
    r["a"]["path"] = str(r["a"]["path"]); r["b"]["path"] = str(r["b"]["path"])
    return r


summary = {}
for arm in [a for a in sys.argv[1:]]:
    label, dst, cells = cells_of(arm)
    results, skipped = released_comparisons(list(cells.values()), apibench)
    for r in results:
        r["a"]["path"] = str(r["a"].get("path", ""))
    best = []  # our retrieved cells vs each released model's gpt_index cell (their best retrieved, strict 17)
    for s in RETRIEVED:
        if s in cells:
            for model in ("RT", "FT"):
                for metric in ("gorilla", "strict"):
                    r = compare_files(cells[s]["path"], released_responses_path(apibench, "torchhub", model, "gpt_index"),
                                      hub="torchhub", metric=metric, scorer=scorer)
                    best.append(row(r, label, f"{s} vs released gpt_index", model))
    doc = {"comparisons": results, "skipped": skipped, "vs_released_best_retrieved": best}
    md = released_markdown(results)
    if best:
        md += "\nOur retrieved cells against each released model's gpt_index cell (its best retrieved cell):\n\n" + released_markdown(best)
    if arm in MIXTURE_VS:
        pairs = []
        for other in MIXTURE_VS[arm]:
            _, _, ocells = cells_of(other)
            for s in cells:
                if s in ocells and s not in ("swap", "irrelevant"):
                    for metric in ("gorilla", "strict"):
                        r = compare_files(cells[s]["path"], ocells[s]["path"], hub="torchhub", metric=metric, scorer=scorer)
                        pairs.append(row(r, label, s, label_of(other)))
        doc["vs_pure_arms"] = pairs
        md += "\nThe mixture arm against the pure arms, setting by setting (\"released\" column: the other arm):\n\n" + released_markdown(pairs)
    if arm in VS:  # one more arm, setting by setting
        other, key, heading = VS[arm]
        _, _, ocells = cells_of(other)
        pairs = [row(compare_files(cells[s]["path"], ocells[s]["path"], hub="torchhub", metric=metric, scorer=scorer),
                     label, s, label_of(other))
                 for s in cells if s in ocells for metric in ("gorilla", "strict")]
        doc[key] = pairs
        md += f"\n{heading} (\"released\" column: {label_of(other)}):\n\n" + released_markdown(pairs)
    (dst / "comparisons.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    (dst / "comparisons.md").write_text(md)
    summary[arm] = {s: (c["metrics"]["gorilla"]["correct_n"], c["metrics"]["strict"]["correct_n"],
                        c["metrics"]["strict"]["hallucination_n"]) for s, c in cells.items() if "gorilla" in c["metrics"]}
    print(arm, summary[arm])
json.dump(summary, open("/tmp/repro_summary.json", "w"), indent=1)
