#!/usr/bin/env bash
# random_on_device.sh SEEDS [OPT_MODELS] - on the device machine (transformers there, on its CPU in fp32): make the
# drawn-architecture models random-S of make_golden.py --random-arch for SEEDS (e.g. 1-6,101-110), eight at a time,
# and pack them into $OUT/random-N.tar.gz (each under 15 MiB, the folders in seed order; SEEDS "-" makes none).
# With OPT_MODELS (comma-separated: seeds made by this run, or model folders of the repository such as golden/tiny),
# also build dsv4 there and run the optimized path on those models following their golden forced.h5 (defaults and
# each naive variant, every position dumped), packed as $OUT/opt-N.tar.gz while the eight returned files and 60 MiB
# allow; what did not fit is named in the log.
#   device call: command "bash golden/random_on_device.sh 1-6,101-110 1,2,golden/tiny 2>&1 | tee $OUT/random.log",
#                carry [".debs"] (only needed with OPT_MODELS)
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
seeds=${1:?usage: random_on_device.sh SEEDS [OPT_MODELS]}
opt_models=${2:-}
OUT=${OUT:-/tmp/random-out}
mkdir -p "$OUT"
work=/tmp/dsv4-random
rm -rf "$work"
mkdir -p "$work/models" "$work/logs" "$work/opt"
status=0

expand() { python3 -c 'import sys; sys.path.insert(0, "golden"); import make_golden as m; print(*m.parse_seeds(sys.argv[1]))' "$1"; }
list=""
[ "$seeds" = - ] || list=$(expand "$seeds") || exit 2
echo "=== models: $list"
t0=$SECONDS
# one seed per process, one thread each (make_golden.py sets torch to one thread): eight at a time
# shellcheck disable=SC2086 # one seed a line
printf '%s\n' $list | xargs -P 8 -I{} sh -c \
    'CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 python3 golden/make_golden.py --random-arch {} --out '"$work/models"' >'"$work/logs"'/make-{}.log 2>&1; echo "random-{}: exit $?"'
echo "=== models made in $((SECONDS - t0)) s"
for s in $list; do
    if [ -d "$work/models/random-$s" ]; then
        grep -m1 "random-$s: layers" "$work/logs/make-$s.log"
    else
        echo "random-$s: FAILED"
        grep -E 'over tolerance|no-cache logits|Error' "$work/logs/make-$s.log" | cut -c1-600
        status=1
    fi
done

if [ -n "$opt_models" ]; then
    export dsv4_root=$root
    # shellcheck source=scripts/gpu-env.sh disable=SC1091
    source "$root/scripts/gpu-env.sh" || exit 2
    build=$root/build-gpu
    if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/logs/configure.log" 2>&1 ||
        ! cmake --build "$build" --target dsv4_cli -j"$(nproc)" >"$work/logs/build.log" 2>&1; then
        tail -n 30 "$work/logs/configure.log" "$work/logs/build.log"
        exit 1
    fi
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    variants=("defaults:" "attn-simt:--attn simt" "indexer-fp32:--indexer fp32" "mhc-roundtrip:--mhc roundtrip"
              "index-context-max:--index-context max")
    for s in ${opt_models//,/ }; do
        m=$work/models/random-$s
        [ -d "$s" ] && m=$root/$s
        [ -d "$m" ] || { echo "opt $s: no such model"; status=1; continue; }
        s=$(basename "$m")
        mkdir -p "$work/opt/$s"
        for v in "${variants[@]}"; do
            name=${v%%:*}
            # shellcheck disable=SC2086 # the variant's options are words
            if "$build/dsv4" run --model "$m" --path opt --tokens-from "$m/forced.h5" ${v#*:} --follow "$m/forced.h5" \
                --dump "$work/opt/$s/$name.h5" >"$work/logs/opt-$s-$name.log" 2>&1; then
                echo "opt $s $name: ok"
            else
                echo "opt $s $name: FAILED"; tail -n 5 "$work/logs/opt-$s-$name.log"; status=1
            fi
        done
    done
fi

# pack: models first, then the optimized path's dumps, each tar under 15 MiB, at most 8 files and 60 MiB in all
# (the device tool returns 8 files of 16 MiB, 64 MiB together)
echo "=== sizes"
du -sk "$work"/models/* "$work"/opt/* 2>/dev/null
python3 - "$work" "$OUT" <<'EOF' || status=1
import os, sys, tarfile
work, out = sys.argv[1:]
limit, total_limit, max_files = 15 << 20, 60 << 20, 7  # leave one file for the log
def size(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
items = [("random", os.path.join(work, "models", d)) for d in sorted(os.listdir(os.path.join(work, "models")))
         if not d.endswith((".tmp", ".failed"))]
items += [("opt", os.path.join(work, "opt", d)) for d in sorted(os.listdir(os.path.join(work, "opt")))]
packs, total, left = [], 0, []
for kind, d in items:
    s = size(d)
    if total + s > total_limit:
        left.append(d); continue
    if not packs or packs[-1][0] != kind or packs[-1][1] + s > limit:
        if len(packs) == max_files:
            left.append(d); continue
        packs.append([kind, 0, []])
    packs[-1][1] += s; packs[-1][2].append(d); total += s
for i, (kind, s, ds) in enumerate(packs):
    t = os.path.join(out, f"{kind}-{i}.tar.gz")
    with tarfile.open(t + ".tmp", "w:gz") as tf:
        for d in ds:
            tf.add(d, arcname=os.path.basename(d))
    os.replace(t + ".tmp", t)
    print(f"packed {t}: {len(ds)} folders, {s >> 10} KiB before compression: {[os.path.basename(d) for d in ds]}")
for d in left:
    print(f"NOT RETURNED (over the limits): {d}")
EOF
ls -l "$OUT"
echo "=== overall exit $status"
exit $status
