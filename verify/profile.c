/* profile.c - tolerance profiles: JSON files under verify/profiles/ (docs/verify.md "Profiles").
 *
 * A profile maps probe keys to gates: {"probes": {"attn_out": {"rel_l2": 1e-4, "why": "..."}, ...}}.
 * Keys: a probe name ("attn_out", every layer), a dataset ("layers/3/attn_out", one layer, wins over the
 * probe name), or "default" (any probe not named). An entry REPLACES the default, it does not merge with it.
 * Inside an entry: metric names (dsv4_verify_metric_name) are gates, in file order (the first is the probe's
 * primary metric), "tie_abs"/"tie_rel" are tie tolerances, "why" is the rationale. Unknown keys are errors:
 * a typo must not silently drop a gate.
 *
 * An optional "after_tie" object, keyed like "probes" (with its own "default"), holds the tolerances for
 * comparisons that come after the first tie-accepted top-k difference (docs/verify.md "After a tie"). Its
 * entries do not define gates: each value loosens the probe's normal gate of that metric (or its tie
 * tolerance), so after a tie no gate disappears and none appears.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "verify_internal.h"

typedef struct dsv4_profile_entry {
    char key[96];
    int n_gates;
    dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES];
    double tie_abs, tie_rel;
    unsigned has_tie; /* bit 0: tie_abs given, bit 1: tie_rel given (after_tie entries overlay only those) */
} dsv4_profile_entry;

struct dsv4_verify_profile {
    char name[64];
    char source[512];
    dsv4_profile_entry *e;
    int n, cap;
    struct dsv4_verify_profile *after; /* the after_tie section (same keys), NULL when the file has none */
};

static dsv4_profile_entry *profile_find(const dsv4_verify_profile *p, const char *key)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->e[i].key, key)) return &p->e[i];
    return NULL;
}

static dsv4_profile_entry *profile_add(dsv4_verify_profile *p, const char *key)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 32;
        dsv4_profile_entry *e = realloc(p->e, (size_t)cap * sizeof *e);
        if (!e) return NULL;
        p->e = e;
        p->cap = cap;
    }
    dsv4_profile_entry *e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    return e;
}

/* Set gate m of entry e to tol; NAN removes it. */
static int entry_set(dsv4_profile_entry *e, dsv4_verify_metric m, double tol)
{
    for (int i = 0; i < e->n_gates; i++)
        if (e->gates[i].metric == m) {
            if (isnan(tol)) {
                memmove(&e->gates[i], &e->gates[i + 1], (size_t)(e->n_gates - i - 1) * sizeof e->gates[0]);
                e->n_gates--;
            } else {
                e->gates[i].tol = tol;
            }
            return 0;
        }
    if (isnan(tol)) return 0;
    if (e->n_gates == DSV4_VERIFY_MAX_GATES)
        return dsv4_error(DSV4_ERR_USAGE, "profile: too many gates for '%s' (at most %d)", e->key,
                          DSV4_VERIFY_MAX_GATES);
    e->gates[e->n_gates].metric = m;
    e->gates[e->n_gates].tol = tol;
    e->n_gates++;
    return 0;
}

/* Apply "metric" = value to e. where: for messages. */
static int entry_apply(dsv4_profile_entry *e, const char *metric, double value, const char *where)
{
    if (!strcmp(metric, "tie_abs")) {
        e->tie_abs = value;
        e->has_tie |= 1u;
    } else if (!strcmp(metric, "tie_rel")) {
        e->tie_rel = value;
        e->has_tie |= 2u;
    } else {
        int m = dsv4_verify_metric_from_name(metric);
        if (m < 0) {
            char known[256];
            size_t len = 0;
            for (int i = 0; i < DSV4_METRIC_COUNT; i++)
                len += (size_t)snprintf(known + len, sizeof known - len, "%s ", dsv4_verify_metric_name(i));
            return dsv4_error(DSV4_ERR_USAGE, "%s: unknown metric '%s' (known: %stie_abs tie_rel)", where, metric,
                              known);
        }
        return entry_set(e, (dsv4_verify_metric)m, value);
    }
    return 0;
}

