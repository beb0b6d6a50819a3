/* bench_serve.c - `dsv4 bench --serve`: serving-shaped throughput of the optimized path (issue 37; docs/bench.md
 * "Serving runs"). Requests of random token ids go through the scheduler (optimized/opt_sched.c) at concurrency C;
 * each planned step is one dsv4_opt_step_ragged over the slots' runs; the metrics are vLLM's (dsv4_serve.h).
 *
 * Invariants that fail quietly:
 * - One cache slot of the optimized path per request in flight (n_seq = C); a slot is reset (dsv4_opt_reset) before
 *   the first run of its next request, so no request sees another's state.
 * - A request's prompt ids are drawn from (seed, request, position) on the fly; a decode feeds the slot's previous
 *   greedy token (the step's `next`), as a server does. EOS is ignored.
 * - The clock is host wall time: a step's end is when dsv4_opt_step_ragged returns (it reads the greedy ids back,
 *   so the GPU work is done). Arrivals are compared with the same clock, so with --rate the composition of the steps
 *   depends on how fast the previous ones ran (as in a server); with all requests at once it does not.
 * - The warm-up requests run through their own scheduler before the measured ones (same instance: graphs captured,
 *   caches touched); the measured clock starts at 0 when they are sent.
 * - Every configuration of one C is built from the same config and seed: bit-identical weights.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_model.h"
#include "bench_serve_args.h"
#include "commands.h"
#include "dsv4/dsv4.h"
#include "dsv4/dsv4_opt.h"
#include "dsv4/dsv4_serve.h"
#include "progress.h"

#ifndef DSV4_HAVE_CUDA
int bench_serve(int argc, char **argv)
{
    serve_args a;
    int rc = serve_check_args(argc, argv, &a);
    if (rc)
        return rc;
    fprintf(stderr, "dsv4 bench --serve: this build has no CUDA (configure with a CUDA compiler)\n");
    return 2;
}
#else

#include <cuda_runtime_api.h>
#include <jansson.h>

static double t_start;
#define progress(...) cli_progress_note("serve", t_start, __VA_ARGS__)

/* What one served workload measured besides the per-request metrics. */
typedef struct serve_steps {
    int steps, prefill_steps, decode_steps; /* steps with prompt tokens / with decode tokens only */
    long long prefill_tokens, decode_tokens;
    double prefill_s, decode_s;             /* wall time of steps with prompt tokens / of decode-only steps */
    double step_ms_median, decode_step_ms_median;
} serve_steps;

typedef struct serve_buffers {
    int32_t *tokens, *n_tok, *next, *last;
    double *step_ms, *decode_ms;
    int cap_steps;
} serve_buffers;

/* The median of x[n] (sorted in place; 0 when n = 0): the serving metrics' percentile, numpy's linear one. */
static double median_of(double *x, int n)
{
    dsv4_serve_dist d;
    dsv4_serve_dist_of(x, n, &d);
    return d.median;
}

