/* libtessera-cuda: the CUDA kernels, the per-rank CUDA context (device, streams, cuBLAS) and the
 * caching device allocator. See docs/cuda.md.
 *
 * The kernels themselves are reached through the kernel table (core/kernel_table.h), whose
 * functions have the signatures of include/tessera/kernels.h and run on the calling thread's
 * current context. This header is the rest: what a rank does to own a device. It includes no
 * CUDA header, so C code that only holds the opaque handles needs none.
 *
 * Errors: functions returning tsr_status report CUDA/cuBLAS failures with the call and its error
 * string. Kernels returning void cannot report; a launch failure is kept in the context and
 * returned by the next tsr_cuda_ctx_sync (CUDA's own errors are sticky in the same way). */
#ifndef TESSERA_CUDA_H
#define TESSERA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is none, with the reason (the runtime's message,
 * e.g. "no CUDA-capable device is detected") in why[why_len]. Never fails otherwise. */
int tsr_cuda_device_count(char *why, size_t why_len);

/* One rank's hold on one device: a compute stream, a communication stream, an event pair to
 * order them, a cuBLAS handle bound to the compute stream with its own workspace, a caching
 * allocator and a small scratch area for the kernels that return host values. */
typedef struct tsr_cuda_ctx tsr_cuda_ctx;

tsr_status tsr_cuda_ctx_create(int device, tsr_cuda_ctx **out);
/* Waits for both streams, then frees everything, the allocator's cache included. NULL: no-op. */
void tsr_cuda_ctx_destroy(tsr_cuda_ctx *ctx);

/* The context the kernel table's functions use on this thread (each rank thread sets its own);
 * NULL clears it. */
void tsr_cuda_ctx_make_current(tsr_cuda_ctx *ctx);
tsr_cuda_ctx *tsr_cuda_ctx_current(void);

int tsr_cuda_ctx_device(const tsr_cuda_ctx *ctx);

/* f32 GEMMs use TF32 tensor cores when on (the default, as torch's
 * allow_tf32 for cuDNN/matmul in training recipes); off gives IEEE f32 products. */
void tsr_cuda_ctx_set_tf32(tsr_cuda_ctx *ctx, bool on);

/* The streams as cudaStream_t values (opaque here). Kernels run on the compute stream; a
 * communication backend runs its collectives on the comm stream. */
void *tsr_cuda_ctx_compute_stream(tsr_cuda_ctx *ctx);
void *tsr_cuda_ctx_comm_stream(tsr_cuda_ctx *ctx);

/* Cross-stream ordering without a host wait: the comm stream waits for all work queued so far on
 * the compute stream (before a collective reads what kernels wrote), and the reverse. */
tsr_status tsr_cuda_ctx_comm_waits_compute(tsr_cuda_ctx *ctx);
tsr_status tsr_cuda_ctx_compute_waits_comm(tsr_cuda_ctx *ctx);

/* Waits for both streams; returns the first error kept from a void kernel or raised since. */
tsr_status tsr_cuda_ctx_sync(tsr_cuda_ctx *ctx);

/* Copies on the compute stream, waiting for completion (dst/src: host or device as named). */
tsr_status tsr_cuda_copy_to_device(tsr_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);
tsr_status tsr_cuda_copy_to_host(tsr_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);

/* ---------------------------------------------------------------------------------------------
 * Caching allocator
 *
 * A tsr_allocator (include/tessera/tensor.h) with device {TSR_DEVICE_CUDA, ordinal}. Blocks are
 * rounded up (512 B below 1 MiB, 2 MiB above) and freed blocks are kept per rounded size, so a
 * training step that allocates the same sizes as the previous one calls cudaMalloc zero times.
 * Reuse is ordered by the compute stream: a block freed after kernels that use it were queued
 * may be handed to the next kernel on the same stream at once. A block used on the comm stream
 * must be freed only after tsr_cuda_ctx_compute_waits_comm. On cudaMalloc failure the cache is
 * released and the allocation retried once.
 * ------------------------------------------------------------------------------------------- */

