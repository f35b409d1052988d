// Per-token layers on the device: RMSNorm, RoPE, head layout changes, SwiGLU, embedding. Each
// mirrors kernels/cpu/layers.c operation for operation; products and sums are written with the
// _rn intrinsics where the CPU code has separate roundings, so that nvcc does not fuse them into
// an FMA the CPU does not perform.
#include <math.h>

#include "device_util.cuh"
#include "misc.h"

// ---------------------------------------------------------------------------------------------
// RMSNorm
// ---------------------------------------------------------------------------------------------

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *x, const float *w,
                                       int C, float eps) {
  __shared__ double red[32];
  const float *xi = x + (int64_t)blockIdx.x * C;
  float *oi = out + (int64_t)blockIdx.x * C;
  double ss = 0.0;
  for (int j = threadIdx.x; j < C; j += blockDim.x) ss += (double)xi[j] * xi[j];
  ss = tsr_block_reduce(ss, tsr_sum_op<double>(), red);
  float var = (float)(ss / C);
  float r = 1.0f / sqrtf(var + eps);
  for (int j = threadIdx.x; j < C; j += blockDim.x) oi[j] = __fmul_rn(__fmul_rn(xi[j], r), w[j]);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

__global__ void rmsnorm_backward_dx_kernel(float *dx, const float *dout, const float *x,
                                           const float *w, const float *rstd, int C) {
  __shared__ double red[32];
  int64_t off = (int64_t)blockIdx.x * C;
  const float *xi = x + off, *gi = dout + off;
  float *dxi = dx + off;
  float r = rstd[blockIdx.x];
  double dot = 0.0;
  for (int j = threadIdx.x; j < C; j += blockDim.x) dot += (double)gi[j] * w[j] * xi[j];
  dot = tsr_block_reduce(dot, tsr_sum_op<double>(), red);
  float coef = __fmul_rn(__fmul_rn((float)(dot / C), r), r);
  for (int j = threadIdx.x; j < C; j += blockDim.x)
    dxi[j] =
        __fadd_rn(dxi[j], __fmul_rn(r, __fsub_rn(__fmul_rn(w[j], gi[j]), __fmul_rn(xi[j], coef))));
}

// One thread per column over a slice of the rows; the slices' sums are added with atomics, so
// that a (tokens × hidden) gradient uses the whole device rather than `hidden` threads.
#define RMS_DW_ROWS 64
__global__ void rmsnorm_backward_dw_kernel(float *dw, const float *dout, const float *x,
                                           const float *rstd, int N, int C) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= C) return;
  int64_t r0 = (int64_t)blockIdx.y * RMS_DW_ROWS;
  int64_t r1 = r0 + RMS_DW_ROWS < N ? r0 + RMS_DW_ROWS : N;
  float acc = 0.0f;
  for (int64_t i = r0; i < r1; i++)
    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(dout[i * C + j], x[i * C + j]), rstd[i]));
  atomicAdd(&dw[j], acc);
}

extern "C" void tsr_cuda_k_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                                           int N, int C, float eps) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("rmsnorm_forward");
  if (N <= 0) return;
  rmsnorm_forward_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(out, rstd, x, w, C, eps);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                            const float *w, const float *rstd, int N, int C) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("rmsnorm_backward");
  if (N <= 0) return;
  rmsnorm_backward_dx_kernel<<<N, TSR_CUDA_ROW_THREADS, 0, ctx->compute>>>(dx, dout, x, w, rstd, C);
  TSR_CUDA_KEEP_LAUNCH(ctx);
  if (dw) {
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + RMS_DW_ROWS - 1) / RMS_DW_ROWS));
    rmsnorm_backward_dw_kernel<<<grid, 256, 0, ctx->compute>>>(dw, dout, x, rstd, N, C);
    TSR_CUDA_KEEP_LAUNCH(ctx);
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------

// The inverse frequencies are computed on the host with the C library's powf, exactly as the
// CPU kernel does, so that every angle is bit-identical: the device's powf may differ by a few
// ulp, which at positions in the thousands moves an angle by 1e-4 rad. Only cosf/sinf differ.
struct rope_freqs {
  float inv[256]; /* (D / 2), D <= 512 */
};

