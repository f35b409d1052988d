/* The memory section of the CUDA kernel table (core/kernel_table.h, ABI 2): pointer ownership,
 * the per-thread allocator and context, copies, zeroing and sync. The two kernels of that section
 * (strided copy, add) are in memory.cu. */
#include <string.h>

#include "misc.h"
#include "strided.h"

bool tsr_cuda_k_owns(const void *p) {
  if (!p) return false;
  struct cudaPointerAttributes at;
  cudaError_t e = cudaPointerGetAttributes(&at, p);
  if (e != cudaSuccess) {
    /* Runtimes before 11 answered a plain host pointer with cudaErrorInvalidValue, and every
     * runtime fails without a driver; either way the error stays as the thread's last error and
     * would be reported by the next kernel's launch check as its own. */
    (void)cudaGetLastError();
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

tsr_status tsr_cuda_k_allocator_init(tsr_allocator *a, int ordinal) {
  if (!a) return TSR_ERROR(TSR_EINVAL, "allocator_init: NULL allocator");
  memset(a, 0, sizeof *a);
  tsr_cuda_ctx *ctx = NULL;
  TSR_CHECK(tsr_cuda_ctx_create(ordinal, &ctx));
  tsr_cuda_ctx_make_current(ctx);
  /* A copy, not the context's own tsr_allocator: the core counts bytes in the struct the caller
   * holds, so the caller's counters start at zero and measure only what goes through `a`. Both
   * share the context (and so the cache) through `context`. */
  *a = *tsr_cuda_ctx_allocator(ctx);
  a->bytes_in_use = 0;
  a->peak_bytes = 0;
  return TSR_OK;
}

void tsr_cuda_k_allocator_release(tsr_allocator *a) {
  if (!a || a->device.kind != TSR_DEVICE_CUDA || !a->context) return;
  /* The caching allocator's context is its tsr_cuda_ctx (allocator.c); destroy also clears this
   * thread's current context when it is this one. */
  tsr_cuda_ctx_destroy(a->context);
  memset(a, 0, sizeof *a);
}

/* cudaMemcpyAsync on the current compute stream; with `wait`, also waits for it. */
static void copy_on_stream(const char *fn, void *dst, const void *src, size_t bytes,
                           enum cudaMemcpyKind kind, bool wait) {
  tsr_cuda_ctx *ctx = tsr_cuda_try_ctx(fn);
  if (!ctx || bytes == 0) return;
  tsr_status st = TSR_CU(cudaMemcpyAsync(dst, src, bytes, kind, ctx->compute));
  if (st == TSR_OK && wait) st = TSR_CU(cudaStreamSynchronize(ctx->compute));
  if (st != TSR_OK) tsr_cuda_keep(ctx, tsr_error_prefix(st, "%s of %zu bytes", fn, bytes));
}

void tsr_cuda_k_copy_h2d(void *dst, const void *src, size_t bytes) {
  /* A pinned source is read by DMA after cudaMemcpyAsync has returned, and for a pageable one
   * the runtime documents only that the call "might be synchronous"; telling the two apart costs
   * a pointer query per copy, and either way the caller may reuse `src` only once the copy has
   * run, so this waits. */
  copy_on_stream("copy_h2d", dst, src, bytes, cudaMemcpyHostToDevice, true);
}

void tsr_cuda_k_copy_d2h(void *dst, const void *src, size_t bytes) {
  copy_on_stream("copy_d2h", dst, src, bytes, cudaMemcpyDeviceToHost, true);
}

void tsr_cuda_k_copy_d2d(void *dst, const void *src, size_t bytes) {
  copy_on_stream("copy_d2d", dst, src, bytes, cudaMemcpyDeviceToDevice, false);
}

void tsr_cuda_k_zero(void *dst, size_t bytes) {
  tsr_cuda_ctx *ctx = tsr_cuda_try_ctx("zero");
  if (!ctx || bytes == 0) return;
  tsr_status st = TSR_CU(cudaMemsetAsync(dst, 0, bytes, ctx->compute));
  if (st != TSR_OK) tsr_cuda_keep(ctx, tsr_error_prefix(st, "zero of %zu bytes", bytes));
}

tsr_status tsr_cuda_k_sync(void) {
  tsr_cuda_ctx *ctx = tsr_cuda_ctx_current();
  /* Waiting comes first so that the context's work is finished and its kept error cleared
   * whichever error is returned. */
  tsr_status st =
      ctx ? tsr_cuda_ctx_sync(ctx)
          : TSR_ERROR(TSR_EINVAL, "sync: no CUDA context is current on this thread "
                                  "(allocator_init or tsr_cuda_ctx_make_current first)");
  tsr_status orphan = tsr_cuda_take_orphan();
  return orphan != TSR_OK ? orphan : st;
}

tsr_status tsr_cuda_strided_plan(tsr_cuda_strided *out, int64_t *n, const int64_t *dst_stride,
                                 const int64_t *src_stride, const int64_t *shape, int ndim) {
  if (ndim < 0 || ndim > TSR_MAX_DIMS)
    return TSR_ERROR(TSR_EINVAL, "copy_strided: ndim %d is outside 0..%d", ndim, TSR_MAX_DIMS);
  if (ndim > 0 && (!shape || !dst_stride || !src_stride))
    return TSR_ERROR(TSR_EINVAL, "copy_strided: NULL shape or stride with ndim %d", ndim);
  /* Merged outermost to innermost, then stored reversed. */
  int64_t sh[TSR_MAX_DIMS], ds[TSR_MAX_DIMS], ss[TSR_MAX_DIMS];
  int m = 0;
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return TSR_ERROR(TSR_EINVAL, "copy_strided: dim %d has size %lld", d, (long long)shape[d]);
    count *= shape[d];
    if (shape[d] == 1) continue;
    /* The merged dim keeps the inner stride: element k of the pair is k·inner on each side. */
    if (m > 0 && ds[m - 1] == dst_stride[d] * shape[d] && ss[m - 1] == src_stride[d] * shape[d]) {
      sh[m - 1] *= shape[d];
      ds[m - 1] = dst_stride[d];
      ss[m - 1] = src_stride[d];
    } else {
      sh[m] = shape[d];
      ds[m] = dst_stride[d];
      ss[m] = src_stride[d];
      m++;
    }
  }
  memset(out, 0, sizeof *out);
  out->ndim = m;
  for (int d = 0; d < TSR_MAX_DIMS; d++) {
    out->shape[d] = d < m ? sh[m - 1 - d] : 1;
    if (d < m) {
      out->dst_stride[d] = ds[m - 1 - d];
      out->src_stride[d] = ss[m - 1 - d];
    }
  }
  *n = count;
  return TSR_OK;
}
