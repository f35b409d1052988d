/* `tessera plugins`: the plugin search path and what each plugin on it reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

static const char plugins_usage[] =
    "usage: tessera plugins [--path DIRS] [FILE.so ...]\n"
    "\n"
    "Without files: lists every libtessera-<name>.so on the plugin search path with its name,\n"
    "version, ABI, owned mesh dims, accepted [strategy.NAME] keys and path, and the load error of\n"
    "each one that fails the loader's checks (without calling its init).\n"
    "With files: checks just those files, and exits 2 if any of them fails.\n"
    "\n"
    "  --path DIRS  extra directories, searched as [plugins] path is (':' or ',' separated)\n"
    "\n"
    "exit codes: 0 listed (or every file passed), 2 bad arguments or a file failed\n";

static void print_report(const tsr_plugin_report *r) {
  if (r->status == TSR_OK) {
    printf("  %-12s %-8s ABI %u.%u  dims: %-12s %s\n", r->name, r->version, r->abi_major,
           r->abi_minor, r->dims[0] ? r->dims : "(none)", r->path);
    if (r->description[0]) printf("      %s\n", r->description);
    if (r->keys[0]) printf("      keys: %s\n", r->keys);
    if (r->message[0]) printf("      note: %s\n", r->message);
  } else {
    printf("  %-12s FAILED (%s check)  %s\n", r->name, tsr_plugin_check_name(r->failed), r->path);
    printf("      %s\n", r->message);
  }
}

int tsr_cmd_plugins(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(plugins_usage, stdout);
    return TSR_EXIT_OK;
  }
  const char *extra = NULL;
  int nfiles = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--path")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "tessera plugins: --path needs a value\n%s", plugins_usage);
        return TSR_EXIT_BAD_INPUT;
      }
      extra = argv[++i];
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "tessera plugins: unknown option '%s'\n%s", argv[i], plugins_usage);
      return TSR_EXIT_BAD_INPUT;
    } else {
      tsr_plugin_report rep;
      if (tsr_plugin_probe(argv[i], NULL, &rep) != TSR_OK) bad++;
      if (!nfiles) printf("plugin files:\n");
      print_report(&rep);
      nfiles++;
    }
  }
  if (nfiles) return bad ? TSR_EXIT_BAD_INPUT : TSR_EXIT_OK;

  char dirs[32][TSR_MAX_PATH];
  /* Relative --path entries are taken from the current directory only because the user typed
   * them on this command line; the loader itself never searches it. */
  int ndirs = tsr_plugin_search_dirs(extra, ".", dirs, 32);
  printf("search path (first match wins):\n");
  for (int i = 0; i < ndirs; i++) printf("  %d. %s\n", i + 1, dirs[i]);
  if (!ndirs) printf("  (empty)\n");

  tsr_plugin_report *reps = NULL;
  int n = 0;
  tsr_status st = tsr_plugin_discover(extra, ".", &reps, &n);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera plugins: %s\n", tsr_last_error());
    return tsr_app_exit_code(st);
  }
  int failed = 0;
  for (int i = 0; i < n; i++) failed += reps[i].status != TSR_OK;
  printf("\nplugins (%d found, %d loadable):\n", n, n - failed);
  if (!n) printf("  (none)\n");
  for (int i = 0; i < n; i++) print_report(&reps[i]);
  free(reps);
  return TSR_EXIT_OK;
}
