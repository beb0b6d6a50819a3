/* expected.c - the tensor list a config implies (model-spec §2 tables, for any config) and the check of a
 * model against it (what `dsv4 inspect` reports).
 *
 * Shapes are logical ([out, in] for linears, after dequantisation): an FP4 expert stored as I8 [out, in/2]
 * is compared as [out, in]. Per layer: CSA layers have the indexer and a compressor with coff = 2 (its
 * wkv/wgate project to 2·d and its ape is [ratio, 2·d]); HCA layers a compressor with coff = 1; sliding
 * layers neither. Hash layers carry ffn.gate.tid2eid [vocab, k] INSTEAD of ffn.gate.bias [E].
 * Not reported by the check: MTP tensors (mtp.*, unused by the decoder) and scale tensors attached to a weight.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

typedef struct exp_list {
    dsv4_expected_tensor *v;
    int n, cap;
    int oom;
} exp_list;

static void add(exp_list *l, int ndim, int64_t s0, int64_t s1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void add(exp_list *l, int ndim, int64_t s0, int64_t s1, const char *fmt, ...)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 256;
        dsv4_expected_tensor *nv = realloc(l->v, (size_t)nc * sizeof *nv);
        if (!nv) {
            l->oom = 1;
            return;
        }
        l->v = nv;
        l->cap = nc;
    }
    dsv4_expected_tensor *e = &l->v[l->n++];
    memset(e, 0, sizeof *e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->ndim = ndim;
    e->shape[0] = s0;
    e->shape[1] = ndim > 1 ? s1 : 1;
    e->shape[2] = e->shape[3] = 1;
}

int dsv4_config_expected_tensors(const dsv4_config *c, dsv4_expected_tensor **out, int *n)
{
    *out = NULL;
    *n = 0;
    exp_list l = {0};
    const int64_t D = c->hidden_size, V = c->vocab_size, hc = c->hc_mult, mix = (2 + hc) * hc;
    const int64_t H = c->num_attention_heads, d = c->head_dim, qr = c->q_lora_rank, G = c->o_groups;
    const int64_t orank = c->o_lora_rank, E = c->n_routed_experts, I = c->moe_intermediate_size;
    const int64_t Is = I * c->n_shared_experts, HI = c->index_n_heads, dI = c->index_head_dim;
    add(&l, 2, V, D, "embed.weight");
    if (!c->tie_word_embeddings) add(&l, 2, V, D, "head.weight");
    add(&l, 1, D, 0, "norm.weight");
    add(&l, 2, hc, hc * D, "hc_head_fn");
    add(&l, 1, hc, 0, "hc_head_base");
    add(&l, 1, 1, 0, "hc_head_scale");
    for (int L = 0; L < c->num_hidden_layers; L++) {
        add(&l, 2, mix, hc * D, "layers.%d.hc_attn_fn", L);
        add(&l, 1, mix, 0, "layers.%d.hc_attn_base", L);
        add(&l, 1, 3, 0, "layers.%d.hc_attn_scale", L);
        add(&l, 2, mix, hc * D, "layers.%d.hc_ffn_fn", L);
        add(&l, 1, mix, 0, "layers.%d.hc_ffn_base", L);
        add(&l, 1, 3, 0, "layers.%d.hc_ffn_scale", L);
        add(&l, 1, D, 0, "layers.%d.attn_norm.weight", L);
        add(&l, 1, D, 0, "layers.%d.ffn_norm.weight", L);
        add(&l, 1, H, 0, "layers.%d.attn.attn_sink", L);
        add(&l, 2, qr, D, "layers.%d.attn.wq_a.weight", L);
        add(&l, 1, qr, 0, "layers.%d.attn.q_norm.weight", L);
        add(&l, 2, H * d, qr, "layers.%d.attn.wq_b.weight", L);
        add(&l, 2, d, D, "layers.%d.attn.wkv.weight", L);
        add(&l, 1, d, 0, "layers.%d.attn.kv_norm.weight", L);
        add(&l, 2, G * orank, H * d / G, "layers.%d.attn.wo_a.weight", L);
        add(&l, 2, D, G * orank, "layers.%d.attn.wo_b.weight", L);
        if (c->attn_type[L] != DSV4_ATTN_SLIDING) {
            const int64_t r = c->compress_ratio[L], coff = c->attn_type[L] == DSV4_ATTN_CSA ? 2 : 1;
            add(&l, 2, coff * d, D, "layers.%d.attn.compressor.wkv.weight", L);
            add(&l, 2, coff * d, D, "layers.%d.attn.compressor.wgate.weight", L);
            add(&l, 2, r, coff * d, "layers.%d.attn.compressor.ape", L);
            add(&l, 1, d, 0, "layers.%d.attn.compressor.norm.weight", L);
            if (c->attn_type[L] == DSV4_ATTN_CSA) {
                add(&l, 2, HI * dI, qr, "layers.%d.attn.indexer.wq_b.weight", L);
                add(&l, 2, HI, D, "layers.%d.attn.indexer.weights_proj.weight", L);
                add(&l, 2, coff * dI, D, "layers.%d.attn.indexer.compressor.wkv.weight", L);
                add(&l, 2, coff * dI, D, "layers.%d.attn.indexer.compressor.wgate.weight", L);
                add(&l, 2, r, coff * dI, "layers.%d.attn.indexer.compressor.ape", L);
                add(&l, 1, dI, 0, "layers.%d.attn.indexer.compressor.norm.weight", L);
            }
        }
        add(&l, 2, E, D, "layers.%d.ffn.gate.weight", L);
        if (c->mlp_type[L] == DSV4_MLP_HASH_MOE) add(&l, 2, V, c->num_experts_per_tok, "layers.%d.ffn.gate.tid2eid", L);
        else add(&l, 1, E, 0, "layers.%d.ffn.gate.bias", L);
        if (Is > 0) {
            add(&l, 2, Is, D, "layers.%d.ffn.shared_experts.w1.weight", L);
            add(&l, 2, D, Is, "layers.%d.ffn.shared_experts.w2.weight", L);
            add(&l, 2, Is, D, "layers.%d.ffn.shared_experts.w3.weight", L);
        }
        for (int64_t e = 0; e < E; e++) {
            add(&l, 2, I, D, "layers.%d.ffn.experts.%lld.w1.weight", L, (long long)e);
            add(&l, 2, D, I, "layers.%d.ffn.experts.%lld.w2.weight", L, (long long)e);
            add(&l, 2, I, D, "layers.%d.ffn.experts.%lld.w3.weight", L, (long long)e);
        }
    }
    if (l.oom) {
        free(l.v);
        return dsv4_error(DSV4_ERR_NOMEM, "out of memory for the expected tensor list");
    }
    *out = l.v;
    *n = l.n;
    return 0;
}

static void reportf(dsv4_report_fn report, void *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void reportf(dsv4_report_fn report, void *ctx, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (report) report(ctx, line);
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)s[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static int is_int_dtype(dsv4_dtype t)
{
    return t == DSV4_DTYPE_I32 || t == DSV4_DTYPE_I64;
}

int dsv4_model_check(const dsv4_model *m, dsv4_report_fn report, void *ctx)
{
    dsv4_expected_tensor *ex;
    int nex, rc = dsv4_config_expected_tensors(dsv4_model_config(m), &ex, &nex);
    if (rc) return rc;
    int nt = dsv4_model_tensor_count(m), problems = 0;
    /* 1 = expected, 2 = a scale of some tensor */
    unsigned char *seen = calloc((size_t)nt + 1, 1);
    if (!seen) {
        free(ex);
        return dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    }
    const dsv4_tensor *base = dsv4_model_tensor_at(m, 0);
    for (int i = 0; i < nt; i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(m, i);
        if (t->scale) seen[t->scale - base] |= 2;
    }
    char want[96], got[96];
    for (int i = 0; i < nex; i++) {
        const dsv4_expected_tensor *e = &ex[i];
        const dsv4_tensor *t;
        shape_str(want, sizeof want, e->ndim, e->shape);
        if (dsv4_model_tensor(m, e->name, &t)) {
            reportf(report, ctx, "missing: %s (expected %s)", e->name, want);
            problems++;
            continue;
        }
        seen[t - base] |= 1;
        int64_t ls[4];
        int nd = dsv4_tensor_logical_shape(t, ls);
        int same = nd == e->ndim;
        for (int k = 0; same && k < nd; k++) same = ls[k] == e->shape[k];
        if (!same) {
            shape_str(got, sizeof got, nd, ls);
            reportf(report, ctx, "mis-shaped: %s is %s %s, expected %s (%s in %s)", e->name, dsv4_dtype_name(t->dtype),
                    got, want, t->disk_name, t->file);
            problems++;
            continue;
        }
        int want_int = strstr(e->name, ".tid2eid") != NULL;
        if (want_int != is_int_dtype(t->dtype)) {
            reportf(report, ctx, "mis-typed: %s is %s, expected %s (%s in %s)", e->name, dsv4_dtype_name(t->dtype),
                    want_int ? "I32 or I64" : "a float or quantised dtype", t->disk_name, t->file);
            problems++;
            continue;
        }
        if ((t->dtype == DSV4_DTYPE_I8 || t->dtype == DSV4_DTYPE_U8) && !t->scale) {
            reportf(report, ctx, "bad scale: %s is %s packed FP4 but has no .scale tensor (%s)", e->name,
                    dsv4_dtype_name(t->dtype), t->file);
            problems++;
            continue;
        }
        if (dsv4_tensor_check_scale(t)) {
            reportf(report, ctx, "bad scale: %s", dsv4_last_error());
            problems++;
        }
    }
    for (int i = 0; i < nt; i++) {
        const dsv4_tensor *t = dsv4_model_tensor_at(m, i);
        if (seen[i] || !strncmp(t->name, "mtp.", 4)) continue;
        reportf(report, ctx, "unexpected: %s (%s in %s)", t->name, t->disk_name, t->file);
        problems++;
    }
    free(seen);
    free(ex);
    return problems;
}
