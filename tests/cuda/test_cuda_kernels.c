/* CUDA kernels against the CPU kernels, through the two kernel tables: every op of kernels.h,
 * forward and backward, on shapes that cross the CUDA kernels' block and chunk sizes. Skips with
 * the reason when the machine has no CUDA device.
 *
 * Tolerances: products and sums that the CUDA code rounds separately like the CPU code agree to
 * a few ulp (rtol 1e-5); expf/cosf differ from glibc by up to 2 ulp (rtol 1e-6 on their direct
 * outputs); sums over rows are associated differently on the device (tree reductions, atomics),
 * which for the sizes here (<= 300 terms of magnitude <= 1) moves results by at most
 * 300 · 2^-24 ≈ 2e-5 relative to the terms, hence rtol 1e-4 / atol 1e-5 for attention. AdamW is
 * element-wise with the CPU's rounding order and must match exactly. */
#include "cuda_test_util.h"

static const tsr_kernel_table *cpu, *gpu;

#define RTOL 1e-5
#define ATOL 1e-6

/* ---------------------------------------------------------------------------------------------
 * GEMM and nn.Linear
 * ------------------------------------------------------------------------------------------- */

static void gemm_case(int M, int N, int K, bool tf32) {
  uint64_t s = (uint64_t)(M * 131 + N * 7 + K);
  int64_t na = (int64_t)M * K, nb = (int64_t)K * N, nc = (int64_t)M * N;
  float *a = test_alloc(na), *b = test_alloc(nb), *c = test_alloc(nc), *c0 = test_alloc(nc);
  test_fill(a, na, &s, -1, 1);
  test_fill(b, nb, &s, -1, 1);
  test_fill(c0, nc, &s, -1, 1);
  tsr_cuda_ctx_set_tf32(g_ctx, tf32);
  /* TF32 keeps 10 mantissa bits of each input: each product is off by at most 2^-10 relative,
   * so |error| <= K · max|a| · max|b| · 2^-10 with inputs in [-1, 1]. IEEE f32 products on the
   * device differ from OpenBLAS only by the order of the K additions. */
  double atol = tf32 ? (K + 1) * ldexp(1.0, -10) : (K + 1) * 2e-7;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      float *da = dev_f(a, na), *db = dev_f(b, nb), *dc = dev_f(c0, nc);
      memcpy(c, c0, (size_t)nc * sizeof(float));
      /* The buffers are reinterpreted as transposed storage: both sides see the same bytes. */
      cpu->gemm(c, a, b, M, N, K, ta, tb, 0.5f, 2.0f);
      gpu->gemm(dc, da, db, M, N, K, ta, tb, 0.5f, 2.0f);
      check_dev(tf32 ? "gemm tf32" : "gemm f32", dc, c, nc, RTOL, atol);
      dev_free(da, na * 4);
      dev_free(db, nb * 4);
      dev_free(dc, nc * 4);
    }
  }
  tsr_cuda_ctx_set_tf32(g_ctx, true);
  free(a), free(b), free(c), free(c0);
}

static void test_gemm(void **state) {
  (void)state;
  gemm_case(5, 7, 3, false);
  gemm_case(67, 129, 300, false);
  gemm_case(67, 129, 300, true);
  gemm_case(4, 6, 0, false); /* empty reduction: c = beta · c */
}

/* The f32 linear (IEEE products), or the bf16 one: both sides round the same f32 inputs to the
 * same bf16 operands and their products are exact, so only the order of the f32 sums differs and
 * the f32 tolerance holds for it too. */
static void matmul_case(bool bf16) {
  const int N = 37, C = 70, OC = 45;
  uint64_t s = 11;
  float *x = test_alloc(N * C), *w = test_alloc(OC * C), *bias = test_alloc(OC);
  float *out = test_alloc(N * OC), *g = test_alloc(N * OC);
  float *dx = test_alloc(N * C), *dw = test_alloc(OC * C), *db = test_alloc(OC);
  test_fill(x, N * C, &s, -1, 1);
  test_fill(w, OC * C, &s, -1, 1);
  test_fill(bias, OC, &s, -1, 1);
  test_fill(g, N * OC, &s, -1, 1);
  test_fill(dx, N * C, &s, -1, 1); /* backward accumulates onto what is there */
  test_fill(dw, OC * C, &s, -1, 1);
  test_fill(db, OC, &s, -1, 1);
  tsr_cuda_ctx_set_tf32(g_ctx, false);
  float *d_x = dev_f(x, N * C), *d_w = dev_f(w, OC * C), *d_b = dev_f(bias, OC);
  float *d_out = dev_f(out, N * OC), *d_g = dev_f(g, N * OC);
  float *d_dx = dev_f(dx, N * C), *d_dw = dev_f(dw, OC * C), *d_db = dev_f(db, OC);
  if (bf16) {
    assert_int_equal(cpu->matmul_forward_bf16(out, x, w, bias, N, C, OC), TSR_OK);
    assert_int_equal(gpu->matmul_forward_bf16(d_out, d_x, d_w, d_b, N, C, OC), TSR_OK);
  } else {
    cpu->matmul_forward(out, x, w, bias, N, C, OC);
    gpu->matmul_forward(d_out, d_x, d_w, d_b, N, C, OC);
  }
  check_dev(bf16 ? "matmul bf16 forward" : "matmul forward", d_out, out, N * OC, RTOL, 1e-5);
  if (bf16) {
    assert_int_equal(cpu->matmul_backward_bf16(dx, dw, db, g, x, w, N, C, OC), TSR_OK);
    assert_int_equal(gpu->matmul_backward_bf16(d_dx, d_dw, d_db, d_g, d_x, d_w, N, C, OC), TSR_OK);
  } else {
    cpu->matmul_backward(dx, dw, db, g, x, w, N, C, OC);
    gpu->matmul_backward(d_dx, d_dw, d_db, d_g, d_x, d_w, N, C, OC);
  }
  check_dev(bf16 ? "matmul bf16 dx" : "matmul dx", d_dx, dx, N * C, RTOL, 1e-5);
  check_dev(bf16 ? "matmul bf16 dw" : "matmul dw", d_dw, dw, OC * C, RTOL, 1e-5);
  check_dev(bf16 ? "matmul bf16 dbias" : "matmul dbias", d_db, db, OC, RTOL, 1e-5);
  tsr_cuda_ctx_set_tf32(g_ctx, true);
  dev_free(d_x, N * C * 4), dev_free(d_w, OC * C * 4), dev_free(d_b, OC * 4);
  dev_free(d_out, N * OC * 4), dev_free(d_g, N * OC * 4);
  dev_free(d_dx, N * C * 4), dev_free(d_dw, OC * C * 4), dev_free(d_db, OC * 4);
  free(x), free(w), free(bias), free(out), free(g), free(dx), free(dw), free(db);
}

