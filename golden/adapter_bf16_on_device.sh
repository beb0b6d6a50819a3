#!/usr/bin/env bash
# adapter_bf16_on_device.sh [OUT.h5] - docs/external-engines.md's worked example on the device machine (torch and
# transformers there): golden/tiny loaded in bf16 on the GPU (the CPU when there is none), dumped through the kit's
# adapter (dsv4dump.transformers.dump) and checked by `python3 -m dsv4dump check --complete`. Prints one line,
#   adapter-bf16: ok (device cuda, N s): <check's verdict>      or  adapter-bf16: FAILED ...
# and returns the dump as OUT.h5 (default $OUT/tiny-tf-bf16.h5) to verify on any machine with dsv4.
#
# Why autocast: transformers 5.17 keeps DeepseekV4's mHC parameters, sinks and RMSNorm weights in fp32 when the model
# is loaded in bf16 (_keep_in_fp32_modules_strict), and its RMSNorm returns weight * x in the weight's dtype, so the
# first bf16 projection after a norm gets an fp32 input and raises "expected mat1 and mat2 to have the same dtype"
# (seen on the H200 in session 22). Under torch.autocast the projections take bf16 inputs, as a bf16 engine does,
# and the pinned parts stay fp32.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/adapter-check-out}
mkdir -p "$OUT"
dest=${1:-$OUT/tiny-tf-bf16.h5}
tmp=$dest.tmp.h5
t0=$SECONDS
if PYTHONPATH=python python3 - "$tmp" >"$OUT/adapter-bf16.log" 2>&1 <<'PY'
import sys, h5py, torch
from transformers import DeepseekV4ForCausalLM
from dsv4dump.transformers import dump
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = DeepseekV4ForCausalLM.from_pretrained("golden/tiny", dtype=torch.bfloat16).to(dev).eval()
tokens = h5py.File("golden/tiny/forced.h5", "r")["tokens"][()].tolist()
with torch.autocast(device_type=dev, dtype=torch.bfloat16):
    dump(model, sys.argv[1], model_dir="golden/tiny", prompt=tokens[:21], n_decode=len(tokens) - 21,
         forced=tokens, producer=f"transformers bf16 autocast {dev}")
print("device", dev)
PY
then
    chk=$(PYTHONPATH=python python3 -m dsv4dump check --complete "$tmp" 2>&1 | tail -n 1)
    crc=$?
    mv "$tmp" "$dest"
    echo "adapter-bf16: $([ $crc -eq 0 ] && echo ok || echo 'check FAILED') ($(grep -m1 '^device' "$OUT/adapter-bf16.log"), $((SECONDS - t0)) s): $chk; $dest"
    exit $crc
fi
rm -f "$tmp"
echo "adapter-bf16: FAILED after $((SECONDS - t0)) s; the log's end:"
tail -n 8 "$OUT/adapter-bf16.log" | sed 's/^/    /'
exit 1
