#!/usr/bin/env bash
# baseline_on_device.sh SEEDS [MODEL_DIR...] - the GPU part of docs/verify.md "Baseline mode", on the device machine:
# make the drawn-architecture models random-S for SEEDS with transformers (golden/make_golden.py --random-arch, on
# the CPU in fp32; "-" makes none), build dsv4, run the optimized path on every model (those and the MODEL_DIRs) with
# the defaults and each naive variant, following the golden, and judge each dump with `dsv4 verify --baseline`
# against the CPU reference's bf16 emulation (scripts/baseline_eval.sh -c -), next to the fixed bf16 profile.
# Prints the RESULT lines and the summary table; logs and the dumps' verdicts go to $OUT.
#   device call: command "bash scripts/baseline_on_device.sh 101-104,106-112 2>&1 | tee $OUT/baseline.log",
#                carry [".debs"]
# Exit status: 0 when every optimized-path dump passes, 1 otherwise, 2 when something could not run.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
seeds=${1:?usage: baseline_on_device.sh SEEDS [MODEL_DIR...]}
shift
OUT=${OUT:-/tmp/baseline-out}
work=/tmp/dsv4-baseline
rm -rf "$work"
mkdir -p "$OUT" "$work/models" "$work/opt" "$work/logs"
models=("$@")
if [ "$seeds" != - ]; then
    list=$(python3 -c 'import sys; sys.path.insert(0, "golden"); import make_golden as m; print(*m.parse_seeds(sys.argv[1]))' \
        "$seeds") || exit 2
    t0=$SECONDS
    # shellcheck disable=SC2086 # one seed a line
    printf '%s\n' $list | xargs -P 8 -I{} sh -c \
        'CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 python3 golden/make_golden.py --random-arch {} --out '"$work/models"' >'"$work/logs"'/make-{}.log 2>&1'
    echo "=== models made in $((SECONDS - t0)) s"
    for s in $list; do
        if [ -d "$work/models/random-$s" ]; then
            models+=("$work/models/random-$s")
            grep -m1 "random-$s: layers" "$work/logs/make-$s.log"
        else
            echo "random-$s: not made (make_golden.py's checks failed):"
            grep -E 'over tolerance|Error' "$work/logs/make-$s.log" | cut -c1-300
        fi
    done
fi
[ ${#models[@]} -gt 0 ] || { echo "baseline_on_device.sh: no model to judge"; exit 2; }

export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || exit 2
build=$root/build-gpu
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/logs/configure.log" 2>&1 ||
    ! cmake --build "$build" --target dsv4_cli dsv4_faults -j"$(nproc)" >"$work/logs/build.log" 2>&1; then
    tail -n 30 "$work/logs/configure.log" "$work/logs/build.log"
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

variants=("defaults:" "attn-simt:--attn simt" "indexer-fp32:--indexer fp32" "mhc-roundtrip:--mhc roundtrip"
          "index-context-max:--index-context max")
run_model() { # MODEL_DIR: every variant, following its golden
    local m=$1 name v
    name=$(basename "$m")
    mkdir -p "$work/opt/$name"
    for v in "${variants[@]}"; do
        # shellcheck disable=SC2086 # the variant's options are words
        if ! "$build/dsv4" run --model "$m" --path opt --tokens-from "$m/forced.h5" ${v#*:} --follow "$m/forced.h5" \
            --dump "$work/opt/$name/${v%%:*}.h5" >"$work/logs/opt-$name-${v%%:*}.log" 2>&1; then
            echo "opt $name ${v%%:*}: FAILED"
            tail -n 5 "$work/logs/opt-$name-${v%%:*}.log"
        fi
    done
}
t0=$SECONDS
running=0
for m in "${models[@]}"; do
    run_model "$m" &
    running=$((running + 1))
    if [ $running -ge 4 ]; then wait -n; running=$((running - 1)); fi
done
wait
echo "=== optimized path: ${#models[@]} models x ${#variants[@]} variants in $((SECONDS - t0)) s"
bash "$root/scripts/baseline_eval.sh" -b "$build" -w "$work/eval" -c - -o "$work/opt" -j 8 "${models[@]}" |
    tee "$OUT/baseline-results.txt"
rc=${PIPESTATUS[0]}
# the dumps come back too (tars of at most 15 MiB each), so the verdicts can be redone where the device is not
python3 - "$work/opt" "$OUT" <<'EOF'
import os, sys, tarfile
src, out = sys.argv[1:]
packs, cur, size = [], [], 0
for d in sorted(os.listdir(src)):
    s = sum(os.path.getsize(os.path.join(src, d, f)) for f in os.listdir(os.path.join(src, d)))
    if cur and size + s > 15 << 20:
        packs.append(cur)
        cur, size = [], 0
    cur.append(d)
    size += s
if cur:
    packs.append(cur)
for i, ds in enumerate(packs[:5]):
    t = os.path.join(out, f"opt-{i}.tar.gz")
    with tarfile.open(t + ".tmp", "w:gz") as tf:
        for d in ds:
            tf.add(os.path.join(src, d), arcname=d)
    os.replace(t + ".tmp", t)
    print(f"packed opt-{i}.tar.gz: {ds}")
for ds in packs[5:]:
    print(f"not packed (the device returns 8 files): {ds}")
EOF
[ "$rc" -eq 0 ] || exit 2
if grep '^RESULT' "$OUT/baseline-results.txt" | grep -v ' exit=0 ' >/dev/null; then
    echo "=== some optimized-path dump is not PASS in baseline mode"
    exit 1
fi
echo "=== every optimized-path dump PASSES in baseline mode"
exit 0
