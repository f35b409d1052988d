/* Redistribute: every pair of placements on 1-, 2- and 3-D meshes, even and uneven shapes,
 * forward and adjoint, checked exactly against the full tensor (integer-valued data); cross-mesh
 * moves between pipeline stages; byte counts of each transition and of its adjoint; registered
 * transitions; errors.
 *
 * The check does not trust the code under test: every rank publishes its local tensor, and rank 0
 * rebuilds the global value from the pieces itself (shards placed at their offsets, replicas
 * compared, partial pieces combined) and compares it with the original.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/tessera.h"

#define MAX_RANKS 16
#define MAX_VECS  256

typedef struct harness {
  const tsr_mesh_t *mesh;     /* placements live on this mesh */
  const tsr_mesh_t *dst_mesh; /* target mesh of cross-mesh tests, else == mesh */
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  tsr_dtype dtype;
  int nvec;
  tsr_placement vecs[MAX_VECS][TSR_MAX_MESH_DIMS];
  bool adjoint;
  tsr_tensor *slots[MAX_RANKS]; /* each rank's published local */
  int checked;
  int failures;
  char failure[1024];
} harness;

static int64_t flat_index(int ndim, const int64_t *shape, const int64_t *idx) {
  int64_t f = 0;
  for (int d = 0; d < ndim; d++) f = f * shape[d] + idx[d];
  return f;
}

static bool next_idx(int ndim, const int64_t *shape, int64_t *idx) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

static double full_value(int64_t g) {
  return (double)(g % 61) - 30.0;
}
static double pattern(int64_t g) {
  return (double)((g * 7) % 5) - 2.0;
}

/* This rank's source DTensor: the shards of the full tensor, with each Partial dim split into
 * pieces that combine back to it exactly. */
static tsr_status make_source(tsr_rank_t *r, harness *h, const tsr_mesh_t *mesh,
                              const tsr_placement *p, tsr_dtensor **out) {
  tsr_tensor *full;
  TSR_CHECK(tsr_tensor_new(NULL, h->dtype, h->ndim, h->shape, &full));
  tsr_tensor_fill_arange(full, 0, 0);
  int64_t idx[TSR_MAX_DIMS] = {0};
  if (tsr_tensor_numel(full) > 0) do {
      tsr_tensor_set(full, idx, full_value(flat_index(h->ndim, h->shape, idx)));
    } while (next_idx(h->ndim, h->shape, idx));
  tsr_placement base[TSR_MAX_MESH_DIMS];
  int nd = tsr_mesh_ndim(mesh);
  for (int i = 0; i < nd; i++) base[i] = p[i].kind == TSR_PARTIAL ? tsr_replicate() : p[i];
  tsr_status st = tsr_dtensor_distribute(r, mesh, full, base, out);
  tsr_tensor_free(full);
  TSR_CHECK(st);
  tsr_dtensor *x = *out;
  for (int i = 0; i < nd; i++) x->placements[i] = p[i]; /* every rank holds the metadata */
  if (!x->local) return TSR_OK;
  int coords[TSR_MAX_MESH_DIMS];
  int64_t lshape[TSR_MAX_DIMS], lstart[TSR_MAX_DIMS];
  tsr_mesh_coords(mesh, tsr_rank_id(r), coords);
  tsr_dtensor_local_shape(mesh, base, h->ndim, h->shape, tsr_rank_id(r), lshape, lstart);
  for (int i = 0; i < nd; i++) {
    if (p[i].kind != TSR_PARTIAL) continue;
    int n = tsr_mesh_dim_size(mesh, i), c = coords[i];
    int64_t l[TSR_MAX_DIMS] = {0}, gidx[TSR_MAX_DIMS];
    if (tsr_tensor_numel(x->local) == 0) continue;
    do {
      for (int d = 0; d < h->ndim; d++) gidx[d] = lstart[d] + l[d];
      double q = pattern(flat_index(h->ndim, h->shape, gidx)), v = tsr_tensor_get(x->local, l);
      if (p[i].op == TSR_REDUCE_SUM) v = c == 0 ? v - (n - 1) * q : q;
      if (p[i].op == TSR_REDUCE_AVG) v = v + q * (c == 0 ? -(double)(n - 1) * n / 2 : c);
      if (p[i].op == TSR_REDUCE_MAX) v = v - c;
      tsr_tensor_set(x->local, l, v);
    } while (next_idx(h->ndim, lshape, l));
  }
  return TSR_OK;
}

