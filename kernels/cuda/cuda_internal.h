/* What the files of libtessera-cuda share: the context's layout, error helpers, and the C entry
 * points of the .cu launchers. Not installed. */
#ifndef TESSERA_CUDA_INTERNAL_H
#define TESSERA_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "tessera_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_cuda_block {
  void *ptr;
  size_t bytes; /* rounded size */
} tsr_cuda_block;

typedef struct tsr_cuda_cache {
  pthread_mutex_t lock;
  tsr_cuda_block *free_blocks; /* (n_free) blocks ready for reuse */
  size_t n_free, cap_free;
  tsr_cuda_alloc_stats stats;
} tsr_cuda_cache;

/* Bytes of the scratch area: the check kernels' first bad index and valid count, and a double
 * accumulator, copied to the host in one transfer. */
#define TSR_CUDA_SCRATCH_BYTES 64

typedef struct tsr_cuda_scratch {
  int first_bad; /* smallest bad position, INT32_MAX when none */
  int count;     /* valid entries */
  double acc;    /* reduction result */
} tsr_cuda_scratch;

struct tsr_cuda_ctx {
  int device;
  cudaStream_t compute, comm;
  cudaEvent_t compute_mark, comm_mark; /* recorded to order the two streams */
  cublasHandle_t blas;
  void *blas_workspace; /* (blas_workspace_bytes) so cuBLAS never allocates per call */
  size_t blas_workspace_bytes;
  bool tf32;
  tsr_allocator alloc; /* context = this ctx's cache */
  tsr_cuda_cache cache;
  tsr_cuda_scratch *scratch_dev;  /* device */
  tsr_cuda_scratch *scratch_host; /* pinned host mirror */
  tsr_status kept;                /* first error of a void kernel, returned by sync */
  char kept_msg[512];
};

/* Turns a runtime/cuBLAS failure into a tsr_status with a message naming the call. */
tsr_status tsr_cuda_status(cudaError_t e, const char *what, const char *file, int line);
tsr_status tsr_cublas_status(cublasStatus_t s, const char *what, const char *file, int line);
#define TSR_CU(call)     tsr_cuda_status((call), #call, __FILE__, __LINE__)
#define TSR_CUBLAS(call) tsr_cublas_status((call), #call, __FILE__, __LINE__)

/* Keeps the first failure of a void kernel in the context (returned by tsr_cuda_ctx_sync). */
void tsr_cuda_keep(tsr_cuda_ctx *ctx, tsr_status s);

/* The current context of a kernel that has one of the table's void signatures: a missing
 * context is a caller bug and goes to the invariant handler. */
tsr_cuda_ctx *tsr_cuda_need_ctx(const char *kernel);

/* The current context of a memory function of the table, which must not crash without one:
 * NULL when none is current, after keeping an error naming `fn` for this thread's next
 * tsr_cuda_take_orphan (only the first such error is kept). */
tsr_cuda_ctx *tsr_cuda_try_ctx(const char *fn);
/* The error kept by tsr_cuda_try_ctx on this thread since the last call (TSR_OK if none), its
 * message made the thread's last error; clears it. */
tsr_status tsr_cuda_take_orphan(void);

/* Reads the scratch area back after the kernels queued so far (waits on the compute stream). */
tsr_status tsr_cuda_scratch_read(tsr_cuda_ctx *ctx, tsr_cuda_scratch *out);
/* Resets the scratch area on the compute stream (first_bad = INT32_MAX, count = 0, acc = 0). */
tsr_status tsr_cuda_scratch_reset(tsr_cuda_ctx *ctx);

void tsr_cuda_cache_init(tsr_cuda_ctx *ctx);
void tsr_cuda_cache_fini(tsr_cuda_ctx *ctx);

/* Launchers of the element-wise helpers used by the GEMM code (misc.cu). */
cudaError_t tsr_cuda_launch_bias_rows(cudaStream_t s, float *out, const float *bias, int N, int OC);
cudaError_t tsr_cuda_launch_col_sum(cudaStream_t s, float *dbias, const float *dout, int N, int OC);
cudaError_t tsr_cuda_launch_scale(cudaStream_t s, float *x, int64_t n, float a);
cudaError_t tsr_cuda_launch_fill_pattern(cudaStream_t s, float *x, int64_t n, int mod, float step);

#ifdef __cplusplus
}
#endif
#endif
