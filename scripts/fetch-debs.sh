#!/usr/bin/env bash
# fetch-debs.sh - download (here, where Debian's registry is reachable) the .deb files the GPU machine lacks:
# Check (+ subunit) and jansson headers and libraries. They go to .debs/ (git-ignored) and travel to the
# device with `carry: [".debs"]`; gpu-test.sh unpacks them into a private prefix there, never into /.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.debs"
cd "$root/.debs"
[ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update -qq
apt-get download check libsubunit-dev libsubunit0 libjansson-dev libjansson4 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
ls -1 "$root/.debs"