static void note_failure(harness *h, const char *fmt, ...) {
  if (h->failures++ == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->failure, sizeof h->failure, fmt, ap);
    va_end(ap);
  }
}

static void describe(const tsr_mesh_t *m, const tsr_placement *p, char *buf, size_t len) {
  size_t at = 0;
  for (int i = 0; i < tsr_mesh_ndim(m) && at < len; i++) {
    char b[32];
    at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "," : "",
                           tsr_placement_str(p[i], b, sizeof b));
  }
}

/* Rank 0: rebuild the global tensor from every rank's published piece and compare. */
static void check_pieces(harness *h, const tsr_mesh_t *mesh, const tsr_placement *p,
                         const char *what) {
  int nd = tsr_mesh_ndim(mesh), ndim = h->ndim;
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= h->shape[d];
  double *acc = calloc((size_t)numel + 1, sizeof *acc);
  int *hits = calloc((size_t)numel + 1, sizeof *hits);
  int partial_ranks = 1;
  tsr_reduce_op op = TSR_REDUCE_SUM;
  for (int i = 0; i < nd; i++)
    if (p[i].kind == TSR_PARTIAL && tsr_mesh_dim_size(mesh, i) > 1) {
      partial_ranks *= tsr_mesh_dim_size(mesh, i);
      op = p[i].op;
    }
  char desc[256];
  describe(mesh, p, desc, sizeof desc);
  h->checked++;
  for (int k = 0; k < tsr_mesh_nranks(mesh); k++) {
    int q = tsr_mesh_ranks(mesh)[k], coords[TSR_MAX_MESH_DIMS];
    int64_t lshape[TSR_MAX_DIMS], lstart[TSR_MAX_DIMS];
    tsr_mesh_coords(mesh, q, coords);
    tsr_dtensor_local_shape(mesh, p, ndim, h->shape, q, lshape, lstart);
    const tsr_tensor *t = h->slots[q];
    if (!t) {
      note_failure(h, "%s to (%s): rank %d published no local", what, desc, q);
      continue;
    }
    for (int d = 0; d < ndim; d++)
      if (t->shape[d] != lshape[d])
        note_failure(h, "%s to (%s): rank %d local dim %d is %lld, want %lld", what, desc, q, d,
                     (long long)t->shape[d], (long long)lshape[d]);
    /* Replicas must equal the copy at coordinate 0 of every Replicate dim. */
    int rep[TSR_MAX_MESH_DIMS];
    bool representative = true;
    for (int i = 0; i < nd; i++) {
      rep[i] = p[i].kind == TSR_REPLICATE ? 0 : coords[i];
      representative = representative && rep[i] == coords[i];
    }
    int qrep = tsr_mesh_rank_at(mesh, rep);
    if (!representative && !tsr_tensor_equal(t, h->slots[qrep]))
      note_failure(h, "%s to (%s): replica on rank %d differs from rank %d", what, desc, q, qrep);
    if (!representative || tsr_tensor_numel(t) == 0) continue;
    int64_t l[TSR_MAX_DIMS] = {0}, g[TSR_MAX_DIMS];
    do {
      for (int d = 0; d < ndim; d++) g[d] = lstart[d] + l[d];
      int64_t f = flat_index(ndim, h->shape, g);
      double v = tsr_tensor_get(t, l);
      acc[f] = hits[f] == 0 ? v : op == TSR_REDUCE_MAX ? fmax(acc[f], v) : acc[f] + v;
      hits[f]++;
    } while (next_idx(ndim, lshape, l));
  }
  int64_t g[TSR_MAX_DIMS] = {0};
  for (int64_t f = 0; f < numel && h->failures == 0; f++) {
    double v = acc[f];
    if (op == TSR_REDUCE_AVG && partial_ranks > 1) v /= partial_ranks;
    if (hits[f] != partial_ranks)
      note_failure(h, "%s to (%s): element %lld covered %d times, want %d", what, desc,
                   (long long)f, hits[f], partial_ranks);
    else if (v != full_value(f))
      note_failure(h, "%s to (%s): element %lld is %g, want %g", what, desc, (long long)f, v,
                   full_value(f));
    next_idx(ndim, h->shape, g);
  }
  free(acc);
  free(hits);
}

