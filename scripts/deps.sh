#!/usr/bin/env bash
# deps.sh [EXTRA_PACKAGE...] - install what dsv4 needs to build on Debian 12 / Ubuntu 24.04, with apt-get, only
# if missing. Run by setup.sh (and test.sh, for the extra packages); safe to run twice. CUDA: nvcc is used when
# present (/usr/local/cuda or PATH); without it the CPU paths are built and the GPU ones report that the build has
# no CUDA.
# Extra packages are for optional steps only (test.sh: valgrind; clang + libclang-rt-N-dev for the fuzzers).
# The Python kit (python/dsv4dump) needs numpy and h5py, from Debian's packages: they install into /usr/bin/python3
# (tests/support/kit_python.sh picks that one when python3 on PATH lacks them); pip, setuptools and wheel let its test
# install the kit from the repository without a package index.
set -euo pipefail

dsv4_packages=(cmake make gcc pkg-config libhdf5-dev libopenblas-dev check libsubunit-dev libjansson-dev libssl-dev
               python3 python3-numpy python3-h5py python3-pip python3-setuptools python3-wheel "$@")
missing=()
for p in "${dsv4_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "dsv4: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
