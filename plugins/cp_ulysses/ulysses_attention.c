/* Ulysses attention: q, k, v sharded along the sequence over the Ulysses dim.
 *
 * One all-to-all per tensor moves the Ulysses shard from the sequence to the heads, so each rank
 * holds the whole sequence (as far as this dim is concerned) for 1/n of the heads; attention runs
 * there, and one all-to-all moves the output back. Both moves are DTensor redistributes,
 * Shard(1) <-> Shard(2) on this dim, and their adjoints carry the gradients back.
 *
 * With fewer kv heads on a rank than ranks on the dim (and the ranks a multiple of them), each kv
 * head is repeated until there is one per rank before the move: the query heads a rank receives
 * all read the kv head it receives. The repeats' gradients are summed back into the kv head.
 *
 * After the move the sequence may still be sharded on another dim that has its own attention
 * rule (ring attention on ring_cp): the call is handed to that rule with the head-sharded inputs,
 * which is "Ulysses inside, ring across" for either order of the two dims in the mesh.
 *
 * Document masking (sdpa_doc, segment ids (B, L) as a fourth input placed as q's rows): the ids
 * are gathered along this dim, as the move makes the sequence whole here, and go with the call
 * to the ring or to the local kernels with segment ids.
 *
 * Tensor memory is only ever touched through the kernel table of the tensors' device, and the
 * scratch lives beside them, so the rule runs unchanged on the CPU, the emulated device and CUDA.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_ulysses_impl.h"

/* Attention computed here when no other dim communicates: whole sequence, local heads. The
 * buffers live beside q (host memory for a host q, q's device otherwise). */
typedef struct local_attn {
  int B, L, Hq, Hkv, D;
  tsr_tensor *q, *k, *v, *out, *lse; /* (B, H, L, D), lse (B, Hq, L) */
} local_attn;

typedef struct ulysses_saved {
  int expand;                   /* each local kv head repeated this many times before the move */
  tsr_dtensor *q, *k, *v, *out; /* head-sharded on the dim */
  tsr_op_deferral *inner;       /* another dim's rule handed the call, or NULL */
  tsr_dtensor *seg;             /* sdpa_doc: segment ids whole on the dim, or NULL */
  local_attn *local;            /* when inner is NULL */
} ulysses_saved;

static void local_free(local_attn *a) {
  if (!a) return;
  tsr_tensor_free(a->q);
  tsr_tensor_free(a->k);
  tsr_tensor_free(a->v);
  tsr_tensor_free(a->out);
  tsr_tensor_free(a->lse);
  free(a);
}

void ulysses_sdpa_saved_free(void *p) {
  ulysses_saved *s = p;
  if (!s) return;
  tsr_dtensor_free(s->q);
  tsr_dtensor_free(s->k);
  tsr_dtensor_free(s->v);
  tsr_dtensor_free(s->out);
  tsr_dtensor_free(s->seg);
  tsr_op_deferral_free(s->inner);
  local_free(s->local);
  free(s);
}

/* Device pointers: only the kernel table dereferences them. */
static float *fdata(const tsr_dtensor *x) {
  return tsr_tensor_data(x->local);
}

