#!/usr/bin/env bash
# gpu-test.sh [ctest args...] - on the GPU machine of the device tool (Ubuntu 24.04, nvcc 13, cmake 4, HDF5 and
# OpenBLAS dev files, no Check/jansson headers, no package registry): unpack the .debs brought by
# fetch-debs.sh into a private prefix, build everything for sm_90 and sm_120, run the ctest `gpu` label
# (default) or the given ctest arguments. Logs go to $OUT when set.
#   device call: command "bash scripts/gpu-test.sh", carry [".debs"]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvcc --version | tail -n 2 | tee -a "$out/gpu.txt"
build=$root/build-gpu
set -o pipefail
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo 2>&1 | tee "$out/configure.log" | tail -n 3 || exit 1
# the log is filtered after the build: `| tee | grep | head` killed the build by SIGPIPE (and cut the log short)
# once head had its 40 lines and grep wrote more
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1
rc=$?
grep -E 'warning|error|Error' "$out/build.log" | head -n 40
[ "$rc" -eq 0 ] || { tail -n 30 "$out/build.log"; exit 1; }
cd "$build" || exit 1
if [ $# -eq 0 ]; then set -- -L gpu; fi
ctest --output-on-failure "$@" 2>&1 | tee "$out/ctest.log"
exit "${PIPESTATUS[0]}"
