"""Copy finished reproduction cells into docs/reproduction/ARM/ and write the comparisons:
same-setting released comparisons, our retrieved cells vs the released models' best retrieved cell
(gpt_index), each mixture arm against the pure arms (MIXTURE_VS) and the full-finetuning none arm against the LoRA one,
setting by setting. An arm whose runs/ folders are gone is read from the cells already copied.
Run from the repository root: python docs/reproduction/scripts/arm_comparisons.py ARM..."""
import json, shutil, sys
from pathlib import Path
from ratune.eval.compare import compare_files, released_comparisons, released_markdown
from ratune.data.apibench import released_responses_path, resolve_apibench_dir
from ratune.eval.scoring import Scorer

apibench = resolve_apibench_dir(None)
scorer = Scorer.from_apibench("torchhub", apibench)
ARMS = {"oracle": ("oracle arm, epoch 1", "runs/repro/eval_oracle_step105"),
        "mix": ("mixture arm, epoch 1", "runs/repro/eval_mix_step105"),
        "none": ("none arm, epoch 3", "runs/repro/eval_none_final", "runs/repro/curve_none/step315"),
        "none_full": ("none arm, full finetuning, epoch 2", "runs/repro/eval_none_full_step210",
                      "runs/repro/curve_none_full/step210"),
        "mix_full": ("mixture arm, full finetuning, epoch 2", "runs/repro/eval_mix_full_step210"),
        "none_full3": ("none arm, full finetuning, epoch 3", "runs/repro/none_full3/cells/train_retriever-none-54af93f8/eval",
                       "runs/repro/none_full3_more"),
        "mix_bm25_full3": ("robust_bm25 mixture arm, full finetuning, epoch 3",
                           "runs/repro/mix_bm25_full3/cells/train_retriever-mix-robust-bm25-85a312b4/eval",
                           "runs/repro/mix_bm25_full3_more")}
#: each mixture arm against these arms, setting by setting
MIXTURE_VS = {"mix": ("none", "oracle"), "mix_full": ("none_full", "oracle", "mix"),
              "mix_bm25_full3": ("none_full3", "oracle", "mix_full")}
RETRIEVED = ("bm25", "dense", "dense_ft")
FILES = ("metrics.json", "identity.json", "responses.jsonl")


def record(label, cell):
    """The cell as ratune.eval.compare's released_comparisons takes it (cell = a folder with metrics.json)."""
    m = json.loads((cell / "metrics.json").read_text())
    return {"cell": label, "path": cell, "setting": cell.name, "hub": "torchhub", "n": m["n"], "metrics": m}


def cells_of(arm):
    label, *srcs = ARMS[arm]
    dst = Path("docs/reproduction") / arm
    out = {}
    if not any(Path(src).is_dir() for src in srcs):  # runs/ is gone: the cells already copied here
        for cell in sorted(c for c in dst.iterdir() if (c / "metrics.json").exists()):
            out[cell.name] = record(label, cell)
        return label, dst, out
    for cell in sorted(c for src in srcs if Path(src).is_dir() for c in Path(src).iterdir() if c.is_dir()):
        if cell.name in out:
            continue
        if not (cell / ".complete").exists():
            continue
        (dst / cell.name).mkdir(parents=True, exist_ok=True)
        for f in FILES:
            shutil.copyfile(cell / f, dst / cell.name / f)
        out[cell.name] = record(label, dst / cell.name)
    return label, dst, out


def row(r, label, setting, released):
    r = dict(r); r["cell"] = label; r["setting"] = setting; r["released"] = released
    r["a"]["path"] = str(r["a"]["path"]); r["b"]["path"] = str(r["b"]["path"])
    return r


summary = {}
for arm in [a for a in sys.argv[1:]]:
    label, dst, cells = cells_of(arm)
    results, skipped = released_comparisons(list(cells.values()))
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
                        pairs.append(row(r, label, s, ARMS[other][0]))
        doc["vs_pure_arms"] = pairs
        md += "\nThe mixture arm against the pure arms, setting by setting (\"released\" column: the other arm):\n\n" + released_markdown(pairs)
    if arm == "none_full":  # full finetuning against the LoRA none arm, setting by setting
        _, _, lora = cells_of("none")
        pairs = [row(compare_files(cells[s]["path"], lora[s]["path"], hub="torchhub", metric=metric, scorer=scorer),
                     label, s, ARMS["none"][0])
                 for s in cells if s in lora for metric in ("gorilla", "strict")]
        doc["vs_lora_none_arm"] = pairs
        md += "\nFull finetuning against the LoRA none arm (\"released\" column: the LoRA arm):\n\n" + released_markdown(pairs)
    (dst / "comparisons.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    (dst / "comparisons.md").write_text(md)
    summary[arm] = {s: (c["metrics"]["gorilla"]["correct_n"], c["metrics"]["strict"]["correct_n"],
                        c["metrics"]["strict"]["hallucination_n"]) for s, c in cells.items() if "gorilla" in c["metrics"]}
    print(arm, summary[arm])
json.dump(summary, open("/tmp/repro_summary.json", "w"), indent=1)
