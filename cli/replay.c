/* replay.c - `dsv4 replay --model DIR CANDIDATE.h5 [--baseline B.h5] [options]`: judge a FREE-RUNNING candidate
 * layer by layer on its own inputs (layer-local replay, docs/verify.md "Layer-local replay").
 *
 * 1. `dsv4 run --path ref-cpu|ref-gpu --replay CANDIDATE.h5` (--path, default ref-cpu): the fp32 reference
 *    recomputes every layer from the candidate's streams, window KV, entries and choices (reference/ref_replay.c),
 *    into a temporary dump: what each layer adds to the candidate's state, at the positions replay compares.
 * 2. The same for the baseline, when given (a precision-matched run of the same tokens, e.g. the reference's bf16
 *    emulation free-running: `dsv4 run --path ref-cpu --emulate bf16 --tokens-from G.h5`), unless
 *    --baseline-replay names its replay already made (`--keep` of an earlier run): one baseline, many candidates.
 * 3. `dsv4 verify REPLAY(CANDIDATE) CANDIDATE`, in baseline mode with the baseline judged against its own replay
 *    (dsv4_verify_options.baseline_golden), else with --profile (default bf16): each layer's local error, the
 *    baseline's, the selections judged by the reference's scores on the candidate's inputs, and the first layer
 *    that breaks locally.
 * Exit status: verify's (0, 1, 2); 2 also when a replay cannot run (a candidate lacking what replay needs).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_verify.h"
#include "progress.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 replay --model DIR CANDIDATE.h5 [--path ref-cpu|ref-gpu [--gpu-weights W]]\n"
               "                   [--baseline B.h5 [--baseline-replay R.h5]] [--profile fp32|bf16|FILE]\n"
               "                   [--json OUT] [--html OUT] [--keep DIR] [--allow-different-weights] [--quiet]\n\n"
               "Judges a free-running candidate layer by layer on its OWN inputs: the fp32 reference\n"
               "recomputes every layer from the candidate's streams, window KV, compressed and indexer entries,\n"
               "top-k and router choices (dsv4 run --replay), and the candidate is compared with that, so an\n"
               "earlier near-tie flip does not compound into later layers and a bug shows at its own layer.\n\n"
               "  --model DIR          the model both ran\n"
               "  --path P             the reference that recomputes: ref-cpu (default) or ref-gpu (the same\n"
               "                       injection on the GPU: for models and contexts too large for the CPU)\n"
               "  --baseline B.h5      a precision-matched run of the same tokens (e.g. dsv4 run --path ref-cpu\n"
               "                       --emulate bf16 --tokens-from GOLDEN.h5), replayed the same way: each float\n"
               "                       probe's local error must stay within the baseline's local error (the gates\n"
               "                       of dsv4 verify --baseline); without it, the profile's fixed gates\n"
               "  --gpu-weights W      ref-gpu: auto, resident or stream (dsv4 run --help)\n"
               "  --baseline-replay R  the baseline's replay made before (replay-baseline.h5 of --keep): not\n"
               "                       replayed again (one baseline for many candidates)\n"
               "  --profile P          selections' rules (and, without --baseline, every gate); default bf16\n"
               "  --json/--html OUT    the verifier's reports\n"
               "  --keep DIR           keep the replay dumps there (replay-candidate.h5, replay-baseline.h5)\n"
               "  --allow-different-weights  replay dumps of other weights (same shapes) all the same\n"
               "  --quiet              no terminal report\n\n"
               "The candidate (and the baseline) must store, at the positions it stores, out, kv, attn_out,\n"
               "attn_hc_post, attn_hc_comb, router_ids and (CSA) topk_idx, and every compressed_kv / indexer_kv\n"
               "entry: a dump that lacks them is refused (exit 2) naming what is missing. A position is compared\n"
               "when its window (sliding_window positions up to it) is stored too: at long context store a few\n"
               "ranges of consecutive positions (docs/verify.md \"Replay at long context\").\n\n"
               "exit status: 0 every layer within tolerance locally, 1 a layer breaks locally (the report names\n"
               "the first), 2 could not replay or compare.\n");
}

/* dsv4 run --path PATH --replay DUMP --dump OUT (its own lines go to stdout: which replay ran, how long). */
static int replay_one(const char *model, const char *path, const char *gpu_weights, const char *dump, const char *out,
                      int allow_different_weights)
{
    char *argv[13] = {"run", "--model", (char *)model, "--path", (char *)path, "--replay", (char *)dump, "--dump",
                      (char *)out, NULL};
    int argc = 9;
    if (allow_different_weights) argv[argc++] = "--allow-different-weights";
    if (gpu_weights) {
        argv[argc++] = "--gpu-weights";
        argv[argc++] = (char *)gpu_weights;
    }
    return dsv4_cmd_run(argc, argv);
}

