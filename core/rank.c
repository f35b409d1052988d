/* The per-rank context. */
#include <stdlib.h>

#include "comm_impl.h"
#include "kernel_table.h"
#include "tessera/rank.h"

struct tsr_rank_t {
  tsr_comm_t *comm;               /* borrowed */
  const tsr_registry_t *registry; /* borrowed, may be NULL */
  tsr_allocator alloc;            /* this rank's memory, counted */
  const tsr_kernel_table *device; /* the table whose allocator_init made alloc */
  tsr_dtype matmul_dtype;         /* TSR_F32 or TSR_BF16 */
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

void tsr_rank_free(tsr_rank_t *r) {
  if (!r) return;
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
