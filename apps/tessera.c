/* `tessera`: entry point and subcommand dispatch. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "app.h"
#include "conform.h"
#include "hf.h"
#include "tessera/tessera.h"
#include "tokenize.h"

static const char usage[] =
    "usage: tessera <command> [options]\n"
    "\n"
    "commands:\n"
    "  plugins [--path DIRS] [FILE.so ...]  list the plugins on the search path, or check files\n"
    "  plan JOB.ini                         validate a job; print its mesh, schedule, placements\n"
    "                                       and the state each rank will hold\n"
    "  run JOB.ini [--set S.K=V] [--dump F] validate a job and run it (train or forward)\n"
    "  compare A B [--rtol R] [--atol A]    compare two dumps tensor by tensor\n"
    "  tokenize TOKENIZER.json -o OUT FILE.. text or JSONL to a token file with a Hugging Face\n"
    "                                       tokenizer, and the index of its documents\n"
    "  decode TOKENIZER.json TOKENS         a token file back to text, one document per line\n"
    "  export JOB.ini DIR                   the job's checkpoint as a Hugging Face model folder\n"
    "  generate MODEL --prompt TEXT         continue a prompt (MODEL: a job file or HF folder)\n"
    "  conform PLUGIN [options]             run the conformance suite against a plugin\n"
    "  ini-reference                        print the job-file reference (docs/ini-reference.md)\n"
    "  help                                 this text\n"
    "\n"
    "`tessera <command> --help` describes each command.\n"
    "\n"
    "plugin search order: TESSERA_PLUGIN_PATH (absolute directories, ':'-separated), the job's\n"
    "[plugins] path, the install's lib/tessera, the build tree; never the current directory.\n"
    "\n"
    "exit codes:\n"
    "  0  success\n"
    "  1  runtime failure (a rank failed, a backend or device this build lacks, out of memory)\n"
    "  2  bad input (command line, job file, or a plugin that does not load or rejects the job)\n";

int tsr_app_exit_code(tsr_status s) {
  switch (s) {
    case TSR_OK:
      return TSR_EXIT_OK;
    case TSR_EINVAL:
    case TSR_EIO:
    case TSR_EPLUGIN:
      return TSR_EXIT_BAD_INPUT;
    default:
      return TSR_EXIT_RUNTIME;
  }
}

bool tsr_app_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
  return false;
}

/* Under ulimit -v or -d, the BLAS library's worker threads, started when it loads, may be retrying
 * an allocation their limit denies, which they never give up, and its exit handler joins them: a
 * job refused for want of memory would hang instead of exiting. So a failing command flushes its
 * output and skips the exit handlers. */
static int leave(int code) {
  struct rlimit as, data;
  bool limited = (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) ||
                 (getrlimit(RLIMIT_DATA, &data) == 0 && data.rlim_cur != RLIM_INFINITY);
  if (code != TSR_EXIT_OK && limited) {
    fflush(NULL);
    _exit(code);
  }
  return code;
}

static int dispatch(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return TSR_EXIT_BAD_INPUT;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") || !strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
    fputs(usage, stdout);
    return TSR_EXIT_OK;
  }
  if (!strcmp(cmd, "--version")) {
    printf("tessera %d.%d.%d (plugin ABI %d.%d)\n", TSR_VERSION_MAJOR, TSR_VERSION_MINOR,
           TSR_VERSION_PATCH, TSR_ABI_MAJOR, TSR_ABI_MINOR);
    return TSR_EXIT_OK;
  }
  if (!strcmp(cmd, "plugins")) return tsr_cmd_plugins(argc - 1, argv + 1);
  if (!strcmp(cmd, "plan")) return tsr_cmd_plan(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return tsr_cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "ini-reference")) return tsr_cmd_ini_reference(argc - 1, argv + 1);
  if (!strcmp(cmd, "compare")) return tsr_cmd_compare(argc - 1, argv + 1);
  if (!strcmp(cmd, "conform")) return tsr_cmd_conform(argc - 1, argv + 1);
  if (!strcmp(cmd, "tokenize")) return tsr_cmd_tokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "decode")) return tsr_cmd_decode(argc - 1, argv + 1);
  if (!strcmp(cmd, "export")) return tsr_cmd_export(argc - 1, argv + 1);
  if (!strcmp(cmd, "generate")) return tsr_cmd_generate(argc - 1, argv + 1);
  static const char *const cmds[] = {"plugins", "plan",     "run",      "ini-reference",
                                     "compare", "conform",  "tokenize", "decode",
                                     "export",  "generate", "help"};
  const char *hint = tsr_closest_name(cmd, cmds, 11);
  if (hint)
    fprintf(stderr, "tessera: unknown command '%s'; did you mean '%s'?\n", cmd, hint);
  else
    fprintf(stderr, "tessera: unknown command '%s'; see tessera --help\n", cmd);
  return TSR_EXIT_BAD_INPUT;
}

int main(int argc, char **argv) {
  /* the commands that compute run with OpenBLAS's workers sleeping soon after each GEMM */
  if (argc > 1 && (!strcmp(argv[1], "run") || !strcmp(argv[1], "generate")))
    tsr_kernel_blas_reexec(argv);
  return leave(dispatch(argc, argv));
}
