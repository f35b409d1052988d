/* Moves between a mesh and one of its slices (a pipeline stage from tsr_mesh_unbind): the slice
 * is the parent's ranks at coordinate c of one dim k, with k removed. Parent to slice keeps the
 * slice ranks' data once dim k is Replicate; slice to parent broadcasts along k from coordinate
 * c. Each is the other's adjoint, so pipeline inputs and outputs differentiate through them. */
#include <stdlib.h>
#include <string.h>

#include "redistribute_impl.h"

int tsr_mesh_slice_of(const tsr_mesh_t *parent, const tsr_mesh_t *child, int *coord) {
  int nd = tsr_mesh_ndim(parent);
  if (tsr_mesh_ndim(child) != nd - 1) return -1;
  for (int k = 0; k < nd; k++) {
    bool same = true;
    for (int i = 0, j = 0; i < nd && same; i++) {
      if (i == k) continue;
      same = tsr_mesh_dim_size(parent, i) == tsr_mesh_dim_size(child, j) &&
             strcmp(tsr_mesh_dim_name(parent, i), tsr_mesh_dim_name(child, j)) == 0;
      j++;
    }
    if (!same) continue;
    int pc[TSR_MAX_MESH_DIMS], cc[TSR_MAX_MESH_DIMS];
    if (!tsr_mesh_coords(parent, tsr_mesh_ranks(child)[0], pc)) continue;
    for (int n = 0; n < tsr_mesh_nranks(child) && same; n++) {
      tsr_mesh_coords(child, tsr_mesh_ranks(child)[n], cc);
      for (int i = 0, j = 0; i < nd; i++) pc[i] = i == k ? pc[k] : cc[j++];
      same = tsr_mesh_rank_at(parent, pc) == tsr_mesh_ranks(child)[n];
    }
    if (same) {
      *coord = pc[k];
      return k;
    }
  }
  return -1;
}

/* Placements on the parent for `child_p` on the slice, with `on_k` on dim k. */
static void widen(const tsr_placement *child_p, int nd, int k, tsr_placement on_k,
                  tsr_placement *out) {
  for (int i = 0, j = 0; i < nd; i++) out[i] = i == k ? on_k : child_p[j++];
}

tsr_status tsr_redistribute_to_slice(tsr_rank_t *r, const tsr_dtensor *x, const tsr_mesh_t *child,
                                     int k, const tsr_placement *placements, tsr_dtensor **out) {
  tsr_placement pp[TSR_MAX_MESH_DIMS];
  widen(placements, tsr_mesh_ndim(x->mesh), k, tsr_replicate(), pp);
  tsr_dtensor *y = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(r, x, x->mesh, pp, &y));
  y->mesh = child;
  for (int i = 0; i < tsr_mesh_ndim(child); i++) y->placements[i] = placements[i];
  if (!tsr_mesh_contains(child, tsr_rank_id(r))) {
    tsr_tensor_free(y->local);
    y->local = NULL;
  }
  *out = y;
  return TSR_OK;
}

tsr_status tsr_redistribute_from_slice(tsr_rank_t *r, const tsr_dtensor *x,
                                       const tsr_mesh_t *parent, int k, int coord,
                                       const tsr_placement *placements, tsr_dtensor **out) {
  *out = NULL;
  int nd = tsr_mesh_ndim(parent);
  tsr_placement cp[TSR_MAX_MESH_DIMS], wide[TSR_MAX_MESH_DIMS];
  for (int i = 0, j = 0; i < nd; i++)
    if (i != k) cp[j++] = placements[i];
  tsr_dtensor *y = NULL, *z = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK(tsr_dtensor_redistribute(r, x, x->mesh, cp, &y));
  widen(cp, nd, k, tsr_replicate(), wide);
  TSR_CHECK_GOTO(tsr_dtensor_zeros(r, parent, x->dtype, x->ndim, x->shape, wide, &z), st);
  if (z->local) {
    if (y->local) TSR_CHECK_GOTO(tsr_tensor_copy(z->local, y->local), st);
    tsr_group_t *g;
    TSR_CHECK_GOTO(tsr_mesh_group(parent, tsr_rank_comm(r), 1u << k, &g), st);
    TSR_CHECK_GOTO(tsr_comm_broadcast(g, tsr_tensor_data(z->local),
                                      (size_t)tsr_tensor_numel(z->local), x->dtype, coord),
                   st);
  }
  st = tsr_dtensor_redistribute(r, z, parent, placements, out);
cleanup:
  tsr_dtensor_free(y);
  tsr_dtensor_free(z);
  return st;
}
