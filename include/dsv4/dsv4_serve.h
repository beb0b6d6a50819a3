/* dsv4_serve.h - serving-shaped runs of the optimized path (issue 37): a workload of requests, the scheduler that
 * packs them into ragged steps, and the metrics that vLLM's `bench serve` and SGLang's `bench_serving` report.
 *
 * Host-only and free of CUDA: the scheduler decides WHAT each step computes (per cache slot a run of consecutive
 * tokens of one request), the caller runs the step and tells the scheduler when it ended. Tests drive it with a
 * simulated step (tests/test_serve_sched.c); `dsv4 bench --serve` drives it with the optimized path.
 *
 * A request of input_len prompt tokens and output_len output tokens (EOS ignored):
 *   - its prompt is fed in prefill runs of at most prefill_chunk tokens; the run that feeds the last prompt token
 *     yields the first output token (the time to first token, TTFT, ends when that step ends);
 *   - then output_len - 1 decode runs of one token each, each feeding the token before and yielding the next;
 *   - so it occupies positions 0 .. input_len + output_len - 2 of its slot, which must fit max_context.
 * Each step: the decodes of every request past its prompt first (one token each), then prefill runs in admission
 * order while the token budget lasts. Requests are admitted in arrival order (ties by index) when they have arrived
 * and a slot is free; a finished request frees its slot at once, for the next step. Everything is allocated by
 * dsv4_serve_sched_init; plan and complete allocate nothing. For a fixed workload and the same sequence of clock
 * values the plans are identical; with every arrival at 0 (rate inf) they do not depend on the clock at all.
 */
#ifndef DSV4_SERVE_H
#define DSV4_SERVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_serve_request {
    int input_len;    /* prompt tokens, >= 1 */
    int output_len;   /* output tokens, >= 1 */
    double arrival_s; /* when it is sent, seconds from the start of the run */
} dsv4_serve_request;

/* ------------------------------------------------------------------------------------------- the workload */
typedef struct dsv4_serve_workload_spec {
    int n_requests;           /* >= 1 */
    int input_min, input_max; /* each request's input length, uniform in [min, max] (min = max: fixed) */
    int output_min, output_max;
    double rate;              /* requests per second, Poisson arrivals; <= 0 or inf: all sent at 0 */
    uint64_t seed;
} dsv4_serve_workload_spec;

/* Fill reqs[n_requests] from the spec: lengths and inter-arrival gaps from one seeded generator (splitmix64), the
 * same on every machine. DSV4_ERR_USAGE with a message naming the field in err on a bad spec. */
int dsv4_serve_workload(const dsv4_serve_workload_spec *spec, dsv4_serve_request *reqs, char *err, size_t errlen);
/* The prompt token of request `request` at position pos, in [0, vocab): a hash of (seed, request, pos) with
 * splitmix64's mixer, so that every configuration of a run serves the same prompts without storing them. */
int32_t dsv4_serve_prompt_token(uint64_t seed, int request, int pos, int vocab);

/* ------------------------------------------------------------------------------------------- the scheduler */
typedef struct dsv4_serve_config {
    int n_slots;       /* C: requests in flight at most = cache slots of the optimized path */
    int token_budget;  /* tokens of one step at most (decodes + prefill runs); >= n_slots (a decode each) */
    int prefill_chunk; /* prompt tokens of one request in one step at most, 1 .. token_budget */
    int max_context;   /* positions of a slot */
} dsv4_serve_config;

/* One slot's share of a step: tokens at positions first_pos .. first_pos + n_tokens - 1 of request `request`. */
typedef struct dsv4_serve_run {
    int slot;
    int request;
    int first_pos;
    int n_tokens;
    int is_decode;     /* 1: one token past the prompt; 0: a prefill run */
    int yields_token;  /* 1: this run ends with an output token (a decode, or the run that ends the prompt) */
    int starts;        /* 1: first_pos == 0, the slot must be reset for this request before the step */
} dsv4_serve_run;

