/* Attention kernels: the blockwise online-softmax forward against a full-softmax reference in
 * double, the backward against finite differences, the LSE merge against attention over the union
 * of key sets, and the per-block gradients ring attention needs. */
#include <string.h>

#include "test_kernels_util.h"
#include "tessera/kernels.h"

typedef struct attn_case {
  int B, Hq, Hkv, Lq, Lk, D;
  bool causal;
  const int32_t *q_pos, *k_pos; /* NULL: 0, 1, 2, ... */
} attn_case;

static int32_t pos_or_index(const int32_t *pos, int i) {
  return pos ? pos[i] : i;
}

/* Full softmax over every visible key, in double. Rows with no visible key: out 0, lse -inf. */
static void attention_reference(double *out, double *lse, const float *q, const float *k,
                                const float *v, const attn_case *c) {
  int group = c->Hq / c->Hkv;
  double scale = 1.0 / sqrt((double)c->D);
  double *sc = calloc((size_t)c->Lk, sizeof(double));
  for (int b = 0; b < c->B; b++) {
    for (int h = 0; h < c->Hq; h++) {
      const float *qh = q + ((int64_t)b * c->Hq + h) * c->Lq * c->D;
      const float *kh = k + ((int64_t)b * c->Hkv + h / group) * c->Lk * c->D;
      const float *vh = v + ((int64_t)b * c->Hkv + h / group) * c->Lk * c->D;
      for (int i = 0; i < c->Lq; i++) {
        double m = -INFINITY;
        for (int j = 0; j < c->Lk; j++) {
          bool vis = !c->causal || pos_or_index(c->k_pos, j) <= pos_or_index(c->q_pos, i);
          double s = 0;
          for (int d = 0; d < c->D; d++) s += (double)qh[i * c->D + d] * kh[j * c->D + d];
          sc[j] = vis ? s * scale : -INFINITY;
          m = fmax(m, sc[j]);
        }
        double *oi = out + (((int64_t)b * c->Hq + h) * c->Lq + i) * c->D;
        double *li = lse + ((int64_t)b * c->Hq + h) * c->Lq + i;
        for (int d = 0; d < c->D; d++) oi[d] = 0;
        if (m == -INFINITY) {
          *li = -INFINITY;
          continue;
        }
        double z = 0;
        for (int j = 0; j < c->Lk; j++) z += exp(sc[j] - m);
        for (int j = 0; j < c->Lk; j++) {
          double p = exp(sc[j] - m) / z;
          for (int d = 0; d < c->D; d++) oi[d] += p * vh[j * c->D + d];
        }
        *li = m + log(z);
      }
    }
  }
  free(sc);
}

/* Gradients of Σ out·dout in double by the textbook route, written independently of the kernel's
 * D_i = dout·out shortcut: P = softmax(S), dP = dout·vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)),
 * dq = scale·dS·k, dk = scale·dSᵀ·q (summed over the group), dv = Pᵀ·dout. */
static void attention_backward_reference(double *dq, double *dk, double *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const attn_case *c) {
  int group = c->Hq / c->Hkv, D = c->D;
  double scale = 1.0 / sqrt((double)D);
  double *p = calloc((size_t)c->Lk, sizeof(double)), *dp = calloc((size_t)c->Lk, sizeof(double));
  for (int b = 0; b < c->B; b++) {
    for (int h = 0; h < c->Hq; h++) {
      int64_t qo = ((int64_t)b * c->Hq + h) * c->Lq * D;
      int64_t ko = ((int64_t)b * c->Hkv + h / group) * c->Lk * D;
      for (int i = 0; i < c->Lq; i++) {
        double m = -INFINITY, z = 0, pdp = 0;
        for (int j = 0; j < c->Lk; j++) {
          bool vis = !c->causal || pos_or_index(c->k_pos, j) <= pos_or_index(c->q_pos, i);
          double s = 0;
          for (int d = 0; d < D; d++) s += (double)q[qo + i * D + d] * k[ko + j * D + d];
          p[j] = vis ? s * scale : -INFINITY;
          m = fmax(m, p[j]);
        }
        if (m == -INFINITY) continue;
        for (int j = 0; j < c->Lk; j++) z += (p[j] = exp(p[j] - m));
        for (int j = 0; j < c->Lk; j++) {
          p[j] /= z;
          dp[j] = 0;
          for (int d = 0; d < D; d++) dp[j] += (double)dout[qo + i * D + d] * v[ko + j * D + d];
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j < c->Lk; j++) {
          double ds = p[j] * (dp[j] - pdp) * scale;
          for (int d = 0; d < D; d++) {
            dq[qo + i * D + d] += ds * k[ko + j * D + d];
            dk[ko + j * D + d] += ds * q[qo + i * D + d];
            dv[ko + j * D + d] += p[j] * dout[qo + i * D + d];
          }
        }
      }
    }
  }
  free(p), free(dp);
}

