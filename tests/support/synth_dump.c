/* synth_dump.c - synthetic dump pairs for the verifier tests (see synth_dump.h).
 *
 * Determinism: every row's values come from a seed hashed from (spec seed, dataset name, row), so golden
 * and candidate are written independently yet agree bit for bit where the spec perturbs nothing.
 * Perturbations draw from a second stream (seed ^ a constant), never the golden's.
 */
#define _POSIX_C_SOURCE 200809L
#include "synth_dump.h"

#include <fnmatch.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_verify.h"

void synth_spec_init(synth_spec *s)
{
    memset(s, 0, sizeof *s);
    s->n_layers = 4;
    s->hidden = 64;
    s->head_dim = 32;
    s->index_head_dim = 16;
    s->index_topk = 4;
    s->n_experts = 8;
    s->k_experts = 2;
    s->vocab = 256;
    s->prompt_len = 24;
    s->n_decode = 16;
    s->seed = 1;
    s->noise_layer = -1;
    s->tie_layer = s->low_layer = -1;
    s->token_diff_position = -1;
    s->nan_index = 0;
}

static const char *layer_type(int l)
{
    return l == 0 ? "sliding_attention" : (l % 2 ? "compressed_sparse_attention" : "heavily_compressed_attention");
}
static int layer_ratio(int l)
{
    return l == 0 ? 0 : (l % 2 ? 4 : 8);
}

char *synth_config_json(const synth_spec *s)
{
    size_t cap = 4096 + (size_t)s->n_layers * 80;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t n = 0;
    n += (size_t)snprintf(
        b + n, cap - n,
        "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\",\n"
        " \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": 4,\n"
        " \"num_key_value_heads\": 1, \"head_dim\": %d, \"qk_rope_head_dim\": 8, \"partial_rotary_factor\": %g,\n"
        " \"q_lora_rank\": 32, \"o_groups\": 2, \"o_lora_rank\": 16, \"sliding_window\": 8,\n"
        " \"layer_types\": [",
        s->vocab, s->hidden, s->n_layers, s->head_dim, 8.0 / s->head_dim);
    for (int l = 0; l < s->n_layers; l++)
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\"", l ? ", " : "", layer_type(l));
    n += (size_t)snprintf(b + n, cap - n, "],\n \"mlp_layer_types\": [");
    for (int l = 0; l < s->n_layers; l++)
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\"", l ? ", " : "", l == 0 ? "hash_moe" : "moe");
    snprintf(
        b + n, cap - n,
        "],\n \"compress_rates\": {\"compressed_sparse_attention\": 4, \"heavily_compressed_attention\": 8},\n"
        " \"index_n_heads\": 16, \"index_head_dim\": %d, \"index_topk\": %d,\n"
        " \"n_routed_experts\": %d, \"n_shared_experts\": 1, \"num_experts_per_tok\": %d,\n"
        " \"moe_intermediate_size\": 32, \"num_hash_layers\": 1, \"scoring_func\": \"sqrtsoftplus\",\n"
        " \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.5,\n"
        " \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\", \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20,\n"
        " \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 65536,\n"
        " \"rope_theta\": 10000.0, \"compress_rope_theta\": 160000.0,\n"
        " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 256,\n"
        "                  \"beta_fast\": 32, \"beta_slow\": 1},\n"
        " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1, \"torch_dtype\": \"float32\"}\n",
        s->index_head_dim, s->index_topk, s->n_experts, s->k_experts);
    return b;
}

/* ------------------------------------------------------------------------------------------------ random */
static uint64_t hash_str(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x ? x : 0x9e3779b97f4a7c15ull;
}

static uint64_t row_seed(uint64_t seed, const char *name, int64_t row)
{
    return mix(hash_str(seed * 0x9e3779b97f4a7c15ull + 0xcbf29ce484222325ull, name) +
               (uint64_t)row * 0x632be59bd9b4e019ull);
}

static double unif(uint64_t *s) /* [0, 1) */
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

static void fill(float *x, int64_t n, uint64_t seed, double lo, double hi)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * unif(&s));
}

/* x *= 1 + rel * u, u uniform with unit rms; non-finite values are kept. */
static void perturb(float *x, int64_t n, double rel, uint64_t seed)
{
    uint64_t s = seed ^ 0x5bd1e9955bd1e995ull;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) x[i] = (float)(x[i] * (1.0 + rel * (unif(&s) * 2 - 1) * sqrt(3.0)));
}