static tsr_status publish_and_check(tsr_rank_t *r, tsr_group_t *world, harness *h,
                                    const tsr_dtensor *y, const tsr_placement *p,
                                    const char *what) {
  h->slots[tsr_rank_id(r)] = y->local;
  TSR_CHECK(tsr_comm_barrier(world));
  if (tsr_rank_id(r) == 0) check_pieces(h, y->mesh, p, what);
  return tsr_comm_barrier(world);
}

static tsr_status run_pairs(tsr_comm_t *comm, void *arg) {
  harness *h = arg;
  tsr_rank_t *r = NULL;
  tsr_group_t *world;
  int ranks[MAX_RANKS];
  for (int i = 0; i < tsr_comm_world(comm); i++) ranks[i] = i;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_comm_group(comm, tsr_comm_world(comm), ranks, "test", &world), st);
  for (int a = 0; a < h->nvec; a++) {
    for (int b = 0; b < h->nvec; b++) {
      tsr_dtensor *x = NULL, *y = NULL, *z = NULL;
      char sa[128], sb[128], what[300];
      describe(h->mesh, h->vecs[a], sa, sizeof sa);
      describe(h->mesh, h->vecs[b], sb, sizeof sb);
      snprintf(what, sizeof what, "(%s)", sa);
      TSR_CHECK_GOTO(make_source(r, h, h->mesh, h->vecs[a], &x), st);
      st = tsr_dtensor_redistribute(r, x, h->dst_mesh, h->vecs[b], &y);
      if (st == TSR_OK) st = publish_and_check(r, world, h, y, h->vecs[b], what);
      if (st == TSR_OK && h->adjoint) {
        snprintf(what, sizeof what, "adjoint of (%s)->(%s), back", sa, sb);
        st = tsr_dtensor_redistribute_adjoint(r, y, h->mesh, h->vecs[a], &z);
        tsr_placement back[TSR_MAX_MESH_DIMS];
        for (int i = 0; i < tsr_mesh_ndim(h->mesh); i++)
          back[i] = h->vecs[a][i].kind == TSR_PARTIAL ? tsr_replicate() : h->vecs[a][i];
        if (st == TSR_OK) st = publish_and_check(r, world, h, z, back, what);
      }
      tsr_dtensor_free(x);
      tsr_dtensor_free(y);
      tsr_dtensor_free(z);
      if (st != TSR_OK) {
        tsr_error_prefix(st, "(%s) -> (%s)", sa, sb);
        goto cleanup;
      }
    }
  }
cleanup:
  tsr_rank_free(r);
  return st;
}

/* Every vector of placements drawn from `opts` over the mesh's dims. */
static void all_vectors(harness *h, int mesh_nd, const tsr_placement *opts, int nopts) {
  int total = 1;
  for (int i = 0; i < mesh_nd; i++) total *= nopts;
  assert_true(total <= MAX_VECS);
  h->nvec = total;
  for (int v = 0; v < total; v++) {
    int rest = v;
    for (int i = mesh_nd - 1; i >= 0; i--) {
      h->vecs[v][i] = opts[rest % nopts];
      rest /= nopts;
    }
  }
}

