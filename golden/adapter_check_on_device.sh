#!/usr/bin/env bash
# adapter_check_on_device.sh - on the device machine (torch + transformers there; everything on its CPU, fp32): show
# that golden/make_golden.py, now built on the kit's transformers adapter and DumpWriter (python/dsv4dump), still
# makes the COMMITTED golden sets bit for bit. Regenerates tiny, tiny-fp8 and topk512 (--set all) and the drawn
# architectures random-106 and random-109 (--random-arch 106,109) into a temporary folder, two processes at once,
# then compares each with the committed folder (make_golden.py --compare: every dataset's dtype, shape and bytes,
# every root attribute but `command`, every other file's bytes) and checks each new dump with
# `python3 -m dsv4dump check --complete`. Prints one line per set:
#   adapter-check tiny: bit-identical (2 dumps, 198 datasets, ...)      or  adapter-check tiny: DIFFERS: ...
# and "adapter-check: 5 of 5 sets bit-identical"; exit 0 only then. Then, informative, the worked example of
# docs/external-engines.md (golden/tiny in bf16 on the GPU through dsv4dump.transformers.dump, checked by the kit;
# the dump is returned as $OUT/tiny-tf-bf16.h5 to verify here). Logs: $OUT/adapter-*.log.
#   device call: command "bash golden/adapter_check_on_device.sh 2>&1 | tee $OUT/adapter-check.log", carry nothing
#   (about 1-2 minutes)
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES="" PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/adapter-check-out}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/dsv4-adapter-check-XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 -c 'import sys, torch, transformers, h5py, numpy
print("versions: python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "h5py", h5py.__version__, "numpy", numpy.__version__)' || { echo "adapter-check: no torch/transformers here"; exit 2; }
t0=$SECONDS
# from inside $work with --out golden: tiny-fp8's config.json carries "_name_or_path" = the folder transformers loaded
# tiny from ("golden/tiny.tmp" in the committed set), so the output folder must be named as it was
root=$PWD
(cd "$work" && python3 "$root/golden/make_golden.py" --set all --out golden) >"$OUT/adapter-sets.log" 2>&1 &
pid_sets=$!
(cd "$work" && python3 "$root/golden/make_golden.py" --random-arch 106,109 --out golden) >"$OUT/adapter-random.log" 2>&1 &
pid_random=$!
wait $pid_sets
rc_sets=$?
wait $pid_random
rc_random=$?
echo "adapter-check: made in $((SECONDS - t0)) s (make_golden.py --set all: exit $rc_sets; --random-arch 106,109: exit $rc_random)"
same=0
sets=(tiny tiny-fp8 topk512 random-106 random-109)
for s in "${sets[@]}"; do
    if [ ! -d "$work/golden/$s" ]; then
        why="not made"
        [ -d "$work/golden/$s.failed" ] && why="its checks failed (left as $s.failed)"
        echo "adapter-check $s: NOT MADE: $why; see $OUT/adapter-*.log:"
        grep -hE "Error|error|FAILED|differs|over tolerance" "$OUT"/adapter-*.log | head -n 5 | sed 's/^/    /'
        continue
    fi
    line=$(python3 golden/make_golden.py --compare "golden/$s" "$work/golden/$s" 2>&1 | tail -n 1)
    rc=$?
    chk=$(PYTHONPATH=python python3 -m dsv4dump check --complete --quiet "$work/golden/$s"/*.h5 2>&1)
    crc=$?
    if [ $rc -eq 0 ] && [[ $line == *"bit-identical"* ]] && [ $crc -eq 0 ]; then
        echo "adapter-check $s: ${line#*: }"
        same=$((same + 1))
    else
        echo "adapter-check $s: DIFFERS: ${line#REPRODUCIBILITY: }"
        [ $crc -eq 0 ] || printf '%s\n' "$chk" | head -n 5 | sed 's/^/    dsv4dump check: /'
    fi
done
echo "adapter-check: ${same} of ${#sets[@]} sets bit-identical to the committed ones ($((SECONDS - t0)) s)"

# informative (not in the exit status): docs/external-engines.md's worked example (golden/tiny in bf16 on the GPU)
CUDA_VISIBLE_DEVICES=${ADAPTER_GPU:-0} OUT=$OUT bash golden/adapter_bf16_on_device.sh "$OUT/tiny-tf-bf16.h5"
[ "$same" -eq ${#sets[@]} ]