/* ------------------------------------------------------------------------------------------------ top-k */
typedef struct scored {
    float s;
    int32_t w;
} scored;

static int by_score_desc(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? 1 : -1;
    return (x->w > y->w) - (x->w < y->w);
}

/* Scores [N] for position pos (visible entries (pos+1) div 4), the golden topk [k] and, for the candidate,
 * the perturbed selection. Ties/low swaps as the spec asks at (layer, pos). */
static void topk_rows(const synth_spec *s, int layer, int pos, int64_t N, int candidate, float *scores, int32_t *topk)
{
    char name[64];
    snprintf(name, sizeof name, "layers/%d/indexer_scores", layer);
    int64_t vis = (pos + 1) / 4;
    if (vis > N) vis = N;
    fill(scores, N, row_seed(s->seed, name, pos), -2.0, 6.0);
    for (int64_t i = vis; i < N; i++) scores[i] = -INFINITY;
    int k = s->index_topk;
    scored *e = malloc((size_t)(vis ? vis : 1) * sizeof *e);
    for (int64_t i = 0; i < vis; i++) e[i] = (scored){scores[i], (int32_t)i};
    qsort(e, (size_t)vis, sizeof *e, by_score_desc);
    int tie = layer == s->tie_layer && pos == s->tie_position && s->tie_count > 0 && vis >= k + s->tie_count;
    if (tie) {
        /* ranks k-count .. k+count-1 get exactly the k-th score: the golden picks the first k of them */
        float v = e[k - 1].s;
        for (int r = k - s->tie_count; r < k + s->tie_count; r++) {
            e[r].s = v;
            scores[e[r].w] = v;
        }
    }
    int nk = vis < k ? (int)vis : k;
    for (int i = 0; i < k; i++) topk[i] = i < nk ? e[i].w : -1;
    if (candidate && tie)
        for (int c = 0; c < s->tie_count; c++) topk[k - 1 - c] = e[k + c].w;
    int low = layer == s->low_layer && pos == s->low_position && s->low_count > 0 && vis >= k + s->low_count;
    if (candidate && low)
        for (int c = 0; c < s->low_count; c++) topk[k - 1 - c] = e[vis - 1 - c].w;
    free(e);
}

/* ------------------------------------------------------------------------------------------------ writing */
typedef struct synth_ctx {
    const synth_spec *s;
    int candidate;
    dsv4_dump_writer *w;
    const int32_t *positions;
    int n_positions;
    float *buf;
} synth_ctx;

static int wants_noise(const synth_ctx *x, int layer, int pos)
{
    const synth_spec *s = x->s;
    if (!x->candidate || s->noise_layer < 0 || pos < s->noise_position) return 0;
    return layer < 0 || layer >= s->noise_layer;
}

static int skip(const synth_ctx *x, const char *name)
{
    const synth_spec *s = x->s;
    if (s->omit_role != x->candidate) return 0;
    if (s->omit_dataset && !strcmp(s->omit_dataset, name)) return 1;
    if (!s->omit_probes) return 0;
    const char *probe = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    char globs[512];
    snprintf(globs, sizeof globs, "%s", s->omit_probes);
    char *save = NULL;
    for (char *g = strtok_r(globs, ",", &save); g; g = strtok_r(NULL, ",", &save))
        if (!fnmatch(g, name, 0) || !fnmatch(g, probe, 0)) return 1;
    return 0;
}

static void candidate_edits(const synth_ctx *x, const char *name, int layer, int pos, int64_t row, float *v, int64_t n)
{
    const synth_spec *s = x->s;
    if (!x->candidate) return;
    uint64_t seed = row_seed(s->seed ^ 0xa5a5a5a5ull, name, row);
    if (s->base_noise > 0) perturb(v, n, s->base_noise, seed);
    if (wants_noise(x, layer, pos)) perturb(v, n, s->noise, seed + 1);
    if (s->nan_dataset && !strcmp(s->nan_dataset, name) && row == s->nan_position && s->nan_index < n)
        v[s->nan_index] = NAN;
}

