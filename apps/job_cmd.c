/* `tessera plan` and `tessera run`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "tessera/comm.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"

/* Beyond this many ranks the plan prints the first and last few: the pattern is the point. */
#define PLAN_MAX_RANKS 32

tsr_status tsr_app_job_open(const char *path, tsr_app_job *job) {
  memset(job, 0, sizeof *job);
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_config_load(path, &job->cfg), st);
  TSR_CHECK_GOTO(tsr_registry_new(&job->reg), st);
  TSR_CHECK_GOTO(tsr_plugin_set_load(job->cfg, job->reg, &job->plugins), st);
  const tsr_config *c = job->cfg;
  const char *names[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < c->mesh.ndim; i++) names[i] = c->mesh.names[i];
  TSR_CHECK_GOTO(tsr_mesh_init((int)c->mesh.world, c->mesh.ndim, c->mesh.shape, names, &job->mesh),
                 st);
  return TSR_OK;
cleanup:
  fprintf(stderr, "%s\n", tsr_last_error());
  tsr_app_job_close(job);
  return st;
}

void tsr_app_job_close(tsr_app_job *job) {
  tsr_mesh_free(job->mesh);
  /* The registry holds pointers into the plugins: it goes before they are closed. */
  tsr_registry_free(job->reg);
  tsr_plugin_set_free(job->plugins);
  tsr_config_free(job->cfg);
  memset(job, 0, sizeof *job);
}

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
  fprintf(f, "job %s: mode %s, %lld steps, backend %s, device %s, timeout %gs\n", c->path,
          c->job.mode == TSR_MODE_TRAIN ? "train" : "forward", (long long)c->job.steps,
          c->job.backend, c->job.device == TSR_DEVICE_CUDA ? "cuda" : "cpu", c->job.timeout_s);
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
  fprintf(f, "parameters: not listed yet: the model is not implemented in this build, so there "
             "are no parameter placements or per-rank bytes to show\n");
}

static const char plan_usage[] =
    "usage: tessera plan JOB.ini\n"
    "\n"
    "Validates the job file and its plugins exactly as `run` does, then prints the mesh\n"
    "(rank -> coordinates), which plugin owns each mesh dim, the loaded plugins and what they\n"
    "registered. Nothing runs.\n"
    "\n"
    "exit codes: 0 valid, 1 runtime failure, 2 bad input (file:line:key errors on stderr)\n";

static const char run_usage[] =
    "usage: tessera run JOB.ini\n"
    "\n"
    "Validates the job, loads its plugins, starts [mesh] shape's product of ranks on [job]\n"
    "backend and runs the job. Backends built in: local (ranks are threads of this process).\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure (a rank failed, backend or device not built),\n"
    "            2 bad input (file:line:key errors on stderr)\n";

/* Parses "CMD JOB.ini": returns the path or NULL after printing why. */
static const char *job_arg(int argc, char **argv, const char *usage, int *code) {
  *code = TSR_EXIT_OK;
  if (tsr_app_wants_help(argc, argv)) {
    fputs(usage, stdout);
    return NULL;
  }
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
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
  const char *path = job_arg(argc, argv, plan_usage, &code);
  if (!path) return code;
  tsr_app_job job;
  tsr_status st = tsr_app_job_open(path, &job);
  if (st != TSR_OK) return tsr_app_exit_code(st);
  tsr_app_print_plan(&job, stdout);
  tsr_app_job_close(&job);
  return TSR_EXIT_OK;
}

/* What each rank of `tessera run` needs; shared read-only by the rank threads. */
typedef struct run_ctx {
  const tsr_app_job *job;
} run_ctx;

static tsr_status run_rank(tsr_comm_t *comm, void *arg) {
  const run_ctx *ctx = arg;
  const tsr_app_job *job = ctx->job;
  tsr_rank_t *r = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, job->reg, &r), st);
  tsr_group_t *all;
  uint32_t mask = (1u << tsr_mesh_ndim(job->mesh)) - 1u;
  TSR_CHECK_GOTO(tsr_mesh_group(job->mesh, comm, mask, &all), st);
  TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
  if (tsr_rank_id(r) == 0) {
    tsr_app_print_plan(job, stdout);
    printf("run: %d ranks started on backend %s and reached a barrier\n", tsr_rank_world(r),
           tsr_comm_backend(comm));
  }
cleanup:
  tsr_rank_free(r);
  return st;
}

int tsr_cmd_run(int argc, char **argv) {
  int code;
  const char *path = job_arg(argc, argv, run_usage, &code);
  if (!path) return code;
  tsr_app_job job;
  tsr_status st = tsr_app_job_open(path, &job);
  if (st != TSR_OK) return tsr_app_exit_code(st);
  const tsr_config *c = job.cfg;
  int line = tsr_config_line(c, "job", "backend");
  if (strcmp(c->job.backend, "local")) {
    fprintf(stderr,
            "%s:%d: [job] backend: backend '%s' is not built in this tessera; only 'local' is. "
            "Use backend = local (ranks as threads of one process) for now\n",
            c->path, line, c->job.backend);
    tsr_app_job_close(&job);
    return TSR_EXIT_RUNTIME;
  }
  if (c->job.device == TSR_DEVICE_CUDA) {
    fprintf(stderr,
            "%s:%d: [job] device: device 'cuda' is not built in this tessera; use device = cpu\n",
            c->path, tsr_config_line(c, "job", "device"));
    tsr_app_job_close(&job);
    return TSR_EXIT_RUNTIME;
  }
  run_ctx ctx = {&job};
  st = tsr_local_launch((int)c->mesh.world, c->job.timeout_s, run_rank, &ctx);
  if (st != TSR_OK) {
    fprintf(stderr, "tessera run: %s\n", tsr_last_error());
    tsr_app_job_close(&job);
    return tsr_app_exit_code(st) == TSR_EXIT_BAD_INPUT ? TSR_EXIT_RUNTIME : tsr_app_exit_code(st);
  }
  printf("run: mode = %s needs the Llama model, which is not implemented in this build yet: the "
         "job was validated, its plugins loaded and its mesh set up; there is nothing more to "
         "run\n",
         c->job.mode == TSR_MODE_TRAIN ? "train" : "forward");
  tsr_app_job_close(&job);
  return TSR_EXIT_OK;
}
