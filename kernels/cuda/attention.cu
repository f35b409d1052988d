// Causal GQA attention on the device: forward with log-sum-exp, backward from out and lse, and
// the log-sum-exp merge. Same semantics as kernels/cpu/attention.c (see kernels.h).
//
// One block per query row (grid: Lq × Hq × B), keys visited in chunks of ATT_THREADS with an
// online softmax; thread t scores key j0 + t, then the block accumulates the chunk into the
// output row, each thread owning the dims d ≡ t (mod ATT_THREADS). This is a correct, plain
// schedule: K and V are re-read for every query row and the backward adds dk/dv with atomics.
// A tiled (flash-attention style) schedule is the next step for speed (docs/cuda.md).
#include <math.h>

#include "device_util.cuh"
#include "misc.h"

#define ATT_THREADS         128
#define ATT_MAX_D           512
#define ATT_DIMS_PER_THREAD (ATT_MAX_D / ATT_THREADS)

struct attn_dims {
  int Hq, Hkv, Lq, Lk, D;
  bool causal;
  float scale;
};

__device__ __forceinline__ int32_t pos_at(const int32_t *pos, int i) {
  return pos != NULL ? pos[i] : i;
}

__device__ __forceinline__ float dot_row(const float *x /* shared */, const float *y, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; d++) s += x[d] * y[d];
  return s;
}

