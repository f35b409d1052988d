// Attention through batched GEMMs (tessera_cuda.h): scores = q·kᵀ per (batch, kv head) with the
// group's query heads stacked as rows, a row softmax that writes probabilities and lse, then
// probabilities·v; the backward recomputes the probabilities from lse. The tensor cores do the
// O(L²·D) work; the row kernels are memory-bound passes over the scores.
//
// In (B, H, L, D) layout the G = Hq / Hkv query heads that share kv head n are contiguous, so
// batch n of the GEMMs is a (G·Lq, D) block of q against an (Lk, D) block of k, and its score
// rows are the rows ((b·Hq + h)·Lq + i) of one (B·Hq·Lq, Lk) matrix in their natural order.
#include <cuda_bf16.h>
#include <math.h>

#include "device_util.cuh"
#include "misc.h"

__device__ __forceinline__ void put(float *p, float v) {
  *p = v;
}
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ float get(const float *p) {
  return *p;
}
__device__ __forceinline__ float get(const __nv_bfloat16 *p) {
  return __bfloat162float(*p);
}

// p = exp(s·scale − lse) on visible keys, 0 elsewhere. With write_lse the row's lse is computed
// here (forward); otherwise it is read (backward recompute).
template <typename PT>
__global__ void softmax_rows_kernel(PT *P, float *lse, const float *S, int Lq, int Lk, float scale,
                                    bool causal, bool write_lse) {
  __shared__ float red[32];
  int64_t r = blockIdx.x;
  int i = (int)(r % Lq);
  int nvis = causal ? (i + 1 < Lk ? i + 1 : Lk) : Lk;
  const float *s = S + r * Lk;
  PT *p = P + r * Lk;
  float l;
  if (write_lse) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nvis; j += blockDim.x) m = fmaxf(m, s[j] * scale);
    m = tsr_block_reduce(m, tsr_max_op<float>(), red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < nvis; j += blockDim.x) sum += expf(s[j] * scale - m);
    sum = tsr_block_reduce(sum, tsr_sum_op<float>(), red);
    l = sum > 0.0f ? m + logf(sum) : -INFINITY;
    if (threadIdx.x == 0) lse[r] = l;
  } else {
    l = lse[r];
  }
  for (int j = threadIdx.x; j < Lk; j += blockDim.x)
    put(&p[j], j < nvis && l != -INFINITY ? expf(s[j] * scale - l) : 0.0f);
}

// dS = P ∘ (dP − D_r) · scale with D_r = dout_r · out_r.
template <typename PT>
__global__ void dsoftmax_rows_kernel(PT *dS, const PT *P, const float *dP, const float *out,
                                     const float *dout, int Lk, int D, float scale) {
  __shared__ float red[32];
  int64_t r = blockIdx.x;
  float part = 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) part += dout[r * D + d] * out[r * D + d];
  float di = tsr_block_reduce(part, tsr_sum_op<float>(), red);
  for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
    int64_t e = r * Lk + j;
    float pj = get(&P[e]);
    put(&dS[e], pj * (dP[e] - di) * scale);
  }
}

namespace {

struct scratch {
  tsr_cuda_ctx *ctx;
  void *ptr[8];
  size_t bytes[8];
  int n;
  void *take(size_t b) {
    void *p = tsr_allocator_alloc(tsr_cuda_ctx_allocator(ctx), b);
    if (p) ptr[n] = p, bytes[n++] = b;
    return p;
  }
  ~scratch() {
    for (int i = 0; i < n; i++) tsr_allocator_free(tsr_cuda_ctx_allocator(ctx), ptr[i], bytes[i]);
  }
};

struct dims {
  int B, Hq, Hkv, Lq, Lk, D, G, nb;
  int64_t rows, nq, nk;
};

tsr_status check(const char *what, tsr_cuda_ctx *ctx, int B, int Hq, int Hkv, int Lq, int Lk, int D,
                 dims *d) {
  /* The bf16 casts run on the current context's stream: it must be this one. */
  if (!ctx || ctx != tsr_cuda_ctx_current())
    return TSR_ERROR(TSR_EINVAL, "%s: the context must be this thread's current one", what);
  if (B < 0 || Lq < 0 || Lk <= 0 || D <= 0)
    return TSR_ERROR(TSR_EINVAL, "%s: bad size (B=%d, Lq=%d, Lk=%d, D=%d; Lk must be > 0)", what, B,
                     Lq, Lk, D);
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: query heads %d must be a positive multiple of key/value heads %d", what,
                     Hq, Hkv);
  *d = {B,
        Hq,
        Hkv,
        Lq,
        Lk,
        D,
        Hq / Hkv,
        B * Hkv,
        (int64_t)B * Hq * Lq,
        (int64_t)B * Hq * Lq * D,
        (int64_t)B * Hkv * Lk * D};
  return TSR_OK;
}

/* A bf16 copy of x (n values) in scratch, or x itself for the f32 path. */
const void *operand(scratch &s, const float *x, int64_t n, bool bf16, tsr_status *st) {
  if (!bf16) return x;
  uint16_t *b = (uint16_t *)s.take((size_t)n * 2);
  if (!b) {
    *st = TSR_ERROR(TSR_ENOMEM, "attention (gemm): cannot allocate %lld bf16 values", (long long)n);
    return NULL;
  }
  tsr_cuda_f32_to_bf16(b, x, n);
  return b;
}

