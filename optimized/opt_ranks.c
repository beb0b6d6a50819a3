/* opt_ranks.c - `--gpus N`: the optimized path as N tensor/expert-parallel ranks over NCCL in one process
 * (docs/multigpu.md). One thread per rank and call (init, step), each with its cudaSetDevice; one non-blocking
 * NCCL communicator per GPU from one ncclGetUniqueId; every rank is a whole struct dsv4_opt holding its shard
 * (opt_layout.c carves the ranges of dsv4_ref_shard_partition), and the public handle is rank 0's object, which
 * owns the others. The step itself only gains the three all-reduces (opt_step.c: attn_out, indexer_scores, ffn_out).
 *
 * Invariants that fail quietly:
 * - Every rank issues the same collectives in the same order: their number and sizes depend only on (C, the
 *   buckets of the live entry counts), which come from the host positions, identical on every rank.
 * - All-reduces are fp32 sums in place (ncclFloat32, ncclSum). NCCL delivers one reduced result to every rank,
 *   so the top-k and the routing computed from it are identical everywhere (to be confirmed at N > 1: docs).
 *   At N = 1 the all-reduce is an identity, so --gpus 1 gives the plain path's bits.
 * - No host wait can hang: a communicator never blocks (blocking = 0), every NCCL call that answers
 *   ncclInProgress is polled with ncclCommGetAsyncError, and every stream wait polls an event, the
 *   communicator's async error and the group's abort flag under a deadline (DSV4_NCCL_TIMEOUT_S, default 60 s).
 *   The first failing rank sets the abort flag; every rank then aborts its own communicator (which ends NCCL
 *   kernels in flight) and returns; the handle is then unusable except for dsv4_opt_free.
 * - dsv4_last_error is per thread: a rank thread copies its message into its opt_rank before it ends; the caller
 *   sees "rank r (GPU r): <message>" of the first rank that failed (not the ranks it took down with it).
 * - Emulation (DSV4_NCCL_EMULATE_ONE_GPU=1, tests only, never a transport of `--gpus N` runs): the N ranks share
 *   GPU 0, no communicator exists, and opt_allreduce sums the ranks' partials on the host in rank order; so the
 *   sharded loads, expert ranges and partial sums are checked on a one-GPU machine (steps run eagerly).
 * - Replica check (DSV4_NCCL_REPLICA_CHECK=1, debug): after each step every rank hashes its residual streams on
 *   the host (one process: no collective needed); any divergence of top-k, routing or sums changes them.
 * - Graphs: a rank captures its step with the NCCL calls inside (NCCL >= 2.9 supports capture). Timing events
 *   are recorded only in eager steps (opt_ranks_eager), so a timed run never mixes events into graphs.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "opt_internal.h"
#include "reference/ref_shard.h"

#ifdef DSV4_HAVE_NCCL
#include <nccl.h>

enum { OPT_TIMED_MAX = 1024 }; /* timed collectives per rank and step (107 at Flash) */

struct opt_rank {
    struct opt_ranks *g;
    int rank;
    int dev;               /* its GPU: rank, or 0 when emulated */
    float *ebuf;           /* emulation: [2·e_floats] host partial, then the rank's copy of the sum */
    ncclComm_t comm;       /* NULL once aborted or destroyed */
    cudaEvent_t done;      /* the marker every stream wait polls (no timing) */
    cudaEvent_t *t_ev;     /* [2·OPT_TIMED_MAX] start/stop pairs while timing; NULL otherwise */
    int n_t;               /* collectives of the current step */
    size_t last_bytes;     /* the last collective enqueued, for the timeout message */
    int last_L;
    const char *last_what;
    double us_step;        /* time inside the timed collectives of the last step */
    uint16_t *rbuf;        /* replica check: host copy of the rank's residual streams [C, n, D] bf16 */
    uint64_t hash;         /* and its FNV-1a hash after the last step */
    pthread_t th;
    int rc;                /* the thread's result and message */
    char msg[768];
};

