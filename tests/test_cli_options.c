/* test_cli_options.c - the option checks of `dsv4 run` and `dsv4 bench` (cli/run.c, cli/bench_args.c), on the CPU.
 *
 * Every bad option is a usage error (exit 2) whose message names the option and its value, before any model is
 * loaded or any GPU is touched, so these run in a CPU-only build and in a CUDA build alike:
 * - run: the optimized path's options (--attn ... --dump-seq) given with --path ref-cpu / ref-gpu, which would be
 *   ignored there; an empty number (--decode "" once ran as 0 decode steps); an empty or trailing-comma
 *   --dump-positions (once a dump of no positions); --decode-from past the prompt (once clamped silently), and
 *   --decode-from K > 0 with --path opt (once taken and ignored; since issue 35 the opt prefill, taken); a bad
 *   --prefill-chunk (0, past 32768, with a reference path); a
 *   --max-context below the run's positions (once found at that step, after the load), --batch past 4096; a
 *   --follow dump of other weights (once followed silently); a --prompt-tokens folder (once "no token ids") and
 *   a token past the vocabulary (once refused by the path without naming the file); a --dump naming the run's
 *   --tokens-from or --follow dump (once replaced by the new dump); --path opt with no GPU (once a failed
 *   cudaSetDevice with its source line); --emulate and --follow with --path ref-gpu, refused until issue 34, taken
 *   (the run gets as far as the device) and named in the help; each other usage error named (a bad --path or --graph, --gpus off the
 *   optimized path, neither or both token sources, a descending --dump-positions range, --decode past the
 *   forced tokens, --forced with a prompt file, a word of a prompt file that is not a token id, a stray
 *   argument (once "unknown option").
 * - bench: numbers with trailing junk or none at all (atoi took "5abc" as 5 and "abc" as 0), a negative --seed
 *   (strtoull wrapped it), a K suffix that takes a list value past 2^20 (checked before the suffix), a trailing
 *   comma; --quantize fp8 with --weights bf16 (the later of the two won); an unknown option last on the line
 *   (once "needs a value"); a --json that cannot be written (a missing folder, a directory) is refused up front,
 *   leaving nothing.
 * - every command: a list option given twice (run/verify --probes, verify --layers/--positions, run
 *   --dump-positions, bench --batch/--context/--variants/--scaling/--scaling-batch): the second replaced the first.
 * - the top level: `dsv4` alone and an unknown command print the usage (every command) and exit 2; --help, -h and
 *   help print it on stdout and exit 0; --version; each command's --help on stdout, exit 0.
 * The bench cases that must parse end on a bad --context (checked last, before the GPU), so that a build with a
 * GPU never starts a benchmark here.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsv4/dsv4.h"
#include "dsv4_test.h"

/* `dsv4 ARGS`: exit status want, output holding each of needles and none of absent (NULL-terminated lists). */
static void expect_cli(int want, const char *args, const char *const *needles, const char *const *absent)
{
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", dsv4_test_bin(), args);
    int st = dsv4_test_run(cmd, &out);
    printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
    ck_assert_msg(st == want, "%s: exit %d, want %d\n%s", cmd, st, want, out ? out : "");
    for (int i = 0; needles && needles[i]; i++)
        ck_assert_msg(out && strstr(out, needles[i]), "%s: output lacks '%s'\n%s", cmd, needles[i], out ? out : "");
    for (int i = 0; absent && absent[i]; i++)
        ck_assert_msg(!out || !strstr(out, absent[i]), "%s: output has '%s'\n%s", cmd, absent[i], out ? out : "");
    free(out);
}

#define NEED(...) ((const char *const[]){__VA_ARGS__, NULL})

/* path (re)written to hold text: a prompt file */
static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: cannot write", path);
    fputs(text, f);
    ck_assert_msg(fclose(f) == 0, "%s: write failed", path);
}

/* A folder holding t.txt, a prompt of 3 token ids; *prefix receives "run --model golden/tiny --prompt-tokens
 * DIR/t.txt" (static). */
static char *prompt_dir(const char **prefix)
{
    static char buf[8400];
    char *dir = dsv4_test_mkdtemp("cli-options");
    char path[4200];
    snprintf(path, sizeof path, "%s/t.txt", dir);
    write_text(path, "5 6 7\n");
    snprintf(buf, sizeof buf, "run --model %sgolden/tiny --prompt-tokens %s", dsv4_test_source_path(""), path);
    *prefix = buf;
    return dir;
}

