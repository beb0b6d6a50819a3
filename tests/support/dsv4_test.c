/* dsv4_test.c - shared test helpers (see dsv4_test.h). */
#define _POSIX_C_SOURCE 200809L
#include "dsv4_test.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

const char *dsv4_test_source_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("DSV4_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

const char *dsv4_test_bin(void)
{
    const char *bin = getenv("DSV4_BIN");
    return bin ? bin : "dsv4";
}

char *dsv4_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    ck_assert_msg(n >= 0, "cannot size %s", path);
    char *buf = malloc((size_t)n + 1);
    ck_assert(buf != NULL);
    ck_assert_msg(fread(buf, 1, (size_t)n, f) == (size_t)n, "short read of %s", path);
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

char *dsv4_test_mkdtemp(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    char *dir = malloc(4096);
    if (!dir) return NULL;
    snprintf(dir, 4096, "%s/dsv4-%s-XXXXXX", tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(dir)) {
        free(dir);
        return NULL;
    }
    return dir;
}

void dsv4_test_rmtree(char *dir)
{
    if (!dir) return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    free(dir);
}

/* All of f's output as a malloc'd string (NULL when out of memory), then its exit status as dsv4_test_run's. */
static int read_and_close(FILE *f, char **output)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    int st = pclose(f);
    if (output) *output = buf;
    else free(buf);
    return (st >= 0 && (st & 0x7f) == 0) ? ((st >> 8) & 0xff) : -1;
}

static FILE *start_command(const char *cmd)
{
    char full[8192];
    snprintf(full, sizeof full, "( %s ) 2>&1", cmd);
    return popen(full, "r");
}

int dsv4_test_run(const char *cmd, char **output)
{
    FILE *f = start_command(cmd);
    return f ? read_and_close(f, output) : -1;
}

double dsv4_test_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dsv4_test_run_together(int n, const char *const *cmds, const char *const *labels, int *status, char **outputs)
{
    const double t0 = dsv4_test_now_s();
    FILE **f = calloc((size_t)n, sizeof *f);
    for (int i = 0; f && i < n; i++) f[i] = start_command(cmds[i]);
    /* read in order: a later command that fills its pipe meanwhile just waits for its turn */
    for (int i = 0; i < n; i++) {
        outputs[i] = NULL;
        status[i] = f && f[i] ? read_and_close(f[i], &outputs[i]) : -1;
        printf("%s: exit %d, done by %.1f s\n", labels[i], status[i], dsv4_test_now_s() - t0);
        fflush(stdout);
    }
    free(f);
}

void dsv4_test_poison_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* CUDA cannot be used in a child forked after the parent initialised it: GPU tests run unforked. */
static int dsv4_test_no_fork;

void dsv4_test_require_gpu(void)
{
    dsv4_test_no_fork = 1;
#ifdef DSV4_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
#else
    printf("built without CUDA: skipped\n");
    exit(77);
#endif
}

long dsv4_test_max_work(void)
{
    const char *v = getenv("DSV4_TEST_MAX_WORK");
    long n = v && *v ? strtol(v, NULL, 10) : 0;
    return n > 0 ? n : (1L << 62);
}

int dsv4_test_max_steps(void)
{
    const char *v = getenv("DSV4_TEST_MAX_STEPS");
    long n = v && *v ? strtol(v, NULL, 10) : 0;
    return n > 0 && n < INT_MAX ? (int)n : 0;
}

const char *dsv4_test_run_under(void)
{
    static char buf[1024];
    const char *v = getenv("DSV4_TEST_RUN_UNDER");
    if (!v || !*v) return "";
    snprintf(buf, sizeof buf, "%s ", v);
    return buf;
}

void dsv4_test_run_command(char *cmd, size_t size, const char *set, const char *args, const char *tokens,
                           const char *dump)
{
    char golden[4200], forced[4300];
    snprintf(golden, sizeof golden, "%sgolden/%s", dsv4_test_source_path(""), set);
    if (!tokens) {
        snprintf(forced, sizeof forced, "--tokens-from %s/forced.h5", golden);
        tokens = forced;
    }
    const int n = snprintf(cmd, size, "%s%s run --model %s %s %s --dump %s", dsv4_test_run_under(), dsv4_test_bin(),
                           golden, args, tokens, dump);
    ck_assert_msg(n >= 0 && (size_t)n < size, "the dsv4 run command for %s does not fit in %zu bytes", set, size);
}

int dsv4_test_steps(int T)
{
    const int cap = dsv4_test_max_steps();
    return cap > 0 && cap < T ? cap : T;
}

int dsv4_test_leave_out_long(const char *test)
{
    if (!dsv4_test_max_steps()) return 0;
    printf("%s: not run (DSV4_TEST_MAX_STEPS is set)\n", test);
    return 1;
}

int dsv4_test_main(Suite *s)
{
    SRunner *sr = srunner_create(s);
    if (dsv4_test_no_fork) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

void dsv4_test_add_each(Suite *s, int timeout_s, const TTest *const *tests, int n)
{
    for (int i = 0; i < n; i++) {
        TCase *tc = tcase_create(tests[i]->name);
        tcase_set_timeout(tc, timeout_s);
        tcase_add_test(tc, tests[i]);
        suite_add_tcase(s, tc);
    }
}
