#!/usr/bin/env bash
# flip_rate.sh - how often does a path's top-k differ from the fp32 reference's, over many random prompts? On a
# model with a small index_topk one near-tie flip moves one prompt's recall by 1/(k x rows), so whether that prompt
# passes the strict-recall gate (>= 0.99 per CSA layer) can be chance; pooled over many prompts it is a measurement
# (--gate; docs/verify.md "The strict-recall gate"). For each of N random prompts it runs the fp32 CPU reference
# (every position dumped), then each CONFIG following it (`--follow`, as tests/e2e_opt_gpu.sh gates), and
# `dsv4 verify --profile bf16`.
#
# usage: scripts/flip_rate.sh [options] NAME=ARGS...
#   NAME=ARGS       a configuration: a label and the `dsv4 run` arguments after --model, e.g.
#                   "emu=--path ref-cpu --emulate bf16" "mma=--path opt" "simt=--path opt --attn simt"
#   --model DIR     the model folder (default golden/tiny of this checkout)
#   -n N            prompts (default 100), seeds 1..N
#   --len T         tokens per prompt (default 64, as golden/tiny's forced.h5)
#   --prefill P     the references prefill P tokens, then one-token steps (default 21, as golden/tiny); --path opt
#                   configurations run the whole prompt as one-token steps
#   --golden        also the model's golden prompt (its forced.h5 tokens, prefill as stored), labelled "golden"
#   --gate R        exit 1 unless every configuration's pooled strict recall is >= R on every CSA layer (the
#                   issue-6 gate, R = 0.99, measured over all the prompts: tests/e2e_opt_recall_gpu.sh)
#   -j J            prompts run at the same time (default 1)
#   --bin DSV4      the dsv4 command (default: $DSV4_BIN, else build/dsv4 of this checkout)
#   --out DIR       keep the per-prompt lines (flips.txt) there (default: a temporary folder, removed)
#   --summary FILE  only print the tables of a kept flips.txt (no runs)
# Prompts: token i of seed s comes from a 31-bit LCG seeded with s (the same on every machine), modulo the vocab.
#
# Prints, per configuration and CSA layer: the prompts compared, the rows differing from the reference per
# prompt (mean, and how many prompts had 0, 1, 2, 3, 4+ rows differ), strict misses (picks outside the tie band),
# the pooled strict recall (the verifier's per-row recall, averaged over every row of every prompt), and the
# prompts that would fail a one-prompt gate (recall mean < 0.99 or a strict miss on ANY CSA layer).
# Exit status: 0 when every run compared (and, with --gate, every pooled recall met it), 1 when a run failed or
# the gate did not hold, 2 on bad usage.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DSV4_BIN:-$root/build/dsv4}"
model="$root/golden/tiny"
n=100 len=64 prefill=21 jobs=1 out="" summary="" golden=0 gate=""
configs=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model | -n | --len | --prefill | -j | --bin | --out | --summary | --gate)
        [ $# -ge 2 ] || { echo "flip_rate.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
    esac
    case "$1" in
    --model) model="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    --len) len="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    -j) jobs="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --summary) summary="$2"; shift 2 ;;
    --gate) gate="$2"; shift 2 ;;
    --golden) golden=1; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    -*) echo "flip_rate.sh: unknown option '$1' (options take their value as the next argument; see --help)" >&2; exit 2 ;;
    *=*) configs+=("$1"); shift ;;
    *) echo "flip_rate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
