/* All-reduce, all-gather and reduce-scatter bandwidth of the local communicator, against memcpy.
 *
 *   bench_comm [--quick] [--algo auto|small|large] [--ranks 2,4,8] [--from BYTES]
 *
 * algbw = bytes / time and busbw as nccl-tests defines them (all-reduce: algbw * 2(n-1)/n,
 * all-gather and reduce-scatter: algbw * (n-1)/n, bytes being the size of the whole buffer: the
 * output of one rank's all-gather, the input of its reduce-scatter). memcpy is one thread
 * copying a buffer larger than the caches, counted as bytes copied per second; the last column
 * is busbw / memcpy. --algo forces one all-reduce algorithm, to choose the threshold between
 * them (docs/comm.md). Times are the best of several trials, each the mean of many calls: the
 * statistic of the memcpy reference, which a shared, loaded machine cannot make look slow (a
 * median would set a collective's time under the load against a copy's time without it).
 * --ranks picks the group sizes, --from the smallest size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera/comm.h"

#define BENCH_TRIALS    7
#define BENCH_MAX_SIZES 16

typedef struct bench {
  int sizes;
  size_t bytes[BENCH_MAX_SIZES];
  double ar_s[BENCH_MAX_SIZES]; /* best seconds per call, written by rank 0 */
  double ag_s[BENCH_MAX_SIZES];
  double rs_s[BENCH_MAX_SIZES];
} bench;

enum { BENCH_ALL_REDUCE, BENCH_ALL_GATHER, BENCH_REDUCE_SCATTER };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double best(const double *v, int n) {
  double b = v[0];
  for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
  return b;
}

/* Enough calls per trial to last ~20 ms at a few GB/s, never fewer than 3. */
static int reps_for(size_t bytes) {
  size_t r = ((size_t)64 << 20) / (bytes ? bytes : 1);
  return r < 3 ? 3 : r > 2000 ? 2000 : (int)r;
}

static double memcpy_bandwidth(size_t bytes) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) {
    free(a);
    free(b);
    return 0;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double best = 1e30;
  for (int t = 0; t < BENCH_TRIALS; t++) {
    double t0 = now_s();
    memcpy(t % 2 ? a : b, t % 2 ? b : a, bytes);
    double dt = now_s() - t0;
    best = dt < best ? dt : best;
  }
  free(a);
  free(b);
  return (double)bytes / best;
}

/* Times `reps` calls of one collective per trial; rank 0 keeps the best trial's time per call. */
static tsr_status time_coll(tsr_group_t *g, int coll, float *send, float *recv, size_t count,
                            double *out) {
  int n = tsr_group_size(g), reps = reps_for(count * sizeof(float));
  double trial[BENCH_TRIALS];
  size_t part = count / (size_t)n;
  for (int t = -1; t < BENCH_TRIALS; t++) {
    TSR_CHECK(tsr_comm_barrier(g));
    double t0 = now_s();
    for (int i = 0; i < (t < 0 ? 2 : reps); i++) {
      if (coll == BENCH_ALL_GATHER)
        TSR_CHECK(tsr_comm_all_gather(g, send, part, recv, NULL, TSR_F32));
      else if (coll == BENCH_REDUCE_SCATTER)
        TSR_CHECK(tsr_comm_reduce_scatter(g, send, recv, part, NULL, TSR_F32, TSR_REDUCE_SUM));
      else
        TSR_CHECK(tsr_comm_all_reduce(g, send, recv, count, TSR_F32, TSR_REDUCE_SUM));
    }
    /* The slowest member decides when a collective is done. */
    TSR_CHECK(tsr_comm_barrier(g));
    if (t >= 0) trial[t] = (now_s() - t0) / reps;
  }
  if (tsr_group_index(g) == 0) *out = best(trial, BENCH_TRIALS);
  return TSR_OK;
}

static tsr_status rank_bench(tsr_comm_t *c, void *arg) {
  bench *b = arg;
  int n = tsr_comm_world(c), ranks[64];
  for (int i = 0; i < n; i++) ranks[i] = i;
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_comm_group(c, n, ranks, "bench", &g));
  size_t maxb = b->bytes[b->sizes - 1];
  float *send = malloc(maxb), *recv = malloc(maxb);
  tsr_status st = TSR_OK;
  if (!send || !recv) {
    st = TSR_ERROR(TSR_ENOMEM, "bench: %zu bytes of buffers", 2 * maxb);
    goto cleanup;
  }
  /* Touch every page before timing. */
  for (size_t i = 0; i < maxb / sizeof(float); i++) send[i] = recv[i] = (float)(i % 7);
  for (int s = 0; s < b->sizes; s++) {
    size_t count = b->bytes[s] / sizeof(float);
    TSR_CHECK_GOTO(time_coll(g, BENCH_ALL_REDUCE, send, recv, count, &b->ar_s[s]), st);
    TSR_CHECK_GOTO(time_coll(g, BENCH_ALL_GATHER, send, recv, count, &b->ag_s[s]), st);
    TSR_CHECK_GOTO(time_coll(g, BENCH_REDUCE_SCATTER, send, recv, count, &b->rs_s[s]), st);
  }
