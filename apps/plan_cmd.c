/* `tessera plan`: the job checked and described, nothing run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "train.h"
#include "train_act.h"
#include "train_mem.h"
#include "tessera/comm.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"

/* Beyond this many ranks the plan prints the first and last few: the pattern is the point. */
#define PLAN_MAX_RANKS 32
#define PLAN_MAX_SETS  64 /* --set overrides on one command line */

static void print_rank(const tsr_app_job *job, int rank, FILE *f) {
  int coords[TSR_MAX_MESH_DIMS];
  tsr_mesh_coords(job->mesh, rank, coords);
  fprintf(f, "  rank %3d:", rank);
  for (int d = 0; d < job->cfg->mesh.ndim; d++)
    fprintf(f, " %s=%d", job->cfg->mesh.names[d], coords[d]);
  fprintf(f, "\n");
}

void tsr_app_print_plan(const tsr_app_job *job, FILE *f) {
  const tsr_config *c = job->cfg;
  char buf[512];
  fprintf(f, "job %s: mode %s, %lld steps, backend %s, device %s, dtype %s, timeout %gs\n", c->path,
          c->job.mode == TSR_MODE_TRAIN ? "train" : "forward", (long long)c->job.steps,
          c->job.backend, tsr_device_name(c->job.device), tsr_dtype_name(c->job.dtype),
          c->job.timeout_s);
  fprintf(f, "mesh: %s\n", tsr_mesh_str(job->mesh, buf, sizeof buf));
  int world = (int)c->mesh.world;
  for (int r = 0; r < world; r++) {
    if (world > PLAN_MAX_RANKS && r == PLAN_MAX_RANKS / 2) {
      fprintf(f, "  ... %d more ranks ...\n", world - PLAN_MAX_RANKS);
      r = world - PLAN_MAX_RANKS / 2;
    }
    print_rank(job, r, f);
  }
  fprintf(f, "dims:\n");
  for (int d = 0; d < c->mesh.ndim; d++) {
    const char *owner = tsr_plugin_set_owner(job->plugins, c->mesh.names[d]);
    fprintf(f, "  %-12s size %-4d %s%s%s\n", c->mesh.names[d], c->mesh.shape[d],
            owner ? "owned by " : "no owner", owner ? owner : "",
            !owner || c->mesh.shape[d] == 1 ? " (size 1: inactive)" : "");
  }
  fprintf(f, "plugins:%s\n", tsr_plugin_set_count(job->plugins) ? "" : " none");
  for (int i = 0; i < tsr_plugin_set_count(job->plugins); i++) {
    const tsr_plugin_report *r = tsr_plugin_set_report(job->plugins, i);
    fprintf(f, "  %-12s %-8s ABI %u.%u  dims: %-10s %s\n", r->name, r->version, r->abi_major,
            r->abi_minor, r->dims[0] ? r->dims : "(none)", r->path);
  }
  fprintf(f,
          "registry: %d redistribute transitions, %d op rules, %d module styles, %d schedules, "
          "%d optimizer hooks\n",
          tsr_registry_redistribute_count(job->reg), tsr_registry_op_rule_count(job->reg),
          tsr_registry_module_style_count(job->reg), tsr_registry_schedule_count(job->reg),
          tsr_registry_optim_hook_count(job->reg));
  tsr_train_pipe_print_plan(job, f);
  tsr_train_mem *per_rank = calloc((size_t)world, sizeof *per_rank);
  char *params = NULL;
  tsr_status st = per_rank ? tsr_train_mem_plan(job, per_rank, &params)
                           : TSR_ERROR(TSR_ENOMEM, "out of memory for %d ranks", world);
  if (st == TSR_OK) {
    if (params)
      fprintf(f, "parameters on rank 0 (global shape -> local shape, placements):\n%s", params);
    tsr_train_mem_print(f, job, per_rank, "planned");
    tsr_train_act *act = calloc((size_t)world, sizeof *act);
    if (act && tsr_train_act_plan(job, act) == TSR_OK)
      tsr_train_act_print(f, job, per_rank, act);
    else
      fprintf(f, "activations per rank: not computed: %s\n", act ? tsr_last_error() : "no memory");
    free(act);
  } else {
    fprintf(f, "parameters and state per rank: not computed: %s\n", tsr_last_error());
    /* the activations need no model: with the state split evenly instead */
    tsr_train_act *act = calloc((size_t)world, sizeof *act);
    if (act && per_rank && tsr_train_act_plan(job, act) == TSR_OK) {
      tsr_train_act_state_estimate(job, per_rank);
      fprintf(f, "(the state below: parameters split evenly over tp, dp_shard and the stages)\n");
      tsr_train_act_print(f, job, per_rank, act);
    }
    free(act);
  }
  free(params);
  free(per_rank);
}

/* Runs the job's first step on every rank (tsr_train_check_first_step), so that whatever `run`
 * would refuse when it starts or at its first step (two communicating rules for one op, a rule that
 * refuses its inputs, a checkpoint that does not fit the model, data too short) is refused here,
 * with run's message. Says on `f` what was done, or why not. */