__global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                         attn_dims a) {
  extern __shared__ float sh[];
  float *qs = sh;       /* (D) this query row */
  float *ps = sh + a.D; /* (ATT_THREADS) probabilities of the chunk */
  __shared__ float red[32];
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
  int group = a.Hq / a.Hkv;
  int64_t qrow = ((int64_t)b * a.Hq + h) * a.Lq + i;
  int64_t kvh = (int64_t)b * a.Hkv + h / group;
  const float *kh = k + kvh * a.Lk * a.D, *vh = v + kvh * a.Lk * a.D;
  for (int d = t; d < a.D; d += ATT_THREADS) qs[d] = q[qrow * a.D + d];
  __syncthreads();
  int32_t qp = pos_at(q_pos, i);
  float acc[ATT_DIMS_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
  float m = -INFINITY, l = 0.0f;
  for (int j0 = 0; j0 < a.Lk; j0 += ATT_THREADS) {
    int j = j0 + t;
    float s = -INFINITY;
    if (j < a.Lk && (!a.causal || pos_at(k_pos, j) <= qp))
      s = a.scale * dot_row(qs, kh + (int64_t)j * a.D, a.D);
    float bm = tsr_block_reduce(s, tsr_max_op<float>(), red);
    if (bm == -INFINITY) continue; /* the whole block sees the same bm */
    float m_new = m > bm ? m : bm;
    float corr = expf(m - m_new); /* 0 before the first visible chunk, when acc and l are 0 */
    float p = s == -INFINITY ? 0.0f : expf(s - m_new);
    ps[t] = p; /* visible to all after the reduction's barriers */
    float psum = tsr_block_reduce(p, tsr_sum_op<float>(), red);
    l = l * corr + psum;
    int n = a.Lk - j0 < ATT_THREADS ? a.Lk - j0 : ATT_THREADS;
    for (int e = 0; e < ATT_DIMS_PER_THREAD; e++) acc[e] *= corr;
    for (int jj = 0; jj < n; jj++) {
      float pj = ps[jj];
      if (pj == 0.0f) continue;
      const float *vj = vh + (int64_t)(j0 + jj) * a.D;
      for (int e = 0; e < ATT_DIMS_PER_THREAD; e++) {
        int d = t + e * ATT_THREADS;
        if (d < a.D) acc[e] += pj * vj[d];
      }
    }
    m = m_new;
    __syncthreads(); /* ps is rewritten by the next chunk */
  }
  float *oi = out + qrow * a.D;
  float inv = l == 0.0f ? 0.0f : 1.0f / l;
  for (int e = 0; e < ATT_DIMS_PER_THREAD; e++) {
    int d = t + e * ATT_THREADS;
    if (d < a.D) oi[d] = acc[e] * inv;
  }
  if (t == 0) lse[qrow] = l == 0.0f ? -INFINITY : m + logf(l);
}

// p_ij = exp(s_ij − lse_i), D_i = dout_i · out_i, ds_ij = p_ij (dout_i · v_j − D_i) · scale;
// dq_i += Σ_j ds_ij k_j, dk_j += ds_ij q_i, dv_j += p_ij dout_i.
__global__ void attention_backward_kernel(float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v,
                                          const float *out, const float *lse, const int32_t *q_pos,
                                          const int32_t *k_pos, attn_dims a) {
  extern __shared__ float sh[];
  float *qs = sh;                          /* (D) */
  float *gs = sh + a.D;                    /* (D) dout row */
  float *ps = sh + 2 * a.D;                /* (ATT_THREADS) */
  float *dss = sh + 2 * a.D + ATT_THREADS; /* (ATT_THREADS) */
  __shared__ float red[32];
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
  int group = a.Hq / a.Hkv;
  int64_t qrow = ((int64_t)b * a.Hq + h) * a.Lq + i;
  float lse_i = lse[qrow];
  if (lse_i == -INFINITY) return; /* saw no key: no gradient (uniform over the block) */
  int64_t kvh = (int64_t)b * a.Hkv + h / group;
  const float *kh = k + kvh * a.Lk * a.D, *vh = v + kvh * a.Lk * a.D;
  float *dkh = dk + kvh * a.Lk * a.D, *dvh = dv + kvh * a.Lk * a.D;
  float part = 0.0f;
  for (int d = t; d < a.D; d += ATT_THREADS) {
    qs[d] = q[qrow * a.D + d];
    gs[d] = dout[qrow * a.D + d];
    part += gs[d] * out[qrow * a.D + d];
  }
  float di = tsr_block_reduce(part, tsr_sum_op<float>(), red); /* also publishes qs, gs */
  int32_t qp = pos_at(q_pos, i);
  float acc[ATT_DIMS_PER_THREAD] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j0 = 0; j0 < a.Lk; j0 += ATT_THREADS) {
    int j = j0 + t;
    float p = 0.0f, ds = 0.0f;
    if (j < a.Lk && (!a.causal || pos_at(k_pos, j) <= qp)) {
      p = expf(a.scale * dot_row(qs, kh + (int64_t)j * a.D, a.D) - lse_i);
      ds = p * (dot_row(gs, vh + (int64_t)j * a.D, a.D) - di) * a.scale;
    }
    ps[t] = p;
    dss[t] = ds;
    __syncthreads();
    int n = a.Lk - j0 < ATT_THREADS ? a.Lk - j0 : ATT_THREADS;
    for (int jj = 0; jj < n; jj++) {
      float pj = ps[jj], dsj = dss[jj];
      if (pj == 0.0f && dsj == 0.0f) continue;
      int64_t off = (int64_t)(j0 + jj) * a.D;
      for (int e = 0; e < ATT_DIMS_PER_THREAD; e++) {
        int d = t + e * ATT_THREADS;
        if (d >= a.D) continue;
        acc[e] += dsj * kh[off + d];
        atomicAdd(&dkh[off + d], dsj * qs[d]);
        atomicAdd(&dvh[off + d], pj * gs[d]);
      }
    }
    __syncthreads();
  }
  for (int e = 0; e < ATT_DIMS_PER_THREAD; e++) {
    int d = t + e * ATT_THREADS;
    if (d < a.D) dq[qrow * a.D + d] += acc[e];
  }
}

static tsr_status check_shapes(const char *what, int B, int Hq, int Hkv, int Lq, int Lk, int D) {
  if (B < 0 || Lq < 0 || Lk < 0)
    return TSR_ERROR(TSR_EINVAL, "%s: negative size (B=%d, Lq=%d, Lk=%d)", what, B, Lq, Lk);
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: query heads %d must be a positive multiple of key/value heads %d", what,
                     Hq, Hkv);
  if (D <= 0 || D > ATT_MAX_D)
    return TSR_ERROR(TSR_EINVAL, "%s: head_dim %d outside [1, %d]", what, D, ATT_MAX_D);
  if (Hq > 65535 || B > 65535)
    return TSR_ERROR(TSR_EINVAL, "%s: %d heads × %d batch exceed the CUDA grid (65535 each)", what,
                     Hq, B);
  return TSR_OK;
}

