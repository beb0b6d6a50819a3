#!/usr/bin/env bash
# gpu-ab.sh REPS TARGET ARGS... - on the GPU machine, after gpu-focus.sh has built build-gpu/: time a change
# against the code before it in one device call. ab-base/ (git-ignored; carry it) holds the files as they were
# before, at their repository paths, e.g. made here with
#     mkdir -p ab-base/kernels && git show main:kernels/mhc.cu >ab-base/kernels/mhc.cu
# The script copies the tree to /tmp/ab-base-tree, puts ab-base/'s files over it, builds TARGET there, then runs
# `TARGET ARGS...` REPS times from each build, alternating (base first), so drift hits both alike.
# A file the change added goes in ab-base/.ab-added (one repository path a line): it is deleted from the base
# tree, which would otherwise build it (the CMake lists glob their folders) beside the base's own code.
# Outputs: $OUT/ab/{base,new}-<i>.txt, packed into $OUT/ab.tgz. Exit 1 when the base does not build. The base
# build stays in /tmp/ab-base-tree/b for later commands of the same call (e.g. its dsv4 for dumps to h5diff).
#   device call: command "bash scripts/gpu-focus.sh dumps && bash scripts/gpu-ab.sh 3 bench_mhc --quick",
#   carry [".debs", "ab-base"]
set -u
reps=${1:?usage: gpu-ab.sh REPS TARGET ARGS...}
target=${2:?usage: gpu-ab.sh REPS TARGET ARGS...}
shift 2
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-ab: REPS '$reps' is not a positive whole number" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
dsv4_root=$root
# shellcheck source=scripts/gpu-env.sh
source "$root/scripts/gpu-env.sh" || exit 2
[ -d "$root/ab-base" ] || { echo "gpu-ab: no ab-base/ here (carry it)" >&2; exit 2; }
[ -x "$root/build-gpu/$target" ] || { echo "gpu-ab: build-gpu/$target is missing: run gpu-focus.sh first" >&2; exit 2; }
build_target=$target
[ "$target" = dsv4 ] && build_target=dsv4_cli # the CLI's target; its binary is build/dsv4
tree=/tmp/ab-base-tree
rm -rf "$tree" && mkdir -p "$tree" "$out/ab"
# a base tree that is not what ab-base/ says would time the change against itself: every step is checked, and a
# base file with no counterpart in the tree (a misspelt path, which the build would ignore) is named
set -o pipefail
(cd "$root" && tar cf - --exclude='./build*' --exclude=./.git --exclude=./ab-base --exclude=./out .) | tar xf - -C "$tree" ||
    { echo "gpu-ab: copying the tree to $tree failed" >&2; exit 2; }
base_files=$(cd "$root/ab-base" && find . -type f ! -name .ab-added | sed 's|^\./||')
[ -n "$base_files" ] || { echo "gpu-ab: ab-base/ holds no file: the base would be the change itself" >&2; exit 2; }
while read -r f; do # one path a line: a path with a space stays whole
    [ -f "$tree/$f" ] || echo "gpu-ab: note: ab-base/$f has no counterpart in the tree (a misspelt path, or a file the change removed)" >&2
done <<<"$base_files"
cp -r "$root/ab-base/." "$tree/" || { echo "gpu-ab: putting ab-base/ over $tree failed" >&2; exit 2; }
rm -f "$tree/.ab-added"
if [ -f "$root/ab-base/.ab-added" ]; then
    while read -r f; do
        [ -n "$f" ] || continue
        [ -f "$tree/$f" ] || { echo "gpu-ab: ab-base/.ab-added names $f, which the tree lacks" >&2; exit 2; }
        rm -f "$tree/$f"
    done <"$root/ab-base/.ab-added"
fi
echo "== base files: $(tr '\n' ' ' <<<"$base_files")"
cmake -S "$tree" -B "$tree/b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/ab/build.log" 2>&1 &&
    cmake --build "$tree/b" -j"$(nproc)" --target "$build_target" >>"$out/ab/build.log" 2>&1 ||
    { tail -n 20 "$out/ab/build.log"; exit 1; }
echo "== base $target built at ${SECONDS}s"
for i in $(seq 1 "$reps"); do
    "$tree/b/$target" "$@" >"$out/ab/base-$i.txt" 2>&1
    echo "== base run $i rc $? at ${SECONDS}s"
    "$root/build-gpu/$target" "$@" >"$out/ab/new-$i.txt" 2>&1
    echo "== new run $i rc $? at ${SECONDS}s"
done
tar czf "$out/ab.tgz" -C "$out" ab && rm -rf "$out/ab"