struct opt_ranks {
    int n;
    dsv4_opt **o;          /* [n]; o[0] is the public handle */
    struct opt_rank *rk;   /* [n] */
    double timeout_s;
    /* tests: DSV4_NCCL_INJECT_STALL=1 (STALL_STREAM) holds rank 0's stream in a host function before its first
     * collective; =wait (STALL_WAIT) makes rank 0's waits see an idle stream as busy. The sanitizers make the
     * host wait for a held stream, so only STALL_WAIT reaches the deadline under them (docs/robustness.md). */
    int stall;
    int replica;           /* DSV4_NCCL_REPLICA_CHECK=1: compare every rank's residual streams after each step */
    /* DSV4_NCCL_EMULATE_ONE_GPU=1 (tests only): every rank on GPU 0 without NCCL, the all-reduce a host sum in
     * rank order between two abortable barriers, steps eager; so the split math runs on a one-GPU machine */
    int emulate;
    size_t e_floats;
    pthread_mutex_t e_mu;
    pthread_cond_t e_cv;
    int e_count, e_gen;
    int stall_release;     /* atomic */
    int abort;             /* atomic: a rank failed; every rank aborts its communicator */
    int failed;            /* atomic: the first failing rank, -1 none */
    int broken;            /* a call failed after launching: only free is allowed */
    int timing, t_steps, t_calls;
    double t_us;
    ncclUniqueId id;
    /* the call the threads run */
    int (*body)(struct opt_rank *rk);
    const dsv4_opt_options *op;
    opt_build_fn build;
    void *ctx;
    const int32_t *tokens;
    const int32_t *n_tok;
    dsv4_probe_sink *probe;
    float *logits;
    int32_t *next;
};

enum { STALL_NONE, STALL_STREAM, STALL_WAIT };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap(void)
{
    struct timespec t = {0, 20000}; /* 20 µs: a decode step is milliseconds */
    nanosleep(&t, NULL);
}

/* The injected stall holds the stream until an abort releases it, or for at most 5 deadlines and 10 s: a tool
 * that makes the host wait for the stream (as the sanitizers seem to) then sees a slow step, not a hang. */
static void CUDART_CB stall_fn(void *p)
{
    const struct opt_ranks *g = p;
    const double give_up = now_s() + 5 * g->timeout_s + 10;
    struct timespec t = {0, 1000000};
    while (!__atomic_load_n(&g->stall_release, __ATOMIC_ACQUIRE) && now_s() < give_up) nanosleep(&t, NULL);
}

/* Mark the group failed (the first caller is the root cause), release a test stall, abort this communicator. */
static void rank_abort(struct opt_rank *rk)
{
    struct opt_ranks *g = rk->g;
    int none = -1;
    __atomic_compare_exchange_n(&g->failed, &none, rk->rank, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    __atomic_store_n(&g->abort, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g->stall_release, 1, __ATOMIC_RELEASE);
    if (rk->comm) ncclCommAbort(rk->comm);
    rk->comm = NULL;
}

static int nccl_fail(struct opt_rank *rk, ncclResult_t r, const char *call, const char *what)
{
    const char *last = rk->comm ? ncclGetLastError(rk->comm) : "";
    int rc = dsv4_error(DSV4_ERR_CUDA, "%s: %s (%s) during %s on rank %d", call, ncclGetErrorString(r),
                        last && *last ? last : "no detail", what, rk->rank);
    rank_abort(rk);
    return rc;
}

/* A peer failed first: leave quietly (the caller reports the peer's message). */
static int peer_failed(struct opt_rank *rk, const char *what)
{
    int f = __atomic_load_n(&rk->g->failed, __ATOMIC_ACQUIRE);
    int rc = dsv4_error(DSV4_ERR_CUDA, "rank %d stopped during %s: rank %d failed", rk->rank, what, f);
    rank_abort(rk);
    return rc;
}

static int timed_out(struct opt_rank *rk, const char *what, double limit_s)
{
    int rc;
    if (rk->last_what)
        rc = dsv4_error(DSV4_ERR_CUDA, "%s did not complete within %g s (DSV4_NCCL_TIMEOUT_S; the last collective "
                        "enqueued: all-reduce '%s' of layer %d, %zu bytes): timed out on rank %d; communicators "
                        "aborted", what, limit_s, rk->last_what, rk->last_L, rk->last_bytes, rk->rank);
    else
        rc = dsv4_error(DSV4_ERR_CUDA, "%s did not complete within %g s (DSV4_NCCL_TIMEOUT_S): timed out on rank %d; "
                        "communicators aborted", what, limit_s, rk->rank);
    rank_abort(rk);
    return rc;
}

/* Poll the communicator until its pending call (init, an enqueue) is done: success, an error, a peer's
 * failure or the deadline, limit_s from now. */
static int settle(struct opt_rank *rk, const char *what, double limit_s)
{
    const double deadline = now_s() + limit_s;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(rk->comm, &st);
        if (r != ncclSuccess) return nccl_fail(rk, r, "ncclCommGetAsyncError", what);
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_fail(rk, st, "ncclCommGetAsyncError", what);
        if (__atomic_load_n(&rk->g->abort, __ATOMIC_ACQUIRE)) return peer_failed(rk, what);
        if (now_s() > deadline) return timed_out(rk, what, limit_s);
        nap();
    }
}

