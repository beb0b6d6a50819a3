/* ref_plan.c - the memory plan of a reference run (dsv4_ref.h, docs/reference.md "The plan before the work"):
 * what the run will hold at its peak, from the config and the tensors' on-disk dtypes alone, checked against the
 * host (ref-cpu) or the GPU (ref-gpu) before anything heavy runs: the weights digest reads every byte of the
 * checkpoint (minutes at full size), so a run that cannot fit must say so first.
 *
 * Invariants that fail quietly:
 * - Sizes are summed in double so that no size_t product of config values can wrap before the check.
 * - The CPU numbers bound what ref_model.c / ref_weights.c allocate (layout_state, dsv4_ref_scratch_layout,
 *   dsv4_ref_weights_measure): the plan may overstate, never understate. So do the GPU numbers: the scratch and the
 *   streamed weights' slots and buffers are ref_gpu_layout.c's, which ref_gpu_init.cu allocates; the state is the
 *   CPU's bound. Not counted: the CUDA context and cuBLAS's workspace (tens of MiB).
 * - Mapped tensors (aligned F32 on disk, not rounded by the emulation) cost no private memory: the page cache
 *   holds them, and the kernel may drop those pages under pressure.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_gpu_layout.h"
#include "ref_model.h"

/* Decode state (floats) and the per-token / fixed scratch (floats) of a CPU forward call. DSV4_ERR_CONFIG when
 * a number cannot be represented where the reference keeps it. */
static int state_and_scratch(const dsv4_config *f, int max_tokens, double *state, double *per_token, double *fixed)
{
    double T = max_tokens, d = f->head_dim, dI = f->index_head_dim;
    double cmp_max = 0, extra_max = 0;
    *state = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) {
        *state += (double)f->sliding_window * d;
        int r = f->attn_type[L] == DSV4_ATTN_SLIDING ? 0 : f->compress_ratio[L];
        if (r <= 0) continue;
        if (r > (1 << 24)) return dsv4_error(DSV4_ERR_CONFIG, "reference: layer %d compress ratio %d", L, r);
        *state += T / r * (d + dI) + 8.0 * r * (d + dI); /* pools + compressor states (overlap: 2r rows x 2d) */
        double pool = T / r, extra = f->attn_type[L] == DSV4_ATTN_CSA && f->index_topk < pool ? f->index_topk : pool;
        if (pool > cmp_max) cmp_max = pool;
        if (extra > extra_max) extra_max = extra; /* entries attended besides the window (layout_state's m_max) */
    }
    double m_max = (double)f->sliding_window + extra_max, np = f->qk_rope_head_dim / 2 + 1, n = f->hc_mult;
    double H = f->num_attention_heads, HI = f->index_n_heads, D = f->hidden_size, k = f->num_experts_per_tok;
    if (m_max > 2147483647.0)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: sliding_window %d + %.0f compressed entries (max_tokens %d) "
                          "does not fit an int", f->sliding_window, extra_max, max_tokens);
    /* dsv4_ref_scratch_layout's views per token (each rounded up to 16 floats: the 50 * 16) and once per call */
    *per_token = 2 * n * D + 2 * n + n * n + 5 * D + f->q_lora_rank + 2 * H * d + 5 * d + 4 * dI + HI * dI + HI +
                 (double)f->o_groups * f->o_lora_rank + 4 * np + f->index_topk + 1 + f->n_routed_experts + 3 * k +
                 2.0 * f->moe_intermediate_size + k * D + 50 * 16;
    *fixed = 2 * np + d + dI + m_max * d + H * m_max + cmp_max * (1 + HI) + f->n_routed_experts + 3 * D + n * D +
             (2 + n) * n + f->vocab_size;
    if (4 * (*fixed + T * *per_token) > 0x1p60)
        return dsv4_error(DSV4_ERR_CONFIG, "reference: a %d-token prefill would need %.3g bytes of scratch",
                          max_tokens, 4 * (*fixed + T * *per_token));
    return 0;
}

/* printf at buf + *o, never past size (a full buffer keeps what fitted). */
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...)
{
    if (*o >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, size - *o, fmt, ap);
    va_end(ap);
    *o += n > 0 ? (size_t)n : 0;
}

