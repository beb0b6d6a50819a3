#!/usr/bin/env bash
# e2e_replay.sh - issue 40's CPU part (docs/verify.md "Layer-local replay"): `dsv4 replay` judges a FREE-RUNNING
# candidate layer by layer on its own inputs, on two committed drawn architectures (golden/random-106, random-109).
#   - replay is exact where it should be: the fp32 reference's own free-running dump, replayed, is reproduced within
#     the fp32 profile (the candidate's state injected is the state the reference made);
#   - with the bf16 emulation running free as the baseline (replayed the same way), the faithful candidates (alt-order,
#     prescott; scripts/baseline_eval.sh) pass, and the six planted faults of reference/ref_fault.h that replay catches
#     on every drawn architecture are DIVERGED at the layer where they first acted (sinkhorn-short and expert-scale
#     x1.02 run and are reported, not gated: on 11 unseen models replay catches them at their layer on 1 and 3,
#     docs/verify.md);
#   - a candidate that lacks what replay needs is refused (exit 2) with the missing probes named, and one that stores no
#     whole window; a candidate that stores runs of positions is replayed on those whose window it stores, as the full
#     replay is there;
#   - faults planted into a dump's layer (tests/support/dump_fault.py) are flagged at that layer first.
# shellcheck disable=SC2016 # check() evaluates its condition later, on purpose
set -u -o pipefail
SRC=${DSV4_SOURCE_DIR:?}
# shellcheck source=tests/support/kit_python.sh disable=SC1091
source "$SRC/tests/support/kit_python.sh"
kit_python >/dev/null || { kit_python; exit 1; } # KIT_PY: a python3 with numpy and h5py
BUILD=${DSV4_BINARY_DIR:?}
BIN=$BUILD/dsv4
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-replay-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi; }
models=()
for m in random-106 random-109; do
    [ -f "$SRC/golden/$m/forced.h5" ] || { echo "FAILED: $SRC/golden/$m/forced.h5 missing (committed golden)"; exit 1; }
    models+=("$SRC/golden/$m")
done

G=${models[0]}
"$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump "$T/ref.h5" >"$T/ref.log" 2>&1
"$BIN" run --model "$G" --path ref-cpu --replay "$T/ref.h5" --dump "$T/replay.h5" >"$T/replay.log" 2>&1
check "the reference's own dump, replayed, within the fp32 profile" \
    '"$BIN" verify --profile fp32 "$T/replay.h5" "$T/ref.h5" --quiet'

cands=alt-order,prescott,rope-sign,sink-dropped,sinkhorn-short,compressor-ape,topk-drop-last,expert-scale,kv-truncate
cands=$cands,swiglu-noclamp
GATED_FAULTS="rope-sign sink-dropped compressor-ape topk-drop-last kv-truncate swiglu-noclamp" \
    bash "$SRC/scripts/baseline_eval.sh" -m replay -b "$BUILD" -g -c "$cands" "${models[@]}"
st=$?
check "faithful candidates pass replay, the gated faults are caught at their layers (exit $st)" '[ $st -eq 0 ]'

# what replay needs: a candidate without kv, and one that stores the decode positions only
"$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --probes out,attn_out --dump "$T/partial.h5" \
    >/dev/null 2>&1
"$BIN" replay --model "$G" "$T/partial.h5" >"$T/partial.txt" 2>&1
st=$?
check "a candidate without kv is refused, exit 2 (was $st), the missing probes named" \
    '[ $st -eq 2 ] && grep -q "replay needs probes the candidate did not dump" "$T/partial.txt" &&
     grep -q "layers/0/kv" "$T/partial.txt"'
# a candidate of some positions (docs/verify.md "Replay at long context"): two runs of stored positions, 20-50 and 55-73
# with the window of 16: compared are 35-50 and 70-73 (those whose window is stored), and there the replay is the full
# replay's within fp32, every per-position probe and the CSA entries made inside the first run (layer 2, ratio 2:
# entries 11..23 close at 23..47 with both their windows in 20..47); the HCA entries (ratio 32) are not judged there
"$BIN" run --model "$G" --path ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" --dump "$T/emu.h5" >/dev/null 2>&1
"$BIN" run --model "$G" --path ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" --dump-positions 20-50,55-73 \
    --dump "$T/emu-sub.h5" >/dev/null 2>&1