/* Emulation: all N rank threads meet (or one saw a failure, or the deadline passed). */
static int emu_barrier(struct opt_rank *rk, const char *what)
{
    struct opt_ranks *g = rk->g;
    const double deadline = now_s() + g->timeout_s;
    int why = 0;
    pthread_mutex_lock(&g->e_mu);
    const int gen = g->e_gen;
    if (++g->e_count == g->n) {
        g->e_count = 0, g->e_gen++;
        pthread_cond_broadcast(&g->e_cv);
    }
    while (g->e_gen == gen && !why) {
        if (__atomic_load_n(&g->abort, __ATOMIC_ACQUIRE)) why = 1;
        else if (now_s() > deadline) why = 2;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000; /* re-check the abort flag every 10 ms */
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        if (!why) pthread_cond_timedwait(&g->e_cv, &g->e_mu, &ts);
    }
    pthread_mutex_unlock(&g->e_mu);
    if (why == 1) return peer_failed(rk, what);
    if (why == 2) return timed_out(rk, what, g->timeout_s);
    return 0;
}

/* Emulation: every rank's partial to the host, the sum in rank order 0..N-1 by every rank (the same order, so
 * the same bits everywhere), back to the device. */
static int emu_allreduce(struct opt_rank *rk, dsv4_opt *o, float *buf, size_t n, const char *label)
{
    struct opt_ranks *g = rk->g;
    if (n > g->e_floats)
        return dsv4_error(DSV4_ERR_USAGE, "%s: %zu floats for an emulation buffer of %zu", label, n, g->e_floats);
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    DSV4_OPT_CUDA(cudaMemcpyAsync(rk->ebuf, buf, n * sizeof(float), cudaMemcpyDeviceToHost, o->stream));
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    DSV4_TRY(emu_barrier(rk, label));
    float *sum = rk->ebuf + g->e_floats;
    for (size_t i = 0; i < n; i++) {
        float a = g->rk[0].ebuf[i];
        for (int r = 1; r < g->n; r++) a += g->rk[r].ebuf[i];
        sum[i] = a;
    }
    DSV4_TRY(emu_barrier(rk, label)); /* no partial is overwritten before every rank has summed */
    /* On the rank's own stream, then waited for: a cudaMemcpy from pageable memory may return before its DMA
     * lands, and o->stream is non-blocking, so the next probe copy could read the old partial (it did, once). */
    DSV4_OPT_CUDA(cudaMemcpyAsync(buf, sum, n * sizeof(float), cudaMemcpyHostToDevice, o->stream));
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    return 0;
}

int opt_wait(dsv4_opt *o, const char *what)
{
    if (!o->rk || o->rk->g->emulate) {
        DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
        return 0;
    }
    struct opt_rank *rk = o->rk;
    char label[96];
    snprintf(label, sizeof label, "waiting for %s", what);
    if (!rk->comm) return dsv4_error(DSV4_ERR_CUDA, "rank %d: the communicator was aborted", rk->rank);
    DSV4_OPT_CUDA(cudaEventRecord(rk->done, o->stream));
    const double deadline = now_s() + rk->g->timeout_s;
    for (;;) {
        cudaError_t e = cudaEventQuery(rk->done);
        if (e == cudaSuccess && rk->g->stall == STALL_WAIT && rk->rank == 0) e = cudaErrorNotReady;
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            int rc = dsv4_error(DSV4_ERR_CUDA, "%s: %s on rank %d", label, cudaGetErrorString(e), rk->rank);
            rank_abort(rk);
            return rc;
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(rk->comm, &st);
        if (r != ncclSuccess) return nccl_fail(rk, r, "ncclCommGetAsyncError", label);
        if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(rk, st, "a collective", label);
        if (__atomic_load_n(&rk->g->abort, __ATOMIC_ACQUIRE)) return peer_failed(rk, label);
        if (now_s() > deadline) return timed_out(rk, label, rk->g->timeout_s);
        nap();
    }
}

