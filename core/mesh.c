/* Named N-D meshes over lists of global ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/mesh.h"

struct tsr_mesh_t {
  int ndim;
  int shape[TSR_MAX_MESH_DIMS];                    /* (ndim) */
  char names[TSR_MAX_MESH_DIMS][TSR_MAX_DIM_NAME]; /* (ndim) */
  char unbound[TSR_MAX_DIM_NAME];                  /* dim removed by unbind, "" if none */
  int nranks;
  int *ranks; /* (nranks) global rank at each row-major coordinate */
};

const char *tsr_mesh_canonical_name(const char *name) {
  /* Aliases are the owning plugins' (tsr_strategy.dim_aliases), settled when a job loads. */
  return name;
}

static tsr_status mesh_alloc(int nranks, int ndim, const int *shape, const char *const *names,
                             tsr_mesh_t **out) {
  *out = NULL;
  if (ndim < 0 || ndim > TSR_MAX_MESH_DIMS)
    return TSR_ERROR(TSR_EINVAL, "mesh has %d dims; at most %d are supported", ndim,
                     TSR_MAX_MESH_DIMS);
  long long product = 1;
  char shape_buf[128] = "";
  size_t at = 0;
  for (int i = 0; i < ndim; i++) {
    const char *name = names[i];
    if (!name || !name[0]) return TSR_ERROR(TSR_EINVAL, "mesh dim %d has an empty name", i);
    if (strlen(name) >= TSR_MAX_DIM_NAME)
      return TSR_ERROR(TSR_EINVAL, "mesh dim name '%s' is longer than %d characters", name,
                       TSR_MAX_DIM_NAME - 1);
    if (shape[i] < 1)
      return TSR_ERROR(TSR_EINVAL, "mesh dim '%s' has size %d; sizes must be >= 1", name, shape[i]);
    for (int j = 0; j < i; j++)
      if (strcmp(tsr_mesh_canonical_name(names[j]), tsr_mesh_canonical_name(name)) == 0)
        return TSR_ERROR(TSR_EINVAL, "mesh dim '%s' appears twice (dims %d and %d)", name, j, i);
    product *= shape[i];
    at += (size_t)snprintf(shape_buf + at, sizeof shape_buf - at, "%s%s=%d", i ? " x " : "", name,
                           shape[i]);
    if (at >= sizeof shape_buf) at = sizeof shape_buf - 1;
  }
  if (product != nranks)
    return TSR_ERROR(TSR_EINVAL,
                     "mesh %s has %lld ranks but the world has %d: make the product of the mesh "
                     "shape equal the number of ranks",
                     ndim ? shape_buf : "()", product, nranks);
  tsr_mesh_t *m = calloc(1, sizeof *m);
  if (!m) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a mesh");
  m->ranks = malloc(sizeof(int) * (size_t)(nranks ? nranks : 1));
  if (!m->ranks) {
    free(m);
    return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a mesh of %d ranks", nranks);
  }
  m->ndim = ndim;
  m->nranks = nranks;
  for (int i = 0; i < ndim; i++) {
    m->shape[i] = shape[i];
    snprintf(m->names[i], TSR_MAX_DIM_NAME, "%s", tsr_mesh_canonical_name(names[i]));
  }
  *out = m;
  return TSR_OK;
}

tsr_status tsr_mesh_init(int world, int ndim, const int *shape, const char *const *names,
                         tsr_mesh_t **out) {
  if (world < 1) return TSR_ERROR(TSR_EINVAL, "world size %d; it must be >= 1", world);
  TSR_CHECK(mesh_alloc(world, ndim, shape, names, out));
  for (int r = 0; r < world; r++) (*out)->ranks[r] = r;
  return TSR_OK;
}

tsr_status tsr_mesh_init_ranks(int nranks, const int *ranks, int ndim, const int *shape,
                               const char *const *names, tsr_mesh_t **out) {
  if (nranks < 1) return TSR_ERROR(TSR_EINVAL, "a mesh needs at least one rank, got %d", nranks);
  for (int i = 0; i < nranks; i++)
    for (int j = 0; j < i; j++)
      if (ranks[i] == ranks[j])
        return TSR_ERROR(TSR_EINVAL, "rank %d appears twice in the mesh's rank list", ranks[i]);
  TSR_CHECK(mesh_alloc(nranks, ndim, shape, names, out));
  memcpy((*out)->ranks, ranks, sizeof(int) * (size_t)nranks);
  return TSR_OK;
}