/* The number of entries of dir other than . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------------------------ the top level */
/* `dsv4 ARGS` with stderr dropped: its exit status, and its stdout holding each needle */
static void expect_stdout(int want, const char *args, const char *const *needles)
{
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", dsv4_test_bin(), args);
    int st = dsv4_test_run(cmd, &out);
    ck_assert_msg(st == want, "%s: exit %d, want %d\n%s", cmd, st, want, out ? out : "");
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(out && strstr(out, needles[i]), "%s: stdout lacks '%s'\n%s", cmd, needles[i], out ? out : "");
    free(out);
}

START_TEST(usage_help_and_version)
{
    const char *const *every = NEED("usage: dsv4 <command>", "  inspect ", "  run ", "  verify ", "  bench ");
    expect_cli(2, "", every, NULL);
    expect_cli(2, "frobnicate", NEED("dsv4: unknown command 'frobnicate'", "usage: dsv4 <command>"), NULL);
    char cmd[4200], *out = NULL; /* the usage of a bad call goes to stderr, none of it to stdout */
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null", dsv4_test_bin());
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 2);
    ck_assert_msg(!out || !*out, "%s: stdout holds\n%s", cmd, out);
    free(out);
    for (int i = 0; i < 3; i++) expect_stdout(0, (const char *[]){"--help", "-h", "help"}[i], every);
    expect_stdout(0, "--version", NEED("dsv4 " DSV4_VERSION "\n"));
    static const char *const cmds[] = {"inspect", "run", "verify", "bench"};
    for (int i = 0; i < 4; i++) {
        char args[64], usage[64];
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        snprintf(usage, sizeof usage, "usage: dsv4 %s ", cmds[i]);
        expect_stdout(0, args, NEED(usage));
    }
}
END_TEST

