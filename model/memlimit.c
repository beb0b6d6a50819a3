/* memlimit.c - memory limits checked BEFORE a large allocation (dsv4.h, "Memory limits").
 *
 * A config or header can ask for more memory than the machine has (a 10^6-token state, a 300 GB FP4 checkpoint
 * dequantised to f32). Linux overcommits: the malloc succeeds and the process is OOM-killed pages later, with
 * no message. So sizes are checked against what the host (or GPU) has now and refused with both numbers named.
 * - Host: MemAvailable of /proc/meminfo (and cgroup v2 memory.max - memory.current where a cgroup caps us),
 *   less a margin of max(256 MiB, 1/16 of it), and $DSV4_HOST_MEM_LIMIT when set (a cap the user chooses; the
 *   fuzzers and tests use it).
 * - Device: cudaMemGetInfo's free memory less max(256 MiB, 1/32 of total), and $DSV4_DEVICE_MEM_LIMIT when set.
 *   A build without CUDA applies only the environment limit.
 * Sizes are doubles so a caller summing sizes from a hostile config cannot wrap size_t on the way here.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dsv4/dsv4.h"

#define DSV4_MEM_MIB (1024.0 * 1024.0)

const char *dsv4_mem_format(double bytes, char *buf, size_t size)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    double v = bytes < 0 ? 0 : bytes;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, size, "%.0f bytes", v);
    else if (v >= 1024.0) snprintf(buf, size, "%.3g %s", v, units[u]); /* past EiB: keep the exponent */
    else snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

/* $name as bytes ("1500000", "512M", "2G", "1T"); -1 if unset or unparseable. */
static double env_limit(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s) return -1;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    switch (toupper((unsigned char)*end)) {
    case 'K': v *= 1024.0; break;
    case 'M': v *= DSV4_MEM_MIB; break;
    case 'G': v *= DSV4_MEM_MIB * 1024.0; break;
    case 'T': v *= DSV4_MEM_MIB * 1024.0 * 1024.0; break;
    case 0: break;
    default: return -1;
    }
    return v;
}

/* A number from a one-line file ("max" or unreadable: -1). */
static double read_number_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[64] = "";
    double v = -1;
    if (fgets(line, sizeof line, f) && isdigit((unsigned char)line[0])) v = strtod(line, NULL);
    fclose(f);
    return v;
}

/* Bytes the host can give us now, before the margin; -1 if unknown. */
static double host_available(void)
{
    double avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (double)kb * 1024.0;
                break;
            }
        }
        fclose(f);
    }
    double max = read_number_file("/sys/fs/cgroup/memory.max"), cur = read_number_file("/sys/fs/cgroup/memory.current");
    if (max >= 0 && cur >= 0 && (avail < 0 || max - cur < avail)) avail = max > cur ? max - cur : 0;
    return avail;
}

static double margin(double avail, double fraction)
{
    double m = avail * fraction;
    return m > 256.0 * DSV4_MEM_MIB ? m : 256.0 * DSV4_MEM_MIB;
}

int dsv4_mem_check_host(double bytes, const char *what)
{
    char need[32], have[32];
    if (!what) what = "an allocation";
    double cap = env_limit("DSV4_HOST_MEM_LIMIT");
    if (cap >= 0 && bytes > cap)
        return dsv4_error(DSV4_ERR_NOMEM, "%s: needs %s, more than DSV4_HOST_MEM_LIMIT (%s)", what,
                          dsv4_mem_format(bytes, need, sizeof need), dsv4_mem_format(cap, have, sizeof have));
    if (bytes <= DSV4_MEM_MIB) return 0; /* no single small buffer is what exhausts a host: skip reading /proc */
    double avail = host_available();
    if (avail < 0) return 0; /* no /proc: nothing to check against */
    double usable = avail - margin(avail, 1.0 / 16.0);
    if (bytes > usable)
        return dsv4_error(DSV4_ERR_NOMEM, "%s: needs %s, the host has %s available (MemAvailable less a margin)", what,
                          dsv4_mem_format(bytes, need, sizeof need),
                          dsv4_mem_format(usable > 0 ? usable : 0, have, sizeof have));
    return 0;
}

int dsv4_mem_check_device(double bytes, const char *what)
{
    char need[32], have[32];
    if (!what) what = "a GPU allocation";
    double cap = env_limit("DSV4_DEVICE_MEM_LIMIT");
    if (cap >= 0 && bytes > cap)
        return dsv4_error(DSV4_ERR_NOMEM, "%s: needs %s of GPU memory, more than DSV4_DEVICE_MEM_LIMIT (%s)", what,
                          dsv4_mem_format(bytes, need, sizeof need), dsv4_mem_format(cap, have, sizeof have));
#ifdef DSV4_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess)
        return dsv4_error(DSV4_ERR_CUDA, "%s: cannot query GPU memory (cudaMemGetInfo: %s)", what, cudaGetErrorString(e));
    double usable = (double)free_b - margin((double)total_b, 1.0 / 32.0);
    if (bytes > usable) {
        char total[32];
        return dsv4_error(DSV4_ERR_NOMEM, "%s: needs %s of GPU memory, the GPU has %s free of %s (less a margin)", what,
                          dsv4_mem_format(bytes, need, sizeof need),
                          dsv4_mem_format(usable > 0 ? usable : 0, have, sizeof have),
                          dsv4_mem_format((double)total_b, total, sizeof total));
    }
#endif
    return 0;
}

int dsv4_mem_device_alloc_failed(double bytes, const char *what, const char *why)
{
    char need[32], fr[32] = "?", tot[32] = "?";
#ifdef DSV4_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        dsv4_mem_format((double)free_b, fr, sizeof fr);
        dsv4_mem_format((double)total_b, tot, sizeof tot);
    }
#endif
    return dsv4_error(DSV4_ERR_CUDA, "%s: cannot allocate %s on the GPU (%s free of %s): %s", what ? what : "?",
                      dsv4_mem_format(bytes, need, sizeof need), fr, tot, why ? why : "allocation failed");
}