typedef struct attn_bufs {
  attn_case c;
  int64_t nq, nk, nl;
  float *q, *k, *v, *out, *lse, *wout;
} attn_bufs;

static void bufs_init(attn_bufs *a, const attn_case *c, uint64_t seed) {
  uint64_t s = seed;
  a->c = *c;
  a->nq = (int64_t)c->B * c->Hq * c->Lq * c->D;
  a->nk = (int64_t)c->B * c->Hkv * c->Lk * c->D;
  a->nl = (int64_t)c->B * c->Hq * c->Lq;
  a->q = test_alloc(a->nq), a->out = test_alloc(a->nq), a->wout = test_alloc(a->nq);
  a->k = test_alloc(a->nk), a->v = test_alloc(a->nk), a->lse = test_alloc(a->nl);
  /* Scores of a few units: peaked enough that the online rescaling matters. */
  test_fill(a->q, a->nq, &s, -1.5f, 1.5f);
  test_fill(a->k, a->nk, &s, -1.5f, 1.5f);
  test_fill(a->v, a->nk, &s, -1, 1);
  test_fill(a->wout, a->nq, &s, -1, 1);
}

static void bufs_free(attn_bufs *a) {
  free(a->q), free(a->k), free(a->v), free(a->out), free(a->lse), free(a->wout);
}

static tsr_status run_forward(attn_bufs *a) {
  const attn_case *c = &a->c;
  return tsr_kernel_attention_forward(a->out, a->lse, a->q, a->k, a->v, c->q_pos, c->k_pos, c->B,
                                      c->Hq, c->Hkv, c->Lq, c->Lk, c->D, c->causal);
}

static void check_forward(const attn_case *c, uint64_t seed) {
  attn_bufs a;
  bufs_init(&a, c, seed);
  assert_int_equal(run_forward(&a), TSR_OK);
  double *want = calloc((size_t)a.nq, sizeof(double));
  double *want_lse = calloc((size_t)a.nl, sizeof(double));
  attention_reference(want, want_lse, a.q, a.k, a.v, c);
  test_check_close("attention out", a.out, want, a.nq, 1e-5, 1e-6);
  for (int64_t r = 0; r < a.nl; r++) {
    if (want_lse[r] == -INFINITY) {
      assert_true(a.lse[r] == -INFINITY);
    } else {
      assert_true(fabs(a.lse[r] - want_lse[r]) <= 1e-5 * fabs(want_lse[r]) + 1e-6);
    }
  }
  for (int64_t i = 0; i < a.nq; i++) assert_false(isnan(a.out[i]));
  free(want), free(want_lse);
  bufs_free(&a);
}

/* Positions of a zigzag shard of a 16-token sequence over 2 ranks (chunks 1 and 2 of 4), and a
 * key shard where some queries see nothing (keys 8.. are after queries 4..7). */
static const int32_t zig_q[8] = {4, 5, 6, 7, 8, 9, 10, 11};
static const int32_t late_k[6] = {8, 9, 10, 11, 12, 13};

static void test_attention_forward(void **state) {
  (void)state;
  /* GQA, causal, Lq < Lk top-left aligned */
  check_forward(&(attn_case){2, 4, 2, 5, 7, 8, true, NULL, NULL}, 1);
  /* Lq == Lk, multi-query (one kv head), several key blocks */
  check_forward(&(attn_case){1, 3, 1, 70, 70, 16, true, NULL, NULL}, 2);
  /* not causal, Lk spanning three blocks */
  check_forward(&(attn_case){1, 2, 2, 4, 150, 8, false, NULL, NULL}, 3);
  /* global positions; queries 4..7 see no key: out 0, lse -inf */
  check_forward(&(attn_case){2, 4, 2, 8, 6, 4, true, zig_q, late_k}, 4);
}