# summarise FILE [NAME...]: the tables below from the per-prompt lines, configurations in the order given (default:
# the order they first appear in FILE); with $gate set, a gate line per configuration, and exit 1 when a pooled
# recall is below it. Lines: NAME SEED LAYER ROWS_DIFF ACCEPTED STRICT RECALL_MEAN ROWS VERIFY (ROWS weighs the
# prompt's recall mean in the pooled one; VERIFY is the verifier's exit status, 0 within the profile, 1 diverged;
# lines kept before those two fields existed weigh 1, the same for prompts of one length, and count no verdict)
summarise() {
    local f=$1 names
    shift
    names="$*"
    [ -n "$names" ] || names=$(awk '!($1 in s) {s[$1] = 1; printf "%s ", $1}' "$f")
    awk -v names="$names" -v gate="$gate" '$3 == "FAILED" || $2 == "FAILED" {bad++; next}
         {k = $1 SUBSEP $3; runs[k]++; diff[k] += $4; strict[k] += $6; b = $4 >= 4 ? 4 : $4; hist[k, b]++
          w = NF >= 8 ? $8 : 1; rsum[k] += $7 * w; wsum[k] += w
          if (!($3 in lay)) {lay[$3] = 1; nl++; ls[nl] = $3 + 0}
          if ($7 + 0 < 0.99 || $6 + 0 > 0) failp[$1, $2] = 1; seen[$1, $2] = 1
          if (NF >= 9) {verdict[$1, $2] = 1; if ($9 + 0 != 0) diverged[$1, $2] = 1}}
         END {
           nc = split(names, cs, " ")
           for (i = 2; i <= nl; i++) for (j = i; j > 1 && ls[j - 1] > ls[j]; j--) {t = ls[j]; ls[j] = ls[j - 1]; ls[j - 1] = t}
           printf "%-10s %-5s %7s %11s %-22s %7s %7s\n", "config", "layer", "prompts", "rows!=ref", "rows!=ref 0/1/2/3/4+", "strict", "recall"
           for (i = 1; i <= nc; i++) for (j = 1; j <= nl; j++) { c = cs[i]; k = c SUBSEP ls[j]; if (!runs[k]) continue
             printf "%-10s L%-4s %7d %11.2f %4d/%d/%d/%d/%-9d %7d %7.4f\n", c, ls[j], runs[k], diff[k] / runs[k],
                    hist[k, 0], hist[k, 1], hist[k, 2], hist[k, 3], hist[k, 4], strict[k], rsum[k] / wsum[k] }
           for (i = 1; i <= nc; i++) { c = cs[i]; np = 0; nf = 0; nv = 0; nd = 0
             for (p in seen) { split(p, q, SUBSEP); if (q[1] != c) continue; np++; if (p in failp) nf++
                               if (p in verdict) nv++; if (p in diverged) nd++ }
             if (np) printf "%s: %d of %d prompts (%.1f%%) would fail a one-prompt top-k gate (recall < 0.99 or a strict miss, any CSA layer)\n", c, nf, np, 100 * nf / np
             if (nv) printf "%s: the verifier (--profile bf16) finds %d of %d prompts within the profile\n", c, nv - nd, nv }
           gatebad = 0
           if (gate != "") for (i = 1; i <= nc; i++) { c = cs[i]; line = ""; ok = 1; any = 0
             for (j = 1; j <= nl; j++) { k = c SUBSEP ls[j]; if (!runs[k]) continue; any = 1
               r = rsum[k] / wsum[k]; line = line sprintf(" L%d %.5f", ls[j], r); if (r < gate + 0) ok = 0 }
             if (!any) { ok = 0; line = " no CSA layer compared" }
             printf "gate %s: pooled strict recall%s: %s (>= %s on every CSA layer)\n", c, line, ok ? "PASS" : "FAIL", gate
             if (!ok) gatebad = 1 }
           if (bad) printf "%d runs FAILED (see the logs under the work folder)\n", bad
           exit (bad > 0 || gatebad) }' "$f"
}

if [ -n "$gate" ] && ! awk -v g="$gate" 'BEGIN {exit !(g ~ /^(0?\.[0-9]+|1(\.0*)?)$/ && g + 0 > 0)}'; then
    echo "flip_rate.sh: --gate '$gate': give a recall in (0, 1], e.g. 0.99" >&2
    exit 2
fi
if [ -n "$summary" ]; then
    [ -f "$summary" ] || { echo "flip_rate.sh: $summary: no such file" >&2; exit 2; }
    summarise "$summary"
    exit $?
