/* The redistribute planner.
 *
 * A change of placements is decomposed into per-mesh-dim steps. The only ordering hazard is
 * nesting: when several mesh dims shard one tensor dim, the inner (later) mesh dim splits what the
 * outer one left, so a shard can only be removed innermost-first and added outermost-first. For
 * each tensor dim d let cur(d) and tgt(d) be the mesh dims sharding it now and in the target, in
 * mesh order. Their common prefix stays; the rest of cur(d) is gathered innermost-first; the rest
 * of tgt(d) is added outermost-first. In that order:
 *   1. all-gather   S -> R for every sharder of d beyond the common prefix, innermost first,
 *                   except a mesh dim that can move S(d) -> S(e) by one all-to-all;
 *   2. all-to-all   S(d) -> S(e) when it is the innermost sharder of d and becomes the innermost
 *                   sharder of e, with nothing else changing on d or e;
 *   3. all-reduce   P -> R, and P(op) -> P(other op) through R;
 *   4. in mesh order, add the new shards: P -> S by reduce-scatter, R -> S by local chunk;
 *   5. R -> P: Partial(sum) keeps the value on coordinate 0 and zeros elsewhere.
 * A cross-mesh move (pipeline stages) first sends each local tensor to the rank at the same
 * coordinates of the target mesh, then changes placements there; a move between a mesh and one
 * of its slices is in redistribute_slice.c. Rules registered by plugins
 * are asked first for every mesh dim that changes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/breadcrumb.h"
#include "tessera/dtensor.h"
#include "tessera/registry.h"
#include "redistribute_impl.h"
#include "registry_impl.h"

/* The planner's working state: x's metadata with the current placements and local tensor. */
typedef struct plan_state {
  tsr_rank_t *r;
  tsr_dtensor x; /* x.local owned by the state */
  int coords[TSR_MAX_MESH_DIMS];
} plan_state;

static int mesh_ndim(const plan_state *s) {
  return tsr_mesh_ndim(s->x.mesh);
}

/* Extent of tensor dim d that mesh dim i splits: the global size after the current sharders of
 * d that precede i in mesh order. */
static int64_t extent_before(const plan_state *s, int d, int i) {
  int64_t len = s->x.shape[d];
  for (int j = 0; j < i; j++)
    if (s->x.placements[j].kind == TSR_SHARD && s->x.placements[j].dim == d)
      len = tsr_chunk_size(len, tsr_mesh_dim_size(s->x.mesh, j), s->coords[j]);
  return len;
}

/* Elements of t per index of dims d and e (pass e = d for one dim); right for empty shards too. */
static int64_t numel_except(const tsr_tensor *t, int d, int e) {
  int64_t n = 1;
  for (int k = 0; k < t->ndim; k++)
    if (k != d && k != e) n *= t->shape[k];
  return n;
}

static tsr_status new_local(plan_state *s, const int64_t *shape, tsr_tensor **out) {
  return tsr_tensor_new(tsr_rank_allocator(s->r), s->x.dtype, s->x.ndim, shape, out);
}

static void replace_local(plan_state *s, tsr_tensor *t) {
  tsr_tensor_free(s->x.local);
  s->x.local = t;
}

/* A contiguous view of `count` elements at element `at` of `flat`, shaped `shape`. */
static tsr_status block_view(const tsr_tensor *flat, int64_t at, int ndim, const int64_t *shape,
                             tsr_tensor **out) {
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) count *= shape[d];
  tsr_tensor *piece = NULL;
  TSR_CHECK(tsr_tensor_narrow(flat, 0, at, count, &piece));
  tsr_status st = tsr_tensor_reshape(piece, ndim, shape, out);
  tsr_tensor_free(piece);
  return st;
}

