/* All-gather attention: q, k and v sharded along the sequence over the plugin's dim.
 *
 * Forward: K and V are all-gathered over the dim (a DTensor redistribute Shard(1) -> Replicate on
 * that dim only, so other dims that shard the sequence or the heads keep their split), and each
 * rank attends from its own query rows to every key row it now holds. The causal mask compares
 * global positions (k_pos <= q_pos), which the shards' offsets give: the queries start where this
 * rank's chunk starts, the gathered keys where the gathered extent starts.
 *
 * Backward: the kernel gives dQ for the local queries and each rank's contribution to the
 * gradient of every gathered key row. Those contributions are a Partial(sum) over the dim; a
 * redistribute to the inputs' Shard(1) is the reduce-scatter that sums them and hands each rank
 * the rows it owns (the adjoint of the forward all-gather).
 *
 * Bytes one rank sends per attention, with K the bytes of the whole gathered K (as V):
 *   forward  (n-1)/n · 2K        backward  (n-1)/n · 2K, plus (n-1)/n · 2K with regather_backward
 */
#include <stdlib.h>
#include <string.h>

#include "cp_allgather_impl.h"
#include "tessera/kernels.h"

typedef struct ag_saved {
  int B, Lq, Lk, Hq, Hkv, D;
  bool causal;
  int32_t *q_pos, *k_pos; /* (Lq), (Lk): global sequence positions */
  float *q;               /* (B, Hq, Lq, D) */
  float *k, *v;           /* (B, Hkv, Lk, D) gathered; NULL with regather_backward */
  float *out, *lse;       /* (B, Hq, Lq, D), (B, Hq, Lq) */
} ag_saved;

void ag_sdpa_saved_free(void *p) {
  ag_saved *s = p;
  if (!s) return;
  free(s->q_pos);
  free(s->k_pos);
  free(s->q);
  free(s->k);
  free(s->v);
  free(s->out);
  free(s->lse);
  free(s);
}

/* x with Shard(1) on `dim` replaced by `p`, redistributed: the all-gather (p = Replicate) and
 * the reduce-scatter (x Partial, p = Shard(1)) of this file. */
static tsr_status move_dim(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement p,
                           tsr_dtensor **out) {
  tsr_placement to[TSR_MAX_MESH_DIMS];
  memcpy(to, x->placements, sizeof to);
  to[dim] = p;
  return tsr_dtensor_redistribute(r, x, x->mesh, to, out);
}

/* Global positions along the sequence (tensor dim 1) of the rows this rank holds of x. */
static tsr_status positions(tsr_rank_t *r, const tsr_dtensor *x, int32_t **pos) {
  int64_t shape[TSR_MAX_DIMS], start[TSR_MAX_DIMS];
  if (!tsr_dtensor_local_shape(x->mesh, x->placements, x->ndim, x->shape, tsr_rank_id(r), shape,
                               start))
    return TSR_ERROR(TSR_EINVAL, "cp_allgather: rank %d is not in the attention's mesh",
                     tsr_rank_id(r));
  *pos = malloc(sizeof(int32_t) * (size_t)(shape[1] + 1));
  if (!*pos)
    return TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory for %lld positions",
                     (long long)shape[1]);
  for (int64_t i = 0; i < shape[1]; i++) (*pos)[i] = (int32_t)(start[1] + i);
  return TSR_OK;
}

static float *alloc_f32(size_t n) {
  return malloc(sizeof(float) * (n + 1));
}

