/* commands.h - the dsv4 subcommands. Each takes the arguments after its name (argv[0] = subcommand name)
 * and returns the process exit status: 0 ok, 1 problem found (divergence, bad tensors), 2 bad usage or
 * unreadable input. */
#ifndef DSV4_CLI_COMMANDS_H
#define DSV4_CLI_COMMANDS_H

int dsv4_cmd_inspect(int argc, char **argv);
int dsv4_cmd_verify(int argc, char **argv);
int dsv4_cmd_run(int argc, char **argv);
int dsv4_cmd_bench(int argc, char **argv);

#endif