static float *data(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* A zeroed f32 scratch tensor beside `near`, on its device. */
static tsr_status scratch(const tsr_tensor *near, int ndim, const int64_t *shape, const char *what,
                          tsr_tensor **out) {
  tsr_status st = tsr_tensor_new(tsr_tensor_scratch_allocator(near), TSR_F32, ndim, shape, out);
  return st == TSR_OK ? st : tsr_error_prefix(st, "ulysses_cp: %s", what);
}

/* x's placements with the Ulysses dim set to Shard(d). */
static void on_dim(const tsr_dtensor *x, int dim, int d, tsr_placement *p) {
  memcpy(p, x->placements, sizeof(tsr_placement) * TSR_MAX_MESH_DIMS);
  p[dim] = tsr_shard(d);
}

/* The local heads of k and of its repeated form (placed alike) must correspond one to e: the
 * repeat runs per rank, so the other dims may not cut a group of repeats. */
static tsr_status check_repeats(const tsr_tensor *k, const tsr_tensor *ke, int e, int64_t global) {
  if (ke->shape[2] == k->shape[2] * e) return TSR_OK;
  return TSR_ERROR(TSR_EINVAL,
                   "ulysses_cp: %lld kv heads on this rank repeat to %lld, but their placement "
                   "splits %lld repeated heads into %lld here; the other dims must split the kv "
                   "heads evenly",
                   (long long)k->shape[2], (long long)(k->shape[2] * e), (long long)global,
                   (long long)ke->shape[2]);
}

/* k (B, L, H, D) with each head repeated e times: (B, L, H * e, D), same placements. */
static tsr_status expand_heads(tsr_rank_t *r, const tsr_dtensor *k, int e, tsr_dtensor **out) {
  int64_t shape[4] = {k->shape[0], k->shape[1], k->shape[2] * e, k->shape[3]};
  TSR_CHECK(tsr_dtensor_zeros(r, k->mesh, TSR_F32, 4, shape, k->placements, out));
  const tsr_tensor *src = k->local, *dst = (*out)->local;
  TSR_CHECK(check_repeats(src, dst, e, shape[2]));
  /* Both sides as (B, L, H, e, D); the source's stride 0 on e reads each head e times. */
  const int64_t *ss = src->stride, *ds = dst->stride;
  int64_t rep[5] = {src->shape[0], src->shape[1], src->shape[2], e, src->shape[3]};
  int64_t src_stride[5] = {ss[0], ss[1], ss[2], 0, ss[3]};
  int64_t dst_stride[5] = {ds[0], ds[1], ds[2] * e, ds[2], ds[3]};
  tsr_kernel_table_of(src)->copy_strided(data(dst), dst_stride, data(src), src_stride, rep, 5,
                                         sizeof(float));
  return TSR_OK;
}

/* The adjoint of expand_heads: sums each head's repeats into g (placed as k). */
static tsr_status reduce_heads(tsr_rank_t *r, const tsr_dtensor *k, const tsr_dtensor *ge, int e,
                               tsr_dtensor **out) {
  TSR_CHECK(tsr_dtensor_zeros(r, k->mesh, TSR_F32, 4, k->shape, k->placements, out));
  const tsr_tensor *src = ge->local, *dst = (*out)->local;
  TSR_CHECK(check_repeats(dst, src, e, ge->shape[2]));
  /* The repeats side by side, (e, B, L, H, D), so that each is one contiguous add: zero, then the
   * repeats in the order t = 0 .. e-1, so that every device rounds the sum as the CPU does. */
  const int64_t *ls = dst->shape, *ss = src->stride;
  int64_t reps_shape[5] = {e, ls[0], ls[1], ls[2], ls[3]};
  int64_t src_stride[5] = {ss[2], ss[0], ss[1], ss[2] * e, ss[3]};
  tsr_tensor *reps = NULL;
  TSR_CHECK(scratch(src, 5, reps_shape, "out of memory summing repeated kv heads", &reps));
  const tsr_kernel_table *kt = tsr_kernel_table_of(src);
  kt->copy_strided(data(reps), reps->stride, data(src), src_stride, reps_shape, 5, sizeof(float));
  int64_t n = tsr_tensor_numel(dst);
  for (int t = 0; t < e; t++) kt->add(data(dst), data(dst), data(reps) + t * n, n);
  tsr_tensor_free(reps);
  return TSR_OK;
}

/* With no other dim's rule taking the call, the sequence must be whole on every other dim, or
 * local attention would see part of it. */
static tsr_status check_alone(int dim, const ulysses_saved *s) {
  const tsr_mesh_t *m = s->q->mesh;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    tsr_placement p = s->q->placements[i];
    if (i != dim && tsr_mesh_dim_size(m, i) > 1 && p.kind == TSR_SHARD && p.dim == 1)
      return TSR_ERROR(TSR_ENOTSUP,
                       "ulysses_cp: the sequence is also sharded on mesh dim '%s', which has no "
                       "attention rule; load the strategy that owns '%s'",
                       tsr_mesh_dim_name(m, i), tsr_mesh_dim_name(m, i));
  }
  return TSR_OK;
}

