/* The per-rank CUDA context: device, the two streams and their events, cuBLAS, scratch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* cuBLAS's recommended workspace for Hopper is 32 MiB; giving it one up front keeps it from
 * allocating inside a GEMM. */
#define TSR_CUBLAS_WORKSPACE (32u << 20)

static _Thread_local tsr_cuda_ctx *current;

/* A failure of a memory function called with no current context has no context to be kept in;
 * it waits here, per thread, for the table's sync (tsr_cuda_take_orphan). */
static _Thread_local tsr_status orphan;
static _Thread_local char orphan_msg[512];

tsr_status tsr_cuda_status(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return TSR_OK;
  return tsr_error_at(e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EINTERNAL, file, line,
                      "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

tsr_status tsr_cublas_status(cublasStatus_t s, const char *what, const char *file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return TSR_OK;
  return tsr_error_at(s == CUBLAS_STATUS_ALLOC_FAILED ? TSR_ENOMEM : TSR_EINTERNAL, file, line,
                      "%s failed: %s", what, cublasGetStatusString(s));
}

void tsr_cuda_keep(tsr_cuda_ctx *ctx, tsr_status s) {
  if (s == TSR_OK || ctx->kept != TSR_OK) return;
  ctx->kept = s;
  snprintf(ctx->kept_msg, sizeof ctx->kept_msg, "%s", tsr_last_error());
}

tsr_cuda_ctx *tsr_cuda_need_ctx(const char *kernel) {
  if (!current) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s called with no current CUDA context (tsr_cuda_ctx_make_current)",
             kernel);
    tsr_invariant_failed(msg, __FILE__, __LINE__);
  }
  return current;
}

tsr_cuda_ctx *tsr_cuda_try_ctx(const char *fn) {
  if (current) return current;
  tsr_status s = TSR_ERROR(TSR_EINVAL,
                           "%s: no CUDA context is current on this thread (allocator_init or "
                           "tsr_cuda_ctx_make_current first)",
                           fn);
  if (orphan == TSR_OK) {
    orphan = s;
    snprintf(orphan_msg, sizeof orphan_msg, "%s", tsr_last_error());
  }
  return NULL;
}

tsr_status tsr_cuda_take_orphan(void) {
  if (orphan == TSR_OK) return TSR_OK;
  tsr_status s = orphan;
  orphan = TSR_OK;
  return tsr_error(s, "%s", orphan_msg);
}

int tsr_cuda_device_count(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why && why_len)
      snprintf(why, why_len, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError(); /* not sticky: clear it */
    return 0;
  }
  if (n == 0 && why && why_len) snprintf(why, why_len, "the CUDA runtime reports 0 devices");
  return n;
}

tsr_status tsr_cuda_ctx_create(int device, tsr_cuda_ctx **out) {
  *out = NULL;
  char why[256] = "";
  int n = tsr_cuda_device_count(why, sizeof why);
  if (n == 0) return TSR_ERROR(TSR_ENOTSUP, "no CUDA device: %s", why);
  if (device < 0 || device >= n)
    return TSR_ERROR(TSR_EINVAL, "CUDA device %d does not exist (this machine has %d)", device, n);
  tsr_cuda_ctx *c = calloc(1, sizeof *c);
  if (!c) return TSR_ERROR(TSR_ENOMEM, "CUDA context: out of host memory");
  c->device = device;
  c->tf32 = true;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(TSR_CU(cudaSetDevice(device)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaEventCreateWithFlags(&c->compute_mark, cudaEventDisableTiming)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaEventCreateWithFlags(&c->comm_mark, cudaEventDisableTiming)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaMalloc((void **)&c->scratch_dev, TSR_CUDA_SCRATCH_BYTES)), st);
  TSR_CHECK_GOTO(TSR_CU(cudaMallocHost((void **)&c->scratch_host, TSR_CUDA_SCRATCH_BYTES)), st);
  c->blas_workspace_bytes = TSR_CUBLAS_WORKSPACE;
  TSR_CHECK_GOTO(TSR_CU(cudaMalloc(&c->blas_workspace, c->blas_workspace_bytes)), st);
  TSR_CHECK_GOTO(TSR_CUBLAS(cublasCreate(&c->blas)), st);
  TSR_CHECK_GOTO(TSR_CUBLAS(cublasSetStream(c->blas, c->compute)), st);
  TSR_CHECK_GOTO(
      TSR_CUBLAS(cublasSetWorkspace(c->blas, c->blas_workspace, c->blas_workspace_bytes)), st);
  tsr_cuda_cache_init(c);
  *out = c;
  return TSR_OK;
cleanup:
  tsr_cuda_ctx_destroy(c);
  return st;
}

