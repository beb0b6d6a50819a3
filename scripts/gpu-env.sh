# gpu-env.sh - sourced on the GPU machine by gpu-test.sh, gpu-sanitize.sh and bench/run_on_device.sh: unpack the
# carried .debs (Check, subunit, jansson; fetched here by fetch-debs.sh) into a private prefix, never into /, and
# point pkg-config, the loader and PATH at it and at CUDA. Returns 2 when .debs/ was not carried or does not unpack.
# DSV4_PREFIX overrides the prefix (default /tmp/dsv4-prefix).
dsv4_prefix=${DSV4_PREFIX:-/tmp/dsv4-prefix}
dsv4_root=${dsv4_root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if ! ls "$dsv4_root"/.debs/*.deb >/dev/null 2>&1; then
    echo "gpu-env: no .debs/ here: run scripts/fetch-debs.sh and carry .debs" >&2
    return 2
fi
mkdir -p "$dsv4_prefix" || return 2
# once per machine and set of .debs, under a lock: several sanitizer runs may source this at the same time. The
# marker holds the .debs' checksums and is written only when every .deb unpacked and the pkg-config files were
# rewritten; a failed unpack, or other .debs carried to a warm machine, is redone next time.
if ! (
    flock 9
    sums=$(cd "$dsv4_root/.debs" && sha256sum -- *.deb) || { echo "gpu-env: cannot read $dsv4_root/.debs" >&2; exit 1; }
    if [ "$(cat "$dsv4_prefix/.unpacked" 2>/dev/null)" != "$sums" ]; then
        rm -rf "${dsv4_prefix:?}/usr" # what an earlier, failed unpack (or other .debs) left
        for deb in "$dsv4_root"/.debs/*.deb; do
            dpkg -x "$deb" "$dsv4_prefix" || { echo "gpu-env: $deb: dpkg -x failed" >&2; exit 1; }
        done
        pcs=("$dsv4_prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc)
        [ -f "${pcs[0]}" ] || { echo "gpu-env: the .debs hold no pkg-config files" >&2; exit 1; }
        sed -i "s|^prefix=.*|prefix=$dsv4_prefix/usr|" "${pcs[@]}" || exit 1
        printf '%s\n' "$sums" >"$dsv4_prefix/.unpacked"
    fi
) 9>"$dsv4_prefix/.lock"; then
    echo "gpu-env: unpacking $dsv4_root/.debs into $dsv4_prefix failed" >&2
    return 2
fi
export PKG_CONFIG_PATH=$dsv4_prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$dsv4_prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:$PATH
