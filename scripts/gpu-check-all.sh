#!/usr/bin/env bash
# gpu-check-all.sh [SANITIZE_SECONDS] - on the GPU machine, the whole correctness pass in one device call:
#   1. build (scripts/gpu-test.sh, with a first quick test);
#   2. in the background, compute-sanitizer runs (SANITIZE env: "tool:test ..." pairs; default memcheck and
#      racecheck of the optimized-path tests), each time-boxed to SANITIZE_SECONDS (default 300);
#   3. meanwhile every GPU ctest except the slow CPU-vs-GPU Flash reference check, with the Flash-width model
#      written once to /tmp/dsv4-flash (DSV4_FLASH_MODEL) and the Flash e2e at its defaults only;
#   4. the sanitizer summaries; logs of everything into $OUT/logs.tgz (ctest's LastTest.log, the e2e logs).
# Knobs: SANITIZE=" " runs no test-binary sanitizers; SANITIZE_MODEL=SECONDS also runs
# scripts/gpu-sanitize-model.sh (whole `dsv4 run` jobs under the tools) in the background; CTEST_REGEX limits
# the ctests (ctest -R); DSV4_FLASH_VARIANTS=1 adds the naive variants to the Flash e2e; CTEST_BUDGET_S.
# Exit status: ctest's when it failed, else 1 when a sanitizer run reported errors (gpu-sanitize*.sh's own exit 1;
# a TIMEOUT is printed, not counted), else 0.
#   device call: command "bash scripts/gpu-check-all.sh", carry [".debs"]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/dsv4-logs/e2e /tmp/dsv4-logs/san
limit=${1:-300}
bash "$root/scripts/gpu-test.sh" -R test_gpu_cublas >"$out/build-and-first-test.log" 2>&1 ||
    { tail -n 40 "$out/build-and-first-test.log"; exit 1; }
pids=()
for job in ${SANITIZE:-memcheck:test_opt_model racecheck:test_opt_model memcheck:test_opt_nccl \
    racecheck:test_opt_nccl memcheck:test_opt_fp8 memcheck:test_opt_follow_run racecheck:test_kernel_qweight}; do
    OUT=/tmp/dsv4-logs/san TOOLS=${job%%:*} bash "$root/scripts/gpu-sanitize.sh" "$limit" "${job#*:}" \
        >"/tmp/dsv4-logs/san/${job%%:*}-${job#*:}.txt" 2>&1 &
    pids+=($!)
done
if [ -n "${SANITIZE_MODEL:-}" ]; then
    OUT=/tmp/dsv4-logs/san bash "$root/scripts/gpu-sanitize-model.sh" "$SANITIZE_MODEL" \
        >/tmp/dsv4-logs/san/model-jobs.txt 2>&1 &
    pids+=($!)
fi
export DSV4_E2E_LOG=/tmp/dsv4-logs/e2e DSV4_FLASH_MODEL=/tmp/dsv4-flash DSV4_FLASH_VARIANTS=${DSV4_FLASH_VARIANTS:-0}
mkdir -p "$DSV4_FLASH_MODEL"
(cd "$root/build-gpu" && timeout ${CTEST_BUDGET_S:-450} ctest -L gpu -E 'test_ref_gpu_flash' ${CTEST_REGEX:+-R "$CTEST_REGEX"} --timeout 420 \
    --output-on-failure) \
    >"$out/ctest-all.log" 2>&1
rc=$?
grep -E "Test +#|tests passed|tests failed" "$out/ctest-all.log"
cp "$root/build-gpu/Testing/Temporary/LastTest.log" /tmp/dsv4-logs/ 2>/dev/null &&
    grep -hE "^(e2e_opt[a-z0-9_]*:|== .*(FAIL|PASS|rc [0-9]))" /tmp/dsv4-logs/LastTest.log | head -n 80
# each sanitizer run's own status: \`wait "${pids[@]}"\` returned only the last one's, and none reached the exit
san_rc=0
for p in "${pids[@]}"; do wait "$p" || san_rc=1; done
cat /tmp/dsv4-logs/san/*.txt
tar czf "$out/logs.tgz" --exclude='*.h5' -C /tmp/dsv4-logs .
[ "$rc" -ne 0 ] && exit "$rc"
[ "$san_rc" -eq 0 ] || echo "gpu-check-all: a sanitizer run reported errors (above)"
exit $san_rc
