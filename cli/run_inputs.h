/* run_inputs.h - `dsv4 run`'s position list and replay candidate (cli/run_inputs.c). */
#ifndef DSV4_CLI_RUN_INPUTS_H
#define DSV4_CLI_RUN_INPUTS_H

#include <stdint.h>

#include "dsv4/dsv4.h"
#include "dsv4/dsv4_ref.h"

/* --dump-positions SPEC over T positions with a prompt of P: the ascending list (malloc'd) into *out, its length
 * into *n; DSV4_ERR_USAGE naming what cannot be parsed. */
int dsv4_cli_parse_positions(const char *spec, int T, int P, int32_t **out, int *n);
/* --replay PATH: the candidate's state for the model of cfg, refused unless its weights_digest is digest (or allowed). */
int dsv4_cli_replay_open(const char *path, const dsv4_config *cfg, const char *digest, int allow_different_weights,
                         dsv4_ref_replay **out);

#endif
