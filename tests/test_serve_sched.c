/* test_serve_sched.c - the serving scheduler, workload and metrics (dsv4_serve.h; issue 37), on the CPU with a
 * simulated step whose duration is a + b * tokens:
 * - a hand-worked run (C = 1, two requests) whose every timestamp and metric is computed in the comments below;
 * - admission in arrival order into free slots, slot reuse with a reset, decodes before prefill runs, the token
 *   budget and the chunk respected in every step, every prompt token fed once and every output token yielded once,
 *   completion order of equal requests by admission;
 * - a request arriving later: the scheduler waits for it (next arrival), then admits it;
 * - the same workload and clock give the same plans; the workload is the same for a seed on every machine;
 * - bad input refused with DSV4_ERR_USAGE and a message naming the option;
 * - percentiles as numpy.percentile computes them (linear interpolation);
 * - the prompt ids of `dsv4 bench --serve` (dsv4_serve_prompt_token) pinned.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dsv4/dsv4_serve.h"
#include "dsv4_test.h"

/* Run the scheduler to the end with a step lasting a + b * tokens (the clock jumps to the next arrival when nothing
 * can run). Checks the invariants of every step; returns the number of steps. plans (optional) records, per step,
 * the runs as (slot, request, first_pos, n_tokens) for comparing two runs. */
static int simulate(dsv4_serve_sched *s, const dsv4_serve_config *cfg, const dsv4_serve_request *reqs, int n,
                    double a, double b, int *plans, int plans_cap)
{
    double now = 0;
    int steps = 0, rec = 0;
    int fed[64] = {0};
    ck_assert_int_le(n, 64);
    for (int guard = 0; guard < 100000; guard++) {
        const dsv4_serve_step *st;
        double next;
        const int tokens = dsv4_serve_sched_plan(s, now, &st, &next);
        if (tokens == 0) {
            if (next < 0)
                break;
            ck_assert_msg(next > now, "nothing to run at %g s but the next arrival is %g s", now, next);
            now = next;
            continue;
        }
        ck_assert_int_eq(tokens, st->n_tokens);
        ck_assert_int_le(tokens, cfg->token_budget);
        ck_assert_int_eq(st->n_decode_tokens + st->n_prefill_tokens, tokens);
        int seen_prefill = 0, slot_used[64] = {0};
        for (int u = 0; u < st->n_runs; u++) {
            const dsv4_serve_run *r = &st->runs[u];
            ck_assert_msg(!slot_used[r->slot], "slot %d has two runs in one step", r->slot);
            slot_used[r->slot] = 1;
            ck_assert_msg(!(r->is_decode && seen_prefill), "a decode after a prefill run in step %d", steps);
            seen_prefill |= !r->is_decode;
            ck_assert_int_eq(r->first_pos, fed[r->request]);
            ck_assert_int_eq(r->starts, r->first_pos == 0);
            ck_assert(reqs[r->request].arrival_s <= now);
            if (r->is_decode) {
                ck_assert_int_eq(r->n_tokens, 1);
                ck_assert_int_ge(r->first_pos, reqs[r->request].input_len);
                ck_assert(r->yields_token);
            } else {
                ck_assert_int_le(r->n_tokens, cfg->prefill_chunk);
                ck_assert_int_le(r->first_pos + r->n_tokens, reqs[r->request].input_len);
                ck_assert_int_eq(r->yields_token, r->first_pos + r->n_tokens == reqs[r->request].input_len);
            }
            ck_assert_int_lt(r->first_pos + r->n_tokens - 1, cfg->max_context);
            fed[r->request] += r->n_tokens;
            if (plans && rec + 4 <= plans_cap) {
                plans[rec++] = r->slot, plans[rec++] = r->request, plans[rec++] = r->first_pos;
                plans[rec++] = r->n_tokens;
            }
        }
        now += a + b * tokens;
        dsv4_serve_sched_complete(s, now);
        steps++;
    }
    ck_assert_msg(dsv4_serve_sched_done(s), "the scheduler stopped before every request finished");
    ck_assert_int_eq(dsv4_serve_sched_steps(s), steps);
    for (int i = 0; i < n; i++) {
        const dsv4_serve_timeline *t = dsv4_serve_sched_timeline(s, i);
        ck_assert_int_eq(t->n_tokens_out, reqs[i].output_len);
        ck_assert_int_eq(fed[i], reqs[i].input_len + reqs[i].output_len - 1);
        for (int k = 1; k < reqs[i].output_len; k++)
            ck_assert(t->token_s[k] > t->token_s[k - 1]);
        ck_assert(t->first_token_s == t->token_s[0] && t->finished_s == t->token_s[reqs[i].output_len - 1]);
        ck_assert(t->admitted_s >= reqs[i].arrival_s);
    }
    return steps;
}