extern "C" tsr_status tsr_cuda_k_attention_forward(float *out, float *lse, const float *q,
                                                   const float *k, const float *v,
                                                   const int32_t *q_pos, const int32_t *k_pos,
                                                   int B, int Hq, int Hkv, int Lq, int Lk, int D,
                                                   bool causal) {
  TSR_CHECK(check_shapes("attention forward", B, Hq, Hkv, Lq, Lk, D));
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "attention forward: no current CUDA context");
  if (B == 0 || Lq == 0) return TSR_OK;
  attn_dims a = {Hq, Hkv, Lq, Lk, D, causal, 1.0f / sqrtf((float)D)};
  dim3 grid((unsigned)Lq, (unsigned)Hq, (unsigned)B);
  size_t shmem = (size_t)(D + ATT_THREADS) * sizeof(float);
  attention_forward_kernel<<<grid, ATT_THREADS, shmem, ctx->compute>>>(out, lse, q, k, v, q_pos,
                                                                       k_pos, a);
  return TSR_CU(cudaGetLastError());
}

extern "C" tsr_status
tsr_cuda_k_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const int32_t *q_pos, const int32_t *k_pos, int B, int Hq, int Hkv,
                              int Lq, int Lk, int D, bool causal) {
  TSR_CHECK(check_shapes("attention backward", B, Hq, Hkv, Lq, Lk, D));
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "attention backward: no current CUDA context");
  if (B == 0 || Lq == 0) return TSR_OK;
  attn_dims a = {Hq, Hkv, Lq, Lk, D, causal, 1.0f / sqrtf((float)D)};
  dim3 grid((unsigned)Lq, (unsigned)Hq, (unsigned)B);
  size_t shmem = (size_t)(2 * D + 2 * ATT_THREADS) * sizeof(float);
  attention_backward_kernel<<<grid, ATT_THREADS, shmem, ctx->compute>>>(dq, dk, dv, dout, q, k, v,
                                                                        out, lse, q_pos, k_pos, a);
  return TSR_CU(cudaGetLastError());
}

// One block per row: every thread reads both lse values before thread 0 overwrites lse[r],
// which may alias lse_a.
__global__ void attention_merge_kernel(float *out, float *lse, const float *out_a,
                                       const float *lse_a, const float *out_b, const float *lse_b,
                                       int D) {
  int64_t r = blockIdx.x;
  float la = lse_a[r], lb = lse_b[r];
  __syncthreads();
  float mx = la > lb ? la : lb;
  float *o = out + r * D;
  const float *oa = out_a + r * D, *ob = out_b + r * D;
  if (mx == -INFINITY) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = 0.0f;
    if (threadIdx.x == 0) lse[r] = -INFINITY;
    return;
  }
  float wa = expf(la - mx), wb = expf(lb - mx);
  float other = la > lb ? wb : wa;
  float sum = 1.0f + other;
  float ca = wa / sum, cb = wb / sum;
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    o[d] = __fadd_rn(__fmul_rn(ca, oa[d]), __fmul_rn(cb, ob[d]));
  if (threadIdx.x == 0) lse[r] = mx + log1pf(other);
}

extern "C" void tsr_cuda_k_attention_merge(float *out, float *lse, const float *out_a,
                                           const float *lse_a, const float *out_b,
                                           const float *lse_b, int R, int D) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("attention_merge");
  if (R <= 0) return;
  attention_merge_kernel<<<R, ATT_THREADS, 0, ctx->compute>>>(out, lse, out_a, lse_a, out_b, lse_b,
                                                              D);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

// ---------------------------------------------------------------------------------------------
// The projection layout (B, L, H, D): staged through (B, H, L, D) blocks of the caching
// allocator around the kernels above. The gradients accumulate, so they are staged in and out.
// ---------------------------------------------------------------------------------------------

namespace {

struct staged {
  tsr_cuda_ctx *ctx;
  float *buf[8];
  size_t bytes[8];
  int n;
  float *take(int64_t count) {
    size_t b = (size_t)count * sizeof(float);
    float *p = (float *)tsr_allocator_alloc(tsr_cuda_ctx_allocator(ctx), b ? b : 4);
    if (p) buf[n] = p, bytes[n++] = b ? b : 4;
    return p;
  }
  /* Blocks are handed back after the kernels that use them are queued: reuse is stream-ordered. */
  ~staged() {
    for (int i = 0; i < n; i++) tsr_allocator_free(tsr_cuda_ctx_allocator(ctx), buf[i], bytes[i]);
  }
};

} // namespace