static tsr_status local_forward(tsr_rank_t *r, ulysses_saved *s, bool causal) {
  const tsr_dtensor *q = s->q, *k = s->k, *v = s->v;
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, &s->out));
  local_attn *a = calloc(1, sizeof *a);
  if (!a) return TSR_ERROR(TSR_ENOMEM, "ulysses_cp: out of memory saving attention");
  s->local = a;
  a->B = (int)q->local->shape[0];
  a->L = (int)q->local->shape[1];
  a->Hq = (int)q->local->shape[2];
  a->D = (int)q->local->shape[3];
  a->Hkv = (int)k->local->shape[2];
  int64_t qs[4] = {a->B, a->Hq, a->L, a->D}, ks[4] = {a->B, a->Hkv, a->L, a->D};
  int64_t lse_shape[3] = {a->B, a->Hq, a->L};
  const char *what = "out of memory saving attention";
  TSR_CHECK(scratch(q->local, 4, qs, what, &a->q));
  TSR_CHECK(scratch(q->local, 4, ks, what, &a->k));
  TSR_CHECK(scratch(q->local, 4, ks, what, &a->v));
  TSR_CHECK(scratch(q->local, 4, qs, what, &a->out));
  TSR_CHECK(scratch(q->local, 3, lse_shape, what, &a->lse));
  const tsr_kernel_table *kt = tsr_kernel_table_of(q->local);
  kt->blhd_to_bhld(data(a->q), fdata(q), a->B, a->L, a->Hq, a->D);
  kt->blhd_to_bhld(data(a->k), fdata(k), a->B, a->L, a->Hkv, a->D);
  kt->blhd_to_bhld(data(a->v), fdata(v), a->B, a->L, a->Hkv, a->D);
  if (s->seg) {
    tsr_kernel_fn fn = tsr_kernel_lookup(kt, "attention_forward_seg");
    if (!fn) return TSR_ERROR(TSR_ENOTSUP, "ulysses_cp: no attention kernel with segment ids");
    const int32_t *sg = tsr_tensor_data(s->seg->local);
    TSR_CHECK(((tsr_kernel_attention_forward_seg_fn)fn)(
        data(a->out), data(a->lse), data(a->q), data(a->k), data(a->v), NULL, NULL, sg, sg, a->B,
        a->Hq, a->Hkv, a->L, a->L, a->D, causal));
  } else {
    TSR_CHECK(kt->attention_forward(data(a->out), data(a->lse), data(a->q), data(a->k), data(a->v),
                                    NULL, NULL, a->B, a->Hq, a->Hkv, a->L, a->L, a->D, causal));
  }
  kt->bhld_to_blhd(fdata(s->out), data(a->out), a->B, a->L, a->Hq, a->D);
  return TSR_OK;
}

static tsr_status local_backward(tsr_rank_t *r, const ulysses_saved *s, const tsr_dtensor *g,
                                 bool causal, tsr_dtensor **gins) {
  const local_attn *a = s->local;
  const tsr_dtensor *in[3] = {s->q, s->k, s->v};
  for (int i = 0; i < 3; i++)
    TSR_CHECK(
        tsr_dtensor_zeros(r, in[i]->mesh, TSR_F32, 4, in[i]->shape, in[i]->placements, &gins[i]));
  int64_t nq = (int64_t)a->B * a->Hq * a->L * a->D, nk = (int64_t)a->B * a->Hkv * a->L * a->D;
  int64_t nw = 2 * nq + 2 * nk;
  tsr_tensor *w = NULL; /* zeroed: the kernel accumulates into dq, dk, dv */
  TSR_CHECK(scratch(g->local, 1, &nw, "out of memory in attention backward", &w));
  float *dout = data(w), *dq = dout + nq, *dk = dq + nq, *dv = dk + nk;
  const tsr_kernel_table *kt = tsr_kernel_table_of(g->local);
  kt->blhd_to_bhld(dout, fdata(g), a->B, a->L, a->Hq, a->D);
  tsr_status st = TSR_OK;
  if (s->seg) {
    tsr_kernel_fn fn = tsr_kernel_lookup(kt, "attention_backward_seg");
    const int32_t *sg = tsr_tensor_data(s->seg->local);
    st = fn ? ((tsr_kernel_attention_backward_seg_fn)fn)(
                  dq, dk, dv, dout, data(a->q), data(a->k), data(a->v), data(a->out), data(a->lse),
                  NULL, NULL, sg, sg, a->B, a->Hq, a->Hkv, a->L, a->L, a->D, causal)
            : TSR_ERROR(TSR_ENOTSUP, "ulysses_cp: no attention kernel with segment ids");
  } else {
    st = kt->attention_backward(dq, dk, dv, dout, data(a->q), data(a->k), data(a->v), data(a->out),
                                data(a->lse), NULL, NULL, a->B, a->Hq, a->Hkv, a->L, a->L, a->D,
                                causal);
  }
  if (st == TSR_OK) {
    kt->bhld_to_blhd(fdata(gins[0]), dq, a->B, a->L, a->Hq, a->D);
    kt->bhld_to_blhd(fdata(gins[1]), dk, a->B, a->L, a->Hkv, a->D);
    kt->bhld_to_blhd(fdata(gins[2]), dv, a->B, a->L, a->Hkv, a->D);
  }
  tsr_tensor_free(w);
  return st;
}

