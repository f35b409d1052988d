/* GEMM through cuBLAS: the table's f32 GEMM and nn.Linear (TF32 tensor cores when the context
 * allows), the bf16 GEMM with f32 accumulation, and the peak measurement. */
#include <time.h>

#include "cuda_internal.h"
#include "misc.h" /* the table functions' declarations, which these definitions must match */

/* Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap and every
 * leading dimension is the row-major one, exactly as CBLAS takes them. */
static tsr_status gemm_ex(tsr_cuda_ctx *ctx, void *c, cudaDataType ct, const void *a, const void *b,
                          cudaDataType abt, cublasComputeType_t compute, int M, int N, int K,
                          bool trans_a, bool trans_b, float alpha, float beta) {
  int lda = trans_a ? M : K;
  int ldb = trans_b ? K : N;
  return TSR_CUBLAS(cublasGemmEx(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b, abt, ldb,
                                 a, abt, lda, &beta, c, ct, N, compute, CUBLAS_GEMM_DEFAULT));
}

tsr_status tsr_cuda_gemm_batched(tsr_cuda_ctx *ctx, void *c, bool c_bf16, const void *a,
                                 const void *b, bool ab_bf16, int M, int N, int K, bool trans_a,
                                 bool trans_b, float alpha, float beta, int64_t stride_a,
                                 int64_t stride_b, int64_t stride_c, int batch) {
  if (M < 0 || N < 0 || K <= 0 || batch < 0)
    return TSR_ERROR(TSR_EINVAL, "batched gemm: bad size (M=%d, N=%d, K=%d, batch=%d)", M, N, K,
                     batch);
  if (M == 0 || N == 0 || batch == 0) return TSR_OK;
  int lda = trans_a ? M : K;
  int ldb = trans_b ? K : N;
  cudaDataType abt = ab_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasComputeType_t compute =
      ab_bf16 || !ctx->tf32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  return TSR_CUBLAS(cublasGemmStridedBatchedEx(
      ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
      &alpha, b, abt, ldb, stride_b, a, abt, lda, stride_a, &beta, c,
      c_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
}

static tsr_status gemm_f32(tsr_cuda_ctx *ctx, float *c, const float *a, const float *b, int M,
                           int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
  if (M <= 0 || N <= 0) return TSR_OK;
  if (K <= 0) {
    /* c = beta · c, as the CPU kernel defines it for an empty reduction. */
    if (beta == 0.0f)
      return TSR_CU(cudaMemsetAsync(c, 0, (size_t)M * N * sizeof(float), ctx->compute));
    return TSR_CU(tsr_cuda_launch_scale(ctx->compute, c, (int64_t)M * N, beta));
  }
  return gemm_ex(ctx, c, CUDA_R_32F, a, b, CUDA_R_32F,
                 ctx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, M, N, K, trans_a,
                 trans_b, alpha, beta);
}

void tsr_cuda_k_gemm(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                     bool trans_b, float alpha, float beta) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("gemm");
  tsr_cuda_keep(ctx, gemm_f32(ctx, c, a, b, M, N, K, trans_a, trans_b, alpha, beta));
}

void tsr_cuda_k_matmul_forward(float *out, const float *x, const float *w, const float *bias, int N,
                               int C, int OC) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("matmul_forward");
  float beta = 0.0f;
  if (bias != NULL && N > 0 && OC > 0) {
    tsr_cuda_keep(ctx, TSR_CU(tsr_cuda_launch_bias_rows(ctx->compute, out, bias, N, OC)));
    beta = 1.0f;
  }
  tsr_cuda_keep(ctx, gemm_f32(ctx, out, x, w, N, OC, C, false, true, 1.0f, beta));
}