int dsv4_cmd_replay(int argc, char **argv)
{
    const char *model = NULL, *cand = NULL, *base = NULL, *profile = "bf16", *json = NULL, *html = NULL, *keep = NULL;
    const char *path = "ref-cpu", *base_replay = NULL, *gpu_weights = NULL;
    int allow = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = dsv4_cli_value(argc, argv, i);
        const char **slot = !strcmp(a, "--model")      ? &model
                            : !strcmp(a, "--baseline") ? &base
                            : !strcmp(a, "--profile")  ? &profile
                            : !strcmp(a, "--json")     ? &json
                            : !strcmp(a, "--html")     ? &html
                            : !strcmp(a, "--keep")     ? &keep
                            : !strcmp(a, "--path")     ? &path
                            : !strcmp(a, "--baseline-replay") ? &base_replay
                            : !strcmp(a, "--gpu-weights") ? &gpu_weights
                                                       : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (slot) {
            if (!v) {
                fprintf(stderr, "dsv4 replay: %s needs a value\n", a);
                return 2;
            }
            *slot = v;
            i++;
        } else if (!strcmp(a, "--allow-different-weights"))
            allow = 1;
        else if (!strcmp(a, "--quiet"))
            quiet = 1;
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsv4 replay: unknown option '%s' (see dsv4 replay --help)\n", a);
            return 2;
        } else if (!cand)
            cand = a;
        else {
            fprintf(stderr, "dsv4 replay: one candidate dump, got a second argument '%s'\n", a);
            return 2;
        }
    }
    if (!model || !cand) {
        fprintf(stderr, "dsv4 replay: %s (see dsv4 replay --help)\n",
                !model ? "--model DIR is required" : "give the candidate dump");
        return 2;
    }
    if (strcmp(path, "ref-cpu") && strcmp(path, "ref-gpu")) {
        fprintf(stderr, "dsv4 replay: --path '%s': want ref-cpu or ref-gpu (the fp32 references recompute)\n", path);
        return 2;
    }
    if (gpu_weights && strcmp(path, "ref-gpu")) {
        fprintf(stderr, "dsv4 replay: --gpu-weights is an option of --path ref-gpu (not of %s)\n", path);
        return 2;
    }
    if (base_replay && !base) {
        fprintf(stderr, "dsv4 replay: --baseline-replay %s needs --baseline (the run it is the replay of)\n",
                base_replay);
        return 2;
    }
    if (base_replay && access(base_replay, R_OK)) {
        fprintf(stderr, "dsv4 replay: --baseline-replay %s: cannot read it\n", base_replay);
        return 2;
    }
    char dir[4096], rc_path[4200], rb_path[4200];
    int made = 0;
    if (keep)
        snprintf(dir, sizeof dir, "%s", keep);
    else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/dsv4-replay-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "dsv4 replay: cannot make a temporary folder %s\n", dir);
            return 2;
        }
        made = 1;
    }
    snprintf(rc_path, sizeof rc_path, "%s/replay-candidate.h5", dir);
    snprintf(rb_path, sizeof rb_path, "%s/replay-baseline.h5", dir);
    int status = 2;
    printf("dsv4 replay: the candidate %s\n", cand);
    fflush(stdout);
    if (replay_one(model, path, gpu_weights, cand, rc_path, allow)) goto out;
    if (base && base_replay)
        printf("dsv4 replay: the baseline %s, its replay %s (made before)\n", base, base_replay);
    else if (base) {
        printf("dsv4 replay: the baseline %s\n", base);
        fflush(stdout);
        if (replay_one(model, path, gpu_weights, base, rb_path, allow)) goto out;
    }
    dsv4_verify_options o;
    dsv4_verify_options_init(&o);
    o.profile = profile;
    o.baseline = base;
    o.baseline_golden = base ? (base_replay ? base_replay : rb_path) : NULL;
    o.allow_different_weights = allow;
    cli_progress pr;
    cli_progress_init(&pr, "dsv4 replay");
    o.progress = cli_progress_verify;
    o.progress_ctx = &pr;
    dsv4_verify_result *r = NULL;
    int rc = dsv4_verify_run(rc_path, cand, &o, &r);
    cli_progress_end(&pr);
    if (rc) {
        fprintf(stderr, "dsv4 replay: %s\n", dsv4_last_error());
        goto out;
    }
    printf("dsv4 replay: the candidate's layers against the reference's replay of its own state%s\n\n",
           base ? ", and the baseline's against its own" : "");
    if (!quiet) dsv4_verify_write_text(r, stdout, isatty(STDOUT_FILENO));
    else if (r->status == DSV4_VERIFY_ERROR) fprintf(stderr, "dsv4 replay: %s\n", r->error);
    status = r->status;
    if (json && dsv4_verify_write_json(r, json)) status = 2;
    if (html && dsv4_verify_write_html(r, html)) status = 2;
    if (status == 2 && r->status != DSV4_VERIFY_ERROR) fprintf(stderr, "dsv4 replay: %s\n", dsv4_last_error());
    dsv4_verify_result_free(r);
out:
    if (made) {
        unlink(rc_path);
        unlink(rb_path);
        rmdir(dir);
    }
    return status;
}
