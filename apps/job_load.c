/* Job loading that `plan` and `run` share: the file, its overrides, plugins, registry, mesh. */
#include <stdio.h>
#include <string.h>

#include "app.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"
#include "tessera_mpi.h"

tsr_status tsr_app_job_open(const char *path, int nset, const char *const *sets, tsr_app_job *job) {
  memset(job, 0, sizeof *job);
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_config_load(path, &job->cfg), st);
  for (int i = 0; i < nset; i++) TSR_CHECK_GOTO(tsr_config_set(job->cfg, sets[i]), st);
  TSR_CHECK_GOTO(tsr_config_check_sets(job->cfg), st);
  TSR_CHECK_GOTO(tsr_app_check_files(job->cfg), st);
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
