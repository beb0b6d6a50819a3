#!/usr/bin/env bash
# e2e_ref_gpu.sh - the GPU fp32 reference end to end on every committed golden set, through the command line:
# for each set, `dsv4 run --path ref-gpu` and `--path ref-cpu` on the golden's tokens, then
#   dsv4 verify --profile fp32 CPU.h5 GPU.h5      (the GPU reference against the CPU reference)
#   dsv4 verify --profile fp32 GOLDEN.h5 GPU.h5   (and against transformers)
# Sets: tiny forced, tiny greedy (the golden's 32 greedy tokens), tiny token by token (--decode-from 0), topk512,
# tiny-fp8. Skipped (77) without a GPU; a set not committed is skipped.
#
# topk512 ranks up to 578 entries for 512 picks at every prefill position past 2,050, where the GPU's and the
# CPU's fp32 index scores (different summation orders, ~1e-7 apart) can order a near-tie pair differently at
# a position the golden does not store. Such a flip is a legitimate tie (the verifier accepts it where the
# position is stored), but it changes that token's attention output and so, downstream, the compressed
# entries that pool it (per-entry probes, ~5e-4). For topk512 the per-entry probes are therefore gated at 1e-3
# (VERIFY_TOL); a diagnostic comparison of every position shows where a flip happened and that it is accepted.
set -u -o pipefail
ROOT="${DSV4_SOURCE_DIR:?}/golden"
BIN="${DSV4_BIN:?}"
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-ref-gpu-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0 pass=0 ran=0
step() { echo "+ $*"; "$@" || { echo "FAILED: $*"; fail=$((fail + 1)); return 1; }; }
# one comparison: name, set dir, golden dump, extra run options...
case_run() {
    local name=$1 G=$2 gold=$3
    shift 3
    [ -f "$G/$gold" ] || { echo "golden $G/$gold not committed: $name skipped"; return 0; }
    ran=$((ran + 1))
    local f0=$fail
    step "$BIN" run --model "$G" --path ref-gpu --tokens-from "$G/$gold" "$@" --dump "$T/$name.gpu.h5"
    step "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/$gold" "$@" --dump "$T/$name.cpu.h5"
    echo "== $name: GPU reference vs CPU reference"
    step "$BIN" verify --profile fp32 ${VERIFY_TOL:-} "$T/$name.cpu.h5" "$T/$name.gpu.h5"
    echo "== $name: GPU reference vs golden"
    step "$BIN" verify --profile fp32 ${VERIFY_TOL:-} "$G/$gold" "$T/$name.gpu.h5"
    [ $fail -eq $f0 ] && pass=$((pass + 1))
    return 0
}
case_run tiny-forced "$ROOT/tiny" forced.h5
case_run tiny-greedy "$ROOT/tiny" greedy.h5 --greedy
case_run tiny-tbt "$ROOT/tiny" forced.h5 --decode-from 0
VERIFY_TOL="--tol compressed_kv=rel_l2:1e-3 --tol indexer_kv=rel_l2:1e-3" case_run topk512 "$ROOT/topk512" forced.h5
if [ -f "$ROOT/topk512/forced.h5" ]; then
    echo "== topk512 diagnostic (not gated): every position, GPU vs CPU"
    "$BIN" run --model "$ROOT/topk512" --path ref-gpu --tokens-from "$ROOT/topk512/forced.h5" --dump-positions all \
        --dump "$T/all.gpu.h5" >/dev/null &&
    "$BIN" run --model "$ROOT/topk512" --path ref-cpu --tokens-from "$ROOT/topk512/forced.h5" --dump-positions all \
        --dump "$T/all.cpu.h5" >/dev/null &&
    "$BIN" verify --profile fp32 "$T/all.cpu.h5" "$T/all.gpu.h5" | head -n 40
fi
case_run tiny-fp8 "$ROOT/tiny-fp8" forced.h5
[ $ran -gt 0 ] || { echo "no golden set committed: skipped"; exit 77; }
echo "e2e_ref_gpu: $pass passed, $((ran - pass)) failed"
[ $fail -eq 0 ]