static void test_matmul(void **state) {
  (void)state;
  matmul_case(false);
}

static void test_matmul_bf16(void **state) {
  (void)state;
  matmul_case(true);
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm, RoPE, layouts, SwiGLU
 * ------------------------------------------------------------------------------------------- */

static void test_rmsnorm(void **state) {
  (void)state;
  const int N = 9, C = 300; /* C above the 256 threads of a row block */
  uint64_t s = 3;
  float *x = test_alloc(N * C), *w = test_alloc(C), *out = test_alloc(N * C), *rstd = test_alloc(N);
  float *g = test_alloc(N * C), *dx = test_alloc(N * C), *dw = test_alloc(C);
  test_fill(x, N * C, &s, -2, 2);
  test_fill(w, C, &s, 0.5f, 1.5f);
  test_fill(g, N * C, &s, -1, 1);
  test_fill(dx, N * C, &s, -1, 1);
  test_fill(dw, C, &s, -1, 1);
  float *d_x = dev_f(x, N * C), *d_w = dev_f(w, C), *d_out = dev_f(out, N * C);
  float *d_rstd = dev_f(rstd, N), *d_g = dev_f(g, N * C), *d_dx = dev_f(dx, N * C);
  float *d_dw = dev_f(dw, C);
  cpu->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
  gpu->rmsnorm_forward(d_out, d_rstd, d_x, d_w, N, C, 1e-5f);
  check_dev("rmsnorm out", d_out, out, N * C, RTOL, ATOL);
  check_dev("rmsnorm rstd", d_rstd, rstd, N, RTOL, ATOL);
  cpu->rmsnorm_backward(dx, dw, g, x, w, rstd, N, C);
  gpu->rmsnorm_backward(d_dx, d_dw, d_g, d_x, d_w, d_rstd, N, C);
  check_dev("rmsnorm dx", d_dx, dx, N * C, RTOL, ATOL);
  check_dev("rmsnorm dw", d_dw, dw, C, RTOL, 1e-5);
  dev_free(d_x, N * C * 4), dev_free(d_w, C * 4), dev_free(d_out, N * C * 4);
  dev_free(d_rstd, N * 4), dev_free(d_g, N * C * 4), dev_free(d_dx, N * C * 4);
  dev_free(d_dw, C * 4);
  free(x), free(w), free(out), free(rstd), free(g), free(dx), free(dw);
}

static void test_rope(void **state) {
  (void)state;
  const int B = 2, L = 19, H = 3, D = 16;
  const int64_t n = (int64_t)B * L * H * D;
  int32_t pos[19];
  for (int l = 0; l < L; l++) pos[l] = 4000 + 37 * l; /* large angles: the range reduction */
  uint64_t s = 5;
  float *ct = test_alloc(L * D), *st = test_alloc(L * D), *x = test_alloc(n), *out = test_alloc(n);
  float *g = test_alloc(n), *dx = test_alloc(n);
  test_fill(x, n, &s, -1, 1);
  test_fill(g, n, &s, -1, 1);
  test_fill(dx, n, &s, -1, 1);
  for (int with_pos = 0; with_pos < 2; with_pos++) {
    float *d_ct = dev_f(ct, L * D), *d_st = dev_f(st, L * D);
    int32_t *d_pos = with_pos ? dev_i(pos, L) : NULL;
    assert_int_equal(cpu->rope_tables(ct, st, with_pos ? pos : NULL, L, D, 10000.0f), TSR_OK);
    assert_int_equal(gpu->rope_tables(d_ct, d_st, d_pos, L, D, 10000.0f), TSR_OK);
    /* cosf/sinf of the device and of glibc: both within 2 ulp of the true value. */
    check_dev("rope cos", d_ct, ct, L * D, 0, 5e-7);
    check_dev("rope sin", d_st, st, L * D, 0, 5e-7);
    /* The rotation itself from identical tables, so only its own rounding is compared. */
    assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_ct, ct, L * D * 4), TSR_OK);
    assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_st, st, L * D * 4), TSR_OK);
    float *d_x = dev_f(x, n), *d_out = dev_f(out, n), *d_g = dev_f(g, n), *d_dx = dev_f(dx, n);
    cpu->rope_forward(out, x, ct, st, B, L, H, D);
    gpu->rope_forward(d_out, d_x, d_ct, d_st, B, L, H, D);
    check_dev("rope forward", d_out, out, n, 0, 0);
    gpu->rope_forward(d_x, d_x, d_ct, d_st, B, L, H, D); /* in place */
    check_dev("rope forward in place", d_x, out, n, 0, 0);
    float *dx2 = test_alloc(n);
    memcpy(dx2, dx, (size_t)n * 4);
    cpu->rope_backward(dx2, g, ct, st, B, L, H, D);
    gpu->rope_backward(d_dx, d_g, d_ct, d_st, B, L, H, D);
    check_dev("rope backward", d_dx, dx2, n, 0, 0);
    free(dx2);
    dev_free(d_x, n * 4), dev_free(d_out, n * 4), dev_free(d_g, n * 4), dev_free(d_dx, n * 4);
    dev_free(d_ct, L * D * 4), dev_free(d_st, L * D * 4);
    if (d_pos) dev_free(d_pos, L * 4);
  }
  assert_int_equal(gpu->rope_tables(NULL, NULL, NULL, L, 15, 10000.0f), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "head_dim 15"));
  free(ct), free(st), free(x), free(out), free(g), free(dx);
}

