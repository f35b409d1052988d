/* Per-rank thread budget and the small fork-join helper the hand-written kernels use. */
#define _GNU_SOURCE /* sched_getaffinity: containers and `taskset` restrict the usable cores */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "internal.h"
#include "tessera/kernels.h"

/* Thread-local because a rank of the `local` backend is a thread: each rank has its own budget. */
static _Thread_local int hand_threads = 1;

/* OpenBLAS's count is process state; this lock only keeps two ranks from resizing its pool at
 * once when they start together. */
static pthread_mutex_t blas_threads_lock = PTHREAD_MUTEX_INITIALIZER;

int tsr_kernel_num_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int tsr_kernel_thread_budget(int cores, int ranks_per_host) {
  if (ranks_per_host < 1) ranks_per_host = 1;
  int t = cores / ranks_per_host;
  return t > 1 ? t : 1;
}

void tsr_kernel_set_threads(int n) {
  if (n < 1) n = 1;
  hand_threads = n;
  pthread_mutex_lock(&blas_threads_lock);
  if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
  pthread_mutex_unlock(&blas_threads_lock);
}

int tsr_kernel_threads(void) {
  return hand_threads;
}

void tsr_kernel_blas_reexec(char **argv) {
  if (getenv("OPENBLAS_THREAD_TIMEOUT")) return;
  /* under valgrind an exec would leave the tool behind and run the program natively */
  const char *preload = getenv("LD_PRELOAD");
  if (preload && strstr(preload, "vgpreload")) return;
  char v[16];
  snprintf(v, sizeof v, "%d", TSR_BLAS_THREAD_TIMEOUT);
  if (setenv("OPENBLAS_THREAD_TIMEOUT", v, 1) != 0) return;
  execv("/proc/self/exe", argv);
  /* no exec (no /proc): go on with OpenBLAS's own spin */
}

typedef struct chunk {
  tsr_range_fn fn;
  void *ctx;
  int64_t begin, end;
} chunk;

static void *run_chunk(void *arg) {
  chunk *c = arg;
  c->fn(c->ctx, c->begin, c->end);
  return NULL;
}

#define TSR_MAX_HAND_THREADS 64

void tsr_parallel_for(int64_t n, int64_t min_chunk, tsr_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (min_chunk < 1) min_chunk = 1;
  int64_t parts = hand_threads;
  if (parts > TSR_MAX_HAND_THREADS) parts = TSR_MAX_HAND_THREADS;
  if (parts > n / min_chunk) parts = n / min_chunk;
  if (parts <= 1) {
    fn(ctx, 0, n);
    return;
  }
  chunk chunks[TSR_MAX_HAND_THREADS];
  pthread_t tids[TSR_MAX_HAND_THREADS];
  int started[TSR_MAX_HAND_THREADS];
  for (int64_t p = 0; p < parts; p++) {
    chunks[p] = (chunk){fn, ctx, n * p / parts, n * (p + 1) / parts};
  }
  for (int64_t p = 1; p < parts; p++) {
    started[p] = pthread_create(&tids[p], NULL, run_chunk, &chunks[p]) == 0;
  }
  run_chunk(&chunks[0]);
  for (int64_t p = 1; p < parts; p++) {
    if (started[p]) {
      pthread_join(tids[p], NULL);
    } else {
      run_chunk(&chunks[p]);
    }
  }
}
