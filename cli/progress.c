/* progress.c - the progress line of a long step of a dsv4 command (progress.h): the weights digest, which reads
 * every byte of the checkpoint before a dump is written (minutes for a full one) and showed nothing meanwhile,
 * the comparison of `dsv4 verify` (minutes on dumps of many GB), and the reference's layers (seconds each on the
 * full model: a step of 43 layers showed nothing for a minute). */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_note(const char *tag, double t0, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s %6.1fs] ", tag, cli_now_s() - t0);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double cli_progress_after_s(void)
{
    const char *env = getenv("DSV4_PROGRESS_AFTER_S");
    char *end = NULL;
    double after = env ? strtod(env, &end) : 3.0;
    return env && end != env && !*end && after >= 0 ? after : 3.0;
}

void cli_progress_init(cli_progress *p, const char *prefix)
{
    p->prefix = prefix;
    p->t0 = cli_now_s();
    p->last = -1e30;
    p->after_s = cli_progress_after_s();
    p->tty = isatty(2);
    p->last_done = 0;
    p->shown = 0;
    p->call_pos = p->call_tokens = p->total_pos = 0;
    p->call_t0 = p->t0;
}

/* 1 when a line is due at t: not before after_s, then every 0.25 s on a terminal, every 5 s otherwise, and the
 * last one (done == total) once a line has been shown. */
static int line_due(cli_progress *p, double t, double done, double total)
{
    if (t - p->t0 < p->after_s || (t - p->last < (p->tty ? 0.25 : 5.0) && done < total)) return 0;
    if (done >= total && !p->shown) return 0; /* done before the first line was due: nothing to say */
    p->last = t;
    p->shown = 1;
    return 1;
}

void cli_progress_digest(void *ctx, double done, double total)
{
    cli_progress *p = ctx;
    double t = cli_now_s();
    if (!line_due(p, t, done, total)) return;
    double rate = t > p->t0 ? done / (t - p->t0) : 0.0, gib = 1024.0 * 1024.0 * 1024.0;
    fprintf(stderr, "%s%s: weights_digest: hashed %.1f of %.1f GiB (%.0f%%), %.2f GB/s, ETA %.0f s%s",
            p->tty ? "\r" : "", p->prefix, done / gib, total / gib, total > 0 ? 100.0 * done / total : 100.0,
            rate / 1e9, rate > 0 ? (total - done) / rate : 0.0, p->tty ? "   " : "\n");
    fflush(stderr);
}

void cli_progress_verify(void *ctx, double done, double total)
{
    cli_progress *p = ctx;
    double t = cli_now_s();
    if (!line_due(p, t, done, total)) return;
    const int big = total >= 1024.0 * 1024.0 * 1024.0;
    const double unit = big ? 1024.0 * 1024.0 * 1024.0 : 1024.0 * 1024.0;
    double rate = t > p->t0 ? done / (t - p->t0) : 0.0;
    fprintf(stderr, "%s%s: read %.1f of %.1f %s (%.0f%%), %.1f %s/s, ETA %.0f s%s", p->tty ? "\r" : "", p->prefix,
            done / unit, total / unit, big ? "GiB" : "MiB", total > 0 ? 100.0 * done / total : 100.0, rate / unit,
            big ? "GiB" : "MiB", rate > 0 ? (total - done) / rate : 0.0, p->tty ? "   " : "\n");
    fflush(stderr);
}

void cli_progress_positions(cli_progress *p, int done, int total)
{
    double t = cli_now_s();
    if (t - p->t0 < p->after_s || t - p->last < (p->tty ? 0.25 : 5.0)) return;
    double rate = t > p->last ? (done - p->last_done) / (t - p->last) : 0.0;
    p->last = t;
    p->last_done = done;
    double eta = rate > 0 ? (total - done) / rate : 0.0;
    fprintf(stderr, "%s%s: position %d/%d, %.2f tokens/s, ETA %.0f s%s", p->tty ? "\r" : "", p->prefix, done, total,
            rate, eta, p->tty ? "   " : "\n");
    fflush(stderr);
    p->shown = 1;
}

void cli_progress_call(cli_progress *p, int pos, int n_tokens, int total)
{
    p->call_pos = pos;
    p->call_tokens = n_tokens;
    p->total_pos = total;
    p->call_t0 = cli_now_s();
}

void cli_progress_layer(void *ctx, double done, double total)
{
    cli_progress *p = ctx;
    double t = cli_now_s();
    if (t - p->t0 < p->after_s || (t - p->last < (p->tty ? 0.25 : 5.0))) return;
    p->last = t;
    double per_layer = done > 0 ? (t - p->call_t0) / done : 0.0;
    int calls_left = p->total_pos - (p->call_pos + p->call_tokens); /* decode steps after this call */
    double eta = per_layer * ((total - done) + (calls_left > 0 ? calls_left : 0) * total);
    if (p->call_tokens > 1)
        fprintf(stderr, "%s%s: prefill of %d tokens, layer %.0f/%.0f, %.2f s/layer, ETA %.0f s%s", p->tty ? "\r" : "",
                p->prefix, p->call_tokens, done, total, per_layer, eta, p->tty ? "   " : "\n");
    else
        fprintf(stderr, "%s%s: position %d/%d, layer %.0f/%.0f, %.2f s/layer, ETA %.0f s%s", p->tty ? "\r" : "",
                p->prefix, p->call_pos + 1, p->total_pos, done, total, per_layer, eta, p->tty ? "   " : "\n");
    fflush(stderr);
    p->shown = 1;
}

void cli_progress_end(cli_progress *p)
{
    if (p->shown && p->tty) fputc('\n', stderr);
    p->shown = 0;
}
