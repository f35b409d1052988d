/* The caching device allocator (tessera_cuda.h): size classes, one free list, stream-ordered
 * reuse on the compute stream. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_ROUND ((size_t)512)
#define LARGE_ROUND ((size_t)2 << 20)

/* Exact size classes: a freed block goes back under the size its request rounds to, which is
 * the size it was allocated with, so no pointer-to-size map is needed. */
static size_t round_size(size_t bytes) {
  size_t r = bytes < SMALL_LIMIT ? SMALL_ROUND : LARGE_ROUND;
  if (bytes == 0) bytes = 1;
  return (bytes + r - 1) / r * r;
}

static void release_locked(tsr_cuda_ctx *ctx) {
  tsr_cuda_cache *c = &ctx->cache;
  for (size_t i = 0; i < c->n_free; i++) {
    (void)cudaFree(c->free_blocks[i].ptr);
    c->stats.reserved_bytes -= c->free_blocks[i].bytes;
  }
  c->n_free = 0;
  c->stats.cached_bytes = 0;
}

static void *cache_alloc(void *context, size_t bytes) {
  tsr_cuda_ctx *ctx = context;
  tsr_cuda_cache *c = &ctx->cache;
  size_t want = round_size(bytes);
  void *p = NULL;
  pthread_mutex_lock(&c->lock);
  for (size_t i = c->n_free; i-- > 0;) {
    if (c->free_blocks[i].bytes == want) {
      p = c->free_blocks[i].ptr;
      c->free_blocks[i] = c->free_blocks[--c->n_free];
      c->stats.cached_bytes -= want;
      c->stats.cache_hits++;
      break;
    }
  }
  if (!p) {
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      /* Blocks in the cache may still be read by queued kernels; wait before freeing them. */
      (void)cudaStreamSynchronize(ctx->compute);
      release_locked(ctx);
      e = cudaMalloc(&p, want);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      p = NULL;
    } else {
      c->stats.device_mallocs++;
      c->stats.reserved_bytes += want;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return p;
}

static void cache_free(void *context, void *ptr, size_t bytes) {
  tsr_cuda_ctx *ctx = context;
  tsr_cuda_cache *c = &ctx->cache;
  if (!ptr) return;
  size_t sz = round_size(bytes);
  pthread_mutex_lock(&c->lock);
  if (c->n_free == c->cap_free) {
    size_t cap = c->cap_free ? 2 * c->cap_free : 64;
    tsr_cuda_block *nb = realloc(c->free_blocks, cap * sizeof *nb);
    if (!nb) {
      /* Cannot remember it: give it back to the device instead, after queued work. */
      (void)cudaStreamSynchronize(ctx->compute);
      (void)cudaFree(ptr);
      c->stats.reserved_bytes -= sz;
      pthread_mutex_unlock(&c->lock);
      return;
    }
    c->free_blocks = nb;
    c->cap_free = cap;
  }
  c->free_blocks[c->n_free++] = (tsr_cuda_block){ptr, sz};
  c->stats.cached_bytes += sz;
  pthread_mutex_unlock(&c->lock);
}

void tsr_cuda_cache_init(tsr_cuda_ctx *ctx) {
  memset(&ctx->cache, 0, sizeof ctx->cache);
  pthread_mutex_init(&ctx->cache.lock, NULL);
  memset(&ctx->alloc, 0, sizeof ctx->alloc);
  ctx->alloc.alloc = cache_alloc;
  ctx->alloc.free = cache_free;
  ctx->alloc.context = ctx;
  ctx->alloc.device = (tsr_device){TSR_DEVICE_CUDA, ctx->device};
}

void tsr_cuda_cache_fini(tsr_cuda_ctx *ctx) {
  pthread_mutex_lock(&ctx->cache.lock);
  release_locked(ctx);
  free(ctx->cache.free_blocks);
  ctx->cache.free_blocks = NULL;
  ctx->cache.cap_free = 0;
  pthread_mutex_unlock(&ctx->cache.lock);
  pthread_mutex_destroy(&ctx->cache.lock);
  ctx->alloc.context = NULL;
}

tsr_allocator *tsr_cuda_ctx_allocator(tsr_cuda_ctx *ctx) {
  return &ctx->alloc;
}

tsr_cuda_alloc_stats tsr_cuda_ctx_alloc_stats(tsr_cuda_ctx *ctx) {
  pthread_mutex_lock(&ctx->cache.lock);
  tsr_cuda_alloc_stats s = ctx->cache.stats;
  pthread_mutex_unlock(&ctx->cache.lock);
  return s;
}

tsr_status tsr_cuda_ctx_release_cache(tsr_cuda_ctx *ctx) {
  TSR_CHECK(TSR_CU(cudaStreamSynchronize(ctx->compute)));
  pthread_mutex_lock(&ctx->cache.lock);
  release_locked(ctx);
  pthread_mutex_unlock(&ctx->cache.lock);
  return TSR_OK;
}
