/* `tessera run`: option parsing, backend checks, then the training loop (train.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app.h"
#include "train.h"
#include "train_act.h"
#include "train_mem.h"
#include "tessera_mpi.h"
#include "tessera_nccl.h"

#define MAX_SETS 64

static const char run_usage[] =
    "usage: tessera run JOB.ini [options]\n"
    "\n"
    "Validates the job, loads its plugins, starts [mesh] shape's product of ranks on [job]\n"
    "backend and runs it: mode = train runs [job] steps optimizer steps, mode = forward runs\n"
    "[job] steps forward passes. Rank 0 logs one line per step (loss, lr, grad norm, tokens/s,\n"
    "FLOP/s and MFU against the sgemm peak measured at start-up, peak memory over ranks, bytes\n"
    "sent per mesh dim). Backends: local (ranks are threads of this process); mpi (ranks are\n"
    "processes: mpirun -np N tessera run JOB.ini) when built with Open MPI (docs/mpi.md).\n"
    "\n"
    "options:\n"
    "  --set SECTION.KEY=VALUE  override a job-file key (repeatable); relative paths are taken\n"
    "                           from the current directory\n"
    "  --dump PATH              shorthand for --set output.dump=PATH\n"
    "  --stop-at STEP           stop after optimizer step STEP and save the checkpoint there;\n"
    "                           the lr schedule still spans [job] steps (for resumable runs)\n"
    "  --dump-step STEP         the dump (--dump, [output] dump) is of optimizer step STEP\n"
    "                           instead of the run's first step\n"
    "  --json                   one JSON object per step instead of the human log line\n"
    "  --no-progress            plain lines even on a terminal\n"
    "  --no-peak                skip the sgemm peak measurement (no MFU in the log)\n"
    "  --force                  run even when the training state of this process's ranks does\n"
    "                           not fit the memory it may use (physical, cgroup, ulimit -v)\n"
    "\n"
    "A rank that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGABRT) is reported in one line naming\n"
    "the rank, the plugin callback or op it ran, the step and the microbatch. When several\n"
    "ranks fail, the first failure in time is reported, the ranks that failed after it below.\n"
    "\n"
    "SIGINT or SIGTERM: the step under way finishes, the checkpoint ([checkpoint] save, dir) is\n"
    "written at it, and the run exits with 130 (SIGINT) or 143 (SIGTERM) and a line saying so;\n"
    "a second SIGINT or SIGTERM exits at once.\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure (a rank failed, backend or device not built),\n"
    "            2 bad input (file:line:key errors on stderr; bad checkpoint, data or options),\n"
    "            130, 143 stopped by SIGINT, SIGTERM\n";

int tsr_cmd_run(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(run_usage, stdout);
    return TSR_EXIT_OK;
  }
  /* a crash in any rank (or in a plugin's init) names the rank and what it ran, then exit 1 */
  tsr_app_crash_install("tessera run");
  const char *path = NULL;
  char *sets[MAX_SETS];
  int nset = 0, code = TSR_EXIT_OK;
  bool force = false;
  tsr_train_opts opts = {.progress = isatty(STDOUT_FILENO) != 0, .peak_secs = 0.3, .out = stdout};
  for (int i = 1; i < argc && code == TSR_EXIT_OK; i++) {
    const char *a = argv[i];
    bool takes = !strcmp(a, "--set") || !strcmp(a, "--dump") || !strcmp(a, "--stop-at") ||
                 !strcmp(a, "--dump-step");
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "tessera run: %s needs a value\n%s", a, run_usage);
      code = TSR_EXIT_BAD_INPUT;
    } else if (takes && nset >= MAX_SETS) {
      fprintf(stderr, "tessera run: more than %d overrides\n", MAX_SETS);
      code = TSR_EXIT_BAD_INPUT;
    } else if (!strcmp(a, "--set")) {
      sets[nset] = tsr_app_absolute_set("run", argv[++i]);
      if (sets[nset])
        nset++;
      else
        code = TSR_EXIT_BAD_INPUT;
    } else if (!strcmp(a, "--dump")) {
      size_t len = strlen(argv[i + 1]) + 16;
      char *s = malloc(len);
      if (s) snprintf(s, len, "output.dump=%s", argv[++i]);
      sets[nset] = s ? tsr_app_absolute_set("run", s) : NULL;
      if (sets[nset])
        nset++;
      else
        code = TSR_EXIT_BAD_INPUT;
      free(s);
    } else if (!strcmp(a, "--stop-at")) {
      char *end;
      opts.stop_at = strtoll(argv[++i], &end, 10);
      if (*end || opts.stop_at < 1) {
        fprintf(stderr, "tessera run: --stop-at '%s': expected a step number >= 1\n", argv[i]);
        code = TSR_EXIT_BAD_INPUT;
      }
    } else if (!strcmp(a, "--dump-step")) {
      char *end;
      opts.dump_step = strtoll(argv[++i], &end, 10);
      if (*end || opts.dump_step < 1) {
        fprintf(stderr, "tessera run: --dump-step '%s': expected a step number >= 1\n", argv[i]);
        code = TSR_EXIT_BAD_INPUT;
      }
    } else if (!strcmp(a, "--json")) {
      opts.json = true;
    } else if (!strcmp(a, "--no-progress")) {
      opts.progress = false;
    } else if (!strcmp(a, "--no-peak")) {
      opts.peak_secs = 0;
    } else if (!strcmp(a, "--force")) {
      force = true;
    } else if (a[0] == '-') {
      fprintf(stderr, "tessera run: unknown option '%s'\n%s", a, run_usage);
      code = TSR_EXIT_BAD_INPUT;
    } else if (path) {
      fprintf(stderr, "tessera run: one job file only ('%s' and '%s')\n", path, a);
      code = TSR_EXIT_BAD_INPUT;
    } else {
      path = a;
    }
  }
  if (code == TSR_EXIT_OK && !path) {
    fprintf(stderr, "tessera run: missing JOB.ini\n%s", run_usage);
    code = TSR_EXIT_BAD_INPUT;
  }
  if (opts.json) opts.progress = false;
  /* Under mpirun rank 0 writes the log; the other processes run silently. */
  FILE *quiet = tsr_mpi_env_rank() > 0 ? fopen("/dev/null", "w") : NULL;
  if (quiet) opts.out = quiet, opts.progress = false;
  tsr_app_job job;
  memset(&job, 0, sizeof job);
  if (code == TSR_EXIT_OK) {
    tsr_status st = tsr_app_job_open(path, nset, (const char *const *)sets, &job);
    if (st != TSR_OK) code = tsr_app_exit_code(st);
  }
  /* before any model is built: the state of this process's ranks must fit its memory */
  if (code == TSR_EXIT_OK) {
    tsr_status st = tsr_train_mem_check(&job, force, opts.out);
    if (st == TSR_OK) st = tsr_train_act_check(&job); /* [job] memory_limit, as plan checks it */
    if (st != TSR_OK) {
      if (tsr_mpi_env_rank() <= 0) fprintf(stderr, "tessera run: %s\n", tsr_last_error());
      code = tsr_app_exit_code(st);
    }
  }
  /* the backend, device and world were checked with the job (job_load.c) */
  bool mpi = code == TSR_EXIT_OK && !strcmp(job.cfg->job.backend, "mpi");
  bool nccl = code == TSR_EXIT_OK && !strcmp(job.cfg->job.backend, "nccl");
  /* from here SIGINT and SIGTERM stop the run after the current step; a second exits at once */
  if (code == TSR_EXIT_OK)
    tsr_app_stop_install(tsr_mpi_env_rank() > 0, tsr_config_ext_of(job.cfg)->job_stop.stop_grace_s);
  if (code == TSR_EXIT_OK) {
    tsr_status st = tsr_train_run(&job, &opts);
    if (st != TSR_OK) {
      if (opts.progress) fputc('\n', stdout);
      fflush(stdout);
      /* Before the launch every mpi rank fails alike and rank 0 speaks for all; once running,
       * each failing rank reports itself and ends the job, as peers may wait for it. */
      bool started = tsr_mpi_loader_started() || tsr_nccl_loader_started();
      if (!(mpi || nccl) || tsr_mpi_env_rank() <= 0 || started)
        fprintf(stderr, "tessera run: %s\n", tsr_last_error());
      code = tsr_app_exit_code(st);
      if (mpi) tsr_mpi_loader_abort(code);
      if (nccl) tsr_nccl_loader_abort(code);
    }
    int sig = 0;
    int64_t at = 0, last = 0;
    if (st == TSR_OK && tsr_app_stopped(&sig, &at, &last)) {
      if (opts.progress) fputc('\n', stdout);
      fflush(stdout);
      const tsr_config *c = job.cfg;
      char saved[TSR_TRAIN_PATH_LEN];
      const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      bool train = c->job.mode == TSR_MODE_TRAIN, lead = tsr_mpi_env_rank() <= 0;
      bool dir = train && tsr_config_ext_of(c)->checkpoint.dir[0],
           file = train && c->checkpoint.save[0];
      if (lead && file)
        fprintf(stderr,
                "tessera run: stopped by %s after step %lld of %lld; checkpoint written to %s "
                "(resume with [checkpoint] load = it)\n",
                name, (long long)at, (long long)last,
                tsr_train_path(c, c->checkpoint.save, saved, sizeof saved));
      if (lead && dir)
        fprintf(stderr,
                "tessera run: stopped by %s after step %lld of %lld; checkpoint written to "
                "%s/step-%06lld (resume with [checkpoint] load = latest)\n",
                name, (long long)at, (long long)last,
                tsr_train_path(c, tsr_config_ext_of(c)->checkpoint.dir, saved, sizeof saved),
                (long long)at);
      if (lead && !file && !dir)
        fprintf(stderr,
                "tessera run: stopped by %s after step %lld of %lld; no checkpoint written (%s)\n",
                name, (long long)at, (long long)last,
                train ? "[checkpoint] save is empty" : "mode = forward");
      code = 128 + sig;
    }
  }
  if (job.cfg) tsr_app_job_close(&job);
  for (int i = 0; i < nset; i++) free(sets[i]);
  if (quiet) fclose(quiet);
  /* A job refused before the launch fails alike on every process and rank 0 alone says why; mpirun
   * ends the whole job at the first non-zero exit, so the silent ranks leave a moment later, or
   * rank 0 could be killed before its message is out. */
  if (code != TSR_EXIT_OK && tsr_mpi_env_rank() > 0 && !tsr_mpi_loader_started() &&
      !tsr_nccl_loader_started()) {
    struct timespec grace = {1, 0};
    nanosleep(&grace, NULL);
  }
  return code;
}