__global__ void rope_tables_kernel(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                                   rope_freqs f) {
  int half = D / 2;
  int64_t n = (int64_t)L * half;
  for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < n;
       u += (int64_t)gridDim.x * blockDim.x) {
    int64_t l = u / half;
    int i = (int)(u % half);
    float p = (float)(pos != NULL ? pos[l] : l);
    float angle = __fmul_rn(p, f.inv[i]);
    float c = cosf(angle), s = sinf(angle);
    cos_t[l * D + i] = c;
    cos_t[l * D + i + half] = c;
    sin_t[l * D + i] = s;
    sin_t[l * D + i + half] = s;
  }
}

// One thread per (b, l, h, i < D/2): reads both halves before writing, so out == x is safe.
__global__ void rope_kernel(float *out, const float *x, const float *cos_t, const float *sin_t,
                            int64_t B, int L, int H, int D, bool backward) {
  int half = D / 2;
  int64_t n = B * L * H * half;
  for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < n;
       u += (int64_t)gridDim.x * blockDim.x) {
    int i = (int)(u % half);
    int64_t row = u / half; /* (b, l, h) */
    int64_t l = (row / H) % L;
    const float *c = cos_t + l * D, *s = sin_t + l * D;
    int64_t off = row * D;
    float x1 = x[off + i], x2 = x[off + i + half];
    if (!backward) {
      out[off + i] = __fsub_rn(__fmul_rn(x1, c[i]), __fmul_rn(x2, s[i]));
      out[off + i + half] = __fadd_rn(__fmul_rn(x2, c[i + half]), __fmul_rn(x1, s[i + half]));
    } else {
      out[off + i] =
          __fadd_rn(out[off + i], __fadd_rn(__fmul_rn(x1, c[i]), __fmul_rn(x2, s[i + half])));
      out[off + i + half] = __fadd_rn(out[off + i + half],
                                      __fsub_rn(__fmul_rn(x2, c[i + half]), __fmul_rn(x1, s[i])));
    }
  }
}

extern "C" tsr_status tsr_cuda_k_rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int L,
                                             int D, float theta) {
  if (D <= 0 || D % 2 != 0)
    return TSR_ERROR(TSR_EINVAL, "rope: head_dim %d must be positive and even", D);
  if (L < 0) return TSR_ERROR(TSR_EINVAL, "rope: sequence length %d is negative", L);
  if (!(theta > 0.0f)) return TSR_ERROR(TSR_EINVAL, "rope: rope_theta %g must be > 0", theta);
  if (D > 512) return TSR_ERROR(TSR_EINVAL, "rope: head_dim %d is above the CUDA limit 512", D);
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "rope tables: no current CUDA context on this thread");
  if (L == 0) return TSR_OK;
  rope_freqs f;
  for (int i = 0; i < D / 2; i++) f.inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
  rope_tables_kernel<<<tsr_cuda_ew_blocks((int64_t)L * (D / 2)), TSR_CUDA_EW_THREADS, 0,
                       ctx->compute>>>(cos_t, sin_t, pos, L, D, f);
  return TSR_CU(cudaGetLastError());
}

static void launch_rope(const char *what, float *out, const float *x, const float *cos_t,
                        const float *sin_t, int B, int L, int H, int D, bool backward) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx(what);
  int64_t n = (int64_t)B * L * H * (D / 2);
  if (n <= 0) return;
  rope_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
      out, x, cos_t, sin_t, B, L, H, D, backward);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_rope_forward(float *out, const float *x, const float *cos_t,
                                        const float *sin_t, int B, int L, int H, int D) {
  launch_rope("rope_forward", out, x, cos_t, sin_t, B, L, H, D, false);
}

extern "C" void tsr_cuda_k_rope_backward(float *dx, const float *dout, const float *cos_t,
                                         const float *sin_t, int B, int L, int H, int D) {
  launch_rope("rope_backward", dx, dout, cos_t, sin_t, B, L, H, D, true);
}

// out index by the output layout; `to_bhld` picks which side is (B, L, H, D).
__global__ void head_layout_kernel(float *out, const float *x, int64_t B, int L, int H, int D,
                                   bool to_bhld) {
  int64_t n = B * L * H * D;
  for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < n;
       u += (int64_t)gridDim.x * blockDim.x) {
    int64_t d = u % D, r = u / D;
    int64_t b, l, h;
    if (to_bhld) { /* u walks (B, H, L, D) */
      l = r % L;
      h = (r / L) % H;
      b = r / ((int64_t)L * H);
      out[u] = x[((b * L + l) * H + h) * D + d];
    } else { /* u walks (B, L, H, D) */
      h = r % H;
      l = (r / H) % L;
      b = r / ((int64_t)L * H);
      out[u] = x[((b * H + h) * L + l) * D + d];
    }
  }
}

