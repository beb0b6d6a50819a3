/* fuzz_safetensors.c - libFuzzer target: one safetensors file (8-byte length, JSON header, data) as the input.
 *
 * Parses it in memory with dsv4_st_parse (the checks dsv4_st_open does after mmap), then, for a header that
 * passed, touches the first and last byte of every tensor's range (ASan flags a range the validation let past
 * the buffer) and maps every name through the naming parser. Seeds: tests/fuzz/corpus/safetensors/
 * (make_corpus). Run: fuzz_safetensors -timeout=10 -rss_limit_mb=2048 corpus/safetensors
 */
#include <stddef.h>
#include <stdint.h>

#include "model/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_st_file *f;
    if (dsv4_st_parse(data, size, "fuzz.safetensors", &f)) return 0;
    volatile uint8_t sink = 0;
    char canon[256];
    for (int i = 0; i < f->n; i++) {
        const dsv4_st_entry *e = &f->entries[i];
        if (e->end > e->begin) sink ^= f->data[e->begin] ^ f->data[e->end - 1];
        unsigned naming;
        dsv4_fused_kind fused;
        int layer;
        dsv4_naming_canonical(e->name, canon, sizeof canon, &naming, &fused, &layer);
    }
    (void)sink;
    dsv4_st_free(f);
    return 0;
}
