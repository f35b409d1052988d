/* DTensors: placements, local shapes, distribute / from_local / full_tensor. The redistribute
 * planner is in redistribute.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_impl.h"
#include "tessera/dtensor.h"

bool tsr_placement_equal(tsr_placement a, tsr_placement b) {
  if (a.kind != b.kind) return false;
  if (a.kind == TSR_SHARD) return a.dim == b.dim;
  if (a.kind == TSR_PARTIAL) return a.op == b.op;
  return true;
}

const char *tsr_placement_str(tsr_placement p, char *buf, size_t len) {
  switch (p.kind) {
    case TSR_REPLICATE:
      snprintf(buf, len, "R");
      break;
    case TSR_SHARD:
      snprintf(buf, len, "S(%d)", p.dim);
      break;
    case TSR_PARTIAL:
      snprintf(buf, len, "P(%s)", tsr_reduce_op_name(p.op));
      break;
    default:
      snprintf(buf, len, "?");
      break;
  }
  return buf;
}

tsr_status tsr_dtensor_check_placements(const tsr_mesh_t *mesh, const tsr_placement *placements,
                                        int ndim) {
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    tsr_placement p = placements[i];
    const char *dim = tsr_mesh_dim_name(mesh, i);
    if (p.kind == TSR_SHARD && (p.dim < 0 || p.dim >= ndim))
      return TSR_ERROR(TSR_EINVAL, "placement Shard(%d) on mesh dim '%s' for a rank-%d tensor",
                       p.dim, dim, ndim);
    if (p.kind == TSR_PARTIAL && (p.op < TSR_REDUCE_SUM || p.op > TSR_REDUCE_MAX))
      return TSR_ERROR(TSR_EINVAL, "placement Partial with invalid op %d on mesh dim '%s'",
                       (int)p.op, dim);
    if (p.kind != TSR_SHARD && p.kind != TSR_REPLICATE && p.kind != TSR_PARTIAL)
      return TSR_ERROR(TSR_EINVAL, "invalid placement kind %d on mesh dim '%s'", (int)p.kind, dim);
  }
  return TSR_OK;
}

bool tsr_dtensor_local_shape(const tsr_mesh_t *mesh, const tsr_placement *placements, int ndim,
                             const int64_t *shape, int rank, int64_t *local_shape,
                             int64_t *local_start) {
  int coords[TSR_MAX_MESH_DIMS];
  if (!tsr_mesh_coords(mesh, rank, coords)) return false;
  for (int d = 0; d < ndim; d++) {
    local_shape[d] = shape[d];
    if (local_start) local_start[d] = 0;
  }
  /* Nested split, outermost mesh dim first: each sharding mesh dim splits what the previous
   * ones left. */
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    if (placements[i].kind != TSR_SHARD) continue;
    int d = placements[i].dim, n = tsr_mesh_dim_size(mesh, i);
    int64_t len = local_shape[d];
    if (local_start) local_start[d] += tsr_chunk_start(len, n, coords[i]);
    local_shape[d] = tsr_chunk_size(len, n, coords[i]);
  }
  return true;
}

static tsr_status dtensor_alloc(const tsr_mesh_t *mesh, int ndim, const int64_t *shape,
                                tsr_dtype dt, const tsr_placement *placements, tsr_dtensor **out) {
  *out = NULL;
  if (ndim < 0 || ndim > TSR_MAX_DIMS)
    return TSR_ERROR(TSR_EINVAL, "DTensor rank %d out of range 0..%d", ndim, TSR_MAX_DIMS);
  TSR_CHECK(tsr_dtensor_check_placements(mesh, placements, ndim));
  tsr_dtensor *x = calloc(1, sizeof *x);
  if (!x) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a DTensor");
  x->mesh = mesh;
  x->ndim = ndim;
  x->dtype = dt;
  for (int d = 0; d < ndim; d++) x->shape[d] = shape[d];
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) x->placements[i] = placements[i];
  *out = x;
  return TSR_OK;
}