/* One float per-position probe at every stored position. */
static int dense(synth_ctx *x, int layer, const char *probe, int ndim, int64_t d0, int64_t d1, double lo, double hi)
{
    char name[64];
    if (layer >= 0)
        snprintf(name, sizeof name, "layers/%d/%s", layer, probe);
    else
        snprintf(name, sizeof name, "final/%s", probe);
    if (skip(x, name)) return 0;
    int64_t shape[2] = {d0, d1}, n = ndim == 2 ? d0 * d1 : d0;
    for (int i = 0; i < x->n_positions; i++) {
        int pos = x->positions[i];
        fill(x->buf, n, row_seed(x->s->seed, name, pos), lo, hi);
        candidate_edits(x, name, layer, pos, pos, x->buf, n);
        int rc = dsv4_dump_writer_row(x->w, name, i, DSV4_DTYPE_F32, ndim, shape, x->buf);
        if (rc) return rc;
    }
    return 0;
}

static int entries(synth_ctx *x, int layer, const char *probe, int64_t rows, int64_t width)
{
    char name[64];
    snprintf(name, sizeof name, "layers/%d/%s", layer, probe);
    if (skip(x, name) || rows == 0) return 0;
    float *a = malloc((size_t)(rows * width) * sizeof *a);
    if (!a) return DSV4_ERR_NOMEM;
    for (int64_t w = 0; w < rows; w++) {
        fill(a + w * width, width, row_seed(x->s->seed, name, w), -1, 1);
        int pos = (int)((w + 1) * layer_ratio(layer) - 1);
        candidate_edits(x, name, layer, pos, w, a + w * width, width);
    }
    int64_t shape[2] = {rows, width};
    int rc = dsv4_dump_writer_array(x->w, name, DSV4_DTYPE_F32, 2, shape, a);
    free(a);
    return rc;
}

static int csa_probes(synth_ctx *x, int layer)
{
    const synth_spec *s = x->s;
    int last = x->positions[x->n_positions - 1];
    int64_t N = (last + 1) / 4, k = s->index_topk;
    char ns[64], nt[64];
    snprintf(ns, sizeof ns, "layers/%d/indexer_scores", layer);
    snprintf(nt, sizeof nt, "layers/%d/topk_idx", layer);
    float *sc = malloc((size_t)(N ? N : 1) * sizeof *sc);
    int32_t *tk = malloc((size_t)k * sizeof *tk);
    int rc = sc && tk ? 0 : DSV4_ERR_NOMEM;
    for (int i = 0; i < x->n_positions && !rc; i++) {
        int pos = x->positions[i];
        topk_rows(s, layer, pos, N, x->candidate, sc, tk);
        candidate_edits(x, ns, layer, pos, pos, sc, N);
        int64_t shs[1] = {N}, sht[1] = {k};
        if (N > 0 && !skip(x, ns)) rc = dsv4_dump_writer_row(x->w, ns, i, DSV4_DTYPE_F32, 1, shs, sc);
        if (!rc && !skip(x, nt)) rc = dsv4_dump_writer_row(x->w, nt, i, DSV4_DTYPE_I32, 1, sht, tk);
    }
    free(sc);
    free(tk);
    return rc;
}

static int router_ids(synth_ctx *x, int layer)
{
    char name[64];
    snprintf(name, sizeof name, "layers/%d/router_ids", layer);
    if (skip(x, name)) return 0;
    int k = x->s->k_experts;
    int32_t ids[64];
    int64_t shape[1] = {k};
    for (int i = 0; i < x->n_positions; i++) {
        uint64_t st = row_seed(x->s->seed, name, x->positions[i]);
        for (int j = 0; j < k; j++) {
            int32_t e, dup;
            do {
                e = (int32_t)(unif(&st) * x->s->n_experts);
                dup = 0;
                for (int t = 0; t < j; t++) dup |= ids[t] == e;
            } while (dup);
            ids[j] = e;
        }
        int rc = dsv4_dump_writer_row(x->w, name, i, DSV4_DTYPE_I32, 1, shape, ids);
        if (rc) return rc;
    }
    return 0;
}

