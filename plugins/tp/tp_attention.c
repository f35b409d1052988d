/* Attention with the query heads split over tp and the kv heads replicated (tp > kv heads).
 *
 * With tp a multiple of the kv heads, each kv head's query group spans tp / kv whole ranks, so
 * the query heads of one rank all read one kv head: kv head (first local q head) / group. The
 * rank attends with that head only; its key and value gradients are its query heads' share of
 * that head's gradient and zero elsewhere, which makes them Partial(sum) over tp.
 *
 * Document masking (sdpa_doc) adds the segment ids (B, L), whole on tp, as a fourth input; the
 * kernels with segment ids take them in place.
 */
#include <stdlib.h>
#include <string.h>

#include "tessera/device.h"
#include "tp_impl.h"

/* The saved tensors live on q's device. The kernels take the (B, H, L, D) layout; a single head
 * copied out of (B, L, H, D) is a contiguous (B, L, 1, D), which is (B, 1, L, D) in memory, so k
 * and v are kept in that shape and passed as one kv head. */
typedef struct sdpa_saved {
  int B, L, Hq, Hkv, D, kv; /* local batch, sequence, local q heads, all kv heads, the kv head */
  bool causal;
  tsr_tensor *q, *k, *v; /* (B, Hq, L, D), (B, L, 1, D) twice */
  tsr_tensor *out, *lse; /* (B, Hq, L, D), (B, Hq, L) */
} sdpa_saved;

void tp_sdpa_saved_free(void *p) {
  sdpa_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->q);
  tsr_tensor_free(s->k);
  tsr_tensor_free(s->v);
  tsr_tensor_free(s->out);
  tsr_tensor_free(s->lse);
  free(s);
}

static float *data(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* sdpa_doc's segment ids and the kernel `name` that reads them; NULL ids for plain sdpa. */
static tsr_status seg_kernel(int nin, const tsr_dtensor *const *in, const tsr_kernel_table *kt,
                             const char *name, const int32_t **seg, tsr_kernel_fn *fn) {
  *seg = NULL;
  if (nin < 4) return TSR_OK;
  *seg = tsr_tensor_data(in[3]->local);
  *fn = tsr_kernel_lookup(kt, name);
  if (!*fn)
    return TSR_ERROR(TSR_ENOTSUP, "tp: the %s device has no kernel '%s' ([data] mask = document)",
                     kt->name, name);
  return TSR_OK;
}

/* A new contiguous (B, L, 1, D) copy of head `h` of x (B, L, H, D), beside x. */
static tsr_status head_of(const tsr_tensor *x, int h, tsr_tensor **y) {
  tsr_tensor *head;
  TSR_CHECK(tsr_tensor_narrow(x, 2, h, 1, &head));
  tsr_status st = tsr_tensor_to(head, tsr_tensor_scratch_allocator(x), y);
  tsr_tensor_free(head);
  return st;
}

/* Writes y (B, L, 1, D) into head `h` of x (B, L, H, D). */
static tsr_status head_into(tsr_tensor *x, int h, const tsr_tensor *y) {
  tsr_tensor *head;
  TSR_CHECK(tsr_tensor_narrow(x, 2, h, 1, &head));
  tsr_status st = tsr_tensor_copy(head, y);
  tsr_tensor_free(head);
  return st;
}

tsr_status tp_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved,
                           void *ctx) {
  const tsr_sdpa_attrs *a = attrs;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  /* positions are 0 .. L-1: a sequence shard beside tp would need a context-parallel rule */
  TSR_CHECK(tp_check_other_dims("tp.sdpa.kv_replicated", dim, 3, in, 1));
  int n = tsr_mesh_dim_size(q->mesh, dim), Hq = (int)q->shape[2], Hkv = (int)k->shape[2];
  int group = Hq / Hkv, h0 = (int)tsr_chunk_start(Hq, n, tp_coord(r, q, dim));
  int hn = (int)tsr_chunk_size(Hq, n, tp_coord(r, q, dim));
  if (Hq % n || hn == 0 || h0 / group != (h0 + hn - 1) / group)
    return TSR_ERROR(TSR_EINVAL,
                     "tp: %d query heads over tp = %d with %d replicated kv heads: the query "
                     "heads of a rank must all read one kv head; use a tp that divides the query "
                     "heads and is a multiple of the kv heads",
                     Hq, n, Hkv);
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, out));
  if (!q->local) return TSR_OK;
  sdpa_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving attention");
  *saved = s; /* freed by the core when this fails */
  const int64_t *ql = q->local->shape;
  s->B = (int)ql[0];
  s->L = (int)ql[1];
  s->Hq = hn;
  s->Hkv = Hkv;
  s->D = (int)ql[3];
  s->kv = h0 / group;
  s->causal = a->causal;
  tsr_allocator *alloc = tsr_tensor_scratch_allocator(q->local);
  const int64_t qshape[4] = {s->B, hn, s->L, s->D}, lshape[3] = {s->B, hn, s->L};
  TSR_CHECK(tsr_tensor_new(alloc, TSR_F32, 4, qshape, &s->q));
  TSR_CHECK(tsr_tensor_new(alloc, TSR_F32, 4, qshape, &s->out));
  TSR_CHECK(tsr_tensor_new(alloc, TSR_F32, 3, lshape, &s->lse));
  TSR_CHECK(head_of(k->local, s->kv, &s->k));
  TSR_CHECK(head_of(v->local, s->kv, &s->v));
  const tsr_kernel_table *kt = tsr_kernel_table_of(q->local);
  kt->blhd_to_bhld(data(s->q), data(q->local), s->B, s->L, hn, s->D);
  const int32_t *seg;
  tsr_kernel_fn fn = NULL;
  TSR_CHECK(seg_kernel(nin, in, kt, "attention_forward_seg", &seg, &fn));
  if (seg)
    TSR_CHECK(((tsr_kernel_attention_forward_seg_fn)fn)(
        data(s->out), data(s->lse), data(s->q), data(s->k), data(s->v), NULL, NULL, seg, seg, s->B,
        hn, 1, s->L, s->L, s->D, s->causal));
  else
    TSR_CHECK(kt->attention_forward(data(s->out), data(s->lse), data(s->q), data(s->k), data(s->v),
                                    NULL, NULL, s->B, hn, 1, s->L, s->L, s->D, s->causal));
  kt->bhld_to_blhd(data((*out)->local), data(s->out), s->B, s->L, hn, s->D);
  return TSR_OK;
}

