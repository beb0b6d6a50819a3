/* test_robust_interrupt.c - the temporary-file registry (model/tempfile.c): a process killed by SIGINT or SIGTERM
 * while a registered temporary file exists dies by that signal (exit status as without the handler) and the
 * file is gone; an unregistered file is kept; a signal that was ignored (nohup's SIGHUP) stays ignored.
 * The end-to-end check on a real dump (dsv4 run killed mid-way) is tests/e2e_robust_interrupt.sh. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void wait_for(const char *path)
{
    struct timespec ts = {0, 2000000};
    for (int i = 0; i < 5000 && !exists(path); i++) nanosleep(&ts, NULL);
    ck_assert_msg(exists(path), "%s never appeared", path);
}

/* The child: install, (optionally ignore SIGHUP first), register + create `tmp`, create `plain`, wait. */
static pid_t start_child(const char *tmp, const char *plain, int ignore_hup)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* a fresh process: Check's own SIGINT/SIGTERM handlers (they kill the process group) are not ours */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, ignore_hup ? SIG_IGN : SIG_DFL);
        dsv4_tempfile_install_signal_handlers();
        if (dsv4_tempfile_register(tmp) < 0) _exit(3);
        FILE *f = fopen(tmp, "w");
        FILE *g = fopen(plain, "w");
        if (!f || !g) _exit(4);
        fputs("half a dump", f);
        fflush(f);
        fclose(g);
        for (;;) pause();
    }
    wait_for(plain);
    wait_for(tmp);
    return pid;
}

static void kill_and_check(int sig)
{
    char *dir = dsv4_test_mkdtemp("interrupt");
    char tmp[4200], plain[4200];
    snprintf(tmp, sizeof tmp, "%s/out.h5.tmp.1", dir);
    snprintf(plain, sizeof plain, "%s/other", dir);
    pid_t pid = start_child(tmp, plain, 0);
    ck_assert_int_eq(kill(pid, sig), 0);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == sig, "child status %#x, want killed by %d", st, sig);
    ck_assert_msg(!exists(tmp), "%s survived signal %d", tmp, sig);
    ck_assert_msg(exists(plain), "an unregistered file was removed");
    dsv4_test_rmtree(dir);
}

START_TEST(test_sigint_removes_registered_temp_file)
{
    kill_and_check(SIGINT);
}
END_TEST

START_TEST(test_sigterm_removes_registered_temp_file)
{
    kill_and_check(SIGTERM);
}
END_TEST

START_TEST(test_ignored_sighup_stays_ignored)
{
    char *dir = dsv4_test_mkdtemp("interrupt");
    char tmp[4200], plain[4200];
    snprintf(tmp, sizeof tmp, "%s/out.json.tmp.1", dir);
    snprintf(plain, sizeof plain, "%s/other", dir);
    pid_t pid = start_child(tmp, plain, 1);
    ck_assert_int_eq(kill(pid, SIGHUP), 0);
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, WNOHANG), 0); /* still running */
    ck_assert(exists(tmp));
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    ck_assert(!exists(tmp));
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(test_register_unregister_and_limits)
{
    int a = dsv4_tempfile_register("/nonexistent/a.tmp"), b = dsv4_tempfile_register("/nonexistent/b.tmp");
    ck_assert_int_ge(a, 0);
    ck_assert_int_ge(b, 0);
    ck_assert_int_ne(a, b);
    dsv4_tempfile_unregister(a);
    dsv4_tempfile_unregister(b);
    dsv4_tempfile_unregister(-1); /* no-op */
    ck_assert_int_eq(dsv4_tempfile_register(""), DSV4_ERR_USAGE);
    char *longp = malloc(5000);
    memset(longp, 'x', 4999);
    longp[4999] = 0;
    ck_assert_int_eq(dsv4_tempfile_register(longp), DSV4_ERR_USAGE);
    free(longp);
    int ids[64], n = 0, rc;
    while ((rc = dsv4_tempfile_register("/nonexistent/many.tmp")) >= 0) ids[n++] = rc;
    ck_assert_int_eq(rc, DSV4_ERR_NOMEM);
    ck_assert_int_eq(n, 64);
    for (int i = 0; i < n; i++) dsv4_tempfile_unregister(ids[i]);
    dsv4_tempfile_remove_all(); /* nothing registered: nothing happens */
}
END_TEST

static Suite *robust_interrupt_suite(void)
{
    Suite *s = suite_create("robust_interrupt");
    TCase *tc = tcase_create("signals");
    tcase_add_test(tc, test_sigint_removes_registered_temp_file);
    tcase_add_test(tc, test_sigterm_removes_registered_temp_file);
    tcase_add_test(tc, test_ignored_sighup_stays_ignored);
    tcase_add_test(tc, test_register_unregister_and_limits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return dsv4_test_main(robust_interrupt_suite());
}