int synth_write(const char *path, const synth_spec *s, int candidate)
{
    int T = s->prompt_len + s->n_decode;
    int32_t *tokens = malloc((size_t)T * sizeof *tokens), *all = NULL;
    char *cj = synth_config_json(s);
    if (!tokens || !cj) {
        free(tokens);
        free(cj);
        return DSV4_ERR_NOMEM;
    }
    uint64_t ts = s->seed * 77 + 3;
    for (int p = 0; p < T; p++) tokens[p] = (int32_t)(unif(&ts) * s->vocab);
    if (candidate && s->token_diff_position >= 0)
        for (int p = s->token_diff_position; p < T; p++) tokens[p] = (tokens[p] + 1) % s->vocab;
    const int32_t *positions = s->positions;
    int np = s->n_positions;
    if (candidate && s->candidate_positions) {
        positions = s->candidate_positions;
        np = s->n_candidate_positions;
    }
    if (!positions) {
        all = malloc((size_t)T * sizeof *all);
        for (int p = 0; p < T; p++) all[p] = p;
        positions = all;
        np = T;
    }
    dsv4_config cfg;
    int rc = dsv4_config_parse(cj, "synth config", &cfg);
    dsv4_dump_meta meta = {
        .producer = s->producer ? s->producer
                    : candidate ? "synth candidate"
                                : "synth golden",
        .config_json = cj,
        .weights_digest = s->digest ? s->digest : "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed",
        .prompt_len = s->prompt_len,
        .n_decode = s->n_decode,
        .mode = s->mode ? s->mode : "forced",
    };
    synth_ctx x = {.s = s, .candidate = candidate, .positions = positions, .n_positions = np};
    int64_t maxrow = 4 * (int64_t)s->hidden;
    if (s->vocab > maxrow) maxrow = s->vocab;
    x.buf = malloc((size_t)maxrow * sizeof *x.buf);
    if (!rc && !x.buf) rc = DSV4_ERR_NOMEM;
    if (!rc) rc = dsv4_dump_writer_open(path, &meta, &cfg, tokens, T, positions, np, &x.w);
    int D = s->hidden;
    for (int l = 0; l < s->n_layers && !rc; l++) {
        int r = layer_ratio(l);
        const char *hc[2] = {"attn", "ffn"};
        for (int h = 0; h < 2 && !rc; h++) {
            char n1[32], n2[32], n3[32];
            snprintf(n1, sizeof n1, "%s_hc_pre", hc[h]);
            snprintf(n2, sizeof n2, "%s_hc_post", hc[h]);
            snprintf(n3, sizeof n3, "%s_hc_comb", hc[h]);
            if (!rc) rc = dense(&x, l, n1, 1, 4, 0, 0.05, 1.0);
            if (!rc) rc = dense(&x, l, n2, 1, 4, 0, 0.1, 2.0);
            if (!rc) rc = dense(&x, l, n3, 2, 4, 4, 0.01, 0.5);
            if (!rc) rc = dense(&x, l, h ? "ffn_in" : "attn_in", 1, D, 0, -2, 2);
            if (h == 0) {
                if (!rc) rc = dense(&x, l, "kv", 1, s->head_dim, 0, -1, 1);
                if (!rc && r) rc = entries(&x, l, "compressed_kv", T / r, s->head_dim);
                if (!rc && r == 4) rc = entries(&x, l, "indexer_kv", T / r, s->index_head_dim);
                if (!rc && r == 4) rc = csa_probes(&x, l);
                if (!rc) rc = dense(&x, l, "attn_out", 1, D, 0, -1, 1);
            }
        }
        if (!rc) rc = router_ids(&x, l);
        if (!rc) rc = dense(&x, l, "router_weights", 1, s->k_experts, 0, 0.1, 1.0);
        if (!rc) rc = dense(&x, l, "ffn_out", 1, D, 0, -1, 1);
        if (!rc) rc = dense(&x, l, "out", 2, 4, D, -3, 3);
    }
    if (!rc) rc = dense(&x, -1, "hc_head", 1, D, 0, -2, 2);
    if (!rc) rc = dense(&x, -1, "norm", 1, D, 0, -2, 2);
    if (!rc) rc = dense(&x, -1, "logits", 1, s->vocab, 0, -4, 4);
    if (!rc) {
        rc = dsv4_dump_writer_commit(x.w);
        x.w = NULL;
    }
    dsv4_dump_writer_abort(x.w);
    free(x.buf);
    free(tokens);
    free(all);
    free(cj);
    return rc;
}

int synth_set_root_attr(const char *path, const char *name, const char *value)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return DSV4_ERR_IO;
    if (H5Aexists(f, name) > 0) H5Adelete(f, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t w = a >= 0 ? H5Awrite(a, t, value) : -1;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
    return w < 0 ? DSV4_ERR_IO : 0;
}

