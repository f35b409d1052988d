/* The communicator front and the local backend: exact results of every collective for world
 * sizes 1-16 and 64, on the world and on sub-groups, every dtype and op, even and uneven counts,
 * both all-reduce algorithms; point to point; mismatch, timeout and early-exit errors; byte
 * counters against the definitions in comm.h.
 *
 * Rank bodies run on their own threads, where cmocka's asserts must not be used: they return
 * TSR_EINTERNAL with a message instead, and the test thread asserts on the launch's status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tessera/breadcrumb.h"
#include "tessera/comm.h"

#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) return TSR_ERROR(TSR_EINTERNAL, __VA_ARGS__);                                     \
  } while (0)

/* Generous for the result tests so that slow sanitizer runs never trip it. */
#define TIMEOUT_S 60.0

static void launch_ok(int world, tsr_rank_fn fn, void *arg) {
  tsr_status st = tsr_local_launch(world, TIMEOUT_S, fn, arg);
  if (st != TSR_OK) print_error("world %d: %s: %s\n", world, tsr_status_name(st), tsr_last_error());
  assert_int_equal(st, TSR_OK);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

/* ---- Integer-valued data ---- */

static const tsr_dtype all_dtypes[] = {TSR_F32, TSR_BF16, TSR_F16, TSR_I32, TSR_I64};
static const tsr_reduce_op all_ops[] = {TSR_REDUCE_SUM, TSR_REDUCE_AVG, TSR_REDUCE_MAX};

/* Small integers, exact in every dtype; distinct per rank, element and call. */
static int64_t val(int seed, int rank, size_t e) {
  return (int64_t)(((uint64_t)rank * 131u + e * 17u + (uint64_t)seed * 7u) % 61u) - 30;
}

static void put(tsr_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
    case TSR_F32:
      ((float *)p)[i] = (float)v;
      break;
    case TSR_BF16:
      ((uint16_t *)p)[i] = tsr_f32_to_bf16((float)v);
      break;
    case TSR_F16:
      ((uint16_t *)p)[i] = tsr_f32_to_f16((float)v);
      break;
    case TSR_I32:
      ((int32_t *)p)[i] = (int32_t)v;
      break;
    default:
      ((int64_t *)p)[i] = (int64_t)v;
      break;
  }
}

static void fill(tsr_dtype dt, void *p, size_t count, int seed, int rank, size_t base) {
  for (size_t i = 0; i < count; i++) put(dt, p, i, (double)val(seed, rank, base + i));
}

/* The exact reduction of element e over `ranks`: f32 arithmetic for floats, rounded to the dtype
 * once; 64-bit integers with truncating division for integers. */
static void put_reduced(tsr_dtype dt, tsr_reduce_op op, int n, const int *ranks, int seed, size_t e,
                        void *p, size_t i) {
  int64_t sum = 0, max = INT64_MIN;
  for (int k = 0; k < n; k++) {
    int64_t v = val(seed, ranks[k], e);
    sum += v;
    max = v > max ? v : max;
  }
  if (dt == TSR_I32 || dt == TSR_I64) {
    int64_t r = op == TSR_REDUCE_SUM ? sum : op == TSR_REDUCE_AVG ? sum / n : max;
    put(dt, p, i, (double)r);
    return;
  }
  float r = op == TSR_REDUCE_SUM   ? (float)sum
            : op == TSR_REDUCE_AVG ? (float)sum / (float)n
                                   : (float)max;
  put(dt, p, i, r);
}

static size_t esize(tsr_dtype dt) {
  return tsr_dtype_size(dt);
}

/* ---- Collectives on one group, run by every member ---- */

typedef struct suite {
  tsr_group_t *g;
  int n, me;
  int ranks[64];
  int seed;
  char *a, *b, *want; /* buffers of `cap` bytes */
  size_t cap;
} suite;

#define SUITE_FAIL(s, what, dt, count)                                                             \
  TSR_ERROR(TSR_EINTERNAL, "group '%s' member %d: %s wrong for %s count %zu",                      \
            tsr_group_label((s)->g), (s)->me, what, tsr_dtype_name(dt), (size_t)(count))

static tsr_status check_all_reduce(suite *s, tsr_dtype dt, size_t count) {
  size_t es = esize(dt);
  for (int o = 0; o < 3; o++) {
    tsr_reduce_op op = all_ops[o];
    for (size_t i = 0; i < count; i++) put_reduced(dt, op, s->n, s->ranks, s->seed, i, s->want, i);
    fill(dt, s->a, count, s->seed, s->ranks[s->me], 0);
    memset(s->b, 0x5a, count * es);
    TSR_CHECK(tsr_comm_all_reduce(s->g, s->a, s->b, count, dt, op));
    if (memcmp(s->b, s->want, count * es) != 0) return SUITE_FAIL(s, "all_reduce", dt, count);
    /* In place. */
    TSR_CHECK(tsr_comm_all_reduce(s->g, s->a, s->a, count, dt, op));
    if (memcmp(s->a, s->want, count * es) != 0)
      return SUITE_FAIL(s, "in-place all_reduce", dt, count);
  }
  return TSR_OK;
}

/* Uneven counts: some members contribute nothing, others one more. */
static void uneven_counts(int n, size_t count, size_t *counts) {
  for (int i = 0; i < n; i++) counts[i] = ((size_t)i * 3 + count) % 5 + (count > 8 ? count : 0);
}

static tsr_status check_all_gather(suite *s, tsr_dtype dt, size_t count) {
  size_t es = esize(dt), counts[64];
  for (int uneven = 0; uneven < 2; uneven++) {
    for (int i = 0; i < s->n; i++) counts[i] = count;
    if (uneven) uneven_counts(s->n, count, counts);
    size_t off = 0, mine = counts[s->me];
    for (int j = 0; j < s->n; j++) {
      fill(dt, s->want + off * es, counts[j], s->seed, s->ranks[j], 0);
      off += counts[j];
    }
    fill(dt, s->a, mine, s->seed, s->ranks[s->me], 0);
    memset(s->b, 0x5a, off * es);
    TSR_CHECK(tsr_comm_all_gather(s->g, s->a, mine, s->b, uneven ? counts : NULL, dt));
    if (memcmp(s->b, s->want, off * es) != 0)
      return SUITE_FAIL(s, uneven ? "uneven all_gather" : "all_gather", dt, count);
  }
  return TSR_OK;
}