/* attention(A ∪ B) == merge(attention(A), attention(B)) for a key set split in two, including
 * rows that see nothing in A, nothing in B, or nothing at all. */
static void test_attention_merge(void **state) {
  (void)state;
  const int B = 1, Hq = 4, Hkv = 2, Lq = 8, La = 5, Lb = 6, D = 4;
  static const int32_t qp[8] = {0, 1, 2, 3, 8, 9, 10, 11};
  static const int32_t ka[5] = {1, 2, 3, 9, 10}; /* query 0 sees none of A */
  static const int32_t kb[6] = {0, 4, 5, 6, 7, 11};
  int32_t kall[11];
  memcpy(kall, ka, sizeof ka);
  memcpy(kall + La, kb, sizeof kb);
  attn_case cu = {B, Hq, Hkv, Lq, La + Lb, D, true, qp, kall};
  attn_bufs u;
  bufs_init(&u, &cu, 5);
  assert_int_equal(run_forward(&u), TSR_OK);

  /* Split the keys of every kv head into the A and B blocks. */
  int64_t nka = (int64_t)B * Hkv * La * D, nkb = (int64_t)B * Hkv * Lb * D;
  float *kA = test_alloc(nka), *vA = test_alloc(nka), *kB = test_alloc(nkb), *vB = test_alloc(nkb);
  for (int h = 0; h < B * Hkv; h++) {
    memcpy(kA + h * La * D, u.k + h * (La + Lb) * D, (size_t)La * D * sizeof(float));
    memcpy(vA + h * La * D, u.v + h * (La + Lb) * D, (size_t)La * D * sizeof(float));
    memcpy(kB + h * Lb * D, u.k + (h * (La + Lb) + La) * D, (size_t)Lb * D * sizeof(float));
    memcpy(vB + h * Lb * D, u.v + (h * (La + Lb) + La) * D, (size_t)Lb * D * sizeof(float));
  }
  float *oA = test_alloc(u.nq), *lA = test_alloc(u.nl), *oB = test_alloc(u.nq);
  float *lB = test_alloc(u.nl), *om = test_alloc(u.nq), *lm = test_alloc(u.nl);
  assert_int_equal(
      tsr_kernel_attention_forward(oA, lA, u.q, kA, vA, qp, ka, B, Hq, Hkv, Lq, La, D, true),
      TSR_OK);
  assert_int_equal(
      tsr_kernel_attention_forward(oB, lB, u.q, kB, vB, qp, kb, B, Hq, Hkv, Lq, Lb, D, true),
      TSR_OK);
  assert_true(lA[0] == -INFINITY); /* query 0 sees nothing in A */
  tsr_kernel_attention_merge(om, lm, oA, lA, oB, lB, (int)u.nl, D);

  double *want = calloc((size_t)u.nq, sizeof(double)), *want_l = calloc((size_t)u.nl, 8);
  for (int64_t i = 0; i < u.nq; i++) want[i] = u.out[i];
  for (int64_t i = 0; i < u.nl; i++) want_l[i] = u.lse[i];
  test_check_close("merge out", om, want, u.nq, 1e-5, 1e-6);
  test_check_close("merge lse", lm, want_l, u.nl, 1e-5, 1e-6);

  /* In place, as a ring step updates its running result. */
  tsr_kernel_attention_merge(oA, lA, oA, lA, oB, lB, (int)u.nl, D);
  assert_memory_equal(oA, om, (size_t)u.nq * sizeof(float));
  assert_memory_equal(lA, lm, (size_t)u.nl * sizeof(float));

  /* Both sides empty: out 0, lse -inf, no NaN. */
  float ninf[1] = {-INFINITY}, z[2] = {0, 0}, o[2] = {7, 7}, l[1];
  tsr_kernel_attention_merge(o, l, z, ninf, z, ninf, 1, 2);
  assert_true(o[0] == 0.0f && o[1] == 0.0f && l[0] == -INFINITY);

  free(kA), free(vA), free(kB), free(vB), free(oA), free(lA), free(oB), free(lB), free(om),
      free(lm), free(want), free(want_l);
  bufs_free(&u);
}

