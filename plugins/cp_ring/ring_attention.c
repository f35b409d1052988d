/* Ring attention: q, k and v sharded along the sequence over the ring dim.
 *
 * Each rank keeps its query rows and passes its key/value block to the next rank, n - 1 times,
 * so that every query block meets every key block once. Each meeting runs the attention kernel
 * with the global positions of both blocks (the causal mask is k_pos <= q_pos, whatever the
 * layout) and yields a partial output with its log-sum-exp; the partials are merged in f32 by the
 * stable log-sum-exp rule, so the result is the softmax over all keys without materialising the
 * scores. A block wholly in the future of every query row is skipped.
 *
 * Document masking (sdpa_doc, a fourth input of segment ids laid out as q's rows): the segment
 * ids of every member's block are all-gathered once, and each meeting runs the kernels with
 * segment ids; a query row that sees no key of a block gets lse = -inf there, which the merge
 * weighs as nothing.
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

/* Every tensor is on q's device (scratch made with tsr_tensor_scratch_allocator); the positions
 * are built on the host, and what the skip test needs of them is kept there as `visible`. */
typedef struct ring_saved {
  int B, Lq, Lk, Hq, Hkv, D, n, me;
  bool causal;
  bool *visible;         /* (n): whether member j's block has a key some local query sees */
  tsr_tensor *q_pos;     /* (Lq) i32 */
  tsr_tensor *k_pos;     /* (n, Lk) i32: positions of member j's block */
  tsr_tensor *q, *kv;    /* (B, Hq, Lq, D); own k then v, (2, B, Hkv, Lk, D) */
  tsr_tensor *out, *lse; /* merged (B, Hq, Lq, D), (B, Hq, Lq) */
  tsr_tensor *seg;       /* (n, B, Lk) i32 every member's segment ids (sdpa_doc), or NULL */
  tsr_kernel_fn seg_fwd, seg_bwd; /* the kernels with segment ids, with seg */
} ring_saved;

void ring_sdpa_saved_free(void *p) {
  ring_saved *s = p;
  if (!s) return;
  free(s->visible);
  tsr_tensor_free(s->q_pos);
  tsr_tensor_free(s->k_pos);
  tsr_tensor_free(s->q);
  tsr_tensor_free(s->kv);
  tsr_tensor_free(s->out);
  tsr_tensor_free(s->lse);
  tsr_tensor_free(s->seg);
  free(s);
}

/* Member j's segment ids, (B, Lk) in s->seg. */
static const int32_t *seg_of(const ring_saved *s, int j) {
  return (const int32_t *)tsr_tensor_data(s->seg) + (size_t)j * s->B * s->Lk;
}

/* sdpa_doc: every member's segment ids (`seg` holds this rank's, laid out as its rows) and the
 * kernels that read them. */
static tsr_status gather_segments(tsr_group_t *g, const tsr_dtensor *seg, tsr_allocator *alloc,
                                  ring_saved *s) {
  const tsr_kernel_table *kt = tsr_kernel_table_of(seg->local);
  s->seg_fwd = tsr_kernel_lookup(kt, "attention_forward_seg");
  s->seg_bwd = tsr_kernel_lookup(kt, "attention_backward_seg");
  if (!s->seg_fwd || !s->seg_bwd)
    return TSR_ERROR(TSR_ENOTSUP,
                     "cp_ring: the %s device has no attention kernel with segment "
                     "ids ([data] mask = document)",
                     kt->name);
  if (s->Lq != s->Lk || seg->local->shape[0] != s->B || seg->local->shape[1] != s->Lq)
    return TSR_ERROR(TSR_EINVAL, "cp_ring: segment ids of %lld x %lld rows for q of %d x %d",
                     (long long)seg->local->shape[0], (long long)seg->local->shape[1], s->B, s->Lq);
  int64_t shape[3] = {s->n, s->B, s->Lk};
  TSR_CHECK(tsr_tensor_new(alloc, TSR_I32, 3, shape, &s->seg));
  return tsr_comm_all_gather(g, tsr_tensor_data(seg->local), (size_t)s->B * s->Lk,
                             tsr_tensor_data(s->seg), NULL, TSR_I32);
}

