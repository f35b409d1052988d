/* The host buffer pool behind every CPU allocator (tessera/tensor.h: tsr_host_pool_read).
 *
 * A training step frees and makes the same tensor sizes every step. Handed back to malloc, the
 * large ones return to the system and come back as fresh pages, each costing a page fault and
 * the kernel's zeroing on top of the tensor's own (a quarter of a 1-rank step's time on the
 * bench preset, measured with perf). The pool keeps freed buffers by exact size and hands them
 * out again, so a steady-state step asks the system for nothing.
 *
 * Bound: the bytes kept plus the bytes handed out stay within twice the most ever handed out at
 * once: a buffer is kept only within that bound, a new buffer made past it first evicts kept
 * ones, and a system allocation that fails gives every kept buffer back and tries again. Exact
 * sizes need some slack over the high-water mark (a size's buffers wait while other sizes are
 * made); on the bench preset the pool settles at 1.06 times it and a steady step then asks the
 * system for nothing (bench_train prints both). The allocators' counters (bytes_in_use,
 * peak_bytes) sit above the pool and do not see it.
 *
 * One pool per process, under one lock: ranks of the `local` backend are threads and allocate
 * coarse buffers a few hundred times a step, which a lock serves without contention. Kept
 * buffers are threaded into a free list per size through their first bytes. Under AddressSanitizer
 * the pool is off, so a use after free stays a use of freed memory. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host_pool.h"
#include "tessera/tensor.h"

#if defined(__SANITIZE_ADDRESS__)
#define POOL_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ON 0
#endif
#endif
#ifndef POOL_ON
#define POOL_ON 1
#endif

/* Distinct sizes kept at once; a size past this is freed, not kept. A power of two, for the
 * probe mask. */
#define POOL_SIZES 4096

typedef struct pool_bucket {
  size_t bytes; /* 0: never used; a used bucket keeps its size while empty (no tombstones) */
  void *head;   /* kept buffers of this size, linked through their first word */
  int64_t count;
} pool_bucket;

static struct {
  pthread_mutex_t lock;
  pool_bucket buckets[POOL_SIZES];
  int nbuckets;    /* buckets with a size */
  size_t kept;     /* bytes in the free lists */
  size_t live;     /* bytes handed out and not yet given back */
  size_t peak;     /* the most `live` has been */
  size_t bound;    /* what kept + live may reach: twice the peak */
  int64_t hits;    /* buffers handed out from the lists */
  int64_t misses;  /* buffers asked of the system */
  int64_t evicted; /* kept buffers given back to the system to stay within the bound */
  unsigned rover;  /* where the next eviction starts looking */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static pool_bucket *bucket_of(size_t bytes, bool make) {
  uint64_t h = (uint64_t)bytes * 0x9E3779B97F4A7C15ull;
  for (unsigned i = 0; i < POOL_SIZES; i++) {
    pool_bucket *b = &pool.buckets[((h >> 52) + i) & (POOL_SIZES - 1)];
    if (b->bytes == bytes) return b;
    if (b->bytes == 0) {
      /* the table is half full at most, so probes stay short */
      if (!make || pool.nbuckets >= POOL_SIZES / 2) return NULL;
      b->bytes = bytes;
      pool.nbuckets++;
      return b;
    }
  }
  return NULL;
}

/* Frees kept buffers until kept + live is within the bound; under the lock. */
static void evict_to_bound(void) {
  for (unsigned n = 0; n < POOL_SIZES && pool.kept > 0 && pool.kept + pool.live > pool.bound;) {
    pool_bucket *b = &pool.buckets[pool.rover];
    if (b->head) {
      void *p = b->head;
      memcpy(&b->head, p, sizeof(void *));
      b->count--;
      pool.kept -= b->bytes;
      pool.evicted++;
      free(p);
      continue;
    }
    pool.rover = (pool.rover + 1) & (POOL_SIZES - 1);
    n++;
  }
}

void *tsr_host_pool_alloc(size_t bytes) {
  /* at least one pointer's worth, to link it while kept, and one byte for empty tensors */
  if (bytes < sizeof(void *)) bytes = sizeof(void *);
  void *p = NULL;
  pthread_mutex_lock(&pool.lock);
  pool_bucket *b = POOL_ON ? bucket_of(bytes, false) : NULL;
  if (b && b->head) {
    p = b->head;
    memcpy(&b->head, p, sizeof(void *));
    b->count--;
    pool.kept -= bytes;
    pool.hits++;
  }
  pool.live += bytes;
  if (pool.live > pool.peak) pool.peak = pool.live, pool.bound = 2 * pool.live;
  if (!p) {
    pool.misses++;
    evict_to_bound();
  }
  pthread_mutex_unlock(&pool.lock);
  /* 64-byte alignment for vector loads; short of memory, the kept buffers go back first */
  if (!p && posix_memalign(&p, 64, bytes) != 0) {
    pthread_mutex_lock(&pool.lock);
    size_t bound = pool.bound;
    pool.bound = 0;
    evict_to_bound();
    pool.bound = bound;
    pthread_mutex_unlock(&pool.lock);
    if (posix_memalign(&p, 64, bytes) != 0) p = NULL;
  }
  if (!p) {
    pthread_mutex_lock(&pool.lock);
    pool.live -= bytes;
    pool.misses--;
    pthread_mutex_unlock(&pool.lock);
    return NULL;
  }
  return p;
}

void tsr_host_pool_free(void *ptr, size_t bytes) {
  if (!ptr) return;
  if (bytes < sizeof(void *)) bytes = sizeof(void *);
  bool kept = false;
  pthread_mutex_lock(&pool.lock);
  pool.live -= bytes;
  if (POOL_ON && pool.kept + pool.live + bytes <= pool.bound) {
    pool_bucket *b = bucket_of(bytes, true);
    if (b) {
      memcpy(ptr, &b->head, sizeof(void *));
      b->head = ptr;
      b->count++;
      pool.kept += bytes;
      kept = true;
    }
  }
  pthread_mutex_unlock(&pool.lock);
  if (!kept) free(ptr);
}

void tsr_host_pool_read(tsr_host_pool_stats *out) {
  pthread_mutex_lock(&pool.lock);
  *out = (tsr_host_pool_stats){
      .system_allocations = pool.misses,
      .reuses = pool.hits,
      .evictions = pool.evicted,
      .kept_bytes = pool.kept,
      .live_bytes = pool.live,
      .bound_bytes = pool.bound,
  };
  pthread_mutex_unlock(&pool.lock);
}
