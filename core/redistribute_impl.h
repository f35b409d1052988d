/* Private: the redistribute planner's moves between a mesh and one of its slices. */
#ifndef TESSERA_REDISTRIBUTE_IMPL_H
#define TESSERA_REDISTRIBUTE_IMPL_H

#include "tessera/dtensor.h"

/* k when `child` is the slice of `parent` at coordinate *coord of dim k (what tsr_mesh_unbind
 * makes), else -1. */
int tsr_mesh_slice_of(const tsr_mesh_t *parent, const tsr_mesh_t *child, int *coord);

/* x on a parent mesh to its slice `child` (dim k removed) with `placements` (child's dims). */
tsr_status tsr_redistribute_to_slice(tsr_rank_t *r, const tsr_dtensor *x, const tsr_mesh_t *child,
                                     int k, const tsr_placement *placements, tsr_dtensor **out);
/* x on a slice (coordinate `coord` of dim k) to the parent with `placements` (parent's dims). */
tsr_status tsr_redistribute_from_slice(tsr_rank_t *r, const tsr_dtensor *x,
                                       const tsr_mesh_t *parent, int k, int coord,
                                       const tsr_placement *placements, tsr_dtensor **out);

#endif
