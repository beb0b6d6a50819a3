#!/usr/bin/env bash
# run_on_device.sh - the whole throughput run on the GPU machine of the device tool, in one call: build the dsv4
# command (Check/jansson from the carried .debs, as scripts/gpu-test.sh does), `dsv4 bench`, the transformers peer
# at the matching shapes, and the report (Markdown table + SVG chart). Everything lands in $OUT (at most 8 files):
#   gpu.txt  run.log  bench.json  peer.json  results.md  chart.svg  build.log
# Each part is time-boxed with `timeout` against one budget (BENCH_BUDGET_S, default 255 s from the start), so a
# hang costs only its own part; bench.json is rewritten after every variant, so a cut-short run keeps what ran.
#   device call: command "DSV4_COMMIT=<hash> bash bench/run_on_device.sh", carry [".debs"]
# Knobs (environment): BENCH_ARGS (extra `dsv4 bench` options), PEER_BATCH (default 1,64), PEER_CONTEXT
# (default 4096), PEER_RESERVE_S (seconds kept for the peer and the report, default 75), SKIP_PEER (non-empty:
# no peer run, e.g. when an earlier call measured it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
budget=${BENCH_BUDGET_S:-255}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
exec > >(tee -a "$out/run.log") 2>&1
echo "run_on_device: budget ${budget}s, commit ${DSV4_COMMIT:-?}"

dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader |
    sed 's/^/nvidia-smi: /'
  nvcc --version | tail -n 2 | tr '\n' ' ' | sed 's/^/nvcc: /'
  echo
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 |
    tail -n 1
} | tee "$out/gpu.txt"

# --- build: the dsv4 command only; a fresh build folder is configured Release for sm_90 alone, one left by
# scripts/gpu-test.sh on a warm machine is reused as configured (incremental)
build=$root/build-gpu
echo "== build ($(left)s left)"
cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
[ -f "$build/CMakeCache.txt" ] && cfg=()
timeout $(($(left) - 120)) cmake -S "$root" -B "$build" "${cfg[@]}" >"$out/build.log" 2>&1 &&
  timeout $(($(left) - 110)) cmake --build "$build" --target dsv4_cli -j"$(nproc)" >>"$out/build.log" 2>&1
rc=$?
grep -E 'warning|error' "$out/build.log" | head -n 20
[ $rc -eq 0 ] || { echo "run_on_device: build failed (rc $rc)"; tail -n 30 "$out/build.log"; exit 1; }
echo "== built ($(left)s left)"

# --- dsv4 bench
reserve=${PEER_RESERVE_S:-75}
bs=$(($(left) - reserve))
echo "== dsv4 bench (${bs}s)"
timeout --signal=TERM --kill-after=5 $bs "$build/dsv4" bench --json "$out/bench.json" ${BENCH_ARGS:-} \
  2> >(tee "$out/bench.stderr" >&2)
echo "dsv4 bench exit $? ($(left)s left)"

# --- the peer, at the shapes of the bench run
ps=$(($(left) - 12))
if [ -n "${SKIP_PEER:-}" ]; then
  echo "== peer skipped (SKIP_PEER set)"
elif [ -f "$out/bench.json" ] && [ $ps -gt 20 ]; then
  echo "== transformers peer (${ps}s)"
  PYTHONUNBUFFERED=1 timeout --signal=TERM --kill-after=5 $ps python3 "$root/bench/peers/peer_transformers.py" \
    --like "$out/bench.json" --batch "${PEER_BATCH:-1,64}" --context "${PEER_CONTEXT:-4096}" \
    --deadline $((ps - 25)) --json "$out/peer.json"
  echo "peer exit $? ($(left)s left)"
else
  echo "== peer skipped (no bench.json or no time left)"
fi

# --- report
timeout 20 python3 "$root/bench/report.py" --bench "$out/bench.json" --peer "$out/peer.json" --meta "$out/gpu.txt" \
  --commit "${DSV4_COMMIT:-?}" --md "$out/results.md" --svg "$out/chart.svg"
rm -f "$out/bench.stderr"
[ -f "$out/results.md" ] && cat "$out/results.md"
echo "run_on_device: done in $(($(date +%s) - t0))s"
