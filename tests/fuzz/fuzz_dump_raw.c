/* fuzz_dump_raw.c - libFuzzer target: a dsv4-dump/1 HDF5 file, as raw bytes, as the input.
 *
 * The reader works on files (HDF5 opens by name), so each input is written to a private temporary file and
 * opened with dsv4_dump_open; for a dump that opens, every attribute, the embedded config, every dataset's
 * info (validated against the config) and the first and last rows of each dataset are read, as dsv4 verify would
 * (fuzz_dump_read.h, shared with fuzz_dump.c). DSV4_HOST_MEM_LIMIT is set to 256M so a declared shape the machine
 * cannot hold is refused by the library (dsv4_mem_check_host), not by libFuzzer's rss limit.
 * Seeds: tests/fuzz/corpus/dump_raw/.
 * Most findings of this target are inside libhdf5 itself (1.10.8: wild free in H5G__dense_get_name_by_idx,
 * a loop in the global heap reader, leaks in H5C_protect), which dsv4 cannot guard against: run it with
 * -fork=1 -ignore_crashes=1 and triage the artifacts by their first dsv4 frame (tests/fuzz/README.md). The
 * structure-aware fuzz_dump.c is the one that tests dsv4's reader logic, and the one CI runs.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>

#include "fuzz_dump_read.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_dump_init("dump");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(fuzz_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
    dsv4_dump *d;
    if (dsv4_dump_open(fuzz_path, &d)) return 0;
    fuzz_read_everything(d);
    dsv4_dump_free(d);
    return 0;
}