void tsr_cuda_k_matmul_backward(float *dx, float *dw, float *dbias, const float *dout,
                                const float *x, const float *w, int N, int C, int OC) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("matmul_backward");
  if (dx) tsr_cuda_keep(ctx, gemm_f32(ctx, dx, dout, w, N, C, OC, false, false, 1.0f, 1.0f));
  if (dw) tsr_cuda_keep(ctx, gemm_f32(ctx, dw, dout, x, OC, C, N, true, false, 1.0f, 1.0f));
  if (dbias && N > 0 && OC > 0)
    tsr_cuda_keep(ctx, TSR_CU(tsr_cuda_launch_col_sum(ctx->compute, dbias, dout, N, OC)));
}

tsr_status tsr_cuda_gemm_bf16(tsr_cuda_ctx *ctx, void *c, bool c_bf16, const uint16_t *a,
                              const uint16_t *b, int M, int N, int K, bool trans_a, bool trans_b,
                              float alpha, float beta) {
  if (M < 0 || N < 0 || K < 0)
    return TSR_ERROR(TSR_EINVAL, "bf16 gemm: negative size (M=%d, N=%d, K=%d)", M, N, K);
  if (M == 0 || N == 0) return TSR_OK;
  if (K == 0) return TSR_ERROR(TSR_EINVAL, "bf16 gemm: K = 0 is not supported; scale c instead");
  return gemm_ex(ctx, c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, a, b, CUDA_R_16BF, CUBLAS_COMPUTE_32F,
                 M, N, K, trans_a, trans_b, alpha, beta);
}

/* bf16 copies of x, from the context's caching allocator (so a repeated step allocates
 * nothing), converted on the compute stream. */
static uint16_t *bf16_copy(tsr_cuda_ctx *ctx, const float *x, int64_t n, tsr_status *st) {
  if (*st != TSR_OK) return NULL;
  uint16_t *b = tsr_allocator_alloc(tsr_cuda_ctx_allocator(ctx), (size_t)(n > 0 ? n : 1) * 2);
  if (!b) {
    *st = TSR_ERROR(TSR_ENOMEM, "bf16 matmul: cannot allocate %lld bf16 operand values",
                    (long long)n);
    return NULL;
  }
  tsr_cuda_f32_to_bf16(b, x, n);
  return b;
}

static void bf16_free(tsr_cuda_ctx *ctx, uint16_t *b, int64_t n) {
  if (b) tsr_allocator_free(tsr_cuda_ctx_allocator(ctx), b, (size_t)(n > 0 ? n : 1) * 2);
}

tsr_status tsr_cuda_k_matmul_forward_bf16(float *out, const float *x, const float *w,
                                          const float *bias, int N, int C, int OC) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("matmul_forward_bf16");
  if (N <= 0 || OC <= 0) return TSR_OK;
  if (C <= 0) {
    tsr_cuda_k_matmul_forward(out, x, w, bias, N, C, OC);
    return TSR_OK;
  }
  tsr_status st = TSR_OK;
  int64_t nx = (int64_t)N * C, nw = (int64_t)OC * C;
  uint16_t *xb = bf16_copy(ctx, x, nx, &st), *wb = bf16_copy(ctx, w, nw, &st);
  float beta = 0.0f;
  if (st == TSR_OK && bias) {
    st = TSR_CU(tsr_cuda_launch_bias_rows(ctx->compute, out, bias, N, OC));
    beta = 1.0f;
  }
  if (st == TSR_OK)
    st = tsr_cuda_gemm_bf16(ctx, out, false, xb, wb, N, OC, C, false, true, 1.0f, beta);
  /* freed blocks are reused in stream order: the GEMM that reads them is queued already */
  bf16_free(ctx, xb, nx);
  bf16_free(ctx, wb, nw);
  return st;
}

