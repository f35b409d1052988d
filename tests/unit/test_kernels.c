/* CPU kernels: GEMM, RMSNorm, RoPE, SwiGLU, embedding, cross-entropy, AdamW, grad norm, threads.
 * Forwards against double-precision references written here; backwards against central finite
 * differences (test_kernels_util.h). Attention is in test_kernels_attention.c. */
#include <string.h>

#include "test_kernels_util.h"
#include "tessera/kernels.h"

/* ---------------------------------------------------------------------------------------------
 * GEMM
 * ------------------------------------------------------------------------------------------- */

static void test_gemm_transposes(void **state) {
  (void)state;
  uint64_t s = 1;
  const int M = 5, N = 7, K = 3;
  float a[5 * 3], b[3 * 7], c[5 * 7], c0[5 * 7];
  double want[5 * 7];
  test_fill(a, M * K, &s, -1, 1);
  test_fill(b, K * N, &s, -1, 1);
  test_fill(c0, M * N, &s, -1, 1);
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      /* The same logical operands stored transposed when asked, so every case has one answer. */
      float as[5 * 3], bs[3 * 7];
      for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) as[ta ? k * M + i : i * K + k] = a[i * K + k];
      for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) bs[tb ? j * K + k : k * N + j] = b[k * N + j];
      memcpy(c, c0, sizeof c);
      tsr_kernel_gemm(c, as, bs, M, N, K, ta, tb, 0.5f, 2.0f);
      for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
          double acc = 0;
          for (int k = 0; k < K; k++) acc += (double)a[i * K + k] * b[k * N + j];
          want[i * N + j] = 0.5 * acc + 2.0 * c0[i * N + j];
        }
      }
      test_check_close("gemm", c, want, M * N, 1e-5, 1e-6);
    }
  }
  /* K == 0: an empty sum, so c = beta · c. */
  memcpy(c, c0, sizeof c);
  tsr_kernel_gemm(c, a, b, M, N, 0, false, false, 1.0f, 2.0f);
  for (int i = 0; i < M * N; i++) assert_true(c[i] == 2.0f * c0[i]);
}

typedef struct linear_ctx {
  float *x, *w, *bias, *out, *wout;
  int N, C, OC;
} linear_ctx;

static double linear_loss(void *p) {
  linear_ctx *c = p;
  tsr_kernel_matmul_forward(c->out, c->x, c->w, c->bias, c->N, c->C, c->OC);
  return test_weighted_sum(c->out, c->wout, (int64_t)c->N * c->OC);
}

static void test_matmul_forward_backward(void **state) {
  (void)state;
  uint64_t s = 2;
  linear_ctx c = {.N = 6, .C = 5, .OC = 4};
  c.x = test_alloc(c.N * c.C);
  c.w = test_alloc(c.OC * c.C);
  c.bias = test_alloc(c.OC);
  c.out = test_alloc(c.N * c.OC);
  c.wout = test_alloc(c.N * c.OC);
  test_fill(c.x, c.N * c.C, &s, -1, 1);
  test_fill(c.w, c.OC * c.C, &s, -1, 1);
  test_fill(c.bias, c.OC, &s, -1, 1);
  test_fill(c.wout, c.N * c.OC, &s, -1, 1);

  tsr_kernel_matmul_forward(c.out, c.x, c.w, c.bias, c.N, c.C, c.OC);
  double want[6 * 4];
  for (int i = 0; i < c.N; i++) {
    for (int o = 0; o < c.OC; o++) {
      double acc = c.bias[o];
      for (int k = 0; k < c.C; k++) acc += (double)c.x[i * c.C + k] * c.w[o * c.C + k];
      want[i * c.OC + o] = acc;
    }
  }
  test_check_close("linear forward", c.out, want, c.N * c.OC, 1e-5, 1e-6);

  float *dx = test_alloc(c.N * c.C), *dw = test_alloc(c.OC * c.C), *db = test_alloc(c.OC);
  tsr_kernel_matmul_backward(dx, dw, db, c.wout, c.x, c.w, c.N, c.C, c.OC);
  test_check_grad("linear dx", c.x, c.N * c.C, dx, linear_loss, &c);
  test_check_grad("linear dw", c.w, c.OC * c.C, dw, linear_loss, &c);
  test_check_grad("linear dbias", c.bias, c.OC, db, linear_loss, &c);

  /* Gradients accumulate: a second backward doubles them. */
  float dx1 = dx[3];
  tsr_kernel_matmul_backward(dx, NULL, NULL, c.wout, c.x, c.w, c.N, c.C, c.OC);
  assert_float_equal(dx[3], 2 * dx1, 1e-6 * fabs(dx1) + 1e-7);
  free(dx), free(dw), free(db), free(c.x), free(c.w), free(c.bias), free(c.out), free(c.wout);
}