static void test_layouts(void **state) {
  (void)state;
  const int B = 2, L = 5, H = 3, D = 7;
  const int64_t n = (int64_t)B * L * H * D;
  uint64_t s = 8;
  float *x = test_alloc(n), *y = test_alloc(n), *z = test_alloc(n);
  test_fill(x, n, &s, -1, 1);
  float *d_x = dev_f(x, n), *d_y = dev_f(y, n), *d_z = dev_f(z, n);
  cpu->blhd_to_bhld(y, x, B, L, H, D);
  gpu->blhd_to_bhld(d_y, d_x, B, L, H, D);
  check_dev("blhd_to_bhld", d_y, y, n, 0, 0);
  cpu->bhld_to_blhd(z, y, B, L, H, D);
  gpu->bhld_to_blhd(d_z, d_y, B, L, H, D);
  check_dev("bhld_to_blhd", d_z, z, n, 0, 0);
  dev_free(d_x, n * 4), dev_free(d_y, n * 4), dev_free(d_z, n * 4);
  free(x), free(y), free(z);
}

static void test_swiglu(void **state) {
  (void)state;
  const int64_t n = 100003;
  uint64_t s = 9;
  float *gate = test_alloc(n), *up = test_alloc(n), *out = test_alloc(n), *g = test_alloc(n);
  float *dg = test_alloc(n), *du = test_alloc(n);
  test_fill(gate, n, &s, -8, 8);
  test_fill(up, n, &s, -2, 2);
  test_fill(g, n, &s, -1, 1);
  test_fill(dg, n, &s, -1, 1);
  test_fill(du, n, &s, -1, 1);
  float *d_gate = dev_f(gate, n), *d_up = dev_f(up, n), *d_out = dev_f(out, n);
  float *d_g = dev_f(g, n), *d_dg = dev_f(dg, n), *d_du = dev_f(du, n);
  cpu->swiglu_forward(out, gate, up, n);
  gpu->swiglu_forward(d_out, d_gate, d_up, n);
  check_dev("swiglu forward", d_out, out, n, 1e-6, 1e-7);
  cpu->swiglu_backward(dg, du, g, gate, up, n);
  gpu->swiglu_backward(d_dg, d_du, d_g, d_gate, d_up, n);
  check_dev("swiglu dgate", d_dg, dg, n, 1e-6, 1e-7);
  check_dev("swiglu dup", d_du, du, n, 1e-6, 1e-7);
  dev_free(d_gate, n * 4), dev_free(d_up, n * 4), dev_free(d_out, n * 4);
  dev_free(d_g, n * 4), dev_free(d_dg, n * 4), dev_free(d_du, n * 4);
  free(gate), free(up), free(out), free(g), free(dg), free(du);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding and losses
 * ------------------------------------------------------------------------------------------- */

static void test_embedding(void **state) {
  (void)state;
  const int N = 50, V = 13, C = 33;
  int32_t ids[50];
  for (int i = 0; i < N; i++) ids[i] = (i * 7) % V; /* repeats: the backward's atomics */
  uint64_t s = 10;
  float *table = test_alloc(V * C), *out = test_alloc(N * C), *g = test_alloc(N * C);
  float *dt = test_alloc(V * C);
  test_fill(table, V * C, &s, -1, 1);
  test_fill(g, N * C, &s, -1, 1);
  test_fill(dt, V * C, &s, -1, 1);
  float *d_table = dev_f(table, V * C), *d_out = dev_f(out, N * C), *d_g = dev_f(g, N * C);
  float *d_dt = dev_f(dt, V * C);
  int32_t *d_ids = dev_i(ids, N);
  assert_int_equal(cpu->embedding_forward(out, ids, table, N, V, C), TSR_OK);
  assert_int_equal(gpu->embedding_forward(d_out, d_ids, d_table, N, V, C), TSR_OK);
  check_dev("embedding forward", d_out, out, N * C, 0, 0);
  assert_int_equal(cpu->embedding_backward(dt, g, ids, N, V, C), TSR_OK);
  assert_int_equal(gpu->embedding_backward(d_dt, d_g, d_ids, N, V, C), TSR_OK);
  check_dev("embedding backward", d_dt, dt, V * C, RTOL, ATOL);
  /* A bad id is refused before anything is written, naming the first bad position. */
  ids[17] = V;
  ids[30] = -1;
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_ids, ids, sizeof ids), TSR_OK);
  assert_int_equal(gpu->embedding_forward(d_out, d_ids, d_table, N, V, C), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "token id 13 at position 17"));
  assert_int_equal(gpu->embedding_backward(d_dt, d_g, d_ids, N, V, C), TSR_EINVAL);
  check_dev("embedding backward untouched on error", d_dt, dt, V * C, RTOL, ATOL);
  dev_free(d_table, V * C * 4), dev_free(d_out, N * C * 4), dev_free(d_g, N * C * 4);
  dev_free(d_dt, V * C * 4), dev_free(d_ids, N * 4);
  free(table), free(out), free(g), free(dt);
}

