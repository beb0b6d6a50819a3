/* test_opt_prefill_plan.c - the host-side rules of the optimized path's prefill (issue 35), on the CPU:
 * - the chunk planning (dsv4_opt_plan_step, optimized/opt_plan.c): decodes first, then prompts in order within the
 *   budget; a whole batch schedule feeds every token exactly once, never more than the budget per step, and a
 *   decoding sequence never waits while the budget covers the batch;
 * - the compressor of a step with runs (kernels/compressor_plan.h, what compressor.cu's run kernels do): entries
 *   pooled from a run's own rows and the state before it, then the state carried, must give the entries and the
 *   state of the reference's own per-token state machine (reference/ref_compressor.c, dsv4_ref_compressor_push)
 *   bit for bit, for CSA (r 4, overlapping) and HCA (r 8 here, the same rules as 128) and for runs of every length
 *   1..2r+3, starting on and off window boundaries, including chunks longer than a window and than two. The
 *   golden is the reference machine, never the code under test; a deliberately wrong rule (reading the previous
 *   window's rows where the current ones hold a partial window) must fail the same comparison;
 * - the window of a step with runs (kernels/window_plan.h, what step.cu's gather list and ring write do): over
 *   random ragged schedules of 3 sequences (runs up to 3 windows long, decodes between), every row's W gather slots
 *   resolve, through the fresh rows and a ring of W position ids, to exactly the positions p-W+1..p of the
 *   one-token window (model-spec §6.5), and after the ring write the ring holds each slot's latest position; a ring
 *   written before the attention (the hazard the fresh rows avoid) must fail the same check.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/compressor_plan.h"
#include "../kernels/window_plan.h"
#include "../reference/ref_ops.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4_test.h"

/* ------------------------------------------------------------------------------------------- planning */
START_TEST(test_plan_decodes_first_then_prompts_in_order)
{
    int32_t want[5] = {7, 1, 0, 300, 1}, n[5];
    ck_assert_int_eq(dsv4_opt_plan_step(5, want, 10, n), 10);
    const int32_t expect[5] = {7, 1, 0, 1, 1}; /* decodes 1 and 4, then 7 of seq 0, the last 1 to seq 3 */
    for (int c = 0; c < 5; c++) ck_assert_int_eq(n[c], expect[c]);
    ck_assert_int_eq(dsv4_opt_plan_step(5, want, 2, n), 2); /* only the decodes fit */
    ck_assert(n[0] == 0 && n[1] == 1 && n[3] == 0 && n[4] == 1);
    ck_assert_int_eq(dsv4_opt_plan_step(5, want, 1, n), 1); /* the first decode only */
    ck_assert(n[1] == 1 && n[4] == 0);
    ck_assert_int_eq(dsv4_opt_plan_step(5, want, 0, n), 0);
    for (int c = 0; c < 5; c++) ck_assert_int_eq(n[c], 0);
    int32_t none[3] = {0, 0, 0};
    ck_assert_int_eq(dsv4_opt_plan_step(3, none, 64, n), 0);
}
END_TEST

/* A whole run as cli/run.c drives it: copy c starts at step c, prefills positions 0..K-1, then decodes to T. */
static void schedule(int C, int K, int T, int budget, int *steps_out)
{
    int32_t *pos = calloc((size_t)C, 4), *want = calloc((size_t)C, 4), *n = calloc((size_t)C, 4);
    int *fed = calloc((size_t)C * T, sizeof *fed);
    int steps = 0;
    for (int s = 0;; s++) {
        int busy = 0, decodes = 0;
        for (int c = 0; c < C; c++) {
            want[c] = c > s || pos[c] >= T ? 0 : pos[c] < K ? K - pos[c] : 1;
            busy |= c > s || pos[c] < T;
            decodes += want[c] == 1;
        }
        if (!busy) break;
        ck_assert_int_lt(s, 10 * (T + C)); /* progress */
        int total = dsv4_opt_plan_step(C, want, budget, n), sum = 0;
        ck_assert_int_le(total, budget);
        for (int c = 0; c < C; c++) {
            ck_assert(n[c] >= 0 && n[c] <= want[c]);
            if (want[c] == 1 && decodes <= budget) ck_assert_int_eq(n[c], 1); /* a decode never starves */
            for (int j = 0; j < n[c]; j++) fed[(size_t)c * T + pos[c] + j]++;
            ck_assert(pos[c] >= K || pos[c] + n[c] <= K); /* a prefill run never crosses into decoding */
            pos[c] += n[c];
            sum += n[c];
        }
        ck_assert_int_eq(sum, total);
        steps += total > 0;
    }
    for (int i = 0; i < C * T; i++) ck_assert_int_eq(fed[i], 1);
    if (steps_out) *steps_out = steps;
    free(pos), free(want), free(n), free(fed);
}

