/* fuzz_dump_read.h - what both dump fuzz targets (fuzz_dump.c, fuzz_dump_raw.c) share: the private temporary file
 * each input is written to (HDF5 opens files by name) and the reads a dump gets once it opens, as dsv4 verify
 * would make them. Included by exactly one translation unit per fuzzer, so the definitions are static.
 */
#ifndef DSV4_FUZZ_DUMP_READ_H
#define DSV4_FUZZ_DUMP_READ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"

#define FUZZ_READ_BYTES (16u << 20) /* bytes read per dataset, at most */

static char fuzz_path[300];

static void fuzz_cleanup(void)
{
    if (fuzz_path[0]) unlink(fuzz_path);
}

/* The temporary file $TMPDIR/dsv4-fuzz-<tag>-<pid>.h5 (removed at exit), and DSV4_HOST_MEM_LIMIT = 256M so that a
 * declared shape the machine cannot hold is refused by the library, not by libFuzzer's rss limit. */
static void fuzz_dump_init(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_path, sizeof fuzz_path, "%s/dsv4-fuzz-%s-%ld.h5", tmp && *tmp ? tmp : "/tmp", tag, (long)getpid());
    atexit(fuzz_cleanup);
    setenv("DSV4_HOST_MEM_LIMIT", "256M", 0);
}

/* Every root attribute the tools read, the tokens and positions, the embedded config, every dataset's info (checked
 * against the config by the reader) and its first rows (up to 4) and last row. */
static void fuzz_read_everything(dsv4_dump *d)
{
    volatile size_t sink = 0;
    static const char *const attrs[] = {"producer", "config_json", "weights_digest", "mode", "schema", "seed",
                                        "command"};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        const char *v = dsv4_dump_attr(d, attrs[i]);
        if (v) sink += strlen(v);
    }
    int n_tok = 0, n_pos = 0;
    const int32_t *tok = dsv4_dump_tokens(d, &n_tok), *pos = dsv4_dump_positions(d, &n_pos);
    for (int i = 0; i < n_tok; i++) sink += (size_t)tok[i];
    for (int i = 0; i < n_pos; i++) sink += (size_t)pos[i];
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
        if (info.shape[0] > rows) dsv4_dump_read_rows(d, name, info.shape[0] - 1, 1, buf); /* the last row too */
        free(buf);
    }
    (void)sink;
}

#endif /* DSV4_FUZZ_DUMP_READ_H */