const char *dsv4_ref_plan_describe(const dsv4_ref_plan *p, int max_tokens, int prefill_tokens, char *buf,
                                   size_t size)
{
    char a[32], b[32], c[32], d[32], e[32];
    size_t o = 0;
    buf[0] = 0;
    if (p->gpu && p->streamed) {
        append(buf, size, &o, "weights streamed as on disk %s (2 slots of %s for a layer's dense tensors or a row "
               "range of the head, in %d, and 2 of %s for a routed expert, the same pinned on the host; as f32 an "
               "arena",
               dsv4_mem_format(p->weights, a, sizeof a), dsv4_mem_format(p->dense_slot, b, sizeof b), p->head_parts,
               dsv4_mem_format(p->expert_slot, c, sizeof c));
        append(buf, size, &o, " of %s for the largest layer, %d: %s, or the head: %s,", dsv4_mem_format(p->arena, a,
               sizeof a), p->layer_at, dsv4_mem_format(p->layer, b, sizeof b), dsv4_mem_format(p->head, c, sizeof c));
        append(buf, size, &o, " and one routed expert %s; resident would need %s)",
               dsv4_mem_format(p->expert, d, sizeof d), dsv4_mem_format(p->resident, e, sizeof e));
    } else if (p->gpu || p->upfront)
        append(buf, size, &o, "weights as f32%s %s", p->gpu ? " (resident)" : ", all at init",
               dsv4_mem_format(p->weights, a, sizeof a));
    else {
        append(buf, size, &o, "weights as f32 a layer at a time %s", dsv4_mem_format(p->weights, a, sizeof a));
        if (p->arena <= 0 && p->expert <= 0)
            append(buf, size, &o, " (every tensor used from the mmap: aligned F32 on disk)");
        else if (p->layer_at >= 0)
            append(buf, size, &o, " (an arena of %s for the largest layer, %d: %s, or the head: %s; one routed "
                   "expert %s)", dsv4_mem_format(p->arena, b, sizeof b), p->layer_at,
                   dsv4_mem_format(p->layer, c, sizeof c), dsv4_mem_format(p->head, d, sizeof d),
                   dsv4_mem_format(p->expert, e, sizeof e));
        else
            append(buf, size, &o, " (an arena of %s for the head; one routed expert %s)",
                   dsv4_mem_format(p->arena, b, sizeof b), dsv4_mem_format(p->expert, e, sizeof e));
    }
    append(buf, size, &o, ", decode state for %d tokens %s, scratch %s", max_tokens,
           dsv4_mem_format(p->state, a, sizeof a), dsv4_mem_format(p->scratch, b, sizeof b));
    if (!p->gpu && prefill_tokens > 1)
        append(buf, size, &o, ", prefill of %d tokens %s", prefill_tokens, dsv4_mem_format(p->prefill, a, sizeof a));
    append(buf, size, &o, "; total %s", dsv4_mem_format(p->total, a, sizeof a));
    return buf;
}

int dsv4_ref_cpu_plan(dsv4_model *m, int max_tokens, int prefill_tokens, const dsv4_ref_options *o,
                      dsv4_ref_plan *out)
{
    DSV4_CHECK(m && out, "dsv4_ref_cpu_plan: NULL argument");
    memset(out, 0, sizeof *out);
    out->layer_at = -1;
    const dsv4_config *f = dsv4_model_config(m);
    DSV4_TRY(dsv4_ref_check_config(f, max_tokens));
    DSV4_CHECK(prefill_tokens >= 0 && prefill_tokens <= max_tokens, "dsv4_ref_cpu_plan: prefill of %d tokens, "
               "max_tokens %d", prefill_tokens, max_tokens);
    const int emu = o && o->emulate == DSV4_REF_EMULATE_BF16, upfront = o && o->weights == DSV4_REF_WEIGHTS_UPFRONT;
    out->upfront = upfront;
    double state, per_token, fixed;
    DSV4_TRY(state_and_scratch(f, max_tokens, &state, &per_token, &fixed));
    dsv4_ref_weights_size sz;
    DSV4_TRY(dsv4_ref_weights_measure(m, f, emu, upfront, &sz));
    out->state = 4 * state + sz.tid2eid_bytes;
    out->scratch = 4 * (fixed + per_token);
    out->prefill = prefill_tokens > 1 ? 4 * (fixed + prefill_tokens * per_token) : 0; /* 1 token: the decode's */
    if (upfront) {
        out->weights = 4 * (sz.upfront_arena + sz.upfront_loader);
    } else {
        out->head = 4 * sz.head;
        out->layer = 4 * sz.layer;
        out->layer_at = sz.layer_at;
        out->arena = out->layer > out->head ? out->layer : out->head;
        out->expert = 4 * sz.expert;
        out->weights = out->arena + out->expert + 4 * (sz.globals + sz.embed_row);
    }
    out->total = out->weights + out->state + out->scratch + out->prefill;
    char what[512], line[400];
    snprintf(what, sizeof what, "reference cpu (%s)", dsv4_ref_plan_describe(out, max_tokens, prefill_tokens, line,
                                                                             sizeof line));
    return dsv4_mem_check_host(out->total, what);
}