/* Where the named profiles are looked for, in order. Each candidate is "<dir>/<name>.json". */
static int profile_locate(const char *name, char *path, size_t n)
{
    char dirs[4][PATH_MAX];
    int nd = 0;
    const char *env = getenv("DSV4_PROFILE_DIR");
    if (env && *env) snprintf(dirs[nd++], PATH_MAX, "%s", env);
    /* a build directory inside the source tree: <tree>/<build>/dsv4 -> <tree>/verify/profiles */
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[nd++], PATH_MAX, "%.*s/../verify/profiles", PATH_MAX - 32, exe);
        }
    }
    /* the source tree this file was compiled from (CMake passes absolute source paths) */
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s", __FILE__);
    char *slash = strrchr(src, '/');
    if (slash) {
        *slash = 0;
        snprintf(dirs[nd++], PATH_MAX, "%.*s/profiles", PATH_MAX - 32, src);
    }
    char tried[2048];
    size_t tl = 0;
    tried[0] = 0;
    for (int i = 0; i < nd; i++) {
        snprintf(path, n, "%.400s/%.64s.json", dirs[i], name);
        if (access(path, R_OK) == 0) return 0;
        if (tl < sizeof tried) tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s", i ? ", " : "", path);
    }
    return dsv4_error(DSV4_ERR_IO, "profile '%s' not found (looked for %s; set DSV4_PROFILE_DIR or give a file)", name,
                      tried);
}

/* 1 when key names what an entry may gate: "default", a probe of dump-format.md, or one layer's dataset of it
 * ("layers/3/attn_out", "final/logits"). A misspelt key would otherwise gate nothing: the probe it meant
 * falls back to the default entry, whose metrics may not even apply to it (rel_l2 on topk_idx). */
static int key_known(const char *key)
{
    if (!strcmp(key, "default")) return 1;
    const char *probe = key;
    if (!strncmp(key, "final/", 6)) {
        probe = key + 6;
    } else if (!strncmp(key, "layers/", 7)) {
        const char *d = key + 7;
        while (*d >= '0' && *d <= '9') d++;
        if (d == key + 7 || *d != '/') return 0;
        probe = d + 1;
    }
    return dsv4_verify_probe_known(probe);
}

/* The entries of one section ("probes" or "after_tie") into p. */
static int section_parse(dsv4_verify_profile *p, json_t *section, const char *what, const char *source)
{
    const char *key;
    json_t *val;
    json_object_foreach(section, key, val)
    {
        if (!json_is_object(val)) return dsv4_error(DSV4_ERR_FORMAT, "%s: %s.%s is not an object", source, what, key);
        if (!key_known(key))
            return dsv4_error(DSV4_ERR_FORMAT,
                              "%s: %s.\"%s\" is not a probe of dump-format.md (keys: default, a probe name such as "
                              "topk_idx, or one layer's dataset such as layers/3/attn_out)",
                              source, what, key);
        dsv4_profile_entry *e = profile_find(p, key);
        if (!e && !(e = profile_add(p, key))) return dsv4_error(DSV4_ERR_NOMEM, "profile: out of memory");
        const char *mk;
        json_t *mv;
        json_object_foreach(val, mk, mv)
        {
            if (!strcmp(mk, "why")) continue;
            if (!json_is_number(mv))
                return dsv4_error(DSV4_ERR_FORMAT, "%s: %s.%s.%s is not a number", source, what, key, mk);
            char where[700];
            snprintf(where, sizeof where, "%s: %s.%s", source, what, key);
            if (entry_apply(e, mk, json_number_value(mv), where)) {
                char why[1024]; /* dsv4_error must not format its own buffer */
                snprintf(why, sizeof why, "%s", dsv4_last_error());
                return dsv4_error(DSV4_ERR_FORMAT, "%s", why);
            }
        }
    }
    if (!profile_find(p, "default"))
        return dsv4_error(DSV4_ERR_FORMAT, "%s: %s has no \"default\" entry (needed for probes not named)", source,
                          what);
    return 0;
}

