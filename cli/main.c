/* main.c - the dsv4 command: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "dsv4/dsv4.h"

typedef struct dsv4_subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} dsv4_subcommand;

static const dsv4_subcommand dsv4_subcommands[] = {
    {"inspect", dsv4_cmd_inspect, "summarise a model folder and check its tensors against its config"},
    {"run", dsv4_cmd_run, "run a path (ref-cpu, ref-gpu, opt) on a prompt and write an HDF5 dump"},
    {"verify", dsv4_cmd_verify, "compare two dumps layer by layer: errors, top-k agreement, logits"},
    {"replay", dsv4_cmd_replay, "judge a free-running candidate layer by layer on its own inputs"},
    {"bench", dsv4_cmd_bench, "decode throughput of the optimized path on a Flash-shaped random model"},
};

const char *dsv4_cli_value(int argc, char **argv, int i)
{
    if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) return NULL;
    return argv[i + 1];
}

int dsv4_cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int dsv4_cli_list_again(dsv4_cli_seen *seen, const char *opt)
{
    for (int i = 0; i < seen->n; i++)
        if (!strcmp(seen->opt[i], opt)) {
            dsv4_error(DSV4_ERR_USAGE,
                       "%s given twice: the second would replace the first, not add to it; give it once", opt);
            return 1;
        }
    if (seen->n < (int)(sizeof seen->opt / sizeof seen->opt[0])) seen->opt[seen->n++] = opt;
    return 0;
}

static void print_usage(FILE *f)
{
    fprintf(f, "dsv4 %s - DeepSeek-V4-Flash decoders (fp32 reference, optimized CUDA) and a layer-wise verifier\n\n"
               "usage: dsv4 <command> [options]\n\ncommands:\n",
            DSV4_VERSION);
    for (size_t i = 0; i < sizeof dsv4_subcommands / sizeof dsv4_subcommands[0]; i++)
        fprintf(f, "  %-8s %s\n", dsv4_subcommands[i].name, dsv4_subcommands[i].summary);
    fprintf(f, "\n'dsv4 <command> --help' describes a command, 'dsv4 --version' prints the version.\n"
               "Exit status: 0 ok, 1 problem found, 2 bad usage or unreadable input.\n");
}

int main(int argc, char **argv)
{
    dsv4_tempfile_install_signal_handlers(); /* SIGINT/SIGTERM remove a dump or report being written */
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv4 %s\n", DSV4_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof dsv4_subcommands / sizeof dsv4_subcommands[0]; i++)
        if (!strcmp(argv[1], dsv4_subcommands[i].name)) return dsv4_subcommands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv4: unknown command '%s'\n\n", argv[1]);
    print_usage(stderr);
    return 2;
}
