/* verify_pair.c - the golden/candidate pair of the verifier tests (verify_pair.h). */
#define _POSIX_C_SOURCE 200809L
#include "verify_pair.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "dsv4_test.h"

static const char *g_dir;

void verify_pair_dir(const char *dir) { g_dir = dir; }

const char *verify_pair_path(const char *name)
{
    static char buf[8][4200];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

dsv4_verify_result *verify_pair_run(const synth_spec *s, const dsv4_verify_options *o)
{
    ck_assert_int_eq(synth_write(verify_pair_path("golden.h5"), s, 0), 0);
    ck_assert_int_eq(synth_write(verify_pair_path("cand.h5"), s, 1), 0);
    dsv4_verify_result *r = NULL;
    ck_assert_int_eq(dsv4_verify_run(verify_pair_path("golden.h5"), verify_pair_path("cand.h5"), o, &r), 0);
    ck_assert_ptr_nonnull(r);
    return r;
}

int verify_pair_cli(const char *args, char **out)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' verify --no-color %s/golden.h5 %s/cand.h5 %s", dsv4_test_bin(), g_dir, g_dir, args);
    return dsv4_test_run(cmd, out);
}

const dsv4_verify_probe *verify_pair_probe(const dsv4_verify_result *r, const char *dataset)
{
    for (int i = 0; i < r->n_probes; i++)
        if (!strcmp(r->probes[i].dataset, dataset)) return &r->probes[i];
    ck_abort_msg("no probe %s", dataset);
    return NULL;
}

const dsv4_verify_row *verify_pair_row(const dsv4_verify_probe *p, int position)
{
    for (int i = 0; i < p->n_rows; i++)
        if (p->rows[i].position == position) return &p->rows[i];
    ck_abort_msg("%s has no row at position %d", p->dataset, position);
    return NULL;
}