typedef struct tsr_cuda_alloc_stats {
  uint64_t device_mallocs; /* cudaMalloc calls so far */
  uint64_t cache_hits;     /* allocations served from the cache */
  size_t reserved_bytes;   /* held from the device: in use + cached */
  size_t cached_bytes;     /* free blocks kept for reuse */
} tsr_cuda_alloc_stats;

tsr_allocator *tsr_cuda_ctx_allocator(tsr_cuda_ctx *ctx);
tsr_cuda_alloc_stats tsr_cuda_ctx_alloc_stats(tsr_cuda_ctx *ctx);
/* Returns the cached (free) blocks to the device. */
tsr_status tsr_cuda_ctx_release_cache(tsr_cuda_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Mixed precision and peak measurement
 * ------------------------------------------------------------------------------------------- */

/* Row-major c = alpha · op(a) · op(b) + beta · c with bf16 a and b (bit patterns as tsr_tensor
 * stores them), f32 accumulation, and c in f32 (c_bf16 false) or bf16 (c_bf16 true). */
tsr_status tsr_cuda_gemm_bf16(tsr_cuda_ctx *ctx, void *c, bool c_bf16, const uint16_t *a,
                              const uint16_t *b, int M, int N, int K, bool trans_a, bool trans_b,
                              float alpha, float beta);

/* `batch` independent row-major GEMMs c_i = alpha · op(a_i) · op(b_i) + beta · c_i, the i-th
 * operands starting stride_* elements after the previous ones. a and b are both bf16 (f32
 * accumulation) or both f32 (TF32 as the context is set); c is f32 or bf16. */
tsr_status tsr_cuda_gemm_batched(tsr_cuda_ctx *ctx, void *c, bool c_bf16, const void *a,
                                 const void *b, bool ab_bf16, int M, int N, int K, bool trans_a,
                                 bool trans_b, float alpha, float beta, int64_t stride_a,
                                 int64_t stride_b, int64_t stride_c, int batch);

/* Attention through batched GEMMs, for positions 0, 1, 2, ... (causal = top-left aligned, as the
 * kernel table's attention with NULL positions): same layouts, outputs and accumulation rules as
 * tsr_kernel_attention_forward / _backward, f32 in and out. The scores of each (batch, kv head)
 * are materialised ((B·Hq·Lq·Lk) f32 plus as many probabilities) in blocks from the context's
 * allocator, so the tensor cores do the work. bf16: the GEMM operands (q, k, v, dout,
 * probabilities, score gradients) are rounded to bf16 with f32 accumulation; else f32 (TF32 as
 * the context is set). Lk must be positive. */
tsr_status tsr_cuda_attention_gemm_forward(tsr_cuda_ctx *ctx, float *out, float *lse,
                                           const float *q, const float *k, const float *v, int B,
                                           int Hq, int Hkv, int Lq, int Lk, int D, bool causal,
                                           bool bf16);
tsr_status tsr_cuda_attention_gemm_backward(tsr_cuda_ctx *ctx, float *dq, float *dk, float *dv,
                                            const float *dout, const float *q, const float *k,
                                            const float *v, const float *out, const float *lse,
                                            int B, int Hq, int Hkv, int Lq, int Lk, int D,
                                            bool causal, bool bf16);

/* Element-wise conversions on the compute stream, rounding to nearest even as tsr_f32_to_bf16. */
void tsr_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void tsr_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);

/* Best dense GEMM rate in TFLOP/s (2·n³ per GEMM) over about `seconds` of square n×n GEMMs:
 * bf16 inputs with f32 accumulation and bf16 output when bf16, else f32 (TF32 as the context is
 * set). Negative when the buffers cannot be allocated. */
double tsr_cuda_gemm_peak_tflops(tsr_cuda_ctx *ctx, bool bf16, int n, double seconds);

#ifdef __cplusplus
}
#endif
#endif
