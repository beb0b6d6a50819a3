/* opt_sched.c - the request scheduler of serving runs (dsv4_serve.h; issue 37). Host code only, no CUDA: built in
 * the CPU-only build too, so CI tests it with a simulated step.
 *
 * State per request: waiting (not admitted), running (in a slot, prompt fed up to `fed`), finished. Per step the
 * plan takes, in this order:
 *   1. admission: requests that have arrived by now, in arrival order (ties by index), into free slots, lowest
 *      slot first;
 *   2. one decode token for every running request whose prompt is fed (slot order): decodes first, so that a
 *      long prompt never stalls the requests already generating (the engines' "decode first" policy);
 *   3. prefill runs of the running requests still in their prompt, in admission order, each at most
 *      prefill_chunk tokens, while the token budget lasts (the last one may be cut to what is left).
 * The budget is at least one decode per slot (checked at init), so step 2 always fits. A request's first output
 * token comes with the run that feeds its last prompt token; a decode run yields the next. `complete` stamps the
 * step's end on every token it yielded and frees the slots of the requests that have all their tokens.
 * Steps 2 and 3 are the rule of dsv4_opt_plan_step (opt_plan.c, the chunking of `dsv4 run --path opt`), not that
 * function: it takes want == 1 for a decode and orders prompts by slot, where a 1-token prompt run must stay a
 * prefill (it yields the first token, behind the decodes) and prompts go in admission order, chunk-capped.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_serve.h"

enum { WAITING, RUNNING, FINISHED };

struct dsv4_serve_sched {
    dsv4_serve_config cfg;
    const dsv4_serve_request *reqs;
    int n;
    int *order;                 /* request indices by (arrival, index) */
    int next_waiting;           /* position in order of the first request not yet admitted */
    int *state;                 /* [n] */
    int *fed;                   /* [n] positions fed so far */
    long long *admit_seq;       /* [n] admission counter, for the prefill order */
    long long admitted;
    int *slot_req;              /* [n_slots] request in the slot, -1 free */
    dsv4_serve_timeline *tl;    /* [n] */
    double *token_store;        /* sum(output_len) doubles behind the timelines' token_s */
    dsv4_serve_run *runs;       /* [n_slots] the planned step's runs */
    int *prefill_pick;          /* [n_slots] scratch: running prompts by admission order */
    dsv4_serve_step step;
    int planned;                /* 1 between plan and complete */
    int n_finished;
    int n_steps;
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return DSV4_ERR_USAGE;
}

static const dsv4_serve_request *sort_base;
static int by_arrival(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    const double ti = sort_base[i].arrival_s, tj = sort_base[j].arrival_s;
    if (ti != tj)
        return ti < tj ? -1 : 1;
    return i < j ? -1 : i > j;
}