int synth_set_element(const char *path, const char *dataset, int64_t row, int64_t col, double value)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return DSV4_ERR_IO;
    hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT), fs = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t start[2] = {(hsize_t)row, (hsize_t)col}, one[2] = {1, 1};
    hid_t ms = H5Screate_simple(2, one, NULL);
    herr_t w = fs >= 0 && H5Sget_simple_extent_ndims(fs) == 2 &&
                       H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, one, NULL) >= 0
                   ? H5Dwrite(d, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, &value)
                   : -1;
    H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (d >= 0) H5Dclose(d);
    H5Fclose(f);
    return w < 0 ? DSV4_ERR_IO : 0;
}

int synth_copy_dataset(const char *path, const char *src, const char *dst)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return DSV4_ERR_IO;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    herr_t w = lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0
                   ? H5Ocopy(f, src, f, dst, H5P_DEFAULT, lcpl)
                   : -1;
    if (lcpl >= 0) H5Pclose(lcpl);
    H5Fclose(f);
    return w < 0 ? DSV4_ERR_IO : 0;
}

int synth_copy_perturbed(const char *src, const char *dst, int layer, double rel, uint64_t seed)
{
    return synth_copy_transformed(src, dst, layer, rel, 1.0, seed);
}

int synth_copy_transformed(const char *src, const char *dst, int layer, double rel, double scale, uint64_t seed)
{
    dsv4_dump *d;
    int rc = dsv4_dump_open(src, &d);
    if (rc) return rc;
    const dsv4_config *cfg;
    int nt, np;
    const int32_t *tok = dsv4_dump_tokens(d, &nt), *pos = dsv4_dump_positions(d, &np);
    dsv4_dump_meta meta = {dsv4_dump_attr(d, "producer"),
                           dsv4_dump_attr(d, "config_json"),
                           dsv4_dump_attr(d, "weights_digest"),
                           dsv4_dump_prompt_len(d),
                           dsv4_dump_n_decode(d),
                           dsv4_dump_attr(d, "mode")};
    dsv4_dump_writer *w = NULL;
    rc = dsv4_dump_config(d, &cfg);
    if (!rc) rc = dsv4_dump_writer_open(dst, &meta, cfg, tok, nt, pos, np, &w);
    for (int i = 0; !rc && i < dsv4_dump_dataset_count(d); i++) {
        const char *name = dsv4_dump_dataset_name(d, i);
        dsv4_dataset_info info;
        if ((rc = dsv4_dump_info(d, name, &info))) break;
        int l = -1;
        if (sscanf(name, "layers/%d/", &l) != 1) l = -1;
        const int final = !strncmp(name, "final/", 6);
        int hit = (layer == SYNTH_ALL_LAYERS ? l >= 0 || final : l == layer && (layer >= 0 || final)) &&
                  info.dtype == DSV4_DTYPE_F32;
        size_t row = 1;
        for (int k = 1; k < info.ndim; k++) row *= (size_t)info.shape[k];
        int per_entry = strstr(name, "/compressed_kv") || strstr(name, "/indexer_kv");
        void *buf = malloc((size_t)info.shape[0] * row * 4 + 4);
        if (!buf) {
            rc = DSV4_ERR_NOMEM;
            break;
        }
        rc = dsv4_dump_read_rows(d, name, 0, info.shape[0], buf);
        if (!rc && hit) perturb(buf, info.shape[0] * (int64_t)row, rel, mix(seed + (uint64_t)i));
        if (!rc && hit && scale != 1.0)
            for (int64_t k = 0; k < info.shape[0] * (int64_t)row; k++) ((float *)buf)[k] *= (float)scale;
        if (!rc && per_entry) rc = dsv4_dump_writer_array(w, name, info.dtype, info.ndim, info.shape, buf);
        for (int64_t r = 0; !rc && !per_entry && r < info.shape[0]; r++)
            rc = dsv4_dump_writer_row(w, name, (int)r, info.dtype, info.ndim - 1, info.shape + 1,
                                      (char *)buf + (size_t)r * row * 4);
        free(buf);
    }
    if (!rc) {
        rc = dsv4_dump_writer_commit(w);
        w = NULL;
    }
    dsv4_dump_writer_abort(w);
    dsv4_dump_free(d);
    return rc;
}

char *synth_text_report(const dsv4_verify_result *r)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    int rc = dsv4_verify_write_text(r, f, 0);
    if (fclose(f) || rc) {
        free(buf);
        return NULL;
    }
    printf("%s", buf);
    fflush(stdout); /* a failed check ends the forked case before stdio's buffers are written */
    return buf;
}
