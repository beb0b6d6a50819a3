/* verify_pair.h - the golden/candidate pair that the verifier tests compare: DIR/golden.h5 and DIR/cand.h5 written
 * from one synth_spec (synth_dump.h), compared by the library or by the dsv4 command, and lookups in the result.
 * DIR is the test's own directory, set once from main (verify_pair_dir) before any other call. */
#ifndef DSV4_VERIFY_PAIR_H
#define DSV4_VERIFY_PAIR_H

#include "dsv4/dsv4_verify.h"
#include "synth_dump.h"

/* The directory of the pair (borrowed: it must outlive the tests). */
void verify_pair_dir(const char *dir);
/* DIR/name, in one of 8 static buffers used in turn. */
const char *verify_pair_path(const char *name);
/* Write the pair from s (golden and candidate roles) and compare them with the library; o may be NULL (the
 * defaults). The test fails unless the run returns a result. */
dsv4_verify_result *verify_pair_run(const synth_spec *s, const dsv4_verify_options *o);
/* `dsv4 verify --no-color DIR/golden.h5 DIR/cand.h5 ARGS`: its exit status, stdout+stderr in *out (malloc'd). */
int verify_pair_cli(const char *args, char **out);
/* The result's probe of `dataset`, and a probe's row at `position`: the test fails when there is none. */
const dsv4_verify_probe *verify_pair_probe(const dsv4_verify_result *r, const char *dataset);
const dsv4_verify_row *verify_pair_row(const dsv4_verify_probe *p, int position);

#endif