int dsv4_serve_sched_init(dsv4_serve_sched **out, const dsv4_serve_config *cfg, const dsv4_serve_request *reqs, int n,
                          char *err, size_t errlen)
{
    *out = NULL;
    if (n < 1)
        return fail(err, errlen, "--requests: %d requests; at least 1 is needed", n);
    if (cfg->n_slots < 1)
        return fail(err, errlen, "--concurrency: %d; at least 1 request in flight is needed", cfg->n_slots);
    if (cfg->token_budget < cfg->n_slots)
        return fail(err, errlen, "--token-budget: %d tokens a step is less than one decode for each of the %d "
                    "requests in flight (--concurrency); give at least %d", cfg->token_budget, cfg->n_slots,
                    cfg->n_slots);
    if (cfg->prefill_chunk < 1 || cfg->prefill_chunk > cfg->token_budget)
        return fail(err, errlen, "--prefill-chunk: %d is outside 1 .. %d (the token budget)", cfg->prefill_chunk,
                    cfg->token_budget);
    if (cfg->max_context < 1)
        return fail(err, errlen, "--max-context: %d; at least 1 position is needed", cfg->max_context);
    long long total_out = 0;
    for (int i = 0; i < n; i++) {
        const dsv4_serve_request *r = &reqs[i];
        if (r->input_len < 1)
            return fail(err, errlen, "--input-len: request %d has %d input tokens; at least 1 is needed", i,
                        r->input_len);
        if (r->output_len < 1)
            return fail(err, errlen, "--output-len: request %d asks for %d output tokens; at least 1 is needed", i,
                        r->output_len);
        if ((long long)r->input_len + r->output_len - 1 > cfg->max_context)
            return fail(err, errlen, "--max-context: request %d needs %lld positions (input %d + output %d - 1), "
                        "more than the maximum context of %d", i, (long long)r->input_len + r->output_len - 1,
                        r->input_len, r->output_len, cfg->max_context);
        if (!(r->arrival_s >= 0) || !isfinite(r->arrival_s))
            return fail(err, errlen, "--rate: request %d arrives at %g s; arrivals must be finite and >= 0", i,
                        r->arrival_s);
        total_out += r->output_len;
    }
    dsv4_serve_sched *s = calloc(1, sizeof *s);
    if (!s)
        return DSV4_ERR_NOMEM;
    s->cfg = *cfg, s->reqs = reqs, s->n = n;
    s->order = malloc((size_t)n * sizeof *s->order);
    s->state = calloc((size_t)n, sizeof *s->state);
    s->fed = calloc((size_t)n, sizeof *s->fed);
    s->admit_seq = calloc((size_t)n, sizeof *s->admit_seq);
    s->slot_req = malloc((size_t)cfg->n_slots * sizeof *s->slot_req);
    s->tl = calloc((size_t)n, sizeof *s->tl);
    s->token_store = calloc((size_t)total_out, sizeof *s->token_store);
    s->runs = calloc((size_t)cfg->n_slots, sizeof *s->runs);
    s->prefill_pick = malloc((size_t)cfg->n_slots * sizeof *s->prefill_pick);
    if (!s->order || !s->state || !s->fed || !s->admit_seq || !s->slot_req || !s->tl || !s->token_store || !s->runs ||
        !s->prefill_pick) {
        dsv4_serve_sched_free(s);
        return DSV4_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++)
        s->order[i] = i;
    sort_base = reqs; /* qsort has no context argument in C11; the scheduler is set up from one thread */
    qsort(s->order, (size_t)n, sizeof *s->order, by_arrival);
    for (int j = 0; j < cfg->n_slots; j++)
        s->slot_req[j] = -1;
    double *t = s->token_store;
    for (int i = 0; i < n; i++) {
        s->state[i] = WAITING;
        s->tl[i].slot = -1;
        s->tl[i].admitted_s = s->tl[i].first_token_s = s->tl[i].finished_s = NAN;
        s->tl[i].token_s = t;
        for (int k = 0; k < reqs[i].output_len; k++)
            t[k] = NAN;
        t += reqs[i].output_len;
    }
    s->step.runs = s->runs;
    *out = s;
    return DSV4_OK;
}

void dsv4_serve_sched_free(dsv4_serve_sched *s)
{
    if (!s)
        return;
    free(s->order), free(s->state), free(s->fed), free(s->admit_seq), free(s->slot_req), free(s->tl);
    free(s->token_store), free(s->runs), free(s->prefill_pick);
    free(s);
}

static void admit(dsv4_serve_sched *s, double now_s)
{
    for (int j = 0; j < s->cfg.n_slots && s->next_waiting < s->n; j++) {
        if (s->slot_req[j] >= 0)
            continue;
        const int r = s->order[s->next_waiting];
        if (s->reqs[r].arrival_s > now_s)
            return;
        s->next_waiting++;
        s->slot_req[j] = r;
        s->state[r] = RUNNING;
        s->fed[r] = 0;
        s->admit_seq[r] = s->admitted++;
        s->tl[r].slot = j;
        s->tl[r].admitted_s = now_s;
    }
}