"$BIN" run --model "$G" --path ref-cpu --replay "$T/emu.h5" --dump "$T/replay-full.h5" >/dev/null 2>&1
"$BIN" run --model "$G" --path ref-cpu --replay "$T/emu-sub.h5" --dump "$T/replay-sub.h5" >"$T/sub.log" 2>&1
check "a subset candidate: 20 positions compared in 2 segments" \
    'grep -q "20 positions compared, in 2 segments run" "$T/sub.log"'
check "a subset candidate's replay is the full replay's within fp32 at the compared positions" \
    '"$BIN" verify --profile fp32 "$T/replay-full.h5" "$T/replay-sub.h5" --quiet --json "$T/sub.json" \
        --probes "attn_*,ffn_*,kv,indexer_scores,topk_idx,router_*,out,final/*" &&
     "$KIT_PY" -c "import json, sys; sys.exit(len(json.load(open(sys.argv[1]))[\"positions\"]) != 20)" \
         "$T/sub.json"'
check "and so are the CSA entries made inside its first run" \
    '"$BIN" verify --profile fp32 "$T/replay-full.h5" "$T/replay-sub.h5" --quiet --probes compressed_kv,indexer_kv \
        --layers 2-2 --positions 23-47'
check "the HCA entries it cannot judge are the candidate's (the full replay's differ from them)" \
    '! "$BIN" verify --profile fp32 "$T/replay-full.h5" "$T/replay-sub.h5" --quiet --probes compressed_kv --layers 0-0'
"$BIN" run --model "$G" --path ref-cpu --tokens-from "$G/forced.h5" --dump-positions decode --dump "$T/subset.h5" \
    >/dev/null 2>&1
"$BIN" replay --model "$G" "$T/subset.h5" >"$T/subset.txt" 2>&1
st=$?
check "a candidate storing no whole window (11 positions, window 16) is refused, exit 2 (was $st)" \
    '[ $st -eq 2 ] && grep -q "at most 11 consecutive ones" "$T/subset.txt"'

# scripts/dump_truncate.py: the first 50 tokens of a run of 74 are the run of those 50 (what the Flash-width script
# reads its 16K experiment from a 32K run by), and replay judges it as it judges that run
"$KIT_PY" -c 'import h5py, sys; print(" ".join(map(str, h5py.File(sys.argv[1], "r")["tokens"][:50])))' \
    "$G/forced.h5" >"$T/p50.txt"
"$BIN" run --model "$G" --path ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" --dump-positions 20-73 \
    --dump "$T/emu74.h5" >/dev/null 2>&1
"$BIN" run --model "$G" --path ref-cpu --emulate bf16 --prompt-tokens "$T/p50.txt" --dump-positions 20-49 \
    --dump "$T/emu50.h5" >/dev/null 2>&1
"$KIT_PY" "$SRC/scripts/dump_truncate.py" "$T/emu74.h5" "$T/trunc50.h5" --tokens 50 >/dev/null
check "a dump cut to its first 50 tokens is the run of those 50 within fp32" \
    '"$BIN" verify --profile fp32 "$T/emu50.h5" "$T/trunc50.h5" --quiet'
"$BIN" replay --model "$G" "$T/trunc50.h5" --baseline "$T/emu50.h5" --quiet --json "$T/trunc.json" >/dev/null 2>&1
st=$?
check "and it passes replay with the run of those 50 as its baseline (exit $st)" '[ $st -eq 0 ]'

# faults planted into the emulation's dump the way a bug in one layer acts (tests/support/dump_fault.py), from a
# position on: replay with the unfaulted emulation as the baseline flags that layer first
for spec in "attn-scale 1 30 attn_out" "kv-rope-sign 3 30 kv" "topk-drop 2 40 topk_idx"; do
    read -r kind layer from probe <<<"$spec"
    "$KIT_PY" "$SRC/tests/support/dump_fault.py" "$T/emu.h5" "$T/fault.h5" --kind "$kind" --layer "$layer" \
        --from "$from" >/dev/null
    "$BIN" replay --model "$G" "$T/fault.h5" --baseline "$T/emu.h5" --quiet --json "$T/fault.json" >/dev/null 2>&1
    st=$?
    got=$("$KIT_PY" "$SRC/scripts/replay_summary.py" "$T/fault.json")
    check "dump fault $kind at layer $layer from $from: DIVERGED first at $layer/$probe (exit $st: $got)" \
        '[ $st -eq 1 ] && [ "${got% *}" = "DIVERGED $layer/$probe" ]'
done
[ $fail -eq 0 ] && echo "e2e_replay: 1 passed, 0 failed" || echo "e2e_replay: 0 passed, 1 failed"
exit $fail