static void test_cross_entropy(void **state) {
  (void)state;
  const int N = 21, V = 1000;
  int32_t t[21];
  for (int i = 0; i < N; i++) t[i] = i % 5 == 3 ? TSR_IGNORE_INDEX : (i * 97) % V;
  uint64_t s = 12;
  float *logits = test_alloc(N * V), *dl = test_alloc(N * V);
  test_fill(logits, N * V, &s, -6, 6);
  test_fill(dl, N * V, &s, -1, 1);
  float *d_logits = dev_f(logits, N * V), *d_dl = dev_f(dl, N * V);
  int32_t *d_t = dev_i(t, N);
  float loss_c = 0, loss_g = 0;
  int nv_c = 0, nv_g = 0;
  assert_int_equal(cpu->cross_entropy(&loss_c, &nv_c, dl, logits, t, N, V, 0.7f), TSR_OK);
  assert_int_equal(gpu->cross_entropy(&loss_g, &nv_g, d_dl, d_logits, d_t, N, V, 0.7f), TSR_OK);
  assert_int_equal(nv_c, nv_g);
  test_check_close("cross_entropy loss", &loss_g, &(double){loss_c}, 1, RTOL, ATOL);
  check_dev("cross_entropy dlogits", d_dl, dl, N * V, RTOL, ATOL);

  /* Vocabulary-parallel pieces on the shard [300, 700). */
  const int Vl = 400, start = 300;
  float *shard = test_alloc(N * Vl), *rmax = test_alloc(N), *se = test_alloc(N);
  float *tl = test_alloc(N), *ds = test_alloc(N * Vl);
  for (int i = 0; i < N; i++) memcpy(shard + i * Vl, logits + i * V + start, Vl * 4);
  test_fill(ds, N * Vl, &s, -1, 1);
  float *d_shard = dev_f(shard, N * Vl), *d_rmax = dev_f(rmax, N), *d_se = dev_f(se, N);
  float *d_tl = dev_f(tl, N), *d_ds = dev_f(ds, N * Vl);
  cpu->logits_row_max(rmax, shard, N, Vl);
  gpu->logits_row_max(d_rmax, d_shard, N, Vl);
  check_dev("logits_row_max", d_rmax, rmax, N, 0, 0);
  cpu->logits_row_sumexp(se, shard, rmax, N, Vl);
  gpu->logits_row_sumexp(d_se, d_shard, d_rmax, N, Vl);
  check_dev("logits_row_sumexp", d_se, se, N, RTOL, ATOL);
  cpu->logits_target(tl, shard, t, N, Vl, start);
  gpu->logits_target(d_tl, d_shard, d_t, N, Vl, start);
  check_dev("logits_target", d_tl, tl, N, 0, 0);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_se, se, N * 4), TSR_OK);
  cpu->cross_entropy_shard_backward(ds, shard, t, rmax, se, N, Vl, start, 0.05f);
  gpu->cross_entropy_shard_backward(d_ds, d_shard, d_t, d_rmax, d_se, N, Vl, start, 0.05f);
  check_dev("cross_entropy_shard_backward", d_ds, ds, N * Vl, RTOL, ATOL);

  /* All ignored: NaN as torch; a bad target: refused with its position. */
  int32_t ign[21];
  for (int i = 0; i < N; i++) ign[i] = TSR_IGNORE_INDEX;
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_t, ign, sizeof ign), TSR_OK);
  assert_int_equal(gpu->cross_entropy(&loss_g, &nv_g, NULL, d_logits, d_t, N, V, 1.0f), TSR_OK);
  assert_true(isnan(loss_g));
  assert_int_equal(nv_g, 0);
  t[4] = V + 5;
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_t, t, sizeof t), TSR_OK);
  assert_int_equal(gpu->cross_entropy(&loss_g, NULL, NULL, d_logits, d_t, N, V, 1.0f), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "target 1005 at position 4"));

  dev_free(d_logits, N * V * 4), dev_free(d_dl, N * V * 4), dev_free(d_t, N * 4);
  dev_free(d_shard, N * Vl * 4), dev_free(d_rmax, N * 4), dev_free(d_se, N * 4);
  dev_free(d_tl, N * 4), dev_free(d_ds, N * Vl * 4);
  free(logits), free(dl), free(shard), free(rmax), free(se), free(tl), free(ds);
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