static void add_run(dsv4_serve_sched *s, int slot, int r, int n_tokens, int is_decode)
{
    dsv4_serve_run *u = &s->runs[s->step.n_runs++];
    u->slot = slot, u->request = r, u->first_pos = s->fed[r], u->n_tokens = n_tokens, u->is_decode = is_decode;
    u->yields_token = is_decode || s->fed[r] + n_tokens == s->reqs[r].input_len;
    u->starts = s->fed[r] == 0;
    s->step.n_tokens += n_tokens;
    if (is_decode)
        s->step.n_decode_tokens += n_tokens;
    else
        s->step.n_prefill_tokens += n_tokens;
}

int dsv4_serve_sched_plan(dsv4_serve_sched *s, double now_s, const dsv4_serve_step **step, double *next_arrival_s)
{
    *step = &s->step;
    *next_arrival_s = -1;
    s->step.n_runs = s->step.n_tokens = s->step.n_decode_tokens = s->step.n_prefill_tokens = 0;
    if (s->planned) /* a plan without its complete: a caller bug; plan nothing rather than run a step twice */
        return 0;
    admit(s, now_s);
    int budget = s->cfg.token_budget;
    int n_prompt = 0;
    for (int j = 0; j < s->cfg.n_slots; j++) { /* decodes first */
        const int r = s->slot_req[j];
        if (r < 0)
            continue;
        if (s->fed[r] >= s->reqs[r].input_len) {
            add_run(s, j, r, 1, 1);
            budget--;
        } else
            s->prefill_pick[n_prompt++] = j;
    }
    /* prompts in admission order (insertion sort: at most n_slots entries) */
    for (int a = 1; a < n_prompt; a++) {
        const int j = s->prefill_pick[a];
        int b = a - 1;
        while (b >= 0 && s->admit_seq[s->slot_req[s->prefill_pick[b]]] > s->admit_seq[s->slot_req[j]]) {
            s->prefill_pick[b + 1] = s->prefill_pick[b];
            b--;
        }
        s->prefill_pick[b + 1] = j;
    }
    for (int a = 0; a < n_prompt && budget > 0; a++) {
        const int j = s->prefill_pick[a], r = s->slot_req[j];
        int take = s->reqs[r].input_len - s->fed[r];
        if (take > s->cfg.prefill_chunk)
            take = s->cfg.prefill_chunk;
        if (take > budget)
            take = budget;
        add_run(s, j, r, take, 0);
        budget -= take;
    }
    if (s->step.n_runs == 0) {
        if (s->next_waiting < s->n)
            *next_arrival_s = s->reqs[s->order[s->next_waiting]].arrival_s;
        return 0;
    }
    s->planned = 1;
    return s->step.n_tokens;
}

void dsv4_serve_sched_complete(dsv4_serve_sched *s, double end_s)
{
    if (!s->planned)
        return;
    s->planned = 0;
    s->n_steps++;
    for (int u = 0; u < s->step.n_runs; u++) {
        const dsv4_serve_run *run = &s->runs[u];
        const int r = run->request;
        s->fed[r] += run->n_tokens;
        if (!run->yields_token)
            continue;
        dsv4_serve_timeline *t = &s->tl[r];
        t->token_s[t->n_tokens_out++] = end_s;
        if (t->n_tokens_out == 1)
            t->first_token_s = end_s;
        if (t->n_tokens_out == s->reqs[r].output_len) {
            t->finished_s = end_s;
            s->state[r] = FINISHED;
            s->slot_req[run->slot] = -1;
            s->n_finished++;
        }
    }
}

int dsv4_serve_sched_done(const dsv4_serve_sched *s) { return s->n_finished == s->n; }
int dsv4_serve_sched_steps(const dsv4_serve_sched *s) { return s->n_steps; }

const dsv4_serve_timeline *dsv4_serve_sched_timeline(const dsv4_serve_sched *s, int request)
{
    return request >= 0 && request < s->n ? &s->tl[request] : NULL;
}
