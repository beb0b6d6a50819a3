/* test_golden.c - the committed golden sets (golden/README.md) are what the verifier may trust.
 *
 * Opens every committed golden dump with the dump/ reader and every golden model folder with the model/
 * loader, and checks, against the embedded config:
 *   schema and root attributes (producer, digest, versions, seed, command), /tokens and /positions;
 *   the layer groups' `attention`/`mlp` attributes; every probe of dump-format.md present with its shape and
 *   dtype, and nothing else; all floats finite (indexer_scores: finite exactly on the visible entries,
 *   -inf beyond);
 *   topk_idx rows: distinct ids in [0, (p+1) div 4), exactly min(index_topk, visible) of them, -1 only as
 *   trailing padding (transformers' topk is sorted and its invalid picks score -inf), and they are the top
 *   golden scores (no unpicked visible entry scores higher than a pick);
 *   router rows: k distinct experts, weights > 0 summing to routed_scaling_factor; hash layers route by the
 *   model's tid2eid; mHC: pre in (0, 1+eps], post in (0, 2), comb >= 0 with column sums 1 (Sinkhorn ends on
 *   a column step) and row sums near 1;
 *   what each set is for: tiny has every attention and MoE type, windows and compressed entries closing
 *   during decode and index_topk < visible entries; greedy tokens are the argmax of the previous logits;
 *   topk512 has decode positions with well over 512 visible entries; tiny-fp8 is in official naming with
 *   FP8 e4m3 block-scaled linears and FP4 experts that dequantise to the tiny weights;
 *   model folders: open, no problems against the config, config.json and weights digest equal the dumps'.
 */
#define _POSIX_C_SOURCE 200809L
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4_dump.h"
#include "dsv4_test.h"

typedef struct golden_file {
    const char *set, *file, *mode;
    int all_positions; /* 1: every position stored; 0: the last prefill position and the decode positions */
} golden_file;

static const golden_file golden_files[] = {
    {"tiny", "forced.h5", "forced", 1},
    {"tiny", "greedy.h5", "greedy", 1},
    {"tiny-fp8", "forced.h5", "forced", 1},
    {"topk512", "forced.h5", "forced", 0},
};
#define N_FILES ((int)(sizeof golden_files / sizeof golden_files[0]))
static const char *const golden_sets[] = {"tiny", "tiny-fp8", "topk512"};
#define N_SETS ((int)(sizeof golden_sets / sizeof golden_sets[0]))

/* ------------------------------------------------------------------------------------------------ helpers */
static char *golden_path(const char *set, const char *file)
{
    char rel[512];
    snprintf(rel, sizeof rel, "golden/%s%s%s", set, file ? "/" : "", file ? file : "");
    return strdup(dsv4_test_source_path(rel));
}

static dsv4_dump *open_dump(const golden_file *g)
{
    char *path = golden_path(g->set, g->file);
    dsv4_dump *d = NULL;
    int rc = dsv4_dump_open(path, &d);
    ck_assert_msg(rc == 0, "%s: %s", path, dsv4_last_error());
    free(path);
    return d;
}

static const dsv4_config *dump_cfg(const dsv4_dump *d)
{
    const dsv4_config *cfg = NULL;
    ck_assert_msg(dsv4_dump_config(d, &cfg) == 0, "%s: config_json: %s", dsv4_dump_path(d), dsv4_last_error());
    return cfg;
}

/* A whole dataset, f32 or i32 as stored (checked), with its info. */
static void *read_all(const dsv4_dump *d, const char *name, dsv4_dtype want, dsv4_dataset_info *info)
{
    ck_assert_msg(dsv4_dump_info(d, name, info) == 0, "%s: %s: %s", dsv4_dump_path(d), name, dsv4_last_error());
    ck_assert_msg(info->dtype == want, "%s: %s is %s, expected %s", dsv4_dump_path(d), name,
                  dsv4_dtype_name(info->dtype), dsv4_dtype_name(want));
    size_t n = 1;
    for (int i = 0; i < info->ndim; i++) n *= (size_t)info->shape[i];
    void *buf = malloc(n * 4 + 4);
    ck_assert(buf != NULL);
    ck_assert_msg(dsv4_dump_read_rows(d, name, 0, info->shape[0], buf) == 0, "%s: %s: %s", dsv4_dump_path(d),
                  name, dsv4_last_error());
    return buf;
}

