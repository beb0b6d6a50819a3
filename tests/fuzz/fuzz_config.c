/* fuzz_config.c - libFuzzer target: config.json text as the input.
 *
 * dsv4_config_parse (both dialects, every derived field), then for a config that passed, the tensor list it
 * implies (dsv4_config_expected_tensors: shapes computed from fuzzed sizes must not overflow or crash).
 * Seeds: tests/fuzz/corpus/config/ (the golden configs and the tests' tiny config).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20)) return 0; /* config.json is a few KB; the parser is linear */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0; /* json_loads reads a C string, as dsv4_file_read_text gives it */
    dsv4_config cfg;
    if (dsv4_config_parse(text, "fuzz/config.json", &cfg) == 0) {
        dsv4_expected_tensor *t = NULL;
        int n = 0;
        if (dsv4_config_expected_tensors(&cfg, &t, &n) == 0) free(t);
    }
    free(text);
    return 0;
}
