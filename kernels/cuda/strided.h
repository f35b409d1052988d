/* The index arithmetic of the table's strided copy (memory.c plans, memory.cu runs), in a header
 * that C and nvcc both compile, so that the tests can check the plan and the per-element offsets
 * on the host against a plain reference without a device. Internal. */
#ifndef TESSERA_CUDA_STRIDED_H
#define TESSERA_CUDA_STRIDED_H

#include <stdint.h>

#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __CUDACC__
#define TSR_CUDA_HD __host__ __device__
#else
#define TSR_CUDA_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Shape and strides of a planned copy, dims innermost first; dims at and above ndim have size 1
 * and stride 0. Passed by value as a kernel argument (200 bytes; the limit is 4 KiB), so that no
 * device buffer is allocated and filled per call. */
typedef struct tsr_cuda_strided {
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  int64_t dst_stride[TSR_MAX_DIMS];
  int64_t src_stride[TSR_MAX_DIMS];
} tsr_cuda_strided;

/* Plans dst[idx] = src[idx] over the row-major `shape` (strides in elements): drops size-1 dims
 * and merges a dim into its inner neighbour when both sides are contiguous across the pair, so
 * the kernel divides less per element and a copy that ends as one unit-stride dim (or none) can
 * be a memcpy. *n is the element count (1 for ndim 0, 0 when a dim is 0). TSR_EINVAL, naming
 * copy_strided, for ndim outside 0..TSR_MAX_DIMS, NULL arrays with ndim > 0, a negative size. */
tsr_status tsr_cuda_strided_plan(tsr_cuda_strided *out, int64_t *n, const int64_t *dst_stride,
                                 const int64_t *src_stride, const int64_t *shape, int ndim);

/* Offsets (in elements) of linear index i, 0 <= i < n, on both sides. The loop is unrolled to
 * TSR_MAX_DIMS with a guard so that `a` is indexed with constants only and, in the kernel, stays
 * in the parameter space instead of being copied to local memory. */
static inline TSR_CUDA_HD void tsr_cuda_strided_offsets(const tsr_cuda_strided *a, int64_t i,
                                                        int64_t *od, int64_t *os) {
  int64_t rem = i, d_off = 0, s_off = 0;
#ifdef __CUDA_ARCH__ /* device pass only: the host compilers do not know the pragma */
#pragma unroll
#endif
  for (int d = 0; d < TSR_MAX_DIMS; d++) {
    if (d < a->ndim) {
      int64_t q = rem / a->shape[d];
      int64_t c = rem - q * a->shape[d];
      rem = q;
      d_off += c * a->dst_stride[d];
      s_off += c * a->src_stride[d];
    }
  }
  *od = d_off;
  *os = s_off;
}

#ifdef __cplusplus
}
#endif
#endif