static int profile_parse(dsv4_verify_profile *p, json_t *root)
{
    if (!json_is_object(root)) return dsv4_error(DSV4_ERR_FORMAT, "%s: not a JSON object", p->source);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "profile") && strcmp(key, "description") && strcmp(key, "probes") && strcmp(key, "after_tie"))
            return dsv4_error(DSV4_ERR_FORMAT,
                              "%s: unknown key \"%s\" (known: profile, description, probes, after_tie)", p->source,
                              key);
    }
    json_t *name = json_object_get(root, "profile");
    if (json_is_string(name)) snprintf(p->name, sizeof p->name, "%s", json_string_value(name));
    json_t *probes = json_object_get(root, "probes");
    if (!json_is_object(probes)) return dsv4_error(DSV4_ERR_FORMAT, "%s: missing object \"probes\"", p->source);
    int rc = section_parse(p, probes, "probes", p->source);
    if (rc) return rc;
    json_t *after = json_object_get(root, "after_tie");
    if (!after) return 0;
    if (!json_is_object(after)) return dsv4_error(DSV4_ERR_FORMAT, "%s: after_tie is not an object", p->source);
    if (!(p->after = calloc(1, sizeof *p->after))) return dsv4_error(DSV4_ERR_NOMEM, "profile: out of memory");
    snprintf(p->after->name, sizeof p->after->name, "%.50s after_tie", p->name);
    return section_parse(p->after, after, "after_tie", p->source);
}

