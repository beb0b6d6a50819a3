/* progress.h - the progress line of a long step of a dsv4 command on stderr (cli/progress.c). */
#ifndef DSV4_CLI_PROGRESS_H
#define DSV4_CLI_PROGRESS_H

typedef struct cli_progress {
    const char *prefix; /* "dsv4 run", "dsv4 inspect", "dsv4 verify" */
    double t0, last, after_s;
    double last_done; /* cli_progress_positions: the count at `last` (the rate is that of the last interval) */
    int tty, shown;
    /* cli_progress_layer: the forward call in progress (cli_progress_call) */
    int call_pos, call_tokens, total_pos;
    double call_t0;
} cli_progress;

/* Seconds on the monotonic clock (CLOCK_MONOTONIC): every timing of the dsv4 command. */
double cli_now_s(void);
/* The bench's timestamped line on stderr: "[tag S.s] " (seconds since t0, a cli_now_s() value), the message, a
 * newline. */
void cli_progress_note(const char *tag, double t0, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Seconds a step runs before its progress line shows: 3, or $DSV4_PROGRESS_AFTER_S (a number >= 0). */
double cli_progress_after_s(void);
/* Starts the clock. Nothing is printed before cli_progress_after_s() seconds. */
void cli_progress_init(cli_progress *p, const char *prefix);
/* A dsv4_progress_fn (dsv4.h) for the weights digest: ctx is a cli_progress; prints "weights_digest: hashed X of
 * Y GiB (Z%), R GB/s, ETA S s", in place on a terminal, every ~5 s otherwise. */
void cli_progress_digest(void *ctx, double done, double total);
/* A dsv4_progress_fn for dsv4_verify_options.progress: ctx is a cli_progress; prints "read X of Y MiB (Z%),
 * R MiB/s, ETA S s" (GiB from a total of 1 GiB on), in place on a terminal, every ~5 s otherwise. */
void cli_progress_verify(void *ctx, double done, double total);
/* The run's line "position D/T, R tokens/s, ETA S s": not before after_s, then every 0.25 s on a terminal, every
 * 5 s otherwise; the rate is that of the interval since `last` / `last_done` (decode slows down as the context
 * grows; set them where the timed steps start), the ETA assumes it holds. */
void cli_progress_positions(cli_progress *p, int done, int total);
/* A reference forward call starts: n_tokens positions from pos (a prefill, or 1: a decode step) of total. */
void cli_progress_call(cli_progress *p, int pos, int n_tokens, int total);
/* A dsv4_progress_fn for dsv4_ref_options.layer_progress (ctx a cli_progress, cli_progress_call made): prints
 * "position P/T, layer L/N, S s/layer, ETA E s" (a prefill: "prefill of K tokens, layer L/N, ..."), on the same
 * schedule as the position line. The ETA assumes every layer left in the run takes this call's time per layer (a
 * prefill's layers are slower than a decode step's: its ETA overstates). */
void cli_progress_layer(void *ctx, double done, double total);
/* Ends the line on a terminal when one was shown. */
void cli_progress_end(cli_progress *p);

#endif
