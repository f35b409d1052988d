/* Core-only tensor constructors (tensor.c, dtensor.c). */
#ifndef TSR_TENSOR_IMPL_H
#define TSR_TENSOR_IMPL_H

#include "tessera/dtensor.h"
#include "tessera/tensor.h"

/* As tsr_tensor_new, without zeroing the storage: for an output a kernel then writes whole, where
 * the zeroing would be a second pass over memory. Never for a buffer something adds into. */
tsr_status tsr_tensor_new_uninit(tsr_allocator *alloc, tsr_dtype dt, int ndim, const int64_t *shape,
                                 tsr_tensor **out);

/* As tsr_dtensor_zeros, with the local tensor not zeroed (tsr_tensor_new_uninit). */
tsr_status tsr_dtensor_uninit(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_dtype dt, int ndim,
                              const int64_t *shape, const tsr_placement *placements,
                              tsr_dtensor **out);

/* Whether another view holds t's storage too: a buffer someone else may still read, so that a
 * sum into it must go to a new buffer instead (copy on write). */
bool tsr_tensor_is_shared(const tsr_tensor *t);

/* A DTensor of global `shape` and placements `p` over x's local storage, reshaped to the local
 * shape those give (no copy; a copy when x's local is not contiguous). The element count of
 * the local tensors must agree (TSR_EINTERNAL otherwise). Writes through either are seen by
 * both: for values nobody writes again and for gradients summed copy-on-write. */
tsr_status tsr_dtensor_alias(tsr_rank_t *r, const tsr_dtensor *x, int ndim, const int64_t *shape,
                             const tsr_placement *p, tsr_dtensor **out);

#endif
