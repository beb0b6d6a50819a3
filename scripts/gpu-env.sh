# gpu-env.sh - sourced on the GPU machine by gpu-test.sh, gpu-sanitize.sh and bench/run_on_device.sh: unpack the
# carried .debs (Check, subunit, jansson; fetched here by fetch-debs.sh) into a private prefix, never into /, and
# point pkg-config, the loader and PATH at it and at CUDA. Returns 2 when .debs/ was not carried.
dsv4_prefix=/tmp/dsv4-prefix
dsv4_root=${dsv4_root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if ! ls "$dsv4_root"/.debs/*.deb >/dev/null 2>&1; then
    echo "gpu-env: no .debs/ here: run scripts/fetch-debs.sh and carry .debs" >&2
    return 2
fi
mkdir -p "$dsv4_prefix"
# once per machine, under a lock: several sanitizer runs may source this at the same time
(
    flock 9
    if [ ! -f "$dsv4_prefix/.unpacked" ]; then
        for deb in "$dsv4_root"/.debs/*.deb; do dpkg -x "$deb" "$dsv4_prefix"; done
        sed -i "s|^prefix=.*|prefix=$dsv4_prefix/usr|" "$dsv4_prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
        touch "$dsv4_prefix/.unpacked"
    fi
) 9>"$dsv4_prefix/.lock"
export PKG_CONFIG_PATH=$dsv4_prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$dsv4_prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:$PATH
