/* compare_progress.c - how far dsv4_verify_run is (dsv4_verify_options.progress): every pass's bytes are planned
 * from the datasets' shapes once its probes are built (dsv4_cmp_probe_plan mirrors the reads), and the count
 * moves as the blocks are read.
 *
 * Quiet trap: planned bytes, not the bytes read, decide where the count is at the end of each probe. The scan of
 * a top-k probe stops at its first tie, and the count jumps to the probe's plan there, so that it ends at the
 * total. Nothing here touches the result: the numbers are the same with and without a callback.
 */
#include "verify_compare.h"

void dsv4_cmp_progress_report(dsv4_cmp_ctx *x, double done)
{
    dsv4_cmp_progress *pr = x->prog;
    if (done > pr->total) done = pr->total;
    if (done < pr->done) done = pr->done;
    if (pr->calls && done == pr->done) return; /* nothing new (a probe that reads nothing, its end at its plan) */
    pr->calls++;
    pr->done = done;
    pr->fn(pr->ctx, done, pr->total);
}

void dsv4_cmp_progress_read(dsv4_cmp_ctx *x, double bytes)
{
    if (!x->pass_planned) return;
    x->probe_read += bytes;
    dsv4_cmp_progress_report(x, x->pass_at + (x->probe_read < x->probe_plan ? x->probe_read : x->probe_plan));
}

void dsv4_cmp_progress_probe_begin(dsv4_cmp_ctx *x, const dsv4_verify_probe *p)
{
    if (!x->pass_planned) return;
    x->probe_plan = dsv4_cmp_probe_plan(x, p);
    x->probe_read = 0;
}

void dsv4_cmp_progress_probe_end(dsv4_cmp_ctx *x)
{
    if (!x->pass_planned) return;
    x->pass_at += x->probe_plan;
    x->probe_plan = x->probe_read = 0;
    dsv4_cmp_progress_report(x, x->pass_at);
}

/* What a pass whose probes are built reads: the tie scan of its top-k probes, then every probe in both files
 * (the scan alone in a tie_only pass). */
double dsv4_cmp_pass_plan(const dsv4_cmp_ctx *x)
{
    double sum = 0;
    for (int i = 0; i < x->r->n_probes; i++) {
        const dsv4_verify_probe *p = &x->r->probes[i];
        if (p->presence != DSV4_VERIFY_IN_BOTH) continue;
        const int topk = p->kind == DSV4_VERIFY_KIND_TOPK;
        if (x->tie_only && !topk) continue;
        double b = dsv4_cmp_probe_plan(x, p);
        sum += topk && !x->tie_only ? 2 * b : b;
    }
    return sum;
}