static dsv4_serve_metrics metrics_of(dsv4_serve_sched *s, const dsv4_serve_request *reqs, int n)
{
    const dsv4_serve_timeline *tl[64];
    for (int i = 0; i < n; i++)
        tl[i] = dsv4_serve_sched_timeline(s, i);
    dsv4_serve_metrics m;
    ck_assert_int_eq(dsv4_serve_metrics_compute(reqs, tl, n, &m), DSV4_OK);
    return m;
}

#define NEAR(x, want) ck_assert_msg(fabs((x) - (want)) < 1e-12, "%s = %.15g, expected %.15g", #x, (double)(x), \
                                    (double)(want))

/* C = 1, budget 4, chunk 4, each step 1 s. A (input 6, output 3) then B (input 2, output 1), both at 0:
 *   step 1 (0-1 s): A prefill positions 0-3;   step 2 (1-2 s): A prefill 4-5, first token at 2 s;
 *   step 3: A decode (pos 6), token at 3 s;    step 4: A decode (pos 7), token at 4 s: A finishes, frees slot 0;
 *   step 5 (4-5 s): B admitted at 4 s into slot 0 (reset), prefill 0-1, its only token at 5 s.
 * TTFT: A 2, B 5 (mean 3.5, median 3.5); E2EL: A 4, B 5; TPOT: A only, (4 - 2) / 2 = 1; ITL: A's gaps 1, 1;
 * duration 5 s; input 8, output 4 tokens: 0.4 req/s, 1.6 in/s, 0.8 out/s, 2.4 total/s. */
START_TEST(test_hand_worked)
{
    const dsv4_serve_request reqs[2] = {{6, 3, 0}, {2, 1, 0}};
    const dsv4_serve_config cfg = {.n_slots = 1, .token_budget = 4, .prefill_chunk = 4, .max_context = 16};
    dsv4_serve_sched *s;
    char err[256];
    ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, reqs, 2, err, sizeof err), DSV4_OK);
    int plans[64];
    ck_assert_int_eq(simulate(s, &cfg, reqs, 2, 1.0, 0.0, plans, 64), 5);
    const int want[] = {0, 0, 0, 4, 0, 0, 4, 2, 0, 0, 6, 1, 0, 0, 7, 1, 0, 1, 0, 2};
    for (int i = 0; i < 20; i++)
        ck_assert_msg(plans[i] == want[i], "plan entry %d (step %d): %d, expected %d", i, i / 4 + 1, plans[i],
                      want[i]);
    const dsv4_serve_timeline *a = dsv4_serve_sched_timeline(s, 0), *b = dsv4_serve_sched_timeline(s, 1);
    NEAR(a->token_s[0], 2); NEAR(a->token_s[1], 3); NEAR(a->token_s[2], 4); NEAR(b->admitted_s, 4);
    NEAR(b->finished_s, 5);
    ck_assert_int_eq(b->slot, 0);
    const dsv4_serve_metrics m = metrics_of(s, reqs, 2);
    NEAR(m.duration_s, 5); NEAR(m.request_throughput, 0.4); NEAR(m.input_throughput, 1.6);
    NEAR(m.output_throughput, 0.8); NEAR(m.total_throughput, 2.4);
    ck_assert_int_eq(m.ttft.n, 2); NEAR(m.ttft.mean, 3.5); NEAR(m.ttft.median, 3.5); NEAR(m.ttft.max, 5);
    NEAR(m.ttft.p99, 2 + 0.99 * 3);
    NEAR(m.e2el.mean, 4.5);
    ck_assert_int_eq(m.tpot.n, 1); NEAR(m.tpot.mean, 1);
    ck_assert_int_eq(m.itl.n, 2); NEAR(m.itl.mean, 1); NEAR(m.itl.p99, 1);
    dsv4_serve_sched_free(s);
}
END_TEST

/* C = 2, budget 3, chunk 3: A (input 1, output 5) and B (input 10, output 1) at 0. A's decodes come first in every
 * step after its prompt, and B's prompt gets what the budget leaves: 2 tokens a step. */
