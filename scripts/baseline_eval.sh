#!/usr/bin/env bash
# baseline_eval.sh [options] MODEL_DIR... - the evidence of docs/verify.md "Baseline mode": on each model (a folder
# with config.json, the weights and its transformers golden forced.h5), the bf16 baseline (the CPU reference's
# emulation following the golden), the faithful second candidate and every planted fault of reference/ref_fault.h
# (the test-only binary dsv4_faults), and optionally the optimized path's dumps, each judged by
# `dsv4 verify --baseline` and, for comparison, by the fixed bf16 profile alone.
#   -b BUILD       build folder with dsv4 and dsv4_faults (default: build)
#   -w WORK        where the dumps go (default: a temporary folder, removed at the end)
#   -o OPT_DIR     also judge OPT_DIR/<model name>/<variant>.h5 (optimized-path dumps following the golden)
#   -c CANDIDATES  comma-separated candidates (default: the two faithful ones and every fault; "-": none, only -o's
#                  dumps); a fault may carry a scale for expert-scale, e.g. expert-scale@1.1 ($DSV4_TEST_FAULT_SCALE).
#                  Faithful: alt-order (dsv4_faults: another accumulation order, the kernel's tile-wise softmax) and
#                  prescott (the emulation itself with OpenBLAS's Prescott kernels, OPENBLAS_CORETYPE: every product
#                  rounded apart instead of fused, so other bf16 rounding flips)
#   -j N           models evaluated N at a time (default 1)
#   -r RESULTS     run nothing: the summary (and -g) of the RESULT lines in RESULTS, from an earlier run
#   -m MODE        follow (default): every run follows the golden's choices and is judged by `dsv4 verify
#                  --baseline`; replay: every run is free-running and judged by `dsv4 replay --baseline`
#                  (layer-local replay, docs/verify.md), the baseline free-running too
#   -f FIXED_BIN   the dsv4 whose fixed bf16 profile judges the "fixed" column (default: BUILD's; docs/verify.md
#                  uses the build from before baseline mode, whose indexer_scores rel_l2 had no floor)
#   -g             gate: exit 1 unless every faithful candidate passes and every candidate named in $GATED_FAULTS
#                  (default: the six faults whose effect exceeds the bf16 rounding error, docs/verify.md) is caught
#                  at the layer where it first acts on every model
# Prints one line per (model, candidate):
#   RESULT model=M cand=C kind=faithful|fault exit=E first=L/PROBE acted=L fixed=E ratio=R z=Z
# (E: the verifier's exit status with --baseline; first: its first divergence; acted: the layer where the fault
# first acted, from dsv4_faults' stderr; fixed: the exit status of the fixed bf16 profile without a baseline; ratio
# and z: the largest RMS ratio and scale difference in standard errors over the probes), then a summary per
# candidate. Exit status: 0, or 1 when -g is given and the gate fails, 2 on bad usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build work="" opt="" cands="" gate=0 fixed_bin="" jobs=1 from="" mode=follow
FAULTS=(rope-sign sink-dropped sinkhorn-short compressor-ape topk-drop-last expert-scale kv-truncate swiglu-noclamp)
GATED_FAULTS=${GATED_FAULTS:-rope-sign sink-dropped compressor-ape topk-drop-last kv-truncate swiglu-noclamp}
while getopts "b:w:o:c:f:j:r:m:g" opt_; do
    case $opt_ in
    b) build=$OPTARG ;;
    w) work=$OPTARG ;;
    o) opt=$OPTARG ;;
    c) cands=$OPTARG ;;
    f) fixed_bin=$OPTARG ;;
    j) jobs=$OPTARG ;;
    r) from=$OPTARG ;;
    m) mode=$OPTARG ;;
    g) gate=1 ;;
    *) echo "usage: baseline_eval.sh [-b BUILD] [-w WORK] [-o OPT_DIR] [-c CANDIDATES] [-f FIXED_BIN] [-g] MODEL..." >&2
       exit 2 ;;
    esac
