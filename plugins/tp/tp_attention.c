/* Attention with the query heads split over tp and the kv heads replicated (tp > kv heads).
 *
 * With tp a multiple of the kv heads, each kv head's query group spans tp / kv whole ranks, so
 * the query heads of one rank all read one kv head: kv head (first local q head) / group. The
 * rank attends with that head only; its key and value gradients are its query heads' share of
 * that head's gradient and zero elsewhere, which makes them Partial(sum) over tp.
 */
#include <stdlib.h>
#include <string.h>

#include "tessera/kernels.h"
#include "tp_impl.h"

typedef struct sdpa_saved {
  int B, L, Hq, Hkv, D, kv; /* local batch, sequence, local q heads, all kv heads, the kv head */
  bool causal;
  float *q, *k, *v; /* (B, Hq, L, D), (B, 1, L, D) twice */
  float *out, *lse; /* (B, Hq, L, D), (B, Hq, L) */
} sdpa_saved;

void tp_sdpa_saved_free(void *p) {
  sdpa_saved *s = p;
  if (!s) return;
  free(s->q);
  free(s->k);
  free(s->v);
  free(s->out);
  free(s->lse);
  free(s);
}

/* Copies head `h` of x (B, L, H, D) into y (B, 1, L, D), or back when `to_x`. */
static void head_copy(float *y, float *x, int B, int L, int H, int D, int h, bool to_x) {
  for (int b = 0; b < B; b++)
    for (int l = 0; l < L; l++) {
      float *xs = x + (((size_t)b * L + l) * H + h) * D, *ys = y + ((size_t)b * L + l) * D;
      memcpy(to_x ? xs : ys, to_x ? ys : xs, sizeof(float) * (size_t)D);
    }
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
  *saved = s;
  const int64_t *ql = q->local->shape;
  s->B = (int)ql[0];
  s->L = (int)ql[1];
  s->Hq = hn;
  s->Hkv = Hkv;
  s->D = (int)ql[3];
  s->kv = h0 / group;
  s->causal = a->causal;
  size_t nq = (size_t)s->B * hn * s->L * s->D, nk = (size_t)s->B * s->L * s->D;
  s->q = malloc(sizeof(float) * (nq + 1));
  s->out = malloc(sizeof(float) * (nq + 1));
  s->k = malloc(sizeof(float) * (nk + 1));
  s->v = malloc(sizeof(float) * (nk + 1));
  s->lse = malloc(sizeof(float) * ((size_t)s->B * hn * s->L + 1));
  if (!s->q || !s->out || !s->k || !s->v || !s->lse)
    return TSR_ERROR(TSR_ENOMEM, "out of memory saving attention");
  tsr_kernel_blhd_to_bhld(s->q, tsr_tensor_data(q->local), s->B, s->L, hn, s->D);
  head_copy(s->k, tsr_tensor_data(k->local), s->B, s->L, Hkv, s->D, s->kv, false);
  head_copy(s->v, tsr_tensor_data(v->local), s->B, s->L, Hkv, s->D, s->kv, false);
  TSR_CHECK(tsr_kernel_attention_forward(s->out, s->lse, s->q, s->k, s->v, NULL, NULL, s->B, hn, 1,
                                         s->L, s->L, s->D, s->causal));
  tsr_kernel_bhld_to_blhd(tsr_tensor_data((*out)->local), s->out, s->B, s->L, hn, s->D);
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
  size_t nq = (size_t)s->B * s->Hq * s->L * s->D, nk = (size_t)s->B * s->L * s->D;
  float *buf = calloc(2 * nq + 2 * nk + 1, sizeof(float));
  if (!buf) return TSR_ERROR(TSR_ENOMEM, "out of memory in attention backward");
  float *dout = buf, *dq = dout + nq, *dk = dq + nq, *dv = dk + nk;
  tsr_kernel_blhd_to_bhld(dout, tsr_tensor_data(gout[0]->local), s->B, s->L, s->Hq, s->D);
  tsr_status st =
      tsr_kernel_attention_backward(dq, dk, dv, dout, s->q, s->k, s->v, s->out, s->lse, NULL, NULL,
                                    s->B, s->Hq, 1, s->L, s->L, s->D, s->causal);
  if (st == TSR_OK) {
    tsr_kernel_bhld_to_blhd(tsr_tensor_data(gin[0]->local), dq, s->B, s->L, s->Hq, s->D);
    head_copy(dk, tsr_tensor_data(gin[1]->local), s->B, s->L, s->Hkv, s->D, s->kv, true);
    head_copy(dv, tsr_tensor_data(gin[2]->local), s->B, s->L, s->Hkv, s->D, s->kv, true);
  }
  free(buf);
  return st;
}