typedef struct dsv4_serve_step {
    int n_runs;             /* runs in slot order of their packing: decodes first, then prefill runs */
    dsv4_serve_run *runs;   /* owned by the scheduler, n_slots entries */
    int n_tokens;           /* sum of the runs' n_tokens */
    int n_decode_tokens;
    int n_prefill_tokens;
} dsv4_serve_step;

/* Every request's timeline, filled as steps complete. */
typedef struct dsv4_serve_timeline {
    double admitted_s;      /* when its first step was planned */
    double first_token_s;   /* end of the step that yielded its first output token */
    double finished_s;      /* end of the step that yielded its last output token */
    double *token_s;        /* [output_len]: end of the step that yielded each output token (owned by the scheduler) */
    int n_tokens_out;       /* output tokens so far */
    int slot;               /* the slot it ran in, -1 before admission */
} dsv4_serve_timeline;

typedef struct dsv4_serve_sched dsv4_serve_sched;

/* The scheduler for n requests (borrowed; they must outlive it). DSV4_ERR_USAGE with a message naming the option
 * ("--concurrency", "--token-budget", "--prefill-chunk", "--max-context") or the request (its index and lengths) in
 * err: no request, a budget below one decode per slot, a chunk outside 1 .. budget, a request whose
 * input_len + output_len - 1 positions exceed max_context, a length below 1. DSV4_ERR_NOMEM. */
int dsv4_serve_sched_init(dsv4_serve_sched **s, const dsv4_serve_config *cfg, const dsv4_serve_request *reqs, int n,
                          char *err, size_t errlen);
void dsv4_serve_sched_free(dsv4_serve_sched *s);

/* Plan the next step at clock time now_s (admits what has arrived by then into free slots). Returns the number of
 * tokens in *step (its runs point into the scheduler); 0 when nothing can run now: then *next_arrival_s is the
 * arrival of the next request not yet admitted (the caller waits until then), or a negative value when every
 * request has finished. A planned step must be completed before the next plan. */
int dsv4_serve_sched_plan(dsv4_serve_sched *s, double now_s, const dsv4_serve_step **step, double *next_arrival_s);
/* The planned step ended at end_s: record the tokens it yielded; a request that has its output_len tokens finishes
 * and frees its slot. */
void dsv4_serve_sched_complete(dsv4_serve_sched *s, double end_s);
int dsv4_serve_sched_done(const dsv4_serve_sched *s);                     /* 1 when every request has finished */
const dsv4_serve_timeline *dsv4_serve_sched_timeline(const dsv4_serve_sched *s, int request);
int dsv4_serve_sched_steps(const dsv4_serve_sched *s);                    /* steps completed so far */

/* ------------------------------------------------------------------------------------------- the metrics */
typedef struct dsv4_serve_dist {
    int n;                       /* samples */
    double mean, median, p99, max; /* seconds; percentiles by linear interpolation between order statistics
                                      (numpy's default, as vLLM and SGLang compute them) */
} dsv4_serve_dist;

typedef struct dsv4_serve_metrics {
    int n_requests;
    double duration_s;           /* first arrival to last finish */
    long long input_tokens, output_tokens;
    double request_throughput;   /* requests / s */
    double input_throughput, output_throughput, total_throughput; /* tokens / s */
    dsv4_serve_dist ttft;        /* first token - arrival */
    dsv4_serve_dist tpot;        /* (e2el - ttft) / (output_len - 1), requests with output_len >= 2 only */
    dsv4_serve_dist itl;         /* every gap between consecutive output tokens of a request, pooled */
    dsv4_serve_dist e2el;        /* finished - arrival */
} dsv4_serve_metrics;

/* The metrics of n finished requests with their timelines. DSV4_ERR_USAGE when one has not finished. The ITL pool
 * needs scratch for sum(output_len - 1) doubles: DSV4_ERR_NOMEM if it cannot be had. */
int dsv4_serve_metrics_compute(const dsv4_serve_request *reqs, const dsv4_serve_timeline *const *timelines, int n,
                               dsv4_serve_metrics *m);
/* The distribution of n samples (sorted in place). n = 0 gives zeros. */
void dsv4_serve_dist_of(double *samples, int n, dsv4_serve_dist *d);

#ifdef __cplusplus
}
#endif
#endif