/* bf16 rounding, nearest even, written here from the format (not tsr_f32_to_bf16): keep the
 * top 16 bits after adding half an ulp of bf16, plus one when the kept part is odd. */
static double bf16_ref(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The mixed-precision linear against double sums of bf16-rounded operands: the forward, and a
 * backward that rounds dout, x and w the same way (the rounding passes gradients straight
 * through). The bias and its gradient stay f32. */
static void test_matmul_bf16(void **state) {
  (void)state;
  uint64_t s = 5;
  const int N = 7, C = 33, OC = 6;
  float x[7 * 33], w[6 * 33], bias[6], out[7 * 6], f32[7 * 6], dout[7 * 6];
  float dx[7 * 33] = {0}, dw[6 * 33] = {0}, db[6] = {0};
  double want[7 * 33];
  test_fill(x, N * C, &s, -1, 1);
  test_fill(w, OC * C, &s, -1, 1);
  test_fill(bias, OC, &s, -1, 1);
  test_fill(dout, N * OC, &s, -1, 1);
  assert_int_equal(tsr_kernel_matmul_forward_bf16(out, x, w, bias, N, C, OC), TSR_OK);
  for (int i = 0; i < N; i++)
    for (int o = 0; o < OC; o++) {
      double acc = 0;
      for (int k = 0; k < C; k++) acc += bf16_ref(x[i * C + k]) * bf16_ref(w[o * C + k]);
      want[i * OC + o] = acc + bias[o];
    }
  test_check_close("bf16 linear forward", out, want, N * OC, 1e-5, 1e-6);
  /* and it is not the f32 product: the rounding is visible at this size */
  tsr_kernel_matmul_forward(f32, x, w, bias, N, C, OC);
  double worst = 0;
  for (int i = 0; i < N * OC; i++) worst = fmax(worst, fabs((double)f32[i] - out[i]));
  assert_true(worst > 1e-4);

  assert_int_equal(tsr_kernel_matmul_backward_bf16(dx, dw, db, dout, x, w, N, C, OC), TSR_OK);
  for (int i = 0; i < N; i++)
    for (int k = 0; k < C; k++) {
      double acc = 0;
      for (int o = 0; o < OC; o++) acc += bf16_ref(dout[i * OC + o]) * bf16_ref(w[o * C + k]);
      want[i * C + k] = acc;
    }
  test_check_close("bf16 linear dx", dx, want, N * C, 1e-5, 1e-6);
  for (int o = 0; o < OC; o++)
    for (int k = 0; k < C; k++) {
      double acc = 0;
      for (int i = 0; i < N; i++) acc += bf16_ref(dout[i * OC + o]) * bf16_ref(x[i * C + k]);
      want[o * C + k] = acc;
    }
  test_check_close("bf16 linear dw", dw, want, OC * C, 1e-5, 1e-6);
  for (int o = 0; o < OC; o++) {
    double acc = 0;
    for (int i = 0; i < N; i++) acc += dout[i * OC + o];
    want[o] = acc;
  }
  test_check_close("bf16 linear dbias", db, want, OC, 1e-5, 1e-6);
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm
 * ------------------------------------------------------------------------------------------- */

typedef struct rms_ctx {
  float *x, *w, *out, *rstd, *wout;
  int N, C;
  float eps;
} rms_ctx;

static double rms_loss(void *p) {
  rms_ctx *c = p;
  tsr_kernel_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->N, c->C, c->eps);
  return test_weighted_sum(c->out, c->wout, (int64_t)c->N * c->C);
}

static void test_rmsnorm(void **state) {
  (void)state;
  uint64_t s = 3;
  rms_ctx c = {.N = 4, .C = 16, .eps = 1e-5f};
  int64_t n = c.N * c.C;
  c.x = test_alloc(n), c.w = test_alloc(c.C), c.out = test_alloc(n), c.rstd = test_alloc(c.N);
  c.wout = test_alloc(n);
  test_fill(c.x, n, &s, -2, 2);
  test_fill(c.w, c.C, &s, 0.5f, 1.5f);
  test_fill(c.wout, n, &s, -1, 1);

  tsr_kernel_rmsnorm_forward(c.out, c.rstd, c.x, c.w, c.N, c.C, c.eps);
  double want[4 * 16];
  for (int i = 0; i < c.N; i++) {
    double ss = 0;
    for (int j = 0; j < c.C; j++) ss += (double)c.x[i * c.C + j] * c.x[i * c.C + j];
    double r = 1.0 / sqrt(ss / c.C + c.eps);
    for (int j = 0; j < c.C; j++) want[i * c.C + j] = c.x[i * c.C + j] * r * c.w[j];
  }
  test_check_close("rmsnorm forward", c.out, want, n, 1e-5, 1e-6);

  float *dx = test_alloc(n), *dw = test_alloc(c.C);
  tsr_kernel_rmsnorm_backward(dx, dw, c.wout, c.x, c.w, c.rstd, c.N, c.C);
  test_check_grad("rmsnorm dx", c.x, n, dx, rms_loss, &c);
  test_check_grad("rmsnorm dw", c.w, c.C, dw, rms_loss, &c);
  free(dx), free(dw), free(c.x), free(c.w), free(c.out), free(c.rstd), free(c.wout);
}

/* ---------------------------------------------------------------------------------------------
 * RoPE
 * ------------------------------------------------------------------------------------------- */

typedef struct rope_ctx {
  float *x, *out, *cos_t, *sin_t, *wout;
  int B, L, H, D;
} rope_ctx;

static double rope_loss(void *p) {
  rope_ctx *c = p;
  tsr_kernel_rope_forward(c->out, c->x, c->cos_t, c->sin_t, c->B, c->L, c->H, c->D);
  return test_weighted_sum(c->out, c->wout, (int64_t)c->B * c->L * c->H * c->D);
}

static void test_rope(void **state) {
  (void)state;
  uint64_t s = 4;
  rope_ctx c = {.B = 2, .L = 5, .H = 3, .D = 8};
  int64_t n = (int64_t)c.B * c.L * c.H * c.D;
  /* Global positions of a zigzag shard: not contiguous, not starting at 0. */
  int32_t pos[5] = {3, 4, 11, 12, 40};
  const double theta = 10000.0;
  c.x = test_alloc(n), c.out = test_alloc(n), c.wout = test_alloc(n);
  c.cos_t = test_alloc(c.L * c.D), c.sin_t = test_alloc(c.L * c.D);
  test_fill(c.x, n, &s, -1, 1);
  test_fill(c.wout, n, &s, -1, 1);
  assert_int_equal(tsr_kernel_rope_tables(c.cos_t, c.sin_t, pos, c.L, c.D, (float)theta), TSR_OK);

  /* Reference: HF's formula in double. f32 angles carry a relative error of ~6e-8 · position,
   * hence the absolute tolerance. */
  double *want = calloc((size_t)n, sizeof(double));
  for (int l = 0; l < c.L; l++) {
    for (int i = 0; i < c.D; i++) {
      double ang = pos[l] * pow(theta, -2.0 * (i % (c.D / 2)) / c.D);
      assert_true(fabs(c.cos_t[l * c.D + i] - cos(ang)) < 1e-5);
      assert_true(fabs(c.sin_t[l * c.D + i] - sin(ang)) < 1e-5);
    }
  }
  for (int b = 0; b < c.B; b++) {
    for (int l = 0; l < c.L; l++) {
      for (int h = 0; h < c.H; h++) {
        const float *xh = c.x + ((b * c.L + l) * c.H + h) * c.D;
        double *wh = want + ((b * c.L + l) * c.H + h) * c.D;
        for (int i = 0; i < c.D; i++) {
          int half = c.D / 2;
          double rot = i < half ? -(double)xh[i + half] : (double)xh[i - half];
          double ang = pos[l] * pow(theta, -2.0 * (i % half) / c.D);
          wh[i] = xh[i] * cos(ang) + rot * sin(ang);
        }
      }
    }
  }
  tsr_kernel_rope_forward(c.out, c.x, c.cos_t, c.sin_t, c.B, c.L, c.H, c.D);
  test_check_close("rope forward", c.out, want, n, 1e-5, 2e-5);

  /* In place gives the same bits. */
  float *inplace = test_alloc(n);
  memcpy(inplace, c.x, (size_t)n * sizeof(float));
  tsr_kernel_rope_forward(inplace, inplace, c.cos_t, c.sin_t, c.B, c.L, c.H, c.D);
  assert_memory_equal(inplace, c.out, (size_t)n * sizeof(float));

  float *dx = test_alloc(n);
  tsr_kernel_rope_backward(dx, c.wout, c.cos_t, c.sin_t, c.B, c.L, c.H, c.D);
  test_check_grad("rope dx", c.x, n, dx, rope_loss, &c);

  /* NULL positions are 0 .. L-1. */
  int32_t arange[5] = {0, 1, 2, 3, 4};
  float ca[5 * 8], sa[5 * 8], cn[5 * 8], sn[5 * 8];
  assert_int_equal(tsr_kernel_rope_tables(ca, sa, arange, c.L, c.D, 1e4f), TSR_OK);
  assert_int_equal(tsr_kernel_rope_tables(cn, sn, NULL, c.L, c.D, 1e4f), TSR_OK);
  assert_memory_equal(ca, cn, sizeof ca);
  assert_memory_equal(sa, sn, sizeof sa);

  assert_int_equal(tsr_kernel_rope_tables(c.cos_t, c.sin_t, pos, c.L, 7, 1e4f), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "head_dim 7"));
  free(want), free(inplace), free(dx), free(c.x), free(c.out), free(c.wout), free(c.cos_t),
      free(c.sin_t);
}