/* scores = q·kᵀ, then probabilities (and lse when write_lse) into P. */
tsr_status scores_and_probs(tsr_cuda_ctx *ctx, const dims &d, const void *qo, const void *ko,
                            bool bf16, float *scores, void *P, float *lse, bool causal,
                            bool write_lse) {
  TSR_CHECK(tsr_cuda_gemm_batched(ctx, scores, false, qo, ko, bf16, d.G * d.Lq, d.Lk, d.D, false,
                                  true, 1.0f, 0.0f, (int64_t)d.G * d.Lq * d.D, (int64_t)d.Lk * d.D,
                                  (int64_t)d.G * d.Lq * d.Lk, d.nb));
  float scale = 1.0f / sqrtf((float)d.D);
  if (bf16)
    softmax_rows_kernel<<<(unsigned)d.rows, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(
        (__nv_bfloat16 *)P, lse, scores, d.Lq, d.Lk, scale, causal, write_lse);
  else
    softmax_rows_kernel<<<(unsigned)d.rows, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(
        (float *)P, lse, scores, d.Lq, d.Lk, scale, causal, write_lse);
  return TSR_CU(cudaGetLastError());
}

} // namespace

extern "C" tsr_status tsr_cuda_attention_gemm_forward(tsr_cuda_ctx *ctx, float *out, float *lse,
                                                      const float *q, const float *k,
                                                      const float *v, int B, int Hq, int Hkv,
                                                      int Lq, int Lk, int D, bool causal,
                                                      bool bf16) {
  dims d;
  TSR_CHECK(check("attention forward (gemm)", ctx, B, Hq, Hkv, Lq, Lk, D, &d));
  if (d.rows == 0) return TSR_OK;
  scratch s{ctx, {}, {}, 0};
  tsr_status st = TSR_OK;
  size_t psz = bf16 ? 2 : 4;
  float *scores = (float *)s.take((size_t)d.rows * Lk * 4);
  void *P = s.take((size_t)d.rows * Lk * psz);
  if (!scores || !P)
    return TSR_ERROR(TSR_ENOMEM, "attention forward (gemm): cannot allocate %lld scores",
                     (long long)(d.rows * Lk));
  const void *qo = operand(s, q, d.nq, bf16, &st), *ko = operand(s, k, d.nk, bf16, &st);
  const void *vo = operand(s, v, d.nk, bf16, &st);
  TSR_CHECK(st);
  TSR_CHECK(scores_and_probs(ctx, d, qo, ko, bf16, scores, P, lse, causal, true));
  return tsr_cuda_gemm_batched(ctx, out, false, P, vo, bf16, d.G * Lq, D, Lk, false, false, 1.0f,
                               0.0f, (int64_t)d.G * Lq * Lk, (int64_t)Lk * D, (int64_t)d.G * Lq * D,
                               d.nb);
}

extern "C" tsr_status tsr_cuda_attention_gemm_backward(tsr_cuda_ctx *ctx, float *dq, float *dk,
                                                       float *dv, const float *dout, const float *q,
                                                       const float *k, const float *v,
                                                       const float *out, const float *lse, int B,
                                                       int Hq, int Hkv, int Lq, int Lk, int D,
                                                       bool causal, bool bf16) {
  dims d;
  TSR_CHECK(check("attention backward (gemm)", ctx, B, Hq, Hkv, Lq, Lk, D, &d));
  if (d.rows == 0) return TSR_OK;
  scratch s{ctx, {}, {}, 0};
  tsr_status st = TSR_OK;
  size_t psz = bf16 ? 2 : 4;
  float *buf = (float *)s.take((size_t)d.rows * Lk * 4); /* scores, then dP */
  void *P = s.take((size_t)d.rows * Lk * psz);
  void *dS = s.take((size_t)d.rows * Lk * psz);
  if (!buf || !P || !dS)
    return TSR_ERROR(TSR_ENOMEM, "attention backward (gemm): cannot allocate %lld scores",
                     (long long)(d.rows * Lk));
  const void *qo = operand(s, q, d.nq, bf16, &st), *ko = operand(s, k, d.nk, bf16, &st);
  const void *vo = operand(s, v, d.nk, bf16, &st), *go = operand(s, dout, d.nq, bf16, &st);
  TSR_CHECK(st);
  /* lse is const here: the recompute only reads it. */
  TSR_CHECK(scores_and_probs(ctx, d, qo, ko, bf16, buf, P, (float *)lse, causal, false));
  int64_t sq = (int64_t)d.G * Lq * D, sk = (int64_t)Lk * D, ss = (int64_t)d.G * Lq * Lk;
  TSR_CHECK(tsr_cuda_gemm_batched(ctx, buf, false, go, vo, bf16, d.G * Lq, Lk, D, false, true, 1.0f,
                                  0.0f, sq, sk, ss, d.nb)); /* dP = dout·vᵀ */
  float scale = 1.0f / sqrtf((float)D);
  if (bf16)
    dsoftmax_rows_kernel<<<(unsigned)d.rows, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(
        (__nv_bfloat16 *)dS, (const __nv_bfloat16 *)P, buf, out, dout, Lk, D, scale);
  else
    dsoftmax_rows_kernel<<<(unsigned)d.rows, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(
        (float *)dS, (const float *)P, buf, out, dout, Lk, D, scale);
  TSR_CHECK(TSR_CU(cudaGetLastError()));
  /* dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dout (the group's rows summed by the GEMM's K dim). */
  TSR_CHECK(tsr_cuda_gemm_batched(ctx, dq, false, dS, ko, bf16, d.G * Lq, D, Lk, false, false, 1.0f,
                                  1.0f, ss, sk, sq, d.nb));
  TSR_CHECK(tsr_cuda_gemm_batched(ctx, dk, false, dS, qo, bf16, Lk, D, d.G * Lq, true, false, 1.0f,
                                  1.0f, ss, sq, sk, d.nb));
  return tsr_cuda_gemm_batched(ctx, dv, false, P, go, bf16, Lk, D, d.G * Lq, true, false, 1.0f,
                               1.0f, ss, sq, sk, d.nb);
}
