#!/usr/bin/env bash
# gpu-sanitize-model.sh [SECONDS] - on the GPU machine, after scripts/gpu-test.sh has built build-gpu/: whole
# `dsv4 run --path opt` jobs under compute-sanitizer (TOOLS, default "memcheck racecheck"), in parallel, each
# time-boxed to SECONDS (default 420). The model-level tests (test_opt_model, test_opt_nccl, test_opt_fp8,
# test_opt_follow_run) run dozens of such jobs and do not finish under racecheck's slowdown; these six cover
# the same launch sequences on golden/tiny, cut to 25 positions (21 prompt + 4 decode):
#   default     every optimized kernel, batch of 3 sequences (different lengths), the decode step as a CUDA graph
#   naive       every naive variant at once (--attn simt --indexer fp32 --mhc roundtrip --index-context max)
#               and the FP8 KV cache
#   fp8         golden/tiny-fp8 with --weights fp8: the FP8 linear and FP4 expert kernels
#   nccl        --gpus 1: the NCCL rank path (sharded buffers, all-reduces)
#   kv8         the FP8 KV cache with the default (mma) attention, batch of 3 sequences
#   follow      --follow the golden dump: the decision-following kernels
# memcheck of the nccl job runs with --report-api-errors no: NCCL probes its kernel images with
# cudaFuncGetAttributes and handles the cudaErrorNoKernelImageForDevice it gets (4 such reports, every frame in
# libnccl.so.2, in this session's H200 run); memory errors are still reported, and every CUDA call of dsv4 itself
# is checked by the code (an error there fails the run).
# JOBS="default nccl" runs only those jobs.
# Prints one line per (tool, job): clean, ERRORS (the sanitizer's summary) or TIMEOUT. Exit 1 on any error, 2 when
# build-gpu/dsv4 is missing or JOBS names an unknown job.
# Logs to $OUT/sanmodel-<tool>-<job>.log when OUT is set.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${1:-420}
out=${OUT:-$root/out}
mkdir -p "$out"
bin=$root/build-gpu/dsv4
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
g=$root/golden
common=(run --path opt --decode 4 --dump-positions decode)
declare -A jobs=(
    [default]="--model $g/tiny --tokens-from $g/tiny/forced.h5 --batch 3"
    [naive]="--model $g/tiny --tokens-from $g/tiny/forced.h5 --attn simt --indexer fp32 --mhc roundtrip --index-context max --kv fp8"
    [fp8]="--model $g/tiny-fp8 --tokens-from $g/tiny-fp8/forced.h5 --weights fp8"
    [nccl]="--model $g/tiny --tokens-from $g/tiny/forced.h5 --gpus 1"
    [kv8]="--model $g/tiny --tokens-from $g/tiny/forced.h5 --kv fp8 --batch 3"
    [follow]="--model $g/tiny --tokens-from $g/tiny/forced.h5 --follow $g/tiny/forced.h5"
)
[ -x "$bin" ] || { echo "gpu-sanitize-model: no $bin: run scripts/gpu-test.sh first" >&2; exit 2; }
for job in ${JOBS:-}; do # a misspelt job ran `dsv4 run` without a model and read as a failure under the tool
    [ -n "${jobs[$job]+set}" ] || { echo "gpu-sanitize-model: unknown job '$job' (the jobs: ${!jobs[*]})" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
for tool in ${TOOLS:-memcheck racecheck}; do
    for job in ${JOBS:-"${!jobs[@]}"}; do
        api=()
        [ "$tool" = memcheck ] && [ "$job" = nccl ] && api=(--report-api-errors no)
        (
            log=$out/sanmodel-$tool-$job.log
            # shellcheck disable=SC2086
            timeout "$limit" compute-sanitizer --tool "$tool" "${api[@]}" --error-exitcode 99 "$bin" "${common[@]}" \
                ${jobs[$job]} --dump "$tmp/$tool-$job.h5" >"$log" 2>&1
            rc=$?
            summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
            case $rc in
            0) echo "$tool $job: clean ${summary:+($summary)}" ;;
            124) echo "$tool $job: TIMEOUT after ${limit}s (not completed)" ;;
            99) echo "$tool $job: ERRORS ($summary)" ;;
            *) echo "$tool $job: run failed under the tool, rc $rc ${summary:+($summary)}" ;;
            esac >"$tmp/$tool-$job.result"
        ) &
        pids+=($!)
    done
done
wait "${pids[@]}"
[ ${#pids[@]} -gt 0 ] || exit 0 # TOOLS=" ": nothing asked for
cat "$tmp"/*.result
# a run that wrote no result line is not clean (with none at all, the grep below found nothing and passed)
n_res=$(find "$tmp" -name '*.result' | wc -l)
[ "$n_res" -eq ${#pids[@]} ] || { echo "gpu-sanitize-model: only $n_res of ${#pids[@]} runs reported a result"; exit 1; }
! grep -qvE ': clean' "$tmp"/*.result
