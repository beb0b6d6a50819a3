#!/usr/bin/env bash
# fetch-debs.sh - download (here, where Debian's registry is reachable) the .deb files the GPU machine lacks:
# Check (+ subunit) and jansson headers and libraries. They go to .debs/ (git-ignored) and travel to the
# device with `carry: [".debs"]`; gpu-test.sh unpacks them into a private prefix there, never into /.
# Exit status 1 when a package cannot be downloaded (after one `apt-get update` and a second try).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs=(check libsubunit-dev libsubunit0 libjansson-dev libjansson4)
mkdir -p "$root/.debs"
cd "$root/.debs"
err=$(mktemp)
trap 'rm -f "$err"' EXIT
# apt-get download's own exit status decides (a pipe into grep hid it); /var/lib/apt/lists always holds `lock`
# and `partial`, so whether the package lists are there is found by trying, and updating once on failure
download() { apt-get download "${pkgs[@]}" 2>"$err"; }
if ! download; then
    echo "fetch-debs: apt-get download failed; running apt-get update and trying again" >&2
    if ! apt-get update -qq || ! download; then
        grep -v '^W: Download is performed unsandboxed' "$err" >&2 || true
        echo "fetch-debs: could not download ${pkgs[*]} into $root/.debs" >&2
        exit 1
    fi
fi
grep -v '^W: Download is performed unsandboxed' "$err" >&2 || true
ls -1 "$root/.debs"