/* String attribute of an HDF5 object (the reader API exposes root attributes only), fixed or variable. */
static char *h5_string_attr(const char *file, const char *obj, const char *name)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "H5Fopen %s", file);
    char *out = NULL;
    if (H5Aexists_by_name(f, obj, name, H5P_DEFAULT) > 0) {
        hid_t a = H5Aopen_by_name(f, obj, name, H5P_DEFAULT, H5P_DEFAULT);
        hid_t ft = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
        ck_assert_msg(H5Tget_class(ft) == H5T_STRING, "%s %s@%s is not a string", file, obj, name);
        if (H5Tis_variable_str(ft) > 0) {
            char *v = NULL;
            H5Tset_size(mt, H5T_VARIABLE);
            H5Tset_cset(mt, H5Tget_cset(ft));
            ck_assert(H5Aread(a, mt, &v) >= 0);
            out = strdup(v ? v : "");
            hid_t sp = H5Aget_space(a);
            H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, &v);
            H5Sclose(sp);
        } else {
            size_t n = H5Tget_size(ft);
            out = calloc(n + 1, 1);
            H5Tset_size(mt, n + 1);
            ck_assert(H5Aread(a, mt, out) >= 0);
        }
        H5Tclose(mt);
        H5Tclose(ft);
        H5Aclose(a);
    }
    H5Fclose(f);
    return out;
}

static int visible(int p, int ratio) { return (p + 1) / ratio; }

/* ------------------------------------------------------------------------------------------------ schema */
START_TEST(test_root_attributes)
{
    const golden_file *g = &golden_files[_i];
    dsv4_dump *d = open_dump(g);
    const char *path = dsv4_dump_path(d);
    const dsv4_config *cfg = dump_cfg(d);
    ck_assert_str_eq(dsv4_dump_attr(d, "schema"), DSV4_DUMP_SCHEMA);
    const char *producer = dsv4_dump_attr(d, "producer");
    ck_assert_msg(producer && !strncmp(producer, "transformers ", 13) && strstr(producer, " fp32 cpu"),
                  "%s: producer %s", path, producer ? producer : "(none)");
    ck_assert_str_eq(dsv4_dump_attr(d, "mode"), g->mode);
    const char *digest = dsv4_dump_attr(d, "weights_digest");
    ck_assert_msg(digest && strlen(digest) == 64 && strspn(digest, "0123456789abcdef") == 64,
                  "%s: weights_digest %s", path, digest ? digest : "(none)");
    static const char *const extras[] = {"transformers_version", "torch_version", "seed", "command"};
    for (int i = 0; i < 4; i++) {
        const char *v = dsv4_dump_attr(d, extras[i]);
        ck_assert_msg(v && *v, "%s: root attribute %s missing", path, extras[i]);
    }
    ck_assert_msg(strstr(producer, dsv4_dump_attr(d, "transformers_version")) != NULL,
                  "%s: producer %s does not name transformers %s", path, producer,
                  dsv4_dump_attr(d, "transformers_version"));
    ck_assert_msg(strstr(dsv4_dump_attr(d, "command"), "make_golden.py") != NULL, "%s: command", path);

    /* config_json is the set's config.json verbatim */
    char *cfg_path = golden_path(g->set, "config.json");
    char *text = dsv4_test_read_file(cfg_path, NULL);
    ck_assert_msg(!strcmp(text, dsv4_dump_attr(d, "config_json")), "%s: config_json is not %s verbatim", path,
                  cfg_path);
    free(text);
    free(cfg_path);

    int P = dsv4_dump_prompt_len(d), n = dsv4_dump_n_decode(d), T, R;
    ck_assert_msg(P > 0 && n > 0, "%s: prompt_len %d, n_decode %d", path, P, n);
    if (!strcmp(g->mode, "greedy")) ck_assert_int_eq(n, 32);
    const int32_t *tok = dsv4_dump_tokens(d, &T), *pos = dsv4_dump_positions(d, &R);
    ck_assert_int_eq(T, P + n);
    for (int t = 0; t < T; t++)
        ck_assert_msg(tok[t] >= 0 && tok[t] < cfg->vocab_size, "%s: token %d = %d", path, t, tok[t]);
    if (g->all_positions) {
        ck_assert_int_eq(R, T);
        for (int i = 0; i < R; i++) ck_assert_int_eq(pos[i], i);
    } else {
        ck_assert_int_eq(R, n + 1);
        ck_assert_int_eq(pos[0], P - 1);
        for (int i = 1; i < R; i++) ck_assert_int_eq(pos[i], P + i - 1);
    }

    /* layer groups: attention / mlp attributes as the config says (read with HDF5 itself, which cannot
     * open a file the reader holds open) */
    char *h5 = strdup(path);
    dsv4_config cv = *cfg;
    cfg = &cv;
    dsv4_dump_free(d);
    path = h5;
    for (int L = 0; L < cfg->num_hidden_layers; L++) {
        char obj[32];
        snprintf(obj, sizeof obj, "layers/%d", L);
        char *att = h5_string_attr(path, obj, "attention"), *mlp = h5_string_attr(path, obj, "mlp");
        ck_assert_msg(att && !strcmp(att, dsv4_attn_type_name(cfg->attn_type[L])), "%s: %s attention %s, "
                      "config says %s", path, obj, att ? att : "(none)", dsv4_attn_type_name(cfg->attn_type[L]));
        ck_assert_msg(mlp && !strcmp(mlp, dsv4_mlp_type_name(cfg->mlp_type[L])), "%s: %s mlp %s, config says %s",
                      path, obj, mlp ? mlp : "(none)", dsv4_mlp_type_name(cfg->mlp_type[L]));
        free(att);
        free(mlp);
    }
    free(h5);
}
END_TEST

