#!/usr/bin/env bash
# run_on_device.sh - the whole throughput run on the GPU machine of the device tool, in one call: build the dsv4
# command (Check/jansson from the carried .debs, as scripts/gpu-test.sh does), `dsv4 bench`, the transformers peer
# at the matching shapes, and the report (Markdown table + SVG chart). Everything lands in $OUT (at most 8 files):
#   gpu.txt  run.log  bench.json  bench-fp8.json  peer.json  results.md  chart.svg  build.log
# Each part is time-boxed with `timeout` against one budget (BENCH_BUDGET_S, default 255 s from the start), so a
# hang costs only its own part; bench.json is rewritten after every variant, so a cut-short run keeps what ran.
#   device call: command "DSV4_COMMIT=<hash> bash bench/run_on_device.sh", carry [".debs"]
# Micro-benchmarks only (every bench/bench_*.cu, their tables into $OUT/ubench.md; the throughput run is skipped):
#   device call: command "DSV4_COMMIT=<hash> bash bench/run_on_device.sh ubench [--quick]", carry [".debs"]
#   (each bench time-boxed to UBENCH_EACH_S, default 150 s; BENCH_BUDGET_S default 420 s in this mode; exit 1
#   when a bench fails or one of its spot checks does)
# Knobs (environment): BENCH_ARGS (extra `dsv4 bench` options, for both runs: not --variants or --scaling, which
# the fp8 run sets, as dsv4 bench refuses a list option given twice), PEER_BATCH (default 1,64), PEER_CONTEXT
# (default 4096), PEER_RESERVE_S (seconds kept for the peer and the report, default 75), SKIP_PEER (non-empty:
# no peer run, e.g. when an earlier call measured it), SKIP_FP8 (non-empty: no `--weights fp8` run; else it gets
# FP8_BENCH_S seconds, default 60, all optimizations on, no scaling or baseline runs).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
mode=full
quick=
if [ "${1:-}" = ubench ]; then
  mode=ubench
  [ "${2:-}" = --quick ] && quick=--quick
elif [ $# -gt 0 ]; then
  echo "usage: $0 [ubench [--quick]]" >&2
  exit 2
fi
if [ $mode = ubench ]; then budget=${BENCH_BUDGET_S:-420}; else budget=${BENCH_BUDGET_S:-255}; fi
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
# `timeout 0` means no limit at all and a negative time is an error: a part whose box is under 10 s is not started
boxed() { # boxed SECONDS WHAT: true when SECONDS is a time box worth starting WHAT in, else says why not
  [ "$1" -ge 10 ] && return 0
  echo "run_on_device: $2 not started: a ${1}s time box (BENCH_BUDGET_S $budget)"
  return 1
}
exec > >(tee -a "$out/run.log") 2>&1
echo "run_on_device: $mode${quick:+ $quick}, budget ${budget}s, commit ${DSV4_COMMIT:-?}"

dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader |
    sed 's/^/nvidia-smi: /'
  nvcc --version | tail -n 2 | tr '\n' ' ' | sed 's/^/nvcc: /'
  echo
  [ $mode = full ] &&
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 |
    tail -n 1
} | tee "$out/gpu.txt"