int opt_allreduce(dsv4_opt *o, float *buf, size_t n, int L, const char *what)
{
    struct opt_rank *rk = o->rk;
    if (!rk) return 0;
    struct opt_ranks *g = rk->g;
    char label[96];
    snprintf(label, sizeof label, "all-reduce '%s' of layer %d", what, L);
    if (g->emulate) {
        rk->n_t++;
        rk->last_what = what, rk->last_L = L, rk->last_bytes = n * sizeof(float);
        return emu_allreduce(rk, o, buf, n, label);
    }
    if (!rk->comm) return dsv4_error(DSV4_ERR_CUDA, "%s: rank %d's communicator was aborted", label, rk->rank);
    if (g->stall == STALL_STREAM && rk->rank == 0 && rk->n_t == 0)
        DSV4_OPT_CUDA(cudaLaunchHostFunc(o->stream, stall_fn, g));
    const int timed = rk->t_ev && rk->n_t < OPT_TIMED_MAX;
    if (timed) DSV4_OPT_CUDA(cudaEventRecord(rk->t_ev[2 * rk->n_t], o->stream));
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, rk->comm, o->stream);
    if (r == ncclInProgress) DSV4_TRY(settle(rk, label, g->timeout_s));
    else if (r != ncclSuccess) return nccl_fail(rk, r, "ncclAllReduce", label);
    if (timed) DSV4_OPT_CUDA(cudaEventRecord(rk->t_ev[2 * rk->n_t + 1], o->stream));
    rk->n_t++;
    rk->last_what = what, rk->last_L = L, rk->last_bytes = n * sizeof(float);
    return 0;
}

int opt_ranks_eager(const dsv4_opt *o) { return o->rk && (o->rk->g->timing || o->rk->g->emulate); }

/* ------------------------------------------------------------------------------------ the threads */
static void *rank_thread(void *arg)
{
    struct opt_rank *rk = arg;
    cudaError_t e = cudaSetDevice(rk->dev);
    rk->rc = e == cudaSuccess ? rk->g->body(rk)
                              : dsv4_error(DSV4_ERR_CUDA, "cudaSetDevice(%d): %s", rk->dev, cudaGetErrorString(e));
    if (rk->rc) {
        snprintf(rk->msg, sizeof rk->msg, "%s", dsv4_last_error());
        rank_abort(rk); /* no-op for a rank already aborted; wakes the others otherwise */
    }
    return NULL;
}

/* Run g->body on every rank, one thread each; the first failing rank's error, prefixed with its rank. */
static int run_ranks(struct opt_ranks *g)
{
    g->failed = -1;
    int started = 0, rc = 0;
    for (int r = 0; r < g->n; r++, started++) {
        g->rk[r].rc = 0;
        g->rk[r].msg[0] = 0;
        if (pthread_create(&g->rk[r].th, NULL, rank_thread, &g->rk[r])) {
            rc = dsv4_error(DSV4_ERR_NOMEM, "--gpus %d: cannot start the thread of rank %d", g->n, r);
            __atomic_store_n(&g->abort, 1, __ATOMIC_RELEASE); /* the started ranks stop at their next poll */
            break;
        }
    }
    for (int r = 0; r < started; r++) pthread_join(g->rk[r].th, NULL);
    if (rc) return rc;
    int f = g->failed;
    if (f < 0)
        for (int r = 0; r < g->n && f < 0; r++)
            if (g->rk[r].rc) f = r;
    if (f < 0) return 0;
    return dsv4_error(g->rk[f].rc, "rank %d (GPU %d): %s", f, g->rk[f].dev, g->rk[f].msg); /* emulated: all 0 */
}

