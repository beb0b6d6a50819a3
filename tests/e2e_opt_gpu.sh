#!/usr/bin/env bash
# e2e_opt_gpu.sh - the optimized path end to end on every committed golden set (issue 6 "Done when").
#
# THE GATE is decision following (docs/optimized.md "Decision following"): for each set, the CPU reference is run
# on the golden's forced tokens with every position dumped, and `dsv4 run --path opt --follow REF.h5` runs with all
# switches at their defaults AND each naive variant alone (--attn simt, --indexer fp32, --mhc roundtrip,
# --index-context max), plus --graph off and a staggered batch (--batch 3 --dump-seq 2: three copies of
# different lengths at every step, the last one dumped and following). Each following run is verified with
# `dsv4 verify --profile bf16` against REF and against the transformers golden, and must also meet the issue's
# numbers: per CSA layer no strict miss (tie-aware acceptance 100%) and strict top-k recall (mean) >= 0.99,
# router_ids rows identical >= 99% (over all MoE layers), logits argmax equal or tie-accepted >= 99% of positions.
# The recall is gated here where one prompt holds at least 4,096 picks per CSA layer (topk512: 17 rows x 512); on
# the index_topk = 4 sets (tiny, tiny-fp8: 256 picks) it is printed here and gated pooled over the golden prompt
# and 63 random ones by tests/e2e_opt_recall_gpu.sh (tests/support/e2e_opt_lib.sh says why).
# tiny greedy: the greedy golden's tokens are forced (--tokens-from greedy.h5 --forced) and followed, gated the
# same way against a CPU reference of those tokens and against greedy.h5.
#
# Reported, NOT gated: the free-running runs (every variant above without --follow, and free greedy decoding)
# and --kv fp8 (free and following). Why: on these golden models (index_topk 4, 4..8 experts) one bf16 near-tie
# in the indexer top-k or the router swaps 1 of 4 keys or experts, moves that position's output by O(1), and the
# damage travels through the residual and the caches; a CPU reference with the same bf16 roundings reproduces the
# same failure digit for digit. A free-running comparison measures that chaos, not the path. Following keeps
# every later step on the reference's choices while the dump still records the path's own ones, so selection
# agreement stays measured and every probe is compared on the same context.
#
# Printed per run: the verifier's VERDICT (and first divergence), the top-k table (strict recall, accepted =
# tie-aware picks, strict misses), router agreement, the logits argmax line, the follow line of `dsv4 run`; full
# logs in $DSV4_E2E_LOG (default: a temporary folder). Ends with "N passed, M failed". Skipped (77) without a GPU.
set -u -o pipefail
BIN="${DSV4_BIN:?}"
SRC="${DSV4_SOURCE_DIR:?}"
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-opt-XXXXXX")
trap 'rm -rf "$T"' EXIT
LOG="${DSV4_E2E_LOG:-$T}"
mkdir -p "$LOG"
pass=0
fail=0
reported=0

# shellcheck source=tests/support/e2e_opt_lib.sh
source "$SRC/tests/support/e2e_opt_lib.sh"

variants=("default|" "attn-simt|--attn simt" "indexer-fp32|--indexer fp32" "mhc-roundtrip|--mhc roundtrip"
          "index-max|--index-context max" "graph-off|--graph off" "batch3|--batch 3 --dump-seq 2")
for set in tiny topk512 tiny-fp8; do
    G="$SRC/golden/$set"
    [ -f "$G/forced.h5" ] || { echo "== $set: FAIL ($G/forced.h5 missing: the golden sets are committed)"; fail=$((fail + 1)); continue; }
    topk_of "$G"
    ref="$T/$set-ref.h5"
    run "$set-ref" "$G" ref-cpu --tokens-from "$G/forced.h5" --dump-positions all || ref=""
    [ -n "$ref" ] && verify "$set-ref-vs-golden" 0 "$G/forced.h5" "$ref"
    for v in "${variants[@]}"; do
        name="$set-${v%%|*}"
        read -r -a args <<<"${v#*|}"
        if [ -n "$ref" ] && run "$name-follow" "$G" opt --tokens-from "$G/forced.h5" "${args[@]}" --follow "$ref"; then
            verify "$name-follow-vs-ref" 1 "$ref" "$T/$name-follow.h5"
            verify "$name-follow-vs-golden" 1 "$G/forced.h5" "$T/$name-follow.h5"
        fi
        if run "$name-free" "$G" opt --tokens-from "$G/forced.h5" "${args[@]}"; then
            verify "$name-free-vs-golden" 0 "$G/forced.h5" "$T/$name-free.h5"
            [ -n "$ref" ] && verify "$name-free-vs-ref" 0 "$ref" "$T/$name-free.h5"
        fi
        rm -f "$T/$name-follow.h5" "$T/$name-free.h5"
    done
    if [ -n "$ref" ] && run "$set-kv-fp8-follow" "$G" opt --tokens-from "$G/forced.h5" --kv fp8 --follow "$ref"; then
        verify "$set-kv-fp8-follow-vs-ref" 0 "$ref" "$T/$set-kv-fp8-follow.h5"
    fi
    if run "$set-kv-fp8-free" "$G" opt --tokens-from "$G/forced.h5" --kv fp8; then
        verify "$set-kv-fp8-free-vs-golden" 0 "$G/forced.h5" "$T/$set-kv-fp8-free.h5"
    fi
done
G="$SRC/golden/tiny"
topk_of "$G"
if [ ! -f "$G/greedy.h5" ]; then
    echo "== tiny-greedy: FAIL ($G/greedy.h5 missing: the golden sets are committed)"
    fail=$((fail + 1))
else
    ref="$T/tiny-greedy-ref.h5"
    run tiny-greedy-ref "$G" ref-cpu --tokens-from "$G/greedy.h5" --forced --dump-positions all || ref=""
    if [ -n "$ref" ] && run tiny-greedy-follow "$G" opt --tokens-from "$G/greedy.h5" --forced --follow "$ref"; then
        verify tiny-greedy-follow-vs-ref 1 "$ref" "$T/tiny-greedy-follow.h5"
        verify tiny-greedy-follow-vs-golden 1 "$G/greedy.h5" "$T/tiny-greedy-follow.h5"
    fi
    if run tiny-greedy-free "$G" opt --tokens-from "$G/greedy.h5" --greedy; then
        verify tiny-greedy-free-vs-golden 0 "$G/greedy.h5" "$T/tiny-greedy-free.h5"
    fi
fi
echo "e2e_opt_gpu: $reported free-running / kv fp8 comparisons reported, not gated (one bf16 near-tie flip on these"
echo "  tiny models moves the rest of the run by O(1): see the header and docs/optimized.md)"
echo "e2e_opt_gpu: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ]