static void attention_case(int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal,
                           bool positions) {
  const int64_t nq = (int64_t)B * Hq * Lq * D, nk = (int64_t)B * Hkv * Lk * D;
  const int64_t nl = (int64_t)B * Hq * Lq;
  uint64_t s = (uint64_t)(B + Hq * 3 + Lq * 5 + Lk * 7 + D * 11 + causal);
  float *q = test_alloc(nq), *k = test_alloc(nk), *v = test_alloc(nk), *out = test_alloc(nq);
  float *lse = test_alloc(nl), *g = test_alloc(nq), *dq = test_alloc(nq), *dk = test_alloc(nk);
  float *dv = test_alloc(nk);
  int32_t *qp = malloc((size_t)Lq * 4), *kp = malloc((size_t)Lk * 4);
  assert_non_null(qp);
  assert_non_null(kp);
  /* Keys at 0, 2, 4, ... and queries starting before the first key: the first query row sees
   * nothing (out 0, lse -inf), others see a prefix that does not end on a chunk boundary. */
  for (int j = 0; j < Lk; j++) kp[j] = 2 * j + 1;
  for (int i = 0; i < Lq; i++) qp[i] = 3 * i;
  test_fill(q, nq, &s, -1, 1);
  test_fill(k, nk, &s, -1, 1);
  test_fill(v, nk, &s, -1, 1);
  test_fill(g, nq, &s, -1, 1);
  test_fill(dq, nq, &s, -1, 1);
  test_fill(dk, nk, &s, -1, 1);
  test_fill(dv, nk, &s, -1, 1);
  float *d_q = dev_f(q, nq), *d_k = dev_f(k, nk), *d_v = dev_f(v, nk), *d_out = dev_f(out, nq);
  float *d_lse = dev_f(lse, nl), *d_g = dev_f(g, nq), *d_dq = dev_f(dq, nq);
  float *d_dk = dev_f(dk, nk), *d_dv = dev_f(dv, nk);
  int32_t *d_qp = positions ? dev_i(qp, Lq) : NULL, *d_kp = positions ? dev_i(kp, Lk) : NULL;
  const int32_t *hqp = positions ? qp : NULL, *hkp = positions ? kp : NULL;
  assert_int_equal(
      cpu->attention_forward(out, lse, q, k, v, hqp, hkp, B, Hq, Hkv, Lq, Lk, D, causal), TSR_OK);
  assert_int_equal(gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_qp, d_kp, B, Hq, Hkv, Lq,
                                          Lk, D, causal),
                   TSR_OK);
  check_dev("attention out", d_out, out, nq, 1e-4, 1e-5);
  /* lse: -inf rows must match exactly; test_check_close treats inf == inf as error 0 only when
   * both are the same infinity, and the rest compare within tolerance. */
  float *glse = test_alloc(nl);
  down(glse, d_lse, nl);
  for (int64_t r = 0; r < nl; r++) {
    if (isinf(lse[r]))
      assert_true(isinf(glse[r]) && glse[r] < 0);
    else if (!(fabs(glse[r] - lse[r]) <= 1e-5 + 1e-5 * fabs(lse[r])))
      fail_msg("attention lse row %lld: %.9g vs %.9g", (long long)r, glse[r], lse[r]);
  }
  free(glse);
  assert_int_equal(cpu->attention_backward(dq, dk, dv, g, q, k, v, out, lse, hqp, hkp, B, Hq, Hkv,
                                           Lq, Lk, D, causal),
                   TSR_OK);
  /* The device backward reads the CPU's forward results, so only the backward is compared. */
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_out, out, (size_t)nq * 4), TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_lse, lse, (size_t)nl * 4), TSR_OK);
  assert_int_equal(gpu->attention_backward(d_dq, d_dk, d_dv, d_g, d_q, d_k, d_v, d_out, d_lse, d_qp,
                                           d_kp, B, Hq, Hkv, Lq, Lk, D, causal),
                   TSR_OK);
  check_dev("attention dq", d_dq, dq, nq, 1e-4, 1e-5);
  check_dev("attention dk", d_dk, dk, nk, 1e-4, 1e-5);
  check_dev("attention dv", d_dv, dv, nk, 1e-4, 1e-5);
  dev_free(d_q, nq * 4), dev_free(d_k, nk * 4), dev_free(d_v, nk * 4), dev_free(d_out, nq * 4);
  dev_free(d_lse, nl * 4), dev_free(d_g, nq * 4), dev_free(d_dq, nq * 4);
  dev_free(d_dk, nk * 4), dev_free(d_dv, nk * 4);
  if (d_qp) dev_free(d_qp, Lq * 4);
  if (d_kp) dev_free(d_kp, Lk * 4);
  free(q), free(k), free(v), free(out), free(lse), free(g), free(dq), free(dk), free(dv);
  free(qp), free(kp);
}

static void test_attention(void **state) {
  (void)state;
  attention_case(2, 4, 2, 33, 33, 16, true, false);   /* GQA, causal, default positions */
  attention_case(1, 2, 2, 20, 300, 64, false, false); /* three key chunks, not causal */
  attention_case(1, 3, 1, 40, 150, 130, true, true);  /* D > one dim per thread; positions */
  attention_case(2, 2, 1, 7, 5, 8, true, false);      /* Lq > Lk, top-left aligned */
  assert_int_equal(
      gpu->attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 3, 2, 4, 4, 8, true),
      TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "query heads 3"));
  assert_int_equal(
      gpu->attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 2, 2, 4, 4, 513, true),
      TSR_EINVAL);
}

