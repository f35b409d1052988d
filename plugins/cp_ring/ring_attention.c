/* Ring attention: q, k and v sharded along the sequence over the ring dim.
 *
 * Each rank keeps its query rows and passes its key/value block to the next rank, n - 1 times,
 * so that every query block meets every key block once. Each meeting runs the attention kernel
 * with the global positions of both blocks (the causal mask is k_pos <= q_pos, whatever the
 * layout) and yields a partial output with its log-sum-exp; the partials are merged in f32 by the
 * stable log-sum-exp rule, so the result is the softmax over all keys without materialising the
 * scores. A block wholly in the future of every query row is skipped.
 *
 * Backward needs only the merged output and log-sum-exp: for each block, the kernel returns that
 * block's dk/dv and its share of dq. The key/value blocks travel the ring again, each with its
 * dk/dv accumulator; after n steps every block has met every query block and one more send brings
 * its accumulated gradient home.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cp_ring_impl.h"

typedef struct ring_saved {
  int B, Lq, Lk, Hq, Hkv, D, n, me;
  bool causal;
  int32_t *q_pos;   /* (Lq) */
  int32_t *k_pos;   /* (n, Lk): positions of member j's block */
  float *q, *kv;    /* (B, Hq, Lq, D); own k then v, (B, Hkv, Lk, D) each */
  float *out, *lse; /* merged (B, Hq, Lq, D), (B, Hq, Lq) */
} ring_saved;

void ring_sdpa_saved_free(void *p) {
  ring_saved *s = p;
  if (!s) return;
  free(s->q_pos);
  free(s->k_pos);
  free(s->q);
  free(s->kv);
  free(s->out);
  free(s->lse);
  free(s);
}

/* False when every key of member j's block is in the future of every local query. */
static bool block_visible(const ring_saved *s, int j) {
  if (!s->causal || s->Lk == 0) return s->Lk > 0;
  int32_t kmin = s->k_pos[(size_t)j * s->Lk], qmax = -1;
  for (int i = 0; i < s->Lk; i++)
    if (s->k_pos[(size_t)j * s->Lk + i] < kmin) kmin = s->k_pos[(size_t)j * s->Lk + i];
  for (int i = 0; i < s->Lq; i++)
    if (s->q_pos[i] > qmax) qmax = s->q_pos[i];
  return kmin <= qmax;
}

static size_t q_elems(const ring_saved *s) {
  return (size_t)s->B * s->Hq * s->Lq * s->D;
}

static size_t kv_elems(const ring_saved *s) {
  return (size_t)s->B * s->Hkv * s->Lk * s->D;
}

/* Positions of this rank's queries and of every ring member's keys; every block must have the
 * same length, since the blocks travel in fixed-size messages. */
static tsr_status block_positions(tsr_rank_t *r, const ring_state *st, tsr_group_t *g,
                                  const tsr_dtensor *q, const tsr_dtensor *k, ring_saved *s) {
  int n = 0;
  TSR_CHECK(ring_positions(st, q->mesh, q->placements, q->shape[1], tsr_rank_id(r), &s->q_pos, &n));
  if (n != s->Lq) return TSR_ERROR(TSR_EINTERNAL, "cp_ring: %d positions for %d rows", n, s->Lq);
  s->k_pos = malloc(sizeof(int32_t) * ((size_t)s->n * s->Lk + 1));
  if (!s->k_pos) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for key positions");
  for (int j = 0; j < s->n; j++) {
    int32_t *p = NULL;
    TSR_CHECK(
        ring_positions(st, k->mesh, k->placements, k->shape[1], tsr_group_rank(g, j), &p, &n));
    if (n == s->Lk) memcpy(s->k_pos + (size_t)j * s->Lk, p, sizeof(int32_t) * (size_t)n);
    free(p);
    if (n != s->Lk)
      return TSR_ERROR(TSR_EINVAL,
                       "cp_ring: ring_cp member %d holds %d sequence rows and member %d holds %d; "
                       "ring attention passes equal blocks: use a sequence length that ring_cp "
                       "(times the other sequence-sharding dims) divides",
                       s->me, s->Lk, j, n);
  }
  return TSR_OK;
}