START_TEST(test_decodes_first_and_budget)
{
    const dsv4_serve_request reqs[2] = {{1, 5, 0}, {10, 1, 0}};
    const dsv4_serve_config cfg = {.n_slots = 2, .token_budget = 3, .prefill_chunk = 3, .max_context = 16};
    dsv4_serve_sched *s;
    char err[256];
    ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, reqs, 2, err, sizeof err), DSV4_OK);
    int plans[256];
    const int steps = simulate(s, &cfg, reqs, 2, 0.5, 0.1, plans, 256);
    /* step 1: A prefill 1 (slot 0), B prefill 2 (slot 1); steps 2-5: A decode, B prefill 2 each (B done at 10 in
     * step 5); A's 4 decodes in steps 2-5 */
    ck_assert_int_eq(steps, 5);
    const int want1[] = {0, 0, 0, 1, 1, 1, 0, 2};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(plans[i], want1[i]);
    for (int k = 1; k < 5; k++) {
        const int *p = &plans[8 * k];
        ck_assert_msg(p[1] == 0 && p[3] == 1 && p[5] == 1 && p[7] == 2, "step %d: A decode then B 2 tokens", k + 1);
    }
    dsv4_serve_sched_free(s);
}
END_TEST

/* C = 2, six equal requests at 0: slots are reused lowest first, finished requests leave in admission order, and
 * every reused slot starts with a reset. Then a budget that allows several prompts in one step. */
START_TEST(test_admission_and_slot_reuse)
{
    dsv4_serve_request reqs[6];
    for (int i = 0; i < 6; i++)
        reqs[i] = (dsv4_serve_request){5, 3, 0};
    const dsv4_serve_config cfg = {.n_slots = 2, .token_budget = 16, .prefill_chunk = 8, .max_context = 64};
    dsv4_serve_sched *s;
    char err[256];
    ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, reqs, 6, err, sizeof err), DSV4_OK);
    simulate(s, &cfg, reqs, 6, 1.0, 0.0, NULL, 0);
    for (int i = 0; i < 6; i++) {
        const dsv4_serve_timeline *t = dsv4_serve_sched_timeline(s, i);
        ck_assert_int_eq(t->slot, i % 2);
        if (i >= 2) /* admitted when the pair before it finished */
            ck_assert(t->admitted_s == dsv4_serve_sched_timeline(s, i - 2)->finished_s);
        if (i > 0)
            ck_assert(t->finished_s >= dsv4_serve_sched_timeline(s, i - 1)->finished_s);
    }
    /* three pairs, each 1 prefill step + 2 decode steps */
    ck_assert_int_eq(dsv4_serve_sched_steps(s), 9);
    dsv4_serve_sched_free(s);
}
END_TEST

/* Request 1 arrives at 100 s, long after request 0 is done: the scheduler reports the next arrival, then admits it
 * at that time; its TTFT counts from its own arrival. */
START_TEST(test_late_arrival)
{
    const dsv4_serve_request reqs[2] = {{3, 2, 100}, {3, 2, 0}}; /* listed out of arrival order on purpose */
    const dsv4_serve_config cfg = {.n_slots = 4, .token_budget = 8, .prefill_chunk = 8, .max_context = 8};
    dsv4_serve_sched *s;
    char err[256];
    ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, reqs, 2, err, sizeof err), DSV4_OK);
    simulate(s, &cfg, reqs, 2, 1.0, 0.0, NULL, 0);
    const dsv4_serve_timeline *t0 = dsv4_serve_sched_timeline(s, 0), *t1 = dsv4_serve_sched_timeline(s, 1);
    NEAR(t1->admitted_s, 0); NEAR(t1->finished_s, 2);
    NEAR(t0->admitted_s, 100); NEAR(t0->first_token_s, 101); NEAR(t0->finished_s, 102);
    ck_assert_int_eq(t0->slot, 0); /* slot 0 was freed by request 1 */
    const dsv4_serve_metrics m = metrics_of(s, reqs, 2);
    NEAR(m.ttft.mean, 1); NEAR(m.duration_s, 102);
    dsv4_serve_sched_free(s);
}
END_TEST

/* A random workload with Poisson arrivals, C = 8: the invariants of every step (simulate), and the same plans from
 * a second scheduler on the same workload and clock. */
