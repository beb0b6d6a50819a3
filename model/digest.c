/* digest.c - weights_digest (dump-format.md): lowercase hex SHA-256 of model.safetensors, or for a sharded
 * model of the concatenation of ALL *.safetensors files of the folder in sorted (byte-wise) name order —
 * not only the shards the index names. Read with plain read() in 4 MiB chunks (OpenSSL EVP API); a name that is
 * not a regular file (a FIFO, a directory) is an error, never read.
 *
 * The cache (dsv4_model_weights_digest_cached, docs/reference.md "The weights digest and its cache"): hashing a
 * full checkpoint reads 160 GB (minutes), so the digest of a checkpoint of >= 1 GiB is kept in a small text file
 * keyed by the folder's real path and, for every hashed file, its name, size, modification and status-change times
 * (ns), device and inode, as dump-format.md allows ("A producer may cache it keyed by each file's size and
 * modification time"; ctime is stricter: a rewrite that restores the mtime still changes it).
 * Quiet traps:
 * - The key cannot see a file rewritten in place with the same size, mtime and ctime (a filesystem that does not
 *   keep ctime, a clock set back): the cached digest is then stale. DSV4_DIGEST_CACHE=off bypasses the cache.
 * - The key is built from the same sorted list of files the hash reads, so a shard added or removed changes it.
 * - The cache file is written to a temporary name and renamed; a cache that cannot be read or written is
 *   skipped (the digest is computed as without it), never an error of the run.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/internal.h"

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Only a regular file is hashed: a FIFO named like a shard would block the read for ever (O_NONBLOCK keeps the
 * open itself from blocking), a directory has no bytes to hash. */
typedef struct digest_progress {
    dsv4_progress_fn fn; /* may be NULL */
    void *ctx;
    double done, total; /* bytes */
} digest_progress;

static int hash_file(EVP_MD_CTX *ctx, const char *path, unsigned char *buf, size_t cap, digest_progress *pr)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return dsv4_error(DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dsv4_error(DSV4_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dsv4_error(DSV4_ERR_IO, "%s: not a regular file (weights_digest hashes every *.safetensors file)",
                          path);
    }
    int rc = 0;
    for (;;) {
        ssize_t got = read(fd, buf, cap);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = dsv4_error(DSV4_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (got == 0) break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)got) != 1) {
            rc = dsv4_error(DSV4_ERR_IO, "%s: SHA-256 update failed", path);
            break;
        }
        pr->done += (double)got;
        if (pr->fn) pr->fn(pr->ctx, pr->done < pr->total ? pr->done : pr->total, pr->total);
    }
    close(fd);
    return rc;
}

/* The sorted list of files to hash (malloc'd names, caller frees). */
static int list_files(const char *dir, char ***out, int *n)
{
    *out = NULL;
    *n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        char **l = malloc(sizeof *l);
        if (!l || !(l[0] = strdup("model.safetensors"))) {
            free(l);
            return dsv4_error(DSV4_ERR_NOMEM, "out of memory");
        }
        *out = l;
        *n = 1;
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d) return dsv4_error(DSV4_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    char **l = NULL;
    int cnt = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            char **nl = realloc(l, (size_t)cap * sizeof *nl);
            if (!nl) {
                rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
                break;
            }
            l = nl;
        }
        if (!(l[cnt] = strdup(de->d_name))) {
            rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
            break;
        }
        cnt++;
    }
    closedir(d);
    if (rc) {
        for (int i = 0; i < cnt; i++) free(l[i]);
        free(l);
        return rc;
    }
    qsort(l, (size_t)cnt, sizeof *l, cmp_str);
    *out = l;
    *n = cnt;
    return 0;
}

int dsv4_model_weights_digest(const dsv4_model *m, char out[65])
{
    return dsv4_model_weights_digest_progress(m, out, NULL, NULL);
}

int dsv4_model_weights_digest_progress(const dsv4_model *m, char out[65], dsv4_progress_fn progress, void *pctx)
{
    out[0] = 0;
    char **files;
    int n, rc = list_files(dsv4_model_dir(m), &files, &n);
    if (rc) return rc;
    size_t cap = 4u << 20;
    unsigned char *buf = malloc(cap);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!buf || !ctx) rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    else if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) rc = dsv4_error(DSV4_ERR_IO, "SHA-256 init failed");
    char path[4096];
    digest_progress pr = {.fn = progress, .ctx = pctx};
    for (int i = 0; i < n && !rc; i++) { /* the total first (a file that cannot be stat'ed fails in hash_file) */
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dsv4_model_dir(m), files[i]);
        if (!stat(path, &st) && S_ISREG(st.st_mode)) pr.total += (double)st.st_size;
    }
    for (int i = 0; i < n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dsv4_model_dir(m), files[i]);
        rc = hash_file(ctx, path, buf, cap, &pr);
    }
    if (!rc && progress && pr.done != pr.total) progress(pctx, pr.total, pr.total); /* a file that changed size */
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!rc && EVP_DigestFinal_ex(ctx, md, &mdlen) != 1) rc = dsv4_error(DSV4_ERR_IO, "SHA-256 final failed");
    if (!rc)
        for (unsigned i = 0; i < mdlen && i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    free(buf);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return rc;
}