/* The gathered K and V of this rank, (B, Hkv, Lk, D) each, and optionally their positions. */
static tsr_status gather_kv(tsr_rank_t *r, int dim, const tsr_dtensor *k, const tsr_dtensor *v,
                            const ag_saved *s, float **kb, float **vb, int32_t **k_pos) {
  tsr_dtensor *kg = NULL, *vg = NULL;
  tsr_status st = TSR_OK;
  size_t nk = (size_t)s->B * s->Hkv * s->Lk * s->D;
  TSR_CHECK_GOTO(move_dim(r, k, dim, tsr_replicate(), &kg), st);
  TSR_CHECK_GOTO(move_dim(r, v, dim, tsr_replicate(), &vg), st);
  if (kg->local->shape[1] != s->Lk) {
    st = TSR_ERROR(TSR_EINTERNAL, "cp_allgather: gathered %lld key rows, expected %d",
                   (long long)kg->local->shape[1], s->Lk);
    goto cleanup;
  }
  if (k_pos) TSR_CHECK_GOTO(positions(r, kg, k_pos), st);
  *kb = alloc_f32(nk);
  *vb = alloc_f32(nk);
  if (!*kb || !*vb) {
    free(*kb);
    free(*vb);
    *kb = *vb = NULL;
    st = TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory for the gathered K and V");
    goto cleanup;
  }
  tsr_kernel_blhd_to_bhld(*kb, tsr_tensor_data(kg->local), s->B, s->Lk, s->Hkv, s->D);
  tsr_kernel_blhd_to_bhld(*vb, tsr_tensor_data(vg->local), s->B, s->Lk, s->Hkv, s->D);
cleanup:
  tsr_dtensor_free(kg);
  tsr_dtensor_free(vg);
  return st;
}

/* The length of the gathered sequence on this rank: k's global length split only by the other
 * dims that shard it. */
static tsr_status gathered_rows(tsr_rank_t *r, const tsr_dtensor *k, int dim, int *rows) {
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, k->placements, sizeof p);
  p[dim] = tsr_replicate();
  int64_t shape[TSR_MAX_DIMS], start[TSR_MAX_DIMS];
  if (!tsr_dtensor_local_shape(k->mesh, p, k->ndim, k->shape, tsr_rank_id(r), shape, start))
    return TSR_ERROR(TSR_EINVAL, "cp_allgather: rank %d is not in the attention's mesh",
                     tsr_rank_id(r));
  *rows = (int)shape[1];
  return TSR_OK;
}

tsr_status ag_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved,
                           void *ctx) {
  (void)nin, (void)nout;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  const tsr_sdpa_attrs *a = attrs;
  const ag_state *state = ctx;
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, out));
  if (!q->local) return TSR_OK;
  ag_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory saving attention");
  *saved = s;
  const int64_t *ql = q->local->shape, *kl = k->local->shape;
  s->B = (int)ql[0];
  s->Lq = (int)ql[1];
  s->Hq = (int)ql[2];
  s->D = (int)ql[3];
  s->Hkv = (int)kl[2];
  s->causal = a->causal;
  if (q->dtype != TSR_F32 || k->dtype != TSR_F32 || v->dtype != TSR_F32)
    return TSR_ERROR(TSR_ENOTSUP, "cp_allgather: attention takes f32 q, k, v");
  if (s->Hkv == 0 || s->Hq % s->Hkv || kl[0] != ql[0] || kl[3] != ql[3])
    return TSR_ERROR(TSR_EINVAL,
                     "cp_allgather: local q has %d heads and k %d (batch %d / %d, head dim %d / "
                     "%d); the query heads must be a multiple of the kv heads",
                     s->Hq, s->Hkv, s->B, (int)kl[0], s->D, (int)kl[3]);
  TSR_CHECK(gathered_rows(r, k, dim, &s->Lk));
  TSR_CHECK(positions(r, q, &s->q_pos));
  float *k_full = NULL, *v_full = NULL;
  TSR_CHECK(gather_kv(r, dim, k, v, s, &k_full, &v_full, &s->k_pos));
  if (!state->regather) {
    s->k = k_full;
    s->v = v_full;
  }
  size_t nq = (size_t)s->B * s->Hq * s->Lq * s->D, rows = (size_t)s->B * s->Hq * s->Lq;
  s->q = alloc_f32(nq);
  s->out = alloc_f32(nq);
  s->lse = alloc_f32(rows);
  tsr_status st = TSR_OK;
  if (!s->q || !s->out || !s->lse) {
    st = TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory for attention");
  } else {
    tsr_kernel_blhd_to_bhld(s->q, tsr_tensor_data(q->local), s->B, s->Lq, s->Hq, s->D);
    st = tsr_kernel_attention_forward(s->out, s->lse, s->q, k_full, v_full, s->q_pos, s->k_pos,
                                      s->B, s->Hq, s->Hkv, s->Lq, s->Lk, s->D, s->causal);
  }
  if (st == TSR_OK)
    tsr_kernel_bhld_to_blhd(tsr_tensor_data((*out)->local), s->out, s->B, s->Lq, s->Hq, s->D);
  if (state->regather) {
    free(k_full);
    free(v_full);
  }
  return st;
}

