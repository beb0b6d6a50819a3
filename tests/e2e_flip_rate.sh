#!/usr/bin/env bash
# e2e_flip_rate.sh - scripts/flip_rate.sh on the CPU, 4 prompts of golden/tiny:
#   the control, the fp32 reference following its own dump, must differ in no top-k row, fail no prompt and
#   have pooled recall 1.0000;
#   the bf16 emulation must run and be counted on both CSA layers (L1, L3) of all 4 prompts;
#   --summary of the kept lines must print the same tables; bad usage exits 2 with a message;
#   --gate on hand-written lines: the pooled recall weighs each prompt by its rows, a configuration at the gate
#   passes, one below it fails (exit 1) and is named, lines of the older 7-field form still count.
# golden/tiny is committed (golden/README.md): a missing model fails the test, it is not a skip.
set -u -o pipefail
SRC="${DSV4_SOURCE_DIR:?}"
export DSV4_BIN="${DSV4_BIN:?}"
[ -f "$SRC/golden/tiny/config.json" ] || { echo "FAILED: $SRC/golden/tiny/config.json missing (committed golden)"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-flips-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }
bash "$SRC/scripts/flip_rate.sh" -n 4 -j 2 --out "$T/kept" "fp32=--path ref-cpu" "emu=--path ref-cpu --emulate bf16" \
    >"$T/out.txt" 2>"$T/err.txt"
rc=$?
cat "$T/out.txt"
check "exit status 0 (was $rc)" '[ $rc -eq 0 ]'
check "control: fp32 L1 and L3 over 4 prompts, 0 rows differ, pooled recall 1" \
    '[ "$(grep -cE "^fp32 +L[13] +4 +0\.00 +4/0/0/0/0 +0 +1\.0000$" "$T/out.txt")" = 2 ]'
check "control: no prompt fails" 'grep -q "^fp32: 0 of 4 prompts (0.0%)" "$T/out.txt"'
check "emulation counted on L1 and L3 over 4 prompts" '[ "$(grep -cE "^emu +L[13] +4 " "$T/out.txt")" = 2 ]'
check "emulation's prompts counted" 'grep -qE "^emu: [0-4] of 4 prompts" "$T/out.txt"'
check "16 per-prompt lines kept" '[ "$(wc -l <"$T/kept/flips.txt")" = 16 ]'
bash "$SRC/scripts/flip_rate.sh" --summary "$T/kept/flips.txt" >"$T/again.txt" 2>&1
check "--summary prints the same tables" 'cmp -s "$T/out.txt" "$T/again.txt"'
check "verdicts counted: the control within the profile on 4 of 4" \
    'grep -q "^fp32: the verifier (--profile bf16) finds 4 of 4 prompts within the profile" "$T/out.txt"'
# --gate on hand-written lines (NAME SEED LAYER ROWS_DIFF ACCEPTED STRICT RECALL_MEAN ROWS VERIFY):
#   at: L1 (0.98 x 64 + 1.0 x 64) / 128 = 0.99 exactly, L3 1.0 -> PASS at 0.99
#   low: L1 (0.98 x 192 + 1.0 x 64) / 256 = 0.985 (the mean of the two prompt means would be 0.99) -> FAIL
#   old: the 7-field form of earlier runs, weighed 1 each: (0.995 + 0.995) / 2 -> PASS
cat >"$T/gate.txt" <<'LINES'
at 1 1 5 5 0 0.9800 64 0
at 1 3 0 0 0 1.0000 64 0
at 2 1 0 0 0 1.0000 64 1
at 2 3 0 0 0 1.0000 64 1
low 1 1 15 15 0 0.9800 192 0
low 1 3 0 0 0 1.0000 192 0
low 2 1 0 0 0 1.0000 64 0
low 2 3 0 0 0 1.0000 64 0
old 1 1 1 1 0 0.9950
old 1 3 1 1 0 0.9950
old 2 1 1 1 0 0.9950
old 2 3 1 1 0 0.9950
LINES
bash "$SRC/scripts/flip_rate.sh" --gate 0.99 --summary "$T/gate.txt" >"$T/gate.out" 2>&1
rc=$?
cat "$T/gate.out"
check "--gate: a configuration below it fails the run (exit 1, was $rc)" '[ $rc -eq 1 ]'
check "--gate: at the gate passes" 'grep -q "^gate at: pooled strict recall L1 0.99000 L3 1.00000: PASS" "$T/gate.out"'
check "--gate: pooled by rows, below fails" 'grep -q "^gate low: pooled strict recall L1 0.98500 L3 1.00000: FAIL" "$T/gate.out"'
check "--gate: 7-field lines count" 'grep -q "^gate old: pooled strict recall L1 0.99500 L3 0.99500: PASS" "$T/gate.out"'
check "verdicts: one of two prompts within the profile" \
    'grep -q "^at: the verifier (--profile bf16) finds 1 of 2 prompts within the profile" "$T/gate.out"'
grep -v '^low' "$T/gate.txt" >"$T/gate-ok.txt"
bash "$SRC/scripts/flip_rate.sh" --gate 0.99 --summary "$T/gate-ok.txt" >"$T/gate-ok.out" 2>&1
rc=$?
check "--gate: every configuration at or above it exits 0 (was $rc)" '[ $rc -eq 0 ]'
bash "$SRC/scripts/flip_rate.sh" --gate 1.5 --summary "$T/gate.txt" >"$T/bad.txt" 2>&1
rc=$?
check "--gate 1.5 is refused with exit 2 (was $rc)" '[ $rc -eq 2 ] && grep -q "recall in (0, 1]" "$T/bad.txt"'
bash "$SRC/scripts/flip_rate.sh" -n 0 "x=--path ref-cpu" >"$T/bad.txt" 2>&1
rc=$?
check "-n 0 is refused with exit 2 (was $rc)" '[ $rc -eq 2 ] && grep -q "positive integer" "$T/bad.txt"'
bash "$SRC/scripts/flip_rate.sh" -n 2 >"$T/bad.txt" 2>&1
rc=$?
check "no configuration is refused with exit 2 (was $rc)" '[ $rc -eq 2 ] && grep -q "NAME=ARGS" "$T/bad.txt"'
[ $fail -eq 0 ] && echo "e2e_flip_rate: 1 passed, 0 failed" || echo "e2e_flip_rate: 0 passed, 1 failed"
exit $fail
