/* run_inputs.c - two of `dsv4 run`'s inputs, apart from the command's flow (cli/run.c): the --dump-positions list and
 * the --replay candidate. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_ref.h"
#include "run_inputs.h"

/* --dump-positions: a comma list of items, each "all", "decode" (the last prompt position and every decode
 * position), an id or an a-b range; *out ascending, unique. */
int dsv4_cli_parse_positions(const char *spec, int T, int P, int32_t **out, int *n)
{
    char *mark = calloc((size_t)T + 1, 1);
    if (!mark) return dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    const char *s = spec;
    if (!*s) goto bad; /* no item: not a dump of zero positions */
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 3 && !strncmp(s, "all", 3)) {
            memset(mark, 1, (size_t)T);
        } else if (len == 6 && !strncmp(s, "decode", 6)) {
            for (int p = P > 0 ? P - 1 : 0; p < T; p++) mark[p] = 1;
        } else {
            char *end;
            long a = strtol(s, &end, 10), b = a;
            if (end == s) goto bad;
            if (*end == '-') {
                const char *s2 = end + 1;
                b = strtol(s2, &end, 10);
                if (end == s2) goto bad;
            }
            if (end != s + len) goto bad;
            if (a < 0 || b < a || b >= T) {
                free(mark);
                return dsv4_error(DSV4_ERR_USAGE, "--dump-positions: %ld-%ld is not an ascending range in [0, %d)",
                                  a, b, T);
            }
            for (long p = a; p <= b; p++) mark[p] = 1;
        }
        s += len;
        if (*s == ',' && !*++s) goto bad; /* a trailing comma: an empty item */
    }
    int cnt = 0;
    for (int p = 0; p < T; p++) cnt += mark[p];
    *out = malloc(((size_t)cnt + 1) * sizeof **out);
    if (!*out) {
        free(mark);
        return dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    }
    *n = 0;
    for (int p = 0; p < T; p++)
        if (mark[p]) (*out)[(*n)++] = p;
    free(mark);
    return 0;
bad:
    free(mark);
    return dsv4_error(DSV4_ERR_USAGE, "--dump-positions: cannot parse '%s' (want e.g. all, decode, 0,5,8-12)", spec);
}

/* --replay: load the candidate's state (refused, naming what it lacks, when replay cannot run on it) and check that
 * it is a dump of this model's weights (its tokens are the run's: --replay implies --tokens-from). */
int dsv4_cli_replay_open(const char *path, const dsv4_config *cfg, const char *digest, int allow_different_weights,
                       dsv4_ref_replay **out)
{
    int rc = dsv4_ref_replay_load(path, cfg, out);
    if (rc) return rc;
    const char *theirs = dsv4_ref_replay_weights_digest(*out);
    if (!allow_different_weights && strcmp(theirs, digest))
        return dsv4_error(DSV4_ERR_USAGE, "--replay %s: its weights_digest %s is not the model's %s (a candidate of "
                          "other weights; --allow-different-weights replays it anyway)", path, theirs, digest);
    return 0;
}

