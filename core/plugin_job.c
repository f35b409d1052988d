/* A job file's plugins loaded into a registry (see tsr_plugin_job in tessera/plugin.h). */
#include <string.h>

#include "tessera/config.h"
#include "tessera/plugin.h"
#include "tessera/registry.h"

tsr_status tsr_plugin_job_load_string(const char *text, const char *name, tsr_plugin_job *out) {
  memset(out, 0, sizeof *out);
  tsr_status st = tsr_config_parse_string(text, name, &out->cfg);
  if (st == TSR_OK) st = tsr_registry_new(&out->reg);
  if (st == TSR_OK) st = tsr_plugin_set_load(out->cfg, out->reg, &out->set);
  if (st != TSR_OK) tsr_plugin_job_free(out);
  return st;
}

void tsr_plugin_job_free(tsr_plugin_job *job) {
  tsr_registry_free(job->reg);
  tsr_plugin_set_free(job->set);
  tsr_config_free(job->cfg);
  memset(job, 0, sizeof *job);
}
