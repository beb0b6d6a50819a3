#!/usr/bin/env bash
# test.sh - the whole test suite on a fresh machine: installs what is missing, builds, runs every ctest
# (GPU tests are skipped with exit 77 where there is no GPU), then the CPU tests again in a second build
# under AddressSanitizer + UBSan, so a leak or overflow fails the run; then the CPU unit tests under valgrind
# memcheck (installs valgrind) and a 30-second smoke run of each fuzzer (installs clang + libclang-rt; builds
# build-fuzz). Ends with a plain "N passed, N failed, N skipped" line counting every ctest test, every
# valgrind run and every fuzz smoke run; exit status 0 only if nothing failed.
# DSV4_SKIP_VALGRIND=1 / DSV4_SKIP_FUZZ=1 skip those steps (counted as skipped), e.g. where apt cannot install.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_ctest() { # $1 build dir, $2.. ctest args; a build where ctest finds no test fails (ctest's default is exit 0)
    local dir=$1
    shift
    (cd "$dir" && ctest --output-on-failure --no-tests=error -j"$jobs" "$@") 2>&1 | tee -a "$log"
    return "${PIPESTATUS[0]}"
}

status=0
build=$(bash "$root/scripts/setup.sh" "$root/build" | tail -n 1) || { echo "dsv4: build failed" >&2; exit 1; }
echo "== dsv4 tests ($build)"
run_ctest "$build" || status=1

asan=$(bash "$root/scripts/setup.sh" "$root/build-asan" -DDSV4_CUDA=OFF -DDSV4_SANITIZE=ON | tail -n 1) ||
    { echo "dsv4: sanitizer build failed" >&2; exit 1; }
echo "== dsv4 tests under AddressSanitizer + UBSan ($asan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run_ctest "$asan" -LE gpu || status=1

# ------------------------------------------------------------------------------------ valgrind memcheck
# The Check unit tests of model/ (quant.c included), dump/, verify/ (the after-tie rule included), the follow table,
# the opt options, the --gpus plan and the serving scheduler (host code), the reference ops, the golden-set checks
# and the robustness tests, unforked (CK_FORK=no: valgrind follows one process). Not run: the e2e reference runs and timing tests
# (minutes under valgrind, and covered by the sanitizer build), test_ref_model (it interposes malloc to prove
# decode allocates nothing, which valgrind's own malloc replaces).
vg_tests=(test_model_config test_model_dequant test_model_load test_model_corrupt test_quantize test_dump_compat
          test_dump_corrupt test_dump_probe test_dump_roundtrip test_verify_basic test_verify_filters test_verify_topk
          test_verify_reports test_verify_after_tie test_verify_partial test_opt_follow test_opt_options
          test_opt_shard_plan test_serve_sched test_ref_ops test_golden test_robust_limits test_robust_dump
          test_robust_interrupt test_robust_regressions test_opt_prefill_plan)
extra_log=$(mktemp)
trap 'rm -f "$log" "$extra_log"' EXIT
vg_one() { # $1 test name; prints one result line
    local t=$1 out=$vgdir/$1.out vlog=$vgdir/$1.valgrind start=$SECONDS
    if [ ! -x "$build/$t" ]; then
        echo "valgrind: $t: FAILED (not built)"
        return
    fi
    if (cd "$build" && env DSV4_SOURCE_DIR="$root" DSV4_BINARY_DIR="$build" DSV4_BIN="$build/dsv4" CK_FORK=no \
        CK_DEFAULT_TIMEOUT=1200 OPENBLAS_NUM_THREADS=1 valgrind -q --leak-check=full --errors-for-leak-kinds=definite \
        --error-exitcode=1 --log-file="$vlog" "./$t" > "$out" 2>&1); then
        echo "valgrind: $t: passed ($((SECONDS - start)) s)"
    else
        echo "valgrind: $t: FAILED ($((SECONDS - start)) s)"
        tail -n 20 "$out"
        head -n 60 "$vlog"
    fi
}
if [ "${DSV4_SKIP_VALGRIND:-0}" = 1 ]; then
    echo "valgrind: skipped (DSV4_SKIP_VALGRIND=1)" | tee -a "$extra_log"
elif ! bash "$root/scripts/deps.sh" valgrind >&2; then
    echo "valgrind: FAILED (cannot install valgrind)" | tee -a "$extra_log"
else
    echo "== dsv4 CPU unit tests under valgrind memcheck ($build)"
    vgdir=$(mktemp -d)
    for ((i = 0; i < ${#vg_tests[@]}; i += jobs)); do
        for t in "${vg_tests[@]:i:jobs}"; do vg_one "$t" > "$vgdir/$t.result" & done
        wait
        for t in "${vg_tests[@]:i:jobs}"; do cat "$vgdir/$t.result"; done
    done | tee -a "$extra_log"
    rm -rf "$vgdir"
fi

# ----------------------------------------------------------------------------------------- fuzz smoke
if [ "${DSV4_SKIP_FUZZ:-0}" = 1 ]; then
    echo "fuzz smoke: skipped (DSV4_SKIP_FUZZ=1)" | tee -a "$extra_log"
elif ! bash "$root/scripts/deps.sh" clang >&2 ||
    ! bash "$root/scripts/deps.sh" "libclang-rt-$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n 1)-dev" >&2; then
    echo "fuzz smoke: FAILED (cannot install clang and its libFuzzer runtime)" | tee -a "$extra_log"
elif ! fuzz=$(bash "$root/scripts/setup.sh" "$root/build-fuzz" -DDSV4_FUZZ=ON -DDSV4_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang | tail -n 1); then
    echo "fuzz smoke: FAILED (the fuzz build failed)" | tee -a "$extra_log"
else
    echo "== fuzz smoke: 30 s per fuzzer ($fuzz)"
    bash "$root/tests/fuzz/smoke.sh" "$fuzz" 30 2>&1 | tee -a "$extra_log"
fi

# ctest prints "N% tests passed, F tests failed out of T" per run, and marks each skipped test "***Skipped";
# the valgrind and fuzz steps print one "valgrind: <test>: passed|FAILED" / "fuzz smoke: <target>: ..." line each.
total=$(awk '/tests failed out of/ {t += $NF} END {print t + 0}' "$log")
failed=$(awk '/tests failed out of/ {f += $4} END {print f + 0}' "$log")
skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
passed=$((total - failed - skipped))
passed=$((passed + $(grep -cE '^(valgrind|fuzz smoke): [^ ]+: passed' "$extra_log")))
failed=$((failed + $(grep -cE '^(valgrind|fuzz smoke): .*FAILED' "$extra_log")))
skipped=$((skipped + $(grep -cE '^(valgrind|fuzz smoke): skipped' "$extra_log")))
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] || status=1
exit $status
