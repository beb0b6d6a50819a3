#!/usr/bin/env bash
# replay_on_device.sh [BUDGET_S] - issue 40's Flash-width evidence (docs/verify.md "Layer-local replay", "The
# Flash-width table"), in one device call of at most 9 minutes on one H200:
#   1. build dsv4_cli, dsv4_faults and test_ref_gpu_flash for sm_90 in build-replay/; start the GPU test of replay
#      (ctest e2e_replay_gpu: ref-gpu replay == ref-cpu replay on the golden sets, faults caught at their layer) in
#      the background, beside the runs below (small models; OpenBLAS on 8 threads); write the Flash-width random model
#      (test_ref_gpu_flash --write-model; $DSV4_FLASH_MODEL, default /tmp/dsv4-flash, reused when there);
#   2. the prompt of e2e_opt_flash_gpu.sh's formula, 32,768 tokens (the 16K prompt is its first 16,384);
#   3. the optimized path free-running with its defaults on the 32K prompt, and the baseline (ref-gpu --emulate bf16,
#      free-running) on it, each storing two runs of 192 positions, 16192-16383 and 32576-32767 (the window of 128
#      and 65 compared positions after it; the per-entry probes are stored whole); their 16K experiments are the
#      same dumps cut to the first 16,384 tokens (scripts/dump_truncate.py: for a causal model fed one token per step
#      these are the 16K prompt's last positions);
#   4. the baseline replayed on ref-gpu once per length (dsv4 run --replay); every candidate judged by
#      `dsv4 replay --path ref-gpu --baseline B --baseline-replay R` (baseline mode on each one's own replay);
#   5. three faults planted into the defaults' 32K dump from position 16384 on (tests/support/dump_fault.py:
#      attn-scale x1.05 at layer 1 (HCA), topk-drop at layer 2 (CSA), kv-rope-sign at layer 3 (HCA)): each must be
#      DIVERGED first at its layer;
#   6. each naive variant (--attn simt, --indexer fp32, --mhc roundtrip, --index-context max) free-running on the 16K
#      prompt (its own run: --index-context max reads the allocated context) and judged the same way, then on the 32K
#      prompt (chunked prefill: about 10 s a run; REPLAY_NAIVE_32K=0 leaves the 32K rows out);
#   7. one summary table: variant x length, the verdict, the first locally broken layer/probe, the largest RMS ratio
#      of the candidate's local error to the baseline's, the seconds of the run.
# BUDGET_S (default 530) bounds the whole script; every step is time-boxed and a step the budget cannot hold is
# skipped and says so; the summary is always printed. Logs and the terminal reports go to $OUT (default
# /tmp/replay-out); the dumps (about 2 GB) and the JSON reports to /tmp/dsv4-replay-dumps. REPLAY_GPU_WEIGHTS
# (default stream: a replay computes two runs of 192 positions, so the weights are better streamed than uploaded) and
# BASE_GPU_WEIGHTS (default auto) choose ref-gpu's weights for the replays and for the baseline's 32K run.
# REPLAY_TOKENS (default 32768) sets the long prompt (the short one is its first half), for a shorter trial.
#   device call: command "bash scripts/replay_on_device.sh 2>&1 | tail -n 80", carry [".debs"]
# Exit status: 0 every candidate PASS and every fault caught at its layer, 1 otherwise (or a step skipped or failed),
# 2 when the build or the setup failed.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
# shellcheck source=tests/support/kit_python.sh disable=SC1091
source "$root/tests/support/kit_python.sh"
kit_python >/dev/null || { kit_python; exit 1; } # KIT_PY: a python3 with numpy and h5py
budget=${1:-530}
OUT=${OUT:-/tmp/replay-out}
D=/tmp/dsv4-replay-dumps
mkdir -p "$OUT" "$D"
t_start=$SECONDS
left() { echo $((budget - (SECONDS - t_start))); }
status=0
notes=()
rows=()
note() {
    notes+=("$*")
    echo "[$((SECONDS - t_start)) s] $*"
}
row() { rows+=("$(printf '| %-34s | %-6s | %-8s | %-22s | %-6s | %s |' "$@")"); }
# shellcheck disable=SC2317 # called by the EXIT trap
print_summary() {
    echo
    echo "==================== replay_on_device.sh: summary ($((SECONDS - t_start)) s of $budget) ===================="
    for l in "${notes[@]}"; do echo "$l"; done
    echo
    row_head='| candidate                          | length | verdict  | first locally broken   | ratio  | run |'
    echo "$row_head"
    echo "|---|---|---|---|---:|---|"
    for r in "${rows[@]}"; do echo "$r"; done
    echo "(ratio: the largest RMS local error of the candidate over the baseline's, over the float probes; a fault must"
    echo " be DIVERGED first at its layer. The reports: $OUT/judge-*.log, the JSON in $D)"
    echo "result: $([ "$status" -eq 0 ] && echo PASS || echo FAIL)"
}
trap print_summary EXIT