static void test_head_layout_roundtrip(void **state) {
  (void)state;
  uint64_t s = 5;
  const int B = 2, L = 3, H = 4, D = 5;
  int64_t n = B * L * H * D;
  float *x = test_alloc(n), *y = test_alloc(n), *z = test_alloc(n);
  test_fill(x, n, &s, -1, 1);
  tsr_kernel_blhd_to_bhld(y, x, B, L, H, D);
  /* element (b=1, l=2, h=3, d=4) */
  assert_true(y[((1 * H + 3) * L + 2) * D + 4] == x[((1 * L + 2) * H + 3) * D + 4]);
  tsr_kernel_bhld_to_blhd(z, y, B, L, H, D);
  assert_memory_equal(x, z, (size_t)n * sizeof(float));
  free(x), free(y), free(z);
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU
 * ------------------------------------------------------------------------------------------- */

typedef struct swiglu_ctx {
  float *gate, *up, *out, *wout;
  int64_t n;
} swiglu_ctx;

static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  tsr_kernel_swiglu_forward(c->out, c->gate, c->up, c->n);
  return test_weighted_sum(c->out, c->wout, c->n);
}

static void test_swiglu(void **state) {
  (void)state;
  uint64_t s = 6;
  swiglu_ctx c = {.n = 40};
  c.gate = test_alloc(c.n), c.up = test_alloc(c.n), c.out = test_alloc(c.n);
  c.wout = test_alloc(c.n);
  test_fill(c.gate, c.n, &s, -4, 4);
  test_fill(c.up, c.n, &s, -2, 2);
  test_fill(c.wout, c.n, &s, -1, 1);
  tsr_kernel_swiglu_forward(c.out, c.gate, c.up, c.n);
  double want[40];
  for (int i = 0; i < c.n; i++) want[i] = c.gate[i] / (1.0 + exp(-(double)c.gate[i])) * c.up[i];
  test_check_close("swiglu forward", c.out, want, c.n, 1e-5, 1e-6);

  float *dg = test_alloc(c.n), *du = test_alloc(c.n);
  tsr_kernel_swiglu_backward(dg, du, c.wout, c.gate, c.up, c.n);
  test_check_grad("swiglu dgate", c.gate, c.n, dg, swiglu_loss, &c);
  test_check_grad("swiglu dup", c.up, c.n, du, swiglu_loss, &c);

  /* Saturated gates stay finite in both directions. */
  float g2[2] = {-200.0f, 200.0f}, u2[2] = {1.0f, 1.0f}, o2[2], dg2[2] = {0}, du2[2] = {0};
  float ones[2] = {1.0f, 1.0f};
  tsr_kernel_swiglu_forward(o2, g2, u2, 2);
  tsr_kernel_swiglu_backward(dg2, du2, ones, g2, u2, 2);
  assert_true(o2[0] == 0.0f && o2[1] == 200.0f);
  assert_true(isfinite(dg2[0]) && isfinite(dg2[1]) && fabsf(dg2[1] - 1.0f) < 1e-6f);
  free(dg), free(du), free(c.gate), free(c.up), free(c.out), free(c.wout);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding
 * ------------------------------------------------------------------------------------------- */

static void test_embedding(void **state) {
  (void)state;
  uint64_t s = 7;
  const int V = 6, C = 3, N = 5;
  float table[6 * 3], out[5 * 3], dtable[6 * 3] = {0}, dout[5 * 3];
  int32_t ids[5] = {2, 0, 2, 5, 1};
  test_fill(table, V * C, &s, -1, 1);
  test_fill(dout, N * C, &s, -1, 1);
  assert_int_equal(tsr_kernel_embedding_forward(out, ids, table, N, V, C), TSR_OK);
  for (int i = 0; i < N; i++) assert_memory_equal(out + i * C, table + ids[i] * C, C * 4);

  assert_int_equal(tsr_kernel_embedding_backward(dtable, dout, ids, N, V, C), TSR_OK);
  for (int j = 0; j < C; j++) {
    assert_true(dtable[2 * C + j] == dout[0 * C + j] + dout[2 * C + j]); /* id 2 used twice */
    assert_true(dtable[3 * C + j] == 0.0f);                              /* id 3 unused */
    assert_true(dtable[5 * C + j] == dout[3 * C + j]);
  }

  int32_t bad[5] = {1, 2, 6, 0, 0};
  float before[5 * 3];
  memcpy(before, out, sizeof out);
  assert_int_equal(tsr_kernel_embedding_forward(out, bad, table, N, V, C), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "token id 6 at position 2"));
  assert_memory_equal(before, out, sizeof out); /* nothing written on error */
  bad[2] = -1;
  assert_int_equal(tsr_kernel_embedding_backward(dtable, dout, bad, N, V, C), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "token id -1"));
}

