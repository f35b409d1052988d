/* Helpers shared by the CPU kernel files; not part of the public interface. */
#ifndef TESSERA_KERNELS_CPU_INTERNAL_H
#define TESSERA_KERNELS_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/kernels.h"

/* Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread of the calling
 * thread's budget (tsr_kernel_threads), never more chunks than `n / min_chunk`. The calling
 * thread runs the first chunk itself. Chunks must write disjoint memory. If a thread cannot be
 * started its chunk runs on the caller, so the result never depends on thread availability. */
typedef void (*tsr_range_fn)(void *ctx, int64_t begin, int64_t end);
void tsr_parallel_for(int64_t n, int64_t min_chunk, tsr_range_fn fn, void *ctx);

/* Kernel timing (tsr_kernel_profile_enable): tsr_profile_begin at the top of a public kernel,
 * tsr_profile_end with its kind and the value begin returned on every way out. */
int64_t tsr_profile_begin(void);
void tsr_profile_end(tsr_kernel_kind kind, int64_t t0);

/* CBLAS row-major sgemm without timing, for kernels that run GEMMs inside their own (timed) work,
 * possibly on helper threads. Same arguments as tsr_kernel_gemm. */
void tsr_gemm_raw(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                  bool trans_b, float alpha, float beta);

#endif
