#!/usr/bin/env bash
# e2e_recall_emu.sh - the pooled strict-recall gate of issue 6 (docs/verify.md "The strict-recall gate") met by
# the bf16 design itself, on the CPU: for golden/tiny and golden/tiny-fp8 (index_topk 4), the golden prompt and 63
# random ones (scripts/flip_rate.sh --golden -n 63 --gate 0.99), each run following the fp32 CPU reference:
#   the control, the fp32 reference following its own dump: pooled recall exactly 1.0000 on both CSA layers;
#   the bf16 emulation (ref-cpu --emulate bf16, an independent model of the optimized path's roundings): pooled
#   strict recall >= 0.99 on every CSA layer, the gate tests/e2e_opt_recall_gpu.sh holds the optimized path to.
# If the emulation fails here, the gate asks more than the design's own rounding gives, and the GPU gate's
# failures say nothing about the kernels. The golden sets are committed: a missing one fails, it is not a skip.
set -u -o pipefail
SRC="${DSV4_SOURCE_DIR:?}"
export DSV4_BIN="${DSV4_BIN:?}"
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-recall-emu-XXXXXX")
trap 'rm -rf "$T"' EXIT
jobs=$(nproc 2>/dev/null || echo 2)
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }
for set in tiny tiny-fp8; do
    G="$SRC/golden/$set"
    [ -f "$G/forced.h5" ] || { echo "FAILED: $G/forced.h5 missing (committed golden)"; fail=1; continue; }
    echo "== $set: the golden prompt + 63 random prompts"
    bash "$SRC/scripts/flip_rate.sh" --model "$G" --golden -n 63 -j "$jobs" --gate 0.99 --out "$T/$set" \
        "fp32=--path ref-cpu" "emu=--path ref-cpu --emulate bf16" >"$T/$set.txt" 2>"$T/$set.err"
    rc=$?
    cat "$T/$set.txt"
    [ $rc -le 1 ] || cat "$T/$set.err"
    check "$set: every run compared and the gate held (exit 0, was $rc)" '[ $rc -eq 0 ]'
    check "$set: 64 prompts x 2 configurations x 2 CSA layers counted" '[ "$(wc -l <"$T/$set/flips.txt")" = 256 ]'
    check "$set: control pooled recall 1 on L1 and L3" \
        'grep -q "^gate fp32: pooled strict recall L1 1.00000 L3 1.00000: PASS" "$T/$set.txt"'
    check "$set: emulation pooled recall >= 0.99 on L1 and L3" 'grep -qE "^gate emu: .*: PASS" "$T/$set.txt"'
done
[ $fail -eq 0 ] && echo "e2e_recall_emu: 1 passed, 0 failed" || echo "e2e_recall_emu: 0 passed, 1 failed"
exit $fail
