/* All-reduce bus bandwidth of the mpi backend against the local one, 1 to 64 MiB.
 *
 *   mpirun -np 4 bench_comm_mpi                 the mpi backend, one rank per process
 *   bench_comm_mpi --backend local --ranks 4    the local backend, one rank per thread
 *   options: --min-mib M --max-mib M (powers of two between, default 1 and 64), --trials T
 *
 * f32 sum, out of place. Each trial times enough calls to last ~0.1 s between two barriers (the
 * slowest rank decides); the figure is the median trial. busbw is nccl-tests' definition,
 * bytes / time * 2 (n - 1) / n, so it reads as the bandwidth each rank's link sustains.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera_mpi.h"

#define MAX_TRIALS 15
#define MAX_SIZES  16

typedef struct bench {
  int sizes, trials;
  size_t bytes[MAX_SIZES];
  double secs[MAX_SIZES]; /* median seconds per call, on rank 0 */
} bench;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Calls per trial for ~0.1 s at 1 GB/s, at least 2. */
static int calls_for(size_t bytes) {
  size_t r = ((size_t)100 << 20) / bytes;
  return r < 2 ? 2 : (int)r;
}

static tsr_status bench_rank(tsr_comm_t *c, void *arg) {
  bench *b = arg;
  int n = tsr_comm_world(c), *ranks = malloc((size_t)n * sizeof *ranks);
  size_t top = b->bytes[b->sizes - 1];
  float *send = malloc(top), *recv = malloc(top);
  tsr_group_t *g = NULL;
  tsr_status st = TSR_OK;
  if (!ranks || !send || !recv) {
    st = TSR_ERROR(TSR_ENOMEM, "bench_comm_mpi: out of memory for %zu-byte buffers", top);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) ranks[i] = i;
  TSR_CHECK_GOTO(tsr_comm_group(c, n, ranks, "bench", &g), st);
  /* Fault every page in before anything is timed. */
  for (size_t i = 0; i < top / sizeof(float); i++) send[i] = recv[i] = (float)(i & 15);
  for (int s = 0; s < b->sizes; s++) {
    size_t count = b->bytes[s] / sizeof(float);
    int calls = calls_for(b->bytes[s]);
    double trial[MAX_TRIALS];
    TSR_CHECK_GOTO(tsr_comm_all_reduce(g, send, recv, count, TSR_F32, TSR_REDUCE_SUM), st);
    for (int t = 0; t < b->trials; t++) {
      TSR_CHECK_GOTO(tsr_comm_barrier(g), st);
      double t0 = now_s();
      for (int k = 0; k < calls; k++)
        TSR_CHECK_GOTO(tsr_comm_all_reduce(g, send, recv, count, TSR_F32, TSR_REDUCE_SUM), st);
      TSR_CHECK_GOTO(tsr_comm_barrier(g), st);
      trial[t] = (now_s() - t0) / calls;
    }
    qsort(trial, (size_t)b->trials, sizeof *trial, by_value);
    if (tsr_comm_rank(c) == 0) b->secs[s] = trial[b->trials / 2];
  }
cleanup:
  free(ranks);
  free(send);
  free(recv);
  return st;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_comm_mpi [--backend mpi|local] [--ranks N (local)] [--min-mib M] "
                  "[--max-mib M] [--trials T]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *backend = "mpi";
  int ranks = 4, lo = 1, hi = 64;
  bench b = {.trials = 5};
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (more && !strcmp(argv[i], "--backend"))
      backend = argv[++i];
    else if (more && !strcmp(argv[i], "--ranks"))
      ranks = atoi(argv[++i]);
    else if (more && !strcmp(argv[i], "--min-mib"))
      lo = atoi(argv[++i]);
    else if (more && !strcmp(argv[i], "--max-mib"))
      hi = atoi(argv[++i]);
    else if (more && !strcmp(argv[i], "--trials"))
      b.trials = atoi(argv[++i]);
    else
      return usage();
  }
  bool mpi = !strcmp(backend, "mpi");
  if ((!mpi && strcmp(backend, "local")) || lo < 1 || hi < lo || ranks < 2 || b.trials < 1 ||
      b.trials > MAX_TRIALS)
    return usage();
  for (size_t s = (size_t)lo << 20; s <= (size_t)hi << 20 && b.sizes < MAX_SIZES; s *= 2)
    b.bytes[b.sizes++] = s;
  tsr_status st;
  int rank = 0;
  if (mpi) {
    tsr_comm_t *c = NULL;
    st = tsr_mpi_comm_new(600.0, &c);
    if (st == TSR_OK) {
      rank = tsr_comm_rank(c);
      ranks = tsr_comm_world(c);
      st = bench_rank(c, &b);
      tsr_mpi_comm_free(c);
    }
  } else {
    st = tsr_local_launch(ranks, 600.0, bench_rank, &b);
  }
  if (st != TSR_OK) {
    fprintf(stderr, "bench_comm_mpi: %s: %s\n", tsr_status_name(st), tsr_last_error());
    if (mpi) tsr_mpi_abort(1);
    return 1;
  }
  if (rank == 0) {
    printf("all_reduce f32 sum, %s backend, %d ranks, median of %d trials\n", backend, ranks,
           b.trials);
    printf("%10s %12s %12s %12s\n", "MiB", "time_ms", "algbw_GB/s", "busbw_GB/s");
    for (int s = 0; s < b.sizes; s++) {
      double algbw = (double)b.bytes[s] / b.secs[s] / 1e9;
      printf("%10zu %12.3f %12.3f %12.3f\n", b.bytes[s] >> 20, b.secs[s] * 1e3, algbw,
             algbw * 2.0 * (ranks - 1) / ranks);
    }
  }
  if (mpi) tsr_mpi_finalize();
  return 0;
}