static tsr_status check_reduce_scatter(suite *s, tsr_dtype dt, size_t count) {
  size_t es = esize(dt), counts[64];
  for (int uneven = 0; uneven < 2; uneven++) {
    for (int i = 0; i < s->n; i++) counts[i] = count;
    if (uneven) uneven_counts(s->n, count, counts);
    size_t total = 0, off = 0;
    for (int j = 0; j < s->n; j++) total += counts[j];
    for (int j = 0; j < s->me; j++) off += counts[j];
    size_t mine = counts[s->me];
    for (int o = 0; o < 3; o++) {
      for (size_t i = 0; i < mine; i++)
        put_reduced(dt, all_ops[o], s->n, s->ranks, s->seed, off + i, s->want, i);
      fill(dt, s->a, total, s->seed, s->ranks[s->me], 0);
      memset(s->b, 0x5a, mine * es);
      TSR_CHECK(
          tsr_comm_reduce_scatter(s->g, s->a, s->b, mine, uneven ? counts : NULL, dt, all_ops[o]));
      if (memcmp(s->b, s->want, mine * es) != 0)
        return SUITE_FAIL(s, uneven ? "uneven reduce_scatter" : "reduce_scatter", dt, count);
    }
  }
  return TSR_OK;
}

/* Elements member i sends to member j. */
static size_t a2a_count(int i, int j, size_t count) {
  return ((size_t)(i + 2 * j) + count) % 4 + count;
}

static tsr_status check_all_to_all(suite *s, tsr_dtype dt, size_t count) {
  size_t es = esize(dt), sc[64], rc[64], off = 0;
  for (int j = 0; j < s->n; j++) {
    sc[j] = a2a_count(s->me, j, count);
    rc[j] = a2a_count(j, s->me, count);
    /* What member j sends to me: its data at base 1000 * me. */
    fill(dt, s->a + off * es, sc[j], s->seed, s->ranks[s->me], 1000 * (size_t)j);
    off += sc[j];
  }
  off = 0;
  for (int j = 0; j < s->n; j++) {
    fill(dt, s->want + off * es, rc[j], s->seed, s->ranks[j], 1000 * (size_t)s->me);
    off += rc[j];
  }
  memset(s->b, 0x5a, off * es);
  TSR_CHECK(tsr_comm_all_to_all(s->g, s->a, sc, s->b, rc, dt));
  if (memcmp(s->b, s->want, off * es) != 0) return SUITE_FAIL(s, "all_to_all", dt, count);
  return TSR_OK;
}

static tsr_status check_broadcast(suite *s, tsr_dtype dt, size_t count) {
  size_t es = esize(dt);
  int root = (int)(count % (size_t)s->n);
  fill(dt, s->want, count, s->seed, s->ranks[root], 0);
  if (s->me == root)
    fill(dt, s->a, count, s->seed, s->ranks[root], 0);
  else
    memset(s->a, 0x5a, count * es);
  TSR_CHECK(tsr_comm_broadcast(s->g, s->a, count, dt, root));
  if (memcmp(s->a, s->want, count * es) != 0) return SUITE_FAIL(s, "broadcast", dt, count);
  return TSR_OK;
}

static tsr_status suite_run(tsr_comm_t *c, int n, const int *ranks, const char *label,
                            const size_t *counts, int ncounts) {
  suite s = {.n = n, .me = -1, .seed = 0};
  for (int i = 0; i < n; i++) {
    s.ranks[i] = ranks[i];
    if (ranks[i] == tsr_comm_rank(c)) s.me = i;
  }
  TSR_CHECK(tsr_comm_group(c, n, ranks, label, &s.g));
  EXPECT(tsr_group_index(s.g) == s.me && tsr_group_size(s.g) == n, "group index or size wrong");
  size_t maxc = 0;
  for (int i = 0; i < ncounts; i++) maxc = counts[i] > maxc ? counts[i] : maxc;
  s.cap = (maxc + 8) * (size_t)n * 8;
  s.a = malloc(s.cap);
  s.b = malloc(s.cap);
  s.want = malloc(s.cap);
  tsr_status st = TSR_OK;
  if (!s.a || !s.b || !s.want) {
    st = TSR_ERROR(TSR_ENOMEM, "test buffers");
    goto cleanup;
  }
  for (int d = 0; d < 5; d++) {
    for (int k = 0; k < ncounts; k++) {
      tsr_dtype dt = all_dtypes[d];
      s.seed++;
      TSR_CHECK_GOTO(check_all_reduce(&s, dt, counts[k]), st);
      TSR_CHECK_GOTO(check_all_gather(&s, dt, counts[k]), st);
      TSR_CHECK_GOTO(check_reduce_scatter(&s, dt, counts[k]), st);
      TSR_CHECK_GOTO(check_all_to_all(&s, dt, counts[k]), st);
      TSR_CHECK_GOTO(check_broadcast(&s, dt, counts[k]), st);
      TSR_CHECK_GOTO(tsr_comm_barrier(s.g), st);
    }
  }
cleanup:
  free(s.a);
  free(s.b);
  free(s.want);
  return st;
}

static const size_t small_counts[] = {0, 1, 7, 100};

static tsr_status rank_world_suite(tsr_comm_t *c, void *arg) {
  (void)arg;
  int n = tsr_comm_world(c), ranks[64];
  for (int i = 0; i < n; i++) ranks[i] = i;
  TSR_CHECK(suite_run(c, n, ranks, "world", small_counts, 4));
  /* The same members in another order: group order, not rank order, decides the layout. */
  for (int i = 0; i < n; i++) ranks[i] = n - 1 - i;
  static const size_t one[] = {5};
  return suite_run(c, n, ranks, "reversed", one, 1);
}

static void run_world_sizes(void) {
  static const int worlds[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16};
  for (size_t i = 0; i < sizeof worlds / sizeof *worlds; i++)
    launch_ok(worlds[i], rank_world_suite, NULL);
}

static void test_collectives_latency_algorithm(void **state) {
  (void)state;
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
  run_world_sizes();
}