/* Copies src into the slice [start, start+len) of dst along dim d, or the reverse. */
static tsr_status copy_slice(tsr_tensor *dst, int d, int64_t start, int64_t len,
                             const tsr_tensor *src, bool into_dst) {
  tsr_tensor *slice = NULL;
  TSR_CHECK(tsr_tensor_narrow(into_dst ? dst : src, d, start, len, &slice));
  tsr_status st = into_dst ? tsr_tensor_copy(slice, src) : tsr_tensor_copy(dst, slice);
  tsr_tensor_free(slice);
  return st;
}

static tsr_status group_along(plan_state *s, int i, tsr_group_t **g) {
  return tsr_mesh_group(s->x.mesh, tsr_rank_comm(s->r), 1u << i, g);
}

/* S(d) -> R on mesh dim i. */
static tsr_status step_all_gather(plan_state *s, int i) {
  int d = s->x.placements[i].dim, n = tsr_mesh_dim_size(s->x.mesh, i);
  int64_t E = extent_before(s, d, i), inner = numel_except(s->x.local, d, d);
  tsr_group_t *g;
  tsr_status st = TSR_OK;
  tsr_tensor *flat = NULL, *out = NULL, *src = NULL, *blk = NULL;
  size_t *counts = malloc(sizeof(size_t) * (size_t)n);
  if (!counts) return TSR_ERROR(TSR_ENOMEM, "out of memory planning an all-gather");
  TSR_CHECK_GOTO(group_along(s, i, &g), st);
  for (int k = 0; k < n; k++) counts[k] = (size_t)(tsr_chunk_size(E, n, k) * inner);
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, s->x.local->shape, sizeof shape);
  int64_t total = E * inner;
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, s->x.dtype, 1, &total, &flat), st);
  TSR_CHECK_GOTO(tsr_tensor_clone(s->x.local, &src), st);
  TSR_CHECK_GOTO(tsr_comm_all_gather(g, tsr_tensor_data(src), counts[s->coords[i]],
                                     tsr_tensor_data(flat), counts, s->x.dtype),
                 st);
  shape[d] = E;
  TSR_CHECK_GOTO(new_local(s, shape, &out), st);
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    shape[d] = tsr_chunk_size(E, n, k);
    TSR_CHECK_GOTO(block_view(flat, at, s->x.ndim, shape, &blk), st);
    TSR_CHECK_GOTO(copy_slice(out, d, tsr_chunk_start(E, n, k), shape[d], blk, true), st);
    tsr_tensor_free(blk);
    blk = NULL;
    at += (int64_t)counts[k];
  }
  replace_local(s, out);
  out = NULL;
  s->x.placements[i] = tsr_replicate();
cleanup:
  free(counts);
  tsr_tensor_free(blk);
  tsr_tensor_free(src);
  tsr_tensor_free(flat);
  tsr_tensor_free(out);
  return st;
}