int dsv4_verify_profile_load(const char *name_or_path, dsv4_verify_profile **out)
{
    *out = NULL;
    if (!name_or_path || !*name_or_path) name_or_path = "fp32";
    dsv4_verify_profile *p = calloc(1, sizeof *p);
    if (!p) return dsv4_error(DSV4_ERR_NOMEM, "profile: out of memory");
    /* a path (has '/' or ends in .json) is a file; a bare word is a shipped profile, or a file of that name
     * in the working directory when no shipped profile has it */
    size_t len = strlen(name_or_path);
    int is_file = strchr(name_or_path, '/') || (len > 5 && !strcmp(name_or_path + len - 5, ".json"));
    int rc = 0;
    if (is_file) snprintf(p->source, sizeof p->source, "%s", name_or_path);
    else if ((rc = profile_locate(name_or_path, p->source, sizeof p->source)) && access(name_or_path, R_OK) == 0) {
        snprintf(p->source, sizeof p->source, "%s", name_or_path);
        rc = 0;
    }
    if (rc) {
        free(p);
        return rc;
    }
    /* jansson reads a folder as an empty text ("'[' or '{' expected near end of file") and reports a file it
     * cannot open at line -1: say what is wrong with the file itself (a pipe such as <(...) is a fine profile) */
    struct stat st;
    if (!stat(p->source, &st) && S_ISDIR(st.st_mode)) {
        rc = dsv4_error(DSV4_ERR_IO, "%s: is a directory, not a profile file", p->source);
        free(p);
        return rc;
    }
    json_error_t jerr;
    json_t *root = json_load_file(p->source, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = jerr.line < 0 ? dsv4_error(DSV4_ERR_IO, "%s: %s", p->source, jerr.text)
                           : dsv4_error(DSV4_ERR_FORMAT, "%s:%d: %s", p->source, jerr.line, jerr.text);
        free(p);
        return rc;
    }
    const char *base = strrchr(name_or_path, '/');
    snprintf(p->name, sizeof p->name, "%s", base ? base + 1 : name_or_path);
    rc = profile_parse(p, root);
    json_decref(root);
    if (rc) {
        dsv4_verify_profile_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void dsv4_verify_profile_free(dsv4_verify_profile *p)
{
    if (!p) return;
    dsv4_verify_profile_free(p->after);
    free(p->e);
    free(p);
}

const char *dsv4_verify_profile_name(const dsv4_verify_profile *p)
{
    return p->name;
}
const char *dsv4_verify_profile_source(const dsv4_verify_profile *p)
{
    return p->source;
}

/* The entry that applies to (dataset, probe): dataset key, then probe key, then "default". */
static const dsv4_profile_entry *profile_resolve(const dsv4_verify_profile *p, const char *dataset, const char *probe)
{
    const dsv4_profile_entry *e = dataset ? profile_find(p, dataset) : NULL;
    if (!e && probe) e = profile_find(p, probe);
    if (!e) e = profile_find(p, "default");
    return e;
}

int dsv4_verify_profile_lookup(const dsv4_verify_profile *p, const char *dataset, const char *probe,
                               dsv4_verify_gate gates[DSV4_VERIFY_MAX_GATES], int *n_gates, double *tie_abs,
                               double *tie_rel)
{
    const dsv4_profile_entry *e = profile_resolve(p, dataset, probe);
    if (!e) return dsv4_error(DSV4_ERR_MISSING, "profile %s: no entry for %s", p->name, dataset);
    *n_gates = e->n_gates;
    memcpy(gates, e->gates, (size_t)e->n_gates * sizeof gates[0]);
    *tie_abs = e->tie_abs;
    *tie_rel = e->tie_rel;
    return 0;
}

int dsv4_verify_profile_has_after_tie(const dsv4_verify_profile *p)
{
    return p->after != NULL;
}

/* Looser of two tolerances of metric m (min-type metrics: the lower bound is looser). */
static double looser(dsv4_verify_metric m, double a, double b)
{
    return dsv4_verify_metric_is_min(m) ? (a < b ? a : b) : (a > b ? a : b);
}

void dsv4_verify_profile_after_tie(const dsv4_verify_profile *p, const char *dataset, const char *probe,
                                   dsv4_verify_gate *gates, int n_gates, double *tie_abs, double *tie_rel)
{
    const dsv4_profile_entry *e = p->after ? profile_resolve(p->after, dataset, probe) : NULL;
    if (!e) return;
    for (int i = 0; i < n_gates; i++)
        for (int j = 0; j < e->n_gates; j++)
            if (e->gates[j].metric == gates[i].metric)
                gates[i].tol = looser(gates[i].metric, gates[i].tol, e->gates[j].tol);
    if ((e->has_tie & 1u) && e->tie_abs > *tie_abs) *tie_abs = e->tie_abs;
    if ((e->has_tie & 2u) && e->tie_rel > *tie_rel) *tie_rel = e->tie_rel;
}

int dsv4_verify_profile_override(dsv4_verify_profile *p, const char *spec)
{
    const char *eq = strchr(spec, '='), *colon = eq ? strchr(eq, ':') : NULL;
    if (!eq || !colon || eq == spec || colon == eq + 1 || !colon[1])
        return dsv4_error(DSV4_ERR_USAGE, "--tol '%s': expected PROBE=METRIC:VALUE (e.g. attn_out=rel_l2:1e-3)", spec);
    char key[96], metric[32];
    snprintf(key, sizeof key, "%.*s", (int)(eq - spec), spec);
    snprintf(metric, sizeof metric, "%.*s", (int)(colon - eq - 1), eq + 1);
    if (!key_known(key))
        return dsv4_error(DSV4_ERR_USAGE,
                          "--tol '%s': '%s' is not a probe of dump-format.md (a probe name such as topk_idx, one "
                          "layer's dataset such as layers/3/attn_out, or default)",
                          spec, key);
    double value;
    if (!strcmp(colon + 1, "off")) {
        value = NAN;
    } else {
        char *end;
        errno = 0;
        value = strtod(colon + 1, &end);
        if (errno || *end || !isfinite(value))
            return dsv4_error(DSV4_ERR_USAGE, "--tol '%s': '%s' is not a number (or 'off')", spec, colon + 1);
    }
    dsv4_profile_entry *e = profile_find(p, key);
    if (!e) {
        /* start from what applies now, so "layers/3/attn_out=rel_l2:1e-3" keeps attn_out's other gates */
        const char *slash = strrchr(key, '/');
        const dsv4_profile_entry *from = profile_resolve(p, key, slash ? slash + 1 : key);
        dsv4_profile_entry copy = *from;
        if (!(e = profile_add(p, key))) return dsv4_error(DSV4_ERR_NOMEM, "profile: out of memory");
        snprintf(copy.key, sizeof copy.key, "%s", key);
        *e = copy;
    }
    char where[160];
    snprintf(where, sizeof where, "--tol '%s'", spec);
    if (isnan(value) && (!strcmp(metric, "tie_abs") || !strcmp(metric, "tie_rel")))
        return dsv4_error(DSV4_ERR_USAGE, "%s: tie tolerances take a number", where);
    return entry_apply(e, metric, value, where);
}