static int init_body(struct opt_rank *rk)
{
    struct opt_ranks *g = rk->g;
    if (!g->emulate) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0; /* no NCCL call may block the host: see settle */
        ncclResult_t r = ncclCommInitRankConfig(&rk->comm, g->n, g->id, rk->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(rk, r, "ncclCommInitRankConfig", "init");
        /* NCCL's setup (topology, transports) may take longer than a collective may: at least 5 minutes */
        DSV4_TRY(settle(rk, "ncclCommInitRankConfig", g->timeout_s > 300 ? g->timeout_s : 300));
    }
    dsv4_opt_options op = *g->op;
    op.device = rk->dev;
    DSV4_TRY(g->build(g->ctx, &op, rk->rank, g->n, &g->o[rk->rank]));
    g->o[rk->rank]->rk = rk;
    DSV4_OPT_CUDA(cudaEventCreateWithFlags(&rk->done, cudaEventDisableTiming));
    if (g->replica) {
        const dsv4_opt *o = g->o[rk->rank];
        rk->rbuf = malloc((size_t)o->C * o->n * o->D * 2);
        if (!rk->rbuf) return dsv4_error(DSV4_ERR_NOMEM, "replica check: out of host memory");
    }
    if (g->emulate) { /* the largest all-reduce: [C, D] or the index scores [C, pool_cap_csa] */
        rk->ebuf = malloc(2 * g->e_floats * sizeof(float));
        if (!rk->ebuf) return dsv4_error(DSV4_ERR_NOMEM, "emulated ranks: out of host memory");
    }
    return 0;
}

