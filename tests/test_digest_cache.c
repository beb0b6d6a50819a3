/* test_digest_cache.c - the weights digest cache (issue 36; model/digest.c, docs/reference.md "The weights digest
 * and its cache"), through `dsv4 inspect --digest` and `dsv4 run --dump`, on a sharded model of 1 GiB (a tiny model
 * in 2 shards plus a sparse 1 GiB *.safetensors file: weights_digest hashes every *.safetensors of a sharded folder):
 *
 *   - the first digest is hashed and stored; the second comes from the cache and is the same as an uncached one;
 *   - a shard rewritten in place with its size and mtime restored is hashed again (the key holds ctime too): the
 *     new digest, not the stale one; so is a shard whose mtime changed (touch), and a cache file cut short;
 *   - DSV4_DIGEST_CACHE=off neither reads nor writes the cache; a model under 1 GiB is never cached;
 *   - `dsv4 run --dump` says it took the digest from the cache, and the dump holds the right one.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"
#include "st_writer.h"

static char *root, model[4200], cache[4200];

/* Files in `dir` (0 when it does not exist). */
static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* `dsv4 inspect --digest` of dir with DSV4_DIGEST_CACHE=env: the digest into hex, 1 when "(from the cache)". */
static int inspect_digest(const char *dir, const char *env, char hex[65])
{
    char cmd[9000], *out = NULL;
    /* stdout only: under load the digest's progress line (stderr) says "weights_digest: hashed ..." too */
    snprintf(cmd, sizeof cmd, "DSV4_DIGEST_CACHE='%s' '%s' inspect --digest '%s' 2>/dev/null", env, dsv4_test_bin(),
             dir);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 0, "%s -> %d\n%s", cmd, st, out);
    const char *p = strstr(out, "\nweights_digest: ");
    p = p ? p + 1 : NULL;
    ck_assert_msg(p && strlen(p) >= 16 + 64, "no digest:\n%s", out);
    memcpy(hex, p + 16, 64);
    hex[64] = 0;
    int cached = !strncmp(p + 16 + 64, " (from the cache)", 17);
    free(out);
    return cached;
}

/* Rewrite one byte of path in place, then restore its atime and mtime (ctime moves, as it must). */
static void rewrite_keeping_mtime(const char *path, off_t at, unsigned char byte)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
    ck_assert_int_eq(close(fd), 0);
    struct timespec t[2] = {st.st_atim, st.st_mtim};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
    struct stat st2;
    ck_assert_int_eq(stat(path, &st2), 0);
    ck_assert(st2.st_size == st.st_size && st2.st_mtim.tv_sec == st.st_mtim.tv_sec &&
              st2.st_mtim.tv_nsec == st.st_mtim.tv_nsec);
}

static void setup(void)
{
    root = dsv4_test_mkdtemp("digest-cache");
    snprintf(model, sizeof model, "%s/model", root);
    snprintf(cache, sizeof cache, "%s/cache", root);
    ck_assert_int_eq(mkdir(model, 0755), 0);
    dsv4_stw_model_opts o = {.naming = DSV4_STW_OFFICIAL_F32, .shards = 2};
    ck_assert_int_eq(dsv4_stw_make_model(model, dsv4_stw_tiny_config(), &o), 0);
    char pad[4400];
    snprintf(pad, sizeof pad, "%s/model-pad.safetensors", model); /* not in the index: hashed, never loaded */
    int fd = open(pad, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)1 << 30), 0);
    ck_assert_int_eq(close(fd), 0);
}

static void teardown(void) { dsv4_test_rmtree(root); }