static void run_harness(harness *h, int world) {
  h->failures = 0;
  h->checked = 0;
  tsr_status st = tsr_local_launch(world, 60.0, run_pairs, h);
  if (st != TSR_OK) fail_msg("redistribute failed: %s", tsr_last_error());
  if (h->failures) fail_msg("%d failures; first: %s", h->failures, h->failure);
  assert_true(h->checked > 0);
}

static void test_all_pairs_1d_every_dtype(void **state) {
  int shape[1] = {4};
  const char *names[1] = {"tp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(4, 1, shape, names, &m), TSR_OK);
  tsr_placement opts[] = {tsr_replicate(),
                          tsr_shard(0),
                          tsr_shard(1),
                          tsr_partial(TSR_REDUCE_SUM),
                          tsr_partial(TSR_REDUCE_AVG),
                          tsr_partial(TSR_REDUCE_MAX)};
  int64_t shapes[3][2] = {{8, 4}, {5, 3}, {3, 9}}; /* even; 5 over 4 leaves an empty shard */
  for (int dt = 0; dt < TSR_DTYPE_COUNT; dt++) {
    for (int s = 0; s < 3; s++) {
      harness *h = calloc(1, sizeof *h);
      h->mesh = h->dst_mesh = m;
      h->ndim = 2;
      h->shape[0] = shapes[s][0];
      h->shape[1] = shapes[s][1];
      h->dtype = (tsr_dtype)dt;
      h->adjoint = true;
      all_vectors(h, 1, opts, 6);
      run_harness(h, 4);
      assert_int_equal(h->checked, 2 * 36);
      free(h);
    }
  }
  tsr_mesh_free(m);
}

static void test_all_pairs_2d(void **state) {
  int shape[2] = {2, 3};
  const char *names[2] = {"dp", "tp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(6, 2, shape, names, &m), TSR_OK);
  tsr_placement opts[] = {tsr_replicate(), tsr_shard(0), tsr_shard(1), tsr_partial(TSR_REDUCE_SUM)};
  int64_t shapes[2][2] = {{6, 6}, {5, 7}};
  for (int s = 0; s < 2; s++) {
    harness *h = calloc(1, sizeof *h);
    h->mesh = h->dst_mesh = m;
    h->ndim = 2;
    h->shape[0] = shapes[s][0];
    h->shape[1] = shapes[s][1];
    h->dtype = s ? TSR_I64 : TSR_F32;
    h->adjoint = true;
    all_vectors(h, 2, opts, 4);
    run_harness(h, 6);
    assert_int_equal(h->checked, 2 * 16 * 16);
    free(h);
  }
  tsr_mesh_free(m);
}

static void test_all_pairs_3d(void **state) {
  int shape[3] = {2, 2, 2};
  const char *names[3] = {"dp", "tp", "ring_cp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(8, 3, shape, names, &m), TSR_OK);
  tsr_placement opts[] = {tsr_replicate(), tsr_shard(0), tsr_shard(1), tsr_partial(TSR_REDUCE_SUM)};
  harness *h = calloc(1, sizeof *h);
  h->mesh = h->dst_mesh = m;
  h->ndim = 2;
  h->shape[0] = 7; /* 7 over 2 over 2: 4, 3 then 2, 2, 2, 1 */
  h->shape[1] = 4;
  h->dtype = TSR_F32;
  all_vectors(h, 3, opts, 4);
  run_harness(h, 8);
  assert_int_equal(h->checked, 64 * 64);
  free(h);
  tsr_mesh_free(m);
}

static void test_three_dim_tensor_all_to_all(void **state) {
  /* Shards of every tensor dim of a rank-3 tensor on a 2 x 2 mesh, uneven. */
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "ulysses_cp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(4, 2, shape, names, &m), TSR_OK);
  tsr_placement opts[] = {tsr_replicate(), tsr_shard(0), tsr_shard(1), tsr_shard(2)};
  harness *h = calloc(1, sizeof *h);
  h->mesh = h->dst_mesh = m;
  h->ndim = 3;
  h->shape[0] = 3;
  h->shape[1] = 5;
  h->shape[2] = 4;
  h->dtype = TSR_BF16;
  h->adjoint = true;
  all_vectors(h, 2, opts, 4);
  run_harness(h, 4);
  free(h);
  tsr_mesh_free(m);
}

static void test_cross_mesh_pipeline_stages(void **state) {
  int shape[3] = {2, 2, 2};
  const char *names[3] = {"pp", "dp", "tp"};
  tsr_mesh_t *m, **stages;
  int n;
  assert_int_equal(tsr_mesh_init(8, 3, shape, names, &m), TSR_OK);
  assert_int_equal(tsr_mesh_unbind(m, "pp", &stages, &n), TSR_OK);
  tsr_placement opts[] = {tsr_replicate(), tsr_shard(0), tsr_shard(1), tsr_partial(TSR_REDUCE_SUM)};
  harness *h = calloc(1, sizeof *h);
  h->mesh = stages[0];
  h->dst_mesh = stages[1];
  h->ndim = 2;
  h->shape[0] = 5;
  h->shape[1] = 3;
  h->dtype = TSR_F32;
  h->adjoint = true; /* the adjoint sends the gradient back to stage 0 */
  all_vectors(h, 2, opts, 4);
  run_harness(h, 8);
  assert_int_equal(h->checked, 2 * 16 * 16);
  free(h);
  tsr_mesh_free(stages[0]);
  tsr_mesh_free(stages[1]);
  free(stages);
  tsr_mesh_free(m);
}

/* ---- byte counts of a transition and of its adjoint ---- */

typedef struct bytes_case {
  tsr_mesh_t *mesh;
  uint64_t fwd[4], adj[4]; /* per rank */
} bytes_case;

static tsr_status run_bytes(tsr_comm_t *comm, void *arg) {
  bytes_case *bc = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  int me = tsr_comm_rank(comm);
  int64_t shape[2] = {8, 6};
  tsr_tensor *full;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 2, shape, &full));
  tsr_tensor_fill_arange(full, 1, 0);
  tsr_placement s0 = tsr_shard(0), rep = tsr_replicate(), s1 = tsr_shard(1);
  tsr_placement psum = tsr_partial(TSR_REDUCE_SUM);
  tsr_dtensor *x, *y, *g, *back;
  /* S(0) -> R is an all-gather; its adjoint on a Partial gradient is a reduce-scatter. */
  TSR_CHECK(tsr_dtensor_distribute(r, bc->mesh, full, &s0, &x));
  tsr_comm_bytes_reset(comm);
  TSR_CHECK(tsr_dtensor_redistribute(r, x, bc->mesh, &rep, &y));
  bc->fwd[me] = tsr_comm_bytes(comm, "tp");
  TSR_CHECK(tsr_dtensor_distribute(r, bc->mesh, full, &psum, &g));
  tsr_comm_bytes_reset(comm);
  TSR_CHECK(tsr_dtensor_redistribute_adjoint(r, g, bc->mesh, &s0, &back));
  bc->adj[me] = tsr_comm_bytes(comm, "tp");
  TSR_INVARIANT(tsr_placement_equal(back->placements[0], s0));
  tsr_dtensor_free(x);
  tsr_dtensor_free(y);
  tsr_dtensor_free(g);
  tsr_dtensor_free(back);
  /* S(0) -> S(1) is one all-to-all; its adjoint the inverse all-to-all, the same bytes. */
  tsr_tensor_free(full);
  int64_t square[2] = {8, 8};
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 2, square, &full));
  tsr_tensor_fill_arange(full, 1, 0);
  TSR_CHECK(tsr_dtensor_distribute(r, bc->mesh, full, &s0, &x));
  tsr_comm_bytes_reset(comm);
  TSR_CHECK(tsr_dtensor_redistribute(r, x, bc->mesh, &s1, &y));
  uint64_t a2a = tsr_comm_bytes(comm, "tp");
  tsr_comm_bytes_reset(comm);
  TSR_CHECK(tsr_dtensor_redistribute_adjoint(r, y, bc->mesh, &s0, &back));
  uint64_t a2a_back = tsr_comm_bytes(comm, "tp");
  /* Each rank keeps 2x2 of its 2x8 shard and sends the other three 2x2 blocks. */
  TSR_INVARIANT(a2a == 3 * 2 * 2 * 4 && a2a_back == 3 * 2 * 2 * 4);
  tsr_dtensor_free(x);
  tsr_dtensor_free(y);
  tsr_dtensor_free(back);
  tsr_tensor_free(full);
  tsr_rank_free(r);
  return TSR_OK;
}

