// Softmax cross-entropy on the device, fused and vocabulary-parallel pieces. One block per row;
// sums of exponentials in double, as kernels/cpu/loss.c.
#include <math.h>

#include "device_util.cuh"
#include "misc.h"

__device__ float row_max_dev(const float *row, int V, float *red) {
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = row[j] > m ? row[j] : m;
  return tsr_block_reduce(m, tsr_max_op<float>(), red);
}

__device__ double row_sumexp_dev(const float *row, int V, float m, double *red) {
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp((double)row[j] - m);
  return tsr_block_reduce(s, tsr_sum_op<double>(), red);
}

__global__ void cross_entropy_kernel(tsr_cuda_scratch *acc, float *dlogits, const float *logits,
                                     const int32_t *targets, int V, double scale) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  int64_t i = blockIdx.x;
  int t = targets[i];
  if (t == TSR_IGNORE_INDEX) return;
  const float *row = logits + i * V;
  float m = row_max_dev(row, V, redf);
  double lse = m + log(row_sumexp_dev(row, V, m, redd));
  if (threadIdx.x == 0) atomicAdd(&acc->acc, lse - row[t]);
  if (dlogits) {
    float *drow = dlogits + i * V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      double p = exp((double)row[j] - lse);
      drow[j] += (float)(scale * (p - (j == t ? 1.0 : 0.0)));
    }
  }
}

extern "C" tsr_status tsr_cuda_k_cross_entropy(float *loss, int *n_valid, float *dlogits,
                                               const float *logits, const int32_t *targets, int N,
                                               int V, float dloss) {
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "cross_entropy: no current CUDA context");
  int bad = -1, count = 0;
  TSR_CHECK(tsr_cuda_check_ids(ctx, targets, N, V, true, &bad, &count));
  if (bad >= 0)
    return TSR_ERROR(TSR_EINVAL,
                     "cross_entropy: target %d at position %d is outside [0, %d) and is not the "
                     "ignore index %d",
                     (int)tsr_cuda_read_id(ctx, targets, bad), bad, V, TSR_IGNORE_INDEX);
  if (n_valid) *n_valid = count;
  double scale = count > 0 ? (double)dloss / count : 0.0;
  TSR_CHECK(tsr_cuda_scratch_reset(ctx));
  if (N > 0 && count > 0) {
    cross_entropy_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(ctx->scratch_dev, dlogits,
                                                                       logits, targets, V, scale);
    TSR_CHECK(TSR_CU(cudaGetLastError()));
  }
  tsr_cuda_scratch s;
  TSR_CHECK(tsr_cuda_scratch_read(ctx, &s));
  *loss = count > 0 ? (float)(s.acc / count) : NAN;
  return TSR_OK;
}

__global__ void row_max_kernel(float *out, const float *logits, int Vl) {
  __shared__ float red[32];
  float m = row_max_dev(logits + (int64_t)blockIdx.x * Vl, Vl, red);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

__global__ void row_sumexp_kernel(float *out, const float *logits, const float *rmax, int Vl) {
  __shared__ double red[32];
  double s = row_sumexp_dev(logits + (int64_t)blockIdx.x * Vl, Vl, rmax[blockIdx.x], red);
  if (threadIdx.x == 0) out[blockIdx.x] = (float)s;
}

__global__ void target_kernel(float *out, const float *logits, const int32_t *targets, int N,
                              int Vl, int vocab_start) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  int64_t local = (int64_t)targets[i] - vocab_start;
  bool here = targets[i] != TSR_IGNORE_INDEX && local >= 0 && local < Vl;
  out[i] = here ? logits[(int64_t)i * Vl + local] : 0.0f;
}

__global__ void shard_backward_kernel(float *dlogits, const float *logits, const int32_t *targets,
                                      const float *rmax, const float *sumexp, int Vl,
                                      int vocab_start, float scale) {
  int64_t i = blockIdx.x;
  if (targets[i] == TSR_IGNORE_INDEX) return;
  int64_t local = (int64_t)targets[i] - vocab_start;
  double lse = rmax[i] + log((double)sumexp[i]);
  const float *row = logits + i * Vl;
  float *drow = dlogits + i * Vl;
  for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) {
    double p = exp((double)row[j] - lse);
    drow[j] += (float)(scale * (p - (j == local ? 1.0 : 0.0)));
  }
}

extern "C" void tsr_cuda_k_logits_row_max(float *row_max, const float *logits, int N, int Vl) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("logits_row_max");
  if (N <= 0) return;
  row_max_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(row_max, logits, Vl);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_logits_row_sumexp(float *sumexp, const float *logits,
                                             const float *row_max, int N, int Vl) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("logits_row_sumexp");
  if (N <= 0) return;
  row_sumexp_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(sumexp, logits, row_max, Vl);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_logits_target(float *target_logit, const float *logits,
                                         const int32_t *targets, int N, int Vl, int vocab_start) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("logits_target");
  if (N <= 0) return;
  target_kernel<<<(N + 255) / 256, 256, 0, ctx->compute>>>(target_logit, logits, targets, N, Vl,
                                                           vocab_start);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                                        const int32_t *targets,
                                                        const float *row_max, const float *sumexp,
                                                        int N, int Vl, int vocab_start,
                                                        float scale) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("cross_entropy_shard_backward");
  if (N <= 0) return;
  shard_backward_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(
      dlogits, logits, targets, row_max, sumexp, Vl, vocab_start, scale);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}