static tsr_status check_step(const tsr_app_job *job, FILE *f) {
  const tsr_config *c = job->cfg;
  tsr_llama_config mc = tsr_train_model_config(c);
  long long n = (long long)tsr_llama_num_params(&mc);
  if (n > TSR_TRAIN_MEM_PLAN_MAX_PARAMS) {
    fprintf(f, "first step: not run: %lld parameters, more than the %lld plan builds\n", n,
            (long long)TSR_TRAIN_MEM_PLAN_MAX_PARAMS);
    return TSR_OK;
  }
  if (c->mesh.world > TSR_LOCAL_MAX_RANKS) {
    fprintf(f,
            "first step: not run: %lld ranks, more than the %d that run as threads of one "
            "process\n",
            (long long)c->mesh.world, TSR_LOCAL_MAX_RANKS);
    return TSR_OK;
  }
  tsr_status st = tsr_train_check_first_step(job);
  if (st == TSR_OK)
    fprintf(f,
            "first step: run on %lld ranks on the CPU (checkpoint, data, forward%s), nothing "
            "written\n",
            (long long)c->mesh.world, c->job.mode == TSR_MODE_TRAIN ? ", backward, optimizer" : "");
  return st;
}

static const char plan_usage[] =
    "usage: tessera plan JOB.ini [--force] [--set SECTION.KEY=VALUE ...]\n"
    "\n"
    "Validates the job file and its plugins exactly as `run` does, then prints the mesh\n"
    "(rank -> coordinates), which plugin owns each mesh dim, the loaded plugins and what they\n"
    "registered, the pipeline schedule as a timeline (pp > 1), rank 0's parameters with their\n"
    "placements, and the parameter, gradient and AdamW bytes each rank will hold, found by\n"
    "building each rank's model in turn. Then it runs the job's first step on every rank, as\n"
    "threads of this process on the CPU, writing nothing: what `run` would refuse at the start\n"
    "or at its first step, plan refuses, with run's message. Before any model is built, the\n"
    "training state of the ranks each process runs must fit the memory it may use (physical,\n"
    "cgroup, ulimit -v), as for run; --force, as for run, goes on regardless. Each rank's\n"
    "activation peak for the job's checkpointing mode, microbatches and pipeline schedule is\n"
    "predicted from the shapes and placements, and the job is refused when a rank's predicted\n"
    "total exceeds [job] memory_limit, as run refuses it. --set overrides a key as for run.\n"
    "\n"
    "exit codes: 0 valid, 1 runtime failure, 2 bad input (file:line:key errors on stderr)\n";

/* Parses "CMD JOB.ini [--force] [--set S.K=V ...]": returns the path or NULL after printing why;
 * sets[*nset] point into argv. */
static const char *job_arg(int argc, char **argv, const char *usage, int *code, bool *force,
                           const char **sets, int *nset) {
  *code = TSR_EXIT_OK;
  if (tsr_app_wants_help(argc, argv)) {
    fputs(usage, stdout);
    return NULL;
  }
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--force")) {
      *force = true;
      continue;
    }
    if (!strcmp(argv[i], "--set") && i + 1 < argc && *nset < PLAN_MAX_SETS) {
      sets[(*nset)++] = argv[++i];
      continue;
    }
    if (argv[i][0] == '-') {
      fprintf(stderr, "tessera %s: unknown option '%s'\n%s", argv[0], argv[i], usage);
      *code = TSR_EXIT_BAD_INPUT;
      return NULL;
    }
    if (path) {
      fprintf(stderr, "tessera %s: one job file only ('%s' and '%s')\n", argv[0], path, argv[i]);
      *code = TSR_EXIT_BAD_INPUT;
      return NULL;
    }
    path = argv[i];
  }
  if (!path) {
    fprintf(stderr, "tessera %s: missing JOB.ini\n%s", argv[0], usage);
    *code = TSR_EXIT_BAD_INPUT;
  }
  return path;
}

int tsr_cmd_plan(int argc, char **argv) {
  int code;
  bool force = false;
  const char *sets[PLAN_MAX_SETS];
  int nset = 0;
  const char *path = job_arg(argc, argv, plan_usage, &code, &force, sets, &nset);
  if (!path) return code;
  /* paths in overrides are relative to the current directory, as for run */
  char *abs[PLAN_MAX_SETS];
  for (int i = 0; i < nset; i++) {
    abs[i] = tsr_app_absolute_set("plan", sets[i]);
    if (!abs[i]) {
      for (int j = 0; j < i; j++) free(abs[j]);
      return TSR_EXIT_BAD_INPUT;
    }
  }
  tsr_app_job job;
  tsr_status st = tsr_app_job_open(path, nset, (const char *const *)abs, &job);
  for (int i = 0; i < nset; i++) free(abs[i]);
  if (st != TSR_OK) return tsr_app_exit_code(st);
  st = tsr_train_mem_check(&job, force, stdout);
  if (st == TSR_OK) st = tsr_train_act_check(&job);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera plan: %s\n", tsr_last_error());
    tsr_app_job_close(&job);
    return tsr_app_exit_code(st);
  }
  tsr_app_print_plan(&job, stdout);
  fflush(stdout);
  st = check_step(&job, stdout);
  if (st != TSR_OK) fprintf(stderr, "tessera plan: %s\n", tsr_last_error());
  tsr_app_job_close(&job);
  return tsr_app_exit_code(st);
}
