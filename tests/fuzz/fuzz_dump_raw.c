/* fuzz_dump_raw.c - libFuzzer target: a dsv4-dump/1 HDF5 file, as raw bytes, as the input.
 *
 * The reader works on files (HDF5 opens by name), so each input is written to a private temporary file and
 * opened with dsv4_dump_open; for a dump that opens, every attribute, the embedded config, every dataset's
 * info (validated against the config) and the first rows of each dataset are read, as dsv4 verify would.
 * DSV4_HOST_MEM_LIMIT is set to 256M so a declared shape the machine cannot hold is refused by the library
 * (dsv4_mem_check_host), not by libFuzzer's rss limit. Seeds: tests/fuzz/corpus/dump_raw/.
 * Most findings of this target are inside libhdf5 itself (1.10.8: wild free in H5G__dense_get_name_by_idx,
 * a loop in the global heap reader, leaks in H5C_protect), which dsv4 cannot guard against: run it with
 * -fork=1 -ignore_crashes=1 and triage the artifacts by their first dsv4 frame (tests/fuzz/README.md). The
 * structure-aware fuzz_dump.c is the one that tests dsv4's reader logic, and the one CI runs.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_path[300];

static void fuzz_cleanup(void)
{
    if (fuzz_path[0]) unlink(fuzz_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_path, sizeof fuzz_path, "%s/dsv4-fuzz-dump-%ld.h5", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    atexit(fuzz_cleanup);
    setenv("DSV4_HOST_MEM_LIMIT", "256M", 0);
    return 0;
}

#define FUZZ_READ_BYTES (16u << 20) /* rows read per dataset, at most */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(fuzz_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
    dsv4_dump *d;
    if (dsv4_dump_open(fuzz_path, &d)) return 0;
    volatile size_t sink = 0;
    static const char *const attrs[] = {"producer", "config_json", "weights_digest", "mode", "seed", "command"};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        const char *v = dsv4_dump_attr(d, attrs[i]);
        if (v) sink += strlen(v);
    }
    int n_tok = 0, n_pos = 0;
    const int32_t *tok = dsv4_dump_tokens(d, &n_tok), *pos = dsv4_dump_positions(d, &n_pos);
    if (n_tok) sink += (size_t)tok[n_tok - 1];
    if (n_pos) sink += (size_t)pos[n_pos - 1];
    const dsv4_config *cfg;
    if (dsv4_dump_config(d, &cfg) == 0) sink += (size_t)cfg->num_hidden_layers;
    for (int i = 0; i < dsv4_dump_dataset_count(d); i++) {
        const char *name = dsv4_dump_dataset_name(d, i);
        dsv4_dataset_info info;
        if (dsv4_dump_info(d, name, &info)) continue;
        size_t row = 4;
        for (int k = 1; k < info.ndim && row <= FUZZ_READ_BYTES; k++) row *= (size_t)info.shape[k];
        if (row == 0 || row > FUZZ_READ_BYTES || info.shape[0] == 0) continue;
        int64_t rows = (int64_t)(FUZZ_READ_BYTES / row);
        if (rows > info.shape[0]) rows = info.shape[0];
        if (rows > 4) rows = 4;
        void *buf = malloc((size_t)rows * row);
        if (!buf) continue;
        if (dsv4_dump_read_rows(d, name, 0, rows, buf) == 0) sink += ((unsigned char *)buf)[0];
        free(buf);
    }
    (void)sink;
    dsv4_dump_free(d);
    return 0;
}