static void test_adjoint_bytes_mirror_forward(void **state) {
  int shape[1] = {4};
  const char *names[1] = {"tp"};
  bytes_case bc = {0};
  assert_int_equal(tsr_mesh_init(4, 1, shape, names, &bc.mesh), TSR_OK);
  assert_int_equal(tsr_local_launch(4, 30.0, run_bytes, &bc), TSR_OK);
  for (int q = 0; q < 4; q++) {
    /* all-gather: own 2x6 floats to 3 peers; reduce-scatter: the other 6x6 floats */
    assert_int_equal(bc.fwd[q], 2 * 6 * 4 * 3);
    assert_int_equal(bc.adj[q], 6 * 6 * 4);
  }
  tsr_mesh_free(bc.mesh);
}

/* ---- registered transitions ---- */

typedef struct rule_ctx {
  int applied; /* touched by several rank threads: counted under the harness barrier */
} rule_ctx;

static bool match_s0_to_r(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst,
                          void *ctx) {
  return src.kind == TSR_SHARD && src.dim == 0 && dst.kind == TSR_REPLICATE;
}

/* A different algorithm for S(0) -> R: zero-pad into the full shape and all-reduce. */
static tsr_status apply_pad_allreduce(tsr_rank_t *r, const tsr_dtensor *x, int dim,
                                      tsr_placement dst, tsr_dtensor **out, void *ctx) {
  int n = tsr_mesh_dim_size(x->mesh, dim), coords[TSR_MAX_MESH_DIMS];
  tsr_mesh_coords(x->mesh, tsr_rank_id(r), coords);
  tsr_tensor *full, *slot;
  int64_t padded[TSR_MAX_DIMS];
  memcpy(padded, x->local->shape, sizeof padded);
  padded[0] = x->shape[0]; /* this test's mesh dim is the only sharder of tensor dim 0 */
  TSR_CHECK(tsr_tensor_new(NULL, x->dtype, x->ndim, padded, &full));
  int64_t start = tsr_chunk_start(x->shape[0], n, coords[dim]);
  TSR_CHECK(tsr_tensor_narrow(full, 0, start, x->local->shape[0], &slot));
  TSR_CHECK(tsr_tensor_copy(slot, x->local));
  tsr_tensor_free(slot);
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(x->mesh, tsr_rank_comm(r), 1u << dim, &g));
  TSR_CHECK(tsr_comm_all_reduce(g, tsr_tensor_data(full), tsr_tensor_data(full),
                                (size_t)tsr_tensor_numel(full), x->dtype, TSR_REDUCE_SUM));
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = dst;
  if (tsr_rank_id(r) == 0) ((rule_ctx *)ctx)->applied++;
  return tsr_dtensor_from_local(r, x->mesh, full, x->shape, p, out);
}

