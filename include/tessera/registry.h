/* Core registries that strategy plugins add to when they load.
 *
 * A registry belongs to a job: plugins register into it before any rank starts, and ranks read it
 * (through tsr_rank_registry) while they run. The core consults it; it knows no plugin by name.
 */
#ifndef TESSERA_REGISTRY_H
#define TESSERA_REGISTRY_H

#include <stdbool.h>

#include "tessera/dtensor.h"
#include "tessera/rank.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

tsr_status tsr_registry_new(tsr_registry_t **out);
void tsr_registry_free(tsr_registry_t *reg);

/* ---- Redistribute transitions ----
 * A transition replaces the core's step for one mesh dim changing from `src` to `dst`. The
 * planner asks every registered transition, newest first, before using its own step. */
typedef struct tsr_redistribute_rule {
  const char *name;     /* for messages and `tessera plugins`, e.g. "cp_ring.shard_roll" */
  const char *mesh_dim; /* the mesh dim name it applies to; NULL for any */
  /* True when this rule handles x's mesh dim `dim` going from src to dst. */
  bool (*match)(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst, void *ctx);
  /* Produces the DTensor with placement dst on `dim` and x's placements elsewhere. */
  tsr_status (*apply)(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                      tsr_dtensor **out, void *ctx);
  void *ctx; /* passed back to match and apply */
} tsr_redistribute_rule;

/* Copies `rule` into the registry. TSR_EINVAL if a mandatory member is missing. */
tsr_status tsr_registry_add_redistribute(tsr_registry_t *reg, const tsr_redistribute_rule *rule);
int tsr_registry_redistribute_count(const tsr_registry_t *reg);
const tsr_redistribute_rule *tsr_registry_redistribute_at(const tsr_registry_t *reg, int i);

#ifdef __cplusplus
}
#endif
#endif