# step NAME MAX_S MIN_S CMD...: run CMD time-boxed to MAX_S (or what the budget leaves), its output in $OUT/NAME.log;
# skipped (status 124) when less than MIN_S is left. Sets step_s.
step() {
    local name=$1 max=$2 min=$3 t0=$SECONDS lim
    shift 3
    lim=$(left)
    [ "$lim" -gt "$max" ] && lim=$max
    if [ "$lim" -lt "$min" ]; then
        note "$name: SKIPPED (budget: $(left) s left, it needs about $min)"
        step_s=-
        return 124
    fi
    timeout "$lim" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    step_s=$((SECONDS - t0))
    if [ $rc -ne 0 ]; then
        local why=""
        [ $rc -eq 124 ] && why=": its $lim s were up"
        note "$name: FAILED (exit $rc after $step_s s$why; $OUT/$name.log):"
        note "  $(tail -n 2 "$OUT/$name.log" | tr '\n' ' ' | cut -c1-300)"
    fi
    return $rc
}

export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || exit 2
export DSV4_DIGEST_CACHE=${DSV4_DIGEST_CACHE:-/tmp/dsv4-digest-cache} # the 7.2 GB model is hashed once
export DSV4_PROGRESS_AFTER_S=inf
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
note "machine: ${gpu:-no nvidia-smi}; $(nproc) cores; $(nvcc --version | tail -n 1)"

# ------------------------------------------------------------------------------------------ 1. build, model
build=$root/build-replay
t0=$SECONDS
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure.log" 2>&1 ||
    ! timeout $(($(left) - 200)) cmake --build "$build" --target dsv4_cli dsv4_faults test_ref_gpu_flash \
        -j"$(nproc)" >"$OUT/build.log" 2>&1; then
    tail -n 20 "$OUT/configure.log" "$OUT/build.log"
    note "build: FAILED ($((SECONDS - t0)) s; $OUT/build.log)"
    status=2
    exit 2
fi
note "build: $((SECONDS - t0)) s (dsv4_cli, dsv4_faults, test_ref_gpu_flash; sm_90)"
(cd "$build" && OPENBLAS_NUM_THREADS=8 timeout 200 ctest -V -R '^e2e_replay_gpu$') >"$OUT/e2e_replay_gpu.log" 2>&1 &
gpu_test=$!
bin=$build/dsv4
M=${DSV4_FLASH_MODEL:-/tmp/dsv4-flash}
mkdir -p "$M"
if [ ! -f "$M/model.safetensors" ]; then
    step write-model 150 30 "$build/test_ref_gpu_flash" --write-model "$M" || { status=2; exit 2; }
    note "model: written in $step_s s ($(du -sh "$M" | cut -f1))"
else note "model: $M reused"; fi
GW=${REPLAY_GPU_WEIGHTS:-stream}
BGW=${BASE_GPU_WEIGHTS:-auto}

