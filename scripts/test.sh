#!/usr/bin/env bash
# test.sh - the whole test suite on a fresh machine: installs what is missing, builds, runs every ctest
# (GPU tests are skipped with exit 77 where there is no GPU), then the CPU tests again in a second build
# under AddressSanitizer + UBSan, so a leak or overflow fails the run. Ends with a plain
# "N passed, N failed, N skipped" line; exit status 0 only if nothing failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_ctest() { # $1 build dir, $2.. ctest args
    local dir=$1
    shift
    (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@") 2>&1 | tee -a "$log"
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

# ctest prints "N% tests passed, F tests failed out of T" per run, and marks each skipped test "***Skipped".
total=$(awk '/tests failed out of/ {t += $NF} END {print t + 0}' "$log")
failed=$(awk '/tests failed out of/ {f += $4} END {print f + 0}' "$log")
skipped=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$log")
passed=$((total - failed - skipped))
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] || status=1
exit $status
