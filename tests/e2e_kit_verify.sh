#!/usr/bin/env bash
# e2e_kit_verify.sh - dumps written by the Python kit against dumps written by dsv4 itself, through `dsv4 verify` (CPU).
# What is compared, plainly:
#   1. `dsv4 run --path ref-cpu` of golden/tiny (the C writer) is re-written row by row through dsv4dump.DumpWriter
#      (python/tests/kit_rewrite.py: one row() per layer, probe and position, the digest computed by the kit from the
#      model folder): every dataset of the kit's file equals the C file's bit for bit, and `dsv4 verify --profile
#      fp32` of the two passes (same numbers; this tests the writer, the layout and the digest rule, not a model);
#   2. the transformers golden (golden/tiny/forced.h5, made by golden/make_golden.py, which writes through the kit's
#      transformers adapter and DumpWriter on the device machine) re-written by the kit verifies against the ref-cpu
#      run with --profile fp32: transformers' numbers in a kit file against dsv4's reference, as an engine's dump
#      would be;
#   3. a partial dump (no kv, compressed_kv, indexer_scores, mHC probes; only the last prompt position and the decode
#      positions) passes `dsv4dump check`, verifies against the golden (exit 0) with the report naming what the
#      candidate lacks, fails with --require indexer_scores (exit 1), passes with --require out,final/logits, and a
#      --require glob matching nothing is exit 2;
#   4. a --prompt-tokens file written by the kit runs: `dsv4 run --prompt-tokens` takes it.
set -u -o pipefail
ROOT="${DSV4_SOURCE_DIR:?}"
BIN="${DSV4_BIN:?}"
G="$ROOT/golden/tiny"
# shellcheck source=tests/support/kit_python.sh
source "$ROOT/tests/support/kit_python.sh"
kit_python || { echo "e2e_kit_verify: 0 passed, 1 failed"; exit 1; }
[ -f "$G/forced.h5" ] || { echo "FAILED: $G/forced.h5 missing (committed golden)"; echo "e2e_kit_verify: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-kit-verify-XXXXXX")
trap 'rm -rf "$T"' EXIT
export PYTHONPATH="$ROOT/python:$ROOT/python/tests" PYTHONDONTWRITEBYTECODE=1
fail=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=1; }; }
expect() { # expect STATUS CMD...: run, print the output, the exit status must be STATUS
    local want=$1 out rc
    shift
    echo "+ $* (expect exit $want)"
    out=$("$@" 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed 's/^/    /'
    LAST_OUT=$out
    [ $rc -eq "$want" ] || { echo "FAILED: exit $rc, expected $want: $*"; fail=1; return 1; }
}
has() { case $LAST_OUT in *"$1"*) return 0 ;; esac; echo "FAILED: the output lacks: $1"; fail=1; return 1; }
lacks() { case $LAST_OUT in *"$1"*) echo "FAILED: the output has: $1"; fail=1; return 1 ;; esac; return 0; }

step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/ref.h5"

# 1. the C writer's file through the kit
step "$KIT_PY" "$ROOT/python/tests/kit_rewrite.py" "$T/ref.h5" "$T/kit.h5" --model "$G"
same() {
    "$KIT_PY" - "$T/ref.h5" "$T/kit.h5" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
def datasets(f):
    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(out)
da, db = datasets(a), datasets(b)
assert da == db, f"dataset lists differ: {sorted(set(da) ^ set(db))[:6]}"
for n in da:
    x, y = a[n][()], b[n][()]
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), f"{n} differs"
for k in ("schema", "config_json", "weights_digest", "prompt_len", "n_decode", "mode"):
    assert a.attrs[k] == b.attrs[k], f"attribute {k}: {a.attrs[k]!r} vs {b.attrs[k]!r}"
print(f"kit file = C file: {len(da)} datasets bit for bit, root attributes equal (the digest too)")
PY
}
step same
expect 0 "$BIN" verify --no-color --profile fp32 "$T/ref.h5" "$T/kit.h5" && has "VERDICT: PASS" && lacks "only in"

# 2. transformers' numbers, written by the kit, against the reference
step "$KIT_PY" "$ROOT/python/tests/kit_rewrite.py" "$G/forced.h5" "$T/tf.h5" --model "$G" --producer "transformers golden via dsv4dump"
expect 0 "$BIN" verify --no-color --profile fp32 "$T/tf.h5" "$T/ref.h5" && has "VERDICT: PASS" && lacks "only in"

# 3. a partial candidate
step "$KIT_PY" "$ROOT/python/tests/kit_rewrite.py" "$T/ref.h5" "$T/partial.h5" --model "$G" --positions decode \
    --omit 'kv,compressed_kv,indexer_scores,*_hc_*'
expect 0 "$KIT_PY" -m dsv4dump check "$T/partial.h5" && has "omitted (a partial dump): attn_hc_pre (layers 0-5)"
expect 1 "$KIT_PY" -m dsv4dump check --complete "$T/partial.h5" && has "missing (--complete)"
expect 0 "$BIN" verify --no-color --profile fp32 "$G/forced.h5" "$T/partial.h5" && has "VERDICT: PASS" &&
    has "compared   44 positions (20..63)" &&
    has "only in golden: 48 datasets the candidate did not provide, not compared" &&
    has "attn_hc_comb (layers 0-5), kv (layers 0-5), ffn_hc_pre (layers 0-5)" &&
    has "compressed_kv (layers 1-4), indexer_scores (layers 1, 3)" &&
    has "only in golden: 20 of its 64 stored positions the candidate did not store, not compared: 0-19"
expect 1 "$BIN" verify --no-color --profile fp32 --require indexer_scores "$G/forced.h5" "$T/partial.h5" &&
    has "first divergence: position 20, layer 1 (csa/hash), indexer_scores" && has "REQUIRED"
expect 0 "$BIN" verify --no-color --profile fp32 --require 'out,final/logits,topk_idx,router_*' "$G/forced.h5" "$T/partial.h5"
expect 2 "$BIN" verify --no-color --require 'indexer-scores' "$G/forced.h5" "$T/partial.h5" &&
    has "--require 'indexer-scores' matches no dataset of the golden"

# 4. a prompt file from the kit
step "$KIT_PY" -c 'import sys; from dsv4dump.tokens import write_prompt_tokens; write_prompt_tokens(sys.argv[1], [5, 17, 200, 3, 99])' "$T/prompt.txt"
expect 0 "$BIN" run --model "$G" --path ref-cpu --prompt-tokens "$T/prompt.txt" --decode 2 --dump "$T/p.h5" &&
    has "dump: $T/p.h5 (7 positions)"
expect 0 "$KIT_PY" -m dsv4dump check --complete "$T/p.h5"

[ $fail -eq 0 ] && echo "e2e_kit_verify: 1 passed, 0 failed" || echo "e2e_kit_verify: 0 passed, 1 failed"
exit $fail