tsr_status tsr_cuda_k_matmul_backward_bf16(float *dx, float *dw, float *dbias, const float *dout,
                                           const float *x, const float *w, int N, int C, int OC) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("matmul_backward_bf16");
  if (N <= 0 || OC <= 0 || C <= 0) {
    tsr_cuda_k_matmul_backward(dx, dw, dbias, dout, x, w, N, C, OC);
    return TSR_OK;
  }
  tsr_status st = TSR_OK;
  int64_t ng = (int64_t)N * OC, nx = (int64_t)N * C, nw = (int64_t)OC * C;
  uint16_t *gb = bf16_copy(ctx, dout, ng, &st);
  uint16_t *xb = dw ? bf16_copy(ctx, x, nx, &st) : NULL;
  uint16_t *wb = dx ? bf16_copy(ctx, w, nw, &st) : NULL;
  if (st == TSR_OK && dx)
    st = tsr_cuda_gemm_bf16(ctx, dx, false, gb, wb, N, C, OC, false, false, 1.0f, 1.0f);
  if (st == TSR_OK && dw)
    st = tsr_cuda_gemm_bf16(ctx, dw, false, gb, xb, OC, C, N, true, false, 1.0f, 1.0f);
  if (st == TSR_OK && dbias) st = TSR_CU(tsr_cuda_launch_col_sum(ctx->compute, dbias, dout, N, OC));
  bf16_free(ctx, gb, ng);
  bf16_free(ctx, xb, nx);
  bf16_free(ctx, wb, nw);
  return st;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tsr_cuda_gemm_peak_tflops(tsr_cuda_ctx *ctx, bool bf16, int n, double seconds) {
  size_t elems = (size_t)n * n;
  size_t esz = bf16 ? 2 : 4;
  float *fill = NULL;
  void *a = NULL, *b = NULL, *c = NULL;
  double best = -1.0;
  cudaEvent_t e0 = NULL, e1 = NULL;
  if (cudaMalloc(&a, elems * esz) != cudaSuccess || cudaMalloc(&b, elems * esz) != cudaSuccess ||
      cudaMalloc(&c, elems * esz) != cudaSuccess ||
      cudaMalloc((void **)&fill, elems * 4) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
      cudaEventCreate(&e1) != cudaSuccess)
    goto cleanup;
  /* Small non-zero values: tensor cores run at the same rate on any data, but zeros could be
   * special-cased by a future library. */
  for (int which = 0; which < 2; which++) {
    void *dst = which == 0 ? a : b;
    if (tsr_cuda_launch_fill_pattern(ctx->compute, fill, (int64_t)elems, which ? 13 : 17, 0.01f) !=
        cudaSuccess)
      goto cleanup;
    if (bf16)
      tsr_cuda_f32_to_bf16(dst, fill, (int64_t)elems);
    else if (cudaMemcpyAsync(dst, fill, elems * 4, cudaMemcpyDeviceToDevice, ctx->compute) !=
             cudaSuccess)
      goto cleanup;
  }
  const int reps = 10;
  double flops = 2.0 * (double)n * n * n * reps;
  best = 0.0;
  double start = now_seconds();
  bool first = true;
  int batches = 0;
  do {
    if (cudaEventRecord(e0, ctx->compute) != cudaSuccess) goto fail;
    for (int r = 0; r < reps; r++) {
      tsr_status st =
          bf16 ? tsr_cuda_gemm_bf16(ctx, c, true, a, b, n, n, n, false, false, 1.0f, 0.0f)
               : gemm_f32(ctx, c, a, b, n, n, n, false, false, 1.0f, 0.0f);
      if (st != TSR_OK) goto fail;
    }
    if (cudaEventRecord(e1, ctx->compute) != cudaSuccess) goto fail;
    if (cudaEventSynchronize(e1) != cudaSuccess) goto fail;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) goto fail;
    /* The first batch pays for cuBLAS's heuristics and clock ramp-up. */
    if (!first && ms > 0.0f && flops / (ms * 1e-3) > best) best = flops / (ms * 1e-3);
    first = false;
    batches++;
  } while ((now_seconds() - start < seconds || best == 0.0) && batches < 10000);
  best *= 1e-12;
  goto cleanup;
fail:
  best = -1.0;
cleanup:
  (void)cudaStreamSynchronize(ctx->compute);
  if (e0) (void)cudaEventDestroy(e0);
  if (e1) (void)cudaEventDestroy(e1);
  (void)cudaFree(a);
  (void)cudaFree(b);
  (void)cudaFree(c);
  (void)cudaFree(fill);
  return best;
}
