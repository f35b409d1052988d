/* The communicator on the `mpi` backend: the core collective checks of tests/unit/test_comm.c
 * on a real MPI communicator, run by every process of `mpirun -np N` (N = 4 and 8 in ctest).
 *
 * Exact results of every collective for every dtype and op, even and uneven counts, on the
 * world and on the rows and columns of a 2 x N/2 mesh; float sums bit-identical to a member-order
 * f32 reduction (what the local backend computes); point to point in order, rings, mismatches on
 * both sides; call mismatches with the same message on every rank; a timeout naming the rank
 * that never arrived; byte counters against comm.h.
 *
 * Every process runs the same cmocka suite. A failing assertion fails that process, and mpirun
 * then exits non-zero. */
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
#include "tessera_mpi.h"

/* The result tests' timeout: generous for 8 processes on 2 cores. */
#define TIMEOUT_S 60.0

static tsr_comm_t *world_comm;
static int me, nproc;

static void check_ok(tsr_status st) {
  if (st != TSR_OK) print_error("rank %d: %s: %s\n", me, tsr_status_name(st), tsr_last_error());
  assert_int_equal(st, TSR_OK);
}

/* ---- Data: small integers, exact in every dtype ---- */

static const tsr_dtype dtypes[] = {TSR_F32, TSR_BF16, TSR_F16, TSR_I32, TSR_I64};
static const tsr_reduce_op ops[] = {TSR_REDUCE_SUM, TSR_REDUCE_AVG, TSR_REDUCE_MAX};

static int64_t value(int seed, int rank, size_t e) {
  return (int64_t)((e * 29u + (uint64_t)rank * 113u + (uint64_t)seed * 5u) % 53u) - 26;
}

static void store(tsr_dtype dt, void *p, size_t i, double v) {
  if (dt == TSR_F32)
    ((float *)p)[i] = (float)v;
  else if (dt == TSR_BF16)
    ((uint16_t *)p)[i] = tsr_f32_to_bf16((float)v);
  else if (dt == TSR_F16)
    ((uint16_t *)p)[i] = tsr_f32_to_f16((float)v);
  else if (dt == TSR_I32)
    ((int32_t *)p)[i] = (int32_t)v;
  else
    ((int64_t *)p)[i] = (int64_t)v;
}

static void fill(tsr_dtype dt, void *p, size_t n, int seed, int rank, size_t base) {
  for (size_t i = 0; i < n; i++) store(dt, p, i, (double)value(seed, rank, base + i));
}

/* The reduction of element e over the members: exact for these values. */
static void store_reduced(tsr_dtype dt, tsr_reduce_op op, int n, const int *ranks, int seed,
                          size_t e, void *p, size_t i) {
  int64_t sum = 0, max = INT64_MIN;
  for (int k = 0; k < n; k++) {
    int64_t v = value(seed, ranks[k], e);
    sum += v;
    if (v > max) max = v;
  }
  bool integer = dt == TSR_I32 || dt == TSR_I64;
  if (op == TSR_REDUCE_MAX)
    store(dt, p, i, (double)max);
  else if (op == TSR_REDUCE_SUM)
    store(dt, p, i, (double)sum);
  else if (integer)
    store(dt, p, i, (double)(sum / n));
  else
    store(dt, p, i, (double)((float)sum / (float)n));
}

/* ---- The collectives on one group ---- */

typedef struct fixture {
  tsr_group_t *g;
  int n, idx, ranks[64], seed;
  char *a, *b, *want;
} fixture;

static void fixture_init(fixture *f, tsr_group_t *g, size_t cap) {
  f->g = g;
  f->n = tsr_group_size(g);
  f->idx = tsr_group_index(g);
  for (int i = 0; i < f->n; i++) f->ranks[i] = tsr_group_rank(g, i);
  f->a = malloc(cap);
  f->b = malloc(cap);
  f->want = malloc(cap);
  assert_non_null(f->a);
  assert_non_null(f->b);
  assert_non_null(f->want);
}