START_TEST(test_plan_schedules)
{
    int steps;
    schedule(1, 100, 103, 32, &steps); /* ceil(100 / 32) = 4 prefill steps, then 3 decodes */
    ck_assert_int_eq(steps, 4 + 3);
    schedule(1, 100, 100, 100, &steps); /* the whole prompt in one step */
    ck_assert_int_eq(steps, 1);
    schedule(1, 5, 9, 1, &steps); /* token by token */
    ck_assert_int_eq(steps, 9);
    const int Cs[] = {1, 2, 3, 5}, Ks[] = {0, 1, 7, 64, 129}, Bs[] = {1, 3, 4, 7, 128, 512};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t c = 0; c < 6; c++) {
                const int budget = Bs[c] > Cs[a] ? Bs[c] : Cs[a]; /* run.c: at least one token per copy */
                schedule(Cs[a], Ks[b], Ks[b] + 5, budget, NULL);
            }
}
END_TEST

/* ------------------------------------------------------------------------------------------- compressor */
enum { DC = 6, MAXR = 8, MAXROWS = 2 * MAXR, MAXW = 2 * DC };

/* The (kv, gate) projections of position p, and the position bias, deterministic and distinct. */
static float proj_kv(int64_t p, int col) { return sinf(0.37f * (float)p + 0.11f * (float)col) * 2.0f; }
static float proj_gate(int64_t p, int col) { return cosf(0.23f * (float)p - 0.07f * (float)col) * 3.0f; }
static float ape_at(int slot, int col) { return 0.05f * (float)slot - 0.02f * (float)col; }

/* The run model: state [rows, W] kv and score, as compressor.cu's run kernels read and write it. wrong = 1 takes
 * every pre-run position from the previous rows (a plausible bug: the current window's partial rows ignored). */
typedef struct run_model {
    int r, overlap, W, rows;
    float kv[MAXROWS * MAXW], sc[MAXROWS * MAXW];
} run_model;

static void src_value(const run_model *m, int64_t q, int64_t p0, int col, int wrong, float *kv, float *sc)
{
    if (q < 0) {
        *kv = 0.0f, *sc = -INFINITY;
    } else if (q >= p0) {
        *kv = proj_kv(q, col);
        *sc = proj_gate(q, col) + ape_at((int)(q % m->r), col);
    } else {
        const int row = wrong && m->overlap ? (int)(q % m->r) : dsv4_cmp_state_row(q, p0, m->r, m->overlap);
        *kv = m->kv[row * m->W + col];
        *sc = m->sc[row * m->W + col];
    }
}

