"""Worst cell across the five retrieval settings (0_shot, released_bm25, gpt_index, dense_ft, oracle)
per model that has all five (both metrics); each mixture arm's worst cell paired against every other
model's worst cell. Run from the repository root after arm_comparisons.py has copied the cells."""
import json
from pathlib import Path
from ratune.data.apibench import released_responses_path, resolve_apibench_dir
from ratune.eval.compare import compare_files
from ratune.eval.scoring import Scorer, load_responses

apibench = resolve_apibench_dir(None)
scorer = Scorer.from_apibench("torchhub", apibench)
FIVE = ("0_shot", "released_bm25", "gpt_index", "dense_ft", "oracle")
RELEASED = {"0_shot": "0_shot", "released_bm25": "bm25", "gpt_index": "gpt_index", "oracle": "oracle"}
models = {}
ARMS = (("mix", "mixture arm, epoch 1"), ("none", "none arm, epoch 3"), ("oracle", "oracle arm, epoch 1"),
        ("mix_full", "mixture arm, full finetuning, epoch 2"), ("none_full", "none arm, full finetuning, epoch 2"))
for arm, label in ARMS:
    files = {s: Path("docs/reproduction") / arm / s / "responses.jsonl" for s in FIVE}
    if all(f.exists() for f in files.values()):  # a worst case over fewer settings would not compare
        models[label] = files
    else:
        print(f"{label}: left out, lacks {', '.join(s for s, f in files.items() if not f.exists())}")
for model in ("FT", "RT"):  # released: four settings, no dense_ft
    models[f"released Gorilla-7B {model}"] = {s: released_responses_path(apibench, "torchhub", model, r)
                                              for s, r in RELEASED.items()}
counts = {}
for label, files in models.items():
    counts[label] = {}
    for s, f in files.items():
        score = scorer.score(load_responses(f, scorer.n_questions))
        counts[label][s] = {m: score[m]["correct_n"] for m in ("gorilla", "strict")}
out = {"settings": FIVE, "models": {}, "mixture_vs": []}
lines = ["| model | settings | worst gorilla (setting) | worst strict (setting) |", "|---|---|---|---|"]
worst = {}
for label, c in counts.items():
    worst[label] = {}
    for m in ("gorilla", "strict"):
        s = min(c, key=lambda k: (c[k][m], k))
        worst[label][m] = (s, c[s][m])
    out["models"][label] = {"counts": c, "worst": worst[label]}
    lines.append(f"| {label} | {', '.join(c)} | {worst[label]['gorilla'][1]} ({worst[label]['gorilla'][0]}) | "
                 f"{worst[label]['strict'][1]} ({worst[label]['strict'][0]}) |")
for mix in [label for label in models if label.startswith("mixture")]:
    lines += ["", f"The {mix}'s worst cell against each other model's worst cell (paired on the 186 questions):", "",
              "| metric | mixture worst | other model | its worst | only mixture | only other | McNemar p | difference (points) [95 % CI] |",
              "|---|---|---|---|---|---|---|---|"]
    for m in ("gorilla", "strict"):
        ms, mn = worst[mix][m]
        for label in counts:
            if label == mix:
                continue
            os_, on = worst[label][m]
            r = compare_files(models[mix][ms], models[label][os_], hub="torchhub", metric=m, scorer=scorer)
            t, d = r["contingency"], r["difference"]
            out["mixture_vs"].append({"mixture_model": mix, "metric": m, "mixture": [ms, mn], "other": label,
                                      "other_worst": [os_, on], "contingency": t, "mcnemar_p": r["mcnemar_p"],
                                      "difference": d})
            lines.append(f"| {m} | {mn} ({ms}) | {label} | {on} ({os_}) | {t['only_a']} | {t['only_b']} | {r['mcnemar_p']:.3g} | "
                         f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
Path("docs/reproduction/worst_case.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
Path("docs/reproduction/worst_case.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
