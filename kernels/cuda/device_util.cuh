/* Device helpers shared by the .cu files: block reductions and launch shapes. */
#ifndef TESSERA_CUDA_DEVICE_UTIL_CUH
#define TESSERA_CUDA_DEVICE_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_internal.h"

/* Threads per block of the row kernels: one block per row, threads striding over its columns. */
#define TSR_CUDA_ROW_THREADS 256
/* Threads of the element-wise kernels; the grid is capped and the kernels grid-stride. */
#define TSR_CUDA_EW_THREADS 256

static inline unsigned tsr_cuda_ew_blocks(int64_t n) {
  int64_t b = (n + TSR_CUDA_EW_THREADS - 1) / TSR_CUDA_EW_THREADS;
  if (b < 1) b = 1;
  return (unsigned)(b < 65535 * 8 ? b : 65535 * 8);
}

template <typename T> struct tsr_sum_op {
  __device__ T operator()(T a, T b) const { return a + b; }
};
template <typename T> struct tsr_max_op {
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

/* Reduces `v` over the block; every thread receives the result. blockDim.x must be a multiple
 * of 32 and at most 1024. `shared` holds 32 values. */
template <typename T, typename Op> __device__ T tsr_block_reduce(T v, Op op, T *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads(); /* `shared` may still be read from a previous call */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int nwarps = (blockDim.x + 31) >> 5;
  T r = shared[0];
  for (int w = 1; w < nwarps; w++) r = op(r, shared[w]);
  return r;
}

/* Adds the launch error of the kernel just queued to the context's kept error. */
#define TSR_CUDA_KEEP_LAUNCH(ctx) tsr_cuda_keep((ctx), TSR_CU(cudaGetLastError()))

#endif
