#!/usr/bin/env bash
# prefill_on_device.sh [BUDGET_S [STAGES]] - the optimized path's prefill (issue 35) on the GPU machine, in one
# device call (an H200, 16 cores; at most 9 minutes: BUDGET_S default 500 bounds the whole script). STAGES, a comma
# list (default all), picks among unit, e2e, decode-tests, prefill-bench, sweep, peer, decode-bench, ref, e2e-decode
# (the build always runs; everything at once does not fit 9 minutes, so two calls, e.g. "unit,e2e,decode-tests" then
# "prefill-bench,decode-bench,ref", cover it). In this order:
#   1. build for sm_90 only what it needs (dsv4_cli, the GPU tests below, test_ref_gpu_flash for the model file) in
#      build-prefill/; and, when the checkout has git history, dsv4_cli of the branch's merge base with main in
#      build-prefill-base/ (the decode bench "before"), both at once;
#   2. the new GPU tests: test_opt_prefill (compressor runs bitwise, ragged steps) and e2e_opt_prefill_gpu (chunked
#      prefill following the reference, gated as decode is, every golden set, chunks 1..whole, switches, a mixed
#      batch, chunked vs token by token);
#   3. the decode-path GPU tests the change could break: test_kernel_sparse_attn, test_kernel_indexer,
#      test_kernel_follow, test_opt_kernels, test_opt_model, test_opt_follow_run, test_opt_fp8, test_opt_nccl;
#   4. the prefill benchmark: `dsv4 bench --prefill 8192` on the Flash-shaped random model (4 layers, C = 1, bf16
#      and fp8 weights): ms, tokens/s, share of the FLOP floor at the bf16 GEMM rate measured in the same run, the
#      indexer's share and the per-stage table (device events); then the ablation of the prefill GEMMs, headline
#      only: bf16 and fp8 with --expert-lanes 1 (the grouped experts' GEMMs one after another, as before the
#      lanes), fp8 with --experts decode --linears kernel (the decode kernels, as before the grouped FP4 experts
#      and the dequantised FP8 linears), fp8 with --linears kernel alone, bf16 with --experts decode, and bf16
#      with --mhc-pre rows (the mHC pre's decode kernel instead of the tiled one);
#   4b. sweep: `dsv4 bench --prefill N` for N = 1K, 4K, 8K, 32K and 128K at max context 1M (bf16, defaults, one
#      timed rep): the headline and the indexer's share of each length; the 128K prompt is the out-of-memory check;
#      then 4 prompts of 2,048 tokens together (--batch 4);
#   4c. peer: transformers' prefill of one 8,192-token prompt (bench/peers/peer_transformers.py --prefill-only, 4
#      layers, bf16, eager, CUDA events, one warm-up) against dsv4's 8K time of step 4 (or of the sweep);
#   5. the fp32 GPU reference against the optimized path on the same 8,192-token prompt of the Flash-width model
#      file (test_ref_gpu_flash --write-model: 4 layers, 32 experts): both prefill times and their ratio;
#   6. the decode bench (`dsv4 bench --layers 4 --batch 1,64 --context 4096,32768 --variants all-on`, no
#      scaling, baseline or kernel timing) of this tree and of the base: ms/step side by side (must not regress;
#      the same device call). The base is ab-base/ (git-ignored, carried: the base's versions of the files this
#      branch changed, and .ab-added listing the files it added, the convention of scripts/gpu-ab.sh), written
#      here beforehand by `bash scripts/prefill_on_device.sh --make-ab-base [REV]` (REV default: the merge base
#      with main); without ab-base/, the merge base from git history when the copy has it; else skipped;
#   7. e2e_opt_gpu (the decode gates, now with the default chunked prefill) if the budget still allows;
# then one summary block, always. Each step is time-boxed (timeout) and skipped, saying so, when the budget is
# spent. Logs go to $OUT (default /tmp/prefill-out).
#   device call: command "bash scripts/prefill_on_device.sh 520 unit,e2e,decode-tests 2>&1 | tail -n 80",
#   carry [".debs"]; then "... 520 prefill-bench,decode-bench,ref ...", carry [".debs", "ab-base"] (and
#   e2e-decode when there is time)
# Exit status: 0 when every step that ran passed, 1 when one failed, 2 when the build or setup failed.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
if [ "${1:-}" = --make-ab-base ]; then # here, with git: the base's versions of what this branch changed
    rev=${2:-$(git merge-base HEAD main)} || exit 2
    rm -rf ab-base && mkdir -p ab-base || exit 2
    : >ab-base/.ab-added
    git diff --name-status --no-renames "$rev" HEAD | while read -r st path; do
        case $st in
            A) echo "$path" >>ab-base/.ab-added ;;
            *) mkdir -p "ab-base/$(dirname "$path")" && git show "$rev:$path" >"ab-base/$path" || exit 2 ;;
        esac
    done || exit 2
    echo "ab-base/: $(find ab-base -type f ! -name .ab-added | wc -l) base files, $(wc -l <ab-base/.ab-added) added by the branch (base ${rev:0:10}); carry it"
    exit 0
