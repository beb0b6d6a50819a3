#!/usr/bin/env bash
# e2e_ref_topk512.sh - the CPU reference on the committed `topk512` golden set (index_topk = 512 with more than
# 512 visible compressed entries at the decode positions, so the real top-512 ranking is exercised):
# `dsv4 run --tokens-from golden/topk512/forced.h5` verified with `dsv4 verify --profile fp32`, every probe of the
# golden present in the run's dump (none 'only in golden').
# golden/topk512 is committed (golden/README.md): a missing file fails the test, it is not a skip.
set -u -o pipefail
G="${DSV4_SOURCE_DIR:?}/golden/topk512"
BIN="${DSV4_BIN:?}"
[ -f "$G/forced.h5" ] || { echo "FAILED: $G/forced.h5 missing (committed golden)"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-topk512-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
# shellcheck source=tests/support/e2e_verify_lib.sh
source "${DSV4_SOURCE_DIR:?}/tests/support/e2e_verify_lib.sh" # verify_all
step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/forced.h5"
step verify_all --profile fp32 "$G/forced.h5" "$T/forced.h5"
[ $fail -eq 0 ] && echo "e2e_ref_topk512: 1 passed, 0 failed" || echo "e2e_ref_topk512: 0 passed, 1 failed"
exit $fail
