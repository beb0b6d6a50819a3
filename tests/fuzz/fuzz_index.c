/* fuzz_index.c - libFuzzer target: model.safetensors.index.json as the input.
 *
 * At start-up a tiny sharded model (config.json + two shards, st_writer) is written into a private temporary
 * folder; each input replaces its index.json and the folder is opened with dsv4_model_open, so the whole index
 * path runs: JSON, weight_map entries ("../x", empty, non-strings), shard names, every promised tensor present
 * in its shard. A model that opens is checked against its config (dsv4_model_check).
 * Seeds: tests/fuzz/corpus/index/.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "st_writer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir[256];
static char fuzz_index[320];

static void fuzz_cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (fuzz_dir[0] && system(cmd) != 0) fprintf(stderr, "fuzz_index: cannot remove %s\n", fuzz_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/dsv4-fuzz-index-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir)) {
        perror("fuzz_index: mkdtemp");
        exit(1);
    }
    atexit(fuzz_cleanup);
    dsv4_stw_model_opts o = {DSV4_STW_OFFICIAL_F32, NULL, NULL, 2};
    if (dsv4_stw_make_model(fuzz_dir, dsv4_stw_tiny_config(), &o)) exit(1);
    snprintf(fuzz_index, sizeof fuzz_index, "%s/model.safetensors.index.json", fuzz_dir);
    return 0;
}

static void report_nothing(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(fuzz_index, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
    dsv4_model *m;
    if (dsv4_model_open(fuzz_dir, &m) == 0) {
        dsv4_model_check(m, report_nothing, NULL);
        dsv4_model_free(m);
    }
    return 0;
}
