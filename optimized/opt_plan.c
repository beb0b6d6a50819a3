/* opt_plan.c - how a batch is cut into steps within a token budget (dsv4_opt.h "Chunk planning"): host-only,
 * in the CPU-only build too, tested by tests/test_opt_prefill_plan.c.
 *
 * Decodes first: a sequence that is generating waits at most for the decodes before it, never for a prompt (the
 * engines' "decode-first" chunked prefill); the prompts then fill the rest of the budget in sequence order, so
 * one prompt at a time finishes and starts decoding.
 *
 * The serving scheduler (opt_sched.c) packs its steps by the same rule but does not call this: it knows a decode by
 * its request's state (here want == 1 is one, so a prompt's last token or a chunk of 1 would jump the queue), orders
 * the prompts by admission rather than by slot, caps each at --prefill-chunk, and its budget always holds every
 * decode (here decodes may be cut).
 */
#include "dsv4/dsv4_opt.h"

int dsv4_opt_plan_step(int n_seq, const int32_t *want, int budget, int32_t *n)
{
    int left = budget > 0 ? budget : 0;
    for (int c = 0; c < n_seq; c++) {
        n[c] = 0;
        if (want[c] == 1 && left > 0) n[c] = 1, left--;
    }
    for (int c = 0; c < n_seq; c++) {
        if (want[c] <= 1 || left <= 0) continue;
        n[c] = want[c] < left ? want[c] : left;
        left -= n[c];
    }
    return (budget > 0 ? budget : 0) - left;
}
