#!/usr/bin/env bash
# gpu-sanitize.sh [SECONDS [TEST...]] - on the GPU machine, after scripts/gpu-test.sh has built build-gpu/: run each GPU test
# binary (or the TESTs named) under compute-sanitizer memcheck, racecheck and initcheck, each run time-boxed to
# SECONDS (default 90). TOOLS="racecheck initcheck" picks the tools.
# Prints one line per (tool, test): clean, ERRORS (with the sanitizer's summary) or TIMEOUT (not completed).
# Racecheck runs with DSV4_TEST_MAX_WORK=9000 (override by setting it): the kernel tests skip their few cases
# above that size, which racecheck's ~1000x slowdown cannot finish; the smaller cases take the same code paths.
# A TEST of the form binary:case runs that one Check test case (CK_RUN_CASE; the tests of test_opt_model,
# test_opt_follow_run, test_opt_nccl and test_opt_kernels are each a case of their own), so a slow binary can be
# split over parallel runs; a case that runs no check is reported as an error, not as clean.
# Every run has DSV4_TEST_MAX_STEPS=25 (override by setting it): the model-level tests step at most 25 positions of
# a golden prompt in-process and leave out their golden/topk512 cases (tests/support/dsv4_test.h); 0 runs them whole.
# SANITIZER_ARGS adds options to compute-sanitizer (the NCCL tests: "--report-api-errors no", see docs/robustness.md).
# The cases in child_job_cases (below) run bare, their child jobs each under the tool.
# Exit status 1 if any run reported errors, 2 when there is no test binary to run (no build-gpu/ yet).
# Logs to $OUT/sanitize-<tool>-<test>.log when OUT is set.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${1:-90}
shift || true
out=${OUT:-$root/out}
mkdir -p "$out"
build=$root/build-gpu
export DSV4_SOURCE_DIR=$root DSV4_BINARY_DIR=$build DSV4_BIN=$build/dsv4 CK_FORK=no
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
tests=${*:-$(cd "$build" 2>/dev/null && ls test_gpu_* test_kernel_* test_opt_* test_ref_gpu_ops 2>/dev/null)}
# no test binary found (no build-gpu/ yet) ran nothing: that is not a clean result
[ -n "$tests" ] || { echo "gpu-sanitize: no GPU test binaries in $build: run scripts/gpu-test.sh first" >&2; exit 2; }
# Cases whose GPU work is all in child `dsv4 run` jobs using NCCL: such a job as a child of a sanitized process
# did not finish (H200, sessions 8-10), so the test runs bare and each job under its own compute-sanitizer
# (DSV4_TEST_RUN_UNDER); clean means the test passed and every job's summary says 0 errors / 0 hazards.
child_job_cases="test_opt_nccl:test_n1_dumps"
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck}; do
    for t in $tests; do
        bin=${t%%:*} case=
        [ "$bin" != "$t" ] && case=${t#*:}
        log=$out/sanitize-$tool-${t/:/-}.log
        max_work=${DSV4_TEST_MAX_WORK:-}
        [ "$tool" = racecheck ] && max_work=${DSV4_TEST_MAX_WORK:-9000}
        # CK_RUN_CASE set but empty would run no case at all, so it is only set for binary:case
        tool_cmd="compute-sanitizer --tool $tool ${SANITIZER_ARGS:-} --error-exitcode 99"
        if [[ " $child_job_cases " == *" $t "* ]]; then
            # the tool runs each child job (DSV4_TEST_RUN_UNDER), the test itself runs bare
            env CK_RUN_CASE="$case" DSV4_TEST_MAX_WORK=$max_work DSV4_TEST_MAX_STEPS=${DSV4_TEST_MAX_STEPS:-25} \
                DSV4_TEST_RUN_UNDER="$tool_cmd" timeout "$limit" "$build/$bin" >"$log" 2>&1
            rc=$?
            jobs_seen=$(grep -cE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")
            jobs_clean=$(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)' "$log")
            summary="$jobs_clean of $jobs_seen child jobs' summaries clean"
            [ "$jobs_seen" -gt "$jobs_clean" ] && rc=99
            [ $rc -eq 0 ] && [ "$jobs_seen" -eq 0 ] && rc=96
        else
            # shellcheck disable=SC2086
            env ${case:+CK_RUN_CASE=$case} DSV4_TEST_MAX_WORK=$max_work DSV4_TEST_MAX_STEPS=${DSV4_TEST_MAX_STEPS:-25} \
                timeout "$limit" $tool_cmd "$build/$bin" >"$log" 2>&1
            rc=$?
            summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
        fi
        # Check prints "100%: Checks: N, ..."; a misspelt case name runs none and would otherwise look clean
        if [ $rc -eq 0 ] && [ -n "$case" ] && ! grep -qE 'Checks: [1-9]' "$log"; then rc=98; fi
        # a case that leaves itself out under DSV4_TEST_MAX_STEPS says so; it is not reported as clean
        left=$(grep -c 'not run (DSV4_TEST_MAX_STEPS is set)' "$log")
        if [ $rc -eq 0 ] && [ -n "$case" ] && [ "$left" -gt 0 ]; then rc=97; fi
        [ "$left" -gt 0 ] && summary="$summary; $left case(s) not run under DSV4_TEST_MAX_STEPS"
        case $rc in
        96) echo "$tool $t: no child job ran under the tool"; status=1 ;;
        97) echo "$tool $t: not run (the case leaves itself out under DSV4_TEST_MAX_STEPS)" ;;
        98) echo "$tool $t: ran no check (no test case named $case)"; status=1 ;;
        0) echo "$tool $t: clean ${summary:+($summary)}" ;;
        124) echo "$tool $t: TIMEOUT after ${limit}s (not completed)" ;;
        99) echo "$tool $t: ERRORS ($summary)"; status=1 ;;
        *) echo "$tool $t: test failed under the tool, rc $rc ${summary:+($summary)}"; status=1 ;;
        esac
    done
done
exit $status