/* Threshold 0: every non-empty all-reduce takes the bandwidth algorithm. */
static void test_collectives_bandwidth_algorithm(void **state) {
  (void)state;
  setenv("TESSERA_LOCAL_SMALL_BYTES", "0", 1);
  run_world_sizes();
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
}

/* Counts on both sides of the default threshold, with the default threshold. */
static tsr_status rank_large(tsr_comm_t *c, void *arg) {
  (void)arg;
  int n = tsr_comm_world(c), ranks[64];
  for (int i = 0; i < n; i++) ranks[i] = i;
  static const size_t counts[] = {1000, 5000, 40001};
  return suite_run(c, n, ranks, "world", counts, 3);
}

static void test_collectives_large(void **state) {
  (void)state;
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
  launch_ok(2, rank_large, NULL);
  launch_ok(3, rank_large, NULL);
  launch_ok(8, rank_large, NULL);
}

/* World 6 as dp=2 x tp=3 and world 12 as 3 x 4: groups along each dim and the flattened pair. */
static tsr_status rank_subgroups(tsr_comm_t *c, void *arg) {
  const int *shape = arg;
  int r = tsr_comm_rank(c), a = r / shape[1], b = r % shape[1], ranks[64];
  for (int j = 0; j < shape[1]; j++) ranks[j] = a * shape[1] + j;
  TSR_CHECK(suite_run(c, shape[1], ranks, "tp", small_counts, 4));
  for (int i = 0; i < shape[0]; i++) ranks[i] = i * shape[1] + b;
  TSR_CHECK(suite_run(c, shape[0], ranks, "dp", small_counts, 4));
  /* dp+tp flattened with dp outermost. */
  for (int i = 0; i < shape[0] * shape[1]; i++) ranks[i] = i;
  static const size_t one[] = {9};
  return suite_run(c, shape[0] * shape[1], ranks, "dp+tp", one, 1);
}

static void test_collectives_subgroups(void **state) {
  (void)state;
  int s23[2] = {2, 3}, s34[2] = {3, 4};
  launch_ok(6, rank_subgroups, s23);
  setenv("TESSERA_LOCAL_SMALL_BYTES", "0", 1);
  launch_ok(6, rank_subgroups, s23);
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
  launch_ok(12, rank_subgroups, s34);
}

/* ---- Bit identity with rounding ---- */

/* Values whose sums round: mixed signs and magnitudes 2^-12 to 2^5, within f16's range summed
 * over 8 members. Integers stay small enough to sum exactly. */
static double rval(tsr_dtype dt, int rank, size_t e) {
  uint64_t h =
      ((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)e + 7) * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 32;
  int64_t mant = (int64_t)(h % 2000001u) - 1000000;
  if (dt == TSR_I32 || dt == TSR_I64) return (double)mant;
  return (double)mant / 1e6 * (double)(1u << (h >> 40) % 18) / 4096.0;
}

/* What one member contributes, as the reduction reads it. */
static float rget(tsr_dtype dt, int rank, size_t e) {
  char b[8];
  put(dt, b, 0, rval(dt, rank, e));
  return dt == TSR_F32    ? *(float *)b
         : dt == TSR_BF16 ? tsr_bf16_to_f32(*(uint16_t *)b)
                          : tsr_f16_to_f32(*(uint16_t *)b);
}

/* The documented order: member 0's value, then + member 1's, + member 2's, ... in f32, the average
 * divided by n once, rounded to the dtype once. */
static void put_ordered(tsr_dtype dt, tsr_reduce_op op, int n, size_t e, void *p, size_t i) {
  if (dt == TSR_I32 || dt == TSR_I64) {
    int64_t sum = 0, max = INT64_MIN;
    for (int k = 0; k < n; k++) {
      int64_t v = (int64_t)rval(dt, k, e);
      sum += v;
      max = v > max ? v : max;
    }
    put(dt, p, i, (double)(op == TSR_REDUCE_SUM ? sum : op == TSR_REDUCE_AVG ? sum / n : max));
    return;
  }
  float acc = rget(dt, 0, e);
  for (int k = 1; k < n; k++) {
    float v = rget(dt, k, e);
    acc = op == TSR_REDUCE_MAX ? (v > acc ? v : acc) : acc + v;
  }
  if (op == TSR_REDUCE_AVG) acc /= (float)n;
  put(dt, p, i, acc);
}

typedef struct bits_arg {
  const size_t *counts;
  int ncounts;
} bits_arg;

/* all_reduce (out of place and in place) and reduce_scatter (even, uneven, in place) give every
 * member the bits of the fixed order, for counts around the blocks of the backend's loops. */
