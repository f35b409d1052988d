/* The per-rank context. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "kernel_table.h"
#include "registry_impl.h"
#include "tessera/breadcrumb.h"
#include "tessera/rank.h"

struct tsr_rank_t {
  tsr_comm_t *comm;               /* borrowed */
  const tsr_registry_t *registry; /* borrowed, may be NULL */
  tsr_allocator alloc;            /* this rank's memory, counted */
  const tsr_kernel_table *device; /* the table whose allocator_init made alloc */
  tsr_dtype matmul_dtype;         /* TSR_F32 or TSR_BF16 */
  /* (nstates) plugins' per-rank states by registry index (tsr_rank_state), NULL until made */
  void **states;
  bool *made;
  int nstates;
};

tsr_status tsr_rank_new(tsr_comm_t *comm, const tsr_registry_t *registry, tsr_rank_t **out) {
  *out = NULL;
  if (!comm) return TSR_ERROR(TSR_EINVAL, "a rank context needs a communicator");
  tsr_rank_t *r = calloc(1, sizeof *r);
  if (!r) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a rank context");
  r->comm = comm;
  r->registry = registry;
  tsr_allocator_init_cpu(&r->alloc);
  r->device = tsr_kernel_table_cpu();
  r->matmul_dtype = TSR_F32;
  /* a rank made on a thread of its own (mpi, nccl: the process's) names that thread's crashes */
  tsr_breadcrumb_here()->rank = tsr_comm_rank(comm);
  *out = r;
  return TSR_OK;
}

tsr_status tsr_rank_set_device(tsr_rank_t *r, tsr_device dev) {
  if (r->alloc.bytes_in_use)
    return TSR_ERROR(TSR_EINVAL,
                     "rank %d: set the device before making tensors (%zu bytes are in use)",
                     tsr_rank_id(r), r->alloc.bytes_in_use);
  const tsr_kernel_table *k = NULL;
  TSR_CHECK(tsr_kernel_table_for(dev, &k));
  tsr_allocator a;
  TSR_CHECK(k->allocator_init(&a, dev.index));
  tsr_comm_set_device_allocator(r->comm, NULL);
  r->device->allocator_release(&r->alloc);
  r->alloc = a;
  r->device = k;
  if (dev.kind != TSR_DEVICE_CPU) tsr_comm_set_device_allocator(r->comm, &r->alloc);
  return TSR_OK;
}

tsr_device tsr_rank_device(const tsr_rank_t *r) {
  return r->alloc.device;
}

tsr_status tsr_rank_set_matmul_dtype(tsr_rank_t *r, tsr_dtype dt) {
  if (dt != TSR_F32 && dt != TSR_BF16)
    return TSR_ERROR(TSR_EINVAL,
                     "rank %d: matrix products run in f32 or bf16 (with f32 accumulation), not %s",
                     tsr_rank_id(r), tsr_dtype_name(dt));
  r->matmul_dtype = dt;
  return TSR_OK;
}

tsr_dtype tsr_rank_matmul_dtype(const tsr_rank_t *r) {
  return r->matmul_dtype;
}

tsr_status tsr_rank_state(tsr_rank_t *r, const char *name, void **out) {
  *out = NULL;
  int n = tsr_registry_rank_state_count(r->registry), i = 0;
  while (i < n && strcmp(tsr_registry_rank_state_at(r->registry, i)->name, name)) i++;
  if (i == n)
    return TSR_ERROR(TSR_EINVAL,
                     "rank %d: no rank state '%s' is registered; register it with "
                     "tsr_registry_add_rank_state in register_rules",
                     tsr_rank_id(r), name ? name : "(null)");
  if (!r->states) {
    r->states = calloc((size_t)n, sizeof *r->states);
    r->made = calloc((size_t)n, sizeof *r->made);
    if (!r->states || !r->made) {
      free(r->states), free(r->made);
      r->states = NULL, r->made = NULL;
      return TSR_ERROR(TSR_ENOMEM, "rank %d: out of memory for plugin states", tsr_rank_id(r));
    }
    r->nstates = n;
  }
  if (!r->made[i]) {
    const tsr_rank_state_spec *spec = tsr_registry_rank_state_at(r->registry, i);
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(tsr_registry_rank_state_owner(r->registry, i),
                                                      "rank state", spec->name, "setup");
    tsr_status st = spec->setup(r, spec->ctx, &r->states[i]);
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK)
      return tsr_error_prefix(st, "rank %d: setup of rank state '%s'", tsr_rank_id(r), name);
    r->made[i] = true;
  }
  *out = r->states[i];
  return TSR_OK;
}

void tsr_rank_free(tsr_rank_t *r) {
  if (!r) return;
  /* plugins' states hold tensors of this rank's allocator: newest registration first */
  for (int i = r->nstates - 1; i >= 0; i--) {
    const tsr_rank_state_spec *spec = tsr_registry_rank_state_at(r->registry, i);
    if (!r->made[i] || !spec->teardown) continue;
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(tsr_registry_rank_state_owner(r->registry, i),
                                                      "rank state", spec->name, "teardown");
    spec->teardown(r, r->states[i], spec->ctx);
    tsr_breadcrumb_leave(&crumb);
  }
  free(r->states);
  free(r->made);
  /* the backend's device scratch is this allocator's: it goes first */
  tsr_comm_set_device_allocator(r->comm, NULL);
  r->device->allocator_release(&r->alloc);
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