static void fixture_free(fixture *f) {
  free(f->a);
  free(f->b);
  free(f->want);
}

static void expect_bytes(const fixture *f, const void *got, size_t bytes, const char *what,
                         tsr_dtype dt, size_t count) {
  if (memcmp(got, f->want, bytes) == 0) return;
  print_error("rank %d, group '%s': %s wrong for %s count %zu\n", me, tsr_group_label(f->g), what,
              tsr_dtype_name(dt), count);
  fail();
}

static void run_all_reduce(fixture *f, tsr_dtype dt, size_t count) {
  size_t es = tsr_dtype_size(dt);
  for (int o = 0; o < 3; o++) {
    for (size_t i = 0; i < count; i++)
      store_reduced(dt, ops[o], f->n, f->ranks, f->seed, i, f->want, i);
    fill(dt, f->a, count, f->seed, f->ranks[f->idx], 0);
    memset(f->b, 0x5a, count * es);
    check_ok(tsr_comm_all_reduce(f->g, f->a, f->b, count, dt, ops[o]));
    expect_bytes(f, f->b, count * es, "all_reduce", dt, count);
    check_ok(tsr_comm_all_reduce(f->g, f->a, f->a, count, dt, ops[o]));
    expect_bytes(f, f->a, count * es, "in-place all_reduce", dt, count);
  }
}

/* Some members contribute nothing, others more. */
static size_t uneven(int i, size_t count) {
  return ((size_t)i * 5 + count) % 4 + (count > 6 ? count : 0);
}

static void run_all_gather(fixture *f, tsr_dtype dt, size_t count) {
  size_t es = tsr_dtype_size(dt), counts[64];
  for (int u = 0; u < 2; u++) {
    size_t total = 0;
    for (int j = 0; j < f->n; j++) {
      counts[j] = u ? uneven(j, count) : count;
      fill(dt, f->want + total * es, counts[j], f->seed, f->ranks[j], 0);
      total += counts[j];
    }
    fill(dt, f->a, counts[f->idx], f->seed, f->ranks[f->idx], 0);
    memset(f->b, 0x5a, total * es);
    check_ok(tsr_comm_all_gather(f->g, f->a, counts[f->idx], f->b, u ? counts : NULL, dt));
    expect_bytes(f, f->b, total * es, u ? "uneven all_gather" : "all_gather", dt, count);
  }
}

static void run_reduce_scatter(fixture *f, tsr_dtype dt, size_t count) {
  size_t es = tsr_dtype_size(dt), counts[64];
  for (int u = 0; u < 2; u++) {
    size_t total = 0, off = 0;
    for (int j = 0; j < f->n; j++) {
      counts[j] = u ? uneven(j, count) : count;
      if (j < f->idx) off += counts[j];
      total += counts[j];
    }
    size_t mine = counts[f->idx];
    for (int o = 0; o < 3; o++) {
      for (size_t i = 0; i < mine; i++)
        store_reduced(dt, ops[o], f->n, f->ranks, f->seed, off + i, f->want, i);
      fill(dt, f->a, total, f->seed, f->ranks[f->idx], 0);
      memset(f->b, 0x5a, mine * es);
      check_ok(tsr_comm_reduce_scatter(f->g, f->a, f->b, mine, u ? counts : NULL, dt, ops[o]));
      expect_bytes(f, f->b, mine * es, "reduce_scatter", dt, count);
    }
  }
}

static size_t a2a(int from, int to, size_t count) {
  return ((size_t)(3 * from + to) + count) % 3 + count;
}

