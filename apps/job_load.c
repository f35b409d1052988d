/* Job loading that `plan` and `run` share: the file, its overrides, plugins, registry, mesh. */
#include <stdio.h>
#include <string.h>

#include "app.h"
#include "hf.h"
#include "tessera/comm.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"
#include "tessera_mpi.h"
#include "tessera_nccl.h"
#include "train.h"
#include "train_act.h"
#include "train_ckpt.h"

/* What the job asks of this process and machine: a backend built in, a device present, a local
 * world the threads of one process can hold, no MPI launcher around a local job. TSR_ENOTSUP
 * (exit 1) for what this build or machine lacks, TSR_EINVAL (exit 2) for a job the backend
 * cannot run. */
static tsr_status check_backend(const tsr_config *c) {
  char where[TSR_MAX_PATH + 160];
  bool local = !strcmp(c->job.backend, "local"), mpi = !strcmp(c->job.backend, "mpi"),
       nccl = !strcmp(c->job.backend, "nccl");
  if (!local && !(mpi && tsr_mpi_loader_built()) && !(nccl && tsr_nccl_loader_built()))
    return tsr_error(TSR_ENOTSUP,
                     "%s: backend '%s' is not built in this tessera; only %s. "
                     "Use backend = local (ranks as threads of one process) for now",
                     tsr_config_where(c, "job", "backend", where, sizeof where), c->job.backend,
                     tsr_mpi_loader_built() ? "'local' and 'mpi' are" : "'local' is");
  if (nccl && c->job.device != TSR_DEVICE_CUDA)
    return tsr_error(TSR_ENOTSUP,
                     "%s: nccl moves GPU memory; use it with device = cuda, or "
                     "backend = mpi for processes on the CPU",
                     tsr_config_where(c, "job", "backend", where, sizeof where));
  if (tsr_device_check((tsr_device){c->job.device, 0}) != TSR_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tsr_last_error());
    return tsr_error(TSR_ENOTSUP, "%s: %s",
                     tsr_config_where(c, "job", "device", where, sizeof where), why);
  }
  if (local && c->mesh.world > TSR_LOCAL_MAX_RANKS)
    return tsr_config_error(c, TSR_EINVAL, "mesh", "shape",
                            "%lld ranks, but backend = local runs its ranks as threads of one "
                            "process, at most %d; use backend = mpi (one process per rank) or a "
                            "smaller mesh",
                            (long long)c->mesh.world, TSR_LOCAL_MAX_RANKS);
  /* `mpirun -np 2 tessera run` of a local job would run the whole job twice, both copies
   * writing the same checkpoint: the launcher's environment says when this process is one of
   * several */
  const char *var = NULL;
  int procs = tsr_mpi_env_size(&var), rank = tsr_mpi_env_rank();
  if (local && (procs > 1 || rank > 0)) {
    char seen[64];
    if (procs > 1)
      snprintf(seen, sizeof seen, "%s=%d", var, procs);
    else
      snprintf(seen, sizeof seen, "rank %d", rank);
    return tsr_config_error(c, TSR_EINVAL, "job", "backend",
                            "local, but an MPI launcher started this process as one of several "
                            "(%s): each would run the whole job as threads and write the same "
                            "files. Set backend = mpi to run one rank per process (mpirun -np "
                            "%lld, the mesh's ranks), or start tessera without the launcher",
                            seen, (long long)c->mesh.world);
  }
  return TSR_OK;
}

tsr_status tsr_app_job_open(const char *path, int nset, const char *const *sets, tsr_app_job *job) {
  memset(job, 0, sizeof *job);
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_config_load(path, &job->cfg), st);
  for (int i = 0; i < nset; i++) TSR_CHECK_GOTO(tsr_config_set(job->cfg, sets[i]), st);
  TSR_CHECK_GOTO(tsr_config_check_sets(job->cfg), st);
  if (!tsr_train_ckpt_wants_load(job->cfg)) /* a sharded checkpoint folder is not a HF one */
    TSR_CHECK_GOTO(tsr_hf_job_apply(job->cfg), st); /* [checkpoint] load = a HF folder */
  TSR_CHECK_GOTO(tsr_app_check_files(job->cfg), st);
  TSR_CHECK_GOTO(check_backend(job->cfg), st);
  TSR_CHECK_GOTO(tsr_train_check_config(job->cfg), st);
  int64_t limit;
  TSR_CHECK_GOTO(tsr_train_memory_limit(job->cfg, &limit), st);
  TSR_CHECK_GOTO(tsr_registry_new(&job->reg), st);
  TSR_CHECK_GOTO(tsr_plugin_set_load(job->cfg, job->reg, &job->plugins), st);
  const tsr_config *c = job->cfg;
  const char *names[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < c->mesh.ndim; i++) names[i] = c->mesh.names[i];
  TSR_CHECK_GOTO(tsr_mesh_init((int)c->mesh.world, c->mesh.ndim, c->mesh.shape, names, &job->mesh),
                 st);
  return TSR_OK;
cleanup:
  /* Under mpirun every rank reads the same job: rank 0 alone reports what is wrong with it. */
  if (tsr_mpi_env_rank() <= 0) fprintf(stderr, "%s\n", tsr_last_error());
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
