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
 *
 * Devices: tensor memory is only ever touched by the collectives and by the kernel table of the
 * tensors' device (tessera/device.h: the kernels of tessera/kernels.h, one pointer each), every
 * buffer is a tensor beside q (tsr_tensor_scratch_allocator: host memory for a host q, q's device
 * otherwise), and the positions are built on the host and moved in (tsr_tensor_from_i32). So the
 * rule runs unchanged on the CPU, on CUDA and on the emulated device (`device = emu`), where a run
 * equals the CPU run bit for bit: the CPU table holds the tsr_kernel_* functions themselves.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_allgather_impl.h"
#include "tessera/device.h"

/* Every tensor is on q's device. */
typedef struct ag_saved {
  int B, Lq, Lk, Hq, Hkv, D;
  bool causal;
  tsr_tensor *q_pos, *k_pos; /* (Lq), (Lk) i32: global sequence positions */
  tsr_tensor *q;             /* (B, Hq, Lq, D) */
  tsr_tensor *k, *v;         /* (B, Hkv, Lk, D) gathered; NULL with regather_backward */
  tsr_tensor *out, *lse;     /* (B, Hq, Lq, D), (B, Hq, Lq) */
} ag_saved;

void ag_sdpa_saved_free(void *p) {
  ag_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->q_pos);
  tsr_tensor_free(s->k_pos);
  tsr_tensor_free(s->q);
  tsr_tensor_free(s->k);
  tsr_tensor_free(s->v);
  tsr_tensor_free(s->out);
  tsr_tensor_free(s->lse);
  free(s);
}