/* The projection-layout kernels: q (B, Lq, Hq, D), k/v (B, Lk, Hkv, D), with positions. */
static void test_attention_blhd(void **state) {
  (void)state;
  const int B = 2, Hq = 4, Hkv = 2, Lq = 37, Lk = 140, D = 32;
  const int64_t nq = (int64_t)B * Hq * Lq * D, nk = (int64_t)B * Hkv * Lk * D;
  const int64_t nl = (int64_t)B * Hq * Lq;
  uint64_t s = 21;
  float *q = test_alloc(nq), *k = test_alloc(nk), *v = test_alloc(nk), *out = test_alloc(nq);
  float *lse = test_alloc(nl), *g = test_alloc(nq), *dq = test_alloc(nq), *dk = test_alloc(nk);
  float *dv = test_alloc(nk);
  int32_t qp[37], kp[140];
  for (int i = 0; i < Lq; i++) qp[i] = 3 * i + 2;
  for (int j = 0; j < Lk; j++) kp[j] = j;
  test_fill(q, nq, &s, -1, 1);
  test_fill(k, nk, &s, -1, 1);
  test_fill(v, nk, &s, -1, 1);
  test_fill(g, nq, &s, -1, 1);
  test_fill(dq, nq, &s, -1, 1);
  test_fill(dk, nk, &s, -1, 1);
  test_fill(dv, nk, &s, -1, 1);
  float *d_q = dev_f(q, nq), *d_k = dev_f(k, nk), *d_v = dev_f(v, nk), *d_out = dev_f(out, nq);
  float *d_lse = dev_f(lse, nl), *d_g = dev_f(g, nq), *d_dq = dev_f(dq, nq);
  float *d_dk = dev_f(dk, nk), *d_dv = dev_f(dv, nk);
  int32_t *d_qp = dev_i(qp, Lq), *d_kp = dev_i(kp, Lk);
  assert_int_equal(
      cpu->attention_forward_blhd(out, lse, q, k, v, qp, kp, B, Hq, Hkv, Lq, Lk, D, true), TSR_OK);
  assert_int_equal(gpu->attention_forward_blhd(d_out, d_lse, d_q, d_k, d_v, d_qp, d_kp, B, Hq, Hkv,
                                               Lq, Lk, D, true),
                   TSR_OK);
  check_dev("attention blhd out", d_out, out, nq, 1e-4, 1e-5);
  check_dev("attention blhd lse", d_lse, lse, nl, 1e-5, 1e-5);
  assert_int_equal(cpu->attention_backward_blhd(dq, dk, dv, g, q, k, v, out, lse, qp, kp, B, Hq,
                                                Hkv, Lq, Lk, D, true),
                   TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_out, out, (size_t)nq * 4), TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_lse, lse, (size_t)nl * 4), TSR_OK);
  assert_int_equal(gpu->attention_backward_blhd(d_dq, d_dk, d_dv, d_g, d_q, d_k, d_v, d_out, d_lse,
                                                d_qp, d_kp, B, Hq, Hkv, Lq, Lk, D, true),
                   TSR_OK);
  check_dev("attention blhd dq", d_dq, dq, nq, 1e-4, 1e-5);
  check_dev("attention blhd dk", d_dk, dk, nk, 1e-4, 1e-5);
  check_dev("attention blhd dv", d_dv, dv, nk, 1e-4, 1e-5);
  dev_free(d_q, nq * 4), dev_free(d_k, nk * 4), dev_free(d_v, nk * 4), dev_free(d_out, nq * 4);
  dev_free(d_lse, nl * 4), dev_free(d_g, nq * 4), dev_free(d_dq, nq * 4);
  dev_free(d_dk, nk * 4), dev_free(d_dv, nk * 4), dev_free(d_qp, Lq * 4), dev_free(d_kp, Lk * 4);
  free(q), free(k), free(v), free(out), free(lse), free(g), free(dq), free(dk), free(dv);
}

/* The batched-GEMM attention against the CPU kernel (default positions only). f32 with IEEE
 * GEMMs: the same tolerance as the kernel above. bf16: q, k, v, dout, the probabilities and the
 * score gradients are rounded to 8 mantissa bits (2^-9 relative each), so results move by a few
 * 2^-9 of their terms: rtol 3e-2, atol 1e-2 for values of magnitude <= 1. */