static int step_body(struct opt_rank *rk)
{
    struct opt_ranks *g = rk->g;
    const int r0 = rk->rank == 0;
    rk->n_t = 0;
    rk->last_what = NULL;
    DSV4_TRY(opt_step_rank(g->o[rk->rank], g->tokens, g->n_tok, r0 ? g->probe : NULL, r0 ? g->logits : NULL,
                               r0 ? g->next : NULL));
    if (rk->rbuf) { /* replica check: the replicated state every later step reads, hashed on the host */
        const dsv4_opt *o = g->o[rk->rank];
        const size_t n = (size_t)o->C * o->n * o->D;
        DSV4_OPT_CUDA(cudaMemcpyAsync(rk->rbuf, o->X, n * 2, cudaMemcpyDeviceToHost, o->stream)); /* its stream */
        DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
        uint64_t h = 1469598103934665603ull;
        const unsigned char *b = (const unsigned char *)rk->rbuf;
        for (size_t i = 0; i < n * 2; i++) h = (h ^ b[i]) * 1099511628211ull;
        rk->hash = h;
    }
    rk->us_step = 0;
    for (int i = 0; rk->t_ev && i < rk->n_t && i < OPT_TIMED_MAX; i++) {
        float ms = 0;
        DSV4_OPT_CUDA(cudaEventElapsedTime(&ms, rk->t_ev[2 * i], rk->t_ev[2 * i + 1]));
        rk->us_step += 1e3 * ms;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------ the handle */
static int parse_timeout(double *out)
{
    const char *v = getenv("DSV4_NCCL_TIMEOUT_S");
    *out = 60.0;
    if (!v || !*v) return 0;
    char *end = NULL;
    double t = strtod(v, &end);
    if (!end || *end || !(t > 0) || !isfinite(t))
        return dsv4_error(DSV4_ERR_USAGE, "DSV4_NCCL_TIMEOUT_S '%s': want a number of seconds > 0", v);
    *out = t;
    return 0;
}

/* The test switches: an unknown value is a usage error, not a silently ignored one. */
static int parse_flag(const char *name, int *out)
{
    const char *v = getenv(name);
    *out = v && !strcmp(v, "1");
    if (!v || !*v || !strcmp(v, "0") || *out) return 0;
    return dsv4_error(DSV4_ERR_USAGE, "%s '%s': want 0 or 1", name, v);
}

static int parse_stall(int *out)
{
    const char *v = getenv("DSV4_NCCL_INJECT_STALL");
    *out = !v || !*v || !strcmp(v, "0") ? STALL_NONE : !strcmp(v, "1") ? STALL_STREAM
                                                       : !strcmp(v, "wait") ? STALL_WAIT : -1;
    if (*out >= 0) return 0;
    return dsv4_error(DSV4_ERR_USAGE, "DSV4_NCCL_INJECT_STALL '%s': want 0, 1 (hold the stream) or wait", v);
}

int opt_ranks_init(const dsv4_config *cfg, const dsv4_opt_options *op, opt_build_fn build, void *ctx,
                   dsv4_opt **out)
{
    *out = NULL;
    const int N = op->n_gpus;
    DSV4_CHECK(op->device == 0, "%d ranks with dsv4_opt_options.device %d: the ranks use GPUs 0..%d", N,
               op->device, N - 1);
    int n_dev = 0;
    const char *dev_err = NULL; /* why there are none, for the plan's message */
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess) {
        n_dev = 0; /* no driver or no device: the plan says how many were asked */
        dev_err = cudaGetErrorString(ce);
        cudaGetLastError();
    }
    int emulate, stall, replica;
    DSV4_TRY(parse_flag("DSV4_NCCL_EMULATE_ONE_GPU", &emulate));
    DSV4_TRY(parse_flag("DSV4_NCCL_REPLICA_CHECK", &replica));
    DSV4_TRY(parse_stall(&stall));
    emulate = emulate && n_dev >= 1;
    /* before any device work: the divisibility and the device count (emulated: all on GPU 0) */
    const int plan_rc = dsv4_ref_shard_plan(cfg, N, emulate ? N : n_dev, NULL);
    if (plan_rc && dev_err) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dsv4_last_error()); /* not the sink's own buffer as an argument */
        return dsv4_error(plan_rc, "%s (cudaGetDeviceCount: %s)", msg, dev_err);
    }
    if (plan_rc) return plan_rc;
    double timeout;
    DSV4_TRY(parse_timeout(&timeout));
    struct opt_ranks *g = calloc(1, sizeof *g);
    if (g) g->o = calloc((size_t)N, sizeof *g->o);
    if (g) g->rk = calloc((size_t)N, sizeof *g->rk);
    if (!g || !g->o || !g->rk) {
        if (g) free(g->o), free(g->rk);
        free(g);
        return dsv4_error(DSV4_ERR_NOMEM, "--gpus %d: out of host memory", N);
    }
    g->n = N;
    g->timeout_s = timeout;
    g->emulate = emulate;
    if (emulate) {
        int cap = 1; /* the largest CSA pool, as the caches are sized */
        for (int L = 0; L < cfg->num_hidden_layers; L++)
            if (cfg->attn_type[L] == DSV4_ATTN_CSA && opt_pool_capacity(op->max_context, cfg->compress_ratio[L]) > cap)
                cap = opt_pool_capacity(op->max_context, cfg->compress_ratio[L]);
        const int rows = op->max_step_tokens > op->n_seq ? op->max_step_tokens : op->n_seq; /* the step budget */
        g->e_floats = (size_t)rows * (size_t)(cap > cfg->hidden_size ? cap : cfg->hidden_size);
    }
    pthread_mutex_init(&g->e_mu, NULL);
    pthread_cond_init(&g->e_cv, NULL);
    g->stall = stall;
    g->replica = replica;
    for (int r = 0; r < N; r++) g->rk[r].g = g, g->rk[r].rank = r, g->rk[r].dev = emulate ? 0 : r;
    ncclResult_t nr = emulate ? ncclSuccess : ncclGetUniqueId(&g->id);
    int rc = nr == ncclSuccess ? 0 : dsv4_error(DSV4_ERR_CUDA, "ncclGetUniqueId: %s", ncclGetErrorString(nr));
    if (!rc) {
        g->body = init_body, g->op = op, g->build = build, g->ctx = ctx;
        rc = run_ranks(g);
    }
    if (rc) {
        g->broken = 1; /* abort what was made */
        opt_ranks_free(g);
        return rc;
    }
    dsv4_opt *h = g->o[0];
    h->group = g;
    size_t len = strlen(h->producer);
    if (emulate)
        snprintf(h->producer + len, sizeof h->producer - len, " gpus=%d emulated-on-one-gpu", N);
    else
        snprintf(h->producer + len, sizeof h->producer - len, " gpus=%d nccl=%d.%d.%d", N, NCCL_MAJOR, NCCL_MINOR,
                 NCCL_PATCH);
    *out = h;
    return 0;
}

int opt_ranks_usable(const struct opt_ranks *g)
{
    if (g->broken)
        return dsv4_error(DSV4_ERR_CUDA, "--gpus %d: an earlier collective failed and the communicators were "
                          "aborted; free the handle", g->n);
    return 0;
}

