/* Helpers shared by the CPU kernel files; not part of the public interface. */
#ifndef TESSERA_KERNELS_CPU_INTERNAL_H
#define TESSERA_KERNELS_CPU_INTERNAL_H

#include <stdint.h>

/* Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread of the calling
 * thread's budget (tsr_kernel_threads), never more chunks than `n / min_chunk`. The calling
 * thread runs the first chunk itself. Chunks must write disjoint memory. If a thread cannot be
 * started its chunk runs on the caller, so the result never depends on thread availability. */
typedef void (*tsr_range_fn)(void *ctx, int64_t begin, int64_t end);
void tsr_parallel_for(int64_t n, int64_t min_chunk, tsr_range_fn fn, void *ctx);

#endif
