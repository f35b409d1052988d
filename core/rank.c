/* The per-rank context. */
#include <stdlib.h>

#include "tessera/rank.h"

struct tsr_rank_t {
  tsr_comm_t *comm;               /* borrowed */
  const tsr_registry_t *registry; /* borrowed, may be NULL */
  tsr_allocator alloc;            /* this rank's memory, counted */
};

tsr_status tsr_rank_new(tsr_comm_t *comm, const tsr_registry_t *registry, tsr_rank_t **out) {
  *out = NULL;
  if (!comm) return TSR_ERROR(TSR_EINVAL, "a rank context needs a communicator");
  tsr_rank_t *r = calloc(1, sizeof *r);
  if (!r) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a rank context");
  r->comm = comm;
  r->registry = registry;
  tsr_allocator_init_cpu(&r->alloc);
  *out = r;
  return TSR_OK;
}

void tsr_rank_free(tsr_rank_t *r) {
  free(r);
}

int tsr_rank_id(const tsr_rank_t *r) {
  return tsr_comm_rank(r->comm);
}
int tsr_rank_world(const tsr_rank_t *r) {
  return tsr_comm_world(r->comm);
}
tsr_comm_t *tsr_rank_comm(tsr_rank_t *r) {
  return r->comm;
}
const tsr_registry_t *tsr_rank_registry(const tsr_rank_t *r) {
  return r->registry;
}
tsr_allocator *tsr_rank_allocator(tsr_rank_t *r) {
  return &r->alloc;
}