/* grad (B, Hkv, Lk, D) of the gathered rows, summed over the dim and split back to x's rows. */
static tsr_status reduce_scatter(tsr_rank_t *r, int dim, const tsr_dtensor *x, const float *grad,
                                 const ag_saved *s, tsr_dtensor **out) {
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = tsr_partial(TSR_REDUCE_SUM);
  int64_t shape[4] = {s->B, s->Lk, s->Hkv, s->D};
  tsr_tensor *t = NULL;
  tsr_dtensor *part = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 4, shape, &t));
  tsr_kernel_bhld_to_blhd(tsr_tensor_data(t), grad, s->B, s->Lk, s->Hkv, s->D);
  tsr_status st = tsr_dtensor_from_local(r, x->mesh, t, x->shape, p, &part);
  if (st != TSR_OK) {
    tsr_tensor_free(t);
    return st;
  }
  st = move_dim(r, part, dim, tsr_shard(1), out);
  tsr_dtensor_free(part);
  return st;
}

tsr_status ag_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                            void *ctx) {
  (void)nin, (void)attrs, (void)nout, (void)outs, (void)ctx;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  if (!gouts[0]) return TSR_OK;
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, &gins[0]));
  if (!q->local) {
    /* off the mesh: no local tensors, but the gradients must exist with the right metadata */
    TSR_CHECK(tsr_dtensor_zeros(r, k->mesh, TSR_F32, 4, k->shape, k->placements, &gins[1]));
    return tsr_dtensor_zeros(r, v->mesh, TSR_F32, 4, v->shape, v->placements, &gins[2]);
  }
  const ag_saved *s = saved;
  float *kb = s->k, *vb = s->v;
  if (!kb) TSR_CHECK(gather_kv(r, dim, k, v, s, &kb, &vb, NULL));
  size_t nq = (size_t)s->B * s->Hq * s->Lq * s->D, nk = (size_t)s->B * s->Hkv * s->Lk * s->D;
  float *work = calloc(2 * nq + 2 * nk + 1, sizeof(float));
  tsr_status st = TSR_OK;
  if (!work) {
    st = TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory for attention backward");
    goto cleanup;
  }
  float *dout = work, *dq = dout + nq, *dk = dq + nq, *dv = dk + nk;
  tsr_kernel_blhd_to_bhld(dout, tsr_tensor_data(gouts[0]->local), s->B, s->Lq, s->Hq, s->D);
  TSR_CHECK_GOTO(tsr_kernel_attention_backward(dq, dk, dv, dout, s->q, kb, vb, s->out, s->lse,
                                               s->q_pos, s->k_pos, s->B, s->Hq, s->Hkv, s->Lq,
                                               s->Lk, s->D, s->causal),
                 st);
  tsr_kernel_bhld_to_blhd(tsr_tensor_data(gins[0]->local), dq, s->B, s->Lq, s->Hq, s->D);
  TSR_CHECK_GOTO(reduce_scatter(r, dim, k, dk, s, &gins[1]), st);
  TSR_CHECK_GOTO(reduce_scatter(r, dim, v, dv, s, &gins[2]), st);
cleanup:
  free(work);
  if (kb != s->k) {
    free(kb);
    free(vb);
  }
  return st;
}