static tsr_status rank_bits(tsr_comm_t *c, void *arg) {
  const bits_arg *ba = arg;
  int n = tsr_comm_world(c), me = tsr_comm_rank(c), ranks[64];
  for (int i = 0; i < n; i++) ranks[i] = i;
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_comm_group(c, n, ranks, "bits", &g));
  size_t maxc = 0;
  for (int k = 0; k < ba->ncounts; k++) maxc = ba->counts[k] > maxc ? ba->counts[k] : maxc;
  size_t cap = (maxc * (size_t)n + 64) * 8;
  char *a = malloc(cap), *b = malloc(cap), *want = malloc(cap);
  tsr_status st = TSR_OK;
  if (!a || !b || !want) {
    st = TSR_ERROR(TSR_ENOMEM, "test buffers");
    goto cleanup;
  }
  for (int d = 0; d < 5; d++) {
    tsr_dtype dt = all_dtypes[d];
    size_t es = esize(dt);
    for (int k = 0; k < ba->ncounts; k++) {
      size_t count = ba->counts[k];
      for (int o = 0; o < 3; o++) {
        tsr_reduce_op op = all_ops[o];
        for (size_t i = 0; i < count; i++) put_ordered(dt, op, n, i, want, i);
        for (size_t i = 0; i < count; i++) put(dt, a, i, rval(dt, me, i));
        memset(b, 0x5a, count * es);
        TSR_CHECK_GOTO(tsr_comm_all_reduce(g, a, b, count, dt, op), st);
        if (memcmp(b, want, count * es) != 0) {
          st = TSR_ERROR(TSR_EINTERNAL, "member %d: all_reduce bits differ for %s count %zu", me,
                         tsr_dtype_name(dt), count);
          goto cleanup;
        }
        TSR_CHECK_GOTO(tsr_comm_all_reduce(g, a, a, count, dt, op), st);
        if (memcmp(a, want, count * es) != 0) {
          st = TSR_ERROR(TSR_EINTERNAL,
                         "member %d: in-place all_reduce bits differ for %s count "
                         "%zu",
                         me, tsr_dtype_name(dt), count);
          goto cleanup;
        }
        /* reduce_scatter: even, uneven, then in place (recv at this member's part of send). */
        for (int mode = 0; mode < 3; mode++) {
          size_t cnt[64], total = 0, off = 0;
          for (int j = 0; j < n; j++) cnt[j] = count;
          if (mode == 1) uneven_counts(n, count, cnt);
          for (int j = 0; j < n; j++) total += cnt[j];
          for (int j = 0; j < me; j++) off += cnt[j];
          for (size_t i = 0; i < cnt[me]; i++) put_ordered(dt, op, n, off + i, want, i);
          for (size_t i = 0; i < total; i++) put(dt, a, i, rval(dt, me, i));
          memset(b, 0x5a, cnt[me] * es);
          char *out = mode == 2 ? a + off * es : b;
          TSR_CHECK_GOTO(
              tsr_comm_reduce_scatter(g, a, out, cnt[me], mode == 1 ? cnt : NULL, dt, op), st);
          if (memcmp(out, want, cnt[me] * es) != 0) {
            st = TSR_ERROR(TSR_EINTERNAL,
                           "member %d: reduce_scatter (mode %d) bits differ for %s "
                           "count %zu",
                           me, mode, tsr_dtype_name(dt), count);
            goto cleanup;
          }
        }
      }
    }
  }
cleanup:
  free(a);
  free(b);
  free(want);
  return st;
}

/* The sum order is fixed: every member gets the same bits whatever the algorithm, the group size
 * or the count (blocks of the loops cut anywhere). */
static void test_collectives_bit_identical(void **state) {
  (void)state;
  static const size_t counts[] = {1, 3, 511, 512, 513, 4095, 4097, 8193, 40001};
  bits_arg ba = {counts, 9};
  static const int worlds[] = {2, 3, 5, 8};
  for (int algo = 0; algo < 2; algo++) {
    if (algo)
      setenv("TESSERA_LOCAL_SMALL_BYTES", "0", 1);
    else
      setenv("TESSERA_LOCAL_SMALL_BYTES", "18446744073709551615", 1);
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
      launch_ok(worlds[w], rank_bits, &ba);
  }
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
}

static tsr_status rank_smoke64(tsr_comm_t *c, void *arg) {
  (void)arg;
  int n = tsr_comm_world(c), ranks[64];
  for (int i = 0; i < n; i++) ranks[i] = i;
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_comm_group(c, n, ranks, "world", &g));
  enum { COUNT = 1000 };
  float x[COUNT], got[3 * 64];
  for (int i = 0; i < COUNT; i++) x[i] = (float)(tsr_comm_rank(c) + i);
  TSR_CHECK(tsr_comm_all_reduce(g, x, x, COUNT, TSR_F32, TSR_REDUCE_SUM));
  for (int i = 0; i < COUNT; i++)
    EXPECT(x[i] == (float)(n * (n - 1) / 2 + n * i), "all_reduce element %d: %g", i, x[i]);
  float mine[3] = {(float)tsr_comm_rank(c), 1.0f, -2.0f};
  TSR_CHECK(tsr_comm_all_gather(g, mine, 3, got, NULL, TSR_F32));
  for (int j = 0; j < n; j++)
    EXPECT(got[3 * j] == (float)j && got[3 * j + 1] == 1.0f && got[3 * j + 2] == -2.0f,
           "all_gather block %d", j);
  return TSR_OK;
}

static void test_world_64(void **state) {
  (void)state;
  launch_ok(64, rank_smoke64, NULL);
  setenv("TESSERA_LOCAL_SMALL_BYTES", "0", 1);
  launch_ok(64, rank_smoke64, NULL);
  unsetenv("TESSERA_LOCAL_SMALL_BYTES");
}

static tsr_status rank_barrier_only(tsr_comm_t *c, void *arg) {
  (void)arg;
  int *ranks = malloc((size_t)tsr_comm_world(c) * sizeof *ranks);
  EXPECT(ranks, "oom");
  for (int i = 0; i < tsr_comm_world(c); i++) ranks[i] = i;
  tsr_group_t *g = NULL;
  tsr_status st = tsr_comm_group(c, tsr_comm_world(c), ranks, "world", &g);
  free(ranks);
  TSR_CHECK(st);
  int64_t one = 1, sum = 0;
  TSR_CHECK(tsr_comm_all_reduce(g, &one, &sum, 1, TSR_I64, TSR_REDUCE_SUM));
  EXPECT(sum == tsr_comm_world(c), "sum %lld", (long long)sum);
  return tsr_comm_barrier(g);
}

static void test_world_1024(void **state) {
  (void)state;
  launch_ok(1024, rank_barrier_only, NULL);
}

/* ---- Point to point ---- */

static tsr_status world_group(tsr_comm_t *c, const char *label, tsr_group_t **g) {
  int ranks[64];
  for (int i = 0; i < tsr_comm_world(c); i++) ranks[i] = i;
  return tsr_comm_group(c, tsr_comm_world(c), ranks, label, g);
}

/* Messages from one sender arrive in order; a receiver may pick senders in any order. */
static tsr_status rank_send_recv(tsr_comm_t *c, void *arg) {
  (void)arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "pp", &g));
  int r = tsr_comm_rank(c);
  int32_t buf[8];
  if (r == 1 || r == 2) {
    for (int m = 0; m < 3; m++) {
      for (int i = 0; i < m + 2; i++) buf[i] = 100 * r + 10 * m + i;
      TSR_CHECK(tsr_comm_send(g, 0, buf, (size_t)m + 2, TSR_I32));
    }
  } else if (r == 0) {
    /* Rank 2 first although rank 1 may have posted earlier. */
    for (int src = 2; src >= 1; src--) {
      for (int m = 0; m < 3; m++) {
        memset(buf, 0, sizeof buf);
        TSR_CHECK(tsr_comm_recv(g, src, buf, (size_t)m + 2, TSR_I32));
        for (int i = 0; i < m + 2; i++)
          EXPECT(buf[i] == 100 * src + 10 * m + i, "message %d from %d element %d: %d", m, src, i,
                 buf[i]);
      }
    }
  }
  return TSR_OK;
}