/* Entry w, pooled as ref_compressor.c pools (same float operations in the same order). */
static void run_entry(const run_model *m, int64_t w, int64_t p0, int wrong, float *e)
{
    const int r = m->r, n_slots = (m->overlap ? 2 : 1) * r;
    for (int ch = 0; ch < DC; ch++) {
        float kv, sc, mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int i = 0; i < n_slots; i++) {
            src_value(m, dsv4_cmp_slot_pos(w, i, r, m->overlap), p0, (m->overlap && i >= r) ? DC + ch : ch, wrong,
                      &kv, &sc);
            if (sc > mx) mx = sc;
        }
        for (int i = 0; i < n_slots; i++) {
            src_value(m, dsv4_cmp_slot_pos(w, i, r, m->overlap), p0, (m->overlap && i >= r) ? DC + ch : ch, wrong,
                      &kv, &sc);
            sum += expf(sc - mx);
        }
        for (int i = 0; i < n_slots; i++) {
            src_value(m, dsv4_cmp_slot_pos(w, i, r, m->overlap), p0, (m->overlap && i >= r) ? DC + ch : ch, wrong,
                      &kv, &sc);
            float wgt = expf(sc - mx) / sum;
            acc += kv * wgt;
        }
        e[ch] = acc;
    }
}

static void run_carry(run_model *m, int64_t p0, int64_t p1)
{
    float okv[MAXROWS * MAXW], osc[MAXROWS * MAXW];
    memcpy(okv, m->kv, sizeof okv);
    memcpy(osc, m->sc, sizeof osc);
    for (int row = 0; row < m->rows; row++) {
        int64_t src = 0;
        const int how = dsv4_cmp_carry(p0, p1, m->r, m->overlap, row, &src);
        for (int col = 0; col < m->W && how != DSV4_CMP_KEEP; col++) {
            if (how == DSV4_CMP_FROM_RUN) {
                m->kv[row * m->W + col] = proj_kv(src, col);
                m->sc[row * m->W + col] = proj_gate(src, col) + ape_at((int)(src % m->r), col);
            } else {
                m->kv[row * m->W + col] = okv[src * m->W + col];
                m->sc[row * m->W + col] = osc[src * m->W + col];
            }
        }
    }
}

/* Drive the reference per token and the run model per chunk of `chunk` tokens (the first chunk `first` long, to
 * start later chunks off window boundaries) over n tokens; compare every entry and the state after every chunk.
 * Returns the number of mismatches (0 expected unless wrong). */
static int compare(int r, int overlap, int n, int first, int chunk, int wrong)
{
    const int W = (overlap ? 2 : 1) * DC, rows = (overlap ? 2 : 1) * r;
    float *mem = malloc(dsv4_ref_compressor_state_floats(r, DC, overlap) * sizeof(float));
    float ape[MAXR * MAXW];
    for (int s = 0; s < r; s++)
        for (int col = 0; col < W; col++) ape[s * W + col] = ape_at(s, col);
    dsv4_ref_compressor ref;
    dsv4_ref_compressor_init(&ref, r, DC, overlap, mem);
    run_model m = {.r = r, .overlap = overlap, .W = W, .rows = rows};
    for (int i = 0; i < rows * W; i++) m.kv[i] = 0.0f, m.sc[i] = -INFINITY;
    float ref_entries[64][DC];
    int bad = 0;
    for (int64_t p0 = 0; p0 < n;) {
        const int len = p0 == 0 ? first : chunk;
        const int64_t p1 = p0 + len - 1 < n - 1 ? p0 + len - 1 : n - 1;
        /* the reference, token by token */
        for (int64_t p = p0; p <= p1; p++) {
            float kv[MAXW], g[MAXW];
            for (int col = 0; col < W; col++) kv[col] = proj_kv(p, col), g[col] = proj_gate(p, col);
            float e[DC];
            if (dsv4_ref_compressor_push(&ref, p, kv, g, ape, e)) memcpy(ref_entries[p / r], e, sizeof e);
        }
        /* the run: every entry that closes in it, from the state before it, then the carry */
        for (int64_t p = p0; p <= p1; p++) {
            if ((p + 1) % r) continue;
            float e[DC];
            run_entry(&m, p / r, p0, wrong, e);
            bad += memcmp(e, ref_entries[p / r], sizeof e) != 0;
        }
        run_carry(&m, p0, p1);
        for (int i = 0; i < rows * W; i++) {
            const int same_kv = m.kv[i] == ref.kv[i], same_sc = m.sc[i] == ref.score[i] ||
                                                            (isinf(m.sc[i]) && isinf(ref.score[i]));
            bad += !same_kv || !same_sc;
        }
        p0 = p1 + 1;
    }
    free(mem);
    return bad;
}