static void attention_gemm_case(int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal,
                                bool bf16) {
  const int64_t nq = (int64_t)B * Hq * Lq * D, nk = (int64_t)B * Hkv * Lk * D;
  const int64_t nl = (int64_t)B * Hq * Lq;
  uint64_t s = (uint64_t)(B * 5 + Hq + Lq * 3 + Lk * 13 + D + bf16);
  float *q = test_alloc(nq), *k = test_alloc(nk), *v = test_alloc(nk), *out = test_alloc(nq);
  float *lse = test_alloc(nl), *g = test_alloc(nq), *dq = test_alloc(nq), *dk = test_alloc(nk);
  float *dv = test_alloc(nk);
  test_fill(q, nq, &s, -1, 1);
  test_fill(k, nk, &s, -1, 1);
  test_fill(v, nk, &s, -1, 1);
  test_fill(g, nq, &s, -1, 1);
  test_fill(dq, nq, &s, -1, 1);
  test_fill(dk, nk, &s, -1, 1);
  test_fill(dv, nk, &s, -1, 1);
  float *d_q = dev_f(q, nq), *d_k = dev_f(k, nk), *d_v = dev_f(v, nk), *d_out = dev_f(out, nq);
  float *d_lse = dev_f(lse, nl), *d_g = dev_f(g, nq), *d_dq = dev_f(dq, nq);
  float *d_dk = dev_f(dk, nk), *d_dv = dev_f(dv, nk);
  double rtol = bf16 ? 3e-2 : 1e-4, atol = bf16 ? 1e-2 : 1e-5;
  tsr_cuda_ctx_set_tf32(g_ctx, false);
  assert_int_equal(
      cpu->attention_forward(out, lse, q, k, v, NULL, NULL, B, Hq, Hkv, Lq, Lk, D, causal), TSR_OK);
  assert_int_equal(tsr_cuda_attention_gemm_forward(g_ctx, d_out, d_lse, d_q, d_k, d_v, B, Hq, Hkv,
                                                   Lq, Lk, D, causal, bf16),
                   TSR_OK);
  check_dev(bf16 ? "attention gemm bf16 out" : "attention gemm out", d_out, out, nq, rtol, atol);
  check_dev(bf16 ? "attention gemm bf16 lse" : "attention gemm lse", d_lse, lse, nl, rtol, atol);
  assert_int_equal(cpu->attention_backward(dq, dk, dv, g, q, k, v, out, lse, NULL, NULL, B, Hq, Hkv,
                                           Lq, Lk, D, causal),
                   TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_out, out, (size_t)nq * 4), TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, d_lse, lse, (size_t)nl * 4), TSR_OK);
  assert_int_equal(tsr_cuda_attention_gemm_backward(g_ctx, d_dq, d_dk, d_dv, d_g, d_q, d_k, d_v,
                                                    d_out, d_lse, B, Hq, Hkv, Lq, Lk, D, causal,
                                                    bf16),
                   TSR_OK);
  check_dev("attention gemm dq", d_dq, dq, nq, rtol, atol);
  check_dev("attention gemm dk", d_dk, dk, nk, rtol, atol);
  check_dev("attention gemm dv", d_dv, dv, nk, rtol, atol);
  tsr_cuda_ctx_set_tf32(g_ctx, true);
  dev_free(d_q, nq * 4), dev_free(d_k, nk * 4), dev_free(d_v, nk * 4), dev_free(d_out, nq * 4);
  dev_free(d_lse, nl * 4), dev_free(d_g, nq * 4), dev_free(d_dq, nq * 4);
  dev_free(d_dk, nk * 4), dev_free(d_dv, nk * 4);
  free(q), free(k), free(v), free(out), free(lse), free(g), free(dq), free(dk), free(dv);
}

static void test_attention_gemm(void **state) {
  (void)state;
  for (int bf16 = 0; bf16 < 2; bf16++) {
    attention_gemm_case(2, 4, 2, 33, 33, 16, true, bf16);
    attention_gemm_case(1, 2, 2, 20, 300, 64, false, bf16);
    attention_gemm_case(1, 6, 2, 40, 150, 128, true, bf16);
    attention_gemm_case(2, 2, 1, 7, 5, 8, true, bf16); /* Lq > Lk */
  }
  assert_int_equal(tsr_cuda_attention_gemm_forward(g_ctx, NULL, NULL, NULL, NULL, NULL, 1, 2, 2, 4,
                                                   0, 8, true, false),
                   TSR_EINVAL);
}

static void test_attention_merge(void **state) {
  (void)state;
  const int R = 40, D = 200;
  uint64_t s = 14;
  float *oa = test_alloc(R * D), *ob = test_alloc(R * D), *la = test_alloc(R), *lb = test_alloc(R);
  float *o = test_alloc(R * D), *l = test_alloc(R);
  test_fill(oa, R * D, &s, -1, 1);
  test_fill(ob, R * D, &s, -1, 1);
  test_fill(la, R, &s, -5, 5);
  test_fill(lb, R, &s, -5, 5);
  la[3] = -INFINITY;
  lb[5] = -INFINITY;
  la[7] = lb[7] = -INFINITY;
  float *d_oa = dev_f(oa, R * D), *d_ob = dev_f(ob, R * D), *d_la = dev_f(la, R);
  float *d_lb = dev_f(lb, R), *d_o = dev_f(o, R * D), *d_l = dev_f(l, R);
  cpu->attention_merge(o, l, oa, la, ob, lb, R, D);
  gpu->attention_merge(d_o, d_l, d_oa, d_la, d_ob, d_lb, R, D);
  check_dev("merge out", d_o, o, R * D, RTOL, ATOL);
  float *gl = test_alloc(R);
  down(gl, d_l, R);
  for (int r = 0; r < R; r++) {
    if (isinf(l[r]))
      assert_true(isinf(gl[r]) && gl[r] < 0);
    else if (!(fabs(gl[r] - l[r]) <= 1e-6 + RTOL * fabs(l[r])))
      fail_msg("merge lse row %d", r);
  }
  /* Aliased: the ring update writes into the first operand. */
  gpu->attention_merge(d_oa, d_la, d_oa, d_la, d_ob, d_lb, R, D);
  check_dev("merge out aliased", d_oa, o, R * D, RTOL, ATOL);
  free(gl);
  dev_free(d_oa, R * D * 4), dev_free(d_ob, R * D * 4), dev_free(d_la, R * 4);
  dev_free(d_lb, R * 4), dev_free(d_o, R * D * 4), dev_free(d_l, R * 4);
  free(oa), free(ob), free(la), free(lb), free(o), free(l);
}

/* ---------------------------------------------------------------------------------------------
 * Optimizer
 * ------------------------------------------------------------------------------------------- */

