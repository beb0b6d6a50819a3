#!/usr/bin/env bash
# demo.sh - the main job on the shipped example: build dsv4 (installing what is missing), run the fp32 CPU
# reference on the golden `tiny` set's tokens and verify its dump layer by layer against transformers' golden.
# Exit status is the verifier's: 0 within the fp32 profile, 1 diverged, 2 could not compare.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(bash "$root/scripts/setup.sh" "$root/build" | tail -n 1)
golden=$root/golden/tiny/forced.h5
out=$build/demo-tiny-ref-cpu.h5
"$build/dsv4" run --model "$root/golden/tiny" --path ref-cpu --tokens-from "$golden" --dump "$out"
echo
exec "$build/dsv4" verify --profile fp32 "$golden" "$out"