/* Every probe of dump-format.md with its shape from the config, and no other dataset. */
typedef struct want_ds {
    char name[64];
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[3];
} want_ds;

static int want_probes(const dsv4_config *c, int R, int T, int last, want_ds *w)
{
    int n = 0;
#define WANT(dt, nd, s0, s1, s2, ...)                                                                         \
    do {                                                                                                       \
        snprintf(w[n].name, sizeof w[n].name, __VA_ARGS__);                                                    \
        w[n].dtype = dt;                                                                                       \
        w[n].ndim = nd;                                                                                        \
        w[n].shape[0] = s0;                                                                                    \
        w[n].shape[1] = s1;                                                                                    \
        w[n].shape[2] = s2;                                                                                    \
        n++;                                                                                                   \
    } while (0)
    const int64_t D = c->hidden_size, hc = c->hc_mult, k = c->num_experts_per_tok;
    for (int L = 0; L < c->num_hidden_layers; L++) {
        static const char *const ab[] = {"attn", "ffn"};
        for (int j = 0; j < 2; j++) {
            WANT(DSV4_DTYPE_F32, 2, R, hc, 0, "layers/%d/%s_hc_pre", L, ab[j]);
            WANT(DSV4_DTYPE_F32, 2, R, hc, 0, "layers/%d/%s_hc_post", L, ab[j]);
            WANT(DSV4_DTYPE_F32, 3, R, hc, hc, "layers/%d/%s_hc_comb", L, ab[j]);
            WANT(DSV4_DTYPE_F32, 2, R, D, 0, "layers/%d/%s_in", L, ab[j]);
        }
        WANT(DSV4_DTYPE_F32, 2, R, c->head_dim, 0, "layers/%d/kv", L);
        WANT(DSV4_DTYPE_F32, 2, R, D, 0, "layers/%d/attn_out", L);
        WANT(DSV4_DTYPE_I32, 2, R, k, 0, "layers/%d/router_ids", L);
        WANT(DSV4_DTYPE_F32, 2, R, k, 0, "layers/%d/router_weights", L);
        WANT(DSV4_DTYPE_F32, 2, R, D, 0, "layers/%d/ffn_out", L);
        WANT(DSV4_DTYPE_F32, 3, R, hc, D, "layers/%d/out", L);
        int r = c->compress_ratio[L];
        if (c->attn_type[L] != DSV4_ATTN_SLIDING)
            WANT(DSV4_DTYPE_F32, 2, T / r, c->head_dim, 0, "layers/%d/compressed_kv", L);
        if (c->attn_type[L] == DSV4_ATTN_CSA) {
            WANT(DSV4_DTYPE_F32, 2, T / r, c->index_head_dim, 0, "layers/%d/indexer_kv", L);
            WANT(DSV4_DTYPE_F32, 2, R, visible(last, r), 0, "layers/%d/indexer_scores", L);
            WANT(DSV4_DTYPE_I32, 2, R, c->index_topk, 0, "layers/%d/topk_idx", L);
        }
    }
    WANT(DSV4_DTYPE_F32, 2, R, D, 0, "final/hc_head");
    WANT(DSV4_DTYPE_F32, 2, R, D, 0, "final/norm");
    WANT(DSV4_DTYPE_F32, 2, R, c->vocab_size, 0, "final/logits");
#undef WANT
    return n;
}

START_TEST(test_probe_shapes)
{
    const golden_file *g = &golden_files[_i];
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    int T, R;
    dsv4_dump_tokens(d, &T);
    const int32_t *pos = dsv4_dump_positions(d, &R);
    ck_assert_int_eq(pos[R - 1], T - 1);
    want_ds *w = calloc((size_t)c->num_hidden_layers * 24 + 3, sizeof *w);
    ck_assert(w != NULL);
    int n = want_probes(c, R, T, pos[R - 1], w);
    for (int i = 0; i < n; i++) {
        dsv4_dataset_info info;
        ck_assert_msg(dsv4_dump_has(d, w[i].name), "%s: no dataset %s", dsv4_dump_path(d), w[i].name);
        ck_assert_msg(dsv4_dump_info(d, w[i].name, &info) == 0, "%s: %s: %s", dsv4_dump_path(d), w[i].name,
                      dsv4_last_error());
        ck_assert_msg(info.dtype == w[i].dtype, "%s: %s is %s", dsv4_dump_path(d), w[i].name,
                      dsv4_dtype_name(info.dtype));
        ck_assert_msg(info.ndim == w[i].ndim, "%s: %s has %d dims, expected %d", dsv4_dump_path(d), w[i].name,
                      info.ndim, w[i].ndim);
        for (int j = 0; j < info.ndim; j++)
            ck_assert_msg(info.shape[j] == w[i].shape[j], "%s: %s dim %d is %lld, expected %lld",
                          dsv4_dump_path(d), w[i].name, j, (long long)info.shape[j], (long long)w[i].shape[j]);
    }
    ck_assert_msg(dsv4_dump_dataset_count(d) == n, "%s: %d probe datasets, dump-format.md gives %d",
                  dsv4_dump_path(d), dsv4_dump_dataset_count(d), n);
    free(w);
    dsv4_dump_free(d);
}
END_TEST