static void run_all_to_all(fixture *f, tsr_dtype dt, size_t count) {
  size_t es = tsr_dtype_size(dt), sc[64], rc[64], soff = 0, roff = 0;
  for (int j = 0; j < f->n; j++) {
    sc[j] = a2a(f->idx, j, count);
    rc[j] = a2a(j, f->idx, count);
    fill(dt, f->a + soff * es, sc[j], f->seed, f->ranks[f->idx], 500 * (size_t)j);
    fill(dt, f->want + roff * es, rc[j], f->seed, f->ranks[j], 500 * (size_t)f->idx);
    soff += sc[j];
    roff += rc[j];
  }
  memset(f->b, 0x5a, roff * es);
  check_ok(tsr_comm_all_to_all(f->g, f->a, sc, f->b, rc, dt));
  expect_bytes(f, f->b, roff * es, "all_to_all", dt, count);
}

static void run_broadcast(fixture *f, tsr_dtype dt, size_t count) {
  size_t es = tsr_dtype_size(dt);
  int root = (int)(count % (size_t)f->n);
  fill(dt, f->want, count, f->seed, f->ranks[root], 0);
  if (f->idx == root)
    memcpy(f->b, f->want, count * es);
  else
    memset(f->b, 0x5a, count * es);
  check_ok(tsr_comm_broadcast(f->g, f->b, count, dt, root));
  expect_bytes(f, f->b, count * es, "broadcast", dt, count);
}

static const size_t counts_small[] = {0, 1, 5, 17, 300};

static void run_suite(tsr_group_t *g, size_t extra) {
  fixture f = {0};
  size_t top = extra > 300 ? extra : 300;
  fixture_init(&f, g, (top + 8) * 64 * 8 + 4096);
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    for (size_t c = 0; c <= sizeof counts_small / sizeof counts_small[0]; c++) {
      size_t count = c < sizeof counts_small / sizeof counts_small[0] ? counts_small[c] : extra;
      f.seed = (int)(d * 11 + c);
      run_all_reduce(&f, dtypes[d], count);
      run_all_gather(&f, dtypes[d], count);
      run_reduce_scatter(&f, dtypes[d], count);
      run_all_to_all(&f, dtypes[d], count);
      run_broadcast(&f, dtypes[d], count);
    }
  }
  check_ok(tsr_comm_barrier(g));
  fixture_free(&f);
}

static void world_ranks(int *ranks) {
  for (int i = 0; i < nproc; i++) ranks[i] = i;
}

static void test_world_collectives(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "world", &g));
  /* 1000 elements: every member owns a chunk of the all-reduce, including uneven tails. */
  run_suite(g, 1003);
}

/* Rows and columns of a 2 x N/2 mesh; a second label over the columns shares its sequence. */
static void test_subgroups(void **state) {
  int cols = nproc / 2, row[64], col[2];
  for (int j = 0; j < cols; j++) row[j] = (me / cols) * cols + j;
  col[0] = me % cols;
  col[1] = me % cols + cols;
  tsr_group_t *gr = NULL, *gc = NULL, *gc2 = NULL;
  check_ok(tsr_comm_group(world_comm, cols, row, "tp", &gr));
  check_ok(tsr_comm_group(world_comm, 2, col, "dp", &gc));
  check_ok(tsr_comm_group(world_comm, 2, col, "dp+x", &gc2));
  assert_ptr_not_equal(gc, gc2);
  run_suite(gr, 64);
  run_suite(gc, 33);
  run_suite(gc2, 7);
}

/* Random floats: sums must equal the member-order f32 reduction bit for bit. */
static void test_float_sum_is_member_order(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "world", &g));
  size_t count = 4099;
  float *x = malloc(count * sizeof *x), *want = malloc(count * sizeof *want);
  assert_non_null(x);
  assert_non_null(want);
  for (int r = 0; r < nproc; r++) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
    for (size_t i = 0; i < count; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      float v = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 1e3f;
      if (r == me) x[i] = v;
      want[i] = r == 0 ? v : want[i] + v;
    }
  }
  check_ok(tsr_comm_all_reduce(g, x, x, count, TSR_F32, TSR_REDUCE_SUM));
  assert_memory_equal(x, want, count * sizeof *x);
  free(x);
  free(want);
}