typedef struct rule_case {
  tsr_mesh_t *mesh;
  tsr_registry_t *reg;
  int ok[4];
} rule_case;

static tsr_status run_rule(tsr_comm_t *comm, void *arg) {
  rule_case *rc = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, rc->reg, &r));
  int64_t shape[2] = {7, 3};
  tsr_tensor *full, *got;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &full));
  tsr_tensor_fill_arange(full, 1, -4);
  tsr_placement p[2] = {tsr_shard(0), tsr_shard(1)}, q[2] = {tsr_replicate(), tsr_shard(1)};
  tsr_dtensor *x, *y;
  TSR_CHECK(tsr_dtensor_distribute(r, rc->mesh, full, p, &x));
  TSR_CHECK(tsr_dtensor_redistribute(r, x, rc->mesh, q, &y));
  TSR_CHECK(tsr_dtensor_full_tensor(r, y, &got));
  rc->ok[tsr_comm_rank(comm)] = tsr_tensor_equal(got, full);
  tsr_tensor_free(got);
  tsr_tensor_free(full);
  tsr_dtensor_free(x);
  tsr_dtensor_free(y);
  tsr_rank_free(r);
  return TSR_OK;
}

static void test_registered_transition_is_used(void **state) {
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "tp"};
  rule_ctx ctx = {0};
  rule_case rc = {0};
  assert_int_equal(tsr_mesh_init(4, 2, shape, names, &rc.mesh), TSR_OK);
  assert_int_equal(tsr_registry_new(&rc.reg), TSR_OK);
  tsr_redistribute_rule rule = {"test.pad_allreduce", "dp", match_s0_to_r, apply_pad_allreduce,
                                &ctx};
  assert_int_equal(tsr_registry_add_redistribute(rc.reg, &rule), TSR_OK);
  tsr_redistribute_rule bad = {"test.bad", NULL, NULL, apply_pad_allreduce, NULL};
  assert_int_equal(tsr_registry_add_redistribute(rc.reg, &bad), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "test.bad"));
  if (tsr_local_launch(4, 30.0, run_rule, &rc) != TSR_OK) fail_msg("%s", tsr_last_error());
  for (int q = 0; q < 4; q++) assert_true(rc.ok[q]);
  assert_int_equal(ctx.applied, 1);
  tsr_registry_free(rc.reg);
  tsr_mesh_free(rc.mesh);
}