void tsr_dtensor_free(tsr_dtensor *x) {
  if (!x) return;
  tsr_tensor_free(x->local);
  free(x);
}

tsr_status tsr_dtensor_distribute(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_tensor *full,
                                  const tsr_placement *placements, tsr_dtensor **out) {
  tsr_dtensor *x = NULL;
  tsr_tensor *view = NULL, *next = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK(dtensor_alloc(mesh, full->ndim, full->shape, full->dtype, placements, &x));
  int64_t lshape[TSR_MAX_DIMS], lstart[TSR_MAX_DIMS];
  int coords[TSR_MAX_MESH_DIMS];
  int me = tsr_rank_id(r);
  if (!tsr_dtensor_local_shape(mesh, placements, full->ndim, full->shape, me, lshape, lstart)) {
    *out = x; /* not in the mesh: metadata only */
    return TSR_OK;
  }
  tsr_mesh_coords(mesh, me, coords);
  TSR_CHECK_GOTO(tsr_tensor_reshape(full, full->ndim, full->shape, &view), st);
  for (int d = 0; d < full->ndim; d++) {
    if (lshape[d] == full->shape[d]) continue;
    TSR_CHECK_GOTO(tsr_tensor_narrow(view, d, lstart[d], lshape[d], &next), st);
    tsr_tensor_free(view);
    view = next;
    next = NULL;
  }
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), full->dtype, full->ndim, lshape, &x->local),
                 st);
  TSR_CHECK_GOTO(tsr_tensor_copy(x->local, view), st);
  /* Partial(sum) holds the value once: on coordinate 0, zeros elsewhere. */
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++)
    if (placements[i].kind == TSR_PARTIAL && placements[i].op == TSR_REDUCE_SUM && coords[i] != 0)
      tsr_tensor_zero(x->local);
  tsr_tensor_free(view);
  *out = x;
  return TSR_OK;
cleanup:
  tsr_tensor_free(view);
  tsr_dtensor_free(x);
  *out = NULL;
  return st;
}

tsr_status tsr_dtensor_from_local(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_tensor *local,
                                  const int64_t *shape, const tsr_placement *placements,
                                  tsr_dtensor **out) {
  int64_t gshape[TSR_MAX_DIMS], want[TSR_MAX_DIMS];
  char a[128], b[128], c[128];
  for (int d = 0; d < local->ndim; d++) gshape[d] = shape ? shape[d] : local->shape[d];
  if (!shape) {
    for (int i = 0; i < tsr_mesh_ndim(mesh); i++)
      if (placements[i].kind == TSR_SHARD && placements[i].dim >= 0 &&
          placements[i].dim < local->ndim)
        gshape[placements[i].dim] *= tsr_mesh_dim_size(mesh, i);
  }
  TSR_CHECK(dtensor_alloc(mesh, local->ndim, gshape, local->dtype, placements, out));
  if (tsr_dtensor_local_shape(mesh, placements, local->ndim, gshape, tsr_rank_id(r), want, NULL)) {
    for (int d = 0; d < local->ndim; d++) {
      if (want[d] == local->shape[d]) continue;
      tsr_dtensor_free(*out);
      *out = NULL;
      return TSR_ERROR(TSR_EINVAL,
                       "from_local on rank %d: local shape %s does not match the shard %s of "
                       "global shape %s; pass the global shape when shards are uneven",
                       tsr_rank_id(r), tsr_shape_str(local->ndim, local->shape, a, sizeof a),
                       tsr_shape_str(local->ndim, want, b, sizeof b),
                       tsr_shape_str(local->ndim, gshape, c, sizeof c));
    }
  }
  (*out)->local = local;
  return TSR_OK;
}

tsr_status tsr_dtensor_full_tensor(tsr_rank_t *r, const tsr_dtensor *x, tsr_tensor **out) {
  *out = NULL;
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(x->mesh); i++) rep[i] = tsr_replicate();
  tsr_dtensor *full = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(r, x, x->mesh, rep, &full));
  *out = full->local;
  full->local = NULL;
  tsr_dtensor_free(full);
  return TSR_OK;
}