START_TEST(cached_digest_is_the_digest_and_follows_the_files)
{
    char first[65], again[65], plain[65], pad[4400];
    snprintf(pad, sizeof pad, "%s/model-pad.safetensors", model);
    double t0 = dsv4_test_now_s();
    ck_assert_int_eq(inspect_digest(model, cache, first), 0); /* hashed, stored */
    double t_hash = dsv4_test_now_s() - t0;
    ck_assert_int_eq(count_files(cache), 1);
    t0 = dsv4_test_now_s();
    ck_assert_int_eq(inspect_digest(model, cache, again), 1); /* from the cache */
    double t_cached = dsv4_test_now_s() - t0;
    ck_assert_str_eq(again, first);
    ck_assert_int_eq(inspect_digest(model, "off", plain), 0); /* the cache changes nothing */
    ck_assert_str_eq(plain, first);
    printf("hashed in %.2f s, from the cache in %.2f s: %s\n", t_hash, t_cached, first);

    /* rewritten in place, size and mtime restored: ctime moved, so hashed again */
    rewrite_keeping_mtime(pad, 4096, 0x5a);
    char changed[65];
    ck_assert_int_eq(inspect_digest(model, cache, changed), 0);
    ck_assert_str_ne(changed, first);
    ck_assert_int_eq(inspect_digest(model, "off", plain), 0);
    ck_assert_str_eq(changed, plain);
    ck_assert_int_eq(inspect_digest(model, cache, again), 1);
    ck_assert_str_eq(again, changed);

    /* a new mtime (touch, the content back as it was): hashed again */
    rewrite_keeping_mtime(pad, 4096, 0);
    ck_assert_int_eq(utimensat(AT_FDCWD, pad, NULL, 0), 0);
    ck_assert_int_eq(inspect_digest(model, cache, again), 0);
    ck_assert_str_eq(again, first);

    /* a cache file cut short is ignored and rewritten */
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "for f in '%s'/*; do head -c 100 \"$f\" > \"$f.cut\" && mv \"$f.cut\" \"$f\"; done",
             cache);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    free(out);
    ck_assert_int_eq(inspect_digest(model, cache, again), 0);
    ck_assert_str_eq(again, first);
    ck_assert_int_eq(inspect_digest(model, cache, again), 1);
    ck_assert_int_eq(count_files(cache), 1);
}
END_TEST

START_TEST(off_and_small_models_write_nothing)
{
    char hex[65];
    ck_assert_int_eq(inspect_digest(model, "off", hex), 0);
    ck_assert_int_eq(inspect_digest(model, "off", hex), 0);
    ck_assert_int_eq(count_files(cache), 0);
    /* golden/tiny (3 MB): hashed every time, never stored */
    ck_assert_int_eq(inspect_digest(dsv4_test_source_path("golden/tiny"), cache, hex), 0);
    ck_assert_int_eq(inspect_digest(dsv4_test_source_path("golden/tiny"), cache, hex), 0);
    ck_assert_int_eq(count_files(cache), 0);
}
END_TEST

START_TEST(run_dump_takes_the_cached_digest)
{
    char hex[65];
    ck_assert_int_eq(inspect_digest(model, cache, hex), 0);
    char cmd[30000], *out = NULL, dump[4400];
    snprintf(dump, sizeof dump, "%s/run.h5", root);
    snprintf(cmd, sizeof cmd, "echo 1 2 3 > '%s/p.txt' && DSV4_DIGEST_CACHE='%s' '%s' run --model '%s' --prompt-tokens "
             "'%s/p.txt' --decode 1 --dump '%s' 2>&1", root, cache, dsv4_test_bin(), model, root, dump);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == 0 && strstr(out, "weights_digest from the cache"), "%s -> %d\n%s", cmd, st, out);
    free(out);
    dsv4_dump *d = NULL;
    ck_assert_int_eq(dsv4_dump_open(dump, &d), 0);
    ck_assert_str_eq(dsv4_dump_attr(d, "weights_digest"), hex);
    dsv4_dump_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("digest_cache");
    TCase *tc = tcase_create("cache");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, cached_digest_is_the_digest_and_follows_the_files);
    tcase_add_test(tc, off_and_small_models_write_nothing);
    tcase_add_test(tc, run_dump_takes_the_cached_digest);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