/* The f32 copy of every tensor ref_gpu_init.cu uploads in the resident mode, each view 256-byte aligned. */
static int gpu_resident_weights(const dsv4_config *f, double *bytes)
{
    dsv4_expected_tensor *ex = NULL;
    int n_ex = 0;
    if (dsv4_config_expected_tensors(f, &ex, &n_ex)) return dsv4_error(DSV4_ERR_NOMEM, "reference: out of memory");
    *bytes = 0;
    for (int i = 0; i < n_ex; i++) {
        if (strstr(ex[i].name, ".tid2eid")) continue;
        double numel = 1;
        for (int k = 0; k < ex[i].ndim; k++) numel *= (double)ex[i].shape[k];
        *bytes += 4 * (numel + 63);
    }
    free(ex);
    return 0;
}

/* ref-gpu's device check: no device to ask (no GPU, no driver) is no refusal: ref-gpu's init says why it cannot run */
static int gpu_check(const dsv4_ref_plan *p, int max_tokens)
{
    char what[1400], line[1200];
    snprintf(what, sizeof what, "reference gpu (%s)", dsv4_ref_plan_describe(p, max_tokens, 0, line, sizeof line));
    int rc = dsv4_mem_check_device(p->total, what);
    if (rc == DSV4_ERR_CUDA) return 0;
    if (rc || !p->streamed) return rc;
    snprintf(what, sizeof what, "reference gpu: pinned host buffers of the streamed weights (%s)",
             dsv4_ref_plan_describe(p, max_tokens, 0, line, sizeof line));
    return dsv4_mem_check_host(p->pinned, what);
}

int dsv4_ref_gpu_plan(dsv4_model *m, int max_tokens, const dsv4_ref_options *o, dsv4_ref_plan *out)
{
    DSV4_CHECK(m && out, "dsv4_ref_gpu_plan: NULL argument");
    memset(out, 0, sizeof *out);
    out->gpu = 1;
    out->layer_at = -1;
    const dsv4_config *f = dsv4_model_config(m);
    DSV4_TRY(dsv4_ref_check_config(f, max_tokens));
    const dsv4_ref_gpu_weights mode = o ? o->gpu_weights : DSV4_REF_GPU_WEIGHTS_AUTO;
    const int emu = o && o->emulate == DSV4_REF_EMULATE_BF16;
    double state, per_token, fixed;
    DSV4_TRY(state_and_scratch(f, max_tokens, &state, &per_token, &fixed));
    int n_hash = 0;
    for (int L = 0; L < f->num_hidden_layers; L++) n_hash += f->mlp_type[L] == DSV4_MLP_HASH_MOE;
    out->state = 4 * state + (double)n_hash * f->vocab_size * f->num_experts_per_tok * sizeof(int32_t);
    dsv4_ref_gpu_dims dm; /* the scratch ref_gpu_init.cu carves, and the RoPE tables */
    dsv4_ref_gpu_dims_of(f, max_tokens, &dm);
    out->scratch = 4 * ((double)dsv4_ref_gpu_scratch_layout(f, &dm, NULL, NULL) + 2 * (dm.n_pairs + 1));
    double resident = 0;
    DSV4_TRY(gpu_resident_weights(f, &resident));
    out->resident = resident + out->state + out->scratch;
    if (mode != DSV4_REF_GPU_WEIGHTS_STREAM) {
        out->weights = resident;
        out->total = out->resident;
        if (mode == DSV4_REF_GPU_WEIGHTS_RESIDENT) return gpu_check(out, max_tokens);
        /* auto: resident when it fits with a margin of 10% (the device check keeps its own margin besides) */
        dsv4_ref_plan wide = *out;
        wide.total *= 1.1;
        int rc = gpu_check(&wide, max_tokens);
        if (rc != DSV4_ERR_NOMEM) return rc;
    }
    /* streamed: the slots, the f32 arena and expert buffer, the globals (final norm, hc_head) resident */
    dsv4_ref_stream_size sz;
    DSV4_TRY(dsv4_ref_stream_measure(m, f, emu, &sz));
    const double D = f->hidden_size, n = f->hc_mult, globals = 4 * ((D + 63) + (n * n * D + 63) + (n + 63) + 64);
    out->streamed = 1;
    out->dense_slot = (double)sz.dense_slot;
    out->expert_slot = (double)sz.expert_slot;
    out->slots = 2 * out->dense_slot + 2 * out->expert_slot;
    out->pinned = out->slots;
    out->layer = 4 * (double)sz.layer_floats;
    out->layer_at = sz.layer_at;
    out->head = 4 * (double)sz.head_floats;
    out->arena = 4 * (double)sz.arena_floats;
    out->expert = 4 * (double)sz.expert_floats;
    out->head_parts = sz.head_parts;
    out->weights = out->arena + out->expert + out->slots + globals;
    out->total = out->weights + out->state + out->scratch;
    return gpu_check(out, max_tokens);
}
