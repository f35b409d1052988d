/* GEMM through CBLAS: nn.Linear forward/backward and the in-process peak measurement. */
#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#include "internal.h"
#include "tessera/kernels.h"
#include "tessera/tensor.h"

void tsr_gemm_strided(float *c, int64_t ldc, const float *a, int64_t lda, const float *b,
                      int64_t ldb, int M, int N, int K, bool trans_a, bool trans_b, float alpha,
                      float beta) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, (int)lda, b, (int)ldb, beta,
              c, (int)ldc);
}

void tsr_gemm_raw(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                  bool trans_b, float alpha, float beta) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    /* BLAS leaves c untouched for K == 0 on some builds; the maths says c = beta * c. */
    for (int64_t i = 0; i < (int64_t)M * N; i++) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  int lda = trans_a ? M : K;
  int ldb = trans_b ? K : N;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, lda, b, ldb, beta, c, N);
}

void tsr_kernel_gemm(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                     bool trans_b, float alpha, float beta) {
  int64_t t0 = tsr_profile_begin();
  tsr_gemm_raw(c, a, b, M, N, K, trans_a, trans_b, alpha, beta);
  tsr_profile_end(TSR_KERNEL_GEMM, t0);
}

void tsr_kernel_matmul_forward(float *out, const float *x, const float *w, const float *bias, int N,
                               int C, int OC) {
  int64_t t0 = tsr_profile_begin();
  float beta = 0.0f;
  if (bias != NULL) {
    for (int64_t i = 0; i < N; i++) {
      for (int o = 0; o < OC; o++) out[i * OC + o] = bias[o];
    }
    beta = 1.0f;
  }
  tsr_kernel_gemm(out, x, w, N, OC, C, false, true, 1.0f, beta);
  tsr_profile_end(TSR_KERNEL_GEMM, t0);
}

void tsr_kernel_matmul_backward(float *dx, float *dw, float *dbias, const float *dout,
                                const float *x, const float *w, int N, int C, int OC) {
  int64_t t0 = tsr_profile_begin();
  if (dx != NULL) tsr_kernel_gemm(dx, dout, w, N, C, OC, false, false, 1.0f, 1.0f);
  if (dw != NULL) tsr_kernel_gemm(dw, dout, x, OC, C, N, true, false, 1.0f, 1.0f);
  if (dbias != NULL) {
    for (int64_t i = 0; i < N; i++) {
      for (int o = 0; o < OC; o++) dbias[o] += dout[i * OC + o];
    }
  }
  tsr_profile_end(TSR_KERNEL_GEMM, t0);
}

/* x rounded to bf16, as f32 values: a heap copy of n elements, NULL when it cannot be had. */
static float *bf16_rounded(const float *x, int64_t n) {
  float *r = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!r) return NULL;
  for (int64_t i = 0; i < n; i++) r[i] = tsr_bf16_to_f32(tsr_f32_to_bf16(x[i]));
  return r;
}

static tsr_status no_memory(const char *what, int64_t n) {
  return TSR_ERROR(TSR_ENOMEM, "%s: out of memory for %lld rounded operand values", what,
                   (long long)n);
}

tsr_status tsr_kernel_matmul_forward_bf16(float *out, const float *x, const float *w,
                                          const float *bias, int N, int C, int OC) {
  int64_t t0 = tsr_profile_begin();
  float *xr = bf16_rounded(x, (int64_t)N * C), *wr = bf16_rounded(w, (int64_t)OC * C);
  tsr_status st = TSR_OK;
  if (!xr || !wr)
    st = no_memory("matmul_forward_bf16", (int64_t)N * C + (int64_t)OC * C);
  else
    tsr_kernel_matmul_forward(out, xr, wr, bias, N, C, OC);
  free(xr);
  free(wr);
  tsr_profile_end(TSR_KERNEL_GEMM, t0);
  return st;
}

tsr_status tsr_kernel_matmul_backward_bf16(float *dx, float *dw, float *dbias, const float *dout,
                                           const float *x, const float *w, int N, int C, int OC) {
  int64_t t0 = tsr_profile_begin();
  float *gr = bf16_rounded(dout, (int64_t)N * OC);
  float *xr = dw ? bf16_rounded(x, (int64_t)N * C) : NULL;
  float *wr = dx ? bf16_rounded(w, (int64_t)OC * C) : NULL;
  tsr_status st = TSR_OK;
  if (!gr || (dw && !xr) || (dx && !wr)) {
    st = no_memory("matmul_backward_bf16", (int64_t)N * (OC + 2 * C));
  } else {
    tsr_kernel_matmul_backward(dx, dw, NULL, gr, xr, wr, N, C, OC);
    /* the bias gradient is a plain f32 sum, of the unrounded dout */
    if (dbias) tsr_kernel_matmul_backward(NULL, NULL, dbias, dout, x, w, N, C, OC);
  }
  free(gr);
  free(xr);
  free(wr);
  tsr_profile_end(TSR_KERNEL_GEMM, t0);
  return st;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tsr_kernel_sgemm_peak_gflops(int threads, double seconds) {
  /* 1024 is large enough to reach OpenBLAS's steady state on one or a few cores and small enough
   * (12 MiB) that a short measurement covers several repetitions. */
  const int n = 1024;
  size_t elems = (size_t)n * n;
  float *a = malloc(elems * sizeof(float));
  float *b = malloc(elems * sizeof(float));
  float *c = malloc(elems * sizeof(float));
  if (a == NULL || b == NULL || c == NULL) {
    free(a);
    free(b);
    free(c);
    return -1.0;
  }
  for (size_t i = 0; i < elems; i++) {
    a[i] = (float)(i % 17) * 0.01f;
    b[i] = (float)(i % 13) * 0.01f;
  }
  int saved = openblas_get_num_threads();
  openblas_set_num_threads(threads < 1 ? 1 : threads);

  tsr_gemm_raw(c, a, b, n, n, n, false, false, 1.0f, 0.0f); /* warm the pool and caches */
  double flops = 2.0 * n * n * n;
  double best = 0.0;
  double start = now_seconds();
  do {
    double t0 = now_seconds();
    tsr_gemm_raw(c, a, b, n, n, n, false, false, 1.0f, 0.0f);
    double dt = now_seconds() - t0;
    if (dt > 0.0 && flops / dt > best) best = flops / dt;
  } while (now_seconds() - start < seconds);

  openblas_set_num_threads(saved);
  free(a);
  free(b);
  free(c);
  return best * 1e-9;
}
