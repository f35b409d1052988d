// The two kernels of the kernel table's memory section (ABI 2): the strided copy that makes a
// tensor view contiguous (or scatters into one), and the f32 add that accumulates gradients.
// The rest of the section (copies, zero, allocator, sync) is host code in memory.c.
#include "device_util.cuh"
#include "misc.h"
#include "strided.h"

// One element per iteration. Consecutive threads take consecutive innermost coordinates, so the
// side whose innermost stride is 1 is accessed coalesced.
template <typename T>
__global__ void copy_strided_kernel(T *dst, const T *src, tsr_cuda_strided a, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t od, os;
    tsr_cuda_strided_offsets(&a, i, &od, &os);
    dst[od] = src[os];
  }
}

__global__ void add_kernel(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __fadd_rn(a[i], b[i]); // the CPU's one rounding; _rn is never fused into an FMA
}

template <typename T>
static cudaError_t launch_copy_strided(cudaStream_t s, void *dst, const void *src,
                                       const tsr_cuda_strided &a, int64_t n) {
  copy_strided_kernel<T><<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, s>>>(
      static_cast<T *>(dst), static_cast<const T *>(src), a, n);
  return cudaGetLastError();
}

extern "C" void tsr_cuda_k_copy_strided(void *dst, const int64_t *dst_stride, const void *src,
                                        const int64_t *src_stride, const int64_t *shape, int ndim,
                                        size_t elem_size) {
  tsr_cuda_ctx *ctx = tsr_cuda_try_ctx("copy_strided");
  if (!ctx) return;
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) {
    tsr_cuda_keep(
        ctx, TSR_ERROR(TSR_EINVAL, "copy_strided: elem_size %zu is not 1, 2, 4 or 8", elem_size));
    return;
  }
  // Each element is one access of elem_size bytes, which the device faults on when misaligned.
  if ((uintptr_t)dst % elem_size || (uintptr_t)src % elem_size) {
    tsr_cuda_keep(ctx, TSR_ERROR(TSR_EINVAL,
                                 "copy_strided: dst %p or src %p is not aligned to its %zu-byte "
                                 "elements",
                                 dst, src, elem_size));
    return;
  }
  tsr_cuda_strided a;
  int64_t n = 0;
  tsr_status st = tsr_cuda_strided_plan(&a, &n, dst_stride, src_stride, shape, ndim);
  if (st != TSR_OK || n == 0) {
    tsr_cuda_keep(ctx, st);
    return;
  }
  if (a.ndim == 0 || (a.ndim == 1 && a.dst_stride[0] == 1 && a.src_stride[0] == 1)) {
    tsr_cuda_keep(ctx, TSR_CU(cudaMemcpyAsync(dst, src, (size_t)n * elem_size,
                                              cudaMemcpyDeviceToDevice, ctx->compute)));
    return;
  }
  cudaError_t e;
  switch (elem_size) {
    case 1:
      e = launch_copy_strided<uint8_t>(ctx->compute, dst, src, a, n);
      break;
    case 2:
      e = launch_copy_strided<uint16_t>(ctx->compute, dst, src, a, n);
      break;
    case 4:
      e = launch_copy_strided<uint32_t>(ctx->compute, dst, src, a, n);
      break;
    default:
      e = launch_copy_strided<unsigned long long>(ctx->compute, dst, src, a, n);
      break;
  }
  tsr_cuda_keep(ctx, tsr_cuda_status(e, "copy_strided kernel launch", __FILE__, __LINE__));
}

extern "C" void tsr_cuda_k_add(float *out, const float *a, const float *b, int64_t n) {
  tsr_cuda_ctx *ctx = tsr_cuda_try_ctx("add");
  if (!ctx || n <= 0) return;
  add_kernel<<<tsr_cuda_ew_blocks(n), TSR_CUDA_EW_THREADS, 0, ctx->compute>>>(out, a, b, n);
  TSR_CUDA_KEEP_LAUNCH(ctx);
}