void tsr_mesh_free(tsr_mesh_t *m) {
  if (!m) return;
  free(m->ranks);
  free(m);
}

int tsr_mesh_ndim(const tsr_mesh_t *m) {
  return m->ndim;
}
int tsr_mesh_dim_size(const tsr_mesh_t *m, int dim) {
  return m->shape[dim];
}
const char *tsr_mesh_dim_name(const tsr_mesh_t *m, int dim) {
  return m->names[dim];
}
int tsr_mesh_nranks(const tsr_mesh_t *m) {
  return m->nranks;
}
const int *tsr_mesh_ranks(const tsr_mesh_t *m) {
  return m->ranks;
}
const char *tsr_mesh_unbound_dim(const tsr_mesh_t *m) {
  return m->unbound[0] ? m->unbound : NULL;
}

int tsr_mesh_find_dim(const tsr_mesh_t *m, const char *name) {
  const char *canon = tsr_mesh_canonical_name(name);
  for (int i = 0; i < m->ndim; i++)
    if (strcmp(m->names[i], canon) == 0) return i;
  return -1;
}

int tsr_mesh_size_of(const tsr_mesh_t *m, const char *name) {
  int d = tsr_mesh_find_dim(m, name);
  return d < 0 ? 1 : m->shape[d];
}

static int index_of_rank(const tsr_mesh_t *m, int rank) {
  for (int i = 0; i < m->nranks; i++)
    if (m->ranks[i] == rank) return i;
  return -1;
}

bool tsr_mesh_contains(const tsr_mesh_t *m, int rank) {
  return index_of_rank(m, rank) >= 0;
}

bool tsr_mesh_coords(const tsr_mesh_t *m, int rank, int *coords) {
  int flat = index_of_rank(m, rank);
  if (flat < 0) return false;
  for (int d = m->ndim - 1; d >= 0; d--) {
    coords[d] = flat % m->shape[d];
    flat /= m->shape[d];
  }
  return true;
}

int tsr_mesh_rank_at(const tsr_mesh_t *m, const int *coords) {
  int flat = 0;
  for (int d = 0; d < m->ndim; d++) flat = flat * m->shape[d] + coords[d];
  return m->ranks[flat];
}

bool tsr_mesh_same_shape(const tsr_mesh_t *a, const tsr_mesh_t *b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d] || strcmp(a->names[d], b->names[d]) != 0) return false;
  return true;
}

bool tsr_mesh_equal(const tsr_mesh_t *a, const tsr_mesh_t *b) {
  return a == b || (tsr_mesh_same_shape(a, b) &&
                    memcmp(a->ranks, b->ranks, sizeof(int) * (size_t)a->nranks) == 0);
}

tsr_status tsr_mesh_unbind(const tsr_mesh_t *m, const char *name, tsr_mesh_t ***out, int *n) {
  *out = NULL;
  *n = 0;
  int dim = tsr_mesh_find_dim(m, name);
  int count = dim < 0 ? 1 : m->shape[dim];
  tsr_mesh_t **meshes = calloc((size_t)count, sizeof *meshes);
  if (!meshes) return TSR_ERROR(TSR_ENOMEM, "out of memory unbinding mesh dim '%s'", name);
  tsr_status st = TSR_OK;
  const char *sub_names[TSR_MAX_MESH_DIMS];
  int sub_shape[TSR_MAX_MESH_DIMS], sub_ndim = 0;
  for (int d = 0; d < m->ndim; d++) {
    if (d == dim) continue;
    sub_names[sub_ndim] = m->names[d];
    sub_shape[sub_ndim++] = m->shape[d];
  }
  int sub_n = m->nranks / count;
  int *ranks = malloc(sizeof(int) * (size_t)sub_n);
  if (!ranks) {
    free(meshes);
    return TSR_ERROR(TSR_ENOMEM, "out of memory unbinding mesh dim '%s'", name);
  }
  for (int c = 0; c < count; c++) {
    /* Walk the parent row-major and keep the ranks whose coordinate on `dim` is c: the order
     * of what remains is the row-major order of the sub-mesh. */
    int k = 0, coords[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < m->nranks; i++) {
      tsr_mesh_coords(m, m->ranks[i], coords);
      if (dim < 0 || coords[dim] == c) ranks[k++] = m->ranks[i];
    }
    TSR_CHECK_GOTO(tsr_mesh_init_ranks(sub_n, ranks, sub_ndim, sub_shape, sub_names, &meshes[c]),
                   st);
    snprintf(meshes[c]->unbound, TSR_MAX_DIM_NAME, "%s", dim < 0 ? m->unbound : m->names[dim]);
  }
  free(ranks);
  *out = meshes;
  *n = count;
  return TSR_OK;
cleanup:
  for (int c = 0; c < count; c++) tsr_mesh_free(meshes[c]);
  free(meshes);
  free(ranks);
  return st;
}

