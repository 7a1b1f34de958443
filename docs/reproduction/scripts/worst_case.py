"""Worst cell per model across the retrieval settings (both metrics), over two sets of settings:
the four with a released Gorilla-7B counterpart (0_shot, released_bm25, gpt_index, oracle), which
every model has, and those four plus our dense_ft, for the models that have all five. Each mixture
arm's worst cell is paired against every other model's worst cell (McNemar and the paired bootstrap
interval, ratune.eval.compare). Run from the repository root after the arms' cells are copied into
docs/reproduction/ARM/SETTING/responses.jsonl; writes worst_case.json and worst_case.md there."""
import json
from ratune.sources.apibench import released_responses_path, resolve_apibench_dir
from ratune.eval.compare import compare_files
from ratune.eval.scoring import Scorer, load_responses

from arms import ARMS, DOCS, MIXTURE_VS, label as label_of

apibench = resolve_apibench_dir(None)
scorer = Scorer.from_apibench("torchhub", apibench)
FOUR = ("0_shot", "released_bm25", "gpt_index", "oracle")
SETS = {"four": FOUR, "five": FOUR + ("dense_ft",)}
MIXTURES = {label_of(arm) for arm in MIXTURE_VS}  # the arms paired against every other model
RELEASED = {"0_shot": "0_shot", "released_bm25": "bm25", "gpt_index": "gpt_index", "oracle": "oracle"}
files = {}
for arm in ARMS:
    label = label_of(arm)
    found = {s: DOCS / arm / s / "responses.jsonl" for s in SETS["five"]}
    files[label] = {s: f for s, f in found.items() if f.exists()}
for model in ("FT", "RT"):  # released: four settings, no dense_ft
    files[f"released Gorilla-7B {model}"] = {s: released_responses_path(apibench, "torchhub", model, r)
                                             for s, r in RELEASED.items()}


def correct_counts(path) -> dict[str, int]:
    """{"gorilla": correct, "strict": correct} of one response file, scored once."""
    scores = scorer.score(load_responses(path, scorer.n_questions))
    return {m: scores[m]["correct_n"] for m in ("gorilla", "strict")}


counts = {label: {s: correct_counts(f) for s, f in fs.items()} for label, fs in files.items()}
out, lines = {}, []
for name, settings in SETS.items():
    models = [label for label in files if all(s in files[label] for s in settings)]
    left = [label for label in files if label not in models]
    worst = {label: {m: min(((counts[label][s][m], s) for s in settings)) for m in ("gorilla", "strict")}
             for label in models}
    out[name] = {"settings": settings, "left_out": left, "models": {}, "mixture_vs": []}
    lines += [f"## Worst cell over {', '.join(settings)}", ""]
    if left:
        lines += [f"Left out (lack a setting): {', '.join(left)}.", ""]
    lines += ["| model | worst gorilla (setting) | worst strict (setting) |", "|---|---|---|"]
    for label in models:
        out[name]["models"][label] = {"counts": {s: counts[label][s] for s in settings},
                                      "worst": {m: [s, n] for m, (n, s) in worst[label].items()}}
        g, s_ = worst[label]["gorilla"], worst[label]["strict"]
        lines.append(f"| {label} | {g[0]} ({g[1]}) | {s_[0]} ({s_[1]}) |")
    for mix in [label for label in models if label in MIXTURES]:
        lines += ["", f"The {mix}'s worst cell against each other model's worst cell (paired on the 186 questions):", "",
                  "| metric | mixture worst | other model | its worst | only mixture | only other | McNemar p | difference (points) [95 % CI] |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in ("gorilla", "strict"):
            mn, ms = worst[mix][m]
            for label in models:
                if label == mix:
                    continue
                on, os_ = worst[label][m]
                r = compare_files(files[mix][ms], files[label][os_], hub="torchhub", metric=m, scorer=scorer)
                t, d = r["contingency"], r["difference"]
                out[name]["mixture_vs"].append({"mixture_model": mix, "metric": m, "mixture": [ms, mn], "other": label,
                                                "other_worst": [os_, on], "contingency": t,
                                                "mcnemar_p": r["mcnemar_p"], "difference": d})
                lines.append(f"| {m} | {mn} ({ms}) | {label} | {on} ({os_}) | {t['only_a']} | {t['only_b']} | "
                             f"{r['mcnemar_p']:.3g} | {100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")
    lines.append("")
(DOCS / "worst_case.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
(DOCS / "worst_case.md").write_text("\n".join(lines))
print("\n".join(lines))