int opt_ranks_step(struct opt_ranks *g, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                   float *logits, int32_t *next)
{
    DSV4_TRY(opt_ranks_usable(g));
    g->body = step_body, g->tokens = tokens, g->n_tok = n_tok, g->probe = probe, g->logits = logits,
    g->next = next;
    int rc = run_ranks(g);
    if (rc) {
        g->broken = 1;
        return rc;
    }
    for (int r = 1; g->replica && r < g->n; r++)
        if (g->rk[r].hash != g->rk[0].hash)
            return dsv4_error(DSV4_ERR_CUDA, "replica check (DSV4_NCCL_REPLICA_CHECK): rank %d's residual streams "
                              "differ from rank 0's after this step (sequence 0 now at position %d): the ranks no "
                              "longer compute the same replicated state", r, g->o[0]->pos[0]);
    if (g->timing) {
        double worst = 0;
        for (int r = 0; r < g->n; r++)
            if (g->rk[r].us_step > worst) worst = g->rk[r].us_step;
        g->t_us += worst, g->t_calls = g->rk[0].n_t, g->t_steps++;
    }
    return 0;
}

int opt_ranks_each(struct opt_ranks *g, int (*fn)(dsv4_opt *o, void *arg), void *arg)
{
    DSV4_TRY(opt_ranks_usable(g));
    for (int r = 0; r < g->n; r++) {
        DSV4_OPT_CUDA(cudaSetDevice(g->rk[r].dev));
        int rc = fn(g->o[r], arg);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", dsv4_last_error()); /* not the sink's own buffer as an argument */
            if (r > 0) g->broken = 1; /* ranks 0..r-1 did it (a reset, a state): they no longer agree */
            return dsv4_error(rc, "rank %d (GPU %d): %s", r, g->rk[r].dev, msg);
        }
    }
    return cudaSetDevice(0) == cudaSuccess ? 0 : dsv4_error(DSV4_ERR_CUDA, "cudaSetDevice(0) failed");
}

/* One rank's timing events (on its device, which the caller has set). */
static void rank_timing_events_free(struct opt_rank *rk)
{
    for (int i = 0; rk->t_ev && i < 2 * OPT_TIMED_MAX; i++)
        if (rk->t_ev[i]) cudaEventDestroy(rk->t_ev[i]);
    free(rk->t_ev);
    rk->t_ev = NULL;
}

void opt_ranks_free(struct opt_ranks *g)
{
    if (!g) return;
    /* finalize every communicator (non-blocking: all first, then poll each), abort on failure or timeout */
    for (int r = 0; r < g->n; r++) {
        struct opt_rank *rk = &g->rk[r];
        if (!rk->comm) continue;
        cudaSetDevice(rk->dev);
        ncclResult_t fr = g->broken ? ncclInternalError : ncclCommFinalize(rk->comm);
        if (fr != ncclSuccess && fr != ncclInProgress) rank_abort(rk);
    }
    const double deadline = now_s() + g->timeout_s;
    for (int r = 0; r < g->n; r++) {
        struct opt_rank *rk = &g->rk[r];
        ncclResult_t st = ncclInProgress;
        while (rk->comm && ncclCommGetAsyncError(rk->comm, &st) == ncclSuccess && st == ncclInProgress &&
               now_s() < deadline)
            nap();
        if (rk->comm && st == ncclSuccess) {
            ncclCommDestroy(rk->comm);
            rk->comm = NULL;
        } else if (rk->comm) {
            rank_abort(rk);
        }
    }
    for (int r = 0; r < g->n; r++) {
        cudaSetDevice(g->rk[r].dev);
        if (g->o[r]) g->o[r]->group = NULL, g->o[r]->rk = NULL;
        opt_free_one(g->o[r]);
        struct opt_rank *rk = &g->rk[r];
        if (rk->done) cudaEventDestroy(rk->done);
        rank_timing_events_free(rk);
        free(rk->rbuf);
        free(rk->ebuf);
    }
    pthread_mutex_destroy(&g->e_mu);
    pthread_cond_destroy(&g->e_cv);
    cudaSetDevice(0);
    free(g->o);
    free(g->rk);
    free(g);
}

static void timing_events_free(struct opt_ranks *g)
{
    for (int r = 0; r < g->n; r++) {
        cudaSetDevice(g->rk[r].dev);
        rank_timing_events_free(&g->rk[r]);
    }
}

