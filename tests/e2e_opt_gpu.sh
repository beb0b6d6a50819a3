#!/usr/bin/env bash
# e2e_opt_gpu.sh - the optimized path end to end on every committed golden set (issue 6 "Done when"):
#   for each set, `dsv4 run --path opt` with all switches at their defaults AND each naive variant alone
#   (--attn simt, --indexer fp32, --mhc roundtrip, --index-context max), plus --graph off and a staggered batch
#   (--batch 3 --dump-seq 2: three copies of different lengths at every step, the last one dumped), each verified
#   with `dsv4 verify --profile bf16` against the transformers golden AND against the CPU reference's dump;
#   --kv fp8 is run and reported (its deviations shown by the verifier), not gated; tiny greedy must pass too.
# The verifier's verdict, top-k table and logits line of every run are printed; full logs go to
# $DSV4_E2E_LOG (default: a temporary folder). Skipped (77) without a GPU.
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
# verify NAME GATED GOLDEN CANDIDATE: one verifier run, summary lines printed, counted when gated
verify() {
    local name=$1 gated=$2 g=$3 c=$4 log="$LOG/verify-$1.txt"
    "$BIN" verify --profile bf16 --no-color "$g" "$c" >"$log" 2>&1
    local rc=$?
    echo "== $name (rc $rc$([ "$gated" = 1 ] || echo ', reported only'))"
    grep -E '^VERDICT|^first divergence|^logits \(|^tokens ' "$log" | sed 's/^/   /'
    awk '/^top-k per CSA layer/{f=1;next} f&&/^L /{next} f&&NF==0{f=0} f{print "   topk " $0}' "$log"
    if [ "$gated" = 1 ]; then
        if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    fi
}
run_opt() { # run_opt NAME MODEL ARGS...
    local name=$1 model=$2
    shift 2
    if ! "$BIN" run --model "$model" --path opt "$@" --dump "$T/$name.h5" >"$LOG/run-$name.txt" 2>&1; then
        echo "== $name: dsv4 run FAILED"
        tail -n 5 "$LOG/run-$name.txt" | sed 's/^/   /'
        fail=$((fail + 1))
        return 1
    fi
    grep -E '^dsv4 run:' "$LOG/run-$name.txt" | sed 's/^/   /'
}
variants=("default|" "attn-simt|--attn simt" "indexer-fp32|--indexer fp32" "mhc-roundtrip|--mhc roundtrip"
          "index-max|--index-context max" "graph-off|--graph off" "batch3|--batch 3 --dump-seq 2")
for set in tiny topk512 tiny-fp8; do
    G="$SRC/golden/$set"
    [ -f "$G/forced.h5" ] || { echo "golden/$set not committed: skipped"; continue; }
    "$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/$set-ref.h5" \
        >"$LOG/run-$set-ref.txt" 2>&1 || { echo "== $set: CPU reference run FAILED"; fail=$((fail + 1)); }
    for v in "${variants[@]}"; do
        name="$set-${v%%|*}"
        read -r -a args <<<"${v#*|}"
        run_opt "$name" "$G" --tokens-from "$G/forced.h5" "${args[@]}" || continue
        verify "$name-vs-golden" 1 "$G/forced.h5" "$T/$name.h5"
        [ -f "$T/$set-ref.h5" ] && verify "$name-vs-ref" 1 "$T/$set-ref.h5" "$T/$name.h5"
    done
    if run_opt "$set-kv-fp8" "$G" --tokens-from "$G/forced.h5" --kv fp8; then
        verify "$set-kv-fp8-vs-golden" 0 "$G/forced.h5" "$T/$set-kv-fp8.h5"
    fi
done
G="$SRC/golden/tiny"
if [ -f "$G/greedy.h5" ] && run_opt tiny-greedy "$G" --tokens-from "$G/greedy.h5" --greedy; then
    verify tiny-greedy-vs-golden 1 "$G/greedy.h5" "$T/tiny-greedy.h5"
fi
echo "e2e_opt_gpu: $pass passed, $fail failed"
[ $fail -eq 0 ]
