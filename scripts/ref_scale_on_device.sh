#!/usr/bin/env bash
# ref_scale_on_device.sh [BUDGET_S] - the reference at the real model's size on the GPU machine (issue 36 phase 2;
# docs/reference.md "ref-gpu streams layers"), in one device call of about 5 minutes:
#   1. build only what it needs (dsv4_cli, test_ref_gpu_stream) for sm_90 in build-scale/;
#   2. run the GPU test of the streamed weights (ctest test_ref_gpu_stream: the dequantiser bit for bit, streamed ==
#      resident bitwise on every golden set, GPU memory within the plan on a 3- and 5-layer stand-in);
#   3. write the full-size sparse stand-in of the released checkpoint (43 layers, 46 shards, 160 GB of holes: no disk)
#      and run `dsv4 run --path ref-gpu` on it (auto: the 1 TiB resident plan does not fit, so it streams), a 16-token
#      prompt and 4 decode steps, sampling nvidia-smi's memory.used every 100 ms; then the same with
#      DSV4_REF_GPU_SYNC=1 (every stage alone: where the time goes, the compute included); the resident mode's refusal;
#   4. `dsv4 run --path ref-cpu` on the same stand-in while the budget allows (16 cores here);
#   5. one summary block: GPU memory (the reference's own peak by cudaMemGetInfo, nvidia-smi's, the plan), per-token
#      times, and where the time goes (host fill from the page cache, H2D, GPU dequantisation, compute).
# Logs go to $OUT (default /tmp/ref-scale-out). BUDGET_S (default 300) bounds the whole script: the test gets what the
# build leaves but 80 s (kept for the full-size ref-gpu runs), ref-cpu runs only with 60 s left; a step skipped says so.
#   device call: command "bash scripts/ref_scale_on_device.sh 2>&1 | tail -n 80", carry [".debs"]
# Exit status: 0 when every step that ran passed, 1 when one failed, 2 when the build or setup failed.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
budget=${1:-300}
OUT=${OUT:-/tmp/ref-scale-out}
mkdir -p "$OUT"
t_start=$SECONDS
left() { echo $((budget - (SECONDS - t_start))); }
status=0
summary=()
note() { summary+=("$*"); }

export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || exit 2
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
ram=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
note "machine: ${gpu:-no nvidia-smi}; $(nproc) cores, $ram RAM; $(nvcc --version | tail -n 1)"

# ------------------------------------------------------------------------------------------------- 1. build
build=$root/build-scale
t0=$SECONDS
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$OUT/configure.log" 2>&1 ||
    ! cmake --build "$build" --target dsv4_cli test_ref_gpu_stream -j"$(nproc)" >"$OUT/build.log" 2>&1; then
    tail -n 30 "$OUT/configure.log" "$OUT/build.log"
    echo "ref_scale_on_device.sh: the build failed"
    exit 2
fi
note "build: $((SECONDS - t0)) s (dsv4_cli, test_ref_gpu_stream; sm_90)"
bin=$build/dsv4

# ------------------------------------------------------------------------------------------------- 2. tests
t0=$SECONDS
share=$(($(left) - 80)) # keep 80 s for the full-size ref-gpu runs
if [ "$share" -gt 30 ]; then
    (cd "$build" && timeout "$share" ctest -V -R '^test_ref_gpu_stream$') >"$OUT/ctest.log" 2>&1
    rc=$?
    res=$(grep -E 'tests passed|Checks:' "$OUT/ctest.log" | tr '\n' ' ')
    if [ $rc -eq 0 ]; then note "test_ref_gpu_stream: PASS in $((SECONDS - t0)) s ($res)"
    else
        status=1
        note "test_ref_gpu_stream: FAIL (exit $rc, $((SECONDS - t0)) s; $OUT/ctest.log): $res"
        grep -E ':[FE]:|Assertion|differs|timeout' "$OUT/ctest.log" | head -n 8 | sed 's/^/  /' \
            >"$OUT/ctest-failures.txt"
    fi
    sed 's/^[0-9]*: //' "$OUT/ctest.log" | # ctest -V prefixes the test's lines with its number
        grep -E '^(dequantiser:|[a-z0-9-]+ [a-z-]+: streamed bitwise|[0-9]+ layers: plan|  init \+ prefill|GPU peak:)' \
            >"$OUT/ctest-lines.txt"
else
    note "test_ref_gpu_stream: SKIPPED (budget: $(left) s left after the build)"
fi

# ------------------------------------------------------------------------------------------------- 3. stand-in
standin=/tmp/dsv4-standin-43
rm -rf "$standin"
"$build/test_ref_gpu_stream" --write-standin "$standin" 43 >"$OUT/standin.log" 2>&1 || {
    cat "$OUT/standin.log"
    exit 2
}
note "stand-in: $(tail -n 1 "$OUT/standin.log"); $(du -sh "$standin" | cut -f1) on disk"
run_args=(run --model "$standin" --prompt-tokens "$standin/prompt.txt" --decode 4)

