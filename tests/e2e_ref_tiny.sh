#!/usr/bin/env bash
# e2e_ref_tiny.sh - the CPU reference on the committed `tiny` golden set, end to end through the command line:
#   forced: `dsv4 run --tokens-from golden/tiny/forced.h5` verified with `dsv4 verify --profile fp32`;
#   greedy: `dsv4 run --greedy` reproduces the golden's 32 greedy tokens (verify fails on any token difference);
#   token by token: `--decode-from 0` (the whole prompt as one-token decode steps) verifies the same way;
# each verification also needs every probe of the golden in the run's dump (none 'only in golden').
# golden/tiny is committed (golden/README.md): a missing file fails the test, it is not a skip.
set -u -o pipefail
G="${DSV4_SOURCE_DIR:?}/golden/tiny"
BIN="${DSV4_BIN:?}"
[ -f "$G/forced.h5" ] && [ -f "$G/greedy.h5" ] || { echo "FAILED: $G/forced.h5 or greedy.h5 missing (committed golden)"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-tiny-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
# shellcheck source=tests/support/e2e_verify_lib.sh
source "${DSV4_SOURCE_DIR:?}/tests/support/e2e_verify_lib.sh" # verify_all
step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/forced.h5"
step verify_all --profile fp32 "$G/forced.h5" "$T/forced.h5"
step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/greedy.h5" --greedy --dump "$T/greedy.h5"
step verify_all --profile fp32 "$G/greedy.h5" "$T/greedy.h5"
step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --decode-from 0 --dump "$T/tbt.h5"
step verify_all --profile fp32 "$G/forced.h5" "$T/tbt.h5"
[ $fail -eq 0 ] && echo "e2e_ref_tiny: 1 passed, 0 failed" || echo "e2e_ref_tiny: 0 passed, 1 failed"
exit $fail