static double attention_loss(void *p) {
  attn_bufs *a = p;
  assert_int_equal(run_forward(a), TSR_OK);
  return test_weighted_sum(a->out, a->wout, a->nq);
}

static void check_backward(const attn_case *c, uint64_t seed) {
  attn_bufs a;
  bufs_init(&a, c, seed);
  assert_int_equal(run_forward(&a), TSR_OK);
  float *dq = test_alloc(a.nq), *dk = test_alloc(a.nk), *dv = test_alloc(a.nk);
  assert_int_equal(tsr_kernel_attention_backward(dq, dk, dv, a.wout, a.q, a.k, a.v, a.out, a.lse,
                                                 c->q_pos, c->k_pos, c->B, c->Hq, c->Hkv, c->Lq,
                                                 c->Lk, c->D, c->causal),
                   TSR_OK);
  double *rq = calloc((size_t)a.nq, sizeof(double)), *rk = calloc((size_t)a.nk, sizeof(double));
  double *rv = calloc((size_t)a.nk, sizeof(double));
  attention_backward_reference(rq, rk, rv, a.wout, a.q, a.k, a.v, c);
  test_check_close("attention dq vs reference", dq, rq, a.nq, 1e-4, 1e-5);
  test_check_close("attention dk vs reference", dk, rk, a.nk, 1e-4, 1e-5);
  test_check_close("attention dv vs reference", dv, rv, a.nk, 1e-4, 1e-5);
  free(rq), free(rk), free(rv);
  test_check_grad("attention dq", a.q, a.nq, dq, attention_loss, &a);
  test_check_grad("attention dk", a.k, a.nk, dk, attention_loss, &a);
  test_check_grad("attention dv", a.v, a.nk, dv, attention_loss, &a);
  free(dq), free(dk), free(dv);
  bufs_free(&a);
}

static void test_attention_backward(void **state) {
  (void)state;
  check_backward(&(attn_case){1, 4, 2, 5, 6, 4, true, NULL, NULL}, 6);
  check_backward(&(attn_case){2, 2, 2, 3, 4, 4, false, NULL, NULL}, 7);
  /* fully masked rows must contribute nothing */
  check_backward(&(attn_case){1, 2, 1, 8, 6, 4, true, zig_q, late_k}, 8);
  /* keys over two blocks */
  check_backward(&(attn_case){1, 2, 1, 3, 70, 4, true, NULL, NULL}, 9);
}

/* Ring attention's backward: with the merged out and lse, each key block's kernel call yields
 * that block's dk/dv and a share of dq; the shares sum to the full gradient. */
