#!/usr/bin/env bash
# e2e_ref_tiny_fp8.sh - the CPU reference on the committed `tiny-fp8` golden set: the tiny weights in the
# OFFICIAL checkpoint names with FP8 e4m3 block-scaled linears and FP4 e2m1 experts, dequantised by the loader;
# `dsv4 run --tokens-from golden/tiny-fp8/forced.h5` verified with `dsv4 verify --profile fp32`, every probe of the
# golden present in the run's dump (none 'only in golden').
# golden/tiny-fp8 is committed (golden/README.md): a missing file fails the test, it is not a skip.
set -u -o pipefail
G="${DSV4_SOURCE_DIR:?}/golden/tiny-fp8"
BIN="${DSV4_BIN:?}"
[ -f "$G/forced.h5" ] || { echo "FAILED: $G/forced.h5 missing (committed golden)"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-tiny-fp8-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
# shellcheck source=tests/support/e2e_verify_lib.sh
source "${DSV4_SOURCE_DIR:?}/tests/support/e2e_verify_lib.sh" # verify_all
step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/forced.h5"
step verify_all --profile fp32 "$G/forced.h5" "$T/forced.h5"
[ $fail -eq 0 ] && echo "e2e_ref_tiny_fp8: 1 passed, 0 failed" || echo "e2e_ref_tiny_fp8: 0 passed, 1 failed"
exit $fail
