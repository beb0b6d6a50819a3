#!/usr/bin/env bash
# gpu-sanitize-topk512.sh [SECONDS] - on the GPU machine, after build-gpu/ is built: whole golden/topk512 runs of
# `dsv4 run --path opt` under compute-sanitizer memcheck, in parallel, each time-boxed to SECONDS (default 450).
# topk512 is 2,312 positions and its top-512 ranking starts only past 2,048 (512 compressed entries of ratio 4),
# so the 25-position runs of gpu-sanitize-model.sh never reach it; memcheck of a whole run takes ~200-400 s.
# Racecheck cannot be run on it: whole, it would take ~2 h (~3 s a position), and checking only the last launches
# (--launch-skip) or only some kernels (--kernel-name) fails on the H200: the tool faults on cuBLAS's bf16 kernels
# when it leaves them unchecked (scripts/racecheck_cublas_repro.cu). tests/gpu/test_opt_long_state.c runs the
# decode at k = 512 in 16 steps instead, under both tools (gpu-focus.sh san-long; docs/robustness.md).
#   default   the defaults (the decode step as a CUDA graph)
#   naive     every naive variant at once (--attn simt --indexer fp32 --mhc roundtrip --index-context max)
#   kv8       the FP8 KV cache
#   nccl      --gpus 1, the NCCL rank path (memcheck with --report-api-errors no: gpu-sanitize-model.sh says why)
#   n2emu     --gpus 2 emulated on one GPU (DSV4_NCCL_EMULATE_ONE_GPU=1, with the replica check): the split
#             weights, expert ranges and partial sums
# JOBS="default nccl" runs only those jobs.
# Prints one line per job: clean, ERRORS (the sanitizer's summary), TIMEOUT or a failure. Exit 1 on any of those,
# 2 when build-gpu/dsv4 is missing or JOBS names an unknown job. Logs in $OUT/santopk-memcheck-<job>.log.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${1:-450}
out=${OUT:-$root/out}
mkdir -p "$out"
bin=$root/build-gpu/dsv4
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
g=$root/golden/topk512
common=(run --model "$g" --path opt --tokens-from "$g/forced.h5")
declare -A jobs=(
    [default]=""
    [naive]="--attn simt --indexer fp32 --mhc roundtrip --index-context max"
    [kv8]="--kv fp8"
    [nccl]="--gpus 1"
    [n2emu]="--gpus 2"
)
declare -A job_env=([n2emu]="DSV4_NCCL_EMULATE_ONE_GPU=1 DSV4_NCCL_REPLICA_CHECK=1")
declare -A job_tool_args=([nccl]="--report-api-errors no")
[ -x "$bin" ] || { echo "gpu-sanitize-topk512: no $bin: build build-gpu/ first" >&2; exit 2; }
for job in ${JOBS:-}; do
    [ -n "${jobs[$job]+set}" ] || { echo "gpu-sanitize-topk512: unknown job '$job' (the jobs: ${!jobs[*]})" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for job in ${JOBS:-"${!jobs[@]}"}; do
    (
        log=$out/santopk-memcheck-$job.log
        start=$SECONDS
        # shellcheck disable=SC2086
        env ${job_env[$job]:-} timeout "$limit" compute-sanitizer --tool memcheck ${job_tool_args[$job]:-} \
            --error-exitcode 99 "$bin" "${common[@]}" ${jobs[$job]} --dump "$tmp/$job.h5" >"$log" 2>&1
        rc=$?
        summary="$(grep -E 'ERROR SUMMARY' "$log" | tail -n 1), $((SECONDS - start)) s"
        case $rc in
        0) echo "memcheck topk512 $job: clean ($summary)" ;;
        124) echo "memcheck topk512 $job: TIMEOUT after ${limit}s (not completed)" ;;
        99) echo "memcheck topk512 $job: ERRORS ($summary)" ;;
        *) echo "memcheck topk512 $job: run failed under the tool, rc $rc ($summary)" ;;
        esac >"$tmp/$job.result"
    ) &
    pids+=($!)
done
wait "${pids[@]}"
[ ${#pids[@]} -gt 0 ] || exit 0
cat "$tmp"/*.result
n_res=$(find "$tmp" -name '*.result' | wc -l)
[ "$n_res" -eq ${#pids[@]} ] || { echo "gpu-sanitize-topk512: only $n_res of ${#pids[@]} runs reported a result"; exit 1; }
! grep -qvE ': clean' "$tmp"/*.result
