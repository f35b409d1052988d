/* `tessera ini-reference`: the job-file reference, generated from the parser's schema. */
#include <stdio.h>

#include "app.h"

static const char ref_usage[] =
    "usage: tessera ini-reference\n"
    "\n"
    "Prints the job-file reference in Markdown, generated from the schema table the parser uses.\n"
    "docs/ini-reference.md is this output; a test fails when the two differ.\n"
    "\n"
    "exit codes: 0 printed, 1 write failed, 2 bad arguments\n";

int tsr_cmd_ini_reference(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(ref_usage, stdout);
    return TSR_EXIT_OK;
  }
  if (argc > 1) {
    fprintf(stderr, "tessera ini-reference: takes no arguments\n%s", ref_usage);
    return TSR_EXIT_BAD_INPUT;
  }
  tsr_status st = tsr_config_write_reference(stdout);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera ini-reference: %s\n", tsr_last_error());
    return TSR_EXIT_RUNTIME;
  }
  return TSR_EXIT_OK;
}