static void test_attention_backward_blocks(void **state) {
  (void)state;
  const int B = 1, Hq = 2, Hkv = 1, Lq = 6, La = 4, Lb = 5, D = 4, Lk = La + Lb;
  static const int32_t qp[6] = {2, 3, 4, 9, 10, 11};
  static const int32_t kall[9] = {0, 1, 2, 3, 8, 9, 10, 11, 12};
  attn_case cu = {B, Hq, Hkv, Lq, Lk, D, true, qp, kall};
  attn_bufs u;
  bufs_init(&u, &cu, 10);
  assert_int_equal(run_forward(&u), TSR_OK);
  float *dq = test_alloc(u.nq), *dk = test_alloc(u.nk), *dv = test_alloc(u.nk);
  assert_int_equal(tsr_kernel_attention_backward(dq, dk, dv, u.wout, u.q, u.k, u.v, u.out, u.lse,
                                                 qp, kall, B, Hq, Hkv, Lq, Lk, D, true),
                   TSR_OK);
  float *dq_blocks = test_alloc(u.nq), *dkv_blocks = test_alloc(2 * u.nk);
  float *dk_b = dkv_blocks, *dv_b = dkv_blocks + u.nk;
  /* Hkv == 1, B == 1: the key block A is rows [0, La) of k, block B rows [La, Lk). */
  assert_int_equal(tsr_kernel_attention_backward(dq_blocks, dk_b, dv_b, u.wout, u.q, u.k, u.v,
                                                 u.out, u.lse, qp, kall, B, Hq, Hkv, Lq, La, D,
                                                 true),
                   TSR_OK);
  assert_int_equal(tsr_kernel_attention_backward(dq_blocks, dk_b + La * D, dv_b + La * D, u.wout,
                                                 u.q, u.k + La * D, u.v + La * D, u.out, u.lse, qp,
                                                 kall + La, B, Hq, Hkv, Lq, Lb, D, true),
                   TSR_OK);
  double *want = calloc((size_t)u.nq, sizeof(double));
  for (int64_t i = 0; i < u.nq; i++) want[i] = dq[i];
  test_check_close("block dq", dq_blocks, want, u.nq, 1e-5, 1e-6);
  double *wk = calloc((size_t)u.nk, sizeof(double)), *wv = calloc((size_t)u.nk, sizeof(double));
  for (int64_t i = 0; i < u.nk; i++) wk[i] = dk[i], wv[i] = dv[i];
  test_check_close("block dk", dk_b, wk, u.nk, 1e-5, 1e-6);
  test_check_close("block dv", dv_b, wv, u.nk, 1e-5, 1e-6);
  free(dq), free(dk), free(dv), free(dq_blocks), free(dkv_blocks), free(want), free(wk), free(wv);
  bufs_free(&u);
}

/* Splitting the heads over threads changes nothing, bit for bit. */
static void test_attention_threads(void **state) {
  (void)state;
  attn_case c = {2, 4, 2, 40, 40, 32, true, NULL, NULL};
  attn_bufs a;
  bufs_init(&a, &c, 11);
  float *o1 = test_alloc(a.nq), *dq1 = test_alloc(a.nq), *dk1 = test_alloc(a.nk);
  float *dv1 = test_alloc(a.nk), *dq2 = test_alloc(a.nq), *dk2 = test_alloc(a.nk);
  float *dv2 = test_alloc(a.nk);
  tsr_kernel_set_threads(1);
  assert_int_equal(run_forward(&a), TSR_OK);
  memcpy(o1, a.out, (size_t)a.nq * sizeof(float));
  assert_int_equal(tsr_kernel_attention_backward(dq1, dk1, dv1, a.wout, a.q, a.k, a.v, a.out, a.lse,
                                                 NULL, NULL, c.B, c.Hq, c.Hkv, c.Lq, c.Lk, c.D,
                                                 true),
                   TSR_OK);
  tsr_kernel_set_threads(3);
  assert_int_equal(run_forward(&a), TSR_OK);
  assert_memory_equal(o1, a.out, (size_t)a.nq * sizeof(float));
  assert_int_equal(tsr_kernel_attention_backward(dq2, dk2, dv2, a.wout, a.q, a.k, a.v, a.out, a.lse,
                                                 NULL, NULL, c.B, c.Hq, c.Hkv, c.Lq, c.Lk, c.D,
                                                 true),
                   TSR_OK);
  tsr_kernel_set_threads(1);
  assert_memory_equal(dq1, dq2, (size_t)a.nq * sizeof(float));
  assert_memory_equal(dk1, dk2, (size_t)a.nk * sizeof(float));
  assert_memory_equal(dv1, dv2, (size_t)a.nk * sizeof(float));
  free(o1), free(dq1), free(dk1), free(dv1), free(dq2), free(dk2), free(dv2);
  bufs_free(&a);
}

/* The (B, L, H, D) entry points equal the (B, H, L, D) ones on transposed tensors, bit for bit:
 * GQA, a causal mask through tiles, several key and query tiles, positions with empty rows. */