extern "C" tsr_status tsr_cuda_k_attention_forward_blhd(float *out, float *lse, const float *q,
                                                        const float *k, const float *v,
                                                        const int32_t *q_pos, const int32_t *k_pos,
                                                        int B, int Hq, int Hkv, int Lq, int Lk,
                                                        int D, bool causal) {
  TSR_CHECK(check_shapes("attention forward", B, Hq, Hkv, Lq, Lk, D));
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "attention forward: no current CUDA context");
  int64_t nq = (int64_t)B * Hq * Lq * D, nk = (int64_t)B * Hkv * Lk * D;
  staged s{ctx, {}, {}, 0};
  float *qh = s.take(nq), *kh = s.take(nk), *vh = s.take(nk), *oh = s.take(nq);
  if (!qh || !kh || !vh || !oh)
    return TSR_ERROR(TSR_ENOMEM, "attention forward: cannot stage %lld values",
                     (long long)(2 * nq + 2 * nk));
  tsr_cuda_k_blhd_to_bhld(qh, q, B, Lq, Hq, D);
  tsr_cuda_k_blhd_to_bhld(kh, k, B, Lk, Hkv, D);
  tsr_cuda_k_blhd_to_bhld(vh, v, B, Lk, Hkv, D);
  TSR_CHECK(tsr_cuda_k_attention_forward(oh, lse, qh, kh, vh, q_pos, k_pos, B, Hq, Hkv, Lq, Lk, D,
                                         causal));
  tsr_cuda_k_bhld_to_blhd(out, oh, B, Lq, Hq, D);
  return TSR_CU(cudaGetLastError());
}

extern "C" tsr_status
tsr_cuda_k_attention_backward_blhd(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                   int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal) {
  TSR_CHECK(check_shapes("attention backward", B, Hq, Hkv, Lq, Lk, D));
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "attention backward: no current CUDA context");
  int64_t nq = (int64_t)B * Hq * Lq * D, nk = (int64_t)B * Hkv * Lk * D;
  staged s{ctx, {}, {}, 0};
  float *qh = s.take(nq), *kh = s.take(nk), *vh = s.take(nk), *gh = s.take(nq);
  float *oh = s.take(nq), *dqh = s.take(nq), *dkh = s.take(nk), *dvh = s.take(nk);
  if (!qh || !kh || !vh || !gh || !oh || !dqh || !dkh || !dvh)
    return TSR_ERROR(TSR_ENOMEM, "attention backward: cannot stage %lld values",
                     (long long)(4 * nq + 4 * nk));
  tsr_cuda_k_blhd_to_bhld(qh, q, B, Lq, Hq, D);
  tsr_cuda_k_blhd_to_bhld(kh, k, B, Lk, Hkv, D);
  tsr_cuda_k_blhd_to_bhld(vh, v, B, Lk, Hkv, D);
  tsr_cuda_k_blhd_to_bhld(gh, dout, B, Lq, Hq, D);
  tsr_cuda_k_blhd_to_bhld(oh, out, B, Lq, Hq, D);
  tsr_cuda_k_blhd_to_bhld(dqh, dq, B, Lq, Hq, D);
  tsr_cuda_k_blhd_to_bhld(dkh, dk, B, Lk, Hkv, D);
  tsr_cuda_k_blhd_to_bhld(dvh, dv, B, Lk, Hkv, D);
  TSR_CHECK(tsr_cuda_k_attention_backward(dqh, dkh, dvh, gh, qh, kh, vh, oh, lse, q_pos, k_pos, B,
                                          Hq, Hkv, Lq, Lk, D, causal));
  tsr_cuda_k_bhld_to_blhd(dq, dqh, B, Lq, Hq, D);
  tsr_cuda_k_bhld_to_blhd(dk, dkh, B, Lk, Hkv, D);
  tsr_cuda_k_bhld_to_blhd(dv, dvh, B, Lk, Hkv, D);
  return TSR_CU(cudaGetLastError());
}
