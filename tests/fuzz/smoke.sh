#!/usr/bin/env bash
# smoke.sh BUILD_FUZZ_DIR [SECONDS] - the fuzzers' CI smoke run: each target first replays its committed
# regression inputs (tests/fuzz/regressions/<target>/, inputs that once crashed), then fuzzes for SECONDS (default
# 30) from its seed corpus (tests/fuzz/corpus/<target>/, copied: the committed corpus is not modified), two at a
# time. Prints one line per target, "fuzz smoke: <target>: passed (...)" or "... FAILED (...)", and exits with
# the number of failed targets. fuzz_dump_raw is not run: its findings are libhdf5's (tests/fuzz/README.md).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: smoke.sh BUILD_FUZZ_DIR [SECONDS]}
secs=${2:-30}
targets=(safetensors config index dump)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export TMPDIR=$work

run_one() { # $1 target
    local t=$1 bin=$build/fuzz_$1 log=$work/$1.log
    mkdir -p "$work/corpus-$t"
    if [ -d "$here/regressions/$t" ] && ls "$here/regressions/$t"/* >/dev/null 2>&1; then
        "$bin" -timeout=10 -rss_limit_mb=2048 "$here/regressions/$t"/* > "$log.reg" 2>&1 || {
            echo "fuzz smoke: fuzz_$t: FAILED (a regression input fails again: $log.reg)"
            tail -n 30 "$log.reg"
            return 1
        }
    fi
    "$bin" -timeout=10 -rss_limit_mb=2048 -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="$work/$t-" "$work/corpus-$t" "$here/corpus/$t" > "$log" 2>&1
    local rc=$?
    local runs eps cov
    runs=$(awk -F: '/stat::number_of_executed_units/ {print $NF+0}' "$log")
    eps=$(awk -F: '/stat::average_exec_per_sec/ {print $NF+0}' "$log")
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        echo "fuzz smoke: fuzz_$t: passed (${secs} s, ${runs:-?} runs, ${eps:-?} exec/s, ${cov:-no coverage line})"
    else
        echo "fuzz smoke: fuzz_$t: FAILED (exit $rc; the input is kept under $work only for this run)"
        grep -E "ERROR|SUMMARY|#[0-9]+ .* in " "$log" | head -n 30
        ls "$work/$t-"* 2>/dev/null | while read -r a; do echo "  artifact: $a ($(wc -c < "$a") bytes)"; od -An -c "$a" | head -n 5; done
        return 1
    fi
}

failed=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    pids=()
    for t in "${targets[@]:i:2}"; do
        run_one "$t" > "$work/$t.result" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
    for t in "${targets[@]:i:2}"; do cat "$work/$t.result"; done
done
exit $failed