static void test_adamw_and_norms(void **state) {
  (void)state;
  const int64_t n = 70001;
  uint64_t s = 15;
  float *p = test_alloc(n), *g = test_alloc(n), *m = test_alloc(n), *v = test_alloc(n);
  float *got = test_alloc(n);
  test_fill(p, n, &s, -1, 1);
  test_fill(g, n, &s, -1e-2f, 1e-2f);
  float *d_p = dev_f(p, n), *d_g = dev_f(g, n), *d_m = dev_f(m, n), *d_v = dev_f(v, n);
  for (int step = 1; step <= 3; step++) {
    cpu->adamw(p, g, m, v, n, step, 1e-3, 0.9, 0.95, 1e-8, 0.1);
    gpu->adamw(d_p, d_g, d_m, d_v, n, step, 1e-3, 0.9, 0.95, 1e-8, 0.1);
  }
  /* beta1 = 0.3: the other branch of lerp. */
  cpu->adamw(p, g, m, v, n, 4, 1e-3, 0.3, 0.95, 1e-8, 0.1);
  gpu->adamw(d_p, d_g, d_m, d_v, n, 4, 1e-3, 0.3, 0.95, 1e-8, 0.1);
  down(got, d_p, n);
  assert_memory_equal(got, p, (size_t)n * 4);
  down(got, d_m, n);
  assert_memory_equal(got, m, (size_t)n * 4);
  down(got, d_v, n);
  assert_memory_equal(got, v, (size_t)n * 4);

  /* Sums of squares in double: only the association differs. */
  double want = cpu->sum_squares(p, n), have = gpu->sum_squares(d_p, n);
  assert_true(fabs(have - want) <= 1e-12 * want);
  const float *hb[2] = {p, g}, *db[2] = {d_p, d_g};
  int64_t sz[2] = {n, n - 17};
  want = cpu->global_norm(hb, sz, 2);
  have = gpu->global_norm(db, sz, 2);
  assert_true(fabs(have - want) <= 1e-12 * want);
  assert_true(gpu->clip_coef(4.0, 1.0) == cpu->clip_coef(4.0, 1.0));
  cpu->scale(p, n, 0.37f);
  gpu->scale(d_p, n, 0.37f);
  down(got, d_p, n);
  assert_memory_equal(got, p, (size_t)n * 4);
  dev_free(d_p, n * 4), dev_free(d_g, n * 4), dev_free(d_m, n * 4), dev_free(d_v, n * 4);
  free(p), free(g), free(m), free(v), free(got);
}

/* ---------------------------------------------------------------------------------------------
 * bf16 GEMM and conversions
 * ------------------------------------------------------------------------------------------- */

static void test_bf16_gemm(void **state) {
  (void)state;
  const int M = 64, N = 48, K = 96;
  uint64_t s = 16;
  float *a = test_alloc(M * K), *b = test_alloc(K * N), *c = test_alloc(M * N);
  test_fill(a, M * K, &s, -1, 1);
  test_fill(b, K * N, &s, -1, 1);
  /* Round the inputs to bf16 on the host first: products of bf16 values are exact in f32, so
   * the reference is the f32 GEMM of the rounded values up to the order of the additions. */
  for (int i = 0; i < M * K; i++) a[i] = tsr_bf16_to_f32(tsr_f32_to_bf16(a[i]));
  for (int i = 0; i < K * N; i++) b[i] = tsr_bf16_to_f32(tsr_f32_to_bf16(b[i]));
  cpu->gemm(c, a, b, M, N, K, false, false, 1.0f, 0.0f);
  float *d_af = dev_f(a, M * K), *d_bf = dev_f(b, K * N), *d_c = dev_alloc(M * N * 4);
  uint16_t *d_a = dev_alloc(M * K * 2), *d_b = dev_alloc(K * N * 2);
  tsr_cuda_f32_to_bf16(d_a, d_af, M * K);
  tsr_cuda_f32_to_bf16(d_b, d_bf, K * N);
  assert_int_equal(
      tsr_cuda_gemm_bf16(g_ctx, d_c, false, d_a, d_b, M, N, K, false, false, 1.0f, 0.0f), TSR_OK);
  check_dev("bf16 gemm (f32 out)", d_c, c, M * N, RTOL, (K + 1) * 2e-7);
  /* Round trip of the conversion is exact for values already in bf16. */
  tsr_cuda_bf16_to_f32(d_af, d_a, M * K);
  check_dev("bf16 round trip", d_af, a, M * K, 0, 0);
  dev_free(d_af, M * K * 4), dev_free(d_bf, K * N * 4), dev_free(d_c, M * N * 4);
  dev_free(d_a, M * K * 2), dev_free(d_b, K * N * 2);
  free(a), free(b), free(c);
}

int main(void) {
  int rc = cuda_test_setup("test_cuda_kernels");
  if (rc) return rc;
  if (core_kernel_table(NULL, &cpu) != TSR_OK ||
      core_kernel_table(tsr_cuda_ctx_allocator(g_ctx), &gpu) != TSR_OK) {
    printf("FAIL: a device is present but the CUDA kernel table did not load: %s\n",
           tsr_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_matmul_bf16),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_layouts),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_gemm),
      cmocka_unit_test(test_attention_blhd),
      cmocka_unit_test(test_attention_merge),
      cmocka_unit_test(test_adamw_and_norms),
      cmocka_unit_test(test_bf16_gemm),
  };
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  tsr_cuda_ctx_destroy(g_ctx);
  return rc;
}