/* Every rank's 2·OPT_TIMED_MAX events (a rank that has them keeps them). */
static int timing_events_make(struct opt_ranks *g)
{
    for (int r = 0; r < g->n; r++) {
        struct opt_rank *rk = &g->rk[r];
        if (rk->t_ev) continue;
        DSV4_OPT_CUDA(cudaSetDevice(rk->dev));
        rk->t_ev = calloc(2 * OPT_TIMED_MAX, sizeof *rk->t_ev);
        if (!rk->t_ev) return dsv4_error(DSV4_ERR_NOMEM, "dsv4_opt_nccl_timing: out of host memory");
        for (int i = 0; i < 2 * OPT_TIMED_MAX; i++) {
            cudaError_t e = cudaEventCreate(&rk->t_ev[i]);
            if (e != cudaSuccess)
                return dsv4_error(DSV4_ERR_CUDA, "dsv4_opt_nccl_timing: cudaEventCreate: %s", cudaGetErrorString(e));
        }
    }
    return 0;
}

int dsv4_opt_nccl_timing(dsv4_opt *o, int on)
{
    DSV4_CHECK(o && o->group, "dsv4_opt_nccl_timing: a handle of --gpus N >= 1 is needed");
    struct opt_ranks *g = o->group;
    DSV4_TRY(opt_ranks_usable(g));
    DSV4_CHECK(!g->emulate, "dsv4_opt_nccl_timing: emulated ranks have no NCCL collectives to time");
    /* all ranks' events or none: a step records on every rank's events once any rank has them (step_body) */
    int rc = on ? timing_events_make(g) : 0;
    if (rc || !on) timing_events_free(g);
    if (rc) on = 0;
    if (cudaSetDevice(0) != cudaSuccess && !rc) rc = dsv4_error(DSV4_ERR_CUDA, "cudaSetDevice(0) failed");
    g->timing = on != 0;
    g->t_us = 0, g->t_calls = 0, g->t_steps = 0;
    return rc;
}

int dsv4_opt_nccl_time(const dsv4_opt *o, double *us, int *calls_per_step, int *steps)
{
    DSV4_CHECK(o && o->group, "dsv4_opt_nccl_time: a handle of --gpus N >= 1 is needed");
    if (us) *us = o->group->t_us;
    if (calls_per_step) *calls_per_step = o->group->t_calls;
    if (steps) *steps = o->group->t_steps;
    return 0;
}

#else /* a CUDA build without NCCL: the plain path only */

int opt_ranks_init(const dsv4_config *cfg, const dsv4_opt_options *op, opt_build_fn build, void *ctx,
                   dsv4_opt **out)
{
    (void)cfg, (void)build, (void)ctx;
    *out = NULL;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "--gpus %d: this build has no NCCL (CMake found no libnccl)", op->n_gpus);
}
int opt_ranks_step(struct opt_ranks *g, const int32_t *tokens, const int32_t *n_tok, dsv4_probe_sink *probe,
                   float *logits, int32_t *next)
{
    (void)g, (void)tokens, (void)n_tok, (void)probe, (void)logits, (void)next;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "this build has no NCCL");
}
int opt_ranks_usable(const struct opt_ranks *g)
{
    (void)g;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "this build has no NCCL");
}
int opt_ranks_each(struct opt_ranks *g, int (*fn)(dsv4_opt *o, void *arg), void *arg)
{
    (void)g, (void)fn, (void)arg;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "this build has no NCCL");
}
void opt_ranks_free(struct opt_ranks *g) { (void)g; }
int opt_allreduce(dsv4_opt *o, float *buf, size_t n, int L, const char *what)
{
    (void)o, (void)buf, (void)n, (void)L, (void)what;
    return 0;
}
int opt_wait(dsv4_opt *o, const char *what)
{
    (void)what;
    DSV4_OPT_CUDA(cudaStreamSynchronize(o->stream));
    return 0;
}
int opt_ranks_eager(const dsv4_opt *o)
{
    (void)o;
    return 0;
}
int dsv4_opt_nccl_timing(dsv4_opt *o, int on)
{
    (void)o, (void)on;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "this build has no NCCL");
}
int dsv4_opt_nccl_time(const dsv4_opt *o, double *us, int *calls_per_step, int *steps)
{
    (void)o, (void)us, (void)calls_per_step, (void)steps;
    return dsv4_error(DSV4_ERR_UNSUPPORTED, "this build has no NCCL");
}
#endif
