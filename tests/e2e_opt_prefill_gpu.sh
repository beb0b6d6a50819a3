#!/usr/bin/env bash
# e2e_opt_prefill_gpu.sh - the optimized path's chunked prefill on every committed golden set (issue 35 "Done
# when"), gated as decode is gated in tests/e2e_opt_gpu.sh: `dsv4 run --path opt --follow REF --prefill-chunk N`
# verified with `dsv4 verify --profile bf16` against the transformers golden (the drawn architectures random-106/109
# in baseline mode, `--baseline` the CPU bf16 emulation following the same choices), plus the issue's numbers (tie-aware
# top-k with no strict miss, recall where a layer holds >= 4,096 picks, router agreement >= 99%, logits argmax
# >= 99%; tests/support/e2e_opt_lib.sh). REF is the reference's dump of every position of the golden's tokens
# (ref-cpu; topk512: ref-gpu with --probes topk_idx,router_ids, what --follow needs).
#   chunk sizes   tiny (prompt 21, off both ratios 4/8, window 8): 1 (token by token), 3, 4, 7, the whole prompt;
#                 tiny-fp8 (its FP8 weights): 3, 7; random-106 (64, on the boundaries of 2/32, window 16): 4,
#                 whole; random-109 (78, off 4/8, window 8): 7, whole; topk512 (2296, on 4, off 16, window 32,
#                 574 entries ranked for 512 picks): 1, 128, 512, whole. Chunks longer than the window exercise the
#                 fresh window rows; chunks that close several compressed entries, the compressor runs.
#   switches      tiny at chunk 7 with each naive variant (--attn simt, --indexer fp32, --mhc roundtrip,
#                 --index-context max): gated; --kv fp8: reported (as in e2e_opt_gpu).
#   mixed batch   tiny, --batch 3 --dump-seq 2 --prefill-chunk 8: copy c starts c steps later; decodes go first,
#                 so at most steps one copy prefills while the others decode, all of different lengths; the
#                 last copy is dumped and follows: gated.
#   same path     the chunk-7 and whole-prompt dumps of tiny, and the chunk-512 and whole-prompt dumps of
#                 topk512, against the same set's token-by-token dump (chunk 1): the bf16 verdict and the same
#                 numbers, gated.
# Ends with "N passed, M failed". Logs in $DSV4_E2E_LOG (default: a temporary folder). Skipped (77) without a GPU.
set -u -o pipefail
BIN="${DSV4_BIN:?}"
SRC="${DSV4_SOURCE_DIR:?}"
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-prefill-XXXXXX")
trap 'rm -rf "$T"' EXIT
LOG="${DSV4_E2E_LOG:-$T}"
mkdir -p "$LOG"
pass=0
fail=0
reported=0
t0=$SECONDS
# shellcheck source=tests/support/e2e_opt_lib.sh
source "$SRC/tests/support/e2e_opt_lib.sh"

# prompt_len of a golden set (its README table; the dumps' attribute would need an HDF5 tool)
declare -A PLEN=([tiny]=21 [tiny-fp8]=21 [random-106]=64 [random-109]=78 [topk512]=2296)
declare -A CHUNKS=([tiny]="1 3 4 7 whole" [tiny-fp8]="3 7" [random-106]="4 whole" [random-109]="7 whole"
                   [topk512]="1 128 512 whole")

for set in tiny tiny-fp8 random-106 random-109 topk512; do
    G="$SRC/golden/$set"
    [ -f "$G/forced.h5" ] || { echo "== $set: FAIL ($G/forced.h5 missing)"; fail=$((fail + 1)); continue; }
    topk_of "$G"
    ref="$T/$set-ref.h5"
    if [ "$set" = topk512 ]; then
        run "$set-ref" "$G" ref-gpu --tokens-from "$G/forced.h5" --dump-positions all \
            --probes topk_idx,router_ids || ref=""
    else
        run "$set-ref" "$G" ref-cpu --tokens-from "$G/forced.h5" --dump-positions all || ref=""
    fi
    [ -n "$ref" ] || continue
    # the drawn architectures are judged in baseline mode: the fixed bf16 profile encodes the three sets it was
    # calibrated on and false-alarms on others (docs/verify.md "Baseline mode"); the baseline is the CPU bf16
    # emulation following the same choices
    VERIFY_BASELINE=""
    if [[ $set == random-* ]]; then
        if run "$set-base" "$G" ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" --follow "$ref"; then
            VERIFY_BASELINE=$T/$set-base.h5
        else
            continue
        fi
    fi
    for c in ${CHUNKS[$set]}; do
        n=$c
        [ "$c" = whole ] && n=${PLEN[$set]}
        name="$set-chunk-$c"
        if run "$name" "$G" opt --tokens-from "$G/forced.h5" --prefill-chunk "$n" --follow "$ref"; then
            grep -q "prefill ${PLEN[$set]} in" "$LOG/run-$name.txt" ||
                { echo "== $name: FAIL (the run did not prefill the ${PLEN[$set]}-token prompt)"; fail=$((fail + 1)); }
            verify "$name-vs-golden" 1 "$G/forced.h5" "$T/$name.h5"
        fi
    done
done

VERIFY_BASELINE=""
G="$SRC/golden/tiny"
topk_of "$G"
ref="$T/tiny-ref.h5"
if [ -f "$ref" ]; then
    for v in "attn-simt|--attn simt" "indexer-fp32|--indexer fp32" "mhc-roundtrip|--mhc roundtrip" \
             "index-max|--index-context max" "batch3|--batch 3 --dump-seq 2 --prefill-chunk 8"; do
        name="tiny-prefill-${v%%|*}"
        read -r -a args <<<"${v#*|}"
        run "$name" "$G" opt --tokens-from "$G/forced.h5" --prefill-chunk 7 "${args[@]}" --follow "$ref" &&
            verify "$name-vs-golden" 1 "$G/forced.h5" "$T/$name.h5"
        rm -f "$T/$name.h5"
    done
    run tiny-prefill-kv-fp8 "$G" opt --tokens-from "$G/forced.h5" --prefill-chunk 7 --kv fp8 --follow "$ref" &&
        verify tiny-prefill-kv-fp8-vs-golden 0 "$G/forced.h5" "$T/tiny-prefill-kv-fp8.h5"
    # the same path fed token by token, against chunked feeding
    for c in 7 whole; do
        [ -f "$T/tiny-chunk-1.h5" ] && [ -f "$T/tiny-chunk-$c.h5" ] &&
            verify "tiny-chunk-$c-vs-chunk-1" 1 "$T/tiny-chunk-1.h5" "$T/tiny-chunk-$c.h5"
    done
fi
G="$SRC/golden/topk512"
topk_of "$G"
for c in 512 whole; do
    [ -f "$T/topk512-chunk-1.h5" ] && [ -f "$T/topk512-chunk-$c.h5" ] &&
        verify "topk512-chunk-$c-vs-chunk-1" 1 "$T/topk512-chunk-1.h5" "$T/topk512-chunk-$c.h5"
done

echo "e2e_opt_prefill_gpu: $reported comparison(s) reported, not gated; $((SECONDS - t0)) s in all"
echo "e2e_opt_prefill_gpu: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ]