/* S(d) -> S(e) on mesh dim i by one all-to-all. */
static tsr_status step_all_to_all(plan_state *s, int i, int e) {
  int d = s->x.placements[i].dim, n = tsr_mesh_dim_size(s->x.mesh, i), c = s->coords[i];
  int64_t Ed = extent_before(s, d, i), Ee = s->x.local->shape[e];
  const tsr_tensor *loc = s->x.local;
  int64_t other = numel_except(loc, d, e);
  tsr_group_t *g;
  tsr_status st = TSR_OK;
  tsr_tensor *sendbuf = NULL, *recvbuf = NULL, *out = NULL, *blk = NULL;
  size_t *scounts = malloc(sizeof(size_t) * 2 * (size_t)n), *rcounts = scounts + n;
  if (!scounts) return TSR_ERROR(TSR_ENOMEM, "out of memory planning an all-to-all");
  TSR_CHECK_GOTO(group_along(s, i, &g), st);
  int64_t stot = 0, rtot = 0;
  for (int k = 0; k < n; k++) {
    scounts[k] = (size_t)(loc->shape[d] * tsr_chunk_size(Ee, n, k) * other);
    rcounts[k] = (size_t)(tsr_chunk_size(Ed, n, k) * tsr_chunk_size(Ee, n, c) * other);
    stot += (int64_t)scounts[k];
    rtot += (int64_t)rcounts[k];
  }
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, s->x.dtype, 1, &stot, &sendbuf), st);
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, s->x.dtype, 1, &rtot, &recvbuf), st);
  int64_t shape[TSR_MAX_DIMS], at = 0;
  memcpy(shape, loc->shape, sizeof shape);
  for (int k = 0; k < n; k++) {
    shape[e] = tsr_chunk_size(Ee, n, k);
    TSR_CHECK_GOTO(block_view(sendbuf, at, s->x.ndim, shape, &blk), st);
    TSR_CHECK_GOTO(copy_slice(blk, e, tsr_chunk_start(Ee, n, k), shape[e], loc, false), st);
    tsr_tensor_free(blk);
    blk = NULL;
    at += (int64_t)scounts[k];
  }
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, tsr_tensor_data(sendbuf), scounts, tsr_tensor_data(recvbuf),
                                     rcounts, s->x.dtype),
                 st);
  shape[d] = Ed;
  shape[e] = tsr_chunk_size(Ee, n, c);
  TSR_CHECK_GOTO(new_local(s, shape, &out), st);
  at = 0;
  for (int k = 0; k < n; k++) {
    shape[d] = tsr_chunk_size(Ed, n, k);
    TSR_CHECK_GOTO(block_view(recvbuf, at, s->x.ndim, shape, &blk), st);
    TSR_CHECK_GOTO(copy_slice(out, d, tsr_chunk_start(Ed, n, k), shape[d], blk, true), st);
    tsr_tensor_free(blk);
    blk = NULL;
    at += (int64_t)rcounts[k];
  }
  replace_local(s, out);
  out = NULL;
  s->x.placements[i] = tsr_shard(e);
cleanup:
  free(scounts);
  tsr_tensor_free(blk);
  tsr_tensor_free(sendbuf);
  tsr_tensor_free(recvbuf);
  tsr_tensor_free(out);
  return st;
}

/* P(op) -> R on mesh dim i. */
static tsr_status step_all_reduce(plan_state *s, int i) {
  tsr_group_t *g;
  tsr_tensor *out = NULL;
  TSR_CHECK(group_along(s, i, &g));
  TSR_CHECK(tsr_tensor_clone(s->x.local, &out));
  tsr_status st =
      tsr_comm_all_reduce(g, tsr_tensor_data(out), tsr_tensor_data(out),
                          (size_t)tsr_tensor_numel(out), s->x.dtype, s->x.placements[i].op);
  if (st != TSR_OK) {
    tsr_tensor_free(out);
    return st;
  }
  replace_local(s, out);
  s->x.placements[i] = tsr_replicate();
  return TSR_OK;
}

/* P(op) -> S(e) on mesh dim i by reduce-scatter. */
static tsr_status step_reduce_scatter(plan_state *s, int i, int e) {
  int n = tsr_mesh_dim_size(s->x.mesh, i), c = s->coords[i];
  const tsr_tensor *loc = s->x.local;
  int64_t E = loc->shape[e];
  int64_t inner = numel_except(loc, e, e);
  tsr_group_t *g;
  tsr_status st = TSR_OK;
  tsr_tensor *sendbuf = NULL, *out = NULL, *blk = NULL;
  size_t *counts = malloc(sizeof(size_t) * (size_t)n);
  if (!counts) return TSR_ERROR(TSR_ENOMEM, "out of memory planning a reduce-scatter");
  TSR_CHECK_GOTO(group_along(s, i, &g), st);
  int64_t total = tsr_tensor_numel(loc), at = 0, shape[TSR_MAX_DIMS];
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, s->x.dtype, 1, &total, &sendbuf), st);
  memcpy(shape, loc->shape, sizeof shape);
  for (int k = 0; k < n; k++) {
    shape[e] = tsr_chunk_size(E, n, k);
    counts[k] = (size_t)(shape[e] * inner);
    TSR_CHECK_GOTO(block_view(sendbuf, at, s->x.ndim, shape, &blk), st);
    TSR_CHECK_GOTO(copy_slice(blk, e, tsr_chunk_start(E, n, k), shape[e], loc, false), st);
    tsr_tensor_free(blk);
    blk = NULL;
    at += (int64_t)counts[k];
  }
  shape[e] = tsr_chunk_size(E, n, c);
  TSR_CHECK_GOTO(new_local(s, shape, &out), st);
  TSR_CHECK_GOTO(tsr_comm_reduce_scatter(g, tsr_tensor_data(sendbuf), tsr_tensor_data(out),
                                         counts[c], counts, s->x.dtype, s->x.placements[i].op),
                 st);
  replace_local(s, out);
  out = NULL;
  s->x.placements[i] = tsr_shard(e);
