/* ref_gpu_emu.cu - the GPU reference's two options (dsv4_ref_options; issue 34 item 3): the bf16 emulation's
 * roundings and MoE order, and decision following, each as the CPU reference does it (ref_forward.c, the
 * specification; docs/verify.md "The bf16 emulation of the reference"). ref_gpu.cu calls these at the CPU's sites.
 *
 * Quiet traps:
 * - The rounding is dsv4_ref_gpu_bf16_round (ref_gpu.cuh), bit for bit the CPU's dsv4_f32_to_bf16, NaN included
 *   (__float2bfloat16_rn rounds numbers the same way but turns every NaN into one canonical NaN).
 * - Emulated MoE: the route weight multiplies the SwiGLU row BEFORE its bf16 store (moe_up_kernel's o->h_r), so
 *   the sum over a token's experts is unweighted (moe_sum), routed rows in slot order, then the shared output.
 * - Following merges on the host with the CPU's own dsv4_ref_follow_merge, after the own picks are probed: a top-k
 *   row is widened to index_topk with -1 before the merge (the dump's rows are that wide), and once any row of the
 *   call changed, every row's tail past the own k is -1 so the attention may read index_topk picks per row.
 * - A merged router row is re-weighted from the own router logits (route_reweight), the other rows keep the
 *   router's weights bit for bit: a row that agrees with the dump leaves the step unchanged.
 * - Following stops for good at the first position whose token is not the dump's (or past its tokens), checked
 *   per call before the layers, as the CPU checks per forward call.
 * - Layer-local replay (g->replay) runs on the candidate's top-k and router rows through the same merge (choice_row,
 *   the CPU's): a top-k row of -1 only is no choice.
 * Deterministic: every sum has a fixed order (one thread per output element, j ascending); no atomics.
 */
#include "dsv4/dsv4_opt.h"
#include "ref_gpu_model.cuh"

#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))

static unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

/* ------------------------------------------------------------------------------------------ roundings */
__global__ static void emu_round_kernel(float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = dsv4_ref_gpu_bf16_round(x[i]);
}

extern "C" int dsv4_ref_gpu_emu_round(float *x, size_t n)
{
    if (n == 0) return 0;
    emu_round_kernel<<<blocks_for(n, 256), 256>>>(x, n);
    DSV4_REF_LAUNCH_CHECK("emu_round");
    return 0;
}

__global__ static void moe_scale_round_kernel(float *h, const int32_t *slot, const float *w, int nk, int NI)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nk * NI) return;
    size_t i = t / NI, c = t % NI;
    float *v = h + (size_t)slot[i] * NI + c;
    *v = dsv4_ref_gpu_bf16_round(FMUL(*v, w[i]));
}

extern "C" int dsv4_ref_gpu_moe_scale_round(float *h, const int32_t *slot, const float *w, int nk, int NI)
{
    size_t n = (size_t)nk * NI;
    if (n == 0) return 0;
    moe_scale_round_kernel<<<blocks_for(n, 256), 256>>>(h, slot, w, nk, NI);
    DSV4_REF_LAUNCH_CHECK("moe_scale_round");
    return 0;
}

__global__ static void moe_sum_kernel(float *fo, const float *y, const int32_t *slot, int S, int k, int D)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)S * D) return;
    size_t s = t / D, d = t % D;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc = FADD(acc, y[(size_t)slot[s * k + j] * D + d]);
    fo[t] = FADD(acc, fo[t]);
}

extern "C" int dsv4_ref_gpu_moe_sum(float *fo, const float *y, const int32_t *slot, int S, int k, int D)
{
    size_t n = (size_t)S * D;
    if (n == 0) return 0;
    moe_sum_kernel<<<blocks_for(n, 256), 256>>>(fo, y, slot, S, k, D);
    DSV4_REF_LAUNCH_CHECK("moe_sum");
    return 0;
}

/* ----------------------------------------------------------------------------------- decision following */
/* Is position p following the dump? Until the first position whose token is not the dump's. */
static int follow_on(const dsv4_ref_gpu *g, int p) { return g->follow && (g->follow_stop < 0 || p < g->follow_stop); }