static void check_blhd(const attn_case *c, uint64_t seed) {
  attn_bufs a;
  bufs_init(&a, c, seed);
  assert_int_equal(run_forward(&a), TSR_OK);
  float *dq = test_alloc(a.nq), *dk = test_alloc(a.nk), *dv = test_alloc(a.nk);
  assert_int_equal(tsr_kernel_attention_backward(dq, dk, dv, a.wout, a.q, a.k, a.v, a.out, a.lse,
                                                 c->q_pos, c->k_pos, c->B, c->Hq, c->Hkv, c->Lq,
                                                 c->Lk, c->D, c->causal),
                   TSR_OK);
  /* the same inputs in the projection layout; the gradients start from the same (zero) state */
  float *q = test_alloc(a.nq), *k = test_alloc(a.nk), *v = test_alloc(a.nk), *g = test_alloc(a.nq);
  float *o = test_alloc(a.nq), *l = test_alloc(a.nl), *dq2 = test_alloc(a.nq);
  float *dk2 = test_alloc(a.nk), *dv2 = test_alloc(a.nk),
        *t = test_alloc(a.nq > a.nk ? a.nq : a.nk);
  tsr_kernel_bhld_to_blhd(q, a.q, c->B, c->Lq, c->Hq, c->D);
  tsr_kernel_bhld_to_blhd(g, a.wout, c->B, c->Lq, c->Hq, c->D);
  tsr_kernel_bhld_to_blhd(k, a.k, c->B, c->Lk, c->Hkv, c->D);
  tsr_kernel_bhld_to_blhd(v, a.v, c->B, c->Lk, c->Hkv, c->D);
  assert_int_equal(tsr_kernel_attention_forward_blhd(o, l, q, k, v, c->q_pos, c->k_pos, c->B, c->Hq,
                                                     c->Hkv, c->Lq, c->Lk, c->D, c->causal),
                   TSR_OK);
  assert_memory_equal(l, a.lse, (size_t)a.nl * sizeof(float));
  tsr_kernel_blhd_to_bhld(t, o, c->B, c->Lq, c->Hq, c->D);
  assert_memory_equal(t, a.out, (size_t)a.nq * sizeof(float));
  assert_int_equal(tsr_kernel_attention_backward_blhd(dq2, dk2, dv2, g, q, k, v, o, l, c->q_pos,
                                                      c->k_pos, c->B, c->Hq, c->Hkv, c->Lq, c->Lk,
                                                      c->D, c->causal),
                   TSR_OK);
  tsr_kernel_blhd_to_bhld(t, dq2, c->B, c->Lq, c->Hq, c->D);
  assert_memory_equal(t, dq, (size_t)a.nq * sizeof(float));
  tsr_kernel_blhd_to_bhld(t, dk2, c->B, c->Lk, c->Hkv, c->D);
  assert_memory_equal(t, dk, (size_t)a.nk * sizeof(float));
  tsr_kernel_blhd_to_bhld(t, dv2, c->B, c->Lk, c->Hkv, c->D);
  assert_memory_equal(t, dv, (size_t)a.nk * sizeof(float));
  free(dq), free(dk), free(dv), free(q), free(k), free(v), free(g), free(o), free(l), free(dq2);
  free(dk2), free(dv2), free(t);
  bufs_free(&a);
}

static void test_attention_blhd(void **state) {
  (void)state;
  check_blhd(&(attn_case){2, 4, 2, 150, 150, 16, true, NULL, NULL}, 12);
  check_blhd(&(attn_case){1, 2, 1, 8, 6, 4, true, zig_q, late_k}, 13);
  check_blhd(&(attn_case){1, 3, 3, 5, 70, 8, false, NULL, NULL}, 14);
}

static void test_attention_errors(void **state) {
  (void)state;
  float x[16] = {0}, l[4];
  assert_int_equal(tsr_kernel_attention_forward(x, l, x, x, x, NULL, NULL, 1, 3, 2, 1, 1, 4, true),
                   TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "query heads 3"));
  assert_int_equal(
      tsr_kernel_attention_backward(x, x, x, x, x, x, x, x, l, NULL, NULL, 1, 2, 1, 1, 1, 0, true),
      TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "head_dim 0"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_forward),  cmocka_unit_test(test_attention_merge),
      cmocka_unit_test(test_attention_backward), cmocka_unit_test(test_attention_backward_blocks),
      cmocka_unit_test(test_attention_threads),  cmocka_unit_test(test_attention_blhd),
      cmocka_unit_test(test_attention_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
