#!/usr/bin/env bash
# e2e_robust_interrupt.sh - SIGINT and SIGTERM during `dsv4 run --dump` leave no file under the final name, and
# the temporary "<out>.tmp.<pid>" is removed; the exit status is the signal's (128 + N). (`dsv4 verify --json
# --html` writes its reports through the same registry, tests/test_robust_interrupt.c; it is not interrupted
# here: it writes them only at its end, too briefly to be hit reliably.) The run is the CPU reference on golden/topk512 over a 4000-token prompt fed token by token
# (--decode-from 0), every position dumped: seconds of work, and the signal is sent once the temporary exists.
set -uo pipefail
set -m # job control: a background job of a script otherwise starts with SIGINT ignored (and dsv4 keeps SIG_IGN)
bin=${DSV4_BIN:?DSV4_BIN is set by ctest}
src=${DSV4_SOURCE_DIR:?DSV4_SOURCE_DIR is set by ctest}
model=$src/golden/topk512
[ -f "$model/model.safetensors" ] || { echo "FAIL: $model/model.safetensors missing (committed golden)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

awk 'BEGIN { for (i = 0; i < 4000; i++) printf "%d ", (i * 37 + 11) % 256; print "" }' > "$tmp/prompt.txt"

for sig in INT TERM; do
    out=$tmp/run-$sig.h5
    "$bin" run --model "$model" --prompt-tokens "$tmp/prompt.txt" --decode 4 --decode-from 0 --dump-positions all \
        --dump "$out" > "$tmp/log-$sig" 2>&1 &
    pid=$!
    for _ in $(seq 1 3000); do
        [ -e "$out.tmp.$pid" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.01
    done
    [ -e "$out.tmp.$pid" ] || { cat "$tmp/log-$sig"; fail "SIG$sig: the temporary $out.tmp.$pid never appeared"; }
    sleep 0.2 # mid-way: the reference is decoding and the writer is writing rows
    kill -0 "$pid" 2>/dev/null || fail "SIG$sig: the run ended before the signal; make it longer"
    kill -"$sig" "$pid"
    wait "$pid"
    st=$?
    want=$((128 + $(kill -l "$sig")))
    [ "$st" -eq "$want" ] || { cat "$tmp/log-$sig"; fail "SIG$sig: exit status $st, want $want"; }
    [ ! -e "$out" ] || fail "SIG$sig: $out exists under its final name"
    [ ! -e "$out.tmp.$pid" ] || fail "SIG$sig: the temporary $out.tmp.$pid was left behind"
    left=$(find "$tmp" -name 'run-*.tmp.*' | wc -l)
    [ "$left" -eq 0 ] || fail "SIG$sig: $left temporary files left"
    echo "ok: SIG$sig at $(wc -c < "$tmp/log-$sig") bytes of log: no $out, no temporary, exit $st"
done
echo "e2e_robust_interrupt: ok"
