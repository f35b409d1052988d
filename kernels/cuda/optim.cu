// AdamW, sums of squares and scaling on the device. AdamW follows kernels/cpu/optim.c rounding
// for rounding: the scalars are computed on the host in double exactly as there, and every
// element-wise product and sum is a separately rounded _rn intrinsic (fmaf where the CPU uses
// fmaf), so nvcc cannot contract them and the result matches the CPU's bit for bit.
#include <math.h>

#include "device_util.cuh"
#include "misc.h"

struct adamw_scalars {
  float decay, w1, b2, w2, neg_step_size, bias_correction2_sqrt, eps;
  bool small_weight;
};

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, int64_t n,
                             adamw_scalars s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float p = __fmul_rn(param[i], s.decay);
    float g = grad[i];
    float diff = __fsub_rn(g, m[i]);
    float mi = s.small_weight ? fmaf(s.w1, diff, m[i]) : fmaf(__fsub_rn(s.w1, 1.0f), diff, g);
    float vi = __fmul_rn(v[i], s.b2);
    vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(s.w2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
  }
}

extern "C" void tsr_cuda_k_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
                                 int step, double lr, double beta1, double beta2, double eps,
                                 double weight_decay) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("adamw");
  if (n <= 0) return;
  adamw_scalars s;
  s.decay = (float)(1.0 - lr * weight_decay);
  s.w1 = (float)(1.0 - beta1);
  s.b2 = (float)beta2;
  s.w2 = (float)(1.0 - beta2);
  double bias_correction1 = 1.0 - pow(beta1, step);
  double bias_correction2 = 1.0 - pow(beta2, step);
  s.neg_step_size = (float)(-(lr / bias_correction1));
  s.bias_correction2_sqrt = (float)sqrt(bias_correction2);
  s.eps = (float)eps;
  s.small_weight = fabsf(s.w1) < 0.5f;
  adamw_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(param, grad, m, v,
                                                                                n, s);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

__global__ void sum_squares_kernel(tsr_cuda_scratch *acc, const float *x, int64_t n) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    s += (double)x[i] * x[i];
  s = tsr_block_reduce(s, tsr_sum_op<double>(), red);
  if (threadIdx.x == 0) atomicAdd(&acc->acc, s);
}

static unsigned reduce_blocks(int64_t n) {
  unsigned b = tsr_cuda_ew_blocks(n);
  return b < 1024 ? b : 1024; /* enough to fill the device; fewer atomics on the accumulator */
}

/* Σ over the buffers into the scratch accumulator, then one read back: NaN (and a kept error)
 * when the device fails, since the signature has no status. */
static double sum_squares_all(tsr_cuda_ctx *ctx, const float *const *bufs, const int64_t *sizes,
                              int nbufs) {
  tsr_status st = tsr_cuda_scratch_reset(ctx);
  for (int b = 0; b < nbufs && st == TSR_OK; b++) {
    if (sizes[b] <= 0) continue;
    sum_squares_kernel<<<reduce_blocks(sizes[b]), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
        ctx->scratch_dev, bufs[b], sizes[b]);
    st = TSR_CU(cudaGetLastError());
  }
  tsr_cuda_scratch s;
  if (st == TSR_OK) st = tsr_cuda_scratch_read(ctx, &s);
  if (st != TSR_OK) {
    tsr_cuda_keep(ctx, st);
    return NAN;
  }
  return s.acc;
}

extern "C" double tsr_cuda_k_sum_squares(const float *x, int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("sum_squares");
  return sum_squares_all(ctx, &x, &n, 1);
}

extern "C" double tsr_cuda_k_global_norm(const float *const *bufs, const int64_t *sizes,
                                         int nbufs) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("global_norm");
  return sqrt(sum_squares_all(ctx, bufs, sizes, nbufs));
}

extern "C" void tsr_cuda_k_scale(float *x, int64_t n, float s) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("scale");
  tsr_cuda_keep(ctx, TSR_CU(tsr_cuda_launch_scale(ctx->compute, x, n, s)));
}