# dsv4 run ARGS... with nvidia-smi sampled every 100 ms; $1 names the log. Prints nothing; sets smi_peak, smi_base.
sampled_run() {
    local name=$1
    shift
    smi_base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1)
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/$name.smi" 2>/dev/null &
    local smi=$!
    DSV4_PROGRESS_AFTER_S=0 "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    smi_peak=$(sort -n "$OUT/$name.smi" | tail -n 1)
    return $rc
}

gpu_run() { # NAME [env...]: the streamed ref-gpu run on the stand-in, its lines into the summary
    local name=$1 t0=$SECONDS
    shift
    if [ "$(left)" -lt 25 ]; then
        note "ref-gpu $name: SKIPPED (budget)"
        return
    fi
    if ! sampled_run "$name" env "$@" timeout "$(left)" "$bin" "${run_args[@]}" --path ref-gpu; then
        status=1
        note "ref-gpu $name: FAIL (see $OUT/$name.log):"
        note "  $(tail -n 3 "$OUT/$name.log" | tr '\n' ' ')"
        return
    fi
    local log=$OUT/$name.log
    note "ref-gpu $name ($((SECONDS - t0)) s in all):"
    note "  $(grep -m1 'memory plan:' "$log" | sed 's/^dsv4 run: //')"
    note "  $(grep -m1 '^ref-gpu weights:' "$log")"
    note "  nvidia-smi memory.used: $smi_peak MiB at the most, $smi_base MiB before (the CUDA context included)"
    note "  $(grep -m1 'decode steps in' "$log" | sed 's/^dsv4 run: //')"
    grep '^ref-gpu time,' "$log" | while read -r l; do echo "  $l"; done >"$OUT/$name.time"
    while IFS= read -r l; do note "$l"; done <"$OUT/$name.time"
    if grep -q 'layer 1/43' "$log"; then # the line is shown every 5 s (every 0.25 s on a terminal)
        local n_lines first
        n_lines=$(grep -c 'layer [0-9]*/43' "$log")
        first=$(grep -m1 -o 'layer 1/43[^E]*' "$log")
        note "  per-layer progress: shown ($n_lines lines, e.g. $first)"
    else
        note "  per-layer progress: MISSING"
        status=1
    fi
    grep -q 'weights streamed as on disk' "$log" || { note "  the plan did not stream"; status=1; }
}

gpu_run streamed
gpu_run sync DSV4_REF_GPU_SYNC=1

# the resident mode of the full model: refused at once with its numbers (exit 2), before anything heavy
t0=$SECONDS
"$bin" "${run_args[@]}" --path ref-gpu --gpu-weights resident >"$OUT/resident.log" 2>&1
rc=$?
why=$(grep -m1 -o 'needs [^,]*, the GPU has [^)]*)' "$OUT/resident.log")
note "ref-gpu --gpu-weights resident: exit $rc in $((SECONDS - t0)) s: $why"
[ $rc -eq 2 ] || status=1

# ------------------------------------------------------------------------------------------------- 4. ref-cpu
if [ "$(left)" -gt 60 ]; then
    t0=$SECONDS
    if DSV4_PROGRESS_AFTER_S=0 timeout "$(left)" "$bin" "${run_args[@]}" --path ref-cpu >"$OUT/cpu.log" 2>&1; then
        note "ref-cpu ($((SECONDS - t0)) s in all):"
        note "  $(grep -m1 'decode steps in' "$OUT/cpu.log" | sed 's/^dsv4 run: //')"
        note "  $(grep -m1 'memory plan:' "$OUT/cpu.log" | sed 's/^dsv4 run: //' | cut -c1-200)"
    else
        note "ref-cpu: did not finish in the budget ($((SECONDS - t0)) s; $OUT/cpu.log):"
        note "  $(grep 'layer' "$OUT/cpu.log" | tail -n 1)"
    fi
else
    note "ref-cpu: SKIPPED (budget: $(left) s left)"
fi
rm -rf "$standin"

# ------------------------------------------------------------------------------------------------- 5. summary
echo
echo "==================== ref_scale_on_device.sh: summary ($((SECONDS - t_start)) s) ===================="
for l in "${summary[@]}"; do echo "$l"; done
if [ -s "$OUT/ctest-lines.txt" ]; then
    echo "test_ref_gpu_stream lines:"
    sed 's/^/  /' "$OUT/ctest-lines.txt" | cut -c1-400
fi
[ -s "$OUT/ctest-failures.txt" ] && { echo "test failures:"; cat "$OUT/ctest-failures.txt"; }
echo "result: $([ $status -eq 0 ] && echo PASS || echo FAIL); logs in $OUT"
exit $status