/* ---- Point to point ---- */

static void test_p2p(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "world", &g));
  int next = (me + 1) % nproc, prev = (me + nproc - 1) % nproc;
  /* Three messages in a row arrive in order; even ranks send first. */
  int32_t out[3][4], in[3][4];
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 4; i++) out[k][i] = me * 100 + k * 10 + i;
  for (int phase = 0; phase < 2; phase++) {
    bool sender = (me % 2 == 0) == (phase == 0);
    for (int k = 0; k < 3; k++) {
      if (sender && me + 1 < nproc) check_ok(tsr_comm_send(g, me + 1, out[k], 4, TSR_I32));
      if (!sender && me > 0) {
        check_ok(tsr_comm_recv(g, me - 1, in[k], 4, TSR_I32));
        for (int i = 0; i < 4; i++) assert_int_equal(in[k][i], (me - 1) * 100 + k * 10 + i);
      }
    }
  }
  /* A ring of sendrecvs, the ring-attention pattern. */
  int64_t token = me, got = -1;
  for (int step = 0; step < nproc; step++) {
    check_ok(tsr_comm_sendrecv(g, next, &token, 1, prev, &got, 1, TSR_I64));
    token = got;
  }
  assert_int_equal(token, me);
  /* Count mismatch: both sides fail with the same message, and the pair stays usable. */
  float buf[8] = {0};
  if (me < 2) {
    tsr_status st =
        me == 0 ? tsr_comm_send(g, 1, buf, 8, TSR_F32) : tsr_comm_recv(g, 0, buf, 6, TSR_F32);
    assert_int_equal(st, TSR_ECOMM);
    assert_non_null(strstr(tsr_last_error(), "rank 0 sends 8 f32 to rank 1, which receives 6 f32"));
    if (me == 0)
      check_ok(tsr_comm_send(g, 1, buf, 8, TSR_F32));
    else
      check_ok(tsr_comm_recv(g, 0, buf, 8, TSR_F32));
  }
  check_ok(tsr_comm_barrier(g));
}

/* ---- Errors ---- */

static void test_mismatch(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "world", &g));
  float x[16] = {0};
  tsr_status st =
      tsr_comm_all_reduce(g, x, x, 16, TSR_F32, me == 1 ? TSR_REDUCE_MAX : TSR_REDUCE_SUM);
  assert_int_equal(st, TSR_ECOMM);
  if (!strstr(tsr_last_error(), "rank 0 called all_reduce(f32, 16, sum) outside any op or plugin "
                                "callback (the program's own call), rank 1 called "
                                "all_reduce(f32, 16, max)"))
    fail_msg("%s", tsr_last_error());
  /* all_to_all counts that do not pair up. */
  size_t sc[64], rc[64];
  for (int j = 0; j < nproc; j++) sc[j] = rc[j] = 1;
  if (me == 2) rc[0] = 2;
  float s[64] = {0}, r[64];
  st = tsr_comm_all_to_all(g, s, sc, r, rc, TSR_F32);
  assert_int_equal(st, TSR_ECOMM);
  assert_non_null(strstr(tsr_last_error(), "rank 0 sends 1 elements to rank 2, which expects 2"));
  /* A mismatch does not break the group. */
  check_ok(tsr_comm_all_reduce(g, x, x, 16, TSR_F32, TSR_REDUCE_SUM));
  /* What each side was running crosses the processes with the call: a hook on one rank that
   * makes a collective another rank's op makes is named, beside the op. */
  tsr_breadcrumb *b = tsr_breadcrumb_here(), keep = *b;
  b->step = 3;
  if (me == 0) {
    b->plugin = "fk";
    b->callback = "gradient hook";
    b->name = "fk.sync";
    b->phase = "ready";
  } else {
    b->op = "linear";
    b->op_pass = "backward";
  }
  st = tsr_comm_all_reduce(g, x, x, me == 0 ? 8 : 16, TSR_F32, TSR_REDUCE_SUM);
  *b = keep;
  assert_int_equal(st, TSR_ECOMM);
  assert_non_null(strstr(tsr_last_error(), "in plugin fk, gradient hook fk.sync (ready), step 3"));
  assert_non_null(strstr(tsr_last_error(), "in op linear (backward), no plugin callback, step 3"));
  assert_non_null(strstr(tsr_last_error(), "the two were running different code"));
}