/* Serve reqs[n] on o to the end. label names the run in the progress lines. */
static int serve(dsv4_opt *o, const serve_args *a, int C, const dsv4_serve_request *reqs, int n, unsigned long long
                 prompt_seed, int vocab, serve_buffers *b, dsv4_serve_sched **out, serve_steps *st, const char *label)
{
    const dsv4_serve_config cfg = serve_config(a, C);
    dsv4_serve_sched *s = NULL;
    char err[512];
    int rc = dsv4_serve_sched_init(&s, &cfg, reqs, n, err, sizeof err);
    if (rc)
        return dsv4_error(rc, "%s", err);
    memset(st, 0, sizeof *st);
    int n_dec = 0;
    const double t0 = cli_now_s();
    double last_report = t0;
    while (!dsv4_serve_sched_done(s)) {
        const dsv4_serve_step *step;
        double next_arrival;
        if (!dsv4_serve_sched_plan(s, cli_now_s() - t0, &step, &next_arrival)) {
            if (next_arrival < 0)
                break;
            const double wait = next_arrival - (cli_now_s() - t0);
            if (wait > 0) {
                struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        /* the runs back to back in slot order */
        int off[DSV4_OPT_MAX_SEQ];
        memset(b->n_tok, 0, (size_t)C * sizeof *b->n_tok);
        for (int u = 0; u < step->n_runs; u++)
            b->n_tok[step->runs[u].slot] = step->runs[u].n_tokens;
        for (int c = 0, at = 0; c < C; c++)
            off[c] = at, at += b->n_tok[c];
        for (int u = 0; u < step->n_runs && !rc; u++) {
            const dsv4_serve_run *r = &step->runs[u];
            if (r->starts)
                rc = dsv4_opt_reset(o, r->slot);
            for (int k = 0; k < r->n_tokens; k++)
                b->tokens[off[r->slot] + k] = r->is_decode ? b->last[r->slot]
                                                           : dsv4_serve_prompt_token(prompt_seed, r->request,
                                                                                     r->first_pos + k, vocab);
        }
        const double ts0 = cli_now_s();
        if (!rc)
            rc = dsv4_opt_step_ragged(o, b->tokens, b->n_tok, NULL, NULL, b->next);
        const double ts1 = cli_now_s();
        if (rc)
            break;
        for (int u = 0; u < step->n_runs; u++)
            if (step->runs[u].yields_token)
                b->last[step->runs[u].slot] = b->next[step->runs[u].slot];
        const double ms = 1e3 * (ts1 - ts0);
        if (st->steps < b->cap_steps)
            b->step_ms[st->steps] = ms;
        st->steps++;
        if (step->n_prefill_tokens > 0)
            st->prefill_steps++, st->prefill_s += ms / 1e3;
        else {
            st->decode_steps++, st->decode_s += ms / 1e3;
            if (n_dec < b->cap_steps)
                b->decode_ms[n_dec++] = ms;
        }
        st->prefill_tokens += step->n_prefill_tokens, st->decode_tokens += step->n_decode_tokens;
        dsv4_serve_sched_complete(s, ts1 - t0);
        if (ts1 - last_report > 2.0) {
            int fin = 0;
            for (int i = 0; i < n; i++)
                fin += isfinite(dsv4_serve_sched_timeline(s, i)->finished_s);
            progress("%s: %d/%d requests done, %d steps, %.0f tokens/s out", label, fin, n, st->steps,
                     (double)st->decode_tokens / (ts1 - t0));
            last_report = ts1;
        }
    }
    if (rc) {
        dsv4_serve_sched_free(s);
        return rc;
    }
    st->step_ms_median = median_of(b->step_ms, st->steps < b->cap_steps ? st->steps : b->cap_steps);
    st->decode_step_ms_median = median_of(b->decode_ms, n_dec);
    *out = s;
    return 0;
}

static json_t *dist_json(const dsv4_serve_dist *d)
{
    return json_pack("{s:i, s:f, s:f, s:f, s:f}", "n", d->n, "mean_ms", 1e3 * d->mean, "median_ms", 1e3 * d->median,
                     "p99_ms", 1e3 * d->p99, "max_ms", 1e3 * d->max);
}

static json_t *run_json(const char *config, int C, const dsv4_serve_request *reqs, int n, const dsv4_serve_sched *s,
                        const dsv4_serve_metrics *m, const serve_steps *st)
{
    json_t *timelines = json_array();
    for (int i = 0; i < n; i++) {
        const dsv4_serve_timeline *t = dsv4_serve_sched_timeline(s, i);
        json_t *tok = json_array();
        for (int k = 0; k < t->n_tokens_out; k++) /* ms since the run started, 3 decimals */
            json_array_append_new(tok, json_real(round(1e6 * t->token_s[k]) / 1e3));
        json_array_append_new(timelines, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:o}", "request", i,
                                                   "input_len", reqs[i].input_len, "output_len", reqs[i].output_len,
                                                   "arrival_ms", 1e3 * reqs[i].arrival_s, "admitted_ms",
                                                   1e3 * t->admitted_s, "first_token_ms", 1e3 * t->first_token_s,
                                                   "finished_ms", 1e3 * t->finished_s, "token_ms", tok));
    }
    json_t *r = json_pack("{s:s, s:i, s:i, s:f, s:I, s:I, s:f, s:f, s:f, s:f}", "config", config, "concurrency", C,
                          "requests", n, "duration_s", m->duration_s, "input_tokens", m->input_tokens,
                          "output_tokens", m->output_tokens, "request_throughput", m->request_throughput,
                          "input_throughput", m->input_throughput, "output_throughput", m->output_throughput,
                          "total_throughput", m->total_throughput);
    json_object_set_new(r, "ttft", dist_json(&m->ttft));
    json_object_set_new(r, "tpot", dist_json(&m->tpot));
    json_object_set_new(r, "itl", dist_json(&m->itl));
    json_object_set_new(r, "e2el", dist_json(&m->e2el));
    json_object_set_new(r, "steps", json_pack("{s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:f}", "steps", st->steps,
                                              "with_prefill", st->prefill_steps, "decode_only", st->decode_steps,
                                              "prefill_tokens", st->prefill_tokens, "decode_tokens",
                                              st->decode_tokens, "with_prefill_s", st->prefill_s, "decode_only_s",
                                              st->decode_s, "median_step_ms", st->step_ms_median,
                                              "median_decode_step_ms", st->decode_step_ms_median));
    json_object_set_new(r, "timelines", timelines);
    return r;
}

