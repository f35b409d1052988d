/* libFuzzer target: the job-file parser and --set overrides, as `tessera run` applies them.
 *
 * Input: a job file, optionally followed by a line "%%" and one override per line
 * ("section.key=value", as after --set). The file is parsed from disk (tsr_config_load, the
 * reader with its BOM, NUL and long-line handling), each override applied (tsr_config_set),
 * then the checks run once all are in (tsr_config_check_sets), and the parsed job is read back
 * through the accessors the plugins use. Any outcome but a memory error, undefined behaviour, a
 * leak or a hang is fine: the parser's job is to refuse with a message, never to crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tessera/config.h"
#include "tessera/status.h"

#define MAX_SETS 16

/* The accessors a plugin and the run call on an accepted job. */
static void read_back(const tsr_config *cfg) {
  char where[2048];
  for (int i = 0; i < tsr_config_mesh_ndim(cfg); i++) {
    const char *dim = tsr_config_mesh_dim(cfg, i);
    (void)tsr_config_mesh_size(cfg, dim);
    (void)tsr_config_mesh_index(cfg, dim);
  }
  (void)tsr_config_mesh_world(cfg);
  for (int i = 0; i < tsr_config_schema_count(); i++) {
    const tsr_config_key *k = tsr_config_schema_at(i);
    (void)tsr_config_where(cfg, k->section, k->spec.name, where, sizeof where);
  }
  for (int i = 0; i < cfg->plugins.nload; i++) {
    const tsr_config_section *s = tsr_config_strategy(cfg, cfg->plugins.load[i]);
    (void)s;
    (void)tsr_config_loads_plugin(cfg, cfg->plugins.load[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* the job file ends at a line "%%"; the overrides follow */
  size_t file_len = size;
  for (size_t i = 0; i + 3 <= size; i++)
    if ((i == 0 || data[i - 1] == '\n') && data[i] == '%' && data[i + 1] == '%' &&
        (i + 2 == size || data[i + 2] == '\n')) {
      file_len = i;
      break;
    }
  const char *path = fuzz_file(data, file_len, ".ini");
  if (!path) return 0;
  tsr_config *cfg = NULL;
  if (tsr_config_load(path, &cfg) != TSR_OK) return 0;
  size_t pos = file_len + 3;
  for (int n = 0; n < MAX_SETS && pos < size; n++) {
    size_t end = pos;
    while (end < size && data[end] != '\n') end++;
    char *set = malloc(end - pos + 1);
    if (!set) break;
    memcpy(set, data + pos, end - pos);
    set[end - pos] = '\0';
    tsr_status st = tsr_config_set(cfg, set);
    free(set);
    pos = end + 1;
    if (st != TSR_OK) break;
  }
  if (tsr_config_check_sets(cfg) == TSR_OK) read_back(cfg);
  tsr_config_free(cfg);
  tsr_clear_error();
  return 0;
}