/* Every float probe is finite; indexer_scores finite exactly where the entry is visible. */
START_TEST(test_values_finite)
{
    const golden_file *g = &golden_files[_i];
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    int R;
    const int32_t *pos = dsv4_dump_positions(d, &R);
    int nd = dsv4_dump_dataset_count(d);
    ck_assert_int_gt(nd, 0);
    for (int i = 0; i < nd; i++) {
        const char *name = dsv4_dump_dataset_name(d, i);
        dsv4_dataset_info info;
        ck_assert(dsv4_dump_info(d, name, &info) == 0);
        if (info.dtype != DSV4_DTYPE_F32) continue;
        float *v = read_all(d, name, DSV4_DTYPE_F32, &info);
        size_t row = 1;
        for (int j = 1; j < info.ndim; j++) row *= (size_t)info.shape[j];
        int scores = strstr(name, "/indexer_scores") != NULL;
        int L = -1;
        if (scores) sscanf(name, "layers/%d/", &L);
        for (int64_t r = 0; r < info.shape[0]; r++)
            for (size_t j = 0; j < row; j++) {
                float x = v[(size_t)r * row + j];
                if (scores && (int)j >= visible(pos[r], c->compress_ratio[L]))
                    ck_assert_msg(isinf(x) && x < 0, "%s: %s[%lld][%zu] = %g, not visible (-inf expected)",
                                  dsv4_dump_path(d), name, (long long)r, j, x);
                else
                    ck_assert_msg(isfinite(x), "%s: %s[%lld][%zu] = %g", dsv4_dump_path(d), name, (long long)r,
                                  j, x);
            }
        free(v);
    }
    dsv4_dump_free(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ selections */
START_TEST(test_topk_rows)
{
    const golden_file *g = &golden_files[_i];
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    int R;
    const int32_t *pos = dsv4_dump_positions(d, &R);
    const int K = c->index_topk;
    int csa = 0;
    for (int L = 0; L < c->num_hidden_layers; L++) {
        if (c->attn_type[L] != DSV4_ATTN_CSA) continue;
        csa++;
        char nt[64], ns[64];
        snprintf(nt, sizeof nt, "layers/%d/topk_idx", L);
        snprintf(ns, sizeof ns, "layers/%d/indexer_scores", L);
        dsv4_dataset_info it, is;
        int32_t *idx = read_all(d, nt, DSV4_DTYPE_I32, &it);
        float *sc = read_all(d, ns, DSV4_DTYPE_F32, &is);
        const int N = (int)is.shape[1];
        ck_assert_int_eq((int)it.shape[1], K);
        char *picked = malloc((size_t)N + 1);
        for (int r = 0; r < R; r++) {
            const int p = pos[r], vis = visible(p, c->compress_ratio[L]);
            const int32_t *row = idx + (size_t)r * K;
            const float *srow = sc + (size_t)r * N;
            ck_assert_int_le(vis, N);
            memset(picked, 0, (size_t)N + 1);
            int nvalid = 0, pad = 0;
            float min_pick = INFINITY;
            for (int j = 0; j < K; j++) {
                int w = row[j];
                if (w == -1) {
                    pad = 1;
                    continue;
                }
                ck_assert_msg(!pad, "%s: %s pos %d: id %d after -1 padding (slot %d)", dsv4_dump_path(d), nt, p,
                              w, j);
                ck_assert_msg(w >= 0 && w < vis, "%s: %s pos %d: id %d outside [0, %d)", dsv4_dump_path(d), nt, p,
                              w, vis);
                ck_assert_msg(!picked[w], "%s: %s pos %d: id %d picked twice", dsv4_dump_path(d), nt, p, w);
                picked[w] = 1;
                nvalid++;
                if (srow[w] < min_pick) min_pick = srow[w];
            }
            int want = vis < K ? vis : K;
            ck_assert_msg(nvalid == want, "%s: %s pos %d: %d picks, expected min(%d, %d)", dsv4_dump_path(d), nt,
                          p, nvalid, K, vis);
            for (int w = 0; w < vis; w++)
                ck_assert_msg(picked[w] || srow[w] <= min_pick, "%s: %s pos %d: entry %d (score %g) unpicked "
                              "but above the lowest pick (%g)", dsv4_dump_path(d), nt, p, w, srow[w], min_pick);
        }
        free(picked);
        free(idx);
        free(sc);
    }
    ck_assert_msg(csa > 0, "%s: no CSA layer", dsv4_dump_path(d));
    dsv4_dump_free(d);
}
END_TEST

START_TEST(test_router_and_mhc_rows)
{
    const golden_file *g = &golden_files[_i];
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    const int k = c->num_experts_per_tok, hc = c->hc_mult;
    for (int L = 0; L < c->num_hidden_layers; L++) {
        char name[64];
        dsv4_dataset_info ii, iw;
        snprintf(name, sizeof name, "layers/%d/router_ids", L);
        int32_t *ids = read_all(d, name, DSV4_DTYPE_I32, &ii);
        snprintf(name, sizeof name, "layers/%d/router_weights", L);
        float *w = read_all(d, name, DSV4_DTYPE_F32, &iw);
        for (int64_t r = 0; r < ii.shape[0]; r++) {
            double sum = 0;
            for (int j = 0; j < k; j++) {
                int e = ids[r * k + j];
                ck_assert_msg(e >= 0 && e < c->n_routed_experts, "%s: layer %d row %lld expert %d",
                              dsv4_dump_path(d), L, (long long)r, e);
                for (int j2 = 0; j2 < j; j2++)
                    ck_assert_msg(ids[r * k + j2] != e, "%s: layer %d row %lld expert %d twice", dsv4_dump_path(d),
                                  L, (long long)r, e);
                ck_assert_msg(w[r * k + j] > 0, "%s: layer %d row %lld weight %g", dsv4_dump_path(d), L,
                              (long long)r, w[r * k + j]);
                sum += w[r * k + j];
            }
            ck_assert_msg(fabs(sum - c->routed_scaling_factor) < 1e-5, "%s: layer %d row %lld weights sum to %.8g, "
                          "not %g", dsv4_dump_path(d), L, (long long)r, sum, c->routed_scaling_factor);
        }
        free(ids);
        free(w);
        static const char *const ab[] = {"attn", "ffn"};
        for (int a = 0; a < 2; a++) {
            dsv4_dataset_info ip, iq, ic;
            snprintf(name, sizeof name, "layers/%d/%s_hc_pre", L, ab[a]);
            float *pre = read_all(d, name, DSV4_DTYPE_F32, &ip);
            snprintf(name, sizeof name, "layers/%d/%s_hc_post", L, ab[a]);
            float *post = read_all(d, name, DSV4_DTYPE_F32, &iq);
            snprintf(name, sizeof name, "layers/%d/%s_hc_comb", L, ab[a]);
            float *comb = read_all(d, name, DSV4_DTYPE_F32, &ic);
            for (int64_t r = 0; r < ip.shape[0]; r++) {
                for (int j = 0; j < hc; j++) {
                    float x = pre[r * hc + j], y = post[r * hc + j];
                    ck_assert_msg(x > 0 && x <= 1 + c->hc_eps * 2, "%s: layer %d %s pre %g", dsv4_dump_path(d), L,
                                  ab[a], x);
                    ck_assert_msg(y > 0 && y < 2, "%s: layer %d %s post %g", dsv4_dump_path(d), L, ab[a], y);
                }
                const float *m = comb + r * hc * hc;
                for (int j = 0; j < hc; j++) {
                    double rs = 0, cs = 0;
                    for (int q = 0; q < hc; q++) {
                        ck_assert(m[j * hc + q] >= 0);
                        rs += m[j * hc + q];
                        cs += m[q * hc + j];
                    }
                    ck_assert_msg(fabs(cs - 1) < 1e-4, "%s: layer %d %s comb column %d sums to %.7g",
                                  dsv4_dump_path(d), L, ab[a], j, cs);
                    ck_assert_msg(fabs(rs - 1) < 0.05, "%s: layer %d %s comb row %d sums to %.7g",
                                  dsv4_dump_path(d), L, ab[a], j, rs);
                }
            }
            free(pre);
            free(post);
            free(comb);
        }
    }
    dsv4_dump_free(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ purposes */
START_TEST(test_tiny_coverage)
{
    const golden_file *g = &golden_files[0]; /* tiny forced */
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    int T, P = dsv4_dump_prompt_len(d);
    dsv4_dump_tokens(d, &T);
    int attn[3] = {0}, mlp[2] = {0};
    for (int L = 0; L < c->num_hidden_layers; L++) {
        attn[c->attn_type[L]]++;
        mlp[c->mlp_type[L]]++;
    }
    ck_assert_msg(attn[DSV4_ATTN_SLIDING] && attn[DSV4_ATTN_CSA] && attn[DSV4_ATTN_HCA],
                  "tiny lacks an attention type (%d sliding, %d csa, %d hca)", attn[0], attn[1], attn[2]);
    ck_assert_msg(mlp[DSV4_MLP_HASH_MOE] && mlp[DSV4_MLP_MOE], "tiny lacks an MoE type");
    ck_assert_int_eq(c->compress_rate_csa, 4);
    ck_assert_msg(c->compress_rate_hca > 4 && c->compress_rate_hca < 128, "tiny HCA ratio %d", c->compress_rate_hca);
    /* in decode: the window slides, entries of every ratio close, and the ranking matters */
    ck_assert_msg(T - 1 >= P + c->sliding_window, "tiny: the window never slides fully during decode");
    for (int L = 0; L < c->num_hidden_layers; L++) {
        int r = c->compress_ratio[L], closes = 0;
        if (!r) continue;
        for (int p = P; p < T; p++) closes += (p + 1) % r == 0;
        ck_assert_msg(closes >= 2, "tiny layer %d (ratio %d): %d entries close during decode", L, r, closes);
    }
    ck_assert_msg(visible(P, 4) > c->index_topk, "tiny: index_topk %d not below the %d entries seen in decode",
                  c->index_topk, visible(P, 4));
    ck_assert_msg(P % 4 != 0 && P % c->compress_rate_hca != 0, "tiny: the prompt ends on a window boundary");
    dsv4_dump_free(d);
}
END_TEST

START_TEST(test_greedy_tokens)
{
    const golden_file *g = &golden_files[1];
    ck_assert_str_eq(g->mode, "greedy");
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    int T, R, P = dsv4_dump_prompt_len(d);
    const int32_t *tok = dsv4_dump_tokens(d, &T);
    dsv4_dump_positions(d, &R);
    dsv4_dataset_info info;
    float *lg = read_all(d, "final/logits", DSV4_DTYPE_F32, &info);
    const int V = c->vocab_size;
    for (int p = P; p < T; p++) {
        const float *row = lg + (size_t)(p - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        ck_assert_msg(tok[p] == best, "greedy: token %d at position %d, argmax of the logits at %d is %d", tok[p], p,
                      p - 1, best);
    }
    free(lg);
    dsv4_dump_free(d);
}
END_TEST

START_TEST(test_topk512_context)
{
    const golden_file *g = &golden_files[3];
    ck_assert_str_eq(g->set, "topk512");
    dsv4_dump *d = open_dump(g);
    const dsv4_config *c = dump_cfg(d);
    ck_assert_int_eq(c->index_topk, 512);
    ck_assert_int_eq(c->compress_rate_csa, 4);
    int R, P = dsv4_dump_prompt_len(d), over = 0, min_vis = 1 << 30;
    const int32_t *pos = dsv4_dump_positions(d, &R);
    for (int r = 0; r < R; r++) {
        if (pos[r] < P) continue;
        int vis = visible(pos[r], 4);
        over += vis > 512;
        if (vis < min_vis) min_vis = vis;
    }
    ck_assert_msg(over >= 8, "topk512: %d decode positions with more than 512 visible entries", over);
    ck_assert_msg(min_vis >= 512 + 32, "topk512: a decode position sees only %d entries", min_vis);
    /* and the selection is a real ranking there: full 512 picks, with visible entries left out */
    for (int L = 0; L < c->num_hidden_layers; L++) {
        if (c->attn_type[L] != DSV4_ATTN_CSA) continue;
        char name[64];
        snprintf(name, sizeof name, "layers/%d/topk_idx", L);
        dsv4_dataset_info info;
        int32_t *idx = read_all(d, name, DSV4_DTYPE_I32, &info);
        for (int r = 0; r < R; r++) {
            if (pos[r] < P) continue;
            int n = 0;
            for (int j = 0; j < 512; j++) n += idx[(size_t)r * 512 + j] >= 0;
            ck_assert_msg(n == 512, "topk512 layer %d pos %d: %d picks", L, pos[r], n);
        }
        free(idx);
    }
    dsv4_dump_free(d);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ models */
static void report_line(void *ctx, const char *line)
{
    fprintf(stderr, "%s: %s\n", (const char *)ctx, line);
}

START_TEST(test_model_folders)
{
    const char *set = golden_sets[_i];
    char *dir = golden_path(set, NULL);
    dsv4_model *m = NULL;
    ck_assert_msg(dsv4_model_open(dir, &m) == 0, "%s: %s", dir, dsv4_last_error());
    int problems = dsv4_model_check(m, report_line, (void *)set);
    ck_assert_msg(problems == 0, "%s: %d problems against its config (listed above): %s", dir, problems,
                  problems < 0 ? dsv4_last_error() : "");
    char digest[65];
    ck_assert_msg(dsv4_model_weights_digest(m, digest) == 0, "%s: %s", dir, dsv4_last_error());
    const dsv4_config *mc = dsv4_model_config(m);
    for (int f = 0; f < N_FILES; f++) {
        if (strcmp(golden_files[f].set, set)) continue;
        dsv4_dump *d = open_dump(&golden_files[f]);
        const dsv4_config *dc = dump_cfg(d);
        ck_assert_msg(!strcmp(digest, dsv4_dump_attr(d, "weights_digest")), "%s: weights digest %s, the dump "
                      "says %s", dir, digest, dsv4_dump_attr(d, "weights_digest"));
        ck_assert_msg(!strcmp(dsv4_model_config_json(m), dsv4_dump_attr(d, "config_json")),
                      "%s: config.json differs from the dump's config_json", dir);
        ck_assert_int_eq(mc->num_hidden_layers, dc->num_hidden_layers);
        ck_assert_int_eq(mc->hidden_size, dc->hidden_size);
        ck_assert_int_eq(mc->index_topk, dc->index_topk);
        for (int L = 0; L < mc->num_hidden_layers; L++) {
            ck_assert_int_eq(mc->attn_type[L], dc->attn_type[L]);
            ck_assert_int_eq(mc->compress_ratio[L], dc->compress_ratio[L]);
        }
        /* hash layers route every stored position by the model's tid2eid */
        int T, R;
        const int32_t *tok = dsv4_dump_tokens(d, &T), *pos = dsv4_dump_positions(d, &R);
        const int k = mc->num_experts_per_tok, V = mc->vocab_size;
        int32_t *t2e = malloc((size_t)V * k * sizeof *t2e);
        for (int L = 0; L < mc->num_hidden_layers; L++) {
            if (mc->mlp_type[L] != DSV4_MLP_HASH_MOE) continue;
            char name[64];
            snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", L);
            ck_assert_msg(dsv4_model_read_i32(m, name, t2e, (size_t)V * k) == 0, "%s: %s", dir, dsv4_last_error());
            snprintf(name, sizeof name, "layers/%d/router_ids", L);
            dsv4_dataset_info info;
            int32_t *ids = read_all(d, name, DSV4_DTYPE_I32, &info);
            for (int r = 0; r < R; r++)
                for (int j = 0; j < k; j++) {
                    int e = ids[(size_t)r * k + j], hit = 0;
                    for (int q = 0; q < k; q++) hit |= t2e[(size_t)tok[pos[r]] * k + q] == e;
                    ck_assert_msg(hit, "%s layer %d pos %d: expert %d is not in tid2eid[%d]", dsv4_dump_path(d), L,
                                  pos[r], e, tok[pos[r]]);
                }
            free(ids);
        }
        free(t2e);
        dsv4_dump_free(d);
    }
    dsv4_model_free(m);
    free(dir);
}
END_TEST

/* tiny-fp8: official names on disk, FP8 block / FP4 expert formats, dequantising to the tiny weights. */
START_TEST(test_fp8_set)
{
    char *d8 = golden_path("tiny-fp8", NULL), *d32 = golden_path("tiny", NULL);
    dsv4_model *q = NULL, *m = NULL;
    ck_assert_msg(dsv4_model_open(d8, &q) == 0, "%s: %s", d8, dsv4_last_error());
    ck_assert_msg(dsv4_model_open(d32, &m) == 0, "%s: %s", d32, dsv4_last_error());
    const dsv4_config *c = dsv4_model_config(q);
    ck_assert_msg(c->fp8_block_quant, "tiny-fp8: config.json has no fp8 quantization_config");
    ck_assert_str_eq(c->expert_dtype, "fp4");
    int nt = dsv4_model_tensor_count(q), renamed = 0;
    for (int i = 0; i < nt; i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(q, i);
        ck_assert_msg(!strcmp(t->name, t->disk_name), "tiny-fp8: %s is stored as %s, not in official naming",
                      t->name, t->disk_name);
    }
    for (int i = 0; i < dsv4_model_tensor_count(m); i++)
        renamed += strcmp(dsv4_model_tensor_at(m, i)->name, dsv4_model_tensor_at(m, i)->disk_name) != 0;
    ck_assert_msg(renamed > 0, "tiny: every tensor already in official naming (expected save_pretrained's)");

    /* formats: [name, dtype, disk shape, scale shape] */
    const int64_t D = c->hidden_size, qr = c->q_lora_rank, Hd = (int64_t)c->num_attention_heads * c->head_dim;
    const int64_t I = c->moe_intermediate_size;
    struct {
        const char *name;
        dsv4_dtype dt;
        int64_t s0, s1, c0, c1;
    } fmt[] = {
        {"layers.0.attn.wq_a.weight", DSV4_DTYPE_F8_E4M3, qr, D, (qr + 127) / 128, (D + 127) / 128},
        {"layers.1.attn.wq_b.weight", DSV4_DTYPE_F8_E4M3, Hd, qr, (Hd + 127) / 128, (qr + 127) / 128},
        {"layers.1.attn.indexer.wq_b.weight", DSV4_DTYPE_F8_E4M3, (int64_t)c->index_n_heads * c->index_head_dim, qr,
         ((int64_t)c->index_n_heads * c->index_head_dim + 127) / 128, (qr + 127) / 128},
        {"layers.2.ffn.shared_experts.w2.weight", DSV4_DTYPE_F8_E4M3, D, I, (D + 127) / 128, (I + 127) / 128},
        {"layers.0.ffn.experts.0.w1.weight", DSV4_DTYPE_I8, I, D / 2, I, D / 32},
        {"layers.3.ffn.experts.7.w2.weight", DSV4_DTYPE_I8, D, I / 2, D, I / 32},
    };
    ck_assert_msg(fmt[1].c0 > 1 && fmt[1].c1 > 1, "tiny: wq_b spans a single 128x128 block");
    for (size_t i = 0; i < sizeof fmt / sizeof fmt[0]; i++) {
        const dsv4_tensor *t = NULL;
        ck_assert_msg(dsv4_model_tensor(q, fmt[i].name, &t) == 0, "tiny-fp8: %s", dsv4_last_error());
        ck_assert_msg(t->dtype == fmt[i].dt, "tiny-fp8: %s is %s", fmt[i].name, dsv4_dtype_name(t->dtype));
        ck_assert_msg(t->ndim == 2 && t->shape[0] == fmt[i].s0 && t->shape[1] == fmt[i].s1,
                      "tiny-fp8: %s shape [%lld, %lld]", fmt[i].name, (long long)t->shape[0],
                      (long long)t->shape[1]);
        ck_assert_msg(t->scale && t->scale->dtype == DSV4_DTYPE_F8_E8M0, "tiny-fp8: %s has no F8_E8M0 scale",
                      fmt[i].name);
        ck_assert_msg(t->scale->shape[0] == fmt[i].c0 && t->scale->shape[1] == fmt[i].c1,
                      "tiny-fp8: %s scale [%lld, %lld], expected [%lld, %lld]", fmt[i].name,
                      (long long)t->scale->shape[0], (long long)t->scale->shape[1], (long long)fmt[i].c0,
                      (long long)fmt[i].c1);
    }

    /* every float weight dequantises to the tiny one within its format's rounding */
    dsv4_expected_tensor *ex = NULL;
    int ne = 0;
    ck_assert(dsv4_config_expected_tensors(c, &ex, &ne) == 0 && ne > 0);
    int counted[DSV4_DTYPE_COUNT] = {0};
    for (int i = 0; i < ne; i++) {
        const dsv4_tensor *t = NULL;
        ck_assert_msg(dsv4_model_tensor(q, ex[i].name, &t) == 0, "tiny-fp8: %s", dsv4_last_error());
        double tol;
        switch (t->dtype) {
        case DSV4_DTYPE_F32: tol = 0; break;
        case DSV4_DTYPE_BF16: tol = 1.0 / 128; break;    /* half an ulp, 2^-9, of the largest, with room */
        case DSV4_DTYPE_F8_E4M3: tol = 0.07; break;      /* half an ulp of e4m3: 2^-4 of the value */
        case DSV4_DTYPE_I8: tol = 0.34; break;           /* FP4: at most one scale unit, < amax/3 */
        default: continue;                               /* tid2eid */
        }
        size_t n = 1;
        for (int j = 0; j < ex[i].ndim; j++) n *= (size_t)ex[i].shape[j];
        const float *a = NULL, *b = NULL;
        ck_assert_msg(dsv4_model_f32(q, ex[i].name, n, &a) == 0, "tiny-fp8: %s", dsv4_last_error());
        ck_assert_msg(dsv4_model_f32(m, ex[i].name, n, &b) == 0, "tiny: %s", dsv4_last_error());
        double maxd = 0, maxb = 0;
        for (size_t j = 0; j < n; j++) {
            double e = fabs((double)a[j] - b[j]);
            if (e > maxd) maxd = e;
            if (fabs(b[j]) > maxb) maxb = fabs(b[j]);
        }
        ck_assert_msg(maxd <= tol * maxb, "tiny-fp8: %s (%s) differs from tiny by %g (max |w| %g, tolerance %g)",
                      ex[i].name, dsv4_dtype_name(t->dtype), maxd, maxb, tol);
        counted[t->dtype]++;
    }
    ck_assert_msg(counted[DSV4_DTYPE_F8_E4M3] > 0 && counted[DSV4_DTYPE_I8] > 0 && counted[DSV4_DTYPE_BF16] > 0 &&
                  counted[DSV4_DTYPE_F32] > 0, "tiny-fp8: a storage format is missing (%d fp8, %d fp4, %d bf16, "
                  "%d f32)", counted[DSV4_DTYPE_F8_E4M3], counted[DSV4_DTYPE_I8], counted[DSV4_DTYPE_BF16],
                  counted[DSV4_DTYPE_F32]);
    free(ex);
    dsv4_model_free(q);
    dsv4_model_free(m);
    free(d8);
    free(d32);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ suite */
static Suite *golden_suite(void)
{
    Suite *s = suite_create("golden");
    TCase *tc = tcase_create("dumps");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_root_attributes, 0, N_FILES);
    tcase_add_loop_test(tc, test_probe_shapes, 0, N_FILES);
    tcase_add_loop_test(tc, test_values_finite, 0, N_FILES);
    tcase_add_loop_test(tc, test_topk_rows, 0, N_FILES);
    tcase_add_loop_test(tc, test_router_and_mhc_rows, 0, N_FILES);
    tcase_add_test(tc, test_tiny_coverage);
    tcase_add_test(tc, test_greedy_tokens);
    tcase_add_test(tc, test_topk512_context);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("models");
    tcase_set_timeout(tm, 600);
    tcase_add_loop_test(tm, test_model_folders, 0, N_SETS);
    tcase_add_test(tm, test_fp8_set);
    suite_add_tcase(s, tm);
    return s;
}

int main(void)
{
    return dsv4_test_main(golden_suite());
}