# ------------------------------------------------------------------------------------------ 2. prompts, positions
T32=${REPLAY_TOKENS:-32768} # the long prompt (a short trial: REPLAY_TOKENS=2048); the short one is its first half
T16=$((T32 / 2))
vocab=$("$KIT_PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$M/config.json")
for ((i = 0; i < T32; i++)); do echo $((2 + (i * 7919 + i * i % 8191) % (vocab - 2))); done >"$D/p32.txt"
head -n "$T16" "$D/p32.txt" >"$D/p16.txt"
S16=$((T16 - 192))-$((T16 - 1)) # a run of 192 positions at the end of each prompt: the window of 128, 65 compared
S32=$((T32 - 192))-$((T32 - 1))
rm -f "$D"/*.h5

# judge NAME CANDIDATE LEN EXPECT [RUN_S]: dsv4 replay on ref-gpu in baseline mode, one table row. EXPECT: pass, or the
# layer a fault must be caught at first.
judge() {
    local name=$1 cand=$2 len=$3 expect=$4 run_s=${5:--} got verdict first ratio ok
    if [ ! -f "$D/base-$len.replay.h5" ] || [ ! -f "$cand" ]; then
        row "$name" "$len" "-" "not judged (no $([ -f "$cand" ] && echo "baseline replay" || echo dump))" "-" "$run_s"
        status=1
        return
    fi
    local log=$OUT/judge-${name%% *}-$len.log js=$D/judge-${name%% *}-$len.json lim # the JSON is large: not in $OUT
    lim=$(left)
    [ "$lim" -gt 120 ] && lim=120
    if [ "$lim" -lt 20 ]; then
        row "$name" "$len" "-" "not judged (budget)" "-" "$run_s"
        status=1
        return
    fi
    rm -f "$js"
    timeout "$lim" "$bin" replay --model "$M" --path ref-gpu --gpu-weights "$GW" "$cand" --baseline "$D/base-$len.h5" \
        --baseline-replay "$D/base-$len.replay.h5" --json "$js" >"$log" 2>&1
    local rc=$?
    [ $rc -gt 1 ] && note "judge $name $len: exit $rc ($log): $(tail -n 2 "$log" | tr '\n' ' ' | cut -c1-250)"
    got=$("$KIT_PY" "$root/scripts/replay_summary.py" "$js")
    read -r verdict first ratio <<<"$got"
    if [ "$expect" = pass ]; then
        [ "$verdict" = PASS ] && ok="" || ok=" (want PASS)"
    else
        [ "$verdict" = DIVERGED ] && [ "${first%%/*}" = "$expect" ] && ok=" (caught at its layer)" ||
            ok=" (want DIVERGED at layer $expect)"
    fi
    case $ok in *want*) status=1 ;; esac
    row "$name" "$len" "$verdict" "$first$ok" "$ratio" "$run_s"
}

# opt_run NAME PROMPT POSITIONS [switch...]: the optimized path free-running; sets run_s ("N s, T tok/s")
opt_run() {
    local name=$1 prompt=$2 pos=$3
    shift 3
    run_s=-
    step "run-$name" 200 40 "$bin" run --model "$M" --path opt --prompt-tokens "$prompt" --dump-positions "$pos" \
        --dump "$D/$name.h5" "$@" || return 1
    run_s="$step_s s, prefill $(grep -o 'prefill [0-9]* in [0-9.]* s, [0-9.]* tokens/s' "$OUT/run-$name.log" |
        sed 's/.*, \([0-9.]*\) tokens.*/\1/') tok/s"
}

# ------------------------------------------------------------------------------------------ 3. the 32K runs
opt_run opt-default-32k "$D/p32.txt" "$S16,$S32"
default_s=$run_s
if step run-base-32k 200 40 "$bin" run --model "$M" --path ref-gpu --gpu-weights "$BGW" --emulate bf16 \
    --prompt-tokens "$D/p32.txt" --dump-positions "$S16,$S32" --dump "$D/base-32k.h5"; then
    note "baseline (ref-gpu --emulate bf16, free-running, $T32 tokens): $step_s s"
fi
for f in opt-default base; do
    [ -f "$D/$f-32k.h5" ] &&
        step "cut-$f-16k" 90 20 "$KIT_PY" "$root/scripts/dump_truncate.py" "$D/$f-32k.h5" "$D/$f-16k.h5" \
            --tokens "$T16"