cleanup:
  free(counts);
  tsr_tensor_free(blk);
  tsr_tensor_free(sendbuf);
  tsr_tensor_free(out);
  return st;
}

/* R -> S(e) on mesh dim i: keep this rank's chunk. */
static tsr_status step_chunk(plan_state *s, int i, int e) {
  int n = tsr_mesh_dim_size(s->x.mesh, i), c = s->coords[i];
  int64_t E = s->x.local->shape[e], shape[TSR_MAX_DIMS];
  memcpy(shape, s->x.local->shape, sizeof shape);
  shape[e] = tsr_chunk_size(E, n, c);
  tsr_tensor *out = NULL;
  TSR_CHECK(new_local(s, shape, &out));
  tsr_status st = copy_slice(out, e, tsr_chunk_start(E, n, c), shape[e], s->x.local, false);
  if (st != TSR_OK) {
    tsr_tensor_free(out);
    return st;
  }
  replace_local(s, out);
  s->x.placements[i] = tsr_shard(e);
  return TSR_OK;
}

/* R -> P(op) on mesh dim i. */
static tsr_status step_make_partial(plan_state *s, int i, tsr_reduce_op op) {
  if (op == TSR_REDUCE_SUM && s->coords[i] != 0) {
    tsr_tensor *out = NULL;
    TSR_CHECK(new_local(s, s->x.local->shape, &out));
    replace_local(s, out);
  }
  s->x.placements[i] = tsr_partial(op);
  return TSR_OK;
}

/* Mesh dims sharding tensor dim d under `p`, in mesh order. Returns the count. */
static int sharders(const tsr_placement *p, int mesh_nd, int d, int *list) {
  int n = 0;
  for (int i = 0; i < mesh_nd; i++)
    if (p[i].kind == TSR_SHARD && p[i].dim == d) list[n++] = i;
  return n;
}

static int common_prefix(const int *a, int na, const int *b, int nb) {
  int k = 0;
  while (k < na && k < nb && a[k] == b[k]) k++;
  return k;
}

/* True when mesh dim i can go S(d) -> S(e) by one all-to-all: it is the innermost sharder of d
 * and its removal leaves exactly tgt(d), and appending it to cur(e) gives exactly tgt(e). */
static bool all_to_all_ok(const tsr_placement *cur, const tsr_placement *tgt, int nd, int i) {
  if (cur[i].kind != TSR_SHARD || tgt[i].kind != TSR_SHARD || cur[i].dim == tgt[i].dim)
    return false;
  int d = cur[i].dim, e = tgt[i].dim;
  int cd[TSR_MAX_MESH_DIMS], td[TSR_MAX_MESH_DIMS], ce[TSR_MAX_MESH_DIMS], te[TSR_MAX_MESH_DIMS];
  int ncd = sharders(cur, nd, d, cd), ntd = sharders(tgt, nd, d, td);
  int nce = sharders(cur, nd, e, ce), nte = sharders(tgt, nd, e, te);
  if (ncd != ntd + 1 || cd[ncd - 1] != i || common_prefix(cd, ncd, td, ntd) != ntd) return false;
  if (nte != nce + 1 || te[nte - 1] != i || common_prefix(ce, nce, te, nte) != nce) return false;
  return true;
}

