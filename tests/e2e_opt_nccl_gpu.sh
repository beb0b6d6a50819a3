#!/usr/bin/env bash
# e2e_opt_nccl_gpu.sh - `dsv4 run --path opt --gpus 1` (the NCCL path on one rank, issue 8) end to end on every
# committed golden set: each run verified with `dsv4 verify --profile bf16` against the CPU reference's dump
# (and, reported only, against the transformers golden), for the defaults, --graph off and a staggered batch;
# also --gpus 2 (every golden set divides by 2) with DSV4_NCCL_REPLICA_CHECK=1, against the CPU reference and
# against the --gpus 1 run: on 2 GPUs over NCCL, on one GPU through the test-only emulation
# (DSV4_NCCL_EMULATE_ONE_GPU=1: both ranks on GPU 0, the all-reduce a host sum). Merged with main: --gpus 1
# and 2 with --follow (the CPU reference's dump: every rank applies the same rows), --gpus 1 --weights fp8 on
# tiny-fp8, and --gpus 2 --weights fp8 there refused (exit 2: its FP8 slices are not whole 128 scale blocks).
# Optional: DSV4_FLASH_MODEL=DIR (a Flash-width model, `test_ref_gpu_flash --write-model DIR`) adds a 300-token
# greedy prompt run verified against the GPU reference's dump (the CPU one is too slow at that width).
# The verifier's verdict, first divergence and logits lines are printed; logs go to $DSV4_E2E_LOG (default: a
# temporary folder). Skipped (77) without a GPU.
set -u -o pipefail
BIN="${DSV4_BIN:?}"
SRC="${DSV4_SOURCE_DIR:?}"
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-nccl-XXXXXX")
trap 'rm -rf "$T"' EXIT
LOG="${DSV4_E2E_LOG:-$T}"
mkdir -p "$LOG"
pass=0
fail=0
# verify NAME GATED REFERENCE CANDIDATE
verify() {
    local name=$1 gated=$2 g=$3 c=$4 log="$LOG/verify-$1.txt"
    "$BIN" verify --profile bf16 --no-color "$g" "$c" >"$log" 2>&1
    local rc=$?
    # a dataset missing from the candidate is listed by the verifier, not failed: a failure here
    grep -q '^only in golden: [0-9]* dataset' "$log" && [ $rc -eq 0 ] && rc=1 # a missing probe; not positions
    echo "== $name (rc $rc$([ "$gated" = 1 ] || echo ', reported only'))"
    grep -E '^VERDICT|^first divergence|^logits \(|^tokens |^only in golden' "$log" | sed 's/^/   /'
    if [ "$gated" = 1 ]; then
        if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    fi
}
run() { # run NAME MODEL ARGS...: dsv4 run ... --dump $T/NAME.h5
    local name=$1 model=$2
    shift 2
    if ! "$BIN" run --model "$model" "$@" --dump "$T/$name.h5" >"$LOG/run-$name.txt" 2>&1; then
        echo "== $name: dsv4 run FAILED"
        tail -n 5 "$LOG/run-$name.txt" | sed 's/^/   /'
        fail=$((fail + 1))
        return 1
    fi
    grep -E '^dsv4 run:' "$LOG/run-$name.txt" | sed 's/^/   /'
}
variants=("gpus1|--gpus 1" "gpus1-graph-off|--gpus 1 --graph off" "gpus1-batch3|--gpus 1 --batch 3 --dump-seq 2")
# with 2 GPUs the sets (all divide by 2) also run split: --gpus 2, replica check on
# on one GPU, the test-only emulation of 2 ranks (both on GPU 0, the all-reduce a host sum: opt_ranks.c)
export DSV4_NCCL_REPLICA_CHECK=1
if [ "$(nvidia-smi -L | grep -c '^GPU')" -ge 2 ]; then
    variants+=("gpus2|--gpus 2")
else
    variants+=("gpus2-emulated|--gpus 2")
