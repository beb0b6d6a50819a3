#!/usr/bin/env bash
# setup.sh [BUILD_DIR] [extra cmake args...] - install missing packages, configure and build dsv4.
# Prints the build folder's path on the last line of stdout. Used by demo.sh and test.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
bash "$root/scripts/deps.sh" >&2
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >&2
cmake --build "$build" -j"$(nproc)" >&2
echo "$build"
