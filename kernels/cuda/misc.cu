// Small kernels: bias broadcast and column sums for nn.Linear, scaling, bf16 conversions, test
// patterns, and the id checks that must finish before an op writes anything.
#include <cuda_bf16.h>

#include "device_util.cuh"
#include "misc.h"

__global__ void bias_rows_kernel(float *out, const float *bias, int64_t N, int OC) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * OC;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = bias[i % OC];
}

// One thread per output column, walking the rows: coalesced across the threads of a warp.
__global__ void col_sum_kernel(float *dbias, const float *dout, int N, int OC) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0.0f;
  for (int64_t i = 0; i < N; i++) s += dout[i * OC + o];
  dbias[o] += s;
}

__global__ void scale_kernel(float *x, int64_t n, float a) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] *= a;
}

__global__ void fill_pattern_kernel(float *x, int64_t n, int mod, float step) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = (float)(i % mod) * step;
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void from_bf16_kernel(float *dst, const __nv_bfloat16 *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

// first_bad = smallest position whose id is outside [0, V) (and not the ignore index when
// allowed); count = ids that are in range.
__global__ void check_ids_kernel(tsr_cuda_scratch *s, const int32_t *ids, int N, int V,
                                 bool allow_ignore) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
    int32_t id = ids[i];
    if (allow_ignore && id == TSR_IGNORE_INDEX) continue;
    if (id < 0 || id >= V)
      atomicMin(&s->first_bad, i);
    else
      atomicAdd(&s->count, 1);
  }
}

extern "C" {

cudaError_t tsr_cuda_launch_bias_rows(cudaStream_t s, float *out, const float *bias, int N,
                                      int OC) {
  bias_rows_kernel<<<tsr_cuda_ew_blocks((int64_t)N * OC), TSR_CUDA_EW_THREADS, 0, s>>>(out, bias, N,
                                                                                       OC);
  return cudaGetLastError();
}

cudaError_t tsr_cuda_launch_col_sum(cudaStream_t s, float *dbias, const float *dout, int N,
                                    int OC) {
  col_sum_kernel<<<(OC + 255) / 256, 256, 0, s>>>(dbias, dout, N, OC);
  return cudaGetLastError();
}

cudaError_t tsr_cuda_launch_scale(cudaStream_t s, float *x, int64_t n, float a) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, s>>>(x, n, a);
  return cudaGetLastError();
}

cudaError_t tsr_cuda_launch_fill_pattern(cudaStream_t s, float *x, int64_t n, int mod, float step) {
  if (n <= 0) return cudaSuccess;
  fill_pattern_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, s>>>(x, n, mod, step);
  return cudaGetLastError();
}

void tsr_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("f32_to_bf16");
  if (n <= 0) return;
  to_bf16_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
      reinterpret_cast<__nv_bfloat16 *>(dst), src, n);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

void tsr_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("bf16_to_f32");
  if (n <= 0) return;
  from_bf16_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
      dst, reinterpret_cast<const __nv_bfloat16 *>(src), n);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

tsr_status tsr_cuda_check_ids(tsr_cuda_ctx *ctx, const int32_t *ids, int N, int V,
                              bool allow_ignore, int *first_bad, int *count) {
  TSR_CHECK(tsr_cuda_scratch_reset(ctx));
  if (N > 0) {
    check_ids_kernel<<<tsr_cuda_ew_blocks(N), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
        ctx->scratch_dev, ids, N, V, allow_ignore);
    TSR_CHECK(TSR_CU(cudaGetLastError()));
  }
  tsr_cuda_scratch s;
  TSR_CHECK(tsr_cuda_scratch_read(ctx, &s));
  *first_bad = s.first_bad == INT32_MAX ? -1 : s.first_bad;
  *count = s.count;
  return TSR_OK;
}

} // extern "C"

extern "C" int32_t tsr_cuda_read_id(tsr_cuda_ctx *ctx, const int32_t *ids, int pos) {
  int32_t v = 0;
  if (tsr_cuda_copy_to_host(ctx, &v, ids + pos, sizeof v) != TSR_OK) return 0;
  return v;
}
