#!/usr/bin/env bash
# calibrate_bf16.sh - how large is the bf16 design's rounding error, measured by a model independent of the
# optimized path: the CPU reference with the same roundings (dsv4 run --path ref-cpu --emulate bf16; docs/verify.md
# "The bf16 emulation of the reference"), against the plain fp32 reference, under the bf16 profile's gates.
#
# For each golden set (golden/tiny, golden/tiny-fp8, golden/topk512):
#   1. ref-cpu fp32 with --tokens-from forced.h5 --dump-positions all           -> fp32.h5
#   2. ref-cpu --emulate bf16 --follow fp32.h5 (the same tokens, all positions)   -> emu.h5
#      (following keeps the emulation on the fp32 choices, as the optimized path is gated: docs/optimized.md)
#   3. dsv4 verify fp32.h5 emu.h5 --profile bf16 --json                           -> verify.json
# then prints one table: per probe (and gated metric), the worst value over every layer and position of each set,
# next to the profile's gate ('!' = above it). A probe the emulation exceeds is one whose gate is tighter than the
# design's own rounding error (the profile is wrong there, not the path); a probe where the optimized path exceeds
# what the emulation reaches is worth a look at the path.
#
# usage: scripts/calibrate_bf16.sh [--bin DSV4] [--out DIR] [--profile bf16|FILE]
#   --bin      the dsv4 command (default: $DSV4_BIN, else build/dsv4 of this checkout)
#   --out      where the dumps and JSON go (default: a fresh temporary directory, kept and printed)
#   --profile  the profile to compare under (default bf16)
# Exit status: 0 when every step ran (whatever the table says), 1 when a run or verify could not compare.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DSV4_BIN:-$root/build/dsv4}"
out=""
profile="bf16"
while [ $# -gt 0 ]; do
    case "$1" in
    --bin | --out | --profile)
        [ $# -ge 2 ] || { echo "calibrate_bf16.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
    esac
    case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "calibrate_bf16.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "calibrate_bf16.sh: no dsv4 command at $bin (give --bin or DSV4_BIN)" >&2; exit 2; }
[ -n "$out" ] || out="$(mktemp -d "${TMPDIR:-/tmp}/calibrate_bf16.XXXXXX")"
mkdir -p "$out"

sets=(tiny tiny-fp8 topk512)
for s in "${sets[@]}"; do
    g="$root/golden/$s"
    d="$out/$s"
    mkdir -p "$d"
    echo "== $s" >&2
    # set -e would end the script with dsv4's own status (2 for a usage error); the header promises 1
    "$bin" run --model "$g" --path ref-cpu --tokens-from "$g/forced.h5" --dump-positions all --dump "$d/fp32.h5" \
        > "$d/run_fp32.log" || { echo "calibrate_bf16.sh: $s: the fp32 run failed (exit $?; $d/run_fp32.log)" >&2; exit 1; }
    "$bin" run --model "$g" --path ref-cpu --emulate bf16 --tokens-from "$g/forced.h5" --dump-positions all \
        --follow "$d/fp32.h5" --dump "$d/emu.h5" > "$d/run_emu.log" ||
        { echo "calibrate_bf16.sh: $s: the bf16 emulation run failed (exit $?; $d/run_emu.log)" >&2; exit 1; }
    grep '^follow:' "$d/run_emu.log" >&2 || true
    rc=0
    "$bin" verify "$d/fp32.h5" "$d/emu.h5" --profile "$profile" --json "$d/verify.json" --quiet || rc=$?
    if [ "$rc" -gt 1 ]; then
        echo "calibrate_bf16.sh: $s: verify could not compare (exit $rc)" >&2
        exit 1
    fi
done

python3 - "$out" "${sets[@]}" <<'EOF'
import json, math, sys

out, sets = sys.argv[1], sys.argv[2:]
LOWER_IS_WORSE = {"cosine", "recall", "jaccard", "top5"}

def val(v):
    if isinstance(v, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(v, math.nan)
    return float(v)

order, gates, worst, where = [], {}, {}, {}
tie = {}
for s in sets:
    j = json.load(open(f"{out}/{s}/verify.json"))
    ft = j.get("first_tie")
    tie[s] = f"p{ft['position']} L{ft['layer']}" if ft else "none"
    for p in j["probes"]:
        if p.get("in") != "both":
            continue
        for m, g in p["gates"].items():
            key = (p["probe"], m)
            if key not in gates:
                order.append(key)
                gates[key] = val(g)
            lower = m in LOWER_IS_WORSE
            for r in p.get("rows", []):
                if m not in r:
                    continue
                v = val(r[m])
                cur = worst.get((key, s))
                if cur is None or (v < cur if lower else v > cur):
                    worst[(key, s)] = v
                    where[(key, s)] = (p["layer"], r["position"])

def fmt(v):
    if v is None:
        return "."
    if v == 0 or abs(v) >= 1e-2 and abs(v) < 100 and float(v).is_integer():
        return f"{v:g}"
    return f"{v:.2e}"

w = 13
print(f"bf16 emulation (ref-cpu --emulate bf16 --follow fp32) vs ref-cpu fp32, profile gates; worst over layers "
      f"and positions (L layer, p position; ! = above the gate)")
print(f"{'probe':<16} {'metric':<9} {'gate':>9} " + " ".join(f"{s:>{w + 9}}" for s in sets))
for key in order:
    probe, m = key
    g = gates[key]
    cells = []
    for s in sets:
        v = worst.get((key, s))
        if v is None:
            cells.append(f"{'.':>{w + 9}}")
            continue
        lower = m in LOWER_IS_WORSE
        bad = (v < g) if lower else (v > g)
        L, p = where[(key, s)]
        loc = f"L{L if L >= 0 else 'f'} p{p}"
        cells.append(f"{fmt(v) + ('!' if bad else ' '):>{w}} {loc:>8}")
    print(f"{probe:<16} {m:<9} {fmt(g):>9} " + " ".join(cells))
print("first tie-accepted top-k pick (after it the after_tie gates apply, not marked here): " +
      ", ".join(f"{s} {tie[s]}" for s in sets))
print(f"dumps and JSON: {out}")
EOF