fi
budget=${1:-500}
stages=",${2:-all},"
want() { [ "$stages" = ",all," ] || [[ $stages == *",$1,"* ]]; }
OUT=${OUT:-/tmp/prefill-out}
mkdir -p "$OUT"
t_start=$SECONDS
left() { echo $((budget - (SECONDS - t_start))); }
status=0
summary=()
note() { summary+=("$*"); }
print_summary() {
    echo
    echo "================================ prefill_on_device.sh summary ($((SECONDS - t_start)) s of $budget)"
    for l in "${summary[@]}"; do echo "$l"; done
    echo "exit status $status (logs in $OUT)"
}
trap 'print_summary' EXIT

export dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh disable=SC1091
source "$root/scripts/gpu-env.sh" || { status=2; note "setup: gpu-env.sh failed (.debs carried?)"; exit 2; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
note "machine: ${gpu:-no nvidia-smi}; $(nproc) cores; $(nvcc --version | tail -n 1)"
note "tree: $(git -C "$root" log -1 --format='%h %s' 2>/dev/null | cut -c1-90 || echo 'no git history')"

# timed NAME SECONDS CMD...: run CMD under timeout with its output in $OUT/NAME.log; the exit status, 124 on timeout
timed() {
    local name=$1 secs=$2
    shift 2
    timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
}
# share WANT: min(WANT, what is left minus a reserve of 10 s for the summary)
share() {
    local l
    l=$(($(left) - 10))
    [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}

# ------------------------------------------------------------------------------------------------- 1. build
build=$root/build-prefill
base_build=$root/build-prefill-base
t0=$SECONDS
targets=(dsv4_cli test_opt_prefill test_kernel_sparse_attn test_kernel_indexer test_kernel_follow test_opt_kernels
         test_opt_model test_opt_follow_run test_opt_fp8 test_opt_nccl test_ref_gpu_flash)
jobs=$(nproc)
base_ok=0
base_rev=""
base_tree=/tmp/dsv4-prefill-base
if want decode-bench && [ -d "$root/ab-base" ]; then # this tree with ab-base/ over it, the branch's files removed
    base_rev="ab-base/"
    rm -rf "$base_tree" && mkdir -p "$base_tree" &&
        (tar cf - --exclude='./build*' --exclude=./.git --exclude=./.debs --exclude=./ab-base --exclude=./out .) | tar xf - -C "$base_tree" &&
        cp -r "$root/ab-base/." "$base_tree/" &&
        while read -r f; do [ -n "$f" ] && rm -f "$base_tree/$f"; done <"$root/ab-base/.ab-added" ||
        { note "base tree: building it from ab-base/ failed"; base_rev=""; }
elif want decode-bench && git -C "$root" rev-parse --verify -q main >/dev/null 2>&1; then
    base_rev=$(git -C "$root" merge-base HEAD main 2>/dev/null)
    rm -rf "$base_tree" && mkdir -p "$base_tree" && git -C "$root" archive "$base_rev" | tar -x -C "$base_tree" ||
        base_rev=""
fi
if [ -n "$base_rev" ]; then # the decode bench's "before": dsv4_cli of the base, built beside this tree
        (cmake -S "$base_tree" -B "$base_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/base-configure.log" 2>&1 &&
            timeout "$(share 300)" cmake --build "$base_build" --target dsv4_cli -j$((jobs / 2)) \
                >"$OUT/base-build.log" 2>&1) &
    base_pid=$!
    jobs=$((jobs - jobs / 2))
fi
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$OUT/configure.log" 2>&1 ||
    ! timeout "$(share 330)" cmake --build "$build" --target "${targets[@]}" -j"$jobs" >"$OUT/build.log" 2>&1; then
    tail -n 30 "$OUT/configure.log" "$OUT/build.log"
    status=2
    note "build: FAILED after $((SECONDS - t0)) s ($OUT/build.log): $(grep -m3 -E 'error' "$OUT/build.log" | tr '\n' ' ' | cut -c1-300)"
    exit 2
fi
note "build: $((SECONDS - t0)) s (sm_90, ${#targets[@]} targets)"
if [ -n "$base_rev" ]; then
    wait "$base_pid" && [ -x "$base_build/dsv4" ] && base_ok=1
    note "base build (${base_rev:0:10}, dsv4_cli): $([ $base_ok = 1 ] && echo ok || echo "FAILED or cut ($OUT/base-build.log)") at $((SECONDS - t0)) s"
else
    want decode-bench && note "base build: no ab-base/ carried and no git history: the decode bench runs on this tree only"
fi
bin=$build/dsv4
export DSV4_BIN=$bin DSV4_SOURCE_DIR=$root DSV4_BINARY_DIR=$build DSV4_DIGEST_CACHE=off CK_DEFAULT_TIMEOUT=600

# one GPU test binary or e2e script, time-boxed, with its key lines
gpu_test() {
    local name=$1 want=$2 t0=$SECONDS
    shift 2
    local secs
    secs=$(share "$want")
    if [ "$secs" -lt 20 ]; then
        note "$name: SKIPPED (budget: $(left) s left)"
        return
    fi
    timed "$name" "$secs" "$@"
    local rc=$?
    local checks
    checks=$(grep -E 'Checks:|passed, [0-9]+ failed' "$OUT/$name.log" | tail -n 1)
    if [ $rc -eq 0 ]; then
        note "$name: PASS in $((SECONDS - t0)) s ${checks:+($checks)}"
    elif [ $rc -eq 77 ]; then
        note "$name: SKIPPED by the test (exit 77: no GPU?)"
    else
        status=1
        [ $rc -eq 124 ] && note "$name: TIMEOUT after $secs s" || note "$name: FAIL (exit $rc, $((SECONDS - t0)) s) ${checks:+($checks)}"
        grep -E ':[FE]:|FAIL|device check failed|error|differ' "$OUT/$name.log" | head -n 6 | cut -c1-200 |
            sed 's/^/    /' >"$OUT/$name.why"
        while IFS= read -r l; do note "$l"; done <"$OUT/$name.why"
    fi
}

# ------------------------------------------------------------------------------------------------- 2. new tests
want unit && gpu_test test_opt_prefill 120 "$build/test_opt_prefill"
grep -E '^(compressor runs|ragged|sorted experts|fp8 linear|fp8 prefill|expert lanes)' "$OUT/test_opt_prefill.log" 2>/dev/null | sed 's/^/    /' >"$OUT/p.lines"
while IFS= read -r l; do note "$l"; done <"$OUT/p.lines"
want e2e && gpu_test e2e_opt_prefill_gpu 200 bash "$root/tests/e2e_opt_prefill_gpu.sh"
grep -E '^== .*FAIL' "$OUT/e2e_opt_prefill_gpu.log" 2>/dev/null | head -n 8 | sed 's/^/    /' >"$OUT/e.lines"
while IFS= read -r l; do note "$l"; done <"$OUT/e.lines"

# ------------------------------------------------------------------------------------------------- 3. decode tests
for t in test_kernel_sparse_attn test_kernel_indexer test_kernel_follow test_opt_kernels test_opt_model \
         test_opt_follow_run test_opt_fp8 test_opt_nccl; do
    want decode-tests && gpu_test "$t" 120 "$build/$t"
done

# ------------------------------------------------------------------------------------------------- 4. prefill bench
# NAME|ARGS|TABLE: the defaults with their stage tables, then the ablation of the prefill kernels (headline only)
for cfg in "bf16|--weights bf16|1" "fp8|--weights fp8|1" "bf16-lanes-1|--weights bf16 --expert-lanes 1|0" \
           "fp8-lanes-1|--weights fp8 --expert-lanes 1|0" "bf16-mhc-pre-rows|--weights bf16 --mhc-pre rows|0" \
           "fp8-decode-kernels|--weights fp8 --experts decode --linears kernel|0" \
           "fp8-linears-kernel|--weights fp8 --linears kernel|0" "bf16-experts-decode|--weights bf16 --experts decode|0"; do
    want prefill-bench || break
    IFS='|' read -r w wargs table <<<"$cfg"
    s=$(share 120)
    if [ "$s" -lt 30 ]; then note "bench --prefill 8192 ($w): SKIPPED (budget)"; continue; fi
    # shellcheck disable=SC2086
    if timed "bench-prefill-$w" "$s" "$bin" bench --prefill 8192 --prefill-chunk 8192 --layers 4 $wargs; then
        note "bench --prefill 8192, chunk 8192, 4 Flash-shaped layers, $wargs:"
        if [ "$table" = 1 ]; then
            grep -E '^prefill:|^prefill stages: sum|^\| ' "$OUT/bench-prefill-$w.log" | sed 's/^prefill: //; s/^/    /' >"$OUT/b.lines"
            grep -m1 'memory plan' "$OUT/bench-prefill-$w.log" | cut -c1-440 | sed 's/^/    /' >>"$OUT/b.lines"
        else
            grep -E '^prefill: [0-9]|of the floor' "$OUT/bench-prefill-$w.log" | sed 's/^prefill: /    /' >"$OUT/b.lines"
        fi
        while IFS= read -r l; do note "$l"; done <"$OUT/b.lines"
    else
        status=1
        note "bench --prefill 8192 ($w): FAILED ($OUT/bench-prefill-$w.log): $(tail -n 2 "$OUT/bench-prefill-$w.log" | tr '\n' ' ' | cut -c1-200)"
    fi
done

# ------------------------------------------------------------------------------------------------- 4b. length sweep
# issue 35's lengths at max context 1M (bf16, defaults, one timed rep after the warm-up): the headline and the
# indexer's share of each; the 128K prompt is the out-of-memory check
# and a batch: 4 prompts of 2,048 tokens prefilled together (8,192 tokens, steps of 8,192 shared in sequence order)
for n in 1024 4096 8192 32768 131072 2048x4; do
    want sweep || break
    s=$(share 150)
    b=1
    [[ $n == *x* ]] && b=${n#*x} && n=${n%x*}
    if [ "$s" -lt 30 ]; then note "sweep --prefill $n --batch $b: SKIPPED (budget)"; continue; fi
    if timed "sweep-$n-$b" "$s" "$bin" bench --prefill "$n" --batch "$b" --prefill-chunk 8192 --max-context 1048576 \
        --layers 4 --reps 1; then
        grep -E '^prefill: [0-9]|of the floor|^prefill: indexer' "$OUT/sweep-$n-$b.log" | sed 's/^prefill: /    /' >"$OUT/s.lines"
        note "bench --prefill $n --batch $b, chunk 8192, max context 1M, 4 layers, bf16:"
        while IFS= read -r l; do note "$l"; done <"$OUT/s.lines"
    else
        status=1
        note "sweep --prefill $n --batch $b: FAILED ($OUT/sweep-$n-$b.log): $(tail -n 2 "$OUT/sweep-$n-$b.log" | tr '\n' ' ' | cut -c1-200)"
    fi
done

# ------------------------------------------------------------------------------------------------- 4c. the peer
# transformers' prefill of one 8,192-token prompt at the bench's shapes (4 layers, bf16, eager; one warm-up, two timed)
if want peer; then
    s=$(share 200)
    if [ "$s" -lt 60 ]; then
        note "peer prefill 8192: SKIPPED (budget)"
    elif timed peer-prefill "$s" python3 "$root/bench/peers/peer_transformers.py" --layers 4 --prefill-only 8192 \
        --warmup 1 --reps 2 --json "$OUT/peer-prefill.json"; then
        peer_ms=$(grep -o 'prefill 8192: [0-9.]* ms median' "$OUT/peer-prefill.log" | awk '{print $3}')
        opt_ms=$(grep -ho '^prefill: 8192 tokens in [^:]*: [0-9.]* ms' "$OUT/bench-prefill-bf16.log" \
            "$OUT/sweep-8192-1.log" 2>/dev/null | head -n 1 | awk '{print $NF == "ms" ? $(NF-1) : $NF}')
        note "transformers prefill of 8,192 tokens (4 layers, bf16, eager): ${peer_ms:-?} ms; dsv4 ${opt_ms:-not run} ms$(
            [ -n "$peer_ms" ] && [ -n "$opt_ms" ] && awk -v a="$peer_ms" -v b="$opt_ms" 'BEGIN {printf ": %.1fx (target >= 10x)", a / b}')"
    else
        status=1
        note "peer prefill 8192: FAILED ($OUT/peer-prefill.log): $(tail -n 2 "$OUT/peer-prefill.log" | tr '\n' ' ' | cut -c1-200)"
    fi
fi

# ------------------------------------------------------------------------------------------------- 5. ref-gpu ratio
M=/tmp/dsv4-flash-model
if ! want ref; then
    :
elif [ "$(share 150)" -ge 60 ]; then
    if [ ! -f "$M/model.safetensors" ]; then
        mkdir -p "$M"
        timed write-model "$(share 90)" "$build/test_ref_gpu_flash" --write-model "$M" || note "flash model: write FAILED"
    fi
    P=8192
    for ((i = 0; i < P; i++)); do echo $((2 + (i * 7919 + i * i % 8191) % 8190)); done >"$OUT/prompt8k.txt"
    if [ -f "$M/model.safetensors" ]; then
        timed opt-8k "$(share 90)" "$bin" run --model "$M" --path opt --prompt-tokens "$OUT/prompt8k.txt" \
            --prefill-chunk 8192 --max-context 8200
        opt_rc=$?
        timed ref-8k "$(share 120)" "$bin" run --model "$M" --path ref-gpu --prompt-tokens "$OUT/prompt8k.txt"
        ref_rc=$?
        t_opt=$(grep -o 'prefill 8192 in [0-9.]* s' "$OUT/opt-8k.log" | awk '{print $4}')
        t_ref=$(grep -o 'prefill 8192 in [0-9.]* s' "$OUT/ref-8k.log" | awk '{print $4}')
        if [ $opt_rc -eq 0 ] && [ $ref_rc -eq 0 ] && [ -n "$t_opt" ] && [ -n "$t_ref" ]; then
            note "8,192-token prompt, Flash-width model file (4 layers, 32 experts): opt prefill $t_opt s, ref-gpu (fp32) $t_ref s: opt is $(awk -v a="$t_ref" -v b="$t_opt" 'BEGIN {printf "%.1fx", a / b}') faster (target >= 20x)"
        else
            status=1
            note "opt vs ref-gpu at 8K: FAILED (opt exit $opt_rc, ref exit $ref_rc; $OUT/opt-8k.log, $OUT/ref-8k.log)"
            tail -n 2 "$OUT/opt-8k.log" | cut -c1-200 | sed 's/^/    opt: /' >"$OUT/r.lines"
            while IFS= read -r l; do note "$l"; done <"$OUT/r.lines"
        fi
    fi
else
    note "opt vs ref-gpu at 8K: SKIPPED (budget)"
fi

# ------------------------------------------------------------------------------------------------- 6. decode bench
dbench=(bench --layers 4 --batch 1,64 --context 4096,32768 --max-context 65536 --variants all-on --scaling none
        --no-baseline --kernel-reps 0)
for which in after before; do
    want decode-bench || break
    b=$bin
    [ "$which" = before ] && b=$base_build/dsv4
    if [ "$which" = before ] && [ $base_ok = 0 ]; then note "decode bench before: SKIPPED (no base build)"; continue; fi
    s=$(share 90)
    if [ "$s" -lt 40 ]; then note "decode bench $which: SKIPPED (budget)"; continue; fi
    if timed "decode-bench-$which" "$s" "$b" "${dbench[@]}"; then
        awk '/^throughput/ {f = 1; next} f && NF == 0 {f = 0} f' "$OUT/decode-bench-$which.log" |
            sed "s/^/    $which: /" >"$OUT/d.lines"
        note "decode bench ($which: ${dbench[*]}):"
        while IFS= read -r l; do note "$l"; done <"$OUT/d.lines"
    else
        status=1
        note "decode bench $which: FAILED ($OUT/decode-bench-$which.log): $(tail -n 2 "$OUT/decode-bench-$which.log" | tr '\n' ' ' | cut -c1-200)"
    fi
done

# ------------------------------------------------------------------------------------------------- 7. e2e decode
want e2e-decode && gpu_test e2e_opt_gpu 400 bash "$root/tests/e2e_opt_gpu.sh"
exit $status