tsr_status tp_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                            void *ctx) {
  const sdpa_saved *s = saved;
  for (int j = 0; j < 3; j++) {
    tsr_placement p[TSR_MAX_MESH_DIMS];
    memcpy(p, in[j]->placements, sizeof p);
    if (j) p[dim] = tsr_partial(TSR_REDUCE_SUM);
    TSR_CHECK(tsr_dtensor_zeros(r, in[j]->mesh, TSR_F32, 4, in[j]->shape, p, &gin[j]));
  }
  if (!s || !gout[0]) return TSR_OK;
  tsr_allocator *alloc = tsr_tensor_scratch_allocator(s->q);
  tsr_tensor *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
  tsr_status st = TSR_OK;
  /* zero-filled: the kernel accumulates into dq, dk, dv */
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, s->q->shape, &dout), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, s->q->shape, &dq), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, s->k->shape, &dk), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, s->v->shape, &dv), st);
  const tsr_kernel_table *kt = tsr_kernel_table_of(s->q);
  kt->blhd_to_bhld(data(dout), data(gout[0]->local), s->B, s->L, s->Hq, s->D);
  const int32_t *seg;
  tsr_kernel_fn fn = NULL;
  TSR_CHECK_GOTO(seg_kernel(nin, in, kt, "attention_backward_seg", &seg, &fn), st);
  if (seg)
    st = ((tsr_kernel_attention_backward_seg_fn)fn)(
        data(dq), data(dk), data(dv), data(dout), data(s->q), data(s->k), data(s->v), data(s->out),
        data(s->lse), NULL, NULL, seg, seg, s->B, s->Hq, 1, s->L, s->L, s->D, s->causal);
  else
    st = kt->attention_backward(data(dq), data(dk), data(dv), data(dout), data(s->q), data(s->k),
                                data(s->v), data(s->out), data(s->lse), NULL, NULL, s->B, s->Hq, 1,
                                s->L, s->L, s->D, s->causal);
  TSR_CHECK_GOTO(st, st);
  kt->bhld_to_blhd(data(gin[0]->local), data(dq), s->B, s->L, s->Hq, s->D);
  TSR_CHECK_GOTO(head_into(gin[1]->local, s->kv, dk), st);
  TSR_CHECK_GOTO(head_into(gin[2]->local, s->kv, dv), st);
cleanup:
  tsr_tensor_free(dout);
  tsr_tensor_free(dq);
  tsr_tensor_free(dk);
  tsr_tensor_free(dv);
  return st;
}