done
note "prompts $T16 and $T32 tokens; positions stored $S16 and $S32; the opt dump of both: $(du -sh \
    "$D/opt-default-32k.h5" 2>/dev/null | cut -f1)"

# ------------------------------------------------------------------------------------------ 4. the baseline's replays
for len in 16k 32k; do
    [ -f "$D/base-$len.h5" ] || continue
    if step "replay-base-$len" 150 20 "$bin" run --model "$M" --path ref-gpu --gpu-weights "$GW" \
        --replay "$D/base-$len.h5" --dump "$D/base-$len.replay.h5"; then
        note "baseline replay $len: $step_s s ($(grep -o '[0-9]* positions compared, in [0-9]* segments*' \
            "$OUT/replay-base-$len.log"))"
    fi
done

# ------------------------------------------------------------------------------------------ judged: the defaults
judge opt-default "$D/opt-default-16k.h5" 16k pass "(the 32K run)"
judge opt-default "$D/opt-default-32k.h5" 32k pass "$default_s"

# ------------------------------------------------------------------------------------------ 5. faults in the dump
for spec in "attn-scale 1" "topk-drop 2" "kv-rope-sign 3"; do
    read -r kind layer <<<"$spec"
    name=fault-$kind-L$layer
    if [ -f "$D/opt-default-32k.h5" ] &&
        step "plant-$name" 90 20 "$KIT_PY" "$root/tests/support/dump_fault.py" "$D/opt-default-32k.h5" \
            "$D/$name.h5" --kind "$kind" --layer "$layer" --from "$T16"; then
        judge "$name (from $T16)" "$D/$name.h5" 32k "$layer"
    else
        row "$name (from $T16)" 32k - "not planted" - -
        status=1
    fi
    rm -f "$D/$name.h5"
done

# ------------------------------------------------------------------------------------------ 6. the naive variants
for v in "attn-simt|--attn simt" "indexer-fp32|--indexer fp32" "mhc-roundtrip|--mhc roundtrip" \
    "index-max|--index-context max"; do
    name=opt-${v%%|*}
    read -r -a args <<<"${v#*|}"
    if opt_run "$name-16k" "$D/p16.txt" "$S16" "${args[@]}"; then
        judge "$name" "$D/$name-16k.h5" 16k pass "$run_s"
    else
        row "$name" 16k - "not run (see above)" - -
        status=1
    fi
    rm -f "$D/$name-16k.h5"
    # with chunked prefill a 32K run takes about 10 s: the 32K row too, unless REPLAY_NAIVE_32K=0 (the same stored
    # positions as the defaults' 32K run, so the baseline's 32K replay serves it)
    [ "${REPLAY_NAIVE_32K:-1}" = 1 ] || continue
    if opt_run "$name-32k" "$D/p32.txt" "$S16,$S32" "${args[@]}"; then
        judge "$name" "$D/$name-32k.h5" 32k pass "$run_s"
    else
        row "$name" 32k - "not run (see above)" - -
        status=1
    fi
    rm -f "$D/$name-32k.h5"
done
[ "${REPLAY_NAIVE_32K:-1}" = 1 ] ||
    note "the naive variants ran at $T16 tokens only (REPLAY_NAIVE_32K=0); their $T32-token rows are not run"

# ------------------------------------------------------------------------------------------ the GPU test's result
wait "$gpu_test"
rc=$?
lines=$(sed 's/^[0-9]*: //' "$OUT/e2e_replay_gpu.log")
note "e2e_replay_gpu (ref-gpu replay == ref-cpu replay on the golden sets; faults at their layer): exit $rc," \
    "$(grep -c '^ok:' <<<"$lines") ok, $(grep -c '^FAILED' <<<"$lines") failed$(grep -q 'Skipped' <<<"$lines" &&
        echo ' (SKIPPED: no GPU)')"
while IFS= read -r l; do note "  $l"; done < <(grep -E '^(FAILED|   [A-Z]+ )' <<<"$lines" | head -n 12 | cut -c1-200)
[ $rc -eq 0 ] || status=1
exit $status
