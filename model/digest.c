/* digest.c - weights_digest (dump-format.md): lowercase hex SHA-256 of model.safetensors, or for a sharded
 * model of the concatenation of ALL *.safetensors files of the folder in sorted (byte-wise) name order —
 * not only the shards the index names. Read with plain read() in 4 MiB chunks (OpenSSL EVP API); a name that is
 * not a regular file (a FIFO, a directory) is an error, never read. */
#define _POSIX_C_SOURCE 200809L
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
