/* Named N-D device meshes.
 *
 * A mesh arranges a list of global ranks row-major over named dims, outermost first, as
 * init_device_mesh(device, (dp, tp, pp), mesh_dim_names=[...]). A dim of size 1 behaves as if it
 * were absent: groups along it are one rank, placements on it move nothing, and name checks
 * ignore it. `ulysess_cp` is accepted everywhere as another spelling of `ulysses_cp`.
 *
 * Meshes are immutable once made and may be shared by every rank of a process.
 */
#ifndef TESSERA_MESH_H
#define TESSERA_MESH_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/comm.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_MAX_MESH_DIMS 8
#define TSR_MAX_DIM_NAME  32

typedef struct tsr_mesh_t tsr_mesh_t;

/* The mesh over global ranks 0 .. world-1. `names` are unique, non-empty, at most
 * TSR_MAX_DIM_NAME - 1 characters; the product of `shape` must equal `world`. */
tsr_status tsr_mesh_init(int world, int ndim, const int *shape, const char *const *names,
                         tsr_mesh_t **out);
/* The mesh over an explicit list of global ranks (row-major), e.g. one pipeline stage. */
tsr_status tsr_mesh_init_ranks(int nranks, const int *ranks, int ndim, const int *shape,
                               const char *const *names, tsr_mesh_t **out);
void tsr_mesh_free(tsr_mesh_t *m);

int tsr_mesh_ndim(const tsr_mesh_t *m);
int tsr_mesh_dim_size(const tsr_mesh_t *m, int dim);
const char *tsr_mesh_dim_name(const tsr_mesh_t *m, int dim); /* canonical spelling */
int tsr_mesh_nranks(const tsr_mesh_t *m);
const int *tsr_mesh_ranks(const tsr_mesh_t *m); /* (nranks) global ranks, row-major */
/* Index of the dim called `name` (alias-aware), or -1. */
int tsr_mesh_find_dim(const tsr_mesh_t *m, const char *name);
/* Size of the dim called `name`, 1 when the mesh has no such dim. */
int tsr_mesh_size_of(const tsr_mesh_t *m, const char *name);
/* Name of the dim that tsr_mesh_unbind removed to make this mesh, or NULL. */
const char *tsr_mesh_unbound_dim(const tsr_mesh_t *m);
/* Canonical spelling of a dim name: "ulysess_cp" -> "ulysses_cp", others unchanged. */
const char *tsr_mesh_canonical_name(const char *name);

/* Mesh coordinates of `rank` (ndim entries). False when the rank is not in the mesh. */
bool tsr_mesh_coords(const tsr_mesh_t *m, int rank, int *coords);
/* Global rank at `coords`. */
int tsr_mesh_rank_at(const tsr_mesh_t *m, const int *coords);
bool tsr_mesh_contains(const tsr_mesh_t *m, int rank);
/* Same dims (names and sizes) in the same order; ranks may differ. */
bool tsr_mesh_same_shape(const tsr_mesh_t *a, const tsr_mesh_t *b);
bool tsr_mesh_equal(const tsr_mesh_t *a, const tsr_mesh_t *b); /* same shape and ranks */

/* One mesh per coordinate of dim `name`, each without that dim, in coordinate order. A mesh
 * without the dim yields one copy of itself. The caller frees every mesh and the array. */
tsr_status tsr_mesh_unbind(const tsr_mesh_t *m, const char *name, tsr_mesh_t ***out, int *n);

/* TSR_EINVAL naming the first dim of size > 1 whose name is not in `allowed` (NULL-terminated,
 * alias-aware) and listing the allowed names. */
tsr_status tsr_mesh_check_dim_names(const tsr_mesh_t *m, const char *const *allowed);

/* The members of `rank`'s group over the dims set in `dim_mask` (bit i = dim i): the ranks that
 * share every coordinate outside the mask, ordered row-major over the masked dims (the dims
 * flattened). `ranks` must hold nranks entries; `*n` gets the group size, `*self` the caller's
 * index. */
tsr_status tsr_mesh_group_ranks(const tsr_mesh_t *m, int rank, uint32_t dim_mask, int *ranks,
                                int *n, int *self);
/* The communicator group for tsr_mesh_group_ranks(m, tsr_comm_rank(c), dim_mask), labelled with
 * the masked dims' names joined by '+' in mesh order ("dp+tp"). */
tsr_status tsr_mesh_group(const tsr_mesh_t *m, tsr_comm_t *c, uint32_t dim_mask, tsr_group_t **out);

/* "dp=2 x tp=3 over ranks [0..5]" into buf. Returns buf. */
const char *tsr_mesh_str(const tsr_mesh_t *m, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
