#!/usr/bin/env bash
# gpu-focus.sh STEP... - one short device call: build build-gpu/ for sm_90, then the named steps, each time-boxed,
# outputs in $OUT. A step written bg:STEP runs in the background while the next ones run (the script waits for it
# at the end): for a sanitizer run beside tests, not beside a benchmark. (Of the steps that start jobs of their own,
# only fp8 waits for just its own; the others wait for a bg: step too.)
#   tests    test_opt_nccl, test_kernel_qweight, test_opt_fp8 (ctest)
#   ctest    the ctests whose names match CTEST_R (default test_opt_kernels), time-boxed to CTEST_S (200) seconds,
#            into $OUT/ctest.log
#   nccl     tests/e2e_opt_nccl_gpu.sh with the Flash-width model (written to /tmp/dsv4-flash first) and the
#            memcheck of the --gpus 1 job (scripts/gpu-sanitize-model.sh, in the background)
#   ncu-fp4  Nsight Compute on the FP4 expert kernels of bench_qweight (every launch; speed-of-light, warp
#            state, occupancy, instruction statistics) into $OUT/ncu-fp4.csv
#   ncu-fp4-c64  the C = 64 up and down launches only (bench_qweight --quick launches 58 and 59 of the FP4
#            kernels), with the stall reasons: warp state, scheduler, source counters, into $OUT/ncu-c64.txt
#   ref      the GPU reference tests: test_ref_gpu_ops, e2e_ref_gpu
#   bench-q  bench_qweight --quick into $OUT/qweight.txt (run before any test step: nothing else on the GPU)
#   bench-fp8  dsv4 bench --weights fp8 (all on, 5 layers) into $OUT/bench-fp8.json
#   fp8      the quantised-weight checks after a kernel change: test_kernel_qweight, test_opt_fp8, e2e_opt_fp8_gpu,
#            e2e_opt_gpu (its tiny-fp8 cases run the FP4 experts), with, in the background, memcheck and racecheck
#            of test_kernel_qweight and of the --weights fp8 `dsv4 run` job (scripts/gpu-sanitize*.sh)
#   split    the attention work split after session 4's change: bench_sparse_attn --quick (the CSA list and the
#            longest HCA list) into $OUT/attn.txt, and `dsv4 bench --layers auto --weights fp8 --batch 64`, the run
#            that ran out of memory before it, into $OUT/bench-auto.log
#   study    the top-k flips of the following runs on tiny: the CPU reference of every position, then `dsv4 run
#            --path opt --follow` with the defaults and each naive variant alone; dumps and verifier reports
#            (text and JSON, against the reference) into $OUT/study/ for a look at the flips' score gaps
#   recall   tests/e2e_opt_recall_gpu.sh (issue 6's strict-recall gate pooled over the golden prompt + 63 random
#            prompts of tiny and tiny-fp8: the defaults, each naive variant, the CPU emulation), time-boxed to
#            RECALL_S (360) s, into $OUT/recall.log and the per-prompt lines into $OUT/recall-*.txt
#   e2e      tests/e2e_opt_gpu.sh (every golden set, every variant, following and free), time-boxed to E2E_S
#            (300) s, into $OUT/e2e.log
#   flips    scripts/flip_rate.sh on tiny (200 random prompts) and tiny-fp8 (100): how often the bf16 emulation and
#            the optimized path's defaults and naive variants, each following the fp32 reference, differ in top-k
#            picks from it, and how many prompts fail the e2e top-k gate; into $OUT/flips-*.txt
#   kvdumps  `dsv4 run --path opt --kv fp8` dumps of tiny (free, following, --attn simt, --batch 3), tiny-fp8 and
#            topk512 into $OUT/kv/, to compare a change of the fp8 cache's storage against, value for value
#   kv8      the fp8 cache form: test_kernel_sparse_attn, test_opt_kernels, test_opt_model, test_opt_follow_run,
#            test_opt_fp8 and e2e_opt_gpu, then the cache memory of tiny at 1M positions in both forms, into
#            $OUT/kv8.log (run kvdumps after it for the dumps)
#   kv8b     after the fp8 cache change: dsv4 bench --weights fp8 --kv fp8 at C = 64 (5 layers) into
#            $OUT/bench-kv8.json, then memcheck and racecheck of test_kernel_sparse_attn and of the kv8 and naive
#            `dsv4 run` jobs, then test_opt_nccl and e2e_opt_nccl_gpu (tiny sets)
#   wo-a     the grouped FP8 linear (wo_a in one launch): test_kernel_qweight, test_opt_fp8, e2e_opt_fp8_gpu, then
#            dsv4 bench --weights fp8 at C = 64 (5 layers) into $OUT/bench-woa.json
#   auto-kv8 dsv4 bench --layers auto --weights fp8 --kv fp8 --batch 64: how many Flash layers fit with the fp8
#            caches, into $OUT/bench-auto-kv8.json (run after bench-fp8; time-boxed to 220 s)
#   san-model  the model-level test binaries under the sanitizers, all in parallel, each time-boxed to 380 s:
#            memcheck of test_opt_model, test_opt_fp8, test_opt_follow_run; racecheck of test_opt_fp8; memcheck and
#            racecheck of test_opt_kernels, test_gpu_cublas, test_ref_gpu_ops
#   san-rest  what san-model left: racecheck of test_opt_model and test_opt_follow_run, memcheck and racecheck
#            of test_opt_nccl (memcheck with --report-api-errors no: NCCL probes its own kernel images), one run per
#            Check test case (binary:case), SAN_PAR (12) at a time, each time-boxed to SAN_BOX_S (470) s and to end by
#            SAN_END_S (540 s after the start); SAN_ONLY="tool:binary:case ..." runs only those; into
#            $OUT/san-rest.txt. gpu-sanitize.sh sets DSV4_TEST_MAX_STEPS=25 (tests/support/dsv4_test.h). Racecheck
#            of test_opt_nccl:test_n1_dumps runs alone (~370 s, host memory): give it a call of its own
#   ubench   every micro-benchmark (bench/run_on_device.sh ubench --quick) into $OUT/ubench.md; first, while
#            nothing else uses the GPU
#   suite    every GPU ctest but the slow CPU-vs-GPU Flash reference check and the pooled recall gate (the
#            recall step) (as gpu-check-all.sh, no sanitizers),
#            time-boxed to SUITE_S seconds (default 440); ctest's log into $OUT/suite.log
#   san-topk512  the golden/topk512 runs that the other sanitizer steps leave out, all in parallel, each
#            time-boxed to SAN_BOX_S (420) s: memcheck of every test case with a topk512 part, whole
#            (DSV4_TEST_MAX_STEPS=0), and scripts/gpu-sanitize-topk512.sh (whole `dsv4 run` jobs; SAN_TOPK_JOBS
#            picks its JOBS); into $OUT/san-topk512.txt. SAN_TOPK_CASES="" leaves the test cases out
#   san-long  tests/gpu/test_opt_long_state.c (the top-512 ranking of golden/topk512 and of the Flash-width
#            model in a few steps from a random state past position 2,048): its cases once without a tool (the
#            sanitizers start only if that passes), then each case under memcheck and under racecheck, all at
#            once, each time-boxed to SAN_BOX_S (400) s;
#            racecheck prints every race, and a line per case counts the races' accesses outside cuBLAS's own
#            kernels (nvjet_*: the Flash-width GEMMs' races are cuBLAS's, docs/robustness.md); into
#            $OUT/san-long.txt
#   race-repro  scripts/racecheck_cublas_repro.cu (cuBLAS bf16 GEMMs like the optimized path's) built and run
#            bare, under racecheck whole, with --launch-skip, --launch-count and --kernel-name, and under memcheck
#            with --launch-skip; then (unless RACE_FLASH=0) its Flash-width GEMMs bare, under racecheck, synccheck
#            and racecheck --racecheck-memcpy-async no, with the kernels named in the race reports; each
#            time-boxed to 150 s; into $OUT/race-repro.txt
#   san-n1   why test_n1_dumps' jobs do not finish when the sanitizer follows them (the step's comment); into
#            $OUT/san-n1.tgz
#   dumps    `dsv4 run --path opt` dumps at the defaults of tiny (alone and as copy 2 of a staggered batch of 3),
#            tiny-fp8 and topk512, and of tiny with --mhc roundtrip, into $OUT/dumps.tgz: run before and after a
#            kernel change that must not change a bit, then compare the two with h5diff here. DUMPS_BIN=PATH
#            dumps with another build's dsv4, into $OUT/$DUMPS_NAME.tgz
#   experts  after a change of the grouped experts (kernels/grouped_experts.cuh, both weight formats): first,
#            alone on the GPU, bench_moe --quick (bf16) and bench_qweight --quick (FP4) into $OUT/moe.txt and
#            $OUT/qweight.txt and `dsv4 bench` bf16 all-on (5 layers, C = 1, 16, 64) into $OUT/bench-bf16.json;
#            then test_kernel_qweight, test_opt_kernels, test_opt_nccl's expert-range cases, e2e_opt_gpu and
#            e2e_opt_flash_gpu (with the naive variants), each time-boxed to EXPERTS_S (300) s, into
#            $OUT/experts.log
#   ncu-mhc  Nsight Compute on bench_mhc --quick's mHC pre kernels (partial, tiled partial, finish, the roundtrip's):
#            speed-of-light, warp state and launch statistics into $OUT/ncu-mhc.csv
#   ncu-fp8  Nsight Compute on bench_qweight --quick's first 120 FP8 linear launches (every C and shape, matched by
#            function name: a regex on the demangled template arguments matched nothing): speed-of-light, warp
#            state with stall reasons, memory workload, occupancy, into $OUT/ncu-fp8.csv
#   device call: command "bash scripts/gpu-focus.sh tests nccl ncu-fp4", carry [".debs"]
set -u
# every step name is checked before the build: a misspelt one was found only when reached, after the build and
# the steps before it had used the call's device time
known_steps="recall e2e experts san-long race-repro flips kv8 kv8b wo-a auto-kv8 san-model ubench suite san-rest san-topk512 san-n1 dumps kvdumps study ctest tests nccl
    ncu-fp4 ncu-mhc ncu-fp8 ncu-fp4-c64 ref bench-q bench-fp8 fp8 split"