START_TEST(test_compressor_runs_match_the_reference_machine)
{
    int cases = 0;
    const int shapes[2][2] = {{4, 1}, {8, 0}}; /* CSA ratio 4 overlapping; HCA (ratio 8: 128's rules, small) */
    for (int k = 0; k < 2; k++) {
        const int r = shapes[k][0], ov = shapes[k][1];
        for (int chunk = 1; chunk <= 2 * r + 3; chunk++)
            for (int first = 1; first <= r + 1; first++) {
                const int n = 5 * r + 3; /* ends off a window boundary */
                ck_assert_msg(compare(r, ov, n, first, chunk, 0) == 0,
                              "ratio %d overlap %d: chunks of %d after a first of %d differ from one-token steps", r,
                              ov, chunk, first);
                ck_assert_msg(compare(r, ov, 5 * r, first, chunk, 0) == 0, "ratio %d: ending on a boundary", r);
                cases += 2;
            }
    }
    /* the check can fail: the wrong source rule differs from the reference for CSA runs that start mid-window */
    ck_assert_int_gt(compare(4, 1, 23, 2, 5, 1), 0);
    printf("compressor runs: %d chunkings match the reference state machine bit for bit\n", cases);
}
END_TEST

START_TEST(test_carry_rules_by_hand)
{
    int64_t src = -1;
    /* CSA r 4, state after position 5 (window 1 partial: slots 0, 1), run 6..9 (closes window 2 at 11? no: 7) */
    ck_assert_int_eq(dsv4_cmp_state_row(4, 6, 4, 1), 4 + 0); /* window 1 = window of p0: a current row */
    ck_assert_int_eq(dsv4_cmp_state_row(3, 6, 4, 1), 3);     /* window 0: a previous row */
    ck_assert_int_eq(dsv4_cmp_carry(6, 9, 4, 1, 0, &src), DSV4_CMP_FROM_STATE); /* closed at 7, began at 4 < 6 */
    ck_assert_int_eq(src, 4);
    ck_assert_int_eq(dsv4_cmp_carry(6, 9, 4, 1, 2, &src), DSV4_CMP_FROM_RUN); /* position 6 */
    ck_assert_int_eq(src, 6);
    ck_assert_int_eq(dsv4_cmp_carry(6, 9, 4, 1, 4 + 1, &src), DSV4_CMP_FROM_RUN); /* slot 1: position 9 */
    ck_assert_int_eq(src, 9);
    ck_assert_int_eq(dsv4_cmp_carry(6, 9, 4, 1, 4 + 2, &src), DSV4_CMP_FROM_RUN); /* slot 2: position 6 */
    ck_assert_int_eq(src, 6);
    ck_assert_int_eq(dsv4_cmp_carry(8, 9, 4, 1, 0, &src), DSV4_CMP_KEEP); /* no close inside 8..9 */
    ck_assert_int_eq(dsv4_cmp_carry(0, 1, 4, 1, 4 + 3, &src), DSV4_CMP_KEEP); /* slot 3 never written */
    ck_assert_int_eq(dsv4_cmp_slot_pos(0, 1, 4, 1), -3); /* w 0's a-slots are before position 0 */
    ck_assert_int_eq(dsv4_cmp_slot_pos(2, 5, 4, 1), 9);
    ck_assert_int_eq(dsv4_cmp_slot_pos(2, 5, 128, 0), 261);
}
END_TEST

/* ------------------------------------------------------------------------------------------- window */
enum { WW = 8, WSEQ = 3, WMAXRUN = 3 * WW };

/* Ragged steps over WSEQ sequences; early = 1 writes the ring before the attention (the wrong order). Returns the
 * number of window entries that are not the one-token window's. */