static float *fdata(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* False when every key of the block (k_pos, Lk) is in the future of every local query. */
static bool block_visible(bool causal, const int32_t *q_pos, int Lq, const int32_t *k_pos, int Lk) {
  if (!causal || Lk == 0) return Lk > 0;
  int32_t kmin = k_pos[0], qmax = -1;
  for (int i = 0; i < Lk; i++)
    if (k_pos[i] < kmin) kmin = k_pos[i];
  for (int i = 0; i < Lq; i++)
    if (q_pos[i] > qmax) qmax = q_pos[i];
  return kmin <= qmax;
}

static size_t q_elems(const ring_saved *s) {
  return (size_t)s->B * s->Hq * s->Lq * s->D;
}

static size_t kv_elems(const ring_saved *s) {
  return (size_t)s->B * s->Hkv * s->Lk * s->D;
}

/* Positions of this rank's queries and of every ring member's keys, put on `alloc`'s device;
 * every block must have the same length, since the blocks travel in fixed-size messages. */
static tsr_status block_positions(tsr_rank_t *r, const ring_state *rs, tsr_group_t *g,
                                  const tsr_dtensor *q, const tsr_dtensor *k, tsr_allocator *alloc,
                                  ring_saved *s) {
  int n = 0;
  int32_t *qp = NULL, *kp = NULL, *p = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(ring_positions(rs, q->mesh, q->placements, q->shape[1], tsr_rank_id(r), &qp, &n),
                 st);
  if (n != s->Lq) {
    st = TSR_ERROR(TSR_EINTERNAL, "cp_ring: %d positions for %d rows", n, s->Lq);
    goto cleanup;
  }
  kp = malloc(sizeof(int32_t) * ((size_t)s->n * s->Lk + 1));
  s->visible = calloc((size_t)s->n, sizeof *s->visible);
  if (!kp || !s->visible) {
    st = TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for key positions");
    goto cleanup;
  }
  for (int j = 0; j < s->n; j++) {
    TSR_CHECK_GOTO(
        ring_positions(rs, k->mesh, k->placements, k->shape[1], tsr_group_rank(g, j), &p, &n), st);
    if (n != s->Lk) {
      st = TSR_ERROR(TSR_EINVAL,
                     "cp_ring: ring_cp member %d holds %d sequence rows and member %d holds %d; "
                     "ring attention passes equal blocks: use a sequence length that ring_cp "
                     "(times the other sequence-sharding dims) divides",
                     s->me, s->Lk, j, n);
      goto cleanup;
    }
    memcpy(kp + (size_t)j * s->Lk, p, sizeof(int32_t) * (size_t)n);
    s->visible[j] = block_visible(s->causal, qp, s->Lq, p, n);
    free(p);
    p = NULL;
  }
  TSR_CHECK_GOTO(tsr_tensor_from_i32(alloc, s->Lq, qp, &s->q_pos), st);
  TSR_CHECK_GOTO(tsr_tensor_from_i32(alloc, (int64_t)s->n * s->Lk, kp, &s->k_pos), st);
cleanup:
  free(p);
  free(kp);
  free(qp);
  return st;
}

/* The running log-sum-exp starts at -inf, so that the first merge keeps the first block. */
static tsr_status lse_init(const tsr_kernel_table *kt, tsr_tensor *lse) {
  size_t rows = (size_t)tsr_tensor_numel(lse);
  float *h = malloc(sizeof(float) * (rows + 1));
  if (!h) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for %zu log-sum-exp rows", rows);
  for (size_t i = 0; i < rows; i++) h[i] = -INFINITY;
  kt->copy_h2d(tsr_tensor_data(lse), h, sizeof(float) * rows);
  free(h);
  return TSR_OK;
}

tsr_status ring_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx) {
  (void)nout;
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
  const tsr_kernel_table *kt = tsr_kernel_table_of(q->local);
  tsr_allocator *alloc = tsr_tensor_scratch_allocator(q->local);
  TSR_CHECK(block_positions(r, ctx, g, q, k, alloc, s));
  if (nin == 4) TSR_CHECK(gather_segments(g, in[3], alloc, s));
  size_t nq = q_elems(s), nk = kv_elems(s), rows = (size_t)s->B * s->Hq * s->Lq;
  int64_t qshape[4] = {s->B, s->Hq, s->Lq, s->D}, kvshape[5] = {2, s->B, s->Hkv, s->Lk, s->D};
  int64_t lshape[3] = {s->B, s->Hq, s->Lq}, nwork = (int64_t)(4 * nk + nq + rows);
  tsr_tensor *work = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, qshape, &s->q), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 5, kvshape, &s->kv), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 4, qshape, &s->out), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 3, lshape, &s->lse), st);
  TSR_CHECK_GOTO(lse_init(kt, s->lse), st);
  /* cur and nxt hold a travelling k, v block; bout and blse one block's partial result */
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 1, &nwork, &work), st);
  float *cur = fdata(work), *nxt = cur + 2 * nk, *bout = nxt + 2 * nk, *blse = bout + nq;
  float *sq = fdata(s->q), *skv = fdata(s->kv), *sout = fdata(s->out), *slse = fdata(s->lse);
  const int32_t *qpos = tsr_tensor_data(s->q_pos), *kpos = tsr_tensor_data(s->k_pos);
  kt->blhd_to_bhld(sq, fdata(q->local), s->B, s->Lq, s->Hq, s->D);
  kt->blhd_to_bhld(skv, fdata(k->local), s->B, s->Lk, s->Hkv, s->D);
  kt->blhd_to_bhld(skv + nk, fdata(v->local), s->B, s->Lk, s->Hkv, s->D);
  kt->copy_d2d(cur, skv, sizeof(float) * 2 * nk);
  int next = (s->me + 1) % s->n, prev = (s->me + s->n - 1) % s->n;
  for (int step = 0; step < s->n; step++) {
    int j = (s->me + s->n - step) % s->n;
    if (s->visible[j] && s->seg) {
      TSR_CHECK_GOTO(((tsr_kernel_attention_forward_seg_fn)s->seg_fwd)(
                         bout, blse, sq, cur, cur + nk, qpos, kpos + (size_t)j * s->Lk,
                         seg_of(s, s->me), seg_of(s, j), s->B, s->Hq, s->Hkv, s->Lq, s->Lk, s->D,
                         s->causal),
                     st);
      kt->attention_merge(sout, slse, sout, slse, bout, blse, (int)rows, s->D);
    } else if (s->visible[j]) {
      TSR_CHECK_GOTO(kt->attention_forward(bout, blse, sq, cur, cur + nk, qpos,
                                           kpos + (size_t)j * s->Lk, s->B, s->Hq, s->Hkv, s->Lq,
                                           s->Lk, s->D, s->causal),
                     st);
      kt->attention_merge(sout, slse, sout, slse, bout, blse, (int)rows, s->D);
    }
    if (step < s->n - 1) {
      TSR_CHECK_GOTO(tsr_comm_sendrecv(g, next, cur, 2 * nk, prev, nxt, 2 * nk, TSR_F32), st);
      float *t = cur;
      cur = nxt;
      nxt = t;
    }
  }
  kt->bhld_to_blhd(fdata((*out)->local), sout, s->B, s->Lq, s->Hq, s->D);