/* Text written to "<path>.tmp.<pid>", renamed into place when complete (docs/robustness.md). */
static int write_text(const char *path, const char *text, size_t len)
{
    char tmp[4200];
    int rc = bench_results_tmp_name(path, tmp, sizeof tmp);
    if (rc)
        return rc;
    int slot = dsv4_tempfile_register(tmp);
    FILE *f = fopen(tmp, "w");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f))
        rc = dsv4_error(DSV4_ERR_IO, "%s: cannot write (the temporary %s)", path, tmp);
    else if (rename(tmp, path))
        rc = dsv4_error(DSV4_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (rc)
        unlink(tmp);
    dsv4_tempfile_unregister(slot);
    return rc;
}

static double jnum(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static double jdist(json_t *o, const char *d, const char *k) { return jnum(json_object_get(o, d), k); }

/* The Markdown tables: one row per (C, configuration), then the seeds' table when there is one. */
static char *markdown_of(json_t *root, int seeds_table, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    json_t *runs = json_object_get(root, "runs");
    fprintf(f, "# dsv4 bench --serve\n\n%s\n\n", json_string_value(json_object_get(root, "summary")));
    fprintf(f, "| C | configuration | req/s | input tok/s | output tok/s | total tok/s | TTFT mean / median / p99 (ms) "
               "| TPOT mean / median / p99 (ms) | ITL mean / median / p99 (ms) | E2EL median / p99 (s) | time in "
               "prefill steps / decode-only steps (s) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    size_t i;
    json_t *r;
    json_array_foreach(runs, i, r)
    {
        json_t *st = json_object_get(r, "steps");
        fprintf(f, "| %d | %s | %.3f | %.0f | %.1f | %.0f | %.0f / %.0f / %.0f | %.2f / %.2f / %.2f | %.2f / %.2f / "
                   "%.2f | %.1f / %.1f | %.1f / %.1f |\n",
                (int)jnum(r, "concurrency"), json_string_value(json_object_get(r, "config")),
                jnum(r, "request_throughput"), jnum(r, "input_throughput"), jnum(r, "output_throughput"),
                jnum(r, "total_throughput"), jdist(r, "ttft", "mean_ms"), jdist(r, "ttft", "median_ms"),
                jdist(r, "ttft", "p99_ms"), jdist(r, "tpot", "mean_ms"), jdist(r, "tpot", "median_ms"),
                jdist(r, "tpot", "p99_ms"), jdist(r, "itl", "mean_ms"), jdist(r, "itl", "median_ms"),
                jdist(r, "itl", "p99_ms"), jdist(r, "e2el", "median_ms") / 1e3, jdist(r, "e2el", "p99_ms") / 1e3,
                jnum(st, "with_prefill_s"), jnum(st, "decode_only_s"));
    }
    if (seeds_table) {
        fprintf(f, "\n## The seeds' table: output tokens/s, each optimization switched on after the ones before\n\n"
                   "| configuration |");
        json_t *conc = json_object_get(root, "concurrency");
        size_t j;
        json_t *c;
        json_array_foreach(conc, j, c) fprintf(f, " C = %d | gain at C = %d |", (int)json_integer_value(c),
                                               (int)json_integer_value(c));
        fprintf(f, "\n|---|");
        json_array_foreach(conc, j, c) fprintf(f, "---|---|");
        fprintf(f, "\n");
        for (int s = 0; s < SERVE_N_STEPS; s++) {
            fprintf(f, "| %s |", serve_step_names[s]);
            json_array_foreach(conc, j, c)
            {
                double here = 0, before = 0;
                json_array_foreach(runs, i, r)
                {
                    if (jnum(r, "concurrency") != (double)json_integer_value(c))
                        continue;
                    const char *name = json_string_value(json_object_get(r, "config"));
                    if (!strcmp(name, serve_step_names[s]))
                        here = jnum(r, "output_throughput");
                    if (s > 0 && !strcmp(name, serve_step_names[s - 1]))
                        before = jnum(r, "output_throughput");
                }
                if (s == 0 || before <= 0)
                    fprintf(f, " %.1f | |", here);
                else
                    fprintf(f, " %.1f | %+.1f%% |", here, 100.0 * (here / before - 1.0));
            }
            fprintf(f, "\n");
        }
    }
    fclose(f);
    return buf;
}

/* The SVG: output tokens/s against C (log scale) per configuration, and the ITL distribution (the fraction of gaps
 * at or below a time) of the last configuration at every C. */
static char *svg_of(json_t *root, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    json_t *runs = json_object_get(root, "runs"), *conc = json_object_get(root, "concurrency"),
           *configs = json_object_get(root, "configurations");
    const int W = 900, H = 380, pw = 380, ph = 280, x0 = 60, y0 = 40, x1 = 510;
    static const char *const colour[] = {"#888", "#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd"};
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' "
               "font-size='11'>\n<rect width='100%%' height='100%%' fill='white'/>\n", W, H);
    double ymax = 1;
    size_t i, j, k;
    json_t *r, *c, *g;
    json_array_foreach(runs, i, r) ymax = fmax(ymax, jnum(r, "output_throughput"));
    const int nc = (int)json_array_size(conc);
    const double cmin = log2(fmax(1, (double)json_integer_value(json_array_get(conc, 0)))),
                 cmax = log2(fmax(2, (double)json_integer_value(json_array_get(conc, (size_t)nc - 1))));
    fprintf(f, "<text x='%d' y='20' font-size='13'>output tokens/s against C</text>\n", x0);
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n", x0, y0, pw, ph);
    fprintf(f, "<text x='%d' y='%d'>0</text><text x='%d' y='%d'>%.0f</text>\n", x0 - 12, y0 + ph, x0 - 55, y0 + 10,
            ymax);
    json_array_foreach(conc, j, c)
    {
        const double x = x0 + pw * (log2((double)json_integer_value(c)) - cmin) / fmax(1e-9, cmax - cmin);
        fprintf(f, "<text x='%.0f' y='%d' text-anchor='middle'>C = %d</text>\n", x, y0 + ph + 15,
                (int)json_integer_value(c));
    }
    json_array_foreach(configs, k, g)
    {
        const char *name = json_string_value(g);
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", colour[k % 6]);
        json_array_foreach(runs, i, r)
        {
            if (strcmp(json_string_value(json_object_get(r, "config")), name))
                continue;
            const double x = x0 + pw * (log2(jnum(r, "concurrency")) - cmin) / fmax(1e-9, cmax - cmin);
            fprintf(f, "%.1f,%.1f ", x, y0 + ph - ph * jnum(r, "output_throughput") / ymax);
        }
        fprintf(f, "'/>\n<text x='%d' y='%d' fill='%s'>%s</text>\n", x0 + 8, y0 + 14 + 13 * (int)k, colour[k % 6],
                name);
    }
    /* the ITL distribution of the last configuration, from the timelines */
    const char *last = json_string_value(json_array_get(configs, json_array_size(configs) - 1));
    double itl_max = 0;
    json_array_foreach(runs, i, r) if (!strcmp(json_string_value(json_object_get(r, "config")), last)) itl_max =
        fmax(itl_max, jdist(r, "itl", "p99_ms"));
    itl_max = itl_max > 0 ? itl_max * 1.1 : 1;
    fprintf(f, "<text x='%d' y='20' font-size='13'>ITL distribution (%s): fraction of gaps &lt;= t</text>\n", x1,
            last);
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n", x1, y0, pw, ph);
    fprintf(f, "<text x='%d' y='%d'>0 ms</text><text x='%d' y='%d' text-anchor='end'>%.1f ms</text>\n", x1,
            y0 + ph + 15, x1 + pw, y0 + ph + 15, itl_max);
    int line = 0;
    json_array_foreach(runs, i, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "config")), last))
            continue;
        /* gather the gaps */
        json_t *tls = json_object_get(r, "timelines"), *t;
        size_t n = 0, m;
        json_array_foreach(tls, m, t) n += json_array_size(json_object_get(t, "token_ms")) - 1;
        double *gaps = malloc((n ? n : 1) * sizeof *gaps);
        if (!gaps)
            continue;
        size_t q = 0;
        json_array_foreach(tls, m, t)
        {
            json_t *tok = json_object_get(t, "token_ms");
            for (size_t z = 1; z < json_array_size(tok); z++)
                gaps[q++] = json_real_value(json_array_get(tok, z)) - json_real_value(json_array_get(tok, z - 1));
        }
        dsv4_serve_dist d;
        dsv4_serve_dist_of(gaps, (int)q, &d); /* for the sort in place */
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", colour[(line + 1) % 6]);
        const size_t stride = q > 400 ? q / 400 : 1;
        for (size_t z = 0; z < q; z += stride)
            fprintf(f, "%.1f,%.1f ", x1 + pw * fmin(1, gaps[z] / itl_max), y0 + ph - ph * (double)(z + 1) / q);
        fprintf(f, "'/>\n<text x='%d' y='%d' fill='%s'>C = %d</text>\n", x1 + pw - 60, y0 + ph - 10 - 13 * line,
                colour[(line + 1) % 6], (int)jnum(r, "concurrency"));
        line++;
        free(gaps);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
    return buf;
}

