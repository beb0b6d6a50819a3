/* golden_dumps.c - what the optimized path's model tests share: the committed golden sets (model folder, forced
 * tokens) and the bitwise comparison of two dumps (test_opt_model, test_opt_nccl). */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"

void dsv4_test_assert_dumps_equal(const char *pa, const char *pb, const char *what)
{
    dsv4_dump *a = NULL, *b = NULL;
    ck_assert_msg(dsv4_dump_open(pa, &a) == 0, "%s", dsv4_last_error());
    ck_assert_msg(dsv4_dump_open(pb, &b) == 0, "%s", dsv4_last_error());
    int na, nb;
    const int32_t *ta = dsv4_dump_tokens(a, &na), *tb = dsv4_dump_tokens(b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert(memcmp(ta, tb, (size_t)na * 4) == 0);
    ck_assert_int_eq(dsv4_dump_dataset_count(a), dsv4_dump_dataset_count(b));
    ck_assert_int_gt(dsv4_dump_dataset_count(a), 10);
    for (int i = 0; i < dsv4_dump_dataset_count(a); i++) {
        const char *name = dsv4_dump_dataset_name(a, i);
        dsv4_dataset_info ia, ib;
        ck_assert_msg(dsv4_dump_info(a, name, &ia) == 0 && dsv4_dump_info(b, name, &ib) == 0, "%s", name);
        ck_assert_int_eq(ia.ndim, ib.ndim);
        size_t n = 1;
        for (int k = 0; k < ia.ndim; k++) {
            ck_assert_int_eq(ia.shape[k], ib.shape[k]);
            n *= (size_t)ia.shape[k];
        }
        float *da = malloc(n * 4 + 4), *db = malloc(n * 4 + 4);
        ck_assert(dsv4_dump_read_rows(a, name, 0, ia.shape[0], da) == 0);
        ck_assert(dsv4_dump_read_rows(b, name, 0, ib.shape[0], db) == 0);
        long d = -1;
        for (size_t j = 0; j < n && d < 0; j++)
            if (memcmp(da + j, db + j, 4)) d = (long)j;
        ck_assert_msg(d < 0, "%s: %s differs at element %ld (bits %08x vs %08x)", what, name, d,
                      d < 0 ? 0u : ((uint32_t *)da)[d], d < 0 ? 0u : ((uint32_t *)db)[d]);
        free(da);
        free(db);
    }
    dsv4_dump_free(a);
    dsv4_dump_free(b);
}

int32_t *dsv4_test_golden_tokens(const char *set, int *n)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s/forced.h5", set);
    dsv4_dump *g = NULL;
    ck_assert_msg(dsv4_dump_open(dsv4_test_source_path(rel), &g) == 0, "%s", dsv4_last_error());
    const int32_t *t = dsv4_dump_tokens(g, n);
    int32_t *c = malloc((size_t)*n * sizeof *c);
    memcpy(c, t, (size_t)*n * sizeof *c);
    dsv4_dump_free(g);
    return c;
}

dsv4_model *dsv4_test_open_golden(const char *set)
{
    char rel[128];
    snprintf(rel, sizeof rel, "golden/%s", set);
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(dsv4_test_source_path(rel), &m) == 0, "%s", dsv4_last_error());
    return m;
}
