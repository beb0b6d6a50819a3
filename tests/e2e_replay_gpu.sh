#!/usr/bin/env bash
# e2e_replay_gpu.sh - issue 40's GPU part (docs/verify.md "Layer-local replay"): ref-gpu as replay's recomputing
# engine, on the committed golden sets tiny, random-106, random-109 (every position) and topk512 (a run of 112
# positions at the end of its 2,312 tokens: the subset path, 81 compared):
#   - a candidate (the CPU bf16 emulation free-running: a candidate with its own flips) replayed on ref-gpu equals its
#     replay on ref-cpu within the fp32 profile, every probe (the per-entry ones too);
#   - ref-gpu's own free-running dump, replayed on ref-gpu, is reproduced within the fp32 profile;
#   - planted faults are caught at their layer by `dsv4 replay --path ref-gpu` with the emulation as the baseline: two
#     of the emulation (the CPU fault binary dsv4_faults makes the candidate; rope-sign, topk-drop-last: first
#     divergence at the layer the fault first acted) and the three dump faults of tests/support/dump_fault.py;
#   - --replay with --path opt, and --emulate with --replay, are refused (exit 2).
# Skipped (77) without a GPU.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition (and the variables it names) later, on purpose
set -u -o pipefail
SRC=${DSV4_SOURCE_DIR:?}
# shellcheck source=tests/support/kit_python.sh disable=SC1091
source "$SRC/tests/support/kit_python.sh"
kit_python >/dev/null || { kit_python; exit 1; } # KIT_PY: a python3 with numpy and h5py
BUILD=${DSV4_BINARY_DIR:?}
BIN=$BUILD/dsv4
FBIN=$BUILD/dsv4_faults
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-e2e-replay-gpu-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0
pass=0
check() {
    if eval "$2"; then
        echo "ok: $1"
        pass=$((pass + 1))
    else
        echo "FAILED: $1"
        fail=$((fail + 1))
    fi
}
SUMMARY=$SRC/scripts/replay_summary.py

for m in tiny random-106 random-109 topk512; do
    G=$SRC/golden/$m
    [ -f "$G/forced.h5" ] || { echo "FAILED: $G/forced.h5 missing (committed golden)"; exit 1; }
    pos=()
    [ "$m" = topk512 ] && pos=(--dump-positions 2200-2311)
    d=$T/$m
    mkdir -p "$d"
    "$BIN" run --model "$G" --path ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" "${pos[@]}" \
        --dump "$d/emu.h5" >"$d/emu.log" 2>&1 ||
        { echo "FAILED: $m: the emulation run:"; tail -n 3 "$d/emu.log"; exit 1; }
    "$BIN" run --model "$G" --path ref-cpu --replay "$d/emu.h5" --dump "$d/cpu.h5" >"$d/cpu.log" 2>&1
    "$BIN" run --model "$G" --path ref-gpu --replay "$d/emu.h5" --dump "$d/gpu.h5" >"$d/gpu.log" 2>&1
    st=$?
    [ $st -eq 0 ] || tail -n 3 "$d/gpu.log"
    what=$(grep -o '[0-9]* positions compared, in [0-9]* segments*' "$d/gpu.log")
    check "$m: a candidate replayed on ref-gpu is its replay on ref-cpu within fp32 ($what)" \
        '[ $st -eq 0 ] && "$BIN" verify --profile fp32 "$d/cpu.h5" "$d/gpu.h5" --quiet --json "$d/cg.json"'
    [ -f "$d/cg.json" ] && echo "   $("$KIT_PY" "$SUMMARY" "$d/cg.json")"

    "$BIN" run --model "$G" --path ref-gpu --tokens-from "$G/forced.h5" "${pos[@]}" --dump "$d/ref.h5" \
        >"$d/ref.log" 2>&1
    "$BIN" run --model "$G" --path ref-gpu --replay "$d/ref.h5" --dump "$d/self.h5" >"$d/self.log" 2>&1
    st=$?
    check "$m: ref-gpu's own dump, replayed on ref-gpu, within fp32" \
        '[ $st -eq 0 ] && "$BIN" verify --profile fp32 "$d/self.h5" "$d/ref.h5" --quiet'
done

# planted faults, judged on the GPU against the emulation replayed the same way (one baseline replay, reused)
G=$SRC/golden/random-106
d=$T/random-106
"$BIN" run --model "$G" --path ref-gpu --replay "$d/emu.h5" --dump "$d/base-replay.h5" >/dev/null 2>&1
for fault in rope-sign topk-drop-last; do
    DSV4_TEST_FAULT=$fault "$FBIN" run --model "$G" --path ref-cpu --emulate bf16 --tokens-from "$G/forced.h5" \
        --dump "$d/$fault.h5" >"$d/$fault.log" 2>&1
    acted=$(sed -n 's/.*first acted at layer \([0-9]*\).*/\1/p' "$d/$fault.log")
    "$BIN" replay --model "$G" --path ref-gpu "$d/$fault.h5" --baseline "$d/emu.h5" --baseline-replay \
        "$d/base-replay.h5" --quiet --json "$d/$fault.json" >/dev/null 2>&1
    st=$?
    got=$("$KIT_PY" "$SUMMARY" "$d/$fault.json")
    first=$(echo "$got" | cut -d' ' -f2)
    check "emulation fault $fault (acted first at layer ${acted:-?}): DIVERGED at that layer on ref-gpu ($got)" \
        '[ $st -eq 1 ] && [ -n "$acted" ] && [ "${first%%/*}" = "$acted" ]'
done
for spec in "attn-scale 1 30 attn_out" "kv-rope-sign 3 30 kv" "topk-drop 2 40 topk_idx"; do
    read -r kind layer from probe <<<"$spec"
    "$KIT_PY" "$SRC/tests/support/dump_fault.py" "$d/emu.h5" "$d/df.h5" --kind "$kind" --layer "$layer" \
        --from "$from" >/dev/null
    "$BIN" replay --model "$G" --path ref-gpu "$d/df.h5" --baseline "$d/emu.h5" --baseline-replay \
        "$d/base-replay.h5" --quiet --json "$d/df.json" >/dev/null 2>&1
    st=$?
    got=$("$KIT_PY" "$SUMMARY" "$d/df.json")
    check "dump fault $kind at layer $layer: DIVERGED first at $layer/$probe on ref-gpu ($got)" \
        '[ $st -eq 1 ] && [ "${got% *}" = "DIVERGED $layer/$probe" ]'
done

# what is refused
"$BIN" run --model "$G" --path opt --replay "$d/emu.h5" --dump "$T/x.h5" >"$T/opt.txt" 2>&1
st=$?
check "--replay with --path opt is refused, exit 2 (was $st)" \
    '[ $st -eq 2 ] && grep -q "runs on --path ref-cpu or ref-gpu" "$T/opt.txt"'
"$BIN" run --model "$G" --path ref-gpu --emulate bf16 --replay "$d/emu.h5" --dump "$T/x.h5" >"$T/emu.txt" 2>&1
st=$?
check "--replay with --emulate is refused, exit 2 (was $st)" \
    '[ $st -eq 2 ] && grep -q "not with --follow, --emulate" "$T/emu.txt"'
echo "e2e_replay_gpu: $pass passed, $fail failed"
[ $fail -eq 0 ]