fi
for set in tiny topk512 tiny-fp8; do
    G="$SRC/golden/$set"
    [ -f "$G/forced.h5" ] || { echo "== $set: FAIL ($G/forced.h5 missing: the golden sets are committed)"; fail=$((fail + 1)); continue; }
    # every position: the follow runs need the prefill's choices too, or the prefill runs free and its flips
    # compound into the compressed entries (seen on the H200: topk512 compressed_kv from position 327)
    run "$set-ref" "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump-positions all || continue
    # tiny-fp8 defaults to --weights fp8, whose per-rank FP8 slices must be whole 128 scale blocks: its tiny
    # shapes are not, so its variants hold the (dequantised) weights in bf16, as before the merge, and one
    # --gpus 1 --weights fp8 run is added
    wb=""
    [ "$set" = tiny-fp8 ] && wb=" --weights bf16"
    vs=()
    for v in "${variants[@]}"; do vs+=("$v$wb"); done
    # decision following (the gate of docs/optimized.md): every rank applies the reference's rows
    vs+=("gpus1-follow|--gpus 1 --follow $T/$set-ref.h5$wb")
    gpus2=$(printf '%s\n' "${variants[@]}" | grep '^gpus2' | head -n 1)
    vs+=("${gpus2%%|*}-follow|--gpus 2 --follow $T/$set-ref.h5$wb")
    if [ "$set" = tiny-fp8 ]; then
        vs+=("gpus1-fp8|--gpus 1 --weights fp8")
        # N = 2 with FP8 weights: refused before any device work (exit 2), naming the tensor and N
        "$BIN" run --model "$G" --path opt --gpus 2 --weights fp8 --tokens-from "$G/forced.h5" \
            --dump "$T/refused.h5" >"$LOG/run-$set-gpus2-fp8.txt" 2>&1
        rc=$?
        echo "== $set-gpus2-fp8 refused (rc $rc)"
        sed 's/^/   /' "$LOG/run-$set-gpus2-fp8.txt" | tail -n 2
        if [ $rc -eq 2 ] && grep -q -- '--gpus 2 --weights fp8' "$LOG/run-$set-gpus2-fp8.txt"; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1))
        fi
    fi
    for v in "${vs[@]}"; do
        name="$set-${v%%|*}"
        read -r -a args <<<"${v#*|}"
        [[ $name == *emulated* ]] && export DSV4_NCCL_EMULATE_ONE_GPU=1
        run "$name" "$G" --path opt --tokens-from "$G/forced.h5" "${args[@]}"
        ok=$?
        unset DSV4_NCCL_EMULATE_ONE_GPU
        [ $ok -eq 0 ] || continue
        # gated: the following runs (docs/optimized.md: a free run's bf16 near-tie flips compound on these
        # tiny models); free runs are reported
        gate=0
        [[ $name == *-follow ]] && gate=1
        verify "$name-vs-ref" $gate "$T/$set-ref.h5" "$T/$name.h5"
        verify "$name-vs-golden" 0 "$G/forced.h5" "$T/$name.h5"
        # the split runs against the one-rank run (following against following): only fp32 regrouping
        # separates them
        one="$T/$set-gpus1.h5"
        [[ $name == *-follow ]] && one="$T/$set-gpus1-follow.h5"
        [[ $name == *gpus2* ]] && [ -f "$one" ] && verify "$name-vs-gpus1" $gate "$one" "$T/$name.h5"
    done
done
if [ -n "${DSV4_FLASH_MODEL:-}" ] && [ -f "$DSV4_FLASH_MODEL/config.json" ]; then
    awk 'BEGIN { s = 4242; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%d ", 2 + s % 8000 } }' \
        >"$T/flash-prompt.txt"
    # only the last prompt position and the decode steps are stored: every position at this width is gigabytes
    # and every position's selections (--probes keeps that dump small) for following
    if run flash-ref-gpu "$DSV4_FLASH_MODEL" --path ref-gpu --prompt-tokens "$T/flash-prompt.txt" --decode 4 \
        --dump-positions decode &&
        run flash-sel "$DSV4_FLASH_MODEL" --path ref-gpu --prompt-tokens "$T/flash-prompt.txt" --decode 4 \
            --dump-positions all --probes topk_idx,router_ids; then
        # forced from the reference's own tokens, following its choices
        if run flash-gpus1 "$DSV4_FLASH_MODEL" --path opt --gpus 1 --tokens-from "$T/flash-ref-gpu.h5" --forced \
            --dump-positions decode --follow "$T/flash-sel.h5"; then
            verify flash-gpus1-vs-ref-gpu 1 "$T/flash-ref-gpu.h5" "$T/flash-gpus1.h5"
        fi
    fi
else
    echo "DSV4_FLASH_MODEL not set: the Flash-width run is skipped"
fi
echo "e2e_opt_nccl_gpu: $pass passed, $fail failed"
[ $fail -eq 0 ]