START_TEST(test_random_workload_deterministic)
{
    const dsv4_serve_workload_spec w = {.n_requests = 40, .input_min = 1, .input_max = 300, .output_min = 1,
                                        .output_max = 40, .rate = 20, .seed = 7};
    dsv4_serve_request reqs[40];
    char err[256];
    ck_assert_int_eq(dsv4_serve_workload(&w, reqs, err, sizeof err), DSV4_OK);
    const dsv4_serve_config cfg = {.n_slots = 8, .token_budget = 128, .prefill_chunk = 64, .max_context = 512};
    static int p1[1 << 16], p2[1 << 16];
    int steps[2];
    for (int k = 0; k < 2; k++) {
        dsv4_serve_sched *s;
        ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, reqs, 40, err, sizeof err), DSV4_OK);
        steps[k] = simulate(s, &cfg, reqs, 40, 0.01, 1e-4, k ? p2 : p1, 1 << 16);
        const dsv4_serve_metrics m = metrics_of(s, reqs, 40);
        ck_assert(m.ttft.median <= m.ttft.p99 && m.ttft.p99 <= m.ttft.max && m.itl.n > 0);
        dsv4_serve_sched_free(s);
    }
    ck_assert_int_eq(steps[0], steps[1]);
    ck_assert_msg(memcmp(p1, p2, sizeof p1) == 0, "two runs of one workload planned differently");
}
END_TEST

/* The workload: fixed lengths when min = max, ranges respected, all at 0 without a rate, Poisson gaps of mean
 * 1/rate, the same requests for the same seed and other ones for another seed; the first values of seed 1 are
 * pinned (splitmix64 is specified, so they are the same on every machine: computed from its definition with
 * Python integers, not by this code). */
START_TEST(test_workload)
{
    static dsv4_serve_request a[4000], b[4000];
    char err[256];
    dsv4_serve_workload_spec w = {.n_requests = 4000, .input_min = 1024, .input_max = 8192, .output_min = 256,
                                  .output_max = 1024, .rate = 0, .seed = 1};
    ck_assert_int_eq(dsv4_serve_workload(&w, a, err, sizeof err), DSV4_OK);
    ck_assert_int_eq(dsv4_serve_workload(&w, b, err, sizeof err), DSV4_OK);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    int lo_in = 1 << 30, hi_in = 0;
    for (int i = 0; i < 4000; i++) {
        ck_assert(a[i].arrival_s == 0);
        ck_assert(a[i].input_len >= 1024 && a[i].input_len <= 8192);
        ck_assert(a[i].output_len >= 256 && a[i].output_len <= 1024);
        lo_in = a[i].input_len < lo_in ? a[i].input_len : lo_in;
        hi_in = a[i].input_len > hi_in ? a[i].input_len : hi_in;
    }
    ck_assert_msg(lo_in < 1100 && hi_in > 8100, "4000 draws cover the range: %d..%d", lo_in, hi_in);
    w.seed = 2;
    ck_assert_int_eq(dsv4_serve_workload(&w, b, err, sizeof err), DSV4_OK);
    ck_assert(memcmp(a, b, sizeof a) != 0);
    w.input_min = w.input_max = 4096, w.output_min = w.output_max = 512, w.rate = 10;
    ck_assert_int_eq(dsv4_serve_workload(&w, a, err, sizeof err), DSV4_OK);
    double gap_sum = 0;
    for (int i = 0; i < 4000; i++) {
        ck_assert(a[i].input_len == 4096 && a[i].output_len == 512);
        if (i > 0) {
            ck_assert(a[i].arrival_s >= a[i - 1].arrival_s);
            gap_sum += a[i].arrival_s - a[i - 1].arrival_s;
        }
    }
    ck_assert(a[0].arrival_s == 0);
    /* mean of 3999 exponential gaps of mean 0.1: standard error 0.1 / sqrt(3999) = 0.0016; 5 standard errors */
    ck_assert_msg(fabs(gap_sum / 3999 - 0.1) < 0.008, "mean gap %g, expected 0.1", gap_sum / 3999);
    /* splitmix64 from state 1: the first output is 0x910A2DEC89025CC1 (Vigna's reference splitmix64.c); the
     * range 1..100 takes it modulo 100 (it is below the rejection limit): 0x910A2DEC89025CC1 % 100 = 65 */
    w = (dsv4_serve_workload_spec){.n_requests = 1, .input_min = 1, .input_max = 100, .output_min = 1,
                                   .output_max = 1, .seed = 1};
    ck_assert_int_eq(dsv4_serve_workload(&w, a, err, sizeof err), DSV4_OK);
    ck_assert_int_eq(a[0].input_len, 1 + 65);
}
END_TEST

static void expect_refusal(int rc, const char *err, const char *option)
{
    ck_assert_int_eq(rc, DSV4_ERR_USAGE);
    ck_assert_msg(strstr(err, option) != NULL, "the message does not name %s: %s", option, err);
}