/* ------------------------------------------------------------------------------------ dsv4 run */
START_TEST(run_refuses_opt_options_on_ref_paths)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    static const char *const opts[][2] = {
        {"--attn", "simt"},      {"--indexer", "fp32"}, {"--mhc", "roundtrip"}, {"--index-context", "max"},
        {"--kv", "fp8"},         {"--weights", "fp8"},  {"--quantize", "fp8"},  {"--graph", "off"},
        {"--max-context", "64"}, {"--batch", "3"},      {"--dump-seq", "0"},
    };
    static const char *const paths[] = {"ref-cpu", "ref-gpu"};
    char args[8192], opt_msg[128], not_msg[64];
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        for (int p = 0; p < 2; p++) {
            snprintf(args, sizeof args, "%s --path %s %s %s", pre, paths[p], opts[i][0], opts[i][1]);
            snprintf(opt_msg, sizeof opt_msg, "%s is an option of --path opt", opts[i][0]);
            snprintf(not_msg, sizeof not_msg, "(not of %s)", paths[p]);
            expect_cli(2, args, NEED(opt_msg, not_msg), NULL);
        }
    /* the default path is ref-cpu: the same without --path */
    snprintf(args, sizeof args, "%s --batch 3 --kv fp8", pre);
    expect_cli(2, args, NEED("--batch is an option of --path opt", "(not of ref-cpu)"), NULL);
    /* with --path opt they are taken (a CPU-only build then says it has no CUDA, a GPU one fails on --dump-seq) */
    snprintf(args, sizeof args, "%s --path opt --kv fp8 --batch 2 --dump-seq 2", pre);
    expect_cli(2, args, NEED("--dump-seq 2"), NEED("is an option of"));
    /* what the CPU reference does take still runs */
    snprintf(args, sizeof args, "%s --path ref-cpu --emulate bf16 --decode 1 --decode-from 1 --dump-positions all",
             pre);
    expect_cli(0, args, NEED("tokens after the prompt"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(run_refuses_empty_and_out_of_range_numbers)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[8192];
    static const char *const empty[] = {"--decode", "--decode-from", "--max-context", "--batch", "--dump-seq"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s: '' is not", empty[i]);
        snprintf(args, sizeof args, "%s --path opt %s ''", pre, empty[i]);
        expect_cli(2, args, NEED(msg), NULL);
        snprintf(msg, sizeof msg, "%s: ' 4' is not", empty[i]);
        snprintf(args, sizeof args, "%s --path opt %s ' 4'", pre, empty[i]);
        expect_cli(2, args, NEED(msg), NULL);
    }
    snprintf(args, sizeof args, "%s --path opt --max-context 0", pre);
    expect_cli(2, args, NEED("--max-context: '0'"), NULL);
    snprintf(args, sizeof args, "%s --path opt --batch 0", pre);
    expect_cli(2, args, NEED("--batch: '0'"), NULL);
    snprintf(args, sizeof args, "%s --dump-positions ''", pre);
    expect_cli(2, args, NEED("--dump-positions: cannot parse ''"), NULL);
    snprintf(args, sizeof args, "%s --dump-positions 0,", pre);
    expect_cli(2, args, NEED("--dump-positions: cannot parse '0,'"), NULL);
    /* past the 3-token prompt: refused */
    snprintf(args, sizeof args, "%s --decode-from 99", pre);
    expect_cli(2, args, NEED("--decode-from 99", "3 tokens"), NULL);
    /* --path opt prefills 0..K-1 in chunks (issue 35): K > 0 and 0 are both taken (the run then fails on
     * --dump-seq, checked after them); past the prompt it is refused as on the references */
    snprintf(args, sizeof args, "%s --path opt --decode-from 2 --batch 2 --dump-seq 2", pre);
    expect_cli(2, args, NEED("--dump-seq 2"), NEED("--decode-from"));
    snprintf(args, sizeof args, "%s --path opt --decode-from 0 --batch 2 --dump-seq 2", pre);
    expect_cli(2, args, NEED("--dump-seq 2"), NEED("--decode-from"));
    /* --prefill-chunk: a count of at least 1, and an option of --path opt */
    snprintf(args, sizeof args, "%s --path opt --prefill-chunk 0", pre);
    expect_cli(2, args, NEED("--prefill-chunk: '0'"), NULL);
    snprintf(args, sizeof args, "%s --path opt --prefill-chunk 40000", pre);
    expect_cli(2, args, NEED("--prefill-chunk: '40000'"), NULL);
    snprintf(args, sizeof args, "%s --prefill-chunk 8", pre);
    expect_cli(2, args, NEED("--prefill-chunk is an option of --path opt"), NULL);
    /* the prompt length itself is the default, and allowed */
    snprintf(args, sizeof args, "%s --decode-from 3 --decode 1", pre);
    expect_cli(0, args, NEED("prefill 3"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

/* --path opt sizes its caches before the first step: a --max-context below the run's positions was found at the
 * step that reached it, after the whole load; --batch / --dump-seq past the path's 4096 copies at init */
START_TEST(run_refuses_caches_too_small_up_front)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[8192];
    snprintf(args, sizeof args, "%s --path opt --decode 4 --max-context 5", pre);
    expect_cli(2, args, NEED("--max-context 5: the run has 7 positions"), NULL);
    snprintf(args, sizeof args, "%s --path opt --batch 4097", pre);
    expect_cli(2, args, NEED("--batch: '4097' is not a count in [1, 4096]"), NULL);
    snprintf(args, sizeof args, "%s --path opt --dump-seq 4096", pre);
    expect_cli(2, args, NEED("--dump-seq: '4096' is not a count in [0, 4095]"), NULL);
    /* 7 positions fit 7: taken (the run then fails on --dump-seq, checked after it) */
    snprintf(args, sizeof args, "%s --path opt --decode 4 --max-context 7 --batch 2 --dump-seq 2", pre);
    expect_cli(2, args, NEED("--dump-seq 2"), NEED("--max-context"));
    dsv4_test_rmtree(dir);
}
END_TEST

/* --follow of a dump made with other weights of the same shapes (golden/tiny-fp8 follows a golden/tiny dump)
 * was followed silently; it is refused as dsv4 verify refuses to compare such dumps, unless asked for */
START_TEST(run_follow_refuses_other_weights)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[16400], dump[4200];
    snprintf(dump, sizeof dump, "%s/sel.h5", dir);
    snprintf(args, sizeof args, "%s --decode 1 --dump-positions all --probes topk_idx,router_ids --dump %s", pre,
             dump);
    expect_cli(0, args, NEED("dump:"), NULL);
    /* prompt_dir's prefix names golden/tiny: the same prompt with golden/tiny-fp8 */
    char other[8500];
    snprintf(other, sizeof other, "run --model %sgolden/tiny-fp8 --prompt-tokens %s/t.txt",
             dsv4_test_source_path(""), dir);
    snprintf(args, sizeof args, "%s --decode 1 --follow %s", other, dump);
    expect_cli(2, args, NEED("its weights_digest", "is not the model's", "--allow-different-weights"), NULL);
    snprintf(args, sizeof args, "%s --decode 1 --follow %s --allow-different-weights", other, dump);
    expect_cli(0, args, NEED("follow: "), NULL);
    snprintf(args, sizeof args, "%s --decode 1 --follow %s", pre, dump); /* its own weights */
    expect_cli(0, args, NEED("follow: "), NEED("weights_digest"));
    snprintf(args, sizeof args, "%s --allow-different-weights", pre);
    expect_cli(2, args, NEED("--allow-different-weights applies to --follow"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

/* The prompt's file is named with the problem: a directory read as "no token ids"; a token id past the model's
 * vocabulary was refused by the path ("reference: token 300 at position 2 outside [0, 256)"), naming no file */
START_TEST(run_names_the_prompt_file_and_its_problem)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[16400], path[4200];
    snprintf(args, sizeof args, "run --model %sgolden/tiny --prompt-tokens %s", dsv4_test_source_path(""), dir);
    expect_cli(2, args, NEED(dir, "is a directory"), NEED("no token ids"));
    snprintf(path, sizeof path, "%s/big.txt", dir);
    write_text(path, "5 6 300\n");
    static const char *const paths[] = {"ref-cpu", "ref-gpu", "opt"};
    for (int p = 0; p < 3; p++) { /* before any path is set up (a CPU-only build would say it has no CUDA) */
        snprintf(args, sizeof args, "run --model %sgolden/tiny --prompt-tokens %s --path %s",
                 dsv4_test_source_path(""), path, paths[p]);
        expect_cli(2, args, NEED(path, "token 300 at position 2", "vocabulary of 256"), NEED("CUDA"));
    }
    write_text(path, "5,6\n7 x9 8\n");
    snprintf(args, sizeof args, "run --model %sgolden/tiny --prompt-tokens %s", dsv4_test_source_path(""), path);
    expect_cli(2, args, NEED(path, "'x9' at position 3 is not a token id"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

/* The rest of run's usage errors, each named (exit 2) before any model work: a bad --path, --gpus off the
 * optimized path, neither or both token sources, an unknown option, a bad --graph value, a descending
 * --dump-positions range, --decode past a dump's forced tokens, --forced decoding of a prompt file. */
START_TEST(run_names_each_usage_error)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char g[4200];
    snprintf(g, sizeof g, "%sgolden/tiny", dsv4_test_source_path(""));
    const struct {
        const char *args, *says;
    } bad[] = {
        {"--path gpu --tokens-from %s/forced.h5", "--path 'gpu': want ref-cpu, ref-gpu or opt"},
        {"--gpus 2 --tokens-from %s/forced.h5", "--gpus is for --path opt"},
        {"--decode 1", "give exactly one of --tokens-from and --prompt-tokens"},
        {"--frob --tokens-from %s/forced.h5", "unknown option '--frob'"},
        {"--tokens-from %s/forced.h5 stray", "unexpected argument 'stray': dsv4 run takes options only"},
        {"--path opt --graph maybe --tokens-from %s/forced.h5", "--graph: want on or off"},
        {"--tokens-from %s/forced.h5 --dump-positions 5-2", "--dump-positions: 5-2 is not an ascending range in [0, 64)"},
        {"--tokens-from %s/forced.h5 --decode 1000", "--decode 1000: the dump has only 43 forced tokens after the prompt"},
    };
    char args[20000], opt[9000];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(opt, sizeof opt, bad[i].args, g);
        snprintf(args, sizeof args, "run --model %s %s --dump %s/o.h5", g, opt, dir);
        expect_cli(2, args, NEED(bad[i].says), NEED("CUDA"));
    }
    snprintf(args, sizeof args, "%s --tokens-from %s/forced.h5 --dump %s/o.h5", pre, g, dir);
    expect_cli(2, args, NEED("give exactly one of --tokens-from and --prompt-tokens"), NULL);
    snprintf(args, sizeof args, "%s --forced --decode 2 --dump %s/o.h5", pre, dir);
    expect_cli(2, args, NEED("--forced decoding needs --tokens-from"), NULL);
    ck_assert_int_eq(count_entries(dir), 1); /* t.txt: no dump was started */
    /* a dump that cannot be made there, said in the system's words (HDF5's "unable to open file: name = ...,
     * errno = 2, ..., o_flags = 242" before), and one over a device node */
    snprintf(args, sizeof args, "run --model %s --tokens-from %s/forced.h5 --dump %s/no-such-folder/o.h5", g, g, dir);
    expect_cli(2, args, NEED("no-such-folder/o.h5.tmp.", ": No such file or directory"), NEED("o_flags"));
    snprintf(args, sizeof args, "run --model %s --tokens-from %s/forced.h5 --dump /dev/null", g, g);
    expect_cli(2, args, NEED("/dev/null: exists and is not a regular file; the dump would replace it"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

/* --dump naming the run's own --tokens-from or --follow dump replaced it with the new one (a golden set's
 * forced.h5 lost to a slip of the command line); refused before the model loads */
START_TEST(run_refuses_a_dump_over_its_inputs)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[16400], gold[4200], sel[4200];
    snprintf(gold, sizeof gold, "%s/forced.h5", dir);
    snprintf(args, sizeof args, "cp %sgolden/tiny/forced.h5 %s", dsv4_test_source_path(""), gold);
    ck_assert_int_eq(dsv4_test_run(args, NULL), 0);
    snprintf(args, sizeof args, "run --model %sgolden/tiny --tokens-from %s --dump %s", dsv4_test_source_path(""),
             gold, gold);
    expect_cli(2, args, NEED("--dump", "is the --tokens-from dump"), NEED("dump:"));
    snprintf(sel, sizeof sel, "%s/sel.h5", dir);
    snprintf(args, sizeof args, "%s --decode 1 --probes topk_idx,router_ids --dump %s", pre, sel);
    expect_cli(0, args, NEED("dump:"), NULL);
    snprintf(args, sizeof args, "%s --decode 1 --follow %s --dump %s", pre, sel, sel);
    expect_cli(2, args, NEED("--dump", "is the --follow dump"), NEED("follow:"));
    /* both are still the dumps they were */
    snprintf(args, sizeof args, "cmp %sgolden/tiny/forced.h5 %s", dsv4_test_source_path(""), gold);
    ck_assert_int_eq(dsv4_test_run(args, NULL), 0);
    snprintf(args, sizeof args, "%s --decode 1 --follow %s", pre, sel);
    expect_cli(0, args, NEED("follow:"), NULL);
    dsv4_test_rmtree(dir);
}
END_TEST

/* With no GPU visible the GPU paths say so: --path opt said "cudaSetDevice(o->opt.device): <CUDA's error>
 * (.../optimized/opt_layout.c:602)", which reads as a bug of dsv4; ref-gpu and bench already said "no CUDA device".
 * A CPU-only build says "this build has no CUDA" (exit 2); a CUDA build without a device exits 1 (the run failed). */
START_TEST(run_without_a_gpu_says_so)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[8192];
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    static const char *const paths[] = {"opt", "ref-gpu", "opt --gpus 1"};
    for (int p = 0; p < 3; p++) {
        snprintf(args, sizeof args, "%s --path %s", pre, paths[p]);
        char cmd[9000], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", dsv4_test_bin(), args);
        int st = dsv4_test_run(cmd, &out);
        printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
        ck_assert_msg(st == 1 || st == 2, "%s: exit %d", cmd, st);
        ck_assert_msg(out && (strstr(out, "no CUDA") || strstr(out, "has 0 CUDA devices")) && !strstr(out, ".c:"),
                      "%s: want a 'no CUDA' line naming no source file\n%s", cmd, out ? out : "");
        free(out);
    }
    /* bench in a CUDA build gives CUDA's reason too (it said only "no CUDA device") */
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s bench 2>&1", dsv4_test_bin());
    int st = dsv4_test_run(cmd, &out);
    printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
    ck_assert_int_eq(st, 2);
    ck_assert_msg(out && (strstr(out, "this build has no CUDA") || strstr(out, "no CUDA device (")),
                  "%s: want 'this build has no CUDA' or 'no CUDA device (<reason>)'\n%s", cmd, out ? out : "");
    free(out);
    unsetenv("CUDA_VISIBLE_DEVICES");
    dsv4_test_rmtree(dir);
}
END_TEST

/* ref-gpu takes --emulate and --follow (it refused them before issue 34): with no device visible the run gets past
 * the options and the follow dump (opened and checked first) to the GPU, which is missing; the help says so. */
START_TEST(run_ref_gpu_takes_emulate_and_follow)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[16400], sel[4200], opt[4400];
    snprintf(sel, sizeof sel, "%s/sel.h5", dir);
    snprintf(args, sizeof args, "%s --decode 1 --probes topk_idx,router_ids --dump %s", pre, sel);
    expect_cli(0, args, NEED("dump:"), NULL);
    expect_cli(0, "run --help", NEED("ref-cpu and ref-gpu only:", "decision following (every path)"), NULL);
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    for (int i = 0; i < 3; i++) {
        if (i == 0) snprintf(opt, sizeof opt, "--emulate bf16");
        else snprintf(opt, sizeof opt, "%s--follow %s", i == 2 ? "--emulate bf16 " : "", sel);
        snprintf(args, sizeof args, "%s --decode 1 --path ref-gpu %s", pre, opt);
        char cmd[20000], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", dsv4_test_bin(), args);
        int st = dsv4_test_run(cmd, &out);
        printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
        ck_assert_msg(st == 1 || st == 2, "%s: exit %d", cmd, st);
        ck_assert_msg(out && (strstr(out, "no CUDA") || strstr(out, "has 0 CUDA devices")) &&
                          !strstr(out, "is an option of"),
                      "%s: want the run to reach the missing GPU, past the options\n%s", cmd, out ? out : "");
        free(out);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    dsv4_test_rmtree(dir);
}
END_TEST

/* --gpu-weights is ref-gpu's (issue 36 phase 2): refused with the other paths and for an unknown value, before the
 * model is opened; taken by ref-gpu, whose plan then says which mode, and the run reaches the missing GPU. */
START_TEST(run_gpu_weights_is_ref_gpus)
{
    const char *pre;
    char *dir = prompt_dir(&pre);
    char args[8400];
    snprintf(args, sizeof args, "%s --path ref-cpu --gpu-weights stream", pre);
    expect_cli(2, args, NEED("--gpu-weights is an option of --path ref-gpu (not of ref-cpu"), NULL);
    snprintf(args, sizeof args, "%s --gpu-weights resident", pre); /* the default path, ref-cpu */
    expect_cli(2, args, NEED("--gpu-weights is an option of --path ref-gpu (not of ref-cpu"), NULL);
    snprintf(args, sizeof args, "%s --path opt --gpu-weights stream", pre);
    expect_cli(2, args, NEED("(not of opt; its own is --weights)"), NULL);
    snprintf(args, sizeof args, "%s --path ref-gpu --gpu-weights streamed", pre);
    expect_cli(2, args, NEED("--gpu-weights 'streamed': want auto, resident or stream"), NULL);
    snprintf(args, sizeof args, "%s --path ref-gpu --gpu-weights", pre);
    expect_cli(2, args, NEED("--gpu-weights needs a value"), NULL);
    expect_cli(0, "run --help", NEED("--gpu-weights W", "ref-gpu only:"), NULL);
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    static const char *const modes[][2] = {{"stream", "weights streamed as on disk"},
                                           {"resident", "weights as f32 (resident)"}};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "%s --decode 1 --path ref-gpu --gpu-weights %s", pre, modes[i][0]);
        char cmd[9000], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", dsv4_test_bin(), args);
        int st = dsv4_test_run(cmd, &out);
        printf("$ %s -> %d\n%s", cmd, st, out ? out : "");
        ck_assert_msg(st == 1 || st == 2, "%s: exit %d", cmd, st);
        ck_assert_msg(out && (strstr(out, "no CUDA") || strstr(out, "has 0 CUDA devices")),
                      "%s: want the run to reach the missing GPU\n%s", cmd, out ? out : "");
        ck_assert_msg(out && strstr(out, modes[i][1]), "%s: the plan does not say '%s'\n%s", cmd, modes[i][1],
                      out ? out : "");
        free(out);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    dsv4_test_rmtree(dir);
}
END_TEST

START_TEST(run_notes_positions_past_max_position_embeddings)
{
    /* golden/tiny with max_position_embeddings 16: a 3-token prompt + 20 decode steps runs, and says so */
    const char *pre;
    char *dir = prompt_dir(&pre);
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "mkdir %s/m && ln -s %sgolden/tiny/model.safetensors %s/m/ && "
             "sed 's/\"max_position_embeddings\": 4096/\"max_position_embeddings\": 16/' %sgolden/tiny/config.json "
             ">%s/m/config.json && grep -q '\"max_position_embeddings\": 16' %s/m/config.json",
             dir, dsv4_test_source_path(""), dir, dsv4_test_source_path(""), dir, dir);
    ck_assert_int_eq(dsv4_test_run(cmd, &out), 0);
    free(out);
    const char *prompt = strstr(pre, "--prompt-tokens");
    char args[9000];
    snprintf(args, sizeof args, "run --model %s/m %s --decode 20", dir, prompt);
    expect_cli(0, args, NEED("the run has 23 positions, past the model's max_position_embeddings of 16"), NULL);
    snprintf(args, sizeof args, "run --model %s/m %s --decode 13", dir, prompt); /* 16: not past it */
    expect_cli(0, args, NULL, NEED("max_position_embeddings"));
    dsv4_test_rmtree(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------ every command */
START_TEST(a_forgotten_value_is_not_the_next_option)
{
    /* `--json --quiet` took --quiet as the report's name: the comparison ran quietly and wrote ./--quiet */
    char args[9000], g[4200];
    snprintf(g, sizeof g, "%sgolden/tiny/forced.h5", dsv4_test_source_path(""));
    remove("--quiet");
    snprintf(args, sizeof args, "verify %s %s --json --quiet", g, g);
    expect_cli(2, args, NEED("--json needs a value"), NULL);
    struct stat st;
    int wrote = !stat("--quiet", &st);
    remove("--quiet");
    ck_assert_msg(!wrote, "verify wrote a report named --quiet");
    /* a value beginning with one '-' is still a value: the layers up to 1 */
    snprintf(args, sizeof args, "verify %s %s --layers -1 --quiet", g, g);
    expect_cli(0, args, NULL, NEED("needs a value"));
    const char *pre;
    char *dir = prompt_dir(&pre);
    snprintf(args, sizeof args, "%s --dump --greedy", pre);
    expect_cli(2, args, NEED("--dump needs a value"), NULL);
    ck_assert_int_eq(stat("--greedy", &st), -1);
    expect_cli(2, "bench --json --reps 5", NEED("--json needs a value"), NEED("no CUDA"));
    ck_assert_int_eq(stat("--reps", &st), -1);
    dsv4_test_rmtree(dir);
}
END_TEST

/* A list option given twice: the second replaced the first, where `--probes a --probes b` may well mean both */
START_TEST(a_list_option_given_twice_is_refused)
{
    char args[9000], g[4200];
    snprintf(g, sizeof g, "%sgolden/tiny/forced.h5", dsv4_test_source_path(""));
    static const char *const verify_twice[][2] = {
        {"--probes logits --probes attn_out", "--probes given twice"},
        {"--layers 0-1 --layers 3", "--layers given twice"},
        {"--positions 2- --quiet --positions -1", "--positions given twice"},
    };
    for (size_t i = 0; i < sizeof verify_twice / sizeof verify_twice[0]; i++) {
        snprintf(args, sizeof args, "verify %s %s %s", g, g, verify_twice[i][0]);
        expect_cli(2, args, NEED(verify_twice[i][1]), NEED("PASS"));
    }
    /* one of each is fine, and other options repeated keep taking the last value */
    snprintf(args, sizeof args, "verify %s %s --probes attn_out --layers 0-1 --positions 2- --quiet --quiet", g, g);
    expect_cli(0, args, NULL, NEED("given twice"));
    const char *pre;
    char *dir = prompt_dir(&pre);
    snprintf(args, sizeof args, "%s --probes logits --probes attn_out --dump %s/d.h5", pre, dir);
    expect_cli(2, args, NEED("--probes given twice"), NULL);
    snprintf(args, sizeof args, "%s --dump-positions 0 --dump-positions 1 --dump %s/d.h5", pre, dir);
    expect_cli(2, args, NEED("--dump-positions given twice"), NULL);
    struct stat st;
    snprintf(args, sizeof args, "%s/d.h5", dir);
    ck_assert_int_eq(stat(args, &st), -1); /* refused before the run */
    dsv4_test_rmtree(dir);
    static const char *const bench_twice[] = {"--batch 1 --batch 16", "--context 4096 --context 8192",
                                              "--variants all-on --variants mhc", "--scaling none --scaling 1024",
                                              "--scaling-batch 1 --scaling-batch 2"};
    for (size_t i = 0; i < sizeof bench_twice / sizeof bench_twice[0]; i++) {
        snprintf(args, sizeof args, "bench %s", bench_twice[i]);
        char want[64];
        snprintf(want, sizeof want, "%.*s given twice", (int)strcspn(bench_twice[i], " "), bench_twice[i]);
        expect_cli(2, args, NEED(want), NEED("no CUDA"));
    }
    /* a repeated scalar still parses (last wins): the run gets to the bad --context checked last */
    expect_cli(2, "bench --reps 5 --reps 6 --context 100", NEED("--context 100: want a multiple of 128"),
               NEED("given twice"));
}
END_TEST

/* ------------------------------------------------------------------------------------ dsv4 bench */
START_TEST(bench_refuses_bad_numbers)
{
    static const char *const bad[][2] = {
        {"--reps 5abc", "--reps '5abc'"},
        {"--warmup 2x", "--warmup '2x'"},
        {"--warmup ''", "--warmup ''"},
        {"--layers 3abc", "--layers '3abc'"},
        {"--kernel-reps abc", "--kernel-reps 'abc'"},
        {"--seed xyz", "--seed 'xyz'"},
        {"--seed -1", "--seed '-1'"},
        {"--seed ''", "--seed ''"},
        {"--seed 99999999999999999999999", "--seed '99999999999999999999999'"},
        {"--gpus 2x", "--gpus '2x'"},
        {"--batch 2048K", "--batch '2048K'"},
        {"--batch 1,", "--batch '1,'"},
        {"--batch ''", "--batch ''"},
        {"--batch ' 4'", "--batch ' 4'"},
        {"--context 4096,,8192", "--context '4096,,8192'"},
        {"--max-context 1,2", "--max-context '1,2'"},
        {"--variants ''", "--variants ''"},
        {"--variants all-on,", "--variants 'all-on,'"},
        /* in either order (the last of the two won: fp8 one way, bf16 the other) */
        {"--weights bf16 --quantize fp8", "--quantize fp8 with --weights bf16"},
        {"--quantize fp8 --weights bf16", "--quantize fp8 with --weights bf16"},
        /* an unknown option last on the line (a misspelt flag) was "needs a value" */
        {"--bogus", "unknown option '--bogus'"},
        {"--no-baselin", "unknown option '--no-baselin'"},
        {"--reps", "--reps needs a value"},
        {"64", "unexpected argument '64': dsv4 bench takes options only"},
        {"--kv fp16", "--kv 'fp16': want bf16 or fp8"},
        {"--weights fp4", "--weights 'fp4': want auto, bf16 or fp8"},
        {"--quantize int4", "--quantize 'int4': want none or fp8"},
        {"--scaling 1,", "--scaling '1,'"},
        {"--nccl-time", "--nccl-time needs --gpus N"},
        {"--warmup 100 --reps 100", "--warmup 100 + --reps 100: want at most 128 steps"},
    };
    char args[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "bench %s", bad[i][0]);
        expect_cli(2, args, NEED(bad[i][1]), NEED("no CUDA"));
    }
    /* good values parse: these end on the bad --context, checked last and before any GPU work */
    static const char *const good[] = {"--reps 5",          "--kernel-reps 0", "--seed 18446744073709551615",
                                       "--batch 1K,64",     "--layers 3",      "--layers auto",
                                       "--max-context 64K", "--warmup 2",
                                       "--quantize fp8 --weights fp8", "--weights auto --quantize fp8",
                                       "--quantize none --weights bf16"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(args, sizeof args, "bench %s --context 100", good[i]);
        expect_cli(2, args, NEED("--context 100: want a multiple of 128"), NULL);
    }
}
END_TEST

START_TEST(bench_refuses_a_json_it_cannot_write)
{
    char *dir = dsv4_test_mkdtemp("cli-bench-json");
    char args[8192], sub[4200];
    snprintf(args, sizeof args, "bench --json %s/no/such/folder/b.json", dir);
    expect_cli(2, args, NEED("/no/such/folder/b.json", "cannot write the results"), NEED("no CUDA"));
    snprintf(sub, sizeof sub, "%s/adir", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(args, sizeof args, "bench --json %s", sub);
    expect_cli(2, args, NEED("adir", "cannot write the results"), NEED("no CUDA"));
    ck_assert_int_eq(count_entries(dir), 1); /* adir only: no temporary left beside it */
    ck_assert_int_eq(count_entries(sub), 0);
    /* a writable one passes the check (its temporary created and removed) and the run stops at the GPU: no
     * device is visible (CUDA_VISIBLE_DEVICES=-1) or the build has no CUDA; nothing is left in the folder */
    snprintf(args, sizeof args, "bench --json %s/ok.json", sub);
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    expect_cli(2, args, NEED("no CUDA"), NEED("cannot write"));
    unsetenv("CUDA_VISIBLE_DEVICES");
    ck_assert_int_eq(count_entries(sub), 0);
    dsv4_test_rmtree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_options");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, usage_help_and_version);
    tcase_add_test(tc, run_refuses_opt_options_on_ref_paths);
    tcase_add_test(tc, run_refuses_empty_and_out_of_range_numbers);
    tcase_add_test(tc, run_refuses_caches_too_small_up_front);
    tcase_add_test(tc, run_follow_refuses_other_weights);
    tcase_add_test(tc, run_names_the_prompt_file_and_its_problem);
    tcase_add_test(tc, run_names_each_usage_error);
    tcase_add_test(tc, run_refuses_a_dump_over_its_inputs);
    tcase_add_test(tc, run_without_a_gpu_says_so);
    tcase_add_test(tc, run_ref_gpu_takes_emulate_and_follow);
    tcase_add_test(tc, run_gpu_weights_is_ref_gpus);
    tcase_add_test(tc, run_notes_positions_past_max_position_embeddings);
    tcase_add_test(tc, a_forgotten_value_is_not_the_next_option);
    tcase_add_test(tc, a_list_option_given_twice_is_refused);
    tcase_add_test(tc, bench_refuses_bad_numbers);
    tcase_add_test(tc, bench_refuses_a_json_it_cannot_write);
    suite_add_tcase(s, tc);
    return dsv4_test_main(s);
}