static tsr_status dtensor_make(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_dtype dt, int ndim,
                               const int64_t *shape, const tsr_placement *placements, bool zero,
                               tsr_dtensor **out) {
  TSR_CHECK(dtensor_alloc(mesh, ndim, shape, dt, placements, out));
  int64_t lshape[TSR_MAX_DIMS];
  if (!tsr_dtensor_local_shape(mesh, placements, ndim, shape, tsr_rank_id(r), lshape, NULL))
    return TSR_OK;
  tsr_status st =
      zero ? tsr_tensor_new(tsr_rank_allocator(r), dt, ndim, lshape, &(*out)->local)
           : tsr_tensor_new_uninit(tsr_rank_allocator(r), dt, ndim, lshape, &(*out)->local);
  if (st != TSR_OK) {
    tsr_dtensor_free(*out);
    *out = NULL;
  }
  return st;
}

tsr_status tsr_dtensor_zeros(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_dtype dt, int ndim,
                             const int64_t *shape, const tsr_placement *placements,
                             tsr_dtensor **out) {
  return dtensor_make(r, mesh, dt, ndim, shape, placements, true, out);
}

tsr_status tsr_dtensor_uninit(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_dtype dt, int ndim,
                              const int64_t *shape, const tsr_placement *placements,
                              tsr_dtensor **out) {
  return dtensor_make(r, mesh, dt, ndim, shape, placements, false, out);
}

tsr_status tsr_dtensor_alias(tsr_rank_t *r, const tsr_dtensor *x, int ndim, const int64_t *shape,
                             const tsr_placement *p, tsr_dtensor **out) {
  TSR_CHECK(dtensor_alloc(x->mesh, ndim, shape, x->dtype, p, out));
  int64_t lshape[TSR_MAX_DIMS], n = 1;
  if (!x->local || !tsr_dtensor_local_shape(x->mesh, p, ndim, shape, tsr_rank_id(r), lshape, NULL))
    return TSR_OK;
  for (int d = 0; d < ndim; d++) n *= lshape[d];
  tsr_status st = TSR_OK;
  if (n != tsr_tensor_numel(x->local)) {
    char a[128], b[128];
    st = TSR_ERROR(TSR_EINTERNAL, "alias of a local %s as %s: element counts differ",
                   tsr_shape_str(x->local->ndim, x->local->shape, a, sizeof a),
                   tsr_shape_str(ndim, lshape, b, sizeof b));
  } else if (tsr_tensor_is_contiguous(x->local)) {
    st = tsr_tensor_reshape(x->local, ndim, lshape, &(*out)->local);
  } else {
    st = tsr_tensor_new_uninit(tsr_rank_allocator(r), x->dtype, ndim, lshape, &(*out)->local);
    tsr_tensor *v = NULL;
    if (st == TSR_OK) st = tsr_tensor_reshape((*out)->local, x->local->ndim, x->local->shape, &v);
    if (st == TSR_OK) st = tsr_tensor_copy(v, x->local);
    tsr_tensor_free(v);
  }
  if (st != TSR_OK) {
    tsr_dtensor_free(*out);
    *out = NULL;
  }
  return st;
}

tsr_status tsr_dtensor_clone(tsr_rank_t *r, const tsr_dtensor *x, tsr_dtensor **out) {
  TSR_CHECK(dtensor_alloc(x->mesh, x->ndim, x->shape, x->dtype, x->placements, out));
  if (!x->local) return TSR_OK;
  tsr_status st =
      tsr_tensor_new(tsr_rank_allocator(r), x->dtype, x->ndim, x->local->shape, &(*out)->local);
  if (st == TSR_OK) st = tsr_tensor_copy((*out)->local, x->local);
  if (st != TSR_OK) {
    tsr_dtensor_free(*out);
    *out = NULL;
  }
  return st;
}