/* Lets a registered transition handle mesh dim i. Sets *done when one did. */
static tsr_status try_rules(plan_state *s, int i, tsr_placement dst, bool *done) {
  *done = false;
  const tsr_registry_t *reg = tsr_rank_registry(s->r);
  const char *dim = tsr_mesh_dim_name(s->x.mesh, i);
  for (int k = tsr_registry_redistribute_count(reg) - 1; k >= 0; k--) {
    const tsr_redistribute_rule *rule = tsr_registry_redistribute_at(reg, k);
    if (rule->mesh_dim && strcmp(tsr_mesh_canonical_name(rule->mesh_dim), dim) != 0) continue;
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(
        tsr_registry_redistribute_owner(reg, k), "redistribute transition", rule->name, "match");
    bool match = rule->match(&s->x, i, s->x.placements[i], dst, rule->ctx);
    tsr_breadcrumb_here()->phase = "apply";
    tsr_dtensor *y = NULL;
    tsr_status st = match ? rule->apply(s->r, &s->x, i, dst, &y, rule->ctx) : TSR_OK;
    tsr_breadcrumb_leave(&crumb);
    if (!match) continue;
    tsr_registry_note_redistribute(reg, k);
    if (st != TSR_OK)
      return tsr_error_prefix(st, "redistribute rule '%s' on mesh dim '%s'", rule->name, dim);
    if (!y || !y->local || !tsr_placement_equal(y->placements[i], dst)) {
      tsr_dtensor_free(y);
      return TSR_ERROR(TSR_EPLUGIN,
                       "redistribute rule '%s' on mesh dim '%s' did not produce the "
                       "requested placement",
                       rule->name, dim);
    }
    replace_local(s, y->local);
    y->local = NULL;
    s->x.placements[i] = dst;
    tsr_dtensor_free(y);
    *done = true;
    return TSR_OK;
  }
  return TSR_OK;
}

/* Same-mesh change of placements; s->x.mesh is the mesh and this rank is in it. */
static tsr_status plan_same_mesh(plan_state *s, const tsr_placement *tgt) {
  int nd = mesh_ndim(s), ndim = s->x.ndim;
  tsr_placement *cur = s->x.placements;
  /* A size-1 mesh dim holds the whole tensor whatever its placement. */
  for (int i = 0; i < nd; i++)
    if (tsr_mesh_dim_size(s->x.mesh, i) == 1) cur[i] = tgt[i];
  for (int i = 0; i < nd; i++) {
    if (tsr_placement_equal(cur[i], tgt[i])) continue;
    bool done;
    TSR_CHECK(try_rules(s, i, tgt[i], &done));
  }
  /* 1 and 2: remove shards innermost-first. */
  bool a2a[TSR_MAX_MESH_DIMS] = {false};
  for (int i = 0; i < nd; i++) a2a[i] = all_to_all_ok(cur, tgt, nd, i);
  for (int d = 0; d < ndim; d++) {
    int cd[TSR_MAX_MESH_DIMS], td[TSR_MAX_MESH_DIMS];
    int ncd = sharders(cur, nd, d, cd), ntd = sharders(tgt, nd, d, td);
    int keep = common_prefix(cd, ncd, td, ntd);
    for (int k = ncd - 1; k >= keep; k--)
      if (!a2a[cd[k]]) TSR_CHECK(step_all_gather(s, cd[k]));
  }
  for (int i = 0; i < nd; i++)
    if (a2a[i]) TSR_CHECK(step_all_to_all(s, i, tgt[i].dim));
  /* 3: resolve Partials that do not become Shards. */
  for (int i = 0; i < nd; i++)
    if (cur[i].kind == TSR_PARTIAL && tgt[i].kind != TSR_SHARD &&
        !tsr_placement_equal(cur[i], tgt[i]))
      TSR_CHECK(step_all_reduce(s, i));
  /* 4: add shards outermost-first. */
  for (int i = 0; i < nd; i++) {
    if (tgt[i].kind != TSR_SHARD || tsr_placement_equal(cur[i], tgt[i])) continue;
    if (cur[i].kind == TSR_PARTIAL)
      TSR_CHECK(step_reduce_scatter(s, i, tgt[i].dim));
    else if (cur[i].kind == TSR_REPLICATE)
      TSR_CHECK(step_chunk(s, i, tgt[i].dim));
  }
  /* 5: make Partials. */
  for (int i = 0; i < nd; i++)
    if (tgt[i].kind == TSR_PARTIAL && cur[i].kind == TSR_REPLICATE)
      TSR_CHECK(step_make_partial(s, i, tgt[i].op));
  for (int i = 0; i < nd; i++) TSR_INVARIANT(tsr_placement_equal(cur[i], tgt[i]));
  return TSR_OK;
}