/* ---- by-dict, slices and errors ---- */

typedef struct misc_case {
  tsr_mesh_t *mesh, *stage[2], *other;
  tsr_status st[4];
  bool slice_ok[4];
} misc_case;

static tsr_status run_misc(tsr_comm_t *comm, void *arg) {
  misc_case *mc = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  int64_t shape[3] = {4, 6, 2};
  tsr_tensor *full;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 3, shape, &full));
  tsr_tensor_fill_arange(full, 1, 0);
  tsr_placement rr[2] = {tsr_replicate(), tsr_replicate()};
  tsr_dtensor *x, *y;
  TSR_CHECK(tsr_dtensor_distribute(r, mc->mesh, full, rr, &x));
  /* The seed's input dict: names the mesh lacks are ignored, placed by their names. */
  const char *names[4] = {"dp", "tp", "ulysses_cp", "ring_cp"};
  tsr_placement want[4] = {tsr_shard(0), tsr_replicate(), tsr_shard(1), tsr_shard(1)};
  TSR_CHECK(tsr_dtensor_redistribute_by_dict(r, x, mc->mesh, 4, names, want, &y));
  TSR_INVARIANT(tsr_placement_equal(y->placements[0], tsr_shard(0)));
  TSR_INVARIANT(tsr_placement_equal(y->placements[1], tsr_shard(1)));
  TSR_INVARIANT(y->local->shape[0] == 2 && y->local->shape[1] == 3 && y->local->shape[2] == 2);
  tsr_dtensor_free(y);
  /* Errors, reported without communicating. */
  tsr_placement bad[2] = {tsr_shard(3), tsr_replicate()};
  mc->st[tsr_comm_rank(comm)] = tsr_dtensor_redistribute(r, x, mc->mesh, bad, &y);
  TSR_INVARIANT(strstr(tsr_last_error(), "Shard(3)") != NULL);
  TSR_INVARIANT(tsr_dtensor_redistribute(r, x, mc->other, rr, &y) == TSR_EINVAL);
  TSR_INVARIANT(strstr(tsr_last_error(), "different shapes") != NULL);
  /* To a slice (the stage at dp = 1) and back: the slice keeps its ranks' data, the way back
   * broadcasts along dp; the adjoint of the first move is the second. */
  tsr_placement s01[2] = {tsr_shard(0), tsr_shard(1)}, s1 = tsr_shard(1);
  tsr_placement back_p[2] = {tsr_shard(0), tsr_replicate()};
  tsr_dtensor *xs, *z, *za;
  tsr_tensor *got;
  bool ok = true;
  TSR_CHECK(tsr_dtensor_redistribute(r, x, mc->mesh, s01, &xs));
  TSR_CHECK(tsr_dtensor_redistribute(r, xs, mc->stage[1], &s1, &y));
  bool in_stage = tsr_mesh_contains(mc->stage[1], tsr_comm_rank(comm));
  ok = ok && (y->local != NULL) == in_stage;
  if (in_stage) {
    TSR_CHECK(tsr_dtensor_full_tensor(r, y, &got));
    ok = ok && tsr_tensor_equal(got, full);
    tsr_tensor_free(got);
  }
  tsr_comm_bytes_reset(comm);
  TSR_CHECK(tsr_dtensor_redistribute(r, y, mc->mesh, back_p, &z));
  /* along dp only the broadcast moves data: the stage's full 4 x 6 x 2 floats (gathered on the
   * stage first, counted under ulysses_cp), which the parent then chunks along dp */
  ok = ok && tsr_comm_bytes(comm, "dp") == (in_stage ? 4 * 6 * 2 * 4u : 0u);
  TSR_CHECK(tsr_dtensor_full_tensor(r, z, &got));
  ok = ok && tsr_tensor_equal(got, full);
  tsr_tensor_free(got);
  TSR_CHECK(tsr_dtensor_redistribute_adjoint(r, y, mc->mesh, s01, &za));
  ok = ok && tsr_placement_equal(za->placements[0], s01[0]) &&
       tsr_placement_equal(za->placements[1], s01[1]);
  TSR_CHECK(tsr_dtensor_full_tensor(r, za, &got));
  ok = ok && tsr_tensor_equal(got, full);
  tsr_tensor_free(got);
  mc->slice_ok[tsr_comm_rank(comm)] = ok;
  tsr_dtensor_free(xs);
  tsr_dtensor_free(y);
  tsr_dtensor_free(z);
  tsr_dtensor_free(za);
  tsr_dtensor_free(x);
  tsr_tensor_free(full);
  tsr_rank_free(r);
  return TSR_OK;
}

