#!/usr/bin/env bash
# gpu-session-fp4.sh - one device call: build (sm_90), the FP4 expert variant sweep (bench_qweight --fp4-sweep)
# and test_kernel_qweight, then the NCCL e2e with the Flash-width model (written to /tmp/dsv4-flash) and the
# memcheck of the --gpus 1 job, each time-boxed. Outputs in $OUT.
#   device call: command "bash scripts/gpu-session-fp4.sh", carry [".debs"]
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
b=$root/build-gpu
cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1 &&
    cmake --build "$b" -j"$(nproc)" >>"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
echo "== built at ${SECONDS}s"
timeout 150 "$b/bench_qweight" --fp4-sweep >"$out/sweep.txt" 2>&1
echo "== sweep rc $? at ${SECONDS}s"
timeout 90 "$b/test_kernel_qweight" >"$out/test_qweight.txt" 2>&1
echo "== test_kernel_qweight rc $? at ${SECONDS}s"
tail -n 5 "$out/test_qweight.txt"
[ -n "${SKIP_NCCL:-}" ] && exit 0
mkdir -p /tmp/dsv4-flash /tmp/e2e-nccl
OUT=$out JOBS=nccl TOOLS=memcheck bash "$root/scripts/gpu-sanitize-model.sh" 200 >"$out/memcheck-nccl.txt" 2>&1 &
timeout 150 "$b/test_ref_gpu_flash" --write-model /tmp/dsv4-flash >"$out/flash-write.log" 2>&1
echo "== Flash model written (rc $?) at ${SECONDS}s"
(cd "$b" && DSV4_FLASH_MODEL=/tmp/dsv4-flash DSV4_E2E_LOG=/tmp/e2e-nccl timeout $((580 - SECONDS)) \
    ctest -R e2e_opt_nccl_gpu --output-on-failure -V >"$out/nccl.log" 2>&1)
echo "== nccl e2e rc $? at ${SECONDS}s"
grep -E "passed|failed|VERDICT|flash" "$out/nccl.log" | tail -n 20
wait
cat "$out/memcheck-nccl.txt"
tar czf "$out/e2e-nccl.tgz" -C /tmp/e2e-nccl . 2>/dev/null
