#!/usr/bin/env bash
# demo.sh - the main job on the shipped example: build dsv4 (installing what is missing), then run the
# fp32 CPU reference on the golden `tiny` set and verify it against transformers' golden dump.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(bash "$root/scripts/setup.sh" "$root/build" | tail -n 1)
"$build/dsv4" inspect "$root/golden/tiny"
