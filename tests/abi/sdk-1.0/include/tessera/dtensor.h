/* Distributed tensors and redistribute.
 *
 * A DTensor is a global shape, a mesh and one placement per mesh dim, plus this rank's local
 * tensor. Placements:
 *   Shard(d)     the global tensor is split along tensor dim d over the mesh dim, as torch.chunk
 *                splits it (tsr_chunk_size); several mesh dims sharding one tensor dim split it
 *                nested, outermost mesh dim first, as PyTorch DTensor does;
 *   Replicate    every rank along the mesh dim holds the same values;
 *   Partial(op)  the global value is op (sum, avg, max) over the ranks along the mesh dim.
 * A rank outside the DTensor's mesh (another pipeline stage) holds no local tensor (NULL).
 *
 * Redistribute changes placements, on one mesh or between two meshes of the same shape over
 * different ranks (pipeline stages: each rank sends its local tensor to the rank at the same
 * coordinates of the other mesh; the two meshes share no rank). Each change has an adjoint, used by
 * autograd: the gradient flows back with the source placements, Partial replaced by Replicate (as
 * DTensor does), which turns an all-gather into a reduce-scatter, an all-to-all into its inverse, a
 * send into a recv and a local chunk into a gather.
 */
#ifndef TESSERA_DTENSOR_H
#define TESSERA_DTENSOR_H

#include <stdbool.h>

#include "tessera/comm.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsr_placement_kind {
  TSR_REPLICATE = 0,
  TSR_SHARD = 1,
  TSR_PARTIAL = 2,
} tsr_placement_kind;

typedef struct tsr_placement {
  tsr_placement_kind kind;
  int dim;          /* TSR_SHARD: the tensor dim split over the mesh dim */
  tsr_reduce_op op; /* TSR_PARTIAL: how the pending values combine */
} tsr_placement;

static inline tsr_placement tsr_replicate(void) {
  tsr_placement p = {TSR_REPLICATE, 0, TSR_REDUCE_SUM};
  return p;
}
static inline tsr_placement tsr_shard(int dim) {
  tsr_placement p = {TSR_SHARD, dim, TSR_REDUCE_SUM};
  return p;
}
static inline tsr_placement tsr_partial(tsr_reduce_op op) {
  tsr_placement p = {TSR_PARTIAL, 0, op};
  return p;
}
bool tsr_placement_equal(tsr_placement a, tsr_placement b);
/* "S(1)", "R", "P(sum)" into buf. Returns buf. */
const char *tsr_placement_str(tsr_placement p, char *buf, size_t len);

typedef struct tsr_dtensor {
  const tsr_mesh_t *mesh;      /* borrowed; outlives the DTensor */
  int ndim;                    /* global rank of the tensor */
  int64_t shape[TSR_MAX_DIMS]; /* (ndim) global shape */
  tsr_dtype dtype;
  tsr_placement placements[TSR_MAX_MESH_DIMS]; /* (mesh ndim) */
  tsr_tensor *local;                           /* owned; NULL when this rank is not in mesh */
} tsr_dtensor;

/* Shape of the local tensor that `rank` holds for the given global shape and placements (the
 * nested torch.chunk split). False when the rank is not in the mesh. */
bool tsr_dtensor_local_shape(const tsr_mesh_t *mesh, const tsr_placement *placements, int ndim,
                             const int64_t *shape, int rank, int64_t *local_shape,
                             int64_t *local_start);

/* Checks placements against the mesh and shape: Shard dims in range, Partial ops valid. */
tsr_status tsr_dtensor_check_placements(const tsr_mesh_t *mesh, const tsr_placement *placements,
                                        int ndim);

/* This rank's DTensor for a full tensor that every rank of the mesh holds identically: Shard
 * takes the local chunk, Replicate copies, Partial(sum) puts the value on coordinate 0 and
 * zeros elsewhere, Partial(avg|max) copies. No communication. */
tsr_status tsr_dtensor_distribute(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_tensor *full,
                                  const tsr_placement *placements, tsr_dtensor **out);
/* Wraps `local` (ownership moves to the DTensor) with the given global shape. `shape` may be
 * NULL when every Shard divides evenly: it is then local shape times the shard counts. */
tsr_status tsr_dtensor_from_local(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_tensor *local,
                                  const int64_t *shape, const tsr_placement *placements,
                                  tsr_dtensor **out);
/* The full global tensor on every rank of x's mesh (collective over the mesh). */
tsr_status tsr_dtensor_full_tensor(tsr_rank_t *r, const tsr_dtensor *x, tsr_tensor **out);
void tsr_dtensor_free(tsr_dtensor *x);
/* A DTensor of zeros with the given global shape and placements (local from the rank's
 * allocator; no local off the mesh). */
tsr_status tsr_dtensor_zeros(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_dtype dt, int ndim,
                             const int64_t *shape, const tsr_placement *placements,
                             tsr_dtensor **out);
/* A deep copy of x (its local cloned). */
tsr_status tsr_dtensor_clone(tsr_rank_t *r, const tsr_dtensor *x, tsr_dtensor **out);

/* Collective over the ranks of x's mesh and `mesh`. `mesh` is x's mesh, or one of the same
 * shape over disjoint ranks (a cross-mesh move between pipeline stages). Every rank of both
 * meshes calls it with x's metadata (local NULL off x's mesh); ranks of neither mesh may call it
 * and get a DTensor with no local. */
tsr_status tsr_dtensor_redistribute(tsr_rank_t *r, const tsr_dtensor *x, const tsr_mesh_t *mesh,
                                    const tsr_placement *placements, tsr_dtensor **out);
/* As redistribute, with the target given per dim name. Names `mesh` lacks are ignored; dims of
 * `mesh` not named keep x's placement on the dim of that name (Replicate if x has none). */
tsr_status tsr_dtensor_redistribute_by_dict(tsr_rank_t *r, const tsr_dtensor *x,
                                            const tsr_mesh_t *mesh, int n, const char *const *names,
                                            const tsr_placement *placements, tsr_dtensor **out);
/* The adjoint of redistributing from (src_mesh, src_placements): `grad` is the gradient of the
 * redistribute's output; the result has src_mesh and src_placements with Partial replaced by
 * Replicate. */
tsr_status tsr_dtensor_redistribute_adjoint(tsr_rank_t *r, const tsr_dtensor *grad,
                                            const tsr_mesh_t *src_mesh,
                                            const tsr_placement *src_placements, tsr_dtensor **out);

#ifdef __cplusplus
}
#endif
#endif
