#!/usr/bin/env bash
# regen_on_device.sh - regenerate every golden set where transformers is installed (the device machine), on
# the CPU in fp32, check that a second run reproduces `tiny` bit for bit, and pack the sets into $OUT.
#
#   set -o pipefail; bash golden/regen_on_device.sh 2>&1 | tee $OUT/regen.log
#
# Writes golden/{tiny,topk512,tiny-fp8}/ in the working tree there and $OUT/golden-<set>.tar.gz (one per set,
# each well under the 16 MiB a returned file may have). Exit status: 0 only if every step passed.
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
OUT=${OUT:-/tmp/golden-out}
mkdir -p "$OUT"
status=0
step() { # step NAME CMD...: run, report, remember a failure, go on
    local name=$1; shift
    echo "=== $name: $*"
    local t0=$SECONDS
    "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || status=1
}

step versions python3 -c 'import sys, torch, transformers, h5py, numpy, safetensors
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "h5py", h5py.__version__, "numpy", numpy.__version__, "safetensors", safetensors.__version__)
print("float8_e4m3fn", hasattr(torch, "float8_e4m3fn"), "float8_e8m0fnu", hasattr(torch, "float8_e8m0fnu"))'
step generate python3 golden/make_golden.py --set all --out golden
rm -rf /tmp/golden-repro
step regenerate-tiny python3 golden/make_golden.py --set tiny --out /tmp/golden-repro
step reproducible python3 golden/make_golden.py --compare golden/tiny /tmp/golden-repro/tiny
echo "=== sizes"
du -ab golden | sort -k2
for d in golden/tiny golden/topk512 golden/tiny-fp8 golden/tiny.failed golden/topk512.failed golden/tiny-fp8.failed; do
    [ -d "$d" ] || continue
    # under a temporary name, renamed when complete; a pack that fails fails the run
    t=$OUT/golden-$(basename "$d").tar.gz
    if tar czf "$t.tmp" -C golden "$(basename "$d")" && mv "$t.tmp" "$t"; then
        echo "=== packed $t"
    else
        echo "=== pack $t: FAILED"
        rm -f "$t.tmp"
        status=1
    fi
done
ls -l "$OUT"
echo "=== overall exit $status"
exit $status
