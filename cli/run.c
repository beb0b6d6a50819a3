/* run.c - `dsv4 run`: run a path (ref-cpu, ref-gpu, opt) over a prompt and its decode steps, forced or greedy, and
 * write the probes to an HDF5 dump (dump-format.md).
 *
 * Tokens come from a golden dump (--tokens-from: /tokens, prompt_len, n_decode, mode and /positions, so the
 * new dump lines up with the golden row for row) or from a file of whitespace-separated ids (--prompt-tokens,
 * greedy decoding). The prompt is one prefill by default; --decode-from K prefills 0..K-1 and feeds every
 * later position as a one-token decode step (K = 0: token by token from position 0). Greedy feeds the argmax
 * of the previous position's logits (ties -> lowest id).
 * The optimized path (--path opt) feeds the prompt as one-token steps (exact: the same state machine) and can
 * run a batch of C copies of the sequence, copy c starting c steps later, dumping the copy --dump-seq, and can
 * follow a reference dump's discrete choices (--follow: topk_idx / router_ids; dsv4_opt.h "Decision following").
 * Both references can follow too, and round where the optimized path holds bf16 (--emulate bf16).
 * An option of one path given with another (--kv with ref-cpu, --emulate with opt, --decode-from K > 0 with opt),
 * a number that is empty or has trailing junk, and --decode-from past the prompt are usage errors (exit 2), never
 * ignored or clamped.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_dump.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4/dsv4_ref.h"
#include "progress.h"
#include "run_inputs.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 run --model DIR [--path ref-cpu|ref-gpu|opt] (--tokens-from GOLDEN.h5 | --prompt-tokens FILE)\n"
            "                [--decode N] [--greedy | --forced] [--decode-from K]\n"
            "                [--dump-positions LIST|all|decode] [--dump OUT.h5]\n"
            "                [--attn mma|simt] [--indexer bf16|fp32] [--mhc castfree|roundtrip]\n"
            "                [--index-context live|max] [--kv bf16|fp8] [--max-context N] [--batch C]\n"
            "                [--dump-seq I] [--graph on|off] [--gpus N] [--weights auto|bf16|fp8]\n"
            "                [--quantize none|fp8] [--follow DUMP.h5 [--allow-different-weights]]\n"
            "                [--probes NAMES] [--emulate none|bf16] [--gpu-weights auto|resident|stream]\n"
            "                [--replay CAND.h5] [--prefill-chunk N]\n\n"
            "Runs the model over a prompt (one prefill) and N one-token decode steps, and writes every probe of\n"
            "dump-format.md for the chosen positions to OUT.h5.\n\n"
            "  --model DIR            model folder: config.json + *.safetensors\n"
            "  --path P               ref-cpu (fp32 CPU reference, default), ref-gpu (fp32 GPU reference) or opt\n"
            "                         (optimized CUDA path, bf16 or fp8 weights; the prompt runs in chunks of\n"
            "                         --prefill-chunk tokens)\n"
            "  --tokens-from G.h5     take /tokens, prompt_len, n_decode, mode and /positions from a dump\n"
            "  --prompt-tokens FILE   prompt token ids, separated by whitespace or commas (decoding is greedy)\n"
            "  --decode N             decode steps after the prompt (default: the dump's n_decode, else 0)\n"
            "  --greedy               feed each step the argmax of the previous logits (ties: lowest id)\n"
            "  --forced               feed the dump's own tokens (default for a forced dump)\n"
            "  --decode-from K        prefill positions 0..K-1, then one-token decode steps from K\n"
            "                         (0..the prompt length, the default; 0 = the whole prompt token by token;\n"
            "                         --path opt prefills 0..K-1 in steps of --prefill-chunk tokens)\n"
            "  --dump-positions L     positions to store: comma list of ids, ranges and the words 'all' and\n"
            "                         'decode' (the last prompt position and every decode position), e.g.\n"
            "                         0,3,10-20,decode;\n"
            "                         default: the dump's /positions with --tokens-from, else all\n"
            "  --dump OUT.h5          write the dump (written to a temporary name, renamed when complete)\n"
            "  --probes NAMES         store only these probes, comma separated (default all), e.g.\n"
            "                         topk_idx,router_ids: the small dump of every position that --follow needs\n"
            "  --follow DUMP.h5       decision following (every path): at every position and layer where DUMP\n"
            "                         (a reference dump of the same tokens, e.g. --path ref-cpu --dump-positions\n"
            "                         all) holds topk_idx / router_ids, compute and dump the path's own selection,\n"
            "                         then run the rest of the step on DUMP's (experts weighted by the path's own\n"
            "                         scores); with opt only the --dump-seq copy follows. This is how the bf16 path\n"
            "                         is gated on small models, where one near-tie flip in bf16 changes 1 of 4 keys\n"
            "                         or experts (docs/optimized.md). Following stops at the first position whose\n"
            "                         token is not DUMP's (or past DUMP's tokens). DUMP must hold the model's\n"
            "                         weights_digest\n"
            "  --allow-different-weights  follow (or replay) a DUMP of other weights (same shapes) all the same\n"
            "  --replay CAND.h5       layer-local replay (ref-cpu or ref-gpu; docs/verify.md \"Layer-local\n"
            "                         replay\"): run CAND's tokens, every layer starting from CAND's streams and\n"
            "                         running on its window KV, entries, top-k and router choices, so the dump\n"
            "                         holds what each layer adds to CAND's own state. CAND needs, at the\n"
            "                         positions it stores, out, kv, attn_out, attn_hc_post/comb, router_ids,\n"
            "                         topk_idx, and every compressed/indexer entry; a position is compared when\n"
            "                         its window (sliding_window positions up to it) is stored too, and only the\n"
            "                         runs of stored positions holding one are computed. dsv4 replay judges CAND\n"
            "ref-cpu and ref-gpu only:\n"
            "  --emulate none|bf16    bf16: round to bf16 exactly where the optimized path holds bf16 (weights,\n"
            "                         residual streams, GEMM inputs, caches, attention P and outputs; docs/verify.md\n"
            "                         \"The bf16 emulation of the reference\"): an independent model of the bf16\n"
            "                         design's rounding error. Default none (the plain fp32 reference). ref-gpu\n"
            "                         rounds at the same places as ref-cpu (the baseline for models and prompts too\n"
            "                         large for the CPU); the two differ only in fp32 summation order, which the\n"
            "                         roundings amplify to bf16 size, so compare them with --profile bf16\n"
            "ref-gpu only:\n"
            "  --gpu-weights W        where ref-gpu holds its weights (docs/reference.md): resident (every\n"
            "                         weight as f32 on the GPU, uploaded at init), stream (the checkpoint's own\n"
            "                         bytes, FP8/FP4/bf16/f32, copied to the GPU a layer, a routed expert or a row\n"
            "                         range of the head at a time and dequantised there: GPU memory bounded by one\n"
            "                         layer whatever the model) or auto (the default: resident when the f32 model\n"
            "                         fits the GPU with 10%% to spare). Both give bitwise the same dump. The run\n"
            "                         ends with where ref-gpu's time and GPU memory went (DSV4_REF_GPU_SYNC=1 runs\n"
            "                         each stage alone, to time it)\n"
            "opt only (first value = default; the second is the naive variant of design.md; the references refuse\n"
            "these, exit 2):\n"
            "  --attn, --indexer, --mhc, --index-context, --kv   the switches, e.g. --mhc roundtrip\n"
            "  --max-context N        positions the caches are allocated for (default: the run's tokens)\n"
            "  --batch C              run C copies together, copy c starting c steps later (default 1); each\n"
            "                         step gives every decoding copy its token first, then the prefilling copies\n"
            "                         the rest of the --prefill-chunk budget in copy order (a mixed batch)\n"
            "  --prefill-chunk N      tokens one step may take over all copies (default 512; at least the batch):\n"
            "                         the prefill's chunk, which sizes the scratch (the memory plan, printed\n"
            "                         before allocation, says how much); 1 feeds the prompt token by token\n"
            "  --dump-seq I           the copy whose probes are dumped (default 0)\n"
            "  --graph on|off         replay the decode step as a CUDA graph (default on; a prefill step runs\n"
            "                         eagerly)\n"
            "  --gpus N               N ranks on GPUs 0..N-1 over NCCL, heads and experts split (docs/multigpu.md);\n"
            "                         N = 1 runs the NCCL path on one GPU (default: one GPU without NCCL); with\n"
            "                         --weights fp8 each rank holds its slices of the FP8 tensors with their scales\n"
            "  --weights W            auto, bf16 or fp8: how linears and experts are held on the GPU (auto, the\n"
            "                         default: the checkpoint's own format): fp8 keeps the FP8 e4m3 linears with\n"
            "                         their 128x128 block scales and the FP4 e2m1 routed experts as on disk\n"
            "                         (nothing expanded to bf16); bf16 dequantises them at load\n"
            "  --quantize none|fp8    fp8: quantise a bf16/f32 model's linears / experts at load into those formats\n"
            "                         (model-spec §3 rounding; implies --weights fp8 unless --weights bf16, which\n"
            "                         then holds the quantised values in bf16); none, the default: as on disk\n"
            "\n"
            "The dump's prompt_len is the prompt length whatever --decode-from says (its root attribute\n"
            "'prefill_len' records K), so dumps of one prompt line up. The references print their memory plan\n"
            "first (ref-cpu holds the checkpoint as on disk and dequantises a layer at a time: docs/reference.md)\n"
            "and refuse, exit 2, before anything heavy when it does not fit (DSV4_HOST_MEM_LIMIT /\n"
            "DSV4_DEVICE_MEM_LIMIT cap it). A progress line (tokens/s, ETA; per layer for ref-cpu) goes to\n"
            "stderr on runs longer than a few seconds, and one for the weights_digest that --dump and --follow\n"
            "need (SHA-256 of every weight byte: minutes for a full checkpoint; DSV4_PROGRESS_AFTER_S=0 shows\n"
            "them at once). The digest of a checkpoint of 1 GiB or more is cached, keyed by each file's size and\n"
            "mtime, under $XDG_CACHE_HOME/dsv4 or ~/.cache/dsv4 (DSV4_DIGEST_CACHE=DIR elsewhere, =off never).\n"
            "--probes and --dump-positions may each be given once (a second would replace the first); another\n"
            "option given twice takes its last value. Exit status: 0 ok, 1 the run failed, 2 bad usage,\n"
            "unreadable input or a reference that does not fit the memory.\n");
}

/* Whitespace/comma separated token ids of a file; *out malloc'd. */
static int read_token_file(const char *path, int32_t **out, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return dsv4_error(DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st; /* a folder opens, and reads as no ids; a pipe (<(...)) is a fine prompt */
    if (!fstat(fileno(f), &st) && S_ISDIR(st.st_mode)) {
        fclose(f);
        return dsv4_error(DSV4_ERR_IO, "%s: is a directory, not a file of token ids", path);
    }
    int cap = 256, len = 0;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    char word[64];
    int rc = 0;
    while (t && fscanf(f, " %63[^ \t\r\n,]", word) == 1) {
        char *end;
        errno = 0;
        long v = strtol(word, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX) {
            rc = dsv4_error(DSV4_ERR_FORMAT, "%s: '%s' at position %d is not a token id", path, word, len);
            break;
        }
        if (len == cap) {
            int32_t *nt = realloc(t, (size_t)cap * 2 * sizeof *t);
            if (!nt) { /* a prompt cut short here would run as if it were the whole one */
                rc = dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory after %d token ids", path, len);
                break;
            }
            t = nt;
            cap *= 2;
        }
        t[len++] = (int32_t)v;
        int c;
        while ((c = fgetc(f)) == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n') {}
        if (c != EOF) ungetc(c, f);
    }
    if (!rc && ferror(f)) rc = dsv4_error(DSV4_ERR_IO, "%s: read failed after %d token ids", path, len);
    fclose(f);
    if (!t) return dsv4_error(DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (!rc && len == 0) rc = dsv4_error(DSV4_ERR_FORMAT, "%s: no token ids", path);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    *n = len;
    return 0;
}

static int32_t argmax_lowest(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

typedef struct run_args {
    const char *model, *path, *tokens_from, *prompt_tokens, *positions, *dump, *follow, *probes, *replay;
    int decode, greedy, forced, decode_from;
    int allow_different_weights; /* --follow a dump of another weights_digest */
    int gpu_weights_given;       /* --gpu-weights: ref-gpu only */
    dsv4_opt_options opt; /* --path opt */
    dsv4_ref_options ref; /* --path ref-cpu, ref-gpu */
    int max_context;      /* 0: the run's length */
    int prefill_chunk;    /* --path opt: tokens per step (the step budget) */
    const char *opt_only; /* the first option given that only --path opt takes, or NULL */
} run_args;

/* A count option's value: decimal digits only (no sign, no blanks, not empty) in [lo, hi]. */
static int parse_count(const char *o, const char *v, long lo, long hi, int *out)
{
    if (!v) return dsv4_error(DSV4_ERR_USAGE, "%s needs a value", o);
    if (v[0] < '0' || v[0] > '9') goto bad;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*end || errno || n < lo || n > hi) goto bad;
    *out = (int)n;
    return 0;
bad:
    return dsv4_error(DSV4_ERR_USAGE, "%s: '%s' is not a count in [%ld, %ld]", o, v, lo, hi);
}

static int parse_args(int argc, char **argv, run_args *a)
{
    memset(a, 0, sizeof *a);
    a->path = "ref-cpu";
    a->decode = -1;
    a->decode_from = -1;
    dsv4_opt_options_default(&a->opt);
    dsv4_ref_options_default(&a->ref);
    a->max_context = 0;
    a->prefill_chunk = 512;
    dsv4_cli_seen lists = {{0}, 0};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = dsv4_cli_value(argc, argv, i);
#define TAKE(field)                                                                                              \
    do {                                                                                                         \
        if (!v) return dsv4_error(DSV4_ERR_USAGE, "%s needs a value", o);                                        \
        a->field = v;                                                                                            \
        i++;                                                                                                     \
    } while (0)
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return 1;
        else if ((!strcmp(o, "--probes") || !strcmp(o, "--dump-positions")) && dsv4_cli_list_again(&lists, o))
            return DSV4_ERR_USAGE; /* the message is recorded */
        else if (!strcmp(o, "--model")) TAKE(model);
        else if (!strcmp(o, "--path")) TAKE(path);
        else if (!strcmp(o, "--tokens-from")) TAKE(tokens_from);
        else if (!strcmp(o, "--prompt-tokens")) TAKE(prompt_tokens);
        else if (!strcmp(o, "--dump-positions")) TAKE(positions);
        else if (!strcmp(o, "--dump")) TAKE(dump);
        else if (!strcmp(o, "--follow")) TAKE(follow);
        else if (!strcmp(o, "--replay")) TAKE(replay);
        else if (!strcmp(o, "--probes")) TAKE(probes);
        else if (!strcmp(o, "--emulate")) {
            if (!v) return dsv4_error(DSV4_ERR_USAGE, "%s needs a value", o);
            int rc = dsv4_ref_emulate_parse(v, &a->ref.emulate);
            if (rc) return rc;
            i++;
        } else if (!strcmp(o, "--gpu-weights")) {
            if (!v) return dsv4_error(DSV4_ERR_USAGE, "%s needs a value", o);
            int rc = dsv4_ref_gpu_weights_parse(v, &a->ref.gpu_weights);
            if (rc) return rc;
            a->gpu_weights_given = 1;
            i++;
        } else if (!strcmp(o, "--allow-different-weights")) a->allow_different_weights = 1;
        else if (!strcmp(o, "--greedy")) a->greedy = 1;
        else if (!strcmp(o, "--forced")) a->forced = 1;
        else if (!strcmp(o, "--attn") || !strcmp(o, "--indexer") || !strcmp(o, "--mhc") ||
                 !strcmp(o, "--index-context") || !strcmp(o, "--kv") || !strcmp(o, "--weights") ||
                 !strcmp(o, "--quantize")) {
            if (!v) return dsv4_error(DSV4_ERR_USAGE, "%s needs a value", o);
            int rc = dsv4_opt_options_set(&a->opt, o + 2, v);
            if (rc) return rc;
            if (!a->opt_only) a->opt_only = o;
            i++;
        } else if (!strcmp(o, "--graph")) {
            if (!v || (strcmp(v, "on") && strcmp(v, "off")))
                return dsv4_error(DSV4_ERR_USAGE, "--graph: want on or off");
            a->opt.cuda_graph = !strcmp(v, "on");
            if (!a->opt_only) a->opt_only = o;
            i++;
        } else if (!strcmp(o, "--gpus")) {
            int rc = parse_count(o, v, 1, 64, &a->opt.n_gpus);
            if (rc) return rc;
            i++;
        } else if (!strcmp(o, "--max-context") || !strcmp(o, "--batch") || !strcmp(o, "--dump-seq")) {
            const int seq = !strcmp(o, "--dump-seq"), ctx = !strcmp(o, "--max-context");
            int n, rc = parse_count(o, v, seq ? 0 : 1, ctx ? DSV4_OPT_MAX_CONTEXT : DSV4_OPT_MAX_SEQ - seq, &n);
            if (rc) return rc;
            if (ctx) a->max_context = n;
            else if (seq) a->opt.dump_seq = n;
            else a->opt.n_seq = n;
            if (!a->opt_only) a->opt_only = o;
            i++;
        } else if (!strcmp(o, "--prefill-chunk")) {
            int rc = parse_count(o, v, 1, DSV4_OPT_MAX_STEP_TOKENS, &a->prefill_chunk);
            if (rc) return rc;
            if (!a->opt_only) a->opt_only = o;
            i++;
        } else if (!strcmp(o, "--decode") || !strcmp(o, "--decode-from")) {
            int rc = parse_count(o, v, 0, 100000000, !strcmp(o, "--decode") ? &a->decode : &a->decode_from);
            if (rc) return rc;
            i++;
        } else if (o[0] != '-')
            return dsv4_error(DSV4_ERR_USAGE, "unexpected argument '%s': dsv4 run takes options only (the model is "
                              "--model DIR; see dsv4 run --help)", o);
        else return dsv4_error(DSV4_ERR_USAGE, "unknown option '%s' (see dsv4 run --help)", o);
#undef TAKE
    }
    if (!a->model) return dsv4_error(DSV4_ERR_USAGE, "--model DIR is required (see dsv4 run --help)");
    if (a->replay) { /* the candidate's tokens, every position, one forward over them all */
        if (strcmp(a->path, "ref-cpu") && strcmp(a->path, "ref-gpu"))
            return dsv4_error(DSV4_ERR_USAGE, "--replay runs on --path ref-cpu or ref-gpu (not %s)", a->path);
        if (a->follow || a->ref.emulate != DSV4_REF_EMULATE_NONE || a->prompt_tokens || a->decode >= 0 ||
            a->decode_from >= 0 || a->greedy || a->positions)
            return dsv4_error(DSV4_ERR_USAGE, "--replay runs the plain fp32 reference on the candidate's tokens and "
                              "stores the positions it compares: not with --follow, --emulate, --prompt-tokens, "
                              "--decode, --decode-from, --greedy or --dump-positions");
        if (a->tokens_from && strcmp(a->tokens_from, a->replay))
            return dsv4_error(DSV4_ERR_USAGE, "--replay %s runs that dump's tokens: --tokens-from names another",
                              a->replay);
        a->tokens_from = a->replay;
        a->positions = "all";
    }
    if (!!a->tokens_from == !!a->prompt_tokens)
        return dsv4_error(DSV4_ERR_USAGE, "give exactly one of --tokens-from and --prompt-tokens");
    if (a->greedy && a->forced) return dsv4_error(DSV4_ERR_USAGE, "--greedy and --forced exclude each other");
    if (strcmp(a->path, "ref-cpu") && strcmp(a->path, "ref-gpu") && strcmp(a->path, "opt"))
        return dsv4_error(DSV4_ERR_USAGE, "--path '%s': want ref-cpu, ref-gpu or opt", a->path);
    if (a->opt_only && strcmp(a->path, "opt"))
        return dsv4_error(DSV4_ERR_USAGE, "%s is an option of --path opt (not of %s)", a->opt_only, a->path);
    if (a->opt.n_gpus > 0 && strcmp(a->path, "opt"))
        return dsv4_error(DSV4_ERR_USAGE, "--gpus is for --path opt (the references run on one device)");
    if (a->allow_different_weights && !a->follow && !a->replay)
        return dsv4_error(DSV4_ERR_USAGE, "--allow-different-weights applies to --follow and --replay");
    if (a->ref.emulate != DSV4_REF_EMULATE_NONE && !strcmp(a->path, "opt"))
        return dsv4_error(DSV4_ERR_USAGE, "--emulate is an option of --path ref-cpu and ref-gpu (not of %s: it is the "
                          "bf16 path itself)", a->path);
    if (a->gpu_weights_given && strcmp(a->path, "ref-gpu"))
        return dsv4_error(DSV4_ERR_USAGE, "--gpu-weights is an option of --path ref-gpu (not of %s%s)", a->path,
                          strcmp(a->path, "opt") ? ", which holds the checkpoint as on disk and dequantises a layer at "
                          "a time" : "; its own is --weights");
    const char *const inputs[3][2] = {{"--tokens-from", a->tokens_from}, {"--follow", a->follow},
                                      {"--prompt-tokens", a->prompt_tokens}};
    for (int i = 0; i < 3; i++) /* the dump replaces its final name when complete: never one of the run's inputs */
        if (dsv4_cli_same_file(a->dump, inputs[i][1]))
            return dsv4_error(DSV4_ERR_USAGE, "--dump %s: is the %s %s of this run; the new dump would replace it",
                              a->dump, inputs[i][0], i == 2 ? "file" : "dump");
    if (a->opt.n_seq < 1 || a->opt.dump_seq >= a->opt.n_seq)
        return dsv4_error(DSV4_ERR_USAGE, "--batch %d / --dump-seq %d: want 0 <= dump-seq < batch", a->opt.n_seq,
                          a->opt.dump_seq);
    return 0;
}

/* Tokens, prompt length, mode and default positions from the arguments (golden dump or token file). */
typedef struct run_plan {
    int32_t *tokens; /* [T] (greedy decode positions filled as they are produced) */
    int T, P;
    int greedy;
    int32_t *gold_pos; /* golden /positions (copy) or NULL */
    int n_gold_pos;
} run_plan;

static int make_plan(const run_args *a, run_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    int32_t *src = NULL;
    int n_src = 0, P = 0, n_dec = 0, rc = 0;
    if (a->tokens_from) {
        dsv4_dump *g = NULL;
        if ((rc = dsv4_dump_open(a->tokens_from, &g))) return rc;
        int n;
        const int32_t *t = dsv4_dump_tokens(g, &n);
        const int32_t *pos = dsv4_dump_positions(g, &pl->n_gold_pos);
        const char *mode = dsv4_dump_attr(g, "mode");
        P = dsv4_dump_prompt_len(g);
        n_dec = dsv4_dump_n_decode(g);
        pl->greedy = a->greedy || (!a->forced && mode && !strcmp(mode, "greedy"));
        src = malloc(((size_t)n + 1) * sizeof *src);
        pl->gold_pos = malloc(((size_t)pl->n_gold_pos + 1) * sizeof *pl->gold_pos);
        if (src && pl->gold_pos) {
            memcpy(src, t, (size_t)n * sizeof *src);
            memcpy(pl->gold_pos, pos, (size_t)pl->n_gold_pos * sizeof *pos);
        } else rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
        n_src = n;
        dsv4_dump_free(g);
        if (rc) goto fail;
        if (P < 1 || P > n_src) {
            rc = dsv4_error(DSV4_ERR_FORMAT, "%s: prompt_len %d with %d tokens", a->tokens_from, P, n_src);
            goto fail;
        }
        if (a->decode >= 0) {
            if (!pl->greedy && P + a->decode > n_src) {
                rc = dsv4_error(DSV4_ERR_USAGE, "--decode %d: the dump has only %d forced tokens after the prompt",
                                a->decode, n_src - P);
                goto fail;
            }
            n_dec = a->decode;
        }
    } else {
        if ((rc = read_token_file(a->prompt_tokens, &src, &n_src))) return rc;
        P = n_src;
        n_dec = a->decode > 0 ? a->decode : 0;
        if (a->forced && n_dec > 0) {
            rc = dsv4_error(DSV4_ERR_USAGE, "--forced decoding needs --tokens-from (a file holds only a prompt)");
            goto fail;
        }
        pl->greedy = 1;
    }
    pl->P = P;
    pl->T = P + n_dec;
    pl->tokens = malloc(((size_t)pl->T + 1) * sizeof *pl->tokens);
    if (!pl->tokens) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int p = 0; p < pl->T; p++) pl->tokens[p] = (p < P || !pl->greedy) ? src[p] : -1;
    free(src);
    return 0;
fail:
    free(src);
    free(pl->gold_pos);
    pl->gold_pos = NULL;
    return rc;
}

/* --path opt: C copies of the sequence, copy c starting at global step c (so the copies have different lengths at
 * every step). A copy before position K (the prefill) wants the rest of its prefill, after it one token; each step
 * takes what dsv4_opt_plan_step gives within the budget (decodes first, then the prefills in copy order: a copy
 * prefilling beside others decoding is the mixed batch). A greedy copy feeds its own argmax. pl->tokens receives
 * the dumped copy's tokens; *t_pre the time until every copy had passed K. */
static int run_opt_steps(dsv4_opt *op, const dsv4_opt_options *oo, run_plan *pl, int K, int budget,
                         dsv4_probe_sink *sink, cli_progress *pr, double *t_pre)
{
    const int C = oo->n_seq, T = pl->T;
    int32_t *tok = malloc((size_t)C * T * sizeof *tok), *in = malloc(((size_t)budget + C) * sizeof *in);
    int32_t *next = malloc((size_t)C * sizeof *next), *want = malloc((size_t)C * sizeof *want);
    int32_t *n = malloc((size_t)C * sizeof *n), *pos = calloc((size_t)C, sizeof *pos);
    int32_t *last = malloc((size_t)C * sizeof *last); /* each copy's argmax after its latest token */
    int rc = tok && in && next && want && n && pos && last ? 0 : dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    const double t0 = cli_now_s();
    *t_pre = 0.0;
    int prefilled = K <= 0;
    for (int c = 0; !rc && c < C; c++) memcpy(tok + (size_t)c * T, pl->tokens, (size_t)T * sizeof *tok);
    for (int s = 0; !rc; s++) {
        int busy = 0;
        for (int c = 0; c < C; c++) {
            want[c] = c > s || pos[c] >= T ? 0 : pos[c] < K ? K - pos[c] : 1;
            busy |= c > s || pos[c] < T;
        }
        if (!busy) break;
        const int total = dsv4_opt_plan_step(C, want, budget, n);
        for (int c = 0, k = 0; c < C; c++)
            for (int j = 0; j < n[c]; j++) {
                const int p = pos[c] + j;
                if (tok[(size_t)c * T + p] < 0) tok[(size_t)c * T + p] = last[c]; /* greedy: p >= P >= 1, n = 1 */
                in[k++] = tok[(size_t)c * T + p];
            }
        if (total > 0) rc = dsv4_opt_step_ragged(op, in, n, sink, NULL, next);
        int all_past_k = 1;
        for (int c = 0; !rc && c < C; c++) {
            if (n[c] > 0) last[c] = next[c];
            pos[c] += n[c];
            all_past_k &= pos[c] >= K;
        }
        if (!prefilled && all_past_k) prefilled = 1, *t_pre = cli_now_s() - t0;
        cli_progress_positions(pr, pos[oo->dump_seq], T);
    }
    if (!rc) memcpy(pl->tokens, tok + (size_t)oo->dump_seq * T, (size_t)T * sizeof *tok);
    free(tok);
    free(in);
    free(next);
    free(want);
    free(n);
    free(pos);
    free(last);
    return rc;
}

/* --follow: load the table and check the dump ran the same prompt (forced runs: every common token), so the
 * choices followed are about this text; a greedy run is checked over the prompt, the step stops at a token that
 * differs later. */
static int follow_open(const char *path, const dsv4_config *cfg, const run_plan *pl, const char *digest,
                       int allow_different_weights, dsv4_opt_follow **out)
{
    int rc = dsv4_opt_follow_load(path, cfg, out);
    if (rc) return rc;
    /* the same check as dsv4 verify's: a dump of other weights of the same shapes would be followed silently */
    const char *theirs = dsv4_opt_follow_weights_digest(*out);
    if (strcmp(theirs, digest) && !allow_different_weights)
        return dsv4_error(DSV4_ERR_USAGE, "--follow %s: its weights_digest %s is not the model's %s (a dump of other "
                          "weights; --allow-different-weights follows it anyway)", path, theirs, digest);
    int n;
    const int32_t *t = dsv4_opt_follow_tokens(*out, &n);
    const int upto = pl->greedy ? pl->P : pl->T;
    for (int p = 0; p < upto && p < n; p++)
        if (t[p] != pl->tokens[p])
            return dsv4_error(DSV4_ERR_USAGE, "--follow %s: its token at position %d is %d, the run's is %d (follow a "
                              "dump of the same tokens, e.g. made with --tokens-from the same file)", path, p, t[p],
                              pl->tokens[p]);
    return 0;
}

/* The root attribute "command": the command line of this run (dump-format.md extras). */
static int write_command_attr(dsv4_dump_writer *w, int argc, char **argv)
{
    size_t len = 16;
    for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
    char *cmd = malloc(len);
    if (!cmd) return dsv4_error(DSV4_ERR_NOMEM, "out of memory");
    size_t o = (size_t)snprintf(cmd, len, "dsv4");
    for (int i = 0; i < argc; i++) o += (size_t)snprintf(cmd + o, len - o, " %s", argv[i]);
    int rc = dsv4_dump_writer_attr(w, "command", cmd);
    free(cmd);
    return rc;
}

/* Where ref-gpu's time and memory went: "ref-gpu weights:" (the mode, the GPU memory against the plan) and one
 * "ref-gpu time" line per stretch (the prefill, the decode steps) with the fill / copy / dequantisation sums. */
static void print_gpu_stats(const dsv4_ref *ref, const dsv4_ref_gpu_stats *pre, int K, int n_steps, double plan)
{
    dsv4_ref_gpu_stats end;
    dsv4_ref_gpu_stats_get(ref, &end);
    if (!end.gpu) return;
    char b[5][32];
    printf("ref-gpu weights: %s; GPU memory: %s allocated by the reference (plan %s); cudaMemGetInfo: %s at init, %s "
           "at the most (what CUDA makes lazily included), %s in use before\n", end.streamed ? "streamed" : "resident",
           dsv4_mem_format(end.gpu_alloc, b[0], 32), dsv4_mem_format(plan, b[1], 32),
           dsv4_mem_format(end.gpu_init, b[2], 32), dsv4_mem_format(end.gpu_peak, b[3], 32),
           dsv4_mem_format(end.gpu_base, b[4], 32));
    if (!end.streamed) return;
    const dsv4_ref_gpu_stats *from[2] = {NULL, pre}, *to[2] = {pre, &end};
    const char *what[2] = {"prefill", "decode"};
    const int n[2] = {K > 0 ? 1 : 0, n_steps};
    for (int i = 0; i < 2; i++) {
        dsv4_ref_gpu_stats z, d;
        memset(&z, 0, sizeof z);
        const dsv4_ref_gpu_stats *a = from[i] ? from[i] : &z, *c = to[i];
        if (!n[i] || c->calls == a->calls) continue;
        d.calls = c->calls - a->calls;
        d.wall_s = c->wall_s - a->wall_s;
        d.bytes = c->bytes - a->bytes;
        d.fill_s = c->fill_s - a->fill_s;
        d.wait_s = c->wait_s - a->wait_s;
        d.copy_s = c->copy_s - a->copy_s;
        d.dequant_s = c->dequant_s - a->dequant_s;
        const double per = (double)d.calls;
        printf("ref-gpu time, %s (%ld call%s%s): per call %.3f s wall, %.2f GB copied (%ld dense, %ld head, %ld "
               "expert parts); host fill %.3f s (%.2f GB/s), H2D %.3f s (%.2f GB/s), GPU dequant %.3f s, host waits "
               "%.3f s", what[i], d.calls, d.calls == 1 ? "" : "s",
               end.sync ? ", DSV4_REF_GPU_SYNC=1: each stage alone" : ", overlapped", d.wall_s / per,
               d.bytes / 1e9 / per, (c->dense_parts - a->dense_parts) / d.calls, (c->head_parts - a->head_parts) /
               d.calls, (c->expert_parts - a->expert_parts) / d.calls, d.fill_s / per,
               d.fill_s > 0 ? d.bytes / 1e9 / d.fill_s : 0.0, d.copy_s / per,
               d.copy_s > 0 ? d.bytes / 1e9 / d.copy_s : 0.0, d.dequant_s / per, d.wait_s / per);
        if (end.sync) /* nothing overlapped: what is left of the wall time is the compute */
            printf(", compute (GEMMs, the other kernels, launches) %.3f s",
                   (d.wall_s - d.fill_s - d.copy_s - d.dequant_s - d.wait_s) / per);
        printf("\n");
    }
}

static int exit_code(int rc) { return rc == DSV4_ERR_USAGE || rc == DSV4_ERR_IO || rc == DSV4_ERR_FORMAT ||
                                      rc == DSV4_ERR_CONFIG || rc == DSV4_ERR_MISSING || rc == DSV4_ERR_SHAPE ||
                                      rc == DSV4_ERR_UNSUPPORTED ? 2 : 1; }

int dsv4_cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) {
        run_usage(stdout);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "dsv4 run: %s\n", dsv4_last_error());
        return 2;
    }
    run_plan pl;
    dsv4_model *m = NULL;
    dsv4_ref *ref = NULL;
    dsv4_opt *op = NULL;
    dsv4_opt_follow *follow = NULL;
    dsv4_ref_replay *replay = NULL;
    dsv4_dump_writer *w = NULL;
    dsv4_probe_sink *sink = NULL;
    int32_t *positions = NULL;
    float *logits = NULL;
    int n_pos = 0, refused = 0; /* refused: the memory plan does not fit (exit 2) */
    double plan_total = 0;     /* the reference's memory plan, bytes */
    dsv4_ref_gpu_stats gs_pre; /* ref-gpu: the stats after the prefill */
    memset(&gs_pre, 0, sizeof gs_pre);
    if ((rc = make_plan(&a, &pl))) {
        fprintf(stderr, "dsv4 run: %s\n", dsv4_last_error());
        return exit_code(rc);
    }
    if (a.decode_from > pl.P) { /* decode positions are not prefilled (a greedy one's token is not known yet) */
        rc = dsv4_error(DSV4_ERR_USAGE, "--decode-from %d: past the prompt of %d tokens (want 0..%d)",
                        a.decode_from, pl.P, pl.P);
        goto out;
    }
    int K = a.decode_from >= 0 ? a.decode_from : pl.P;
    if (a.replay) K = pl.T; /* the plan of one forward over every token (the replay runs its segments: fewer) */
    const int use_opt = !strcmp(a.path, "opt");

    /* the positions before the model: a bad list is a usage error before any loading */
    if (a.positions) rc = dsv4_cli_parse_positions(a.positions, pl.T, pl.P, &positions, &n_pos);
    else if (pl.gold_pos) {
        positions = malloc(((size_t)pl.n_gold_pos + 1) * sizeof *positions);
        if (!positions) rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
        for (int i = 0; positions && i < pl.n_gold_pos; i++)
            if (pl.gold_pos[i] < pl.T) positions[n_pos++] = pl.gold_pos[i];
    } else rc = dsv4_cli_parse_positions("all", pl.T, pl.P, &positions, &n_pos);
    if (rc) goto out;

    if (use_opt && a.max_context > 0 && a.max_context < pl.T) { /* it failed at that step, after the whole load */
        rc = dsv4_error(DSV4_ERR_USAGE, "--max-context %d: the run has %d positions (prompt + decode), the caches "
                        "must hold them all", a.max_context, pl.T);
        goto out;
    }
    if (use_opt && !a.max_context && pl.T > DSV4_OPT_MAX_CONTEXT) {
        rc = dsv4_error(DSV4_ERR_USAGE, "the run has %d positions, past the %d the optimized path's caches hold",
                        pl.T, DSV4_OPT_MAX_CONTEXT);
        goto out;
    }

    if ((rc = dsv4_model_open(a.model, &m))) goto out;
    const dsv4_config *cfg = dsv4_model_config(m);
    for (int p = 0; p < pl.T; p++) /* the paths refuse such a token too, but without naming where it came from */
        if (pl.tokens[p] >= cfg->vocab_size || (pl.tokens[p] < 0 && (p < pl.P || !pl.greedy))) {
            rc = dsv4_error(DSV4_ERR_USAGE, "%s: token %d at position %d is outside the model's vocabulary of %d "
                            "(%s; a prompt for another model?)", a.tokens_from ? a.tokens_from : a.prompt_tokens,
                            pl.tokens[p], p, cfg->vocab_size, a.model);
            goto out;
        }
    if (pl.T > cfg->max_position_embeddings) /* run anyway, as transformers does; but say it */
        fprintf(stderr, "dsv4 run: note: the run has %d positions, past the model's max_position_embeddings of "
                "%lld (%s/config.json); positions beyond it were not trained\n", pl.T,
                (long long)cfg->max_position_embeddings, a.model);
    /* the plan before anything heavy (the digest reads every byte): a reference run that cannot fit says so now,
     * with the numbers, and exits 2 (the input cannot be run here) */
    if (!use_opt) {
        dsv4_ref_plan plan;
        char line[1200];
        rc = !strcmp(a.path, "ref-cpu") ? dsv4_ref_cpu_plan(m, pl.T, K, &a.ref, &plan)
                                        : dsv4_ref_gpu_plan(m, pl.T, &a.ref, &plan);
        if (rc) {
            refused = rc == DSV4_ERR_NOMEM;
            goto out;
        }
        printf("dsv4 run: %s memory plan: %s\n", a.path, dsv4_ref_plan_describe(&plan, pl.T, K, line, sizeof line));
        fflush(stdout);
        plan_total = plan.total;
    }
    char digest[65] = ""; /* hashes every weight byte: only when a dump, --follow or --replay needs it, once */
    if (a.dump || a.follow || a.replay) {
        cli_progress dpr;
        cli_progress_init(&dpr, "dsv4 run");
        int cached = 0;
        rc = dsv4_model_weights_digest_cached(m, digest, cli_progress_digest, &dpr, &cached);
        cli_progress_end(&dpr);
        if (rc) goto out;
        if (cached) fprintf(stderr, "dsv4 run: weights_digest from the cache (keyed by each file's size and mtime; "
                            "DSV4_DIGEST_CACHE=off hashes the files again)\n");
    }
    cli_progress pr; /* position D/T, tokens/s of the last interval, ETA; a reference's layers (cli/progress.h) */
    cli_progress_init(&pr, "dsv4 run");
    a.ref.layer_progress = cli_progress_layer;
    a.ref.progress_ctx = &pr;
    if (use_opt) {
        a.opt.max_context = a.max_context > 0 ? a.max_context : pl.T;
        /* the step budget: the prefill chunk, and at least one token per copy (no prefill: a decode step) */
        a.opt.max_step_tokens = K > 1 && a.prefill_chunk > a.opt.n_seq ? a.prefill_chunk : a.opt.n_seq;
        a.opt.print_plan = 1;
        if (a.follow && (rc = follow_open(a.follow, cfg, &pl, digest, a.allow_different_weights, &follow))) goto out;
        a.opt.follow = follow;
        rc = dsv4_opt_init(m, &a.opt, &op);
    } else {
        if (a.follow && (rc = follow_open(a.follow, cfg, &pl, digest, a.allow_different_weights, &follow))) goto out;
        a.ref.follow = follow;
        if (a.replay && (rc = dsv4_cli_replay_open(a.replay, cfg, digest, a.allow_different_weights, &replay)))
            goto out;
        a.ref.replay = replay;
        if (replay) { /* the dump stores the positions replay compares (those whose window the candidate stored) */
            int n_cmp;
            const int32_t *cmp = dsv4_ref_replay_compared(replay, &n_cmp);
            int32_t *np = malloc(((size_t)n_cmp + 1) * sizeof *np);
            if (!np) {
                rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
                goto out;
            }
            memcpy(np, cmp, (size_t)n_cmp * sizeof *np);
            free(positions);
            positions = np;
            n_pos = n_cmp;
            printf("dsv4 run: replay of %s: %d positions compared, in %d segment%s run\n", a.replay, n_cmp,
                   dsv4_ref_replay_segments(replay), dsv4_ref_replay_segments(replay) == 1 ? "" : "s");
        }
        if (!strcmp(a.path, "ref-cpu")) rc = dsv4_ref_cpu_init_opts(m, pl.T, &a.ref, &ref);
        else rc = dsv4_ref_gpu_init_opts(m, pl.T, &a.ref, &ref);
    }
    if (rc) goto out;
    const char *producer = op ? dsv4_opt_producer(op) : dsv4_ref_producer(ref);
    if (op) { /* the memory per layer of this weights mode (issue 11 asks for both modes) */
        size_t wb, sb, xb;
        char b[3][32];
        dsv4_opt_memory(op, &wb, &sb, &xb);
        printf("dsv4 run: opt memory: weights %s (%s), caches %s, scratch %s; weights per layer:",
               dsv4_mem_format((double)wb, b[0], 32), dsv4_opt_weights_name(dsv4_opt_weights_mode(op)),
               dsv4_mem_format((double)sb, b[1], 32), dsv4_mem_format((double)xb, b[2], 32));
        for (int L = 0; L < cfg->num_hidden_layers; L++)
            printf(" %zu", dsv4_opt_layer_weight_bytes(op, L));
        printf(" bytes; rest (embed, head, ...) %zu bytes\n", dsv4_opt_layer_weight_bytes(op, -1));
        if (a.opt.n_gpus > 0) printf("dsv4 run: opt memory above is rank 0's shard of %d ranks\n", a.opt.n_gpus);
    }

    if (a.dump) {
        dsv4_dump_meta meta = {
            .producer = producer,
            .config_json = dsv4_model_config_json(m),
            .weights_digest = digest,
            .prompt_len = pl.P,
            .n_decode = pl.T - pl.P,
            .mode = pl.greedy ? "greedy" : "forced",
        };
        if ((rc = dsv4_dump_writer_open(a.dump, &meta, cfg, pl.tokens, pl.T, positions, n_pos, &w))) goto out;
        char kbuf[32];
        snprintf(kbuf, sizeof kbuf, "%d", K);
        if ((rc = dsv4_dump_writer_attr(w, "prefill_len", kbuf))) goto out;
        if ((follow || replay || a.ref.emulate != DSV4_REF_EMULATE_NONE) && (rc = write_command_attr(w, argc, argv)))
            goto out; /* says which dump it followed, what it rounded */
        if ((rc = dsv4_probe_sink_init(w, cfg, positions, n_pos, pl.T, &sink))) goto out;
        if ((rc = dsv4_probe_sink_keep(sink, a.probes))) goto out;
    }

    logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    if (!logits) {
        rc = dsv4_error(DSV4_ERR_NOMEM, "out of memory");
        goto out;
    }
    double t_pre0 = cli_now_s(), t_pre = 0.0;
    if (replay) { /* the segments, then no decode step: the positions are the candidate's */
        cli_progress_call(&pr, 0, K, pl.T);
        if ((rc = dsv4_ref_replay_run(ref, sink))) goto out;
        t_pre = cli_now_s() - t_pre0;
    } else if (K > 0 && !op) {
        cli_progress_call(&pr, 0, K, pl.T);
        if ((rc = dsv4_ref_prefill(ref, pl.tokens, K, sink, logits))) goto out;
        t_pre = cli_now_s() - t_pre0;
    }
    if (ref) dsv4_ref_gpu_stats_get(ref, &gs_pre);
    double t_dec0 = cli_now_s();
    pr.last = t_dec0;
    pr.last_done = op ? 0 : K;
    if (op) {
        rc = run_opt_steps(op, &a.opt, &pl, K, a.opt.max_step_tokens, sink, &pr, &t_pre);
        t_dec0 += t_pre; /* the decode stretch starts where the prefill ended */
    }
    for (int p = K; !op && p < pl.T; p++) {
        if (pl.tokens[p] < 0) pl.tokens[p] = argmax_lowest(logits, cfg->vocab_size); /* greedy: p >= P >= 1 */
        cli_progress_call(&pr, p, 1, pl.T);
        if ((rc = dsv4_ref_decode(ref, pl.tokens[p], sink, logits))) goto out;
        cli_progress_positions(&pr, p + 1, pl.T);
    }
    if (rc) goto out;
    double t_dec = cli_now_s() - t_dec0;
    cli_progress_end(&pr);

    if (w) {
        if ((rc = op ? dsv4_opt_dump_entries(op, sink) : dsv4_ref_dump_entries(ref, sink))) goto out;
        if (pl.greedy && (rc = dsv4_dump_writer_set_tokens(w, pl.tokens, pl.T))) goto out;
        dsv4_probe_sink_free(sink);
        sink = NULL;
        rc = dsv4_dump_writer_commit(w);
        w = NULL;
        if (rc) goto out;
    }
    int n_steps = pl.T - K;
    printf("dsv4 run: %s, %d prompt tokens (prefill %d in %.3f s, %.1f tokens/s), %d decode steps in %.3f s "
           "(%.2f tokens/s), mode %s\n",
           producer, pl.P, K, t_pre, K > 0 && t_pre > 0 ? K / t_pre : 0.0, n_steps, t_dec,
           n_steps > 0 ? n_steps / t_dec : 0.0, pl.greedy ? "greedy" : "forced");
    if (op) printf("dsv4 run: opt prefill chunk %d tokens per step\n", a.opt.max_step_tokens);
    if (pl.T > pl.P) {
        printf("tokens after the prompt:");
        for (int p = pl.P; p < pl.T; p++) printf(" %d", pl.tokens[p]);
        printf("\n");
    }
    if (a.dump) printf("dump: %s (%d positions)\n", a.dump, n_pos);
    if (ref) print_gpu_stats(ref, &gs_pre, K, n_steps, plan_total);
    if (follow) {
        dsv4_opt_follow_stats fs;
        if (op) {
            if ((rc = dsv4_opt_follow_stats_get(op, &fs))) goto out;
        } else {
            dsv4_ref_follow_stats rs;
            dsv4_ref_follow_stats_get(ref, &rs);
            fs = (dsv4_opt_follow_stats){.topk_rows = rs.topk_rows, .topk_changed = rs.topk_changed,
                                         .router_rows = rs.router_rows, .router_changed = rs.router_changed,
                                         .stopped_at = rs.stopped_at};
        }
        printf("follow: %s: %ld top-k rows followed (%ld ran on the dump's picks, not the path's), %ld router rows "
               "(%ld on the dump's experts)", a.follow, fs.topk_rows, fs.topk_changed, fs.router_rows,
               fs.router_changed);
        int n_follow;
        dsv4_opt_follow_tokens(follow, &n_follow);
        if (fs.stopped_at >= n_follow) printf("; stopped at position %d, past the dump's %d tokens", fs.stopped_at,
                                              n_follow);
        else if (fs.stopped_at >= 0) printf("; stopped at position %d, whose token is not the dump's", fs.stopped_at);
        printf("\n");
    }
out:
    if (rc) fprintf(stderr, "dsv4 run: %s\n", dsv4_last_error());
    dsv4_probe_sink_free(sink);
    dsv4_dump_writer_abort(w);
    dsv4_ref_free(ref);
    dsv4_opt_free(op);
    dsv4_opt_follow_free(follow);
    dsv4_ref_replay_free(replay);
    dsv4_model_free(m);
    free(logits);
    free(positions);
    free(pl.tokens);
    free(pl.gold_pos);
    return rc ? (refused ? 2 : exit_code(rc)) : 0;
}