done
shift $((OPTIND - 1))
case $mode in follow | replay) ;; *) echo "baseline_eval.sh: -m follow or replay, not '$mode'" >&2; exit 2 ;; esac
[ $# -ge 1 ] || [ -n "$from" ] || { echo "baseline_eval.sh: give at least one model folder" >&2; exit 2; }
BIN=$build/dsv4 FBIN=$build/dsv4_faults
fixed_bin=${fixed_bin:-$BIN}
for b in "$BIN" "$FBIN" "$fixed_bin"; do
    [ -n "$from" ] || [ -x "$b" ] || { echo "baseline_eval.sh: $b is not built" >&2; exit 2; }
done
if [ -z "$work" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
list=(alt-order prescott "${FAULTS[@]}")
[ -n "$cands" ] && IFS=, read -r -a list <<<"$cands"
[ "$cands" = - ] && list=()

results=$work/results.txt
: >"$results"
verdict() { # golden candidate [baseline MODEL]: prints "exit first_layer/probe ratio z" (the largest RMS ratio and
    # scale difference in standard errors over the probes, in baseline mode); replay mode: `dsv4 replay`
    local js=$2.verdict${3:+-base}.json
    if [ -n "${3:-}" ] && [ "$mode" = replay ]; then
        "$BIN" replay --model "$4" "$2" --baseline "$3" --quiet --json "$js" >/dev/null 2>&1
    elif [ -n "${3:-}" ]; then "$BIN" verify --profile bf16 "$1" "$2" --baseline "$3" --quiet --json "$js" 2>/dev/null
    else "$fixed_bin" verify --profile bf16 "$1" "$2" --quiet --json "$js" 2>/dev/null; fi
    local rc=$?
    if [ $rc -gt 1 ]; then echo "$rc - - -"; return; fi
    python3 - "$js" "$rc" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
d = r["first_divergence"] or {}
first = f"{d.get('layer', '-')}/{d.get('probe', d.get('dataset', '-'))}" if sys.argv[2] == "1" else "-"
ratio = z = None
for p in r["probes"]:
    b = p.get("baseline")
    if not b:
        continue
    # the JSON writes a value that is not finite as a string ("nan": no scale statistic under 8 rows)
    q, se = [v if isinstance(v, (int, float)) else None for v in (b["ratio"], b["scale_se"])]
    if q is not None and (ratio is None or q > ratio):
        ratio = q
    if se is not None and se > 0:
        zz = abs(b["candidate_scale"] - b["baseline_scale"]) / se
        z = zz if z is None or zz > z else z
print(sys.argv[2], first, "-" if ratio is None else f"{ratio:.3f}", "-" if z is None else f"{z:.2f}")
EOF
}
eval_model() { # MODEL_DIR: its RESULT lines, also into $work/NAME/results.txt; 2 when a run fails
    local m=$1 name g d c fault scale kind bin coretype acted rc first fixed f v ratio z
    name=$(basename "$m")
    g=$m/forced.h5
    d=$work/$name
    mkdir -p "$d"
    : >"$d/results.txt"
    local follow=(--follow "$g")
    [ "$mode" = replay ] && follow=() # free-running: replay judges each layer on the run's own inputs
    if ! "$BIN" run --model "$m" --path ref-cpu --emulate bf16 --tokens-from "$g" "${follow[@]}" --dump "$d/base.h5" \
        >"$d/base.log" 2>&1; then
        echo "baseline_eval.sh: $name: the baseline run failed:" >&2
        tail -n 3 "$d/base.log" >&2
        return 2
    fi
    for c in "${list[@]}"; do
        fault=${c%@*} scale=1.02
        [ "$c" != "$fault" ] && scale=${c#*@}
        kind=fault bin=$FBIN coretype=${OPENBLAS_CORETYPE:-}
        [ "$fault" = alt-order ] && kind=faithful
        if [ "$fault" = prescott ]; then
            kind=faithful bin=$BIN coretype=Prescott fault=""
        fi
        if ! DSV4_TEST_FAULT=$fault DSV4_TEST_FAULT_SCALE=$scale OPENBLAS_CORETYPE=$coretype "$bin" run --model "$m" \
            --path ref-cpu --emulate bf16 --tokens-from "$g" "${follow[@]}" --dump "$d/$c.h5" >"$d/$c.log" 2>&1; then
            echo "baseline_eval.sh: $name: candidate $c failed:" >&2
            tail -n 3 "$d/$c.log" >&2
            return 2
        fi
        acted=$(sed -n 's/.*first acted at layer \([0-9]*\).*/\1/p' "$d/$c.log")
        read -r rc first ratio z <<<"$(verdict "$g" "$d/$c.h5" "$d/base.h5" "$m")"
        read -r fixed _ <<<"$(verdict "$g" "$d/$c.h5")"
        echo "RESULT model=$name cand=$c kind=$kind exit=$rc first=$first acted=${acted:--} fixed=$fixed" \
            "ratio=$ratio z=$z" |
            tee -a "$d/results.txt"
    done
    if [ -n "$opt" ] && [ -d "$opt/$name" ]; then
        for f in "$opt/$name"/*.h5; do
            v=opt-$(basename "$f" .h5)
            read -r rc first ratio z <<<"$(verdict "$g" "$f" "$d/base.h5" "$m")"
            read -r fixed _ <<<"$(verdict "$g" "$f")"
            echo "RESULT model=$name cand=$v kind=faithful exit=$rc first=$first acted=- fixed=$fixed" \
                "ratio=$ratio z=$z" |
                tee -a "$d/results.txt"
        done
    fi
}
failed=0
running=0
for m in "$@"; do
    eval_model "$m" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
done
while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
[ $failed -eq 0 ] || exit 2
for m in "$@"; do cat "$work/$(basename "$m")/results.txt" >>"$results"; done
[ -z "$from" ] || cat "$from" >>"$results"

# summary: faithful candidates must pass (exit 0); a fault is caught when the verdict is DIVERGED (exit 1) with the
# first divergence at the layer where the fault first acted
echo
echo "| candidate | kind | models | baseline mode: pass / diverged (at the fault's layer) | largest RMS ratio, min..max" \
    "over models | largest scale difference (se), min..max | fixed bf16 profile: diverged |"
echo "|---|---|---:|---|---|---|---:|"
python3 - "$results" "$gate" "$GATED_FAULTS" <<'EOF'
import sys
from collections import OrderedDict
rows = [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in open(sys.argv[1]) if line.startswith("RESULT")]
gate, gated = sys.argv[2] == "1", sys.argv[3].split()
by = OrderedDict()
for r in rows:
    by.setdefault(r["cand"], []).append(r)
bad = []
for cand, rs in by.items():
    kind = rs[0]["kind"]
    n = len(rs)
    passed = sum(r["exit"] == "0" for r in rs)
    div = sum(r["exit"] == "1" for r in rs)
    right = sum(r["exit"] == "1" and r["acted"] != "-" and r["first"].split("/")[0] == r["acted"] for r in rs)
    fixed = sum(r["fixed"] == "1" for r in rs)
    other = n - passed - div
    cell = f"{passed} / {div}" + (f" ({right} at its layer)" if kind == "fault" else "") + (f", {other} errors" if other else "")
    def span(key):
        v = [float(r[key]) for r in rs if r.get(key, "-") != "-"]
        return f"{min(v):.2f}..{max(v):.2f}" if v else "-"
    print(f"| {cand} | {kind} | {n} | {cell} | {span('ratio')} | {span('z')} | {fixed} |")
    if kind == "faithful" and passed != n:
        bad.append(f"{cand}: {n - passed} of {n} models not passed")
    if kind == "fault" and cand in gated and right != n:
        bad.append(f"{cand}: caught at its layer on {right} of {n} models")
if gate and bad:
    print("GATE FAILED: " + "; ".join(bad))
    sys.exit(1)
if gate:
    print("GATE PASSED")
EOF