# --- micro-benchmarks: build the bench_* targets (incremental in a build-gpu/ that gpu-test.sh left), run each
# time-boxed, one fenced table per bench in ubench.md
if [ $mode = ubench ]; then
  build=$root/build-gpu
  benches=$(cd "$root/bench" && ls bench_*.cu | sed 's/\.cu$//')
  cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
  [ -f "$build/CMakeCache.txt" ] && cfg=()
  echo "== build $(tr "\n" " " <<<"$benches")($(left)s left)"
  boxed $(($(left) - 60)) "the build" || exit 1
  # shellcheck disable=SC2086
  timeout $(($(left) - 60)) cmake -S "$root" -B "$build" "${cfg[@]}" >"$out/build.log" 2>&1 &&
    timeout $(($(left) - 50)) cmake --build "$build" --target $benches -j"$(nproc)" >>"$out/build.log" 2>&1
  rc=$?
  grep -E 'warning|error' "$out/build.log" | head -n 20
  [ $rc -eq 0 ] || { echo "run_on_device: build failed (rc $rc)"; tail -n 30 "$out/build.log"; exit 1; }
  md=$out/ubench.md
  {
    echo "# Kernel micro-benchmarks${quick:+ ($quick)}"
    echo
    echo "commit ${DSV4_COMMIT:-?}, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    sed 's/^/    /' "$out/gpu.txt"
    echo
    echo "Columns: bench/README.md. Each bench measures the copy and bf16-GEMM ceilings itself (first lines)."
  } >"$md"
  failed=0
  for b in $benches; do
    each=${UBENCH_EACH_S:-150}
    [ "$each" -gt $(($(left) - 5)) ] && each=$(($(left) - 5))
    if [ "$each" -lt 10 ]; then
      echo "== $b skipped (no time left)"
      printf '\n## %s\nskipped: no time left\n' "$b" >>"$md"
      failed=$((failed + 1))
      continue
    fi
    echo "== $b $quick (${each}s max, $(left)s left)"
    t1=$(date +%s)
    timeout --signal=TERM --kill-after=5 "$each" "$build/$b" $quick >"$out/$b.txt" 2>&1
    brc=$?
    cat "$out/$b.txt"
    {
      printf '\n## %s (exit %d, %ds)\n\n```\n' "$b" $brc $(($(date +%s) - t1))
      cat "$out/$b.txt"
      printf '```\n'
    } >>"$md"
    rm -f "$out/$b.txt"
    [ $brc -eq 0 ] || failed=$((failed + 1))
  done
  echo "run_on_device: ubench done in $(($(date +%s) - t0))s, $failed bench(es) failed; tables in $md"
  [ $failed -eq 0 ]
  exit
fi

# --- build: the dsv4 command only; a fresh build folder is configured Release for sm_90 alone, one left by
# scripts/gpu-test.sh on a warm machine is reused as configured (incremental)
build=$root/build-gpu
echo "== build ($(left)s left)"
cfg=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
[ -f "$build/CMakeCache.txt" ] && cfg=()
boxed $(($(left) - 120)) "the build" || exit 1
timeout $(($(left) - 120)) cmake -S "$root" -B "$build" "${cfg[@]}" >"$out/build.log" 2>&1 &&
  timeout $(($(left) - 110)) cmake --build "$build" --target dsv4_cli -j"$(nproc)" >>"$out/build.log" 2>&1
rc=$?
grep -E 'warning|error' "$out/build.log" | head -n 20
[ $rc -eq 0 ] || { echo "run_on_device: build failed (rc $rc)"; tail -n 30 "$out/build.log"; exit 1; }
echo "== built ($(left)s left)"

# --- dsv4 bench (bf16 weights: every variant), then the fp8-weights rows (all on) unless SKIP_FP8
reserve=${PEER_RESERVE_S:-75}
fp8_s=0
[ -n "${SKIP_FP8:-}" ] || fp8_s=${FP8_BENCH_S:-60}
bs=$(($(left) - reserve - fp8_s))
if boxed "$bs" "dsv4 bench (after the peer's ${reserve}s and the fp8 run's ${fp8_s}s)"; then
  echo "== dsv4 bench (${bs}s)"
  timeout --signal=TERM --kill-after=5 $bs "$build/dsv4" bench --json "$out/bench.json" ${BENCH_ARGS:-} \
    2> >(tee "$out/bench.stderr" >&2)
  echo "dsv4 bench exit $? ($(left)s left)"
fi
if [ "$fp8_s" -gt 0 ] && boxed "$fp8_s" "dsv4 bench --weights fp8"; then
  # as many layers as the bf16 run: left to --layers auto, the smaller fp8 weights fit more (9 against 5), and the
  # report would compare steps of different models
  layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["layers"])' "$out/bench.json" \
    2>/dev/null) || layers=auto
  echo "== dsv4 bench --weights fp8 --layers $layers (${fp8_s}s)"
  timeout --signal=TERM --kill-after=5 $fp8_s "$build/dsv4" bench --weights fp8 --variants all-on --scaling none \
    --no-baseline --layers "$layers" --json "$out/bench-fp8.json" ${BENCH_ARGS:-} \
    2> >(tee -a "$out/bench.stderr" >&2)
  echo "dsv4 bench --weights fp8 exit $? ($(left)s left)"
fi

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
  --bench-fp8 "$out/bench-fp8.json" --commit "${DSV4_COMMIT:-?}" --md "$out/results.md" --svg "$out/chart.svg"
rm -f "$out/bench.stderr"
[ -f "$out/results.md" ] && cat "$out/results.md"
echo "run_on_device: done in $(($(date +%s) - t0))s"
