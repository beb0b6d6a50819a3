/* launch_count.c - a CUPTI injection library that counts the kernels a CUDA program runs, so that
 * compute-sanitizer's --launch-skip can start checking near the end of a long run (scripts/gpu-sanitize-tail.sh).
 * Built there:  gcc -shared -fPIC -I$CUDA/include launch_count.c -L$CUDA/lib64 -lcupti -o liblaunch_count.so
 * Used:         CUDA_INJECTION64_PATH=liblaunch_count.so LAUNCH_COUNT_OUT=FILE program ...
 * At exit it writes "kernels N dropped D" to FILE (stderr when unset). It counts CUPTI's kernel activity records,
 * so every kernel that ran is counted once, whichever API launched it (ours, cuBLAS's, a graph's). */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t n_kernels;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = (size_t)8 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) n_kernels++;
    free(buf);
}

static void report(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped);
    const char *path = getenv("LAUNCH_COUNT_OUT");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "launch_count: cannot write %s\n", path);
        return;
    }
    fprintf(f, "kernels %llu dropped %zu\n", (unsigned long long)n_kernels, dropped);
    if (f != stderr) fclose(f);
}

/* the driver calls this when it loads CUDA_INJECTION64_PATH */
int InitializeInjection(void)
{
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "launch_count: CUPTI activity set-up failed\n");
        return 0;
    }
    atexit(report);
    return 1;
}