/* The choice row to run on at (L, p) instead of the own one: the follow table's, or the replayed candidate's (a top-k
 * row of -1 only is no choice); NULL: keep the own. The CPU's choice_row (ref_forward.c). */
static const int32_t *choice_row(const dsv4_ref_gpu *g, dsv4_opt_follow_kind kind, int L, int p, int k)
{
    if (follow_on(g, p)) return dsv4_opt_follow_row(g->follow, kind, L, p);
    if (!g->replay) return NULL;
    const int32_t *row = (const int32_t *)dsv4_ref_replay_row(
        g->replay, kind == DSV4_OPT_FOLLOW_TOPK ? DSV4_REF_REPLAY_TOPK : DSV4_REF_REPLAY_ROUTER, L, p);
    for (int j = 0; row && j < k; j++)
        if (row[j] != -1) return row;
    return NULL;
}

void ref_gpu_follow_start(dsv4_ref_gpu *g, int p0, const int32_t *tokens, int S)
{
    if (!g->follow) return;
    int nt;
    const int32_t *ft = dsv4_opt_follow_tokens(g->follow, &nt);
    for (int s = 0; s < S && g->follow_stop < 0; s++)
        if (p0 + s >= nt || ft[p0 + s] != tokens[s]) g->follow_stop = g->fstats.stopped_at = p0 + s;
}

int ref_gpu_follow_topk(dsv4_ref_gpu *g, int L, int p0, int S, int k)
{
    const int tk = g->topk;
    int any = 0;
    for (int s = 0; s < S && !any; s++) any = choice_row(g, DSV4_OPT_FOLLOW_TOPK, L, p0 + s, tk) != NULL;
    if (!any) return k;
    int32_t *h = g->h_ftopk; /* [S, tk]: the own picks, k per row */
    if (k > 0)
        DSV4_REF_CUDA_CHECK(cudaMemcpy(h, g->sc.topk, (size_t)S * tk * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int changed = 0;
    for (int s = 0; s < S; s++) {
        const int32_t *row = choice_row(g, DSV4_OPT_FOLLOW_TOPK, L, p0 + s, tk);
        int32_t *idx = h + (size_t)s * tk;
        for (int i = k; i < tk; i++) idx[i] = -1; /* the row as wide as the dump's (the attention skips -1) */
        if (!row) continue;
        g->fstats.topk_rows++;
        if (dsv4_ref_follow_merge(idx, row, tk, g->h_fmerge)) {
            changed = 1;
            g->fstats.topk_changed++;
        }
    }
    if (!changed) return k;
    DSV4_REF_CUDA_CHECK(cudaMemcpy(g->sc.topk, h, (size_t)S * tk * sizeof(int32_t), cudaMemcpyHostToDevice));
    return tk;
}

int ref_gpu_follow_router(dsv4_ref_gpu *g, int L, int p0, int S)
{
    const dsv4_config *f = &g->cfg;
    const int k = f->num_experts_per_tok;
    int changed = 0;
    for (int s = 0; s < S; s++) {
        const int32_t *row = choice_row(g, DSV4_OPT_FOLLOW_ROUTER, L, p0 + s, k);
        g->h_rflag[s] = 0;
        if (!row) continue;
        g->fstats.router_rows++;
        if (!dsv4_ref_follow_merge(g->h_rids + (size_t)s * k, row, k, g->h_fmerge)) continue;
        g->h_rflag[s] = 1;
        g->fstats.router_changed++;
        changed = 1;
    }
    if (!changed) return 0;
    gpu_scratch *sc = &g->sc;
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->rids, g->h_rids, (size_t)S * k * sizeof(int32_t), cudaMemcpyHostToDevice));
    DSV4_REF_CUDA_CHECK(cudaMemcpy(sc->rflag, g->h_rflag, (size_t)S * sizeof(int32_t), cudaMemcpyHostToDevice));
    return dsv4_ref_gpu_route_reweight(sc->rlogits, S, f->n_routed_experts, k, sc->rids, sc->rflag,
                                       (float)f->routed_scaling_factor, sc->rw);
}