void tsr_cuda_ctx_destroy(tsr_cuda_ctx *ctx) {
  if (!ctx) return;
  if (current == ctx) current = NULL;
  (void)cudaSetDevice(ctx->device);
  if (ctx->compute) (void)cudaStreamSynchronize(ctx->compute);
  if (ctx->comm) (void)cudaStreamSynchronize(ctx->comm);
  if (ctx->alloc.context) tsr_cuda_cache_fini(ctx);
  if (ctx->blas) (void)cublasDestroy(ctx->blas);
  if (ctx->blas_workspace) (void)cudaFree(ctx->blas_workspace);
  if (ctx->scratch_dev) (void)cudaFree(ctx->scratch_dev);
  if (ctx->scratch_host) (void)cudaFreeHost(ctx->scratch_host);
  if (ctx->compute_mark) (void)cudaEventDestroy(ctx->compute_mark);
  if (ctx->comm_mark) (void)cudaEventDestroy(ctx->comm_mark);
  if (ctx->compute) (void)cudaStreamDestroy(ctx->compute);
  if (ctx->comm) (void)cudaStreamDestroy(ctx->comm);
  free(ctx);
}

void tsr_cuda_ctx_make_current(tsr_cuda_ctx *ctx) {
  current = ctx;
  /* The runtime's current device is per thread as well; keep the two together. */
  if (ctx) (void)cudaSetDevice(ctx->device);
}

tsr_cuda_ctx *tsr_cuda_ctx_current(void) {
  return current;
}

int tsr_cuda_ctx_device(const tsr_cuda_ctx *ctx) {
  return ctx->device;
}

void tsr_cuda_ctx_set_tf32(tsr_cuda_ctx *ctx, bool on) {
  ctx->tf32 = on;
}

void *tsr_cuda_ctx_compute_stream(tsr_cuda_ctx *ctx) {
  return (void *)ctx->compute;
}

void *tsr_cuda_ctx_comm_stream(tsr_cuda_ctx *ctx) {
  return (void *)ctx->comm;
}

tsr_status tsr_cuda_ctx_comm_waits_compute(tsr_cuda_ctx *ctx) {
  TSR_CHECK(TSR_CU(cudaEventRecord(ctx->compute_mark, ctx->compute)));
  return TSR_CU(cudaStreamWaitEvent(ctx->comm, ctx->compute_mark, 0));
}

tsr_status tsr_cuda_ctx_compute_waits_comm(tsr_cuda_ctx *ctx) {
  TSR_CHECK(TSR_CU(cudaEventRecord(ctx->comm_mark, ctx->comm)));
  return TSR_CU(cudaStreamWaitEvent(ctx->compute, ctx->comm_mark, 0));
}

tsr_status tsr_cuda_ctx_sync(tsr_cuda_ctx *ctx) {
  TSR_CHECK(TSR_CU(cudaStreamSynchronize(ctx->compute)));
  TSR_CHECK(TSR_CU(cudaStreamSynchronize(ctx->comm)));
  TSR_CHECK(TSR_CU(cudaGetLastError()));
  if (ctx->kept != TSR_OK) {
    tsr_status s = ctx->kept;
    ctx->kept = TSR_OK;
    return tsr_error(s, "%s", ctx->kept_msg);
  }
  return TSR_OK;
}

tsr_status tsr_cuda_copy_to_device(tsr_cuda_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return TSR_OK;
  TSR_CHECK(TSR_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->compute)));
  return TSR_CU(cudaStreamSynchronize(ctx->compute));
}

tsr_status tsr_cuda_copy_to_host(tsr_cuda_ctx *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return TSR_OK;
  TSR_CHECK(TSR_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->compute)));
  return TSR_CU(cudaStreamSynchronize(ctx->compute));
}

tsr_status tsr_cuda_scratch_reset(tsr_cuda_ctx *ctx) {
  tsr_cuda_scratch init = {.first_bad = INT32_MAX, .count = 0, .acc = 0.0};
  *ctx->scratch_host = init;
  /* Pinned source, stream-ordered: the copy completes before any later kernel reads it. The host
   * mirror is not written again until scratch_read has waited for the stream. */
  return TSR_CU(cudaMemcpyAsync(ctx->scratch_dev, ctx->scratch_host, sizeof init,
                                cudaMemcpyHostToDevice, ctx->compute));
}

tsr_status tsr_cuda_scratch_read(tsr_cuda_ctx *ctx, tsr_cuda_scratch *out) {
  TSR_CHECK(TSR_CU(cudaMemcpyAsync(ctx->scratch_host, ctx->scratch_dev, sizeof *out,
                                   cudaMemcpyDeviceToHost, ctx->compute)));
  TSR_CHECK(TSR_CU(cudaStreamSynchronize(ctx->compute)));
  *out = *ctx->scratch_host;
  return TSR_OK;
}
