/* Gradient buckets: the data-parallel sync started from the tape's gradient hook.
 *
 * A parameter's gradient leaves backward Partial(sum) on the dp dims (the sum over the batch
 * shards). As soon as the tape says no node still to run adds to it, the hook files it in this
 * rank's bucket; a bucket goes out as one collective sequence once it holds bucket_mb, and the
 * last one when backward ends. Replicated parameters get one all-reduce of the concatenated
 * gradients; FSDP ones one reduce-scatter whose chunk i is every gradient's rows for shard i
 * (FSDP's flat parameter), followed under HSDP by an all-reduce of the shards over
 * dp_replicate. The result is the gradient tsr_var_resolve_grad would have made, so the later
 * resolve finds nothing left to do.
 *
 * With the local backend a collective runs when its last member arrives, on the calling ranks'
 * threads: "started while backward runs" means issued from inside backward in bucket order,
 * between the layers' gradient computations, not run concurrently with them.
 */
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

static const tsr_placement P_SUM = {TSR_PARTIAL, 0, TSR_REDUCE_SUM};

static bool is_sum(tsr_placement p) {
  return tsr_placement_equal(p, P_SUM);
}

static bool is_shard0(tsr_placement p) {
  return p.kind == TSR_SHARD && p.dim == 0;
}

/* How a gradient reaches its parameter's placements on the dp dims. *ar_mask: dims to all-reduce
 * (Partial -> Replicate), *rs_dim: the dim to reduce-scatter (Partial -> Shard(0)) or -1.
 * *fast is false when one bucketed reduce-scatter cannot make the parameter's layout (another dim
 * splits the rows inside dp_shard, or the gradient is placed otherwise): the planner does it. */
static void classify(const tsr_var *leaf, uint32_t *ar_mask, int *rs_dim, bool *fast) {
  const tsr_dtensor *x = leaf->value, *g = leaf->grad;
  const tsr_mesh_t *m = x->mesh;
  *ar_mask = 0;
  *rs_dim = -1;
  *fast = g->dtype == TSR_F32 && tsr_tensor_is_contiguous(g->local) && g->local->ndim >= 1;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    tsr_placement gp = g->placements[i], xp = x->placements[i];
    if (tsr_mesh_dim_size(m, i) == 1 || tsr_placement_equal(gp, xp)) continue;
    if (!dp_owns(tsr_mesh_dim_name(m, i))) {
      *fast = false; /* another strategy's dim; its resolve comes later */
      continue;
    }
    if (is_sum(gp) && xp.kind == TSR_REPLICATE) {
      *ar_mask |= 1u << i;
    } else if (is_sum(gp) && is_shard0(xp) && *rs_dim < 0) {
      *rs_dim = i;
    } else {
      *fast = false;
      *ar_mask |= 1u << i; /* marks work for the planner */
    }
  }
  if (*rs_dim < 0) return;
  /* the reduce-scatter chunks the local rows: right when dp_shard splits them last */
  for (int i = *rs_dim + 1; i < tsr_mesh_ndim(m); i++)
    if (tsr_mesh_dim_size(m, i) > 1 && is_shard0(x->placements[i])) *fast = false;
}

/* The planner's way, for gradients a bucket cannot take: the dp dims go to the parameter's
 * placements now, the other dims stay for tsr_var_resolve_grad. */
static tsr_status sync_alone(tsr_rank_t *r, tsr_var *leaf) {
  const tsr_dtensor *x = leaf->value;
  tsr_placement want[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(x->mesh); i++)
    want[i] = dp_owns(tsr_mesh_dim_name(x->mesh, i)) ? x->placements[i] : leaf->grad->placements[i];
  tsr_dtensor *g = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(r, leaf->grad, x->mesh, want, &g));
  tsr_dtensor_free(leaf->grad);
  leaf->grad = g;
  return TSR_OK;
}

static int64_t inner_of(const tsr_tensor *t) {
  int64_t inner = 1;
  for (int d = 1; d < t->ndim; d++) inner *= t->shape[d];
  return inner;
}

/* dst[dst_at ..] = src[src_at ..] for n elements of two contiguous tensors, as flat views, so
 * the bytes move through tsr_tensor_copy on whatever device the tensors live. */