/* ---------------------------------------------------------------------------------------------
 * Cross-entropy
 * ------------------------------------------------------------------------------------------- */

/* Mean over non-ignored rows of logsumexp(row) − row[target], in double. */
static double ce_reference(const float *logits, const int32_t *t, int N, int V) {
  double total = 0;
  int count = 0;
  for (int i = 0; i < N; i++) {
    if (t[i] == TSR_IGNORE_INDEX) continue;
    double m = -INFINITY, se = 0;
    for (int j = 0; j < V; j++) m = fmax(m, logits[i * V + j]);
    for (int j = 0; j < V; j++) se += exp(logits[i * V + j] - m);
    total += m + log(se) - logits[i * V + t[i]];
    count++;
  }
  return total / count;
}

typedef struct ce_ctx {
  float *logits;
  const int32_t *targets;
  int N, V;
} ce_ctx;

static double ce_loss(void *p) {
  ce_ctx *c = p;
  float loss;
  assert_int_equal(
      tsr_kernel_cross_entropy(&loss, NULL, NULL, c->logits, c->targets, c->N, c->V, 1.0f), TSR_OK);
  return loss;
}

static void test_cross_entropy(void **state) {
  (void)state;
  uint64_t s = 8;
  enum { N = 6, V = 13 };
  float logits[N * V], dlogits[N * V] = {0}, loss;
  int32_t targets[N] = {3, TSR_IGNORE_INDEX, 0, 12, TSR_IGNORE_INDEX, 7};
  int count = -1;
  test_fill(logits, N * V, &s, -3, 3);
  assert_int_equal(tsr_kernel_cross_entropy(&loss, &count, dlogits, logits, targets, N, V, 1.0f),
                   TSR_OK);
  assert_int_equal(count, 4);
  double want = ce_reference(logits, targets, N, V);
  assert_true(fabs(loss - want) <= 1e-6 * fabs(want) + 1e-7);
  for (int j = 0; j < V; j++) assert_true(dlogits[1 * V + j] == 0.0f); /* ignored rows */
  ce_ctx c = {logits, targets, N, V};
  test_check_grad("cross_entropy dlogits", logits, N * V, dlogits, ce_loss, &c);

  /* Stable for logits far beyond exp's f32 range. */
  float big[2 * 3] = {1e4f, 1e4f - 1, 1e4f - 2, -1e4f, -1e4f, -1e4f};
  int32_t bt[2] = {0, 2};
  assert_int_equal(tsr_kernel_cross_entropy(&loss, NULL, NULL, big, bt, 2, 3, 1.0f), TSR_OK);
  double l0 = log(1 + exp(-1.0) + exp(-2.0)), l1 = log(3.0);
  assert_true(fabs(loss - (l0 + l1) / 2) < 1e-5);

  /* All ignored: NaN like torch, and no gradient. */
  int32_t none[2] = {TSR_IGNORE_INDEX, TSR_IGNORE_INDEX};
  float d2[2 * 3] = {0};
  assert_int_equal(tsr_kernel_cross_entropy(&loss, &count, d2, big, none, 2, 3, 1.0f), TSR_OK);
  assert_true(isnan(loss) && count == 0);
  for (int j = 0; j < 6; j++) assert_true(d2[j] == 0.0f);

  int32_t badt[2] = {0, 3};
  assert_int_equal(tsr_kernel_cross_entropy(&loss, NULL, NULL, big, badt, 2, 3, 1.0f), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "target 3 at position 1"));
}

