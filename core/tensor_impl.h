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

#endif