START_TEST(test_bad_input)
{
    char err[256];
    dsv4_serve_sched *s = (dsv4_serve_sched *)&s;
    const dsv4_serve_request ok[1] = {{4, 4, 0}};
    dsv4_serve_config cfg = {.n_slots = 4, .token_budget = 16, .prefill_chunk = 8, .max_context = 64};
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, ok, 0, err, sizeof err), err, "--requests");
    ck_assert_ptr_null(s);
    cfg.token_budget = 3; /* below one decode for each of 4 slots */
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, ok, 1, err, sizeof err), err, "--token-budget");
    cfg.token_budget = 16, cfg.prefill_chunk = 0;
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, ok, 1, err, sizeof err), err, "--prefill-chunk");
    cfg.prefill_chunk = 17;
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, ok, 1, err, sizeof err), err, "--prefill-chunk");
    cfg.prefill_chunk = 8, cfg.n_slots = 0;
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, ok, 1, err, sizeof err), err, "--concurrency");
    cfg.n_slots = 4;
    const dsv4_serve_request too_long[2] = {{4, 4, 0}, {60, 6, 0}}; /* 65 positions > 64 */
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, too_long, 2, err, sizeof err), err, "--max-context");
    ck_assert_msg(strstr(err, "request 1") && strstr(err, "65 positions"), "names the request: %s", err);
    const dsv4_serve_request fits[1] = {{60, 5, 0}}; /* 64 positions: fits exactly */
    ck_assert_int_eq(dsv4_serve_sched_init(&s, &cfg, fits, 1, err, sizeof err), DSV4_OK);
    dsv4_serve_sched_free(s);
    const dsv4_serve_request no_out[1] = {{4, 0, 0}}, no_in[1] = {{0, 4, 0}};
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, no_out, 1, err, sizeof err), err, "--output-len");
    expect_refusal(dsv4_serve_sched_init(&s, &cfg, no_in, 1, err, sizeof err), err, "--input-len");
    dsv4_serve_request r[1];
    dsv4_serve_workload_spec w = {.n_requests = 0, .input_min = 1, .input_max = 1, .output_min = 1, .output_max = 1};
    expect_refusal(dsv4_serve_workload(&w, r, err, sizeof err), err, "--requests");
    w.n_requests = 1, w.output_min = w.output_max = 0;
    expect_refusal(dsv4_serve_workload(&w, r, err, sizeof err), err, "--output-len");
    w.output_min = w.output_max = 1, w.input_min = 5, w.input_max = 4;
    expect_refusal(dsv4_serve_workload(&w, r, err, sizeof err), err, "--input-len");
}
END_TEST

/* numpy.percentile([4, 1, 3, 2], q): q 50 -> 2.5, q 99 -> 3.97 (rank 2.97 between 3 and 4); one sample is every
 * percentile; none gives zeros. */
START_TEST(test_percentiles)
{
    double x[4] = {4, 1, 3, 2};
    dsv4_serve_dist d;
    dsv4_serve_dist_of(x, 4, &d);
    NEAR(d.mean, 2.5); NEAR(d.median, 2.5); NEAR(d.p99, 3.97); NEAR(d.max, 4);
    double one[1] = {0.25};
    dsv4_serve_dist_of(one, 1, &d);
    NEAR(d.median, 0.25); NEAR(d.p99, 0.25);
    dsv4_serve_dist_of(NULL, 0, &d);
    ck_assert_int_eq(d.n, 0);
    NEAR(d.mean, 0);
}
END_TEST

/* The prompt ids of `dsv4 bench --serve` are fixed by (seed, request, position): these are the ids its runs have
 * served since issue 37 (the hash then lived in cli/bench_serve.c). */
START_TEST(test_prompt_token)
{
    ck_assert_int_eq(dsv4_serve_prompt_token(7, 0, 0, 129280), 44513);
    ck_assert_int_eq(dsv4_serve_prompt_token(7, 0, 1, 129280), 112805);
    ck_assert_int_eq(dsv4_serve_prompt_token(7, 3, 8191, 129280), 99662);
    ck_assert_int_eq(dsv4_serve_prompt_token(1007, 1, 0, 129280), 113883);
    ck_assert_int_eq(dsv4_serve_prompt_token(7, 2, 5, 8), 7);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve_sched");
    TCase *tc = tcase_create("sched");
    tcase_add_test(tc, test_hand_worked);
    tcase_add_test(tc, test_decodes_first_and_budget);
    tcase_add_test(tc, test_admission_and_slot_reuse);
    tcase_add_test(tc, test_late_arrival);
    tcase_add_test(tc, test_random_workload_deterministic);
    tcase_add_test(tc, test_workload);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_percentiles);
    tcase_add_test(tc, test_prompt_token);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