static int write_outputs(const serve_args *a, json_t *root)
{
    int rc = 0;
    if (a->json) {
        char *text = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(7));
        rc = text ? write_text(a->json, text, strlen(text)) : dsv4_error(DSV4_ERR_NOMEM, "--json: out of memory");
        free(text);
    }
    size_t len = 0;
    if (!rc && a->markdown) {
        char *md = markdown_of(root, a->seeds_table, &len);
        rc = md ? write_text(a->markdown, md, len) : dsv4_error(DSV4_ERR_NOMEM, "--markdown: out of memory");
        free(md);
    }
    if (!rc && a->svg) {
        char *svg = svg_of(root, &len);
        rc = svg ? write_text(a->svg, svg, len) : dsv4_error(DSV4_ERR_NOMEM, "--svg: out of memory");
        free(svg);
    }
    return rc;
}

int bench_serve(int argc, char **argv)
{
    serve_args a;
    if (serve_check_args(argc, argv, &a))
        return 2;
    t_start = cli_now_s();
    int dev = 0, cmax = 1;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1) {
        fprintf(stderr, "dsv4 bench --serve: no CUDA device\n");
        return 2;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    for (int i = 0; i < a.n_conc; i++)
        cmax = a.conc[i] > cmax ? a.conc[i] : cmax;
    const int fp8 = a.weights == DSV4_OPT_WEIGHTS_FP8;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    /* the layer count as `dsv4 bench` picks it, with room for the step's scratch at the token budget (the path
     * prints its own plan and refuses what does not fit) */
    const double margin = 3.0 * 1073741824.0 + (double)a.token_budget * 1048576.0;
    dsv4_config cfg;
    bench_mem_plan mp;
    int layers = a.layers;
    if (!layers)
        for (layers = 1; layers < DSV4_MAX_LAYERS; layers++) {
            if (bench_flash_config(layers + 1, a.max_context, &cfg))
                break;
            bench_plan_memory(&cfg, cmax, a.max_context, a.seeds_table, fp8, 0, &mp);
            if (mp.total > (double)free_b - margin)
                break;
        }
    if (bench_flash_config(layers, a.max_context, &cfg)) {
        fprintf(stderr, "dsv4 bench --serve: config: %s\n", dsv4_last_error());
        return 1;
    }
    const int n_cfg = a.seeds_table ? SERVE_N_STEPS : 1;
    char summary[1024];
    snprintf(summary, sizeof summary,
             "%s, Flash-shaped random model with %d layers (%s weights), max context %d, input %d..%d and output "
             "%d..%d tokens (uniform, seed %llu, EOS ignored), %s, token budget %d a step, prefill chunk %d",
             prop.name, layers, fp8 ? "fp8 (FP8 linears, FP4 experts)" : "bf16", a.max_context, a.input_min,
             a.input_max, a.output_min, a.output_max, a.seed, a.rate > 0 ? "Poisson arrivals" : "all sent at once",
             a.token_budget, a.prefill_chunk);
    progress("%s", summary);
    json_t *root = json_object(), *runs = json_array(), *conc = json_array(), *configs = json_array();
    json_object_set_new(root, "schema", json_string("dsv4-bench-serve/1"));
    json_object_set_new(root, "summary", json_string(summary));
    json_object_set_new(root, "device", json_string(prop.name));
    json_object_set_new(root, "layers", json_integer(layers));
    json_object_set_new(root, "weights", json_string(fp8 ? "fp8" : "bf16"));
    json_object_set_new(root, "max_context", json_integer(a.max_context));
    json_object_set_new(root, "token_budget", json_integer(a.token_budget));
    json_object_set_new(root, "prefill_chunk", json_integer(a.prefill_chunk));
    for (int i = 0; i < a.n_conc; i++)
        json_array_append_new(conc, json_integer(a.conc[i]));
    for (int s = 0; s < n_cfg; s++)
        json_array_append_new(configs, json_string(a.seeds_table ? serve_step_names[s] : "defaults"));
    json_object_set_new(root, "concurrency", conc);
    json_object_set_new(root, "configurations", configs);
    json_object_set_new(root, "runs", runs);
    serve_buffers b = {0};
    b.cap_steps = 1 << 20;
    b.tokens = malloc((size_t)a.token_budget * sizeof *b.tokens);
    b.n_tok = malloc((size_t)cmax * sizeof *b.n_tok);
    b.next = malloc((size_t)cmax * sizeof *b.next);
    b.last = calloc((size_t)cmax, sizeof *b.last);
    b.step_ms = malloc((size_t)b.cap_steps * sizeof *b.step_ms);
    b.decode_ms = malloc((size_t)b.cap_steps * sizeof *b.decode_ms);
    int rc = b.tokens && b.n_tok && b.next && b.last && b.step_ms && b.decode_ms ? 0 : 1;
    for (int ci = 0; ci < a.n_conc && !rc; ci++) {
        const int C = a.conc[ci];
        int n_warm = 0, n_meas = 0;
        dsv4_serve_request *warm = serve_workload(&a, C, 0, &n_warm), *meas = serve_workload(&a, C, 1, &n_meas);
        for (int s = 0; s < n_cfg && !rc && warm && meas; s++) {
            const char *name = a.seeds_table ? serve_step_names[s] : "defaults";
            char label[96];
            snprintf(label, sizeof label, "C=%d %s", C, name);
            dsv4_opt_options oo;
            dsv4_opt_options_default(&oo);
            oo.n_seq = C, oo.max_context = a.max_context, oo.weights = a.weights;
            oo.max_step_tokens = a.token_budget, oo.print_plan = ci == 0 && s == 0;
            if (a.seeds_table)
                serve_step_options(s, &oo);
            dsv4_opt *o = NULL;
            progress("%s: building (random weights on the GPU, %d cache slots of %d positions)", label, C,
                     a.max_context);
            if ((rc = dsv4_opt_init_random(&cfg, a.seed, &oo, &o))) {
                fprintf(stderr, "dsv4 bench --serve: %s: %s\n", label, dsv4_last_error());
                break;
            }
            dsv4_serve_sched *sw = NULL, *sm = NULL;
            serve_steps stw, stm;
            if (n_warm > 0) {
                char wl[128];
                snprintf(wl, sizeof wl, "%s warm-up", label);
                rc = serve(o, &a, C, warm, n_warm, a.seed + 1000, cfg.vocab_size, &b, &sw, &stw, wl);
            }
            if (!rc)
                rc = serve(o, &a, C, meas, n_meas, a.seed, cfg.vocab_size, &b, &sm, &stm, label);
            if (!rc) {
                const dsv4_serve_timeline **tl = malloc((size_t)n_meas * sizeof *tl);
                dsv4_serve_metrics m;
                for (int i = 0; tl && i < n_meas; i++)
                    tl[i] = dsv4_serve_sched_timeline(sm, i);
                rc = tl ? dsv4_serve_metrics_compute(meas, tl, n_meas, &m) : DSV4_ERR_NOMEM;
                if (!rc) {
                    json_array_append_new(runs, run_json(name, C, meas, n_meas, sm, &m, &stm));
                    progress("%s: %d requests in %.1f s: %.3f req/s, %.1f output tokens/s (%.0f total); TTFT median "
                             "%.0f ms, TPOT median %.2f ms, ITL p99 %.2f ms; %d steps (%d with prefill: %.1f s)",
                             label, n_meas, m.duration_s, m.request_throughput, m.output_throughput,
                             m.total_throughput, 1e3 * m.ttft.median, 1e3 * m.tpot.median, 1e3 * m.itl.p99,
                             stm.steps, stm.prefill_steps, stm.prefill_s);
                    if ((rc = write_outputs(&a, root))) /* after every run: a cut-short run keeps what ran */
                        fprintf(stderr, "dsv4 bench --serve: %s\n", dsv4_last_error());
                }
                free(tl);
            } else
                fprintf(stderr, "dsv4 bench --serve: %s: %s\n", label, dsv4_last_error());
            dsv4_serve_sched_free(sw);
            dsv4_serve_sched_free(sm);
            dsv4_opt_free(o);
        }
        if (!warm || !meas)
            rc = 1;
        free(warm);
        free(meas);
    }
    size_t len = 0;
    char *md = rc ? NULL : markdown_of(root, a.seeds_table, &len);
    if (md)
        fwrite(md, 1, len, stdout);
    free(md);
    json_decref(root);
    free(b.tokens), free(b.n_tok), free(b.next), free(b.last), free(b.step_ms), free(b.decode_ms);
    return rc ? 1 : 0;
}
#endif