tsr_status tsr_mesh_check_dim_names(const tsr_mesh_t *m, const char *const *allowed) {
  for (int d = 0; d < m->ndim; d++) {
    if (m->shape[d] == 1) continue; /* a size-1 dim is as good as absent */
    bool ok = false;
    for (int i = 0; allowed[i] && !ok; i++)
      ok = strcmp(tsr_mesh_canonical_name(allowed[i]), m->names[d]) == 0;
    if (ok) continue;
    char list[256] = "";
    size_t at = 0;
    for (int i = 0; allowed[i] && at < sizeof list; i++)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", allowed[i]);
    return TSR_ERROR(TSR_EINVAL,
                     "mesh dim '%s' (size %d) is not supported here; supported dims: %s "
                     "(rename the dim or give it size 1)",
                     m->names[d], m->shape[d], list);
  }
  return TSR_OK;
}

tsr_status tsr_mesh_group_ranks(const tsr_mesh_t *m, int rank, uint32_t dim_mask, int *ranks,
                                int *n, int *self) {
  int mine[TSR_MAX_MESH_DIMS], coords[TSR_MAX_MESH_DIMS];
  if (!tsr_mesh_coords(m, rank, mine))
    return TSR_ERROR(TSR_EINVAL, "rank %d is not in the mesh it asked a group of", rank);
  if (dim_mask >> m->ndim)
    return TSR_ERROR(TSR_EINVAL, "group mask 0x%x names dims beyond the mesh's %d", dim_mask,
                     m->ndim);
  /* Row-major over the parent is row-major over the masked dims once the others are fixed. */
  int k = 0;
  *self = -1;
  for (int i = 0; i < m->nranks; i++) {
    tsr_mesh_coords(m, m->ranks[i], coords);
    bool same = true;
    for (int d = 0; d < m->ndim && same; d++)
      if (!(dim_mask & (1u << d))) same = coords[d] == mine[d];
    if (!same) continue;
    if (m->ranks[i] == rank) *self = k;
    ranks[k++] = m->ranks[i];
  }
  *n = k;
  return TSR_OK;
}

tsr_status tsr_mesh_group(const tsr_mesh_t *m, tsr_comm_t *c, uint32_t dim_mask,
                          tsr_group_t **out) {
  *out = NULL;
  int n, self;
  int *ranks = malloc(sizeof(int) * (size_t)m->nranks);
  if (!ranks) return TSR_ERROR(TSR_ENOMEM, "out of memory building a mesh group");
  tsr_status st = tsr_mesh_group_ranks(m, tsr_comm_rank(c), dim_mask, ranks, &n, &self);
  if (st == TSR_OK) {
    char label[TSR_MAX_MESH_DIMS * TSR_MAX_DIM_NAME] = "";
    size_t at = 0;
    for (int d = 0; d < m->ndim; d++)
      if (dim_mask & (1u << d))
        at += (size_t)snprintf(label + at, sizeof label - at, "%s%s", at ? "+" : "", m->names[d]);
    st = tsr_comm_group(c, n, ranks, at ? label : "self", out);
  }
  free(ranks);
  return st;
}

const char *tsr_mesh_str(const tsr_mesh_t *m, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int d = 0; d < m->ndim && at < len; d++)
    at += (size_t)snprintf(buf + at, len - at, "%s%s=%d", d ? " x " : "", m->names[d], m->shape[d]);
  if (m->ndim == 0 && at < len) at += (size_t)snprintf(buf + at, len - at, "()");
  if (at < len) {
    bool consecutive = true;
    for (int i = 1; i < m->nranks; i++) consecutive = consecutive && m->ranks[i] == m->ranks[0] + i;
    if (consecutive)
      snprintf(buf + at, len - at, " over ranks [%d..%d]", m->ranks[0],
               m->ranks[0] + m->nranks - 1);
    else
      for (int i = 0; i < m->nranks && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d%s", i ? "," : " over ranks [", m->ranks[i],
                               i == m->nranks - 1 ? "]" : "");
  }
  return buf;
}
