#!/usr/bin/env bash
# e2e_serve_args.sh - `dsv4 bench --serve` refuses bad input with exit 2 and a message naming the option, before any
# GPU work (so in every build, with or without a GPU): zero requests, an output of 0 tokens, an input longer than the
# maximum context, a token budget below one decode per request in flight, a prefill chunk outside 1 .. budget, an
# unknown option, a malformed length range; --help exits 0 and names the metrics. `dsv4 bench --prefill` likewise
# refuses a --max-context not above the prompt or past 1M, --expert-lanes 9, an unknown --mhc-pre and --batch 0.
# (The serving runs themselves need a GPU: scripts/serve_on_device.sh.)
set -uo pipefail
bin=${DSV4_BIN:?DSV4_BIN is set by ctest}
fail=0
expect() { # expect OPTION ARGS...: exit 2 and OPTION in the message
    local opt=$1
    shift
    out=$("$bin" bench --serve "$@" 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || [[ $out != *"$opt"* ]]; then
        echo "FAIL: dsv4 bench --serve $*: exit $rc, expected 2 naming $opt; said: $out"
        fail=1
    else
        echo "ok: $* -> exit 2: $(echo "$out" | head -n 1)"
    fi
}
expect --requests --requests 0
expect --output-len --output-len 0
expect --output-len --output-len 8:4
expect --max-context --input-len 5000 --output-len 10 --max-context 4096
expect --max-context --input-len 4090 --output-len 8 --max-context 4096 --concurrency 1  # 4097 positions
expect --token-budget --concurrency 64 --token-budget 32
expect --prefill-chunk --token-budget 256 --prefill-chunk 512
expect --prefill-chunk --prefill-chunk 0
expect --concurrency --concurrency 0
expect --rate --rate -1
expect --weights --weights fp4
expect --bogus --bogus 1
# a request that fits exactly (4089 + 8 - 1 = 4096 positions) passes the checks: without a GPU the exit is 2 for
# want of CUDA or a device, and the message says so rather than naming an option (with a GPU it would serve: left out)
if ! nvidia-smi -L >/dev/null 2>&1; then
    out=$("$bin" bench --serve --input-len 4089 --output-len 8 --max-context 4096 --concurrency 1 --requests 1 \
        --warmup 0 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || [[ $out != *"CUDA"* ]]; then
        echo "FAIL: a request that fits: exit $rc, expected 2 for want of CUDA: $out"
        fail=1
    fi
fi
# the prefill bench's own refusals, also before any GPU work
expect_prefill() { # expect_prefill OPTION ARGS...
    local opt=$1
    shift
    out=$("$bin" bench "$@" 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || [[ $out != *"$opt"* ]]; then
        echo "FAIL: dsv4 bench $*: exit $rc, expected 2 naming $opt; said: $out"
        fail=1
    else
        echo "ok: $* -> exit 2: $(echo "$out" | head -n 1)"
    fi
}
expect_prefill --max-context --prefill 1000 --max-context 1000
expect_prefill --max-context --prefill 1000 --max-context 2000000
expect_prefill --expert-lanes --prefill 1000 --expert-lanes 9
expect_prefill --mhc-pre --prefill 1000 --mhc-pre cols
expect_prefill --batch --prefill 1000 --batch 0
help=$("$bin" bench --serve --help)
rc=$?
if [ $rc -ne 0 ] || [[ $help != *TTFT* ]] || [[ $help != *--seeds-table* ]]; then
    echo "FAIL: --help: exit $rc"
    fail=1
fi
exit $fail