static tsr_status copy_flat(tsr_tensor *dst, int64_t dst_at, const tsr_tensor *src, int64_t src_at,
                            int64_t n) {
  int64_t dn = tsr_tensor_numel(dst), sn = tsr_tensor_numel(src);
  tsr_tensor *df = NULL, *sf = NULL, *dv = NULL, *sv = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_tensor_reshape(dst, 1, &dn, &df), st);
  TSR_CHECK_GOTO(tsr_tensor_reshape(src, 1, &sn, &sf), st);
  TSR_CHECK_GOTO(tsr_tensor_narrow(df, 0, dst_at, n, &dv), st);
  TSR_CHECK_GOTO(tsr_tensor_narrow(sf, 0, src_at, n, &sv), st);
  st = tsr_tensor_copy(dv, sv);
cleanup:
  tsr_tensor_free(sv);
  tsr_tensor_free(dv);
  tsr_tensor_free(sf);
  tsr_tensor_free(df);
  return st;
}

/* All-reduce of the bucket's gradients, concatenated, in place. */
static tsr_status flush_all_reduce(tsr_rank_t *r, dp_bucket *b, tsr_group_t *ga) {
  int64_t total = 0;
  for (int k = 0; k < b->n; k++) total += tsr_tensor_numel(b->vars[k]->grad->local);
  tsr_tensor *flat = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &total, &flat));
  float *f = tsr_tensor_data(flat);
  int64_t at = 0;
  tsr_status st = TSR_OK;
  for (int k = 0; st == TSR_OK && k < b->n; k++) {
    const tsr_tensor *l = b->vars[k]->grad->local;
    st = copy_flat(flat, at, l, 0, tsr_tensor_numel(l));
    at += tsr_tensor_numel(l);
  }
  if (st == TSR_OK) st = tsr_comm_all_reduce(ga, f, f, (size_t)total, TSR_F32, TSR_REDUCE_SUM);
  at = 0;
  for (int k = 0; st == TSR_OK && k < b->n; k++) {
    tsr_dtensor *g = b->vars[k]->grad;
    st = copy_flat(g->local, 0, flat, at, tsr_tensor_numel(g->local));
    at += tsr_tensor_numel(g->local);
    for (int i = 0; i < tsr_mesh_ndim(b->mesh); i++)
      if (b->ar_mask & (1u << i)) g->placements[i] = tsr_replicate();
  }
  tsr_tensor_free(flat);
  return st;
}

/* Reduce-scatter over b->rs_dim of the bucket: chunk i of the send buffer is every gradient's
 * rows for member i, so each member receives its shard of every gradient in one call; then, for
 * HSDP, the all-reduce of those shards over the replica dims. */
static tsr_status flush_reduce_scatter(tsr_rank_t *r, dp_bucket *b, tsr_group_t *gs,
                                       tsr_group_t *ga) {
  int n = tsr_group_size(gs), me = tsr_group_index(gs);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  tsr_tensor *send = NULL, *recv = NULL;
  tsr_status st = TSR_OK;
  if (!counts) return TSR_ERROR(TSR_ENOMEM, "dp: out of memory for a bucket over %d ranks", n);
  int64_t total = 0;
  for (int k = 0; k < b->n; k++) {
    const tsr_tensor *l = b->vars[k]->grad->local;
    total += tsr_tensor_numel(l);
    for (int i = 0; i < n; i++)
      counts[i] += (size_t)(tsr_chunk_size(l->shape[0], n, i) * inner_of(l));
  }
  int64_t mine = (int64_t)counts[me];
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &total, &send), st);
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &mine, &recv), st);
  float *s = tsr_tensor_data(send), *v = tsr_tensor_data(recv);
  int64_t at = 0;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < b->n; k++) {
      const tsr_tensor *l = b->vars[k]->grad->local;
      int64_t inner = inner_of(l), rows = tsr_chunk_size(l->shape[0], n, i);
      TSR_CHECK_GOTO(
          copy_flat(send, at, l, tsr_chunk_start(l->shape[0], n, i) * inner, rows * inner), st);
      at += rows * inner;
    }
  TSR_CHECK_GOTO(tsr_comm_reduce_scatter(gs, s, v, counts[me], counts, TSR_F32, TSR_REDUCE_SUM),
                 st);
  tsr_tensor_free(send);
  send = NULL;
  if (ga) TSR_CHECK_GOTO(tsr_comm_all_reduce(ga, v, v, counts[me], TSR_F32, TSR_REDUCE_SUM), st);
  at = 0;
  for (int k = 0; k < b->n; k++) {
    tsr_var *p = b->vars[k];
    const tsr_dtensor *g = p->grad;
    int64_t shape[TSR_MAX_DIMS];
    memcpy(shape, g->local->shape, sizeof shape);
    shape[0] = tsr_chunk_size(shape[0], n, me);
    tsr_placement pl[TSR_MAX_MESH_DIMS];
    memcpy(pl, g->placements, sizeof pl);
    for (int i = 0; i < tsr_mesh_ndim(b->mesh); i++)
      if (b->ar_mask & (1u << i)) pl[i] = tsr_replicate();
    pl[b->rs_dim] = tsr_shard(0);
    tsr_tensor *local = NULL;
    tsr_dtensor *d = NULL;
    TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, g->local->ndim, shape, &local),
                   st);
    if (tsr_tensor_numel(local) != tsr_tensor_numel(p->value->local)) {
      tsr_tensor_free(local);
      st = TSR_ERROR(TSR_EINTERNAL,
                     "dp: shard of %s's gradient has %lld elements, the "
                     "parameter's %lld",
                     p->name ? p->name : "(unnamed)", (long long)tsr_tensor_numel(local),
                     (long long)tsr_tensor_numel(p->value->local));
      goto cleanup;
    }
    st = copy_flat(local, 0, recv, at, tsr_tensor_numel(local));
    if (st != TSR_OK) {
      tsr_tensor_free(local);
      goto cleanup;
    }
    at += tsr_tensor_numel(local);
    st = tsr_dtensor_from_local(r, b->mesh, local, g->shape, pl, &d);
    if (st != TSR_OK) {
      tsr_tensor_free(local);
      goto cleanup;
    }
    tsr_dtensor_free(p->grad);
    p->grad = d;
  }