/* Moves x's local tensor from its mesh to `dst`, a mesh of the same shape over other ranks: the
 * rank at coordinates c of the source sends to the rank at c of the target. Placements are
 * unchanged. The meshes share no rank, so every rank only sends or only receives. */
static tsr_status move_cross_mesh(plan_state *s, const tsr_mesh_t *dst) {
  const tsr_mesh_t *src = s->x.mesh;
  int me = tsr_rank_id(s->r), coords[TSR_MAX_MESH_DIMS];
  bool in_src = tsr_mesh_coords(src, me, coords);
  bool in_dst = !in_src && tsr_mesh_coords(dst, me, coords);
  s->x.mesh = dst;
  if (!in_src && !in_dst) return TSR_OK;
  int peer = in_src ? tsr_mesh_rank_at(dst, coords) : tsr_mesh_rank_at(src, coords);
  /* The pair's group, labelled with the dim the meshes were unbound from (pipeline: "pp"). */
  const char *a = tsr_mesh_unbound_dim(src), *b = tsr_mesh_unbound_dim(dst);
  const char *label = a && b && strcmp(a, b) == 0 ? a : "cross_mesh";
  int pair[2] = {me < peer ? me : peer, me < peer ? peer : me};
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_comm_group(tsr_rank_comm(s->r), 2, pair, label, &g));
  int other = 1 - tsr_group_index(g);
  if (in_src) {
    tsr_status st = tsr_comm_send(g, other, tsr_tensor_data(s->x.local),
                                  (size_t)tsr_tensor_numel(s->x.local), s->x.dtype);
    replace_local(s, NULL);
    return st;
  }
  int64_t lshape[TSR_MAX_DIMS];
  tsr_dtensor_local_shape(dst, s->x.placements, s->x.ndim, s->x.shape, me, lshape, NULL);
  memcpy(s->coords, coords, sizeof coords);
  tsr_tensor *recv = NULL;
  TSR_CHECK(new_local(s, lshape, &recv));
  tsr_status st =
      tsr_comm_recv(g, other, tsr_tensor_data(recv), (size_t)tsr_tensor_numel(recv), s->x.dtype);
  replace_local(s, recv);
  return st;
}

static bool meshes_disjoint(const tsr_mesh_t *a, const tsr_mesh_t *b) {
  for (int i = 0; i < tsr_mesh_nranks(a); i++)
    if (tsr_mesh_contains(b, tsr_mesh_ranks(a)[i])) return false;
  return true;
}