/* Device pointers: only the kernel table dereferences them. */
static void *data(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* A new zero-filled f32 tensor beside `near`, on its device. */
static tsr_status scratch(const tsr_tensor *near, int ndim, const int64_t *shape, const char *what,
                          tsr_tensor **out) {
  tsr_status st = tsr_tensor_new(tsr_tensor_scratch_allocator(near), TSR_F32, ndim, shape, out);
  return st == TSR_OK ? st : tsr_error_prefix(st, "cp_allgather: %s", what);
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

/* Global positions along the sequence (tensor dim 1) of the rows this rank holds of x: built on
 * the host, then an i32 tensor beside `near`. */
static tsr_status positions(tsr_rank_t *r, const tsr_dtensor *x, const tsr_tensor *near,
                            tsr_tensor **pos) {
  int64_t shape[TSR_MAX_DIMS], start[TSR_MAX_DIMS];
  if (!tsr_dtensor_local_shape(x->mesh, x->placements, x->ndim, x->shape, tsr_rank_id(r), shape,
                               start))
    return TSR_ERROR(TSR_EINVAL, "cp_allgather: rank %d is not in the attention's mesh",
                     tsr_rank_id(r));
  int32_t *host = malloc(sizeof(int32_t) * (size_t)(shape[1] + 1));
  if (!host)
    return TSR_ERROR(TSR_ENOMEM, "cp_allgather: out of memory for %lld positions",
                     (long long)shape[1]);
  for (int64_t i = 0; i < shape[1]; i++) host[i] = (int32_t)(start[1] + i);
  tsr_status st = tsr_tensor_from_i32(tsr_tensor_scratch_allocator(near), shape[1], host, pos);
  free(host);
  return st == TSR_OK ? st
                      : tsr_error_prefix(st, "cp_allgather: %lld positions", (long long)shape[1]);
}

/* The gathered K and V of this rank, (B, Hkv, Lk, D) each beside `near`, and optionally their
 * positions. On failure *kb and *vb are NULL; *k_pos is the caller's to free. */
static tsr_status gather_kv(tsr_rank_t *r, int dim, const tsr_dtensor *k, const tsr_dtensor *v,
                            const ag_saved *s, const tsr_tensor *near, tsr_tensor **kb,
                            tsr_tensor **vb, tsr_tensor **k_pos) {
  tsr_dtensor *kg = NULL, *vg = NULL;
  tsr_status st = TSR_OK;
  const int64_t shape[4] = {s->B, s->Hkv, s->Lk, s->D};
  *kb = *vb = NULL;
  TSR_CHECK_GOTO(move_dim(r, k, dim, tsr_replicate(), &kg), st);
  TSR_CHECK_GOTO(move_dim(r, v, dim, tsr_replicate(), &vg), st);
  if (kg->local->shape[1] != s->Lk) {
    st = TSR_ERROR(TSR_EINTERNAL, "cp_allgather: gathered %lld key rows, expected %d",
                   (long long)kg->local->shape[1], s->Lk);
    goto cleanup;
  }
  if (k_pos) TSR_CHECK_GOTO(positions(r, kg, near, k_pos), st);
  TSR_CHECK_GOTO(scratch(near, 4, shape, "the gathered K", kb), st);
  TSR_CHECK_GOTO(scratch(near, 4, shape, "the gathered V", vb), st);
  const tsr_kernel_table *kt = tsr_kernel_table_of(kg->local);
  kt->blhd_to_bhld(data(*kb), data(kg->local), s->B, s->Lk, s->Hkv, s->D);
  kt->blhd_to_bhld(data(*vb), data(vg->local), s->B, s->Lk, s->Hkv, s->D);
cleanup:
  if (st != TSR_OK) {
    tsr_tensor_free(*kb);
    tsr_tensor_free(*vb);
    *kb = *vb = NULL;
  }
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
  *saved = s; /* freed by the core when this fails */
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
  TSR_CHECK(positions(r, q, q->local, &s->q_pos));
  tsr_tensor *k_full = NULL, *v_full = NULL;
  TSR_CHECK(gather_kv(r, dim, k, v, s, q->local, &k_full, &v_full, &s->k_pos));
  if (!state->regather) {
    s->k = k_full;
    s->v = v_full;
  }
  const int64_t qshape[4] = {s->B, s->Hq, s->Lq, s->D}, lshape[3] = {s->B, s->Hq, s->Lq};
  const char *what = "the tensors attention saves for backward";
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(scratch(q->local, 4, qshape, what, &s->q), st);
  TSR_CHECK_GOTO(scratch(q->local, 4, qshape, what, &s->out), st);
  TSR_CHECK_GOTO(scratch(q->local, 3, lshape, what, &s->lse), st);
  const tsr_kernel_table *kt = tsr_kernel_table_of(q->local);
  kt->blhd_to_bhld(data(s->q), data(q->local), s->B, s->Lq, s->Hq, s->D);
  TSR_CHECK_GOTO(kt->attention_forward(data(s->out), data(s->lse), data(s->q), data(k_full),
                                       data(v_full), data(s->q_pos), data(s->k_pos), s->B, s->Hq,
                                       s->Hkv, s->Lq, s->Lk, s->D, s->causal),
                 st);
  kt->bhld_to_blhd(data((*out)->local), data(s->out), s->B, s->Lq, s->Hq, s->D);
cleanup:
  if (state->regather) { /* backward gathers them again */
    tsr_tensor_free(k_full);
    tsr_tensor_free(v_full);
  }
  return st;
}

/* grad (B, Hkv, Lk, D) of the gathered rows, summed over the dim and split back to x's rows. */
static tsr_status reduce_scatter(tsr_rank_t *r, int dim, const tsr_dtensor *x,
                                 const tsr_tensor *grad, const ag_saved *s, tsr_dtensor **out) {
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = tsr_partial(TSR_REDUCE_SUM);
  int64_t shape[4] = {s->B, s->Lk, s->Hkv, s->D};
  tsr_tensor *t = NULL;
  tsr_dtensor *part = NULL;
  tsr_status st = tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 4, shape, &t);
  if (st != TSR_OK) return tsr_error_prefix(st, "cp_allgather: the gradient to reduce-scatter");
  tsr_kernel_table_of(t)->bhld_to_blhd(data(t), data(grad), s->B, s->Lk, s->Hkv, s->D);
  st = tsr_dtensor_from_local(r, x->mesh, t, x->shape, p, &part);
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
  tsr_tensor *kb = s->k, *vb = s->v;
  if (!kb) TSR_CHECK(gather_kv(r, dim, k, v, s, s->q, &kb, &vb, NULL));
  const int64_t qshape[4] = {s->B, s->Hq, s->Lq, s->D}, kshape[4] = {s->B, s->Hkv, s->Lk, s->D};
  const char *what = "the scratch of attention backward";
  tsr_tensor *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  tsr_status st = TSR_OK;
  /* zero-filled: the kernel accumulates into dq, dk, dv */
  TSR_CHECK_GOTO(scratch(s->q, 4, qshape, what, &dout), st);
  TSR_CHECK_GOTO(scratch(s->q, 4, qshape, what, &dq), st);
  TSR_CHECK_GOTO(scratch(s->q, 4, kshape, what, &dk), st);
  TSR_CHECK_GOTO(scratch(s->q, 4, kshape, what, &dv), st);
  const tsr_kernel_table *kt = tsr_kernel_table_of(s->q);
  kt->blhd_to_bhld(data(dout), data(gouts[0]->local), s->B, s->Lq, s->Hq, s->D);
  TSR_CHECK_GOTO(kt->attention_backward(data(dq), data(dk), data(dv), data(dout), data(s->q),
                                        data(kb), data(vb), data(s->out), data(s->lse),
                                        data(s->q_pos), data(s->k_pos), s->B, s->Hq, s->Hkv, s->Lq,
                                        s->Lk, s->D, s->causal),
                 st);
  kt->bhld_to_blhd(data(gins[0]->local), data(dq), s->B, s->Lq, s->Hq, s->D);
  TSR_CHECK_GOTO(reduce_scatter(r, dim, k, dk, s, &gins[1]), st);
  TSR_CHECK_GOTO(reduce_scatter(r, dim, v, dv, s, &gins[2]), st);
cleanup:
  tsr_tensor_free(dout);
  tsr_tensor_free(dq);
  tsr_tensor_free(dk);
  tsr_tensor_free(dv);
  if (kb != s->k) {
    tsr_tensor_free(kb);
    tsr_tensor_free(vb);
  }
  return st;
}