/* The last rank skips a barrier: every other rank times out naming it, and the group then fails
 * at once. A communicator of its own keeps the short timeout away from the other tests. */
static void test_timeout(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *world = NULL, *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "world", &world));
  /* Everyone starts together, so that only the skipped barrier can take longer than 2 s. */
  check_ok(tsr_comm_barrier(world));
  tsr_comm_t *c = NULL;
  check_ok(tsr_mpi_comm_new(2.0, &c));
  check_ok(tsr_comm_group(c, nproc, ranks, "late", &g));
  if (me != nproc - 1) {
    tsr_status st = tsr_comm_barrier(g);
    assert_int_equal(st, TSR_ETIMEDOUT);
    char want[64];
    snprintf(want, sizeof want, "timed out after 2 s: rank %d never arrived", nproc - 1);
    assert_non_null(strstr(tsr_last_error(), want));
    st = tsr_comm_barrier(g);
    assert_int_equal(st, TSR_ECOMM);
    assert_non_null(strstr(tsr_last_error(), "broken by an earlier failure"));
  }
  tsr_mpi_comm_free(c);
}

/* ---- Byte counters ---- */

static void test_byte_counters(void **state) {
  int ranks[64];
  world_ranks(ranks);
  tsr_group_t *g = NULL;
  check_ok(tsr_comm_group(world_comm, nproc, ranks, "bytes", &g));
  tsr_comm_bytes_reset(world_comm);
  size_t count = 10, n = (size_t)nproc;
  float x[640] = {0}, y[640];
  check_ok(tsr_comm_all_reduce(g, x, y, count, TSR_F32, TSR_REDUCE_SUM));
  uint64_t own = (uint64_t)tsr_chunk_size((int64_t)count, nproc, me) * 4;
  uint64_t want = count * 4 - own + own * (n - 1);
  assert_int_equal(tsr_comm_bytes(world_comm, "bytes"), want);
  check_ok(tsr_comm_all_gather(g, x, 3, y, NULL, TSR_F32));
  want += 3 * 4 * (n - 1);
  check_ok(tsr_comm_reduce_scatter(g, x, y, 2, NULL, TSR_F32, TSR_REDUCE_SUM));
  want += (2 * n - 2) * 4;
  check_ok(tsr_comm_broadcast(g, x, 5, TSR_F32, 0));
  if (me == 0) want += 5 * 4 * (n - 1);
  check_ok(tsr_comm_barrier(g));
  assert_int_equal(tsr_comm_bytes(world_comm, "bytes"), want);
}

int main(int argc, char **argv) {
  tsr_status st = tsr_mpi_comm_new(TIMEOUT_S, &world_comm);
  if (st != TSR_OK) {
    fprintf(stderr, "test_comm_mpi: %s\n", tsr_last_error());
    return 1;
  }
  me = tsr_comm_rank(world_comm);
  nproc = tsr_comm_world(world_comm);
  if (nproc < 4 || nproc > 64 || nproc % 2) {
    fprintf(stderr, "test_comm_mpi: run with an even number of processes in 4 ..= 64, not %d\n",
            nproc);
    tsr_mpi_abort(2);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world_collectives),
      cmocka_unit_test(test_subgroups),
      cmocka_unit_test(test_float_sum_is_member_order),
      cmocka_unit_test(test_p2p),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_byte_counters),
      cmocka_unit_test(test_timeout),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  tsr_mpi_comm_free(world_comm);
  tsr_mpi_finalize();
  return failed ? 1 : 0;
}