static void test_send_recv_order(void **state) {
  (void)state;
  launch_ok(3, rank_send_recv, NULL);
}

static tsr_status rank_ring(tsr_comm_t *c, void *arg) {
  (void)arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "cp", &g));
  int n = tsr_group_size(g), me = tsr_group_index(g);
  int64_t cur[5], next[5];
  for (int i = 0; i < 5; i++) cur[i] = me * 10 + i;
  /* After k steps each member holds the block that started k members to its left. */
  for (int step = 1; step <= n; step++) {
    TSR_CHECK(tsr_comm_sendrecv(g, (me + 1) % n, cur, 5, (me + n - 1) % n, next, 5, TSR_I64));
    int from = ((me - step) % n + n) % n;
    for (int i = 0; i < 5; i++)
      EXPECT(next[i] == from * 10 + i, "step %d element %d: %lld", step, i, (long long)next[i]);
    memcpy(cur, next, sizeof cur);
  }
  return TSR_OK;
}

static void test_sendrecv_ring(void **state) {
  (void)state;
  for (int n = 1; n <= 6; n++) launch_ok(n, rank_ring, NULL);
}

/* ---- Errors ---- */

typedef struct outcome {
  tsr_status st[8];
  char msg[8][1024];
  double elapsed[8];
  int mode;
} outcome;

static tsr_status record(outcome *o, tsr_comm_t *c, tsr_status st, double t0) {
  int r = tsr_comm_rank(c);
  o->st[r] = st;
  o->elapsed[r] = now_s() - t0;
  snprintf(o->msg[r], sizeof o->msg[r], "%s", st == TSR_OK ? "" : tsr_last_error());
  return TSR_OK;
}

static void expect_msg(const outcome *o, int r, const char *needle) {
  if (!strstr(o->msg[r], needle))
    print_error("rank %d message \"%s\" lacks \"%s\"\n", r, o->msg[r], needle);
  assert_non_null(strstr(o->msg[r], needle));
}

/* Rank 0 disagrees with the others in op (mode 0), count (1), dtype (2), kind (3). */
static tsr_status rank_mismatch(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "tp", &g));
  float x[1024] = {0}, y[3 * 1024];
  int r = tsr_comm_rank(c);
  double t0 = now_s();
  tsr_status st;
  if (r == 0 || o->mode == 3)
    st = tsr_comm_all_reduce(g, x, x, 1024, TSR_F32, TSR_REDUCE_SUM);
  else if (o->mode == 0)
    st = tsr_comm_all_reduce(g, x, x, 1024, TSR_F32, TSR_REDUCE_MAX);
  else if (o->mode == 1)
    st = tsr_comm_all_reduce(g, x, x, 1000, TSR_F32, TSR_REDUCE_SUM);
  else
    st = tsr_comm_all_reduce(g, x, x, 1024, TSR_BF16, TSR_REDUCE_SUM);
  if (o->mode == 3) {
    /* Second call: ranks 1 and 2 gather where rank 0 reduces. */
    if (r == 0)
      st = tsr_comm_all_reduce(g, x, x, 1024, TSR_F32, TSR_REDUCE_SUM);
    else
      st = tsr_comm_all_gather(g, x, 512, y, NULL, TSR_F32);
  }
  record(o, c, st, t0);
  /* A mismatch is reported, not fatal: every member saw it, so the group stays in step. */
  TSR_CHECK(tsr_comm_all_reduce(g, x, x, 4, TSR_F32, TSR_REDUCE_SUM));
  return tsr_comm_barrier(g);
}

static void test_mismatch(void **state) {
  (void)state;
  static const char *const want[4][2] = {
      {"rank 0 called all_reduce(f32, 1024, sum)", "called all_reduce(f32, 1024, max)"},
      {"rank 0 called all_reduce(f32, 1024, sum)", "called all_reduce(f32, 1000, sum)"},
      {"rank 0 called all_reduce(f32, 1024, sum)", "called all_reduce(bf16, 1024, sum)"},
      {"rank 0 called all_reduce(f32, 1024, sum)", "rank 1 called all_gather(f32, 512)"},
  };
  for (int mode = 0; mode < 4; mode++) {
    outcome o = {.mode = mode};
    launch_ok(3, rank_mismatch, &o);
    for (int r = 0; r < 3; r++) {
      assert_int_equal(o.st[r], TSR_ECOMM);
      expect_msg(&o, r, "collective mismatch on group 'tp' [0,1,2]");
      expect_msg(&o, r, mode == 3 ? "(seq 1)" : "(seq 0)");
      expect_msg(&o, r, want[mode][0]);
      expect_msg(&o, r, want[mode][1]);
    }
  }
}

static tsr_status rank_a2a_mismatch(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "cp", &g));
  int r = tsr_comm_rank(c);
  size_t sc[2] = {2, 2}, rc[2] = {2, 2};
  if (r == 1) rc[0] = 3;
  int32_t s[4] = {0}, d[5];
  record(o, c, tsr_comm_all_to_all(g, s, sc, d, rc, TSR_I32), now_s());
  return TSR_OK;
}

static void test_all_to_all_mismatch(void **state) {
  (void)state;
  outcome o = {0};
  launch_ok(2, rank_a2a_mismatch, &o);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(o.st[r], TSR_ECOMM);
    expect_msg(&o, r, "rank 0 sends 2 elements to rank 1, which expects 3");
  }
}