tsr_status ulysses_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                const void *attrs, int nout, tsr_dtensor **out, void **saved,
                                void *ctx) {
  (void)nout, (void)ctx;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  const tsr_sdpa_attrs *a = attrs;
  if (!q->local) return tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, out);
  int n = tsr_mesh_dim_size(q->mesh, dim);
  int hq = (int)q->local->shape[2], hkv = (int)k->local->shape[2];
  if (hq % n)
    return TSR_ERROR(TSR_EINVAL,
                     "ulysses_cp: %d query heads on this rank cannot be split over ulysses_cp = "
                     "%d; the heads (after any other dim that splits them) must be a multiple of "
                     "the Ulysses degree",
                     hq, n);
  if (hkv % n && n % hkv)
    return TSR_ERROR(TSR_EINVAL,
                     "ulysses_cp: %d kv heads on this rank over ulysses_cp = %d: the degree must "
                     "divide them (split) or be a multiple of them (replicated)",
                     hkv, n);
  ulysses_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "ulysses_cp: out of memory saving attention");
  *saved = s;
  s->expand = hkv % n ? n / hkv : 1;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  tsr_dtensor *ke = NULL, *ve = NULL;
  tsr_status st = TSR_OK;
  if (s->expand > 1) {
    TSR_CHECK_GOTO(expand_heads(r, k, s->expand, &ke), st);
    TSR_CHECK_GOTO(expand_heads(r, v, s->expand, &ve), st);
  }
  on_dim(q, dim, 2, p);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, q, q->mesh, p, &s->q), st);
  on_dim(k, dim, 2, p);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, ke ? ke : k, k->mesh, p, &s->k), st);
  on_dim(v, dim, 2, p);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, ve ? ve : v, v->mesh, p, &s->v), st);
  if (nin == 4) { /* sdpa_doc: the segment ids of the whole sequence here */
    memcpy(p, in[3]->placements, sizeof(tsr_placement) * TSR_MAX_MESH_DIMS);
    p[dim] = tsr_replicate();
    TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, in[3], in[3]->mesh, p, &s->seg), st);
  }
  /* ring attention, when the sequence is also split over ring_cp, takes the head-sharded call */
  const tsr_dtensor *ins[4] = {s->q, s->k, s->v, s->seg};
  TSR_CHECK_GOTO(tsr_op_defer_forward(r, s->seg ? TSR_OP_SDPA_DOC : TSR_OP_SDPA, dim, nin, ins,
                                      attrs, 1, &s->out, &s->inner),
                 st);
  if (!s->inner) {
    TSR_CHECK_GOTO(check_alone(dim, s), st);
    TSR_CHECK_GOTO(local_forward(r, s, a->causal), st);
  }
  st = tsr_dtensor_redistribute(r, s->out, q->mesh, q->placements, out);
cleanup:
  tsr_dtensor_free(ke);
  tsr_dtensor_free(ve);
  return st;
}

tsr_status ulysses_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                 const void *attrs, int nout, const tsr_dtensor *const *outs,
                                 const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                                 void *ctx) {
  (void)dim, (void)nin, (void)nout, (void)outs, (void)ctx;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  const tsr_sdpa_attrs *a = attrs;
  const ulysses_saved *s = saved;
  if (!gouts[0]) return TSR_OK;
  if (!q->local) {
    for (int i = 0; i < 3; i++)
      TSR_CHECK(
          tsr_dtensor_zeros(r, in[i]->mesh, TSR_F32, 4, in[i]->shape, in[i]->placements, &gins[i]));
    return TSR_OK;
  }
  tsr_dtensor *g = NULL, *g2[3] = {NULL, NULL, NULL}, *ge = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, gouts[0], q->mesh, s->out->placements, &g), st);
  if (s->inner) {
    const tsr_dtensor *ins[4] = {s->q, s->k, s->v, s->seg}, *o[1] = {s->out}, *go[1] = {g};
    tsr_dtensor *g4[4] = {NULL, NULL, NULL, NULL};
    st = tsr_op_defer_backward(r, s->inner, s->seg ? 4 : 3, ins, attrs, 1, o, go, g4);
    for (int i = 0; i < 3; i++) g2[i] = g4[i];
    tsr_dtensor_free(g4[3]);
    TSR_CHECK_GOTO(st, st);
  } else {
    TSR_CHECK_GOTO(local_backward(r, s, g, a->causal, g2), st);
  }
  const tsr_dtensor *orig[3] = {q, k, v};
  for (int i = 0; i < 3 && st == TSR_OK; i++) {
    if (!g2[i]) continue;
    if (i == 0 || s->expand == 1) {
      st = tsr_dtensor_redistribute(r, g2[i], q->mesh, orig[i]->placements, &gins[i]);
    } else {
      st = tsr_dtensor_redistribute(r, g2[i], q->mesh, orig[i]->placements, &ge);
      if (st == TSR_OK) st = reduce_heads(r, orig[i], ge, s->expand, &gins[i]);
      tsr_dtensor_free(ge);
      ge = NULL;
    }
  }
cleanup:
  tsr_dtensor_free(g);
  for (int i = 0; i < 3; i++) tsr_dtensor_free(g2[i]);
  return st;
}