cleanup:
  free(send);
  free(recv);
  return st;
}

static void print_row(const char *coll, int n, size_t bytes, double s, double factor,
                      double copy_bw) {
  double algbw = (double)bytes / s, busbw = algbw * factor;
  printf("%-10s %5d %10zu %12.1f %12.2f %12.2f %8.2f\n", coll, n, bytes, s * 1e6, algbw / 1e9,
         busbw / 1e9, busbw / copy_bw);
}

int main(int argc, char **argv) {
  int quick = 0, worlds[8] = {2, 4, 8}, n_worlds = 3;
  size_t from = 4096;
  const char *algo = "auto";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[i], "--algo") == 0 && i + 1 < argc) {
      algo = argv[++i];
    } else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
      char *p = argv[++i];
      for (n_worlds = 0; n_worlds < 8 && *p;) {
        long v = strtol(p, &p, 10);
        if (v < 2 || v > 64) {
          fprintf(stderr, "bench_comm: --ranks wants a list of 2 to 64, e.g. 2,4,8\n");
          return 2;
        }
        worlds[n_worlds++] = (int)v;
        if (*p == ',') p++;
      }
    } else if (strcmp(argv[i], "--from") == 0 && i + 1 < argc) {
      from = (size_t)strtoull(argv[++i], NULL, 10);
      from = from < 4096 ? 4096 : from;
    } else {
      fprintf(stderr,
              "usage: %s [--quick] [--algo auto|small|large] [--ranks 2,4,8] [--from BYTES]\n",
              argv[0]);
      return 2;
    }
  }
  /* The backend reads its threshold from the environment at each launch. */
  if (strcmp(algo, "small") == 0)
    setenv("TESSERA_LOCAL_SMALL_BYTES", "18446744073709551615", 1);
  else if (strcmp(algo, "large") == 0)
    setenv("TESSERA_LOCAL_SMALL_BYTES", "0", 1);
  else if (strcmp(algo, "auto") != 0) {
    fprintf(stderr, "bench_comm: unknown --algo '%s' (auto, small or large)\n", algo);
    return 2;
  }

  bench b = {0};
  size_t top = quick ? (size_t)4 << 20 : (size_t)64 << 20;
  for (size_t s = from; s <= top && b.sizes < BENCH_MAX_SIZES; s *= 4) b.bytes[b.sizes++] = s;
  double copy_bw = memcpy_bandwidth(quick ? (size_t)64 << 20 : (size_t)256 << 20);
  printf("local communicator, f32, all-reduce algorithm: %s\n", algo);
  printf("memcpy (1 thread, %d MiB): %.2f GB/s\n\n", quick ? 64 : 256, copy_bw / 1e9);
  printf("%-10s %5s %10s %12s %12s %12s %8s\n", "coll", "ranks", "bytes", "time_us", "algbw_GB/s",
         "busbw_GB/s", "bus/cpy");
  if (quick && n_worlds > 2) n_worlds = 2;
  for (int w = 0; w < n_worlds; w++) {
    int n = worlds[w];
    tsr_status st = tsr_local_launch(n, 600.0, rank_bench, &b);
    if (st != TSR_OK) {
      fprintf(stderr, "bench_comm: %s: %s\n", tsr_status_name(st), tsr_last_error());
      return 1;
    }
    for (int s = 0; s < b.sizes; s++)
      print_row("all_reduce", n, b.bytes[s], b.ar_s[s], 2.0 * (n - 1) / n, copy_bw);
    for (int s = 0; s < b.sizes; s++)
      print_row("all_gather", n, b.bytes[s], b.ag_s[s], (double)(n - 1) / n, copy_bw);
    for (int s = 0; s < b.sizes; s++)
      print_row("red_scat", n, b.bytes[s], b.rs_s[s], (double)(n - 1) / n, copy_bw);
  }
  return 0;
}