/* Rank 2 skips an all-reduce: the others time out naming it; then every call fails at once. */
static tsr_status rank_timeout(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "dp", &g));
  int r = tsr_comm_rank(c);
  float x[4] = {0};
  double t0 = now_s();
  if (r == 2) {
    sleep_s(0.6);
    record(o, c, tsr_comm_all_reduce(g, x, x, 4, TSR_F32, TSR_REDUCE_SUM), now_s());
    return TSR_OK;
  }
  record(o, c, tsr_comm_all_reduce(g, x, x, 4, TSR_F32, TSR_REDUCE_SUM), t0);
  if (o->st[r] != TSR_ETIMEDOUT) return TSR_OK;
  t0 = now_s();
  tsr_status st = tsr_comm_barrier(g);
  double dt = now_s() - t0;
  EXPECT(st == TSR_ECOMM, "call on a broken group returned %s", tsr_status_name(st));
  EXPECT(strstr(tsr_last_error(), "broken") && strstr(tsr_last_error(), "never arrived"),
         "broken-group message: %s", tsr_last_error());
  EXPECT(dt < 0.1, "call on a broken group took %g s", dt);
  return TSR_OK;
}

static void test_timeout(void **state) {
  (void)state;
  outcome o = {0};
  assert_int_equal(tsr_local_launch(3, 0.2, rank_timeout, &o), TSR_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(o.st[r], TSR_ETIMEDOUT);
    expect_msg(&o, r,
               "all_reduce(f32, 4, sum) on group 'dp' [0,1,2] (seq 0) timed out after 0.2 s");
    expect_msg(&o, r, "rank 2 never arrived");
    assert_true(o.elapsed[r] >= 0.19 && o.elapsed[r] < 0.55);
  }
  assert_int_equal(o.st[2], TSR_ECOMM);
  expect_msg(&o, 2, "broken");
}

/* Rank 1, in a (pretend) gradient hook, waits in an all-gather on a group rank 0 never uses,
 * while rank 0 waits in the all-reduce rank 1 never makes: rank 0's timeout names where rank 1
 * is instead, hook and all, and that rank 2 has made no collective call. */
static tsr_status rank_elsewhere(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL, *pair = NULL;
  TSR_CHECK(world_group(c, "dp", &g));
  int r = tsr_comm_rank(c), ranks[2] = {1, 2};
  float x[4] = {0}, y[8];
  double t0 = now_s();
  if (r == 1) {
    TSR_CHECK(tsr_comm_group(c, 2, ranks, "fk", &pair));
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter("fk", "gradient hook", "fk.sync", "ready");
    record(o, c, tsr_comm_all_gather(pair, x, 4, y, NULL, TSR_F32), t0);
    tsr_breadcrumb_leave(&crumb);
    sleep_s(2.0); /* alive past rank 0's timeout, so that it times out rather than sees it gone */
    return TSR_OK;
  }
  if (r == 2) {
    sleep_s(2.0);
    return TSR_OK;
  }
  record(o, c, tsr_comm_all_reduce(g, x, x, 4, TSR_F32, TSR_REDUCE_SUM), t0);
  return TSR_OK;
}

static void test_timeout_names_where(void **state) {
  (void)state;
  outcome o = {0};
  tsr_local_launch(3, 0.2, rank_elsewhere, &o);
  assert_int_equal(o.st[0], TSR_ETIMEDOUT);
  expect_msg(&o, 0, "ranks 1, 2 never arrived");
  /* rank 1's own wait times out at about the same moment: it waits in the all-gather, or has
   * just left it */
  expect_msg(&o, 0, "; rank 1 ");
  expect_msg(&o, 0, " all_gather on group 'fk' in plugin fk, gradient hook fk.sync (ready)");
  expect_msg(&o, 0, "; rank 2 has made no collective call");
}

/* Rank 2 fails and returns before its first collective: the others must not wait for it. */
static tsr_status rank_early_exit(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "dp", &g));
  if (tsr_comm_rank(c) == 2) return TSR_ERROR(TSR_EINVAL, "deliberate failure");
  float x[4] = {0};
  double t0 = now_s();
  tsr_status st = tsr_comm_all_reduce(g, x, x, 4, TSR_F32, TSR_REDUCE_SUM);
  record(o, c, st, t0);
  return st;
}

static void test_early_exit(void **state) {
  (void)state;
  outcome o = {0};
  tsr_status st = tsr_local_launch(3, 30.0, rank_early_exit, &o);
  /* The cause is rank 2's failure, which came first: its status and message, then the ranks that
   * failed after it because it had left. */
  assert_int_equal(st, TSR_EINVAL);
  const char *e = tsr_last_error();
  assert_ptr_equal(strstr(e, "rank 2: "), e);
  assert_non_null(
      strstr(e, "deliberate failure\n  then ranks 0, 1 failed after it; the first of them, rank "));
  assert_non_null(strstr(e, "rank 2 returned from its rank function"));
  for (int r = 0; r < 2; r++) {
    assert_int_equal(o.st[r], TSR_ECOMM);
    expect_msg(&o, r, "rank 2 returned from its rank function");
    assert_true(o.elapsed[r] < 5.0);
  }
}

/* Ranks that fail at different times, without waiting for each other: `delay` seconds before
 * failing with `msg` (NULL: succeed). */
typedef struct timed_failures {
  double delay[4];
  const char *msg[4];
} timed_failures;

static tsr_status rank_timed_failure(tsr_comm_t *c, void *arg) {
  const timed_failures *f = arg;
  int r = tsr_comm_rank(c);
  sleep_s(f->delay[r]);
  return f->msg[r] ? tsr_error(r == 3 ? TSR_EIO : TSR_EINVAL, "%s", f->msg[r]) : TSR_OK;
}

/* The failure written first is the launch's error whatever the rank numbers; the others follow
 * in brief: with one more, its message; with the same message everywhere, just their ranks. */