static void launch_layout(const char *what, float *out, const float *x, int B, int L, int H, int D,
                          bool to_bhld) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx(what);
  int64_t n = (int64_t)B * L * H * D;
  if (n <= 0) return;
  head_layout_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
      out, x, B, L, H, D, to_bhld);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_blhd_to_bhld(float *out, const float *x, int B, int L, int H, int D) {
  launch_layout("blhd_to_bhld", out, x, B, L, H, D, true);
}

extern "C" void tsr_cuda_k_bhld_to_blhd(float *out, const float *x, int B, int L, int H, int D) {
  launch_layout("bhld_to_blhd", out, x, B, L, H, D, false);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------

__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    float silu = __fmul_rn(g, s);
    float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
    dgate[i] = __fadd_rn(dgate[i], __fmul_rn(__fmul_rn(dout[i], up[i]), dsilu));
    dup[i] = __fadd_rn(dup[i], __fmul_rn(dout[i], silu));
  }
}

extern "C" void tsr_cuda_k_swiglu_forward(float *out, const float *gate, const float *up,
                                          int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("swiglu_forward");
  if (n <= 0) return;
  swiglu_forward_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(out, gate,
                                                                                         up, n);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

extern "C" void tsr_cuda_k_swiglu_backward(float *dgate, float *dup, const float *dout,
                                           const float *gate, const float *up, int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_need_ctx("swiglu_backward");
  if (n <= 0) return;
  swiglu_backward_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(
      dgate, dup, dout, gate, up, n);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}

// ---------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(float *out, const int32_t *ids, const float *table,
                                         int64_t N, int C) {
  for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < N * C;
       u += (int64_t)gridDim.x * blockDim.x)
    out[u] = table[(int64_t)ids[u / C] * C + u % C];
}

// Rows repeat when a token repeats; atomics make the order of the additions vary from run to
// run, which changes the result by rounding only.
__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int32_t *ids,
                                          int64_t N, int C) {
  for (int64_t u = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; u < N * C;
       u += (int64_t)gridDim.x * blockDim.x)
    atomicAdd(&dtable[(int64_t)ids[u / C] * C + u % C], dout[u]);
}

static tsr_status check_ids(tsr_cuda_ctx *ctx, const char *what, const int32_t *ids, int N, int V) {
  int bad = -1, count = 0;
  TSR_CHECK(tsr_cuda_check_ids(ctx, ids, N, V, false, &bad, &count));
  if (bad >= 0)
    return TSR_ERROR(TSR_EINVAL, "%s: token id %d at position %d is outside the vocabulary [0, %d)",
                     what, (int)tsr_cuda_read_id(ctx, ids, bad), bad, V);
  return TSR_OK;
}

extern "C" tsr_status tsr_cuda_k_embedding_forward(float *out, const int32_t *ids,
                                                   const float *table, int N, int V, int C) {
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "embedding forward: no current CUDA context");
  TSR_CHECK(check_ids(ctx, "embedding forward", ids, N, V));
  if ((int64_t)N * C == 0) return TSR_OK;
  embedding_forward_kernel<<<tsr_cuda_ew_blocks((int64_t)N * C), TSR_CUDA_EW_THREADS, 0,
                             ctx->compute>>>(out, ids, table, N, C);
  return TSR_CU(cudaGetLastError());
}

extern "C" tsr_status tsr_cuda_k_embedding_backward(float *dtable, const float *dout,
                                                    const int32_t *ids, int N, int V, int C) {
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  if (!ctx) return TSR_ERROR(TSR_EINVAL, "embedding backward: no current CUDA context");
  TSR_CHECK(check_ids(ctx, "embedding backward", ids, N, V));
  if ((int64_t)N * C == 0) return TSR_OK;
  embedding_backward_kernel<<<tsr_cuda_ew_blocks((int64_t)N * C), TSR_CUDA_EW_THREADS, 0,
                              ctx->compute>>>(dtable, dout, ids, N, C);
  return TSR_CU(cudaGetLastError());
}
