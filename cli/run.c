/* run.c - placeholder while the subcommand is being written (replaced by its owner). */
#include <stdio.h>
#include "commands.h"

int dsv4_cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dsv4 run: not available in this build yet\n");
    return 2;
}
