/* commands.h - the dsv4 subcommands. Each takes the arguments after its name (argv[0] = subcommand name)
 * and returns the process exit status: 0 ok, 1 problem found (divergence, bad tensors), 2 bad usage or
 * unreadable input. */
#ifndef DSV4_CLI_COMMANDS_H
#define DSV4_CLI_COMMANDS_H

int dsv4_cmd_inspect(int argc, char **argv);
int dsv4_cmd_verify(int argc, char **argv);
int dsv4_cmd_run(int argc, char **argv);
int dsv4_cmd_bench(int argc, char **argv);
int dsv4_cmd_replay(int argc, char **argv);

/* The value of the option argv[i]: argv[i + 1], or NULL when there is none or it is itself a long option, so
 * that a forgotten value is "needs a value" and not the next option taken as one (`verify ... --json --quiet`
 * wrote a report named --quiet). A value may still begin with a single '-' (a range such as --layers -3). */
const char *dsv4_cli_value(int argc, char **argv, int i);
/* 1 when both paths exist and are one file (device and inode: another spelling of the path is caught), so that an
 * output that replaces its final name when complete is never one of the command's inputs. */
int dsv4_cli_same_file(const char *a, const char *b);

/* The options of a command line that select a list (run/verify --probes, --layers, --positions, bench --batch,
 * --context, ...). A second one would replace the first, where a user may well mean both: the commands refuse
 * it. Other options repeated take their last value (a wrapper's default can be overridden). */
typedef struct dsv4_cli_seen {
    const char *opt[16];
    int n;
} dsv4_cli_seen;
/* 1 when `opt` was recorded in `seen` before (the message, naming it, is dsv4_last_error()); else records it and
 * returns 0. */
int dsv4_cli_list_again(dsv4_cli_seen *seen, const char *opt);

#endif