/* The vocabulary split 7 + 6 over two "ranks", combined by hand, reproduces the fused loss and
 * its gradient. */
static void test_cross_entropy_vocab_parallel(void **state) {
  (void)state;
  uint64_t s = 9;
  enum { N = 5, V = 13, V0 = 7, V1 = 6 };
  float logits[N * V], dfull[N * V] = {0}, loss;
  int32_t targets[N] = {2, 9, TSR_IGNORE_INDEX, 6, 7};
  test_fill(logits, N * V, &s, -3, 3);
  int count;
  assert_int_equal(tsr_kernel_cross_entropy(&loss, &count, dfull, logits, targets, N, V, 1.0f),
                   TSR_OK);

  float shard0[N * V0], shard1[N * V1], d0[N * V0] = {0}, d1[N * V1] = {0};
  for (int i = 0; i < N; i++) {
    memcpy(shard0 + i * V0, logits + i * V, V0 * sizeof(float));
    memcpy(shard1 + i * V1, logits + i * V + V0, V1 * sizeof(float));
  }
  float m0[N], m1[N], mx[N], s0[N], s1[N], se[N], t0[N], t1[N];
  tsr_kernel_logits_row_max(m0, shard0, N, V0);
  tsr_kernel_logits_row_max(m1, shard1, N, V1);
  for (int i = 0; i < N; i++) mx[i] = fmaxf(m0[i], m1[i]); /* all-reduce max */
  tsr_kernel_logits_row_sumexp(s0, shard0, mx, N, V0);
  tsr_kernel_logits_row_sumexp(s1, shard1, mx, N, V1);
  tsr_kernel_logits_target(t0, shard0, targets, N, V0, 0);
  tsr_kernel_logits_target(t1, shard1, targets, N, V1, V0);
  double total = 0;
  for (int i = 0; i < N; i++) {
    se[i] = s0[i] + s1[i]; /* all-reduce sum */
    if (targets[i] != TSR_IGNORE_INDEX) total += log(se[i]) + mx[i] - (t0[i] + t1[i]);
  }
  assert_true(fabs(total / count - loss) < 1e-6);
  tsr_kernel_cross_entropy_shard_backward(d0, shard0, targets, mx, se, N, V0, 0, 1.0f / count);
  tsr_kernel_cross_entropy_shard_backward(d1, shard1, targets, mx, se, N, V1, V0, 1.0f / count);
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < V; j++) {
      float got = j < V0 ? d0[i * V0 + j] : d1[i * V1 + j - V0];
      assert_true(fabsf(got - dfull[i * V + j]) < 1e-6f);
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * AdamW and grad norm
 * ------------------------------------------------------------------------------------------- */

static void adamw_reference(double *p, const double *g, double *m, double *v, int n, int step,
                            double lr, double b1, double b2, double eps, double wd) {
  for (int i = 0; i < n; i++) {
    p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mhat = m[i] / (1 - pow(b1, step)), vhat = v[i] / (1 - pow(b2, step));
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

static void check_adamw(double beta1, uint64_t seed) {
  uint64_t s = seed;
  enum { n = 32 };
  float p[n], g[n], m[n] = {0}, v[n] = {0};
  double pd[n], gd[n], md[n] = {0}, vd[n] = {0};
  test_fill(p, n, &s, -1, 1);
  for (int i = 0; i < n; i++) pd[i] = p[i];
  const double lr = 1e-2, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int step = 1; step <= 4; step++) {
    test_fill(g, n, &s, -1, 1);
    for (int i = 0; i < n; i++) gd[i] = g[i];
    tsr_kernel_adamw(p, g, m, v, n, step, lr, beta1, b2, eps, wd);
    adamw_reference(pd, gd, md, vd, n, step, lr, beta1, b2, eps, wd);
    /* f32 state against a double reference: a few ulps per step on parameters of size ~1. */
    test_check_close("adamw param", p, pd, n, 1e-6, 1e-6);
    test_check_close("adamw exp_avg", m, md, n, 1e-5, 1e-7);
    test_check_close("adamw exp_avg_sq", v, vd, n, 1e-5, 1e-8);
  }
}

static void test_adamw(void **state) {
  (void)state;
  check_adamw(0.9, 10); /* lerp weight 0.1: the m + w (g - m) branch */
  check_adamw(0.3, 11); /* lerp weight 0.7: the g - (1 - w)(g - m) branch */

  /* First step by hand: m = 0.1 g, v = 0.05 g², m̂ = g, v̂ = g², so p ← p(1 − lr wd) −
   * lr·g/(|g|+eps). */
  float p = 1.0f, g = 0.5f, m = 0, v = 0;
  tsr_kernel_adamw(&p, &g, &m, &v, 1, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1);
  assert_true(fabs(p - (1.0 * (1 - 1e-4) - 1e-3 * 0.5 / (0.5 + 1e-8))) < 1e-7);
}

static void test_grad_norm(void **state) {
  (void)state;
  float a[3] = {3, 0, 0}, b[2] = {0, 4};
  const float *bufs[2] = {a, b};
  int64_t sizes[2] = {3, 2};
  assert_true(tsr_kernel_global_norm(bufs, sizes, 2) == 5.0);
  assert_true(tsr_kernel_sum_squares(b, 2) == 16.0);
  assert_true(fabsf(tsr_kernel_clip_coef(5.0, 1.0) - (float)(1.0 / (5.0 + 1e-6))) < 1e-9f);
  assert_true(tsr_kernel_clip_coef(0.5, 1.0) == 1.0f);
  tsr_kernel_scale(a, 3, 0.5f);
  assert_true(a[0] == 1.5f);
}

/* ---------------------------------------------------------------------------------------------
 * Threads
 * ------------------------------------------------------------------------------------------- */

static void test_thread_budget(void **state) {
  (void)state;
  assert_int_equal(tsr_kernel_thread_budget(16, 4), 4);
  assert_int_equal(tsr_kernel_thread_budget(16, 5), 3);
  assert_int_equal(tsr_kernel_thread_budget(2, 8), 1);
  assert_int_equal(tsr_kernel_thread_budget(8, 0), 8);
  assert_true(tsr_kernel_num_cores() >= 1);
  tsr_kernel_set_threads(2);
  assert_int_equal(tsr_kernel_threads(), 2);
  tsr_kernel_set_threads(0);
  assert_int_equal(tsr_kernel_threads(), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_transposes),
      cmocka_unit_test(test_matmul_forward_backward),
      cmocka_unit_test(test_matmul_bf16),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_head_layout_roundtrip),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_cross_entropy_vocab_parallel),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_grad_norm),
      cmocka_unit_test(test_thread_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