tsr_status tsr_dtensor_redistribute(tsr_rank_t *r, const tsr_dtensor *x, const tsr_mesh_t *mesh,
                                    const tsr_placement *placements, tsr_dtensor **out) {
  *out = NULL;
  char a[128], b[128];
  if (!tsr_mesh_same_shape(x->mesh, mesh)) {
    int coord, k;
    if ((k = tsr_mesh_slice_of(x->mesh, mesh, &coord)) >= 0) {
      TSR_CHECK(tsr_dtensor_check_placements(mesh, placements, x->ndim));
      return tsr_redistribute_to_slice(r, x, mesh, k, placements, out);
    }
    if ((k = tsr_mesh_slice_of(mesh, x->mesh, &coord)) >= 0) {
      TSR_CHECK(tsr_dtensor_check_placements(mesh, placements, x->ndim));
      return tsr_redistribute_from_slice(r, x, mesh, k, coord, placements, out);
    }
    return TSR_ERROR(TSR_EINVAL,
                     "redistribute between meshes of different shapes (%s and %s): a move needs "
                     "the same dims and sizes, or one mesh a slice of the other (tsr_mesh_unbind)",
                     tsr_mesh_str(x->mesh, a, sizeof a), tsr_mesh_str(mesh, b, sizeof b));
  }
  bool cross = !tsr_mesh_equal(x->mesh, mesh);
  if (cross && !meshes_disjoint(x->mesh, mesh))
    return TSR_ERROR(TSR_EINVAL,
                     "cross-mesh redistribute from %s to %s: the meshes share ranks; a move is "
                     "between meshes on different ranks (e.g. two pipeline stages)",
                     tsr_mesh_str(x->mesh, a, sizeof a), tsr_mesh_str(mesh, b, sizeof b));
  TSR_CHECK(tsr_dtensor_check_placements(mesh, placements, x->ndim));
  int me = tsr_rank_id(r);
  bool in_src = tsr_mesh_contains(x->mesh, me), in_dst = tsr_mesh_contains(mesh, me);
  if (in_src && !x->local)
    return TSR_ERROR(TSR_EINVAL, "redistribute on rank %d: the DTensor has no local tensor", me);
  plan_state s = {.r = r, .x = *x};
  s.x.local = NULL;
  tsr_status st = TSR_OK;
  if (in_src) {
    TSR_CHECK(tsr_tensor_clone(x->local, &s.x.local));
    tsr_mesh_coords(x->mesh, me, s.coords);
  }
  if (cross) TSR_CHECK_GOTO(move_cross_mesh(&s, mesh), st);
  if (in_dst) {
    TSR_CHECK_GOTO(plan_same_mesh(&s, placements), st);
  } else {
    tsr_tensor_free(s.x.local);
    s.x.local = NULL;
    for (int i = 0; i < tsr_mesh_ndim(mesh); i++) s.x.placements[i] = placements[i];
  }
  *out = malloc(sizeof **out);
  if (!*out) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory allocating a DTensor");
    goto cleanup;
  }
  **out = s.x;
  return TSR_OK;
cleanup:
  tsr_tensor_free(s.x.local);
  return st;
}

tsr_status tsr_dtensor_redistribute_by_dict(tsr_rank_t *r, const tsr_dtensor *x,
                                            const tsr_mesh_t *mesh, int n, const char *const *names,
                                            const tsr_placement *placements, tsr_dtensor **out) {
  tsr_placement tgt[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    int j = tsr_mesh_find_dim(x->mesh, tsr_mesh_dim_name(mesh, i));
    tgt[i] = j >= 0 ? x->placements[j] : tsr_replicate();
  }
  for (int k = 0; k < n; k++) {
    int i = tsr_mesh_find_dim(mesh, names[k]);
    if (i >= 0) tgt[i] = placements[k]; /* names the mesh lacks are ignored, as the seed's API */
  }
  return tsr_dtensor_redistribute(r, x, mesh, tgt, out);
}

tsr_status tsr_dtensor_redistribute_adjoint(tsr_rank_t *r, const tsr_dtensor *grad,
                                            const tsr_mesh_t *src_mesh,
                                            const tsr_placement *src_placements,
                                            tsr_dtensor **out) {
  tsr_placement back[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(src_mesh); i++)
    back[i] = src_placements[i].kind == TSR_PARTIAL ? tsr_replicate() : src_placements[i];
  return tsr_dtensor_redistribute(r, grad, src_mesh, back, out);
}
