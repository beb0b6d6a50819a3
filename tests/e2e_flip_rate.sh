#!/usr/bin/env bash
# e2e_flip_rate.sh - scripts/flip_rate.sh on the CPU, 4 prompts of golden/tiny:
#   the control, the fp32 reference following its own dump, must differ in no top-k row and fail no prompt;
#   the bf16 emulation must run and be counted on both CSA layers (L1, L3) of all 4 prompts;
#   --summary of the kept lines must print the same tables; bad usage exits 2 with a message.
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
check "control: fp32 L1 and L3 over 4 prompts, 0 rows differ" \
    '[ "$(grep -cE "^fp32 +L[13] +4 +0\.00 +4/0/0/0/0 +0$" "$T/out.txt")" = 2 ]'
check "control: no prompt fails" 'grep -q "^fp32: 0 of 4 prompts (0.0%)" "$T/out.txt"'
check "emulation counted on L1 and L3 over 4 prompts" '[ "$(grep -cE "^emu +L[13] +4 " "$T/out.txt")" = 2 ]'
check "emulation's prompts counted" 'grep -qE "^emu: [0-4] of 4 prompts" "$T/out.txt"'
check "16 per-prompt lines kept" '[ "$(wc -l <"$T/kept/flips.txt")" = 16 ]'
bash "$SRC/scripts/flip_rate.sh" --summary "$T/kept/flips.txt" >"$T/again.txt" 2>&1
check "--summary prints the same tables" 'cmp -s "$T/out.txt" "$T/again.txt"'
bash "$SRC/scripts/flip_rate.sh" -n 0 "x=--path ref-cpu" >"$T/bad.txt" 2>&1
rc=$?
check "-n 0 is refused with exit 2 (was $rc)" '[ $rc -eq 2 ] && grep -q "positive integer" "$T/bad.txt"'
bash "$SRC/scripts/flip_rate.sh" -n 2 >"$T/bad.txt" 2>&1
rc=$?
check "no configuration is refused with exit 2 (was $rc)" '[ $rc -eq 2 ] && grep -q "NAME=ARGS" "$T/bad.txt"'
[ $fail -eq 0 ] && echo "e2e_flip_rate: 1 passed, 0 failed" || echo "e2e_flip_rate: 0 passed, 1 failed"
exit $fail
