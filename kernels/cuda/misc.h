/* Declarations of the table functions (tsr_cuda_k_<entry>, one per entry of the kernel table
 * list, tessera/device.h) and the helpers the .cu files share. Internal. */
#ifndef TESSERA_CUDA_MISC_H
#define TESSERA_CUDA_MISC_H

#include "cuda_internal.h"
#include "tessera/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks ids (or targets) on the device and waits for the answer: first_bad is the smallest bad
 * position or -1, count the in-range entries. A sync point, taken because the op must refuse
 * bad input before it writes, as the CPU kernel does. */
tsr_status tsr_cuda_check_ids(tsr_cuda_ctx *ctx, const int32_t *ids, int N, int V,
                              bool allow_ignore, int *first_bad, int *count);

/* Reads ids[pos] back for an error message. */
int32_t tsr_cuda_read_id(tsr_cuda_ctx *ctx, const int32_t *ids, int pos);

/* The table's functions, declared from the list so that a definition whose signature differs
 * from its entry fails to compile (a .cu definition is extern "C" and C++ refuses two C functions
 * of one name). clip_coef (kind host) has none: the table holds tsr_kernel_clip_coef. */
#define TSR_CUDA_DECLARE(name, kind, ret, params, args) TSR_CUDA_DECLARE_##kind(name, ret, params)
#define TSR_CUDA_DECLARE_dev(name, ret, params)         ret tsr_cuda_k_##name params;
#define TSR_CUDA_DECLARE_mixed                          TSR_CUDA_DECLARE_dev
#define TSR_CUDA_DECLARE_mem                            TSR_CUDA_DECLARE_dev
#define TSR_CUDA_DECLARE_host(name, ret, params)
TSR_KERNEL_LIST(TSR_CUDA_DECLARE)
TSR_KERNEL_LOOKUP_LIST(TSR_CUDA_DECLARE)

/* ---- Memory of the device (kernel table ABI 2; memory.c, memory.cu) ----
 * The semantics are the table's (tessera/device.h). All but owns and allocator_init work on the
 * calling thread's current context and queue on its compute stream; with no current context they
 * do nothing but keep an error for sync (tsr_cuda_try_ctx), so a caller bug cannot crash the
 * process. Void functions keep their first failure in the context for sync.
 *
 * owns: true when cudaPointerGetAttributes calls p device or managed memory (of any device);
 * false for host memory, pinned or not, for NULL and when the runtime cannot answer, with the
 * error the query may leave behind cleared. Needs no context.
 *
 * allocator_init: creates a context on device `ordinal` for the calling thread, makes it current,
 * and makes `a` a view of that context's caching allocator (context = the tsr_cuda_ctx, device
 * {TSR_DEVICE_CUDA, ordinal}, counters zero). Several threads may each hold a context on the same
 * device. On failure `a` is zeroed and the context error returned (TSR_ENOTSUP without a device,
 * TSR_EINVAL for an ordinal out of range).
 *
 * allocator_release: destroys the context behind `a` (after waiting for both its streams; cached
 * blocks are freed, blocks still in use are not), clears the thread's current context if it was
 * that one, and zeroes `a`. A zeroed or non-CUDA allocator: no-op. Call on the thread that made
 * it.
 *
 * copy_h2d: returns when `src` may be reused, which is when the copy has completed: waits for the
 * compute stream, because a pinned source is read by the DMA engine after cudaMemcpyAsync
 * returns. A sync point.
 * copy_d2h: returns when `dst` holds the data (waits for the compute stream).
 * copy_d2d: queued on the compute stream; no host wait. Regions must not overlap.
 * zero: queued on the compute stream.
 *
 * copy_strided: bit copies of elem_size (1, 2, 4, 8) bytes, strides in elements (any sign),
 * queued on the compute stream; dst and src must not overlap. ndim 0 copies one element; a
 * zero-size dim copies nothing. Dims that are contiguous on both sides are merged first, and a
 * copy that is contiguous after merging is a cudaMemcpyAsync. Bad arguments (ndim outside
 * 0..TSR_MAX_DIMS, a negative size, another elem_size, a pointer not aligned to elem_size) are
 * kept as TSR_EINVAL.
 *
 * add: f32 with one rounding (__fadd_rn), as the CPU's; out may be a.
 *
 * sync: waits for the current context's streams and returns the first failure kept since the
 * last sync; an error kept with no context current (tsr_cuda_try_ctx) comes first. With no
 * context current: TSR_EINVAL naming that. */

#ifdef __cplusplus
}
#endif
#endif
