#!/usr/bin/env bash
# serve_on_device.sh [BUDGET_S] - serving runs of the optimized path on the GPU machine (issue 37; docs/bench.md
# "Serving runs"), in one device call:
#   1. build dsv4 for sm_90 (build-serve/);
#   2. the seeds' table with bf16 weights: `dsv4 bench --serve --seeds-table` at C = $SERVE_C (default 1,16,64;
#      SERVE_BF16_TABLE=0: the defaults only);
#   3. the same with fp8 weights, the defaults only (unless SERVE_FP8_TABLE=1);
#   4. a fixed-length run of the defaults and transformers' peer on the same requests (bench/peers/
#      peer_serve_transformers.py --like);
# each step time-boxed by what the budget leaves, each printing its table; then one summary. Results (JSON, Markdown,
# SVG, logs) go to $OUT (default /tmp/serve-out), named as bench/results/ keeps them (serve-bf16.*, serve-fp8.*,
# serve-fixed.*, peer-serve.json), packed at the end into $OUT/serve-results.tgz. Workload knobs (environment):
# SERVE_C, SERVE_IN (default 1024:8192), SERVE_OUT (256:1024), SERVE_REQUESTS (default: the command's, max(8, 2C)),
# SERVE_WARMUP, SERVE_MAX_CONTEXT (1048576), SERVE_TABLE_MAX_CONTEXT (the seeds' tables; default SERVE_MAX_CONTEXT:
# "original" scores all 262,144 pool entries of a 1M context for every prompt row, so at 1M its prefills take
# minutes per concurrency and the whole table does not fit one device call; docs/bench.md),
# SERVE_BUDGET_TOKENS (8192), SERVE_FIXED_IN/OUT (1024/256), SERVE_PEER_C (1,16), SERVE_LAYERS (default: as many
# Flash-shaped layers as fit beside the caches of the largest C).
#   device call: command "bash scripts/serve_on_device.sh 540 2>&1 | tail -n 80", carry [".debs"]
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
budget=${1:-540}
OUT=${OUT:-/tmp/serve-out}
mkdir -p "$OUT"
t_start=$SECONDS
left() { echo $((budget - (SECONDS - t_start))); }
summary=()
status=0
export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || exit 2
build=$root/build-serve
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
        >"$OUT/configure.log" 2>&1 || ! cmake --build "$build" --target dsv4_cli -j"$(nproc)" >"$OUT/build.log" 2>&1
then
    tail -n 30 "$OUT/build.log"
    echo "serve_on_device.sh: the build failed"
    exit 2
fi
summary+=("build: $((SECONDS - t_start)) s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)")
common=(--concurrency "${SERVE_C:-1,16,64}" --token-budget "${SERVE_BUDGET_TOKENS:-8192}")
max_ctx=${SERVE_MAX_CONTEXT:-1048576}
[ -n "${SERVE_REQUESTS:-}" ] && common+=(--requests "$SERVE_REQUESTS")
[ -n "${SERVE_WARMUP:-}" ] && common+=(--warmup "$SERVE_WARMUP")
[ -n "${SERVE_LAYERS:-}" ] && common+=(--layers "$SERVE_LAYERS")

run() { # run NAME SHARE_S ARGS...: one dsv4 bench --serve, time-boxed
    local name=$1 share=$2
    shift 2
    if [ "$share" -lt 20 ]; then summary+=("$name: SKIPPED (budget)"); return; fi
    local t0=$SECONDS
    timeout "$share" "$build/dsv4" bench --serve "${common[@]}" "$@" --json "$OUT/$name.json" \
        --markdown "$OUT/$name.md" --svg "$OUT/$name.svg" >"$OUT/$name.out" 2>"$OUT/$name.log"
    local rc=$?
    [ $rc -eq 0 ] || status=1
    summary+=("$name: exit $rc in $((SECONDS - t0)) s ($OUT/$name.md)")
    [ -f "$OUT/$name.md" ] && summary+=("$(sed -n '3,$p' "$OUT/$name.md")")
    [ $rc -eq 0 ] || summary+=("$(tail -n 5 "$OUT/$name.log")")
}
bf16_table=(--seeds-table --max-context "${SERVE_TABLE_MAX_CONTEXT:-$max_ctx}")
[ "${SERVE_BF16_TABLE:-1}" = 0 ] && bf16_table=(--max-context "$max_ctx")
run serve-bf16 $(($(left) * 45 / 100)) "${bf16_table[@]}" --weights bf16 --input-len "${SERVE_IN:-1024:8192}" \
    --output-len "${SERVE_OUT:-256:1024}"
fp8_table=(--max-context "$max_ctx")
[ "${SERVE_FP8_TABLE:-0}" = 1 ] && fp8_table=(--seeds-table --max-context "${SERVE_TABLE_MAX_CONTEXT:-$max_ctx}")
run serve-fp8 $(($(left) * 45 / 100)) "${fp8_table[@]}" --weights fp8 --input-len "${SERVE_IN:-1024:8192}" \
    --output-len "${SERVE_OUT:-256:1024}"
run serve-fixed $(($(left) * 35 / 100)) --max-context "$max_ctx" --weights bf16 --input-len "${SERVE_FIXED_IN:-1024}" \
    --output-len "${SERVE_FIXED_OUT:-256}"
share=$(($(left) - 10))
if [ -f "$OUT/serve-fixed.json" ] && [ "$share" -gt 30 ]; then
    t0=$SECONDS
    timeout "$share" python3 bench/peers/peer_serve_transformers.py --like "$OUT/serve-fixed.json" \
        --json "$OUT/peer-serve.json" --concurrency "${SERVE_PEER_C:-1,16}" --deadline $((share - 30)) \
        >"$OUT/peer-serve.log" 2>&1
    rc=$?
    summary+=("peer (transformers): exit $rc in $((SECONDS - t0)) s: $(grep -E 'output tokens/s|FAILED' \
        "$OUT/peer-serve.log" | tr '\n' ';')")
else
    summary+=("peer (transformers): SKIPPED (no serve-fixed.json or no budget)")
fi
# one archive of every result and log: the device tool brings back only a few files of a call
(cd "$OUT" && tar czf serve-results.tgz -- *.json *.md *.svg *.log *.out 2>/dev/null &&
    rm -f -- *.json *.md *.svg *.out) && summary+=("results: $OUT/serve-results.tgz (JSON, Markdown, SVG, logs)")
echo "==================== serve_on_device.sh: summary ($((SECONDS - t_start)) s) ===================="
printf '%s\n' "${summary[@]}"
exit $status
