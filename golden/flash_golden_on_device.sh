#!/usr/bin/env bash
# flash_golden_on_device.sh [--golden-only | --verify-only] [flash_golden_on_device.py options] - on the device
# machine: make the Flash-shaped golden (golden/flash_golden_on_device.py: real Flash widths, 4 layers, 16 experts,
# official FP8/FP4 weights, transformers fp32 golden of a 2100-token prompt + 8 decode steps) in $WORK (default
# /tmp/dsv4-flash, kept while the machine is warm), check the dump with the kit, then build dsv4 and verify its fp32
# GPU reference against it:
#   dsv4 run --model $WORK/flash --path ref-gpu --tokens-from $WORK/flash/forced.h5 --dump $WORK/ref-gpu.h5
#   dsv4 verify --profile fp32 $WORK/flash/forced.h5 $WORK/ref-gpu.h5
# Each step prints one "flash: STEP: ..." line with its time; the last line is "flash: PASS|FAILED ...". Returned in
# $OUT: forced.h5 (the golden dump, ~10 MB), config.json, arch.json, the logs, flash-verify.txt/.json; not the
# weights (~3.6 GB: regenerate them, bit for bit, with the same options and thread count).
#   device call (all at once, ~6-9 minutes):
#     command "bash golden/flash_golden_on_device.sh 2>&1 | tee $OUT/flash.log", carry [".debs"]
#   or in two calls on one warm machine: "... --golden-only" (no carry), then "... --verify-only" (carry [".debs"])
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
OUT=${OUT:-/tmp/flash-out}
WORK=${WORK:-/tmp/dsv4-flash}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
golden=1 verify=1
case ${1:-} in
--golden-only) verify=0; shift ;;
--verify-only) golden=0; shift ;;
esac
status=0
t_all=$SECONDS
say() { echo "flash: $*"; }

if [ $golden = 1 ]; then
    t0=$SECONDS
    # the golden runs on the CPU (fp32); the GPU is not used by it
    if CUDA_VISIBLE_DEVICES="" python3 golden/flash_golden_on_device.py --out "$WORK" --threads "$(nproc)" "$@" \
        >"$OUT/flash-golden.log" 2>&1; then
        say "golden: made in $((SECONDS - t0)) s: $(grep -m1 '== flash golden:' "$OUT/flash-golden.log" | cut -c1-400)"
        grep -E "^versions|parameters|model.safetensors:|dequantised|cached vs no-cache|entries visible|router, mHC" \
            "$OUT/flash-golden.log" | sed 's/^/    /'
    else
        say "golden: FAILED after $((SECONDS - t0)) s; the log's end:"
        tail -n 25 "$OUT/flash-golden.log" | sed 's/^/    /'
        exit 1
    fi
fi
G=$WORK/flash
[ -f "$G/forced.h5" ] || { say "no golden in $G (run without --verify-only first, on the same warm machine)"; exit 2; }
cp "$G/forced.h5" "$G/config.json" "$G/arch.json" "$OUT/" 2>/dev/null
if PYTHONPATH=python python3 -m dsv4dump check --complete "$G/forced.h5" >"$OUT/flash-check.txt" 2>&1; then
    say "dsv4dump check: $(tail -n 1 "$OUT/flash-check.txt")"
else
    say "dsv4dump check: FAILED"; sed 's/^/    /' "$OUT/flash-check.txt"; status=1
fi
[ $verify = 1 ] || { say "golden only: $((SECONDS - t_all)) s; verify later with --verify-only"; exit $status; }

t0=$SECONDS
export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || { say "build: no .debs carried (scripts/gpu-env.sh)"; exit 2; }
build=$root/build-gpu
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
        >"$OUT/flash-configure.log" 2>&1 ||
    ! cmake --build "$build" --target dsv4_cli -j"$(nproc)" >"$OUT/flash-build.log" 2>&1; then
    say "build: FAILED"; tail -n 30 "$OUT/flash-configure.log" "$OUT/flash-build.log"; exit 1
fi
say "build: $((SECONDS - t0)) s"
t0=$SECONDS
if "$build/dsv4" run --model "$G" --path ref-gpu --tokens-from "$G/forced.h5" --dump "$WORK/ref-gpu.h5" \
    >"$OUT/flash-ref-gpu.log" 2>&1; then
    say "ref-gpu: $((SECONDS - t0)) s ($(grep -m1 '^dump:' "$OUT/flash-ref-gpu.log"))"
else
    say "ref-gpu: FAILED after $((SECONDS - t0)) s"; tail -n 20 "$OUT/flash-ref-gpu.log" | sed 's/^/    /'; exit 1
fi
t0=$SECONDS
"$build/dsv4" verify --no-color --profile fp32 --json "$OUT/flash-verify.json" "$G/forced.h5" "$WORK/ref-gpu.h5" \
    >"$OUT/flash-verify.txt" 2>&1
vrc=$?
say "verify ($((SECONDS - t0)) s, exit $vrc): $(grep -m1 '^VERDICT' "$OUT/flash-verify.txt")"
grep -E "^compared|^first divergence|^  [a-z_]+ = |^logits|^top-k|^[0-9]+ +[0-9]+ +[01]\.|^only in" \
    "$OUT/flash-verify.txt" | sed 's/^/    /'
[ $vrc -eq 0 ] || status=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/    gpu: /'
if [ $status -eq 0 ]; then say "PASS in $((SECONDS - t_all)) s (golden $G, ref-gpu verified with --profile fp32)"
else say "FAILED in $((SECONDS - t_all)) s"; fi
exit $status