fi
[ ${#configs[@]} -gt 0 ] || { echo "flip_rate.sh: give at least one NAME=ARGS configuration (see --help)" >&2; exit 2; }
[ -x "$bin" ] || { echo "flip_rate.sh: no dsv4 command at $bin (give --bin or DSV4_BIN)" >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "flip_rate.sh: $model/config.json: no model folder there" >&2; exit 2; }
for v in "$n" "$len" "$prefill" "$jobs"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "flip_rate.sh: '$v' must be a positive integer" >&2; exit 2; }
done
[ $golden = 0 ] || [ -f "$model/forced.h5" ] ||
    { echo "flip_rate.sh: --golden: $model/forced.h5: no golden dump there" >&2; exit 2; }
# dsv4 run refuses --decode-from past the prompt (it was clamped to the prompt length)
[ "$prefill" -le "$len" ] || { echo "flip_rate.sh: --prefill $prefill: past --len $len" >&2; exit 2; }
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json" | head -n 1)
[ -n "$vocab" ] || { echo "flip_rate.sh: $model/config.json: no vocab_size" >&2; exit 2; }
keep=1
[ -n "$out" ] || { out="$(mktemp -d "${TMPDIR:-/tmp}/flip_rate.XXXXXX")"; keep=0; }
mkdir -p "$out/work"

# one prompt: its reference, then each configuration following it; appends "NAME SEED LAYER ROWS_DIFF ACCEPTED
# STRICT RECALL_MEAN ROWS VERIFY" lines (or "NAME SEED FAILED") to its own file, merged at the end. SEED "golden": the
# model's forced.h5 tokens, every run taking that dump's prompt length as its prefill
one_prompt() {
    local s=$1 w="$out/work/$1" x=$1 i toks=() src from_ref
    mkdir -p "$w"
    if [ "$s" = golden ]; then
        src=(--tokens-from "$model/forced.h5")
        from_ref=()
    else
        for ((i = 0; i < len; i++)); do
            x=$(((x * 1103515245 + 12345) % 2147483648))
            toks+=($(((x >> 16) % vocab)))
        done
        echo "${toks[*]}" >"$w/prompt.txt"
        src=(--prompt-tokens "$w/prompt.txt")
        from_ref=(--decode-from "$prefill")
    fi
    if ! "$bin" run --model "$model" --path ref-cpu "${src[@]}" "${from_ref[@]}" \
        --dump-positions all --dump "$w/ref.h5" >"$w/ref.log" 2>&1; then
        echo "ref $s FAILED" >"$w/lines"
        return
    fi
    : >"$w/lines"
    local c name args from
    for c in "${configs[@]}"; do
        name=${c%%=*}
        read -r -a args <<<"${c#*=}"
        from=("${from_ref[@]}") # --path opt feeds the prompt as one-token steps and refuses a prefill
        [[ " ${args[*]} " == *" --path opt "* ]] && from=()
        # the run must succeed and verify compare (0 within the profile, 1 diverged; 2 could not compare); a
        # verify with no top-k table compared nothing this script counts, and is a failure too
        local vrc=2 got=""
        rm -f "$w/$name.verify" # an earlier run's, under a reused --out
        if "$bin" run --model "$model" "${args[@]}" "${src[@]}" "${from[@]}" \
            --dump-positions all --follow "$w/ref.h5" --dump "$w/$name.h5" >"$w/$name.log" 2>&1; then
            "$bin" verify --profile bf16 --no-color "$w/ref.h5" "$w/$name.h5" >"$w/$name.verify" 2>&1
            vrc=$?
        fi
        if [ $vrc -le 1 ]; then
            got=$(awk -v c="$name" -v s="$s" -v v=$vrc '/^top-k per CSA layer/ {f = 1; next} f && NF == 0 {f = 0}
                f && $1 ~ /^[0-9]+$/ {split($3, r, "/"); print c, s, $1, $5, $6, $7, r[2], $2, v}' "$w/$name.verify")
            [ -n "$got" ] || echo "flip_rate: $w/$name.verify has no top-k per CSA layer table" >>"$w/$name.log"
        fi
        if [ -n "$got" ]; then
            echo "$got" >>"$w/lines"
        else
            echo "$name $s FAILED" >>"$w/lines"
        fi
        rm -f "$w/$name.h5"
    done
    rm -f "$w/ref.h5"
}

seeds=()
[ $golden = 1 ] && seeds+=(golden)
for ((s = 1; s <= n; s++)); do seeds+=("$s"); done
echo "flip_rate: $n prompts of $len tokens (prefill $prefill)$([ $golden = 1 ] && echo " and the golden prompt") on" \
    "$model, ${#configs[@]} configurations, $jobs at a time" >&2
started=0
for s in "${seeds[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    one_prompt "$s" &
    started=$((started + 1))
    [ $((started % 20)) -eq 0 ] && echo "flip_rate: started $started of ${#seeds[@]}" >&2
done
wait
# under a temporary name, renamed when complete (a --summary of a half-written file would count too few prompts)
for s in "${seeds[@]}"; do cat "$out/work/$s/lines"; done >"$out/flips.txt.tmp" && mv "$out/flips.txt.tmp" "$out/flips.txt" ||
    { echo "flip_rate: could not write $out/flips.txt" >&2; exit 1; }

names=()
for c in "${configs[@]}"; do names+=("${c%%=*}"); done
summarise "$out/flips.txt" "${names[@]}"
rc=$?
if [ $rc -ne 0 ]; then # keep what shows why, and show the first failed run's last lines (a gate that did not
    # hold has none: its per-prompt lines are kept)
    f=$(grep -l -E "FAILED" "$out"/work/*/lines | head -n 1)
    if [ -n "$f" ]; then
        w=${f%/lines}
        name=$(awk '/FAILED/ {print $1; exit}' "$f")
        echo "flip_rate: the first failed run ($w/$name.log; everything kept in $out):" >&2
        tail -n 5 "$w/$name.log" "$w/$name.verify" 2>/dev/null | sed 's/^/  /' >&2
    else
        echo "flip_rate: per-prompt lines kept in $out/flips.txt" >&2
    fi
elif [ $keep = 0 ]; then
    rm -rf "$out"
else
    echo "flip_rate: per-prompt lines in $out/flips.txt" >&2
fi
exit $rc