static void test_first_failure_reported(void **state) {
  (void)state;
  timed_failures two = {{0.2, 0, 0, 0.4}, {NULL, NULL, NULL, NULL}};
  two.msg[3] = "disk full";
  two.msg[0] = "bad shape";
  assert_int_equal(tsr_local_launch(4, 30.0, rank_timed_failure, &two), TSR_EINVAL);
  assert_string_equal(tsr_last_error(),
                      "rank 0: bad shape\n  then rank 3 failed after it: disk full");

  timed_failures late_low = {{0.4, 0, 0, 0}, {"later", NULL, NULL, "sooner"}};
  assert_int_equal(tsr_local_launch(4, 30.0, rank_timed_failure, &late_low), TSR_EIO);
  assert_string_equal(tsr_last_error(), "rank 3: sooner\n  then rank 0 failed after it: later");

  timed_failures mixed = {{0, 0.2, 0.4, 0}, {"lost", "lost", "gone", NULL}};
  assert_int_equal(tsr_local_launch(4, 30.0, rank_timed_failure, &mixed), TSR_EINVAL);
  assert_string_equal(tsr_last_error(),
                      "rank 0: lost\n  then ranks 1, 2 failed after it; the first "
                      "with another message, rank 2: gone");

  timed_failures same = {{0.2, 0.2, 0, 0.2}, {"diverged", "diverged", "diverged", "diverged"}};
  assert_int_equal(tsr_local_launch(4, 30.0, rank_timed_failure, &same), TSR_EINVAL);
  assert_string_equal(
      tsr_last_error(),
      "rank 2: diverged\n  then ranks 0, 1, 3 failed after it, with the same message");
}

static tsr_status rank_p2p_errors(tsr_comm_t *c, void *arg) {
  outcome *o = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "pp", &g));
  int r = tsr_comm_rank(c);
  float x[8] = {0};
  if (o->mode == 0) { /* count mismatch */
    tsr_status st =
        r == 0 ? tsr_comm_send(g, 1, x, 8, TSR_F32) : tsr_comm_recv(g, 0, x, 6, TSR_F32);
    return record(o, c, st, now_s());
  }
  /* Rank 1 never sends: rank 0's receive times out. */
  double t0 = now_s();
  if (r == 0) return record(o, c, tsr_comm_recv(g, 1, x, 8, TSR_F32), t0);
  sleep_s(0.5);
  return TSR_OK;
}

static void test_p2p_errors(void **state) {
  (void)state;
  outcome o = {.mode = 0};
  assert_int_equal(tsr_local_launch(2, 5.0, rank_p2p_errors, &o), TSR_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(o.st[r], TSR_ECOMM);
    expect_msg(&o, r, "rank 0 sends 8 f32 to rank 1, which receives 6 f32");
  }
  outcome t = {.mode = 1};
  assert_int_equal(tsr_local_launch(2, 0.2, rank_p2p_errors, &t), TSR_OK);
  assert_int_equal(t.st[0], TSR_ETIMEDOUT);
  expect_msg(&t, 0, "recv of 8 f32 by rank 0 from rank 1 on group 'pp' [0,1] timed out");
  expect_msg(&t, 0, "rank 1 never sent");
}

/* ---- Byte counters ---- */

typedef struct bytes_case {
  int n;
  uint64_t got[8][8]; /* [rank][case] */
} bytes_case;

static tsr_status rank_bytes(tsr_comm_t *c, void *arg) {
  bytes_case *bc = arg;
  tsr_group_t *g = NULL;
  TSR_CHECK(world_group(c, "tp", &g));
  int r = tsr_comm_rank(c), n = tsr_comm_world(c);
  int64_t buf[256] = {0}, out[256];
  size_t counts[8], rcounts[8];
  uint64_t *got = bc->got[r];
  tsr_comm_bytes_reset(c);
  TSR_CHECK(tsr_comm_all_reduce(g, buf, out, 10, TSR_I64, TSR_REDUCE_SUM));
  got[0] = tsr_comm_bytes(c, "tp");
  tsr_comm_bytes_reset(c);
  for (int i = 0; i < n; i++) counts[i] = (size_t)i + 1;
  TSR_CHECK(tsr_comm_all_gather(g, buf, (size_t)r + 1, out, counts, TSR_I64));
  got[1] = tsr_comm_bytes(c, "tp");
  tsr_comm_bytes_reset(c);
  TSR_CHECK(tsr_comm_reduce_scatter(g, buf, out, (size_t)r + 1, counts, TSR_I64, TSR_REDUCE_MAX));
  got[2] = tsr_comm_bytes(c, "tp");
  tsr_comm_bytes_reset(c);
  for (int j = 0; j < n; j++) {
    counts[j] = (size_t)(r + 2 * j) % 3;
    rcounts[j] = (size_t)(j + 2 * r) % 3;
  }
  TSR_CHECK(tsr_comm_all_to_all(g, buf, counts, out, rcounts, TSR_I64));
  got[3] = tsr_comm_bytes(c, "tp");
  tsr_comm_bytes_reset(c);
  TSR_CHECK(tsr_comm_broadcast(g, buf, 7, TSR_I64, 1 % n));
  TSR_CHECK(tsr_comm_barrier(g));
  got[4] = tsr_comm_bytes(c, "tp");
  tsr_comm_bytes_reset(c);
  if (n > 1) TSR_CHECK(tsr_comm_sendrecv(g, (r + 1) % n, buf, 3, (r + n - 1) % n, out, 3, TSR_I64));
  got[5] = tsr_comm_bytes(c, "tp");
  /* Counters are per label: another label over the same ranks counts separately. */
  tsr_group_t *h = NULL;
  TSR_CHECK(world_group(c, "dp+tp", &h));
  TSR_CHECK(tsr_comm_all_reduce(h, buf, out, 4, TSR_I64, TSR_REDUCE_SUM));
  got[6] = tsr_comm_bytes(c, "tp");
  got[7] = tsr_comm_bytes(c, "dp+tp");
  return TSR_OK;
}