for step in "$@"; do
    found=0
    for k in $known_steps; do [ "${step#bg:}" = "$k" ] && found=1; done
    [ $found = 1 ] || { echo "gpu-focus: unknown step '$step' (the steps are listed at the top of $0)" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
b=$root/build-gpu
cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1 &&
    cmake --build "$b" -j"$(nproc)" >>"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
echo "== built at ${SECONDS}s"
# The Check cases of tests/gpu/BINARY.c as BINARY:case (one per line of its tests[] table)
cases() { grep -oE '^ +test_[a-z0-9_]+,' "$root/tests/gpu/$1.c" | tr -d ' ,' | sed "s/^/$1:/"; }
# compute-sanitizer's extra options for a BINARY:case: the NCCL cases run with --report-api-errors no (NCCL
# probes its own kernel images, docs/robustness.md)
nccl_tool_args() {
    case $1 in test_opt_nccl:* | test_opt_long_state:test_state_nccl_*) echo "--report-api-errors no" ;; esac
}
run_step() {
    local step=$1
    case $step in
    recall)
        rm -rf /tmp/e2e-recall
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-recall timeout "${RECALL_S:-360}" ctest -R '^e2e_opt_recall_gpu$' -V) \
            >"$out/recall.log" 2>&1
        echo "== recall rc $? at ${SECONDS}s"
        grep -E "^[0-9]+: (== |config|[a-z0-9-]+ +L[0-9]|[a-z0-9-]+: |gate |e2e_opt_recall)" "$out/recall.log" | cut -d' ' -f2- |
            cut -c1-160
        for set in tiny tiny-fp8; do cp "/tmp/e2e-recall/$set/flips.txt" "$out/recall-$set.txt" 2>/dev/null; done
        ;;
    e2e)
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-opt timeout "${E2E_S:-300}" ctest -R '^e2e_opt_gpu$' -V) >"$out/e2e.log" 2>&1
        echo "== e2e_opt_gpu rc $? at ${SECONDS}s"
        grep -E "^[0-9]+: (== |   topk|   router|e2e_opt_gpu:)" "$out/e2e.log" | cut -d' ' -f2- | cut -c1-200 |
            grep -v "reported only" | tail -n 120
        ;;
    flips)
        for m in tiny:200 tiny-fp8:100; do
            DSV4_BIN=$b/dsv4 timeout 250 bash "$root/scripts/flip_rate.sh" --model "$root/golden/${m%%:*}" \
                -n "${m#*:}" -j 12 --out "/tmp/flips-${m%%:*}" "emu=--path ref-cpu --emulate bf16" "mma=--path opt" \
                "simt=--path opt --attn simt" "idx-fp32=--path opt --indexer fp32" \
                "mhc-rt=--path opt --mhc roundtrip" >"$out/flips-${m%%:*}.txt" 2>&1
            echo "== flip_rate ${m%%:*} rc $? at ${SECONDS}s"
            cat "$out/flips-${m%%:*}.txt"
            cp "/tmp/flips-${m%%:*}/flips.txt" "$out/flips-${m%%:*}-lines.txt" 2>/dev/null
        done
        ;;
    kv8)
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-kv8 timeout 300 ctest --output-on-failure -V -R \
            '^(test_kernel_sparse_attn|test_opt_kernels|test_opt_model|test_opt_follow_run|test_opt_fp8|e2e_opt_gpu)$') \
            >"$out/kv8.log" 2>&1
        echo "== kv8 tests rc $? at ${SECONDS}s"
        grep -E "fp8 entries|kv8 writers|Test +#|tests passed|e2e_opt_gpu:|== .*(FAIL|kv-fp8)|Failure|Assertion" \
            "$out/kv8.log" | cut -c1-220 | grep -v "reported only" | tail -n 60
        for kv in bf16 fp8; do
            "$b/dsv4" run --model "$root/golden/tiny" --path opt --kv $kv --max-context 1048576 --batch 2 \
                --tokens-from "$root/golden/tiny/forced.h5" --dump /tmp/mem-$kv.h5 2>&1 | grep "opt memory" | tee -a "$out/kv8.log"
        done
        ;;
    kv8b)
        timeout 150 "$b/dsv4" bench --weights fp8 --kv fp8 --variants all-on --scaling none --no-baseline --layers 5 \
            --batch 64 --json "$out/bench-kv8.json" >"$out/bench-kv8.log" 2>&1
        echo "== dsv4 bench --weights fp8 --kv fp8 rc $? at ${SECONDS}s"
        grep -E "memory plan|weights .* caches|^64 " "$out/bench-kv8.log" | cut -c1-200 | head -n 8
        (OUT=$out TOOLS="memcheck racecheck" bash "$root/scripts/gpu-sanitize.sh" 200 test_kernel_sparse_attn \
            >"$out/sanitize-attn.txt" 2>&1) &
        (OUT=$out JOBS="kv8 naive" bash "$root/scripts/gpu-sanitize-model.sh" 200 >"$out/sanitize-kv8.txt" 2>&1) &
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-nccl timeout 200 ctest -R '^(test_opt_nccl|e2e_opt_nccl_gpu)$' \
            --output-on-failure -V >"$out/nccl.log" 2>&1)
        echo "== nccl tests rc $? at ${SECONDS}s"
        grep -E "Test +#|tests passed|e2e_opt_nccl_gpu:|== .*FAIL" "$out/nccl.log" | tail -n 12
        wait
        echo "== sanitizers done at ${SECONDS}s"
        cat "$out/sanitize-attn.txt" "$out/sanitize-kv8.txt" | grep -E "clean|ERROR|TIMEOUT|failed" | head -n 20
        ;;
    wo-a)
        timeout 150 "$b/dsv4" bench --weights fp8 --variants all-on --scaling none --no-baseline --layers 5 \
            --batch 64 --json "$out/bench-woa.json" >"$out/bench-woa.log" 2>&1
        echo "== dsv4 bench --weights fp8 rc $? at ${SECONDS}s"
        grep -E "^64 " "$out/bench-woa.log" | cut -c1-200 | head -n 14
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-woa timeout 300 ctest --output-on-failure -V \
            -R '^(test_kernel_qweight|test_opt_fp8|e2e_opt_fp8_gpu)$') >"$out/woa.log" 2>&1
        echo "== tests rc $? at ${SECONDS}s"
        grep -E "fp8_linear S=.*G=[2-9]|Test +#|tests passed|e2e_opt_fp8_gpu:|== .*FAIL|Failure" "$out/woa.log" |
            cut -c1-200 | tail -n 20
        ;;
    auto-kv8)
        timeout 220 "$b/dsv4" bench --weights fp8 --kv fp8 --variants all-on --scaling none --no-baseline \
            --batch 64 --json "$out/bench-auto-kv8.json" >"$out/bench-auto-kv8.log" 2>&1
        echo "== dsv4 bench --layers auto --weights fp8 --kv fp8 --batch 64 rc $? at ${SECONDS}s"
        grep -E "memory plan|weights .*caches|^64 +all-on|error|fail" "$out/bench-auto-kv8.log" | head -n 8 | cut -c1-200
        ;;
    san-model)
        rm -rf /tmp/san-model && mkdir -p /tmp/san-model # a warm machine keeps /tmp: no report of an earlier call
        for job in memcheck:test_opt_model memcheck:test_opt_fp8 memcheck:test_opt_follow_run racecheck:test_opt_fp8 \
            memcheck:test_opt_kernels racecheck:test_opt_kernels memcheck:test_gpu_cublas racecheck:test_gpu_cublas \
            memcheck:test_ref_gpu_ops racecheck:test_ref_gpu_ops; do
            (OUT=/tmp/san TOOLS=${job%%:*} bash "$root/scripts/gpu-sanitize.sh" 380 ${job#*:} \
                >"/tmp/san-model/${job/:/-}.txt" 2>&1) &
        done
        wait
        echo "== sanitizers done at ${SECONDS}s"
        cat /tmp/san-model/*.txt | tee "$out/san-model.txt"
        ;;
    ubench)
        # git on the device named an older commit than the tree it ran (session 7): pass DSV4_COMMIT in the command
        OUT=$out DSV4_COMMIT=${DSV4_COMMIT:-?} BENCH_BUDGET_S=200 \
            bash "$root/bench/run_on_device.sh" ubench --quick >"$out/ubench.log" 2>&1
        echo "== ubench rc $? at ${SECONDS}s"
        grep -E "^run_on_device|^== bench" "$out/ubench.log" | tail -n 12
        ;;
    suite)
        mkdir -p /tmp/dsv4-flash /tmp/e2e-suite
        (cd "$b" && DSV4_FLASH_MODEL=/tmp/dsv4-flash DSV4_FLASH_VARIANTS=0 DSV4_E2E_LOG=/tmp/e2e-suite timeout "${SUITE_S:-440}" \
            ctest -L gpu -E 'test_ref_gpu_flash|e2e_opt_recall_gpu' --output-on-failure) >"$out/suite.log" 2>&1
        echo "== suite rc $? at ${SECONDS}s"
        grep -E "Test +#|tests passed|tests failed" "$out/suite.log"
        grep -hE "^(e2e_opt[a-z0-9_]*:|== .*FAIL)" "$b/Testing/Temporary/LastTest.log" | head -n 60
        gzip -c "$b/Testing/Temporary/LastTest.log" >"$out/suite-LastTest.log.gz"
        ;;
    san-rest)
        rm -rf /tmp/san-rest && mkdir -p /tmp/san-rest # a warm machine keeps /tmp: no report of an earlier call
        todo=${SAN_ONLY:-}
        if [ -z "$todo" ]; then
            for t in $(cases test_opt_model) $(cases test_opt_follow_run); do todo="$todo racecheck:$t"; done
            for t in $(cases test_opt_nccl); do todo="$todo memcheck:$t racecheck:$t"; done
        fi
        for j in $todo; do
            # racecheck of test_n1_dumps runs alone: its `--gpus 1` jobs hold ~65 GB of host memory each, and
            # beside other racecheck runs they were killed part way (sessions 10 and 14; alone it is clean)
            alone=0
            [ "$j" = racecheck:test_opt_nccl:test_n1_dumps ] && alone=1 && wait
            while [ "$(jobs -rp | wc -l)" -ge "${SAN_PAR:-12}" ]; do wait -n; done
            tool=${j%%:*} t=${j#*:} lim=$((${SAN_END_S:-540} - SECONDS))
            [ $lim -gt "${SAN_BOX_S:-470}" ] && lim=${SAN_BOX_S:-470}
            if [ $lim -lt 60 ]; then echo "$tool $t: not started (no time left)" >"/tmp/san-rest/$tool-${t/:/-}.txt"; continue; fi
            extra=$(nccl_tool_args "$t")
            (OUT=/tmp/san-rest TOOLS=$tool SANITIZER_ARGS=$extra bash "$root/scripts/gpu-sanitize.sh" $lim "$t" \
                >"/tmp/san-rest/$tool-${t/:/-}.txt" 2>&1) &
            [ $alone = 1 ] && wait
        done
        wait
        echo "== sanitizers done at ${SECONDS}s"
        cat /tmp/san-rest/*.txt | tee "$out/san-rest.txt"
        tar czf "$out/san-rest-logs.tgz" -C /tmp/san-rest . 2>/dev/null
        ;;
    san-topk512)
        local d=/tmp/san-topk512 box=${SAN_BOX_S:-420}
        rm -rf "$d" && mkdir -p "$d" # a warm machine keeps /tmp: no report of an earlier call
        local all_cases="test_opt_model:test_deterministic_default test_opt_follow_run:test_follow_own_dump_topk512
            test_opt_follow_run:test_follow_one_changed_topk_row test_opt_nccl:test_n1_bitwise_plain_topk512
            test_opt_nccl:test_emulated_n2_topk512 test_opt_nccl:test_n1_dumps"
        for t in ${SAN_TOPK_CASES-$all_cases}; do
            extra=$(nccl_tool_args "$t")
            (OUT=$d TOOLS=memcheck DSV4_TEST_MAX_STEPS=0 SANITIZER_ARGS=$extra bash "$root/scripts/gpu-sanitize.sh" \
                "$box" "$t" >"$d/memcheck-${t/:/-}.txt" 2>&1) &
        done
        (OUT=$d JOBS=${SAN_TOPK_JOBS:-} bash "$root/scripts/gpu-sanitize-topk512.sh" "$box" >"$d/runs.txt" 2>&1) &
        wait
        echo "== sanitizers done at ${SECONDS}s"
        cat "$d"/memcheck-*.txt "$d/runs.txt" 2>/dev/null | tee "$out/san-topk512.txt"
        tar czf "$out/san-topk512-logs.tgz" -C "$d" --exclude='*.h5' . 2>/dev/null
        ;;
    san-long)
        local d=/tmp/san-long box=${SAN_BOX_S:-400}
        rm -rf "$d" && mkdir -p "$d" # a warm machine keeps /tmp: no report of an earlier call
        (cd "$b" && DSV4_SOURCE_DIR="$root" DSV4_BINARY_DIR="$b" DSV4_BIN="$b/dsv4" CK_FORK=no timeout 200 \
            ./test_opt_long_state) >"$d/bare.log" 2>&1
        local bare=$?
        echo "== test_opt_long_state without a tool: rc $bare at ${SECONDS}s" | tee "$out/san-long.txt"
        grep -E "bitwise equal|Failure|Assertion|%:" "$d/bare.log" | cut -c1-240 | tee -a "$out/san-long.txt"
        if [ $bare = 0 ]; then
            for t in $(cases test_opt_long_state); do
                extra=$(nccl_tool_args "$t")
                # racecheck prints every race (--print-limit 0): the Flash-width cases have cuBLAS's own
                for tool in memcheck racecheck; do
                    args=$extra
                    [ $tool = racecheck ] && args="$extra --print-limit 0"
                    (OUT=$d TOOLS=$tool SANITIZER_ARGS=$args bash "$root/scripts/gpu-sanitize.sh" "$box" "$t" \
                        >"$d/$tool-${t#*:}.txt" 2>&1) &
                done
            done
            wait
            echo "== sanitizers done at ${SECONDS}s"
            cat "$d"/memcheck-*.txt "$d"/racecheck-*.txt | tee -a "$out/san-long.txt"
            # whose kernels the races are in: cuBLAS's sm_90 GEMMs are named nvjet_*, ours are not
            for log in "$d"/sanitize-racecheck-*.log; do
                local all ours
                all=$(grep -c "Race reported between" "$log")
                ours=$(grep -E "Race reported between|^=+ +and " "$log" | grep -oE "access at [A-Za-z_0-9]+" |
                    grep -vc "access at nvjet_")
                echo "races in $(basename "$log" .log): $all reports, accesses outside cuBLAS's nvjet kernels: $ours"
            done | tee -a "$out/san-long.txt"
        fi
        tar czf "$out/san-long-logs.tgz" -C "$d" . 2>/dev/null
        ;;
    race-repro)
        local d=/tmp/race-repro
        rm -rf "$d" && mkdir -p "$d"
        nvcc -O2 -arch=sm_90 -o "$d/race" "$root/scripts/racecheck_cublas_repro.cu" -lcublas >"$d/build.log" 2>&1 ||
            { echo "race-repro: build failed"; tail -n 5 "$d/build.log"; return; }
        compute-sanitizer --version | tail -n 1 | tee "$out/race-repro.txt"
        # the racecheck options this version has
        compute-sanitizer --help | grep -E -- "--racecheck-" | tee -a "$out/race-repro.txt"
        local i=0 modes=("bare" "racecheck" "racecheck --launch-skip 40" "racecheck --launch-count 40"
            "racecheck --kernel-name kns=block_sum" "racecheck --kernel-name-exclude kns=block_sum"
            "memcheck --launch-skip 40")
        # the Flash-width GEMMs alone (RACE_FLASH=0 leaves them out): are cuBLAS's nvjet kernels reported with no
        # kernel of ours in the process? Then without racecheck's checks of asynchronous copies
        [ "${RACE_FLASH:-1}" = 1 ] && modes+=("bare|flash" "racecheck --print-limit 0|flash" "synccheck|flash"
            "racecheck --print-limit 0 --racecheck-memcpy-async no|flash")
        for entry in "${modes[@]}"; do
            i=$((i + 1))
            local mode=${entry%%|*} prog_args=""
            [ "$entry" != "$mode" ] && prog_args="2 ${entry#*|}"
            if [ "$mode" = bare ]; then
                # shellcheck disable=SC2086
                timeout 150 "$d/race" $prog_args >"$d/$i.log" 2>&1
            else
                # shellcheck disable=SC2086
                timeout 150 compute-sanitizer --tool $mode --error-exitcode 99 "$d/race" $prog_args >"$d/$i.log" 2>&1
            fi
            echo "race-repro [$mode${prog_args:+ | $prog_args}]: rc $? | $(grep -E \
                'racecheck_cublas_repro|SUMMARY|Internal|status|rror' "$d/$i.log" | grep -v "Race reported" |
                head -n 3 | tr '\n' '|' | cut -c1-300)"
            # whose kernels the races are in, as san-long counts them
            grep -oE "access at [A-Za-z_0-9]+" "$d/$i.log" | sort | uniq -c | sort -rn | head -n 12
        done | tee -a "$out/race-repro.txt"
        tar czf "$out/race-repro-logs.tgz" -C "$d" --exclude=race . 2>/dev/null
        ;;
    san-n1)
        # why test_n1_dumps' child jobs do not finish when the sanitizer follows them from the test (the way
        # gpu-sanitize.sh no longer runs that case): the whole test under memcheck at DSV4_TEST_MAX_STEPS=8 for
        # SAN_N1_S (240) s; every 30 s the live processes (elapsed time, state, wait channel); 20 s before the end
        # each live dsv4 / test process's threads (name, state, wait channel, kernel stack); packed into
        # $OUT/san-n1.tgz
        local d=/tmp/san-n1 box=${SAN_N1_S:-240}
        rm -rf "$d" && mkdir -p "$d"
        (cd "$b" && env CK_RUN_CASE=test_n1_dumps CK_FORK=no DSV4_TEST_MAX_STEPS=8 DSV4_SOURCE_DIR="$root" \
            DSV4_BINARY_DIR="$b" DSV4_BIN="$b/dsv4" timeout "$box" compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 99 ./test_opt_nccl >"$d/case.log" 2>&1
            echo "case rc $?" >>"$d/case.log") &
        local t=0
        while [ $t -lt $((box - 20)) ]; do
            sleep 10
            t=$((t + 10))
            [ $((t % 30)) -eq 0 ] || continue
            { echo "--- t=${t}s"; ps -eo pid,ppid,etimes,stat,wchan:24,pcpu,args | grep -E "dsv4 run|test_opt_nccl" |
                grep -v grep | cut -c1-200; } >>"$d/ps.txt"
        done
        for pid in $(pgrep -x dsv4) $(pgrep -x test_opt_nccl); do
            for task in /proc/"$pid"/task/*; do
                echo "== $pid/${task##*/} $(cat "$task/comm") $(cut -d' ' -f3 "$task/stat") $(cat "$task/wchan")"
                cat "$task/stack" 2>/dev/null | head -n 8
            done >"$d/threads-$pid.txt"
            ls -l /proc/"$pid"/fd >"$d/fd-$pid.txt" 2>&1
        done
        wait
        echo "== san-n1 done at ${SECONDS}s"
        cat "$d/case.log" | cut -c1-200 | tail -n 12
        tar czf "$out/san-n1.tgz" -C "$d" .
        ;;
    dumps)
        # DUMPS_BIN picks another build's dsv4 (e.g. gpu-ab.sh's base, /tmp/ab-base-tree/b/dsv4), DUMPS_NAME the
        # archive's name, so that one call can dump both builds
        dumps_bin=${DUMPS_BIN:-$b/dsv4} dumps_name=${DUMPS_NAME:-dumps}
        rm -rf /tmp/dumps && mkdir -p /tmp/dumps
        for v in "tiny|tiny|" "tiny-batch3|tiny|--batch 3 --dump-seq 2" "tiny-fp8|tiny-fp8|" "topk512|topk512|" \
            "tiny-roundtrip|tiny|--mhc roundtrip"; do
            IFS='|' read -r name set extra <<<"$v"
            read -r -a args <<<"$extra"
            "$dumps_bin" run --model "$root/golden/$set" --path opt --tokens-from "$root/golden/$set/forced.h5" \
                "${args[@]}" --dump "/tmp/dumps/$name.h5" >"/tmp/dumps/$name.log" 2>&1
            echo "== dump $name ($dumps_bin) rc $? at ${SECONDS}s"
        done
        tar czf "$out/$dumps_name.tgz" -C /tmp/dumps .
        ;;
    kvdumps)
        mkdir -p "$out/kv"
        G=$root/golden/tiny
        "$b/dsv4" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump-positions all \
            --dump /tmp/tiny-ref.h5 >/dev/null 2>&1
        for v in "tiny-free|tiny|" "tiny-follow|tiny|--follow /tmp/tiny-ref.h5" "tiny-simt|tiny|--attn simt" \
            "tiny-batch3|tiny|--batch 3 --dump-seq 2" "tiny-fp8|tiny-fp8|" "topk512|topk512|"; do
            IFS='|' read -r name set extra <<<"$v"
            read -r -a args <<<"$extra"
            "$b/dsv4" run --model "$root/golden/$set" --path opt --kv fp8 --tokens-from "$root/golden/$set/forced.h5" \
                "${args[@]}" --dump "$out/kv/$name.h5" >"/tmp/kv-$name.log" 2>&1
            echo "== kv fp8 $name rc $? at ${SECONDS}s"
        done
        ;;
    study)
        st=$out/study
        mkdir -p "$st"
        G=$root/golden/tiny
        "$b/dsv4" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump-positions all \
            --dump "$st/ref.h5" >"$st/run-ref.txt" 2>&1
        echo "== reference rc $? at ${SECONDS}s"
        for v in "default|" "attn-simt|--attn simt" "indexer-fp32|--indexer fp32" "mhc-roundtrip|--mhc roundtrip" \
            "index-max|--index-context max"; do
            name=${v%%|*}
            read -r -a args <<<"${v#*|}"
            "$b/dsv4" run --model "$G" --path opt --tokens-from "$G/forced.h5" "${args[@]}" --follow "$st/ref.h5" \
                --dump "$st/$name.h5" >"$st/run-$name.txt" 2>&1
            "$b/dsv4" verify --profile bf16 --no-color --json "$st/$name.json" "$st/ref.h5" "$st/$name.h5" \
                >"$st/verify-$name.txt" 2>&1
            echo "== $name: verify rc $? at ${SECONDS}s"
            awk '/^top-k per CSA layer/ {f = 1} f && NF == 0 {f = 0} f' "$st/verify-$name.txt"
        done
        ;;
    ctest)
        (cd "$b" && timeout "${CTEST_S:-200}" ctest -R "${CTEST_R:-^test_opt_kernels\$}" --output-on-failure) \
            >"$out/ctest.log" 2>&1
        echo "== ctest -R ${CTEST_R:-^test_opt_kernels\$} rc $? at ${SECONDS}s"
        grep -E "Test +#|tests passed|tests failed" "$out/ctest.log"
        ;;
    tests)
        (cd "$b" && timeout 200 ctest -R '^(test_opt_nccl|test_kernel_qweight|test_opt_fp8)$' --output-on-failure) \
            >"$out/tests.log" 2>&1
        rc=$?
        grep -E "^fp4_experts" "$b/Testing/Temporary/LastTest.log" | cut -c1-200 | tail -n 8
        echo "== tests rc $rc at ${SECONDS}s"
        grep -E "Test +#|tests passed" "$out/tests.log"
        ;;
    nccl)
        mkdir -p /tmp/dsv4-flash /tmp/e2e-nccl
        OUT=$out JOBS=nccl TOOLS=memcheck bash "$root/scripts/gpu-sanitize-model.sh" 200 >"$out/memcheck-nccl.txt" 2>&1 &
        timeout 150 "$b/test_ref_gpu_flash" --write-model /tmp/dsv4-flash >"$out/flash-write.log" 2>&1
        echo "== Flash model written (rc $?) at ${SECONDS}s"
        (cd "$b" && DSV4_FLASH_MODEL=/tmp/dsv4-flash DSV4_E2E_LOG=/tmp/e2e-nccl timeout 300 \
            ctest -R e2e_opt_nccl_gpu --output-on-failure -V >"$out/nccl.log" 2>&1)
        echo "== nccl e2e rc $? at ${SECONDS}s"
        grep -E "== |VERDICT|e2e_opt_nccl_gpu:" "$out/nccl.log" | grep -v "reported only" | tail -n 40
        wait
        cat "$out/memcheck-nccl.txt"
        tar czf "$out/e2e-nccl.tgz" -C /tmp/e2e-nccl . 2>/dev/null
        ;;
    ncu-fp4)
        timeout 240 ncu --kernel-name regex:'fp4_(up|down)_kernel' --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section InstructionStats --section LaunchStats --csv --page details \
            "$b/bench_qweight" --quick >"$out/ncu-fp4.csv" 2>"$out/ncu-fp4.err"
        echo "== ncu rc $? at ${SECONDS}s"
        tail -n 3 "$out/ncu-fp4.err"
        ;;
    ncu-mhc)
        timeout 240 ncu --kernel-name regex:'mhc_(partial|partial_tiled|finish|cast|sumsq|collapse|norm)_kernel' --launch-count ${NCU_MHC_COUNT:-150} \
            --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --csv \
            --page details "$b/bench_mhc" --quick >"$out/ncu-mhc.csv" 2>"$out/ncu-mhc.err"
        echo "== ncu mhc rc $? at ${SECONDS}s"
        tail -n 3 "$out/ncu-mhc.err"
        ;;
    ncu-fp8)
        timeout 200 ncu --kernel-name-base function --kernel-name fp8_linear_kernel --launch-count 120 \
            --section SpeedOfLight \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            --csv --page details "$b/bench_qweight" --quick >"$out/ncu-fp8.csv" 2>"$out/ncu-fp8.err"
        echo "== ncu fp8 rc $? at ${SECONDS}s"
        tail -n 3 "$out/ncu-fp8.err"
        ;;
    ncu-fp4-c64)
        timeout 240 ncu --kernel-name regex:'fp4_(up|down)_kernel' --launch-skip 58 --launch-count 2 \
            --section WarpStateStats --section SchedulerStats --section SourceCounters \
            --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --print-details all \
            "$b/bench_qweight" --quick >"$out/ncu-c64.txt" 2>&1
        echo "== ncu c64 rc $? at ${SECONDS}s"
        ;;
    ref)
        (cd "$b" && timeout 200 ctest -R '^(test_ref_gpu_ops|e2e_ref_gpu)$' --output-on-failure) >"$out/ref.log" 2>&1
        echo "== ref rc $? at ${SECONDS}s"
        grep -E "Test +#|tests passed" "$out/ref.log"
        ;;
    experts)
        timeout 120 "$b/bench_moe" --quick >"$out/moe.txt" 2>&1
        echo "== bench_moe rc $? at ${SECONDS}s"
        grep -E "^(ceilings|moe_experts|spot|FAIL)" "$out/moe.txt" | cut -c1-160
        timeout 120 "$b/bench_qweight" --quick >"$out/qweight.txt" 2>&1
        echo "== bench_qweight rc $? at ${SECONDS}s"
        grep -E "^(fp4_experts|FAIL)" "$out/qweight.txt" | cut -c1-160
        timeout 150 "$b/dsv4" bench --variants all-on --scaling none --no-baseline --layers 5 \
            --json "$out/bench-bf16.json" >"$out/bench-bf16.log" 2>&1
        echo "== dsv4 bench (bf16) rc $? at ${SECONDS}s"
        grep -E "all-on" "$out/bench-bf16.log" | cut -c1-160 | head -n 8
        for c in test_moe_expert_range test_fp4_expert_range; do
            (cd "$b" && CK_RUN_CASE="$c" DSV4_SOURCE_DIR=$root DSV4_BIN=$b/dsv4 timeout 120 ./test_opt_nccl) >>"$out/experts.log" 2>&1
            echo "== test_opt_nccl $c rc $?"
        done
        mkdir -p /tmp/dsv4-flash /tmp/e2e-experts
        (cd "$b" && DSV4_FLASH_MODEL=/tmp/dsv4-flash DSV4_E2E_LOG=/tmp/e2e-experts timeout "${EXPERTS_S:-300}" \
            ctest -R '^(test_kernel_qweight|test_opt_kernels|e2e_opt_gpu|e2e_opt_flash_gpu)$' -j 2 \
            --output-on-failure) >>"$out/experts.log" 2>&1
        echo "== experts tests rc $? at ${SECONDS}s"
        grep -E "^(fp4_experts|moe_experts)" "$b/Testing/Temporary/LastTest.log" | cut -c1-220
        grep -E "Test +#|tests passed|tests failed" "$out/experts.log"
        grep -hE "^(e2e_opt[a-z0-9_]*:|== .*FAIL)" "$b/Testing/Temporary/LastTest.log" | head -n 60
        ;;
    bench-q)
        timeout 120 "$b/bench_qweight" --quick >"$out/qweight.txt" 2>&1
        echo "== bench_qweight rc $? at ${SECONDS}s"
        grep -E "^(ceilings|fp4_experts|moe_experts|spot)" "$out/qweight.txt" | cut -c1-160
        ;;
    bench-fp8)
        timeout 120 "$b/dsv4" bench --weights fp8 --variants all-on --scaling none --no-baseline --layers 5 \
            --json "$out/bench-fp8.json" >"$out/bench-fp8.log" 2>&1
        echo "== dsv4 bench --weights fp8 rc $? at ${SECONDS}s"
        tail -n 12 "$out/bench-fp8.log" | cut -c1-160
        ;;
    fp8)
        (OUT=$out TOOLS="memcheck racecheck" bash "$root/scripts/gpu-sanitize.sh" 240 test_kernel_qweight \
            >"$out/sanitize-qweight.txt" 2>&1) &
        local san_pids=$!
        (OUT=$out JOBS=fp8 bash "$root/scripts/gpu-sanitize-model.sh" 240 >"$out/sanitize-fp8-job.txt" 2>&1) &
        san_pids="$san_pids $!"
        mkdir -p /tmp/e2e-fp8
        (cd "$b" && DSV4_E2E_LOG=/tmp/e2e-fp8 timeout 300 ctest \
            -R '^(test_kernel_qweight|test_opt_fp8|e2e_opt_fp8_gpu|e2e_opt_gpu)$' --output-on-failure -V) \
            >"$out/fp8.log" 2>&1
        echo "== fp8 tests rc $? at ${SECONDS}s"
        grep -E "^[0-9]+: fp4_experts|Test +#|tests passed|e2e_opt_gpu:|== .*FAIL" "$out/fp8.log" | cut -c1-200 |
            grep -v "reported only" | tail -n 40
        wait $san_pids # not a bg: step's job
        cat "$out/sanitize-qweight.txt" "$out/sanitize-fp8-job.txt"
        ;;
    split)
        timeout 150 "$b/bench_sparse_attn" --quick >"$out/attn.txt" 2>&1
        echo "== bench_sparse_attn rc $? at ${SECONDS}s"
        grep -E "^(ceilings|sparse_attn|spot)" "$out/attn.txt" | cut -c1-160
        timeout 200 "$b/dsv4" bench --weights fp8 --variants all-on --scaling none --no-baseline --batch 64 \
            --json "$out/bench-auto.json" >"$out/bench-auto.log" 2>&1
        echo "== dsv4 bench --layers auto --weights fp8 --batch 64 rc $? at ${SECONDS}s"
        grep -E "memory plan|scratch|ctx|error|fail" "$out/bench-auto.log" | head -n 12 | cut -c1-160
        ;;
    *) echo "gpu-focus: unknown step '$step'" >&2; exit 2 ;;
    esac
}
for step in "$@"; do
    case $step in
    bg:*) run_step "${step#bg:}" & ;;
    *) run_step "$step" ;;
    esac
done
wait
