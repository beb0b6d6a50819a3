/* opt_serve_stats.c - the workload of a serving run and its metrics (dsv4_serve.h; issue 37). Host code only.
 *
 * The definitions are vLLM's `bench serve` (vllm/benchmarks/serve.py), which SGLang's `bench_serving` shares:
 *   TTFT  = first output token - arrival;
 *   TPOT  = (E2EL - TTFT) / (output_len - 1), per request, requests with one output token left out;
 *   ITL   = every gap between consecutive output tokens of a request, pooled over the requests (here each step
 *           yields at most one token per request, so a gap is one step or more: no speculative chunks);
 *   E2EL  = last output token - arrival;
 *   duration = from the first arrival to the last finish; throughputs are totals over it (total = input + output).
 * Percentiles interpolate linearly between order statistics (numpy.percentile's default), which both tools use.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_serve.h"

/* splitmix64's output mixer */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64: one 64-bit state, the same sequence on every machine */
static uint64_t next_u64(uint64_t *state) { return mix64(*state += 0x9E3779B97F4A7C15ull); }

/* uniform in [lo, hi], by rejection (no modulo bias) */
static int uniform_int(uint64_t *state, int lo, int hi)
{
    const uint64_t span = (uint64_t)(hi - lo) + 1, limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do
        x = next_u64(state);
    while (x >= limit);
    return lo + (int)(x % span);
}

/* in (0, 1]: never 0, so that -log(u) is finite */
static double uniform_open(uint64_t *state) { return ((double)(next_u64(state) >> 11) + 1.0) / 9007199254740992.0; }

int dsv4_serve_workload(const dsv4_serve_workload_spec *w, dsv4_serve_request *reqs, char *err, size_t errlen)
{
#define BAD(...) (snprintf(err, errlen, __VA_ARGS__), DSV4_ERR_USAGE)
    if (w->n_requests < 1)
        return BAD("--requests: %d; at least 1 request is needed", w->n_requests);
    if (w->input_min < 1 || w->input_max < w->input_min)
        return BAD("--input-len: %d..%d is not a range of lengths >= 1", w->input_min, w->input_max);
    if (w->output_min < 1 || w->output_max < w->output_min)
        return BAD("--output-len: %d..%d is not a range of lengths >= 1 (an output of 0 tokens has no first token "
                   "to time)", w->output_min, w->output_max);
    if (isnan(w->rate))
        return BAD("--rate: not a number");
#undef BAD
    uint64_t state = w->seed;
    double t = 0;
    const int all_at_once = !(w->rate > 0) || isinf(w->rate);
    for (int i = 0; i < w->n_requests; i++) {
        reqs[i].input_len = uniform_int(&state, w->input_min, w->input_max);
        reqs[i].output_len = uniform_int(&state, w->output_min, w->output_max);
        if (!all_at_once && i > 0)
            t += -log(uniform_open(&state)) / w->rate; /* exponential gaps: Poisson arrivals */
        reqs[i].arrival_s = all_at_once ? 0 : t;
    }
    return DSV4_OK;
}

int32_t dsv4_serve_prompt_token(uint64_t seed, int request, int pos, int vocab)
{
    const uint64_t key = (uint64_t)request << 32 | (uint32_t)pos;
    return (int32_t)(mix64(seed * 0x9E3779B97F4A7C15ull ^ key) % (uint64_t)vocab);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* numpy.percentile(x, q), method "linear": the order statistic at rank q/100 * (n - 1), interpolated */
static double percentile_sorted(const double *x, int n, double q)
{
    const double rank = q / 100.0 * (n - 1);
    const int lo = (int)floor(rank);
    const int hi = lo + 1 < n ? lo + 1 : lo;
    return x[lo] + (rank - lo) * (x[hi] - x[lo]);
}

void dsv4_serve_dist_of(double *x, int n, dsv4_serve_dist *d)
{
    d->n = n;
    d->mean = d->median = d->p99 = d->max = 0;
    if (n <= 0)
        return;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += x[i];
    d->mean = sum / n;
    d->median = percentile_sorted(x, n, 50);
    d->p99 = percentile_sorted(x, n, 99);
    d->max = x[n - 1];
}

int dsv4_serve_metrics_compute(const dsv4_serve_request *reqs, const dsv4_serve_timeline *const *tl, int n,
                               dsv4_serve_metrics *m)
{
    long long n_gaps = 0;
    double t0 = INFINITY, t1 = -INFINITY;
    *m = (dsv4_serve_metrics){0};
    m->n_requests = n;
    for (int i = 0; i < n; i++) {
        if (tl[i]->n_tokens_out != reqs[i].output_len || !isfinite(tl[i]->finished_s))
            return DSV4_ERR_USAGE;
        n_gaps += reqs[i].output_len - 1;
        m->input_tokens += reqs[i].input_len;
        m->output_tokens += reqs[i].output_len;
        t0 = fmin(t0, reqs[i].arrival_s);
        t1 = fmax(t1, tl[i]->finished_s);
    }
    const size_t scratch = (size_t)(n_gaps > 4LL * n ? n_gaps : 4LL * n);
    double *buf = malloc((scratch > 0 ? scratch : 1) * sizeof *buf);
    if (!buf)
        return DSV4_ERR_NOMEM;
    m->duration_s = n > 0 ? t1 - t0 : 0;
    if (m->duration_s > 0) {
        m->request_throughput = n / m->duration_s;
        m->input_throughput = (double)m->input_tokens / m->duration_s;
        m->output_throughput = (double)m->output_tokens / m->duration_s;
        m->total_throughput = (double)(m->input_tokens + m->output_tokens) / m->duration_s;
    }
    for (int i = 0; i < n; i++)
        buf[i] = tl[i]->first_token_s - reqs[i].arrival_s;
    dsv4_serve_dist_of(buf, n, &m->ttft);
    for (int i = 0; i < n; i++)
        buf[i] = tl[i]->finished_s - reqs[i].arrival_s;
    dsv4_serve_dist_of(buf, n, &m->e2el);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (reqs[i].output_len >= 2)
            buf[k++] = (tl[i]->finished_s - tl[i]->first_token_s) / (reqs[i].output_len - 1);
    dsv4_serve_dist_of(buf, k, &m->tpot);
    long long g = 0;
    for (int i = 0; i < n; i++)
        for (int t = 1; t < reqs[i].output_len; t++)
            buf[g++] = tl[i]->token_s[t] - tl[i]->token_s[t - 1];
    dsv4_serve_dist_of(buf, (int)g, &m->itl);
    free(buf);
    return DSV4_OK;
}