tsr_status ring_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx) {
  (void)nin, (void)nout;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  const tsr_sdpa_attrs *a = attrs;
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, out));
  if (!q->local) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(q->mesh, tsr_rank_comm(r), 1u << dim, &g));
  const int64_t *ql = q->local->shape, *kl = k->local->shape;
  ring_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory saving attention");
  *saved = s;
  s->B = (int)ql[0];
  s->Lq = (int)ql[1];
  s->Hq = (int)ql[2];
  s->D = (int)ql[3];
  s->Lk = (int)kl[1];
  s->Hkv = (int)kl[2];
  s->n = tsr_group_size(g);
  s->me = tsr_group_index(g);
  s->causal = a->causal;
  if (s->Hkv == 0 || s->Hq % s->Hkv || kl[0] != ql[0] || kl[3] != ql[3])
    return TSR_ERROR(TSR_EINVAL,
                     "cp_ring: local q has %d heads and k %d (batch %d / %d, head dim %d / %d); "
                     "the query heads must be a multiple of the kv heads",
                     s->Hq, s->Hkv, s->B, (int)kl[0], s->D, (int)kl[3]);
  TSR_CHECK(block_positions(r, ctx, g, q, k, s));
  size_t nq = q_elems(s), nk = kv_elems(s), rows = (size_t)s->B * s->Hq * s->Lq;
  s->q = malloc(sizeof(float) * (nq + 1));
  s->kv = malloc(sizeof(float) * (2 * nk + 1));
  s->out = malloc(sizeof(float) * (nq + 1));
  s->lse = malloc(sizeof(float) * (rows + 1));
  float *work = malloc(sizeof(float) * (4 * nk + nq + rows + 1));
  tsr_status st = TSR_OK;
  if (!s->q || !s->kv || !s->out || !s->lse || !work) {
    free(work);
    return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for ring attention");
  }
  float *cur = work, *nxt = cur + 2 * nk, *bout = nxt + 2 * nk, *blse = bout + nq;
  tsr_kernel_blhd_to_bhld(s->q, tsr_tensor_data(q->local), s->B, s->Lq, s->Hq, s->D);
  tsr_kernel_blhd_to_bhld(s->kv, tsr_tensor_data(k->local), s->B, s->Lk, s->Hkv, s->D);
  tsr_kernel_blhd_to_bhld(s->kv + nk, tsr_tensor_data(v->local), s->B, s->Lk, s->Hkv, s->D);
  memcpy(cur, s->kv, sizeof(float) * 2 * nk);
  memset(s->out, 0, sizeof(float) * nq);
  for (size_t i = 0; i < rows; i++) s->lse[i] = -INFINITY;
  int next = (s->me + 1) % s->n, prev = (s->me + s->n - 1) % s->n;
  for (int step = 0; step < s->n && st == TSR_OK; step++) {
    int j = (s->me + s->n - step) % s->n;
    if (block_visible(s, j)) {
      st = tsr_kernel_attention_forward(bout, blse, s->q, cur, cur + nk, s->q_pos,
                                        s->k_pos + (size_t)j * s->Lk, s->B, s->Hq, s->Hkv, s->Lq,
                                        s->Lk, s->D, s->causal);
      if (st == TSR_OK)
        tsr_kernel_attention_merge(s->out, s->lse, s->out, s->lse, bout, blse, (int)rows, s->D);
    }
    if (st == TSR_OK && step < s->n - 1) {
      st = tsr_comm_sendrecv(g, next, cur, 2 * nk, prev, nxt, 2 * nk, TSR_F32);
      float *t = cur;
      cur = nxt;
      nxt = t;
    }
  }
  if (st == TSR_OK)
    tsr_kernel_bhld_to_blhd(tsr_tensor_data((*out)->local), s->out, s->B, s->Lq, s->Hq, s->D);
  free(work);
  return st;
}

tsr_status ring_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, const tsr_dtensor *const *outs,
                              const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                              void *ctx) {
  (void)nin, (void)attrs, (void)nout, (void)outs, (void)ctx;
  const tsr_dtensor *q = in[0], *k = in[1], *v = in[2];
  if (!gouts[0]) return TSR_OK;
  TSR_CHECK(tsr_dtensor_zeros(r, q->mesh, TSR_F32, 4, q->shape, q->placements, &gins[0]));
  TSR_CHECK(tsr_dtensor_zeros(r, k->mesh, TSR_F32, 4, k->shape, k->placements, &gins[1]));
  TSR_CHECK(tsr_dtensor_zeros(r, v->mesh, TSR_F32, 4, v->shape, v->placements, &gins[2]));
  if (!q->local) return TSR_OK;
  const ring_saved *s = saved;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(q->mesh, tsr_rank_comm(r), 1u << dim, &g));
  size_t nq = q_elems(s), nk = kv_elems(s);
  /* cur and nxt hold a travelling block: k, v, and the dk, dv accumulated for it so far */
  float *work = calloc(2 * nq + 8 * nk + 1, sizeof(float));
  if (!work) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for ring attention backward");
  float *dout = work, *dq = dout + nq, *cur = dq + nq, *nxt = cur + 4 * nk;
  tsr_kernel_blhd_to_bhld(dout, tsr_tensor_data(gouts[0]->local), s->B, s->Lq, s->Hq, s->D);
  memcpy(cur, s->kv, sizeof(float) * 2 * nk);
  int next = (s->me + 1) % s->n, prev = (s->me + s->n - 1) % s->n;
  tsr_status st = TSR_OK;
  for (int step = 0; step < s->n && st == TSR_OK; step++) {
    int j = (s->me + s->n - step) % s->n;
    if (block_visible(s, j))
      st = tsr_kernel_attention_backward(dq, cur + 2 * nk, cur + 3 * nk, dout, s->q, cur, cur + nk,
                                         s->out, s->lse, s->q_pos, s->k_pos + (size_t)j * s->Lk,
                                         s->B, s->Hq, s->Hkv, s->Lq, s->Lk, s->D, s->causal);
    if (st != TSR_OK) break;
    if (step < s->n - 1) {
      st = tsr_comm_sendrecv(g, next, cur, 4 * nk, prev, nxt, 4 * nk, TSR_F32);
      float *t = cur;
      cur = nxt;
      nxt = t;
    } else {
      /* the block held now belongs to the next rank: its gradient goes home */
      st = tsr_comm_sendrecv(g, next, cur + 2 * nk, 2 * nk, prev, nxt + 2 * nk, 2 * nk, TSR_F32);
    }
  }
  if (st == TSR_OK) {
    tsr_kernel_bhld_to_blhd(tsr_tensor_data(gins[0]->local), dq, s->B, s->Lq, s->Hq, s->D);
    tsr_kernel_bhld_to_blhd(tsr_tensor_data(gins[1]->local), nxt + 2 * nk, s->B, s->Lk, s->Hkv,
                            s->D);
    tsr_kernel_bhld_to_blhd(tsr_tensor_data(gins[2]->local), nxt + 3 * nk, s->B, s->Lk, s->Hkv,
                            s->D);
  }
  free(work);
  return st;
}
