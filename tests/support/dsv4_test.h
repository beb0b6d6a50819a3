/* dsv4_test.h - what every Check test of dsv4 shares: paths, temp dirs, the suite runner, GPU skip.
 *
 * Tests find the source tree (golden data) and the build tree through the environment set by ctest
 * (DSV4_SOURCE_DIR, DSV4_BINARY_DIR, DSV4_BIN = the dsv4 command). A GPU test calls
 * dsv4_test_require_gpu() first: without a CUDA device it exits 77, which ctest reports as skipped.
 */
#ifndef DSV4_TEST_H
#define DSV4_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4/dsv4.h"

/* $DSV4_SOURCE_DIR/rel (static buffer, overwritten by the next call). */
const char *dsv4_test_source_path(const char *rel);
/* The dsv4 binary ($DSV4_BIN). */
const char *dsv4_test_bin(void);
/* A fresh empty directory under $TMPDIR (or /tmp), unique per call; removed by dsv4_test_rmtree. */
char *dsv4_test_mkdtemp(const char *tag);
void dsv4_test_rmtree(char *dir); /* frees dir */
/* The whole file at path, NUL-terminated, malloc'd; its length (without the NUL) in *len when len != NULL. A file
 * that cannot be opened or is read short fails the test, naming the path. */
char *dsv4_test_read_file(const char *path, size_t *len);
/* Run a shell command, capture stdout+stderr into a malloc'd string; returns the exit status. */
int dsv4_test_run(const char *cmd, char **output);
/* Seconds on the monotonic clock, for timing a test's steps. */
double dsv4_test_now_s(void);
/* Start the n shell commands at once, then wait for each in turn: status[i] and outputs[i] as dsv4_test_run's.
 * As each is done it prints "labels[i]: exit N, done by S s" (S counted from the start), so that a log shows how
 * far a slow run (under compute-sanitizer, say) got. */
void dsv4_test_run_together(int n, const char *const *cmds, const char *const *labels, int *status, char **outputs);
/* Fill n floats with NaN so unwritten outputs fail comparisons. */
void dsv4_test_poison_f32(float *p, size_t n);
/* Exits 77 (ctest: skipped) when no CUDA device is present; otherwise the suite runs unforked (CUDA and fork do not mix). */
void dsv4_test_require_gpu(void);
/* $DSV4_TEST_MAX_WORK, or a huge number when unset: GPU kernel tests skip the cases whose work size exceeds it.
 * scripts/gpu-sanitize.sh sets it for racecheck, which is ~1000x slower than the kernels; the small cases take the
 * same code paths (multi-block, tails), only the largest ones are left to the unsanitized run. */
long dsv4_test_max_work(void);
/* $DSV4_TEST_MAX_STEPS, or 0 when unset: the model-level GPU tests step a golden prompt for at most that many
 * positions (dsv4_test_steps) and leave out their golden/topk512 cases (2,312 positions) while it is set.
 * scripts/gpu-sanitize.sh sets it: the tools cannot finish whole golden runs in a device call, and the shortened
 * runs launch the same kernels (prompt and decode steps, graph capture, staggered batches). */
int dsv4_test_max_steps(void);
/* T, or $DSV4_TEST_MAX_STEPS when that is set and smaller. */
int dsv4_test_steps(int T);
/* $DSV4_TEST_RUN_UNDER followed by a space, or "" when unset: the command a test's child `dsv4` jobs run under.
 * scripts/gpu-sanitize.sh sets it to compute-sanitizer for the cases whose GPU work is all in child jobs that use
 * NCCL (test_opt_nccl:test_n1_dumps): such a job as a child of a sanitized process did not finish on the H200,
 * and run under its own compute-sanitizer it does. */
const char *dsv4_test_run_under(void);
/* A model-level test's `dsv4 run` job, written into cmd (size bytes; a Check failure when it does not fit):
 * $DSV4_TEST_RUN_UNDER, then `dsv4 run --model golden/SET ARGS TOKENS --dump DUMP`. ARGS holds the path and its
 * switches; TOKENS is the input (NULL: --tokens-from golden/SET/forced.h5). */
void dsv4_test_run_command(char *cmd, size_t size, const char *set, const char *args, const char *tokens,
                           const char *dump);
/* 1 when $DSV4_TEST_MAX_STEPS is set: a long (golden/topk512) test then prints "<test>: not run
 * (DSV4_TEST_MAX_STEPS is set)", the line scripts/gpu-sanitize.sh reports as "not run", and returns. */
int dsv4_test_leave_out_long(const char *test);
/* Every dataset (and /tokens) of the dumps at pa and pb bitwise equal, else a Check failure naming `what`, the
 * dataset and the first differing element with both bit patterns (tests/support/golden_dumps.c). */
void dsv4_test_assert_dumps_equal(const char *pa, const char *pb, const char *what);
/* golden/SET/forced.h5's /tokens, malloc'd (caller frees), *n their count; golden/SET opened as a model. A Check
 * failure names the file when it does not open. */
int32_t *dsv4_test_golden_tokens(const char *set, int *n);
dsv4_model *dsv4_test_open_golden(const char *set);
/* Run a suite in CK_NOFORK-aware normal mode; returns the process exit status (0 = all passed). */
int dsv4_test_main(Suite *s);
/* Add each of the n tests to s in a test case of its own, named after the test and given timeout_s, so that
 * CK_RUN_CASE=test_name runs that test alone: scripts/gpu-sanitize.sh runs a slow binary's tests in parallel
 * that way. */
void dsv4_test_add_each(Suite *s, int timeout_s, const TTest *const *tests, int n);

#endif