static void test_byte_counters(void **state) {
  (void)state;
  for (int n = 1; n <= 5; n++) {
    bytes_case bc = {.n = n};
    launch_ok(n, rank_bytes, &bc);
    for (int r = 0; r < n; r++) {
      uint64_t own = (uint64_t)tsr_chunk_size(10, n, r), own4 = (uint64_t)tsr_chunk_size(4, n, r);
      uint64_t total = (uint64_t)n * (uint64_t)(n + 1) / 2, a2a = 0;
      for (int j = 0; j < n; j++) a2a += j == r ? 0 : (uint64_t)(r + 2 * j) % 3;
      assert_int_equal(bc.got[r][0], 8 * ((10 - own) + own * (uint64_t)(n - 1)));
      assert_int_equal(bc.got[r][1], 8 * (uint64_t)(r + 1) * (uint64_t)(n - 1));
      assert_int_equal(bc.got[r][2], 8 * (total - (uint64_t)(r + 1)));
      assert_int_equal(bc.got[r][3], 8 * a2a);
      assert_int_equal(bc.got[r][4], r == 1 % n ? 8 * 7 * (uint64_t)(n - 1) : 0);
      assert_int_equal(bc.got[r][5], n > 1 ? 24 : 0);
      assert_int_equal(bc.got[r][6], bc.got[r][5]);
      assert_int_equal(bc.got[r][7], 8 * ((4 - own4) + own4 * (uint64_t)(n - 1)));
    }
    if (n == 4) {
      /* Spelled out: 10 elements over 4 are chunks 3, 3, 3, 1. */
      assert_int_equal(bc.got[0][0], 8 * (7 + 3 * 3));
      assert_int_equal(bc.got[3][0], 8 * (9 + 1 * 3));
      assert_int_equal(bc.got[2][1], 8 * 3 * 3);
      assert_int_equal(bc.got[0][2], 8 * 9);
    }
  }
}

/* ---- Front: chunks, groups, arguments ---- */

static void test_chunks(void **state) {
  (void)state;
  static const int64_t want[4] = {2, 2, 1, 0}, start[4] = {0, 2, 4, 5};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(tsr_chunk_size(5, 4, i), want[i]);
    assert_int_equal(tsr_chunk_start(5, 4, i), start[i]);
  }
  /* ceil(10 / 4) = 3: 3, 3, 3, 1; ceil(2 / 4) = 1: 1, 1, 0, 0. */
  assert_int_equal(tsr_chunk_size(10, 4, 3), 1);
  assert_int_equal(tsr_chunk_size(2, 4, 2), 0);
  assert_int_equal(tsr_chunk_start(2, 4, 3), 2);
  assert_int_equal(tsr_chunk_size(0, 3, 0), 0);
  for (int64_t total = 0; total < 40; total++) {
    for (int n = 1; n < 9; n++) {
      int64_t sum = 0;
      for (int i = 0; i < n; i++) {
        assert_int_equal(tsr_chunk_start(total, n, i), sum);
        sum += tsr_chunk_size(total, n, i);
      }
      assert_int_equal(sum, total);
    }
  }
  assert_string_equal(tsr_reduce_op_name(TSR_REDUCE_SUM), "sum");
  assert_string_equal(tsr_reduce_op_name(TSR_REDUCE_AVG), "avg");
  assert_string_equal(tsr_reduce_op_name(TSR_REDUCE_MAX), "max");
}

static tsr_status rank_groups(tsr_comm_t *c, void *arg) {
  (void)arg;
  int r = tsr_comm_rank(c);
  tsr_group_t *a = NULL, *b = NULL, *bad = NULL;
  int pair[2] = {r / 2 * 2, r / 2 * 2 + 1}, other[2] = {(r / 2 * 2 + 2) % 4, (r / 2 * 2 + 3) % 4};
  TSR_CHECK(tsr_comm_group(c, 2, pair, "tp", &a));
  TSR_CHECK(tsr_comm_group(c, 2, pair, "tp", &b));
  EXPECT(a == b, "the same list and label must return the same handle");
  EXPECT(tsr_group_rank(a, 1) == pair[1] && tsr_group_index(a) == r % 2, "members");
  EXPECT(strcmp(tsr_group_label(a), "tp") == 0, "label");
  EXPECT(strcmp(tsr_comm_backend(c), "local") == 0, "backend name");
  EXPECT(tsr_comm_group(c, 2, other, "tp", &bad) == TSR_EINVAL && !bad, "non-member accepted");
  EXPECT(strstr(tsr_last_error(), "does not contain the calling rank"), "%s", tsr_last_error());
  int dup[2] = {r, r};
  EXPECT(tsr_comm_group(c, 2, dup, "x", &bad) == TSR_EINVAL, "duplicate accepted");
  int out_of_world[2] = {r, 9};
  EXPECT(tsr_comm_group(c, 2, out_of_world, "x", &bad) == TSR_EINVAL, "rank 9 accepted");
  float x[2] = {0};
  EXPECT(tsr_comm_all_reduce(a, NULL, x, 2, TSR_F32, TSR_REDUCE_SUM) == TSR_EINVAL, "NULL send");
  EXPECT(tsr_comm_all_reduce(a, x, x, 2, TSR_F32, (tsr_reduce_op)7) == TSR_EINVAL, "bad op");
  EXPECT(tsr_comm_broadcast(a, x, 2, TSR_F32, 2) == TSR_EINVAL, "root outside the group");
  EXPECT(tsr_comm_send(a, r % 2, x, 2, TSR_F32) == TSR_EINVAL, "send to self");
  /* Local errors do not touch the group: it still works. */
  return tsr_comm_all_reduce(a, x, x, 2, TSR_F32, TSR_REDUCE_SUM);
}

static void test_groups_and_arguments(void **state) {
  (void)state;
  launch_ok(4, rank_groups, NULL);
  assert_int_equal(tsr_local_launch(0, 1.0, rank_groups, NULL), TSR_EINVAL);
  assert_int_equal(tsr_local_launch(1025, 1.0, rank_groups, NULL), TSR_EINVAL);
  assert_int_equal(tsr_local_launch(2, 0.0, rank_groups, NULL), TSR_EINVAL);
  assert_int_equal(tsr_local_launch(2, 1.0, NULL, NULL), TSR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunks),
      cmocka_unit_test(test_groups_and_arguments),
      cmocka_unit_test(test_collectives_latency_algorithm),
      cmocka_unit_test(test_collectives_bandwidth_algorithm),
      cmocka_unit_test(test_collectives_large),
      cmocka_unit_test(test_collectives_subgroups),
      cmocka_unit_test(test_collectives_bit_identical),
      cmocka_unit_test(test_world_64),
      cmocka_unit_test(test_world_1024),
      cmocka_unit_test(test_send_recv_order),
      cmocka_unit_test(test_sendrecv_ring),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_all_to_all_mismatch),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_timeout_names_where),
      cmocka_unit_test(test_early_exit),
      cmocka_unit_test(test_first_failure_reported),
      cmocka_unit_test(test_p2p_errors),
      cmocka_unit_test(test_byte_counters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