/* ----------------------------------------------------------------------------------------- the cache */
enum { DIGEST_CACHE_MIN_BYTES = 1 << 30 };

/* The cache folder: $DSV4_DIGEST_CACHE ("off": none), else $XDG_CACHE_HOME/dsv4, else $HOME/.cache/dsv4. 0 when
 * there is none. */
static int cache_dir(char *out, size_t size)
{
    const char *env = getenv("DSV4_DIGEST_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (env && *env) {
        if (!strcmp(env, "off")) return 0;
        n = snprintf(out, size, "%s", env);
    } else if (xdg && *xdg) n = snprintf(out, size, "%s/dsv4", xdg);
    else if (home && *home) n = snprintf(out, size, "%s/.cache/dsv4", home);
    else return 0;
    return n > 0 && (size_t)n < size;
}

/* mkdir -p of an absolute or relative folder; 0 when it exists afterwards. */
static int make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return -1;
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        (void)mkdir(p, 0755);
        *c = '/';
    }
    struct stat st;
    return mkdir(p, 0755) == 0 || (!stat(p, &st) && S_ISDIR(st.st_mode)) ? 0 : -1;
}

/* The key text of the folder's files (malloc'd), their total size in *total; NULL when a file cannot be
 * stat'ed (the hash then reports it). */
static char *cache_key(const char *dir, char **files, int n, double *total)
{
    char real[4096], path[4096];
    if (!realpath(dir, real)) return NULL;
    size_t cap = 256 + strlen(real) + (size_t)n * 4400, len = 0;
    char *key = malloc(cap);
    if (!key) return NULL;
    len += (size_t)snprintf(key + len, cap - len, "dsv4 weights_digest cache 1\nfolder %s\n", real);
    *total = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (stat(path, &st) || !S_ISREG(st.st_mode)) {
            free(key);
            return NULL;
        }
        *total += (double)st.st_size;
        len += (size_t)snprintf(key + len, cap - len,
                                "file %s size %lld mtime %lld.%09ld ctime %lld.%09ld dev %llu ino %llu\n", files[i],
                                (long long)st.st_size, (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec,
                                (long long)st.st_ctim.tv_sec, (long)st.st_ctim.tv_nsec,
                                (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    }
    return key;
}

/* <cache folder>/digest-<16 hex of SHA-256(key's folder line)>.txt: one file per model folder. */
static int cache_path(const char *cdir, const char *key, char *out, size_t size)
{
    const char *folder = strchr(key, '\n') + 1, *end = strchr(folder, '\n');
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(folder, (size_t)(end - folder), md, &mdlen, EVP_sha256(), NULL) != 1) return -1;
    int n = snprintf(out, size, "%s/digest-", cdir);
    for (int i = 0; i < 8 && n > 0 && (size_t)n + 3 < size; i++)
        n += snprintf(out + n, size - (size_t)n, "%02x", md[i]);
    return n > 0 && (size_t)n + 5 < size && snprintf(out + n, size - (size_t)n, ".txt") == 4 ? 0 : -1;
}

/* The digest of the cache file at path when its key is `key`: 1 (out set), else 0. */
static int cache_read(const char *path, const char *key, char out[65])
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t klen = strlen(key);
    char *buf = malloc(klen + 128);
    size_t got = buf ? fread(buf, 1, klen + 127, f) : 0;
    fclose(f);
    int hit = 0;
    if (buf && got == klen + 72 && !memcmp(buf, key, klen) && !memcmp(buf + klen, "sha256 ", 7) &&
        buf[klen + 71] == '\n') {
        hit = 1;
        for (int i = 0; i < 64; i++) {
            char c = buf[klen + 7 + i];
            hit &= (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        }
        if (hit) {
            memcpy(out, buf + klen + 7, 64);
            out[64] = 0;
        }
    }
    free(buf);
    return hit;
}

/* Store key + digest at path (a temporary name renamed into place); failures are left silent. */
static void cache_write(const char *cdir, const char *path, const char *key, const char *digest)
{
    if (make_dirs(cdir)) return;
    char tmp[4500];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int id = dsv4_tempfile_register(tmp);
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "%ssha256 %s\n", key, digest) > 0;
    if (f) ok = !fclose(f) && ok;
    if (!ok || rename(tmp, path)) unlink(tmp);
    dsv4_tempfile_unregister(id);
}

int dsv4_model_weights_digest_cached(const dsv4_model *m, char out[65], dsv4_progress_fn progress, void *pctx,
                                     int *cached)
{
    if (cached) *cached = 0;
    out[0] = 0;
    char cdir[4096], path[4400];
    char **files = NULL;
    int n = 0;
    char *key = NULL;
    double total = 0;
    if (cache_dir(cdir, sizeof cdir) && !list_files(dsv4_model_dir(m), &files, &n))
        key = cache_key(dsv4_model_dir(m), files, n, &total);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    int use = key && total >= DIGEST_CACHE_MIN_BYTES && !cache_path(cdir, key, path, sizeof path);
    if (use && cache_read(path, key, out)) {
        if (cached) *cached = 1;
        free(key);
        return 0;
    }
    int rc = dsv4_model_weights_digest_progress(m, out, progress, pctx);
    if (!rc && use) cache_write(cdir, path, key, out);
    free(key);
    return rc;
}