cleanup:
  tsr_tensor_free(work);
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
  const tsr_kernel_table *kt = tsr_kernel_table_of(q->local);
  size_t nq = q_elems(s), nk = kv_elems(s);
  /* zero-filled: dq and the dk, dv of the own block accumulate from nothing */
  int64_t nwork = (int64_t)(2 * nq + 8 * nk);
  tsr_tensor *work = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_tensor_scratch_allocator(q->local), TSR_F32, 1, &nwork, &work));
  /* cur and nxt hold a travelling block: k, v, and the dk, dv accumulated for it so far */
  float *dout = fdata(work), *dq = dout + nq, *cur = dq + nq, *nxt = cur + 4 * nk;
  const float *sq = fdata(s->q), *sout = fdata(s->out), *slse = fdata(s->lse);
  const int32_t *qpos = tsr_tensor_data(s->q_pos), *kpos = tsr_tensor_data(s->k_pos);
  kt->blhd_to_bhld(dout, fdata(gouts[0]->local), s->B, s->Lq, s->Hq, s->D);
  kt->copy_d2d(cur, fdata(s->kv), sizeof(float) * 2 * nk);
  int next = (s->me + 1) % s->n, prev = (s->me + s->n - 1) % s->n;
  tsr_status st = TSR_OK;
  for (int step = 0; step < s->n; step++) {
    int j = (s->me + s->n - step) % s->n;
    if (s->visible[j] && s->seg)
      TSR_CHECK_GOTO(((tsr_kernel_attention_backward_seg_fn)s->seg_bwd)(
                         dq, cur + 2 * nk, cur + 3 * nk, dout, sq, cur, cur + nk, sout, slse, qpos,
                         kpos + (size_t)j * s->Lk, seg_of(s, s->me), seg_of(s, j), s->B, s->Hq,
                         s->Hkv, s->Lq, s->Lk, s->D, s->causal),
                     st);
    else if (s->visible[j])
      TSR_CHECK_GOTO(kt->attention_backward(dq, cur + 2 * nk, cur + 3 * nk, dout, sq, cur, cur + nk,
                                            sout, slse, qpos, kpos + (size_t)j * s->Lk, s->B, s->Hq,
                                            s->Hkv, s->Lq, s->Lk, s->D, s->causal),
                     st);
    if (step < s->n - 1) {
      TSR_CHECK_GOTO(tsr_comm_sendrecv(g, next, cur, 4 * nk, prev, nxt, 4 * nk, TSR_F32), st);
      float *t = cur;
      cur = nxt;
      nxt = t;
    } else {
      /* the block held now belongs to the next rank: its gradient goes home */
      TSR_CHECK_GOTO(
          tsr_comm_sendrecv(g, next, cur + 2 * nk, 2 * nk, prev, nxt + 2 * nk, 2 * nk, TSR_F32),
          st);
    }
  }
  kt->bhld_to_blhd(fdata(gins[0]->local), dq, s->B, s->Lq, s->Hq, s->D);
  kt->bhld_to_blhd(fdata(gins[1]->local), nxt + 2 * nk, s->B, s->Lk, s->Hkv, s->D);
  kt->bhld_to_blhd(fdata(gins[2]->local), nxt + 3 * nk, s->B, s->Lk, s->Hkv, s->D);
cleanup:
  tsr_tensor_free(work);
  return st;
}