cleanup:
  tsr_tensor_free(send);
  tsr_tensor_free(recv);
  free(counts);
  return st;
}

static tsr_status flush(tsr_rank_t *r, dp_bucket *b) {
  if (b->n == 0) return TSR_OK;
  tsr_comm_t *c = tsr_rank_comm(r);
  tsr_group_t *ga = NULL, *gs = NULL;
  tsr_status st = TSR_OK;
  if (b->ar_mask) st = tsr_mesh_group(b->mesh, c, b->ar_mask, &ga);
  if (st == TSR_OK && b->rs_dim >= 0) st = tsr_mesh_group(b->mesh, c, 1u << b->rs_dim, &gs);
  if (st == TSR_OK) st = gs ? flush_reduce_scatter(r, b, gs, ga) : flush_all_reduce(r, b, ga);
  b->n = 0;
  b->bytes = 0;
  if (st != TSR_OK) return tsr_error_prefix(st, "dp: gradient bucket");
  return TSR_OK;
}

static dp_bucket *bucket_of(dp_state *s, tsr_rank_t *r) {
  int id = tsr_rank_id(r);
  return id >= 0 && id < s->world ? &s->buckets[id] : NULL;
}

tsr_status dp_grad_ready(tsr_rank_t *r, tsr_var *leaf, void *ctx) {
  dp_state *s = ctx;
  /* not reached by this backward, or a pipeline stage this rank does not hold */
  if (!s->overlap || !leaf->grad || !leaf->grad->local || !leaf->value->local) return TSR_OK;
  uint32_t ar;
  int rs;
  bool fast;
  classify(leaf, &ar, &rs, &fast);
  if (!ar && rs < 0) return TSR_OK;
  if (!fast) return sync_alone(r, leaf);
  dp_bucket *b = bucket_of(s, r);
  if (!b)
    return TSR_ERROR(TSR_EINTERNAL, "dp: rank %d outside the job's %d ranks", tsr_rank_id(r),
                     s->world);
  if (b->n && (b->ar_mask != ar || b->rs_dim != rs || !tsr_mesh_equal(b->mesh, leaf->value->mesh)))
    TSR_CHECK(flush(r, b));
  if (b->n == b->cap) {
    int cap = b->cap ? 2 * b->cap : 16;
    tsr_var **v = realloc(b->vars, sizeof *v * (size_t)cap);
    if (!v) return TSR_ERROR(TSR_ENOMEM, "dp: out of memory growing a gradient bucket");
    b->vars = v;
    b->cap = cap;
  }
  b->mesh = leaf->value->mesh;
  b->ar_mask = ar;
  b->rs_dim = rs;
  b->vars[b->n++] = leaf;
  b->bytes += tsr_tensor_nbytes(leaf->grad->local);
  return b->bytes >= s->bucket_bytes ? flush(r, b) : TSR_OK;
}

tsr_status dp_grad_done(tsr_rank_t *r, void *ctx) {
  dp_state *s = ctx;
  dp_bucket *b = bucket_of(s, r);
  return b ? flush(r, b) : TSR_OK;
}

void dp_buckets_free(dp_state *s) {
  for (int i = 0; s->buckets && i < s->world; i++) free(s->buckets[i].vars);
}