static void test_by_dict_and_errors(void **state) {
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "ulysses_cp"};
  misc_case mc = {0};
  assert_int_equal(tsr_mesh_init(4, 2, shape, names, &mc.mesh), TSR_OK);
  int n;
  tsr_mesh_t **st;
  assert_int_equal(tsr_mesh_unbind(mc.mesh, "dp", &st, &n), TSR_OK);
  mc.stage[0] = st[0];
  mc.stage[1] = st[1];
  free(st);
  int four[1] = {4};
  const char *tp[1] = {"tp"};
  assert_int_equal(tsr_mesh_init(4, 1, four, tp, &mc.other), TSR_OK);
  tsr_status s = tsr_local_launch(4, 30.0, run_misc, &mc);
  if (s != TSR_OK) fail_msg("%s", tsr_last_error());
  for (int q = 0; q < 4; q++) assert_int_equal(mc.st[q], TSR_EINVAL);
  for (int q = 0; q < 4; q++) assert_true(mc.slice_ok[q]);
  tsr_mesh_free(mc.other);
  tsr_mesh_free(mc.stage[0]);
  tsr_mesh_free(mc.stage[1]);
  tsr_mesh_free(mc.mesh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_pairs_1d_every_dtype),
      cmocka_unit_test(test_all_pairs_2d),
      cmocka_unit_test(test_all_pairs_3d),
      cmocka_unit_test(test_three_dim_tensor_all_to_all),
      cmocka_unit_test(test_cross_mesh_pipeline_stages),
      cmocka_unit_test(test_adjoint_bytes_mirror_forward),
      cmocka_unit_test(test_registered_transition_is_used),
      cmocka_unit_test(test_by_dict_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