static int window_schedule(int early, unsigned seed)
{
    int64_t ring[WSEQ][WW];
    int pos[WSEQ] = {0, 0, 0}, bad = 0;
    for (int c = 0; c < WSEQ; c++)
        for (int i = 0; i < WW; i++) ring[c][i] = -7; /* nothing written yet: never read (t >= 0 only) */
    for (int step = 0; step < 40; step++) {
        int n[WSEQ], T = 0, row0[WSEQ];
        for (int c = 0; c < WSEQ; c++) {
            seed = seed * 1103515245u + 12345u;
            n[c] = (int)((seed >> 16) % (WMAXRUN + 1)); /* 0 .. 3W tokens, 1 a decode */
            row0[c] = T;
            T += n[c];
        }
        int64_t fresh[WSEQ * WMAXRUN]; /* the step's fresh rows: each row's own position */
        for (int c = 0; c < WSEQ; c++)
            for (int j = 0; j < n[c]; j++) fresh[row0[c] + j] = pos[c] + j;
        if (early) /* the hazard: the ring written before the rows read it */
            for (int c = 0; c < WSEQ; c++)
                for (int j = 0; j < n[c]; j++) ring[c][(pos[c] + j) % WW] = pos[c] + j;
        const int32_t fresh_base = WW + 100; /* W + pool_cap */
        for (int c = 0; c < WSEQ; c++)
            for (int j = 0; j < n[c]; j++) {
                const int64_t p = pos[c] + j;
                for (int k = 0; k < WW; k++) {
                    const int64_t t = p - (WW - 1) + k;
                    const int32_t slot = dsv4_window_slot(p, j, row0[c] + j, t, WW, fresh_base);
                    int64_t got = -1;
                    if (slot >= fresh_base && slot - fresh_base < T) got = fresh[slot - fresh_base];
                    else if (slot >= 0 && slot < WW) got = ring[c][slot];
                    else if (slot >= 0) got = -2; /* out of range: wrong */
                    bad += got != (t >= 0 ? t : -1);
                }
            }
        for (int c = 0; c < WSEQ; c++) /* after the attention */
            for (int j = 0; j < n[c]; j++)
                if (dsv4_window_ring_keeps(j, n[c], WW)) ring[c][(pos[c] + j) % WW] = pos[c] + j;
        for (int c = 0; c < WSEQ; c++) {
            pos[c] += n[c];
            for (int i = 0; i < WW && !early; i++) { /* each slot holds its latest position */
                const int64_t want = pos[c] - 1 - (((pos[c] - 1 - i) % WW) + WW) % WW;
                bad += want >= 0 && ring[c][i] != want;
            }
        }
    }
    return bad;
}

START_TEST(test_window_of_runs)
{
    for (unsigned seed = 1; seed <= 50; seed++)
        ck_assert_msg(window_schedule(0, seed) == 0, "schedule %u: a row's window is not the one-token window",
                      seed);
    int wrong = 0;
    for (unsigned seed = 1; seed <= 50; seed++) wrong += window_schedule(1, seed);
    ck_assert_int_gt(wrong, 0); /* writing the ring first is caught */
    /* decode (no run): the ring alone, -1 before position 0 */
    ck_assert_int_eq(dsv4_window_slot(5, -1, 0, 3, 8, 108), 3);
    ck_assert_int_eq(dsv4_window_slot(5, -1, 0, -1, 8, 108), -1);
    ck_assert_int_eq(dsv4_window_slot(20, 4, 9, 17, 8, 108), 108 + 6); /* run from 16 at row 5: t 17 is row 6 */
    ck_assert_int_eq(dsv4_window_slot(20, 4, 9, 15, 8, 108), 15 % 8);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opt_prefill_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_plan_decodes_first_then_prompts_in_order);
    tcase_add_test(tc, test_plan_schedules);
    tcase_add_test(tc, test_carry_rules_by_hand);
    tcase_add_test(tc, test_compressor_runs_match_the_reference_machine);
    tcase_add_test(tc, test_window_of_runs);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
