#!/usr/bin/env bash
# gpu-sanitize-tail.sh [SECONDS] - on the GPU machine, after build-gpu/ is built: whole golden/topk512 runs of
# `dsv4 run --path opt` under compute-sanitizer, each time-boxed to SECONDS (default 450), all in parallel.
# topk512 is 2,312 positions, and its top-512 ranking only starts past 2,048 (512 compressed entries of ratio 4).
# memcheck finishes the whole run; racecheck (~40x slower again) cannot, so it checks only the run's last
# TAIL_LAUNCHES (3000) kernel launches, the last ~20 positions: a first, unsanitized run counts the kernels
# (scripts/launch_count.c, a CUPTI injection library) and the racecheck run skips all but the last ones
# (--launch-skip). Those runs are eager (--graph off), so each kernel is one launch for both counts.
#   default   the defaults (graph on for memcheck)
#   naive     every naive variant at once (--attn simt --indexer fp32 --mhc roundtrip --index-context max)
#   kv8       the FP8 KV cache
# JOBS="default" runs only those jobs, TOOLS ("memcheck racecheck") only those tools.
# Prints one line per (tool, job): clean, ERRORS (the sanitizer's summary), TIMEOUT, or a failure. Exit 1 on any
# of those, 2 when build-gpu/dsv4 is missing or JOBS names an unknown job. Logs in $OUT/santail-<tool>-<job>.log.
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
)
[ -x "$bin" ] || { echo "gpu-sanitize-tail: no $bin: build build-gpu/ first" >&2; exit 2; }
for job in ${JOBS:-}; do
    [ -n "${jobs[$job]+set}" ] || { echo "gpu-sanitize-tail: unknown job '$job' (the jobs: ${!jobs[*]})" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
counter=$tmp/liblaunch_count.so
gcc -std=c11 -shared -fPIC -I"$cuda/include" "$root/scripts/launch_count.c" -L"$cuda/lib64" -lcupti -o "$counter" ||
    { echo "gpu-sanitize-tail: cannot build scripts/launch_count.c" >&2; exit 2; }
tail_n=${TAIL_LAUNCHES:-3000}
pids=()
for tool in ${TOOLS:-memcheck racecheck}; do
    for job in ${JOBS:-"${!jobs[@]}"}; do
        (
            log=$out/santail-$tool-$job.log
            # shellcheck disable=SC2206
            args=(${jobs[$job]})
            skip=()
            if [ "$tool" = racecheck ]; then
                args+=(--graph off)
                t0=$SECONDS
                CUDA_INJECTION64_PATH=$counter LAUNCH_COUNT_OUT=$tmp/count-$job "$bin" "${common[@]}" "${args[@]}" \
                    --dump "$tmp/count-$job.h5" >"$tmp/count-$job.log" 2>&1
                read -r _ n _ dropped <"$tmp/count-$job" 2>/dev/null
                if [ -z "${n:-}" ] || [ "${dropped:-1}" != 0 ] || [ "$n" -le "$tail_n" ]; then
                    echo "$tool $job: no launch count (${n:-none}, dropped ${dropped:-?}): not run" >"$tmp/$tool-$job.result"
                    exit 0
                fi
                skip=(--launch-skip $((n - tail_n)))
                echo "$job: $n kernels in the run ($((SECONDS - t0)) s unsanitized); racecheck checks the last $tail_n" >"$log"
            fi
            start=$SECONDS
            timeout "$limit" compute-sanitizer --tool "$tool" "${skip[@]}" --error-exitcode 99 "$bin" "${common[@]}" \
                "${args[@]}" --dump "$tmp/$tool-$job.h5" >>"$log" 2>&1
            rc=$?
            summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1), $((SECONDS - start)) s"
            [ ${#skip[@]} -gt 0 ] && summary="$summary, last $tail_n of $n kernels"
            case $rc in
            0) echo "$tool $job: clean ($summary)" ;;
            124) echo "$tool $job: TIMEOUT after ${limit}s (not completed)" ;;
            99) echo "$tool $job: ERRORS ($summary)" ;;
            *) echo "$tool $job: run failed under the tool, rc $rc ($summary)" ;;
            esac >"$tmp/$tool-$job.result"
        ) &
        pids+=($!)
    done
done
wait "${pids[@]}"
[ ${#pids[@]} -gt 0 ] || exit 0
cat "$tmp"/*.result
n_res=$(find "$tmp" -name '*.result' | wc -l)
[ "$n_res" -eq ${#pids[@]} ] || { echo "gpu-sanitize-tail: only $n_res of ${#pids[@]} runs reported a result"; exit 1; }
! grep -qvE ': clean' "$tmp"/*.result
