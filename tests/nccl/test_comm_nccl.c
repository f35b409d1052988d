/* The communicator on the `nccl` backend, run by every process of `mpirun -np N`, one GPU each.
 *
 * Every collective and point-to-point call on device buffers (cudaMalloc), every dtype and op,
 * even, uneven and empty per-member counts, in-place variants, each result compared byte for
 * byte with the same call on host buffers through the same communicator (the mpi backend's code),
 * which is itself checked against exact values (small integers, exact in every dtype, and member
 * counts that are powers of two, so that NCCL's avg, which multiplies by 1/n, is exact too).
 * Then the per-member path on even counts (TESSERA_NCCL_TEST_GROUPED), mismatches (op, host
 * against device memory, host and device in one call, point to point) as TSR_ECOMM on every rank,
 * a rank that arrives but never queues its part (TESSERA_NCCL_TEST_FAULT) as TSR_ETIMEDOUT on its
 * peers, and tsr_nccl_launch.
 *
 * `--world1` runs on one process and one GPU: the front never hands a group of one to a backend,
 * so the test drives the backend's iface directly on a one-member group (comm_impl.h); that runs
 * the NCCL path (a one-rank NCCL communicator) on a machine with a single GPU.
 *
 * With fewer GPUs on this host than ranks on it, every process prints why and exits 77 (ctest:
 * Skipped) before touching MPI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "comm_impl.h"
#include "tessera_nccl.h"

#define SKIP_CODE 77
#define TIMEOUT_S 60.0

static tsr_comm_t *world_comm;
static int me, nproc;
static bool world1;

static void check_ok(tsr_status st) {
  if (st != TSR_OK) print_error("rank %d: %s: %s\n", me, tsr_status_name(st), tsr_last_error());
  assert_int_equal(st, TSR_OK);
}

static void expect_error(tsr_status st, tsr_status want, const char *text) {
  if (st != want || !strstr(tsr_last_error(), text))
    print_error("rank %d: want %s with \"%s\", got %s: %s\n", me, tsr_status_name(want), text,
                tsr_status_name(st), tsr_last_error());
  assert_int_equal(st, want);
  assert_non_null(strstr(tsr_last_error(), text));
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

/* The reduction over the members of element e: exact for these values. */
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
  else
    store(dt, p, i, integer ? (double)(sum / n) : (double)((float)sum / (float)n));
}

/* ---- Buffers: the same call on host and on device memory ---- */

typedef struct bufs {
  size_t sbytes, rbytes;
  char *hs, *hr, *want, *back; /* host send/recv, expected recv, device recv copied back */
  void *ds, *dr;               /* device send/recv (NULL when empty) */
} bufs;

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes) assert_int_equal(cudaMalloc(&p, bytes), cudaSuccess);
  return p;
}

static void bufs_init(bufs *b, tsr_dtype dt, size_t send_count, size_t recv_count, int seed) {
  size_t es = tsr_dtype_size(dt);
  memset(b, 0, sizeof *b);
  b->sbytes = send_count * es;
  b->rbytes = recv_count * es;
  b->hs = send_count ? malloc(b->sbytes) : NULL;
  b->hr = recv_count ? malloc(b->rbytes) : NULL;
  b->want = malloc(b->rbytes + 1);
  b->back = malloc(b->rbytes + 1);
  assert_non_null(b->want);
  assert_non_null(b->back);
  for (size_t i = 0; i < send_count; i++) store(dt, b->hs, i, (double)value(seed, me, i));
  if (b->hr) memset(b->hr, 0x5a, b->rbytes);
  b->ds = dev_alloc(b->sbytes);
  b->dr = dev_alloc(b->rbytes);
  if (b->sbytes) assert_int_equal(cudaMemcpy(b->ds, b->hs, b->sbytes, cudaMemcpyHostToDevice), 0);
  if (b->rbytes) assert_int_equal(cudaMemset(b->dr, 0x5a, b->rbytes), cudaSuccess);
}

/* The host result equals the exact one, and the device result equals the host one. */
static void bufs_check(const bufs *b, const void *dev, const char *what, tsr_dtype dt) {
  if (!b->rbytes) return;
  assert_int_equal(cudaMemcpy(b->back, dev, b->rbytes, cudaMemcpyDeviceToHost), cudaSuccess);
  bool host_ok = memcmp(b->hr, b->want, b->rbytes) == 0;
  bool dev_ok = memcmp(b->back, b->hr, b->rbytes) == 0;
  if (host_ok && dev_ok) return;
  print_error("rank %d: %s %s: %s result wrong\n", me, what, tsr_dtype_name(dt),
              host_ok ? "device" : "host");
  fail();
}

static void bufs_free(bufs *b) {
  free(b->hs);
  free(b->hr);
  free(b->want);
  free(b->back);
  cudaFree(b->ds);
  cudaFree(b->dr);
}

/* ---- Calls: the front, or the iface itself on a group of one ---- */

typedef struct grp {
  tsr_group_t *g;
  bool direct;
  int n, idx, ranks[64];
} grp;

static void grp_init(grp *G, tsr_comm_t *c, int n, const int *ranks, const char *label) {
  memset(G, 0, sizeof *G);
  check_ok(tsr_comm_group(c, n, ranks, label, &G->g));
  G->n = n;
  G->idx = tsr_group_index(G->g);
  memcpy(G->ranks, ranks, (size_t)n * sizeof *ranks);
  /* The front made no backend state for a group of one; the iface makes it (and its group_free
   * runs when the comm is freed). */
  G->direct = n == 1;
  if (G->direct && !G->g->context) check_ok(c->iface->group_init(c, G->g));
}

static tsr_status run(grp *G, tsr_call call) {
  const tsr_comm_iface *f = G->g->comm->iface;
  switch (call.kind) {
    case TSR_COLL_ALL_REDUCE:
      if (!G->direct)
        return tsr_comm_all_reduce(G->g, call.send, call.recv, call.count, call.dt, call.op);
      return f->all_reduce(G->g, &call);
    case TSR_COLL_ALL_GATHER:
      if (!G->direct)
        return tsr_comm_all_gather(G->g, call.send, call.counts[G->idx], call.recv, call.counts,
                                   call.dt);
      return f->all_gather(G->g, &call);
    case TSR_COLL_REDUCE_SCATTER:
      if (!G->direct)
        return tsr_comm_reduce_scatter(G->g, call.send, call.recv, call.counts[G->idx], call.counts,
                                       call.dt, call.op);
      return f->reduce_scatter(G->g, &call);
    case TSR_COLL_ALL_TO_ALL:
      if (!G->direct)
        return tsr_comm_all_to_all(G->g, call.send, call.counts, call.recv, call.recv_counts,
                                   call.dt);
      return f->all_to_all(G->g, &call);
    case TSR_COLL_BROADCAST:
      if (!G->direct) return tsr_comm_broadcast(G->g, call.recv, call.count, call.dt, call.root);
      call.send = call.recv;
      return f->broadcast(G->g, &call);
    default:
      return f->barrier(G->g, &call);
  }
}

/* ---- Collectives, device against host ---- */

static void check_all_reduce(grp *G, tsr_dtype dt, tsr_reduce_op op, size_t count, int seed) {
  bufs b;
  bufs_init(&b, dt, count, count, seed);
  for (size_t e = 0; e < count; e++) store_reduced(dt, op, G->n, G->ranks, seed, e, b.want, e);
  tsr_call call = {.kind = TSR_COLL_ALL_REDUCE, .dt = dt, .op = op, .count = count};
  call.send = b.hs, call.recv = b.hr;
  check_ok(run(G, call));
  call.send = b.ds, call.recv = b.dr;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "all_reduce", dt);
  call.send = call.recv = b.ds; /* in place */
  check_ok(run(G, call));
  bufs_check(&b, b.ds, "in-place all_reduce", dt);
  bufs_free(&b);
}

/* counts[j]: `even` gives base each, else base + j with member 0 empty. */
static void make_counts(const grp *G, size_t base, bool even, size_t *c, size_t *offs) {
  for (int j = 0; j < G->n; j++) {
    c[j] = even ? base : j == 0 && G->n > 1 ? 0 : base + (size_t)j;
    offs[j] = j ? offs[j - 1] + c[j - 1] : 0;
  }
}

static void check_all_gather(grp *G, tsr_dtype dt, size_t base, bool even, int seed) {
  size_t c[64], offs[64], es = tsr_dtype_size(dt);
  make_counts(G, base, even, c, offs);
  size_t total = offs[G->n - 1] + c[G->n - 1];
  bufs b;
  bufs_init(&b, dt, c[G->idx], total, seed);
  for (int j = 0; j < G->n; j++)
    for (size_t i = 0; i < c[j]; i++)
      store(dt, b.want, offs[j] + i, (double)value(seed, G->ranks[j], i));
  tsr_call call = {.kind = TSR_COLL_ALL_GATHER, .dt = dt, .counts = c};
  call.send = b.hs, call.recv = b.hr;
  check_ok(run(G, call));
  call.send = b.ds, call.recv = b.dr;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "all_gather", dt);
  /* In place: the own part already at its offset in recv. */
  void *mine = (char *)b.dr + offs[G->idx] * es;
  assert_int_equal(cudaMemset(b.dr, 0, b.rbytes), cudaSuccess);
  if (c[G->idx])
    assert_int_equal(cudaMemcpy(mine, b.hs, c[G->idx] * es, cudaMemcpyHostToDevice), 0);
  call.send = c[G->idx] ? mine : NULL;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "in-place all_gather", dt);
  bufs_free(&b);
}

static void check_reduce_scatter(grp *G, tsr_dtype dt, tsr_reduce_op op, size_t base, bool even,
                                 int seed) {
  size_t c[64], offs[64], es = tsr_dtype_size(dt);
  make_counts(G, base, even, c, offs);
  size_t total = offs[G->n - 1] + c[G->n - 1];
  bufs b;
  bufs_init(&b, dt, total, c[G->idx], seed);
  for (size_t i = 0; i < c[G->idx]; i++)
    store_reduced(dt, op, G->n, G->ranks, seed, offs[G->idx] + i, b.want, i);
  tsr_call call = {.kind = TSR_COLL_REDUCE_SCATTER, .dt = dt, .op = op, .counts = c};
  call.send = b.hs, call.recv = b.hr;
  check_ok(run(G, call));
  call.send = b.ds, call.recv = b.dr;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "reduce_scatter", dt);
  /* In place: recv is this member's chunk of send. */
  call.recv = c[G->idx] ? (char *)b.ds + offs[G->idx] * es : NULL;
  check_ok(run(G, call));
  if (c[G->idx]) bufs_check(&b, call.recv, "in-place reduce_scatter", dt);
  bufs_free(&b);
}

/* Member a sends cnt(a, b) elements to member b; member 3 of four sends and receives nothing. */
static size_t a2a_count(const grp *G, int a, int b, size_t base) {
  if (G->n == 4 && (a == 3 || b == 3)) return 0;
  return base + (size_t)((a + 2 * b) % 3);
}

static void check_all_to_all(grp *G, tsr_dtype dt, size_t base, int seed) {
  size_t sc[64], rc[64], st = 0, rt = 0;
  for (int j = 0; j < G->n; j++) {
    sc[j] = a2a_count(G, G->idx, j, base);
    rc[j] = a2a_count(G, j, G->idx, base);
    st += sc[j];
    rt += rc[j];
  }
  bufs b;
  bufs_init(&b, dt, st, rt, seed);
  size_t at = 0;
  for (int j = 0; j < G->n; j++) {
    size_t from = 0; /* offset of my part in member j's send */
    for (int k = 0; k < G->idx; k++) from += a2a_count(G, j, k, base);
    for (size_t i = 0; i < rc[j]; i++)
      store(dt, b.want, at + i, (double)value(seed, G->ranks[j], from + i));
    at += rc[j];
  }
  tsr_call call = {.kind = TSR_COLL_ALL_TO_ALL, .dt = dt, .counts = sc, .recv_counts = rc};
  call.send = b.hs, call.recv = b.hr;
  check_ok(run(G, call));
  call.send = b.ds, call.recv = b.dr;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "all_to_all", dt);
  bufs_free(&b);
}

static void check_broadcast(grp *G, tsr_dtype dt, size_t count, int root, int seed) {
  bufs b;
  bufs_init(&b, dt, count, count, seed);
  for (size_t i = 0; i < count; i++) store(dt, b.want, i, (double)value(seed, G->ranks[root], i));
  memcpy(b.hr, b.hs, b.rbytes);
  assert_int_equal(cudaMemcpy(b.dr, b.hs, b.rbytes, cudaMemcpyHostToDevice), cudaSuccess);
  tsr_call call = {.kind = TSR_COLL_BROADCAST, .dt = dt, .count = count, .root = root};
  call.recv = b.hr;
  check_ok(run(G, call));
  call.recv = b.dr;
  check_ok(run(G, call));
  bufs_check(&b, b.dr, "broadcast", dt);
  bufs_free(&b);
}

static void check_group(grp *G) {
  int seed = 1;
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    tsr_dtype dt = dtypes[d];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      check_all_reduce(G, dt, ops[o], 1, seed++);
      check_all_reduce(G, dt, ops[o], 1031, seed++);
      check_reduce_scatter(G, dt, ops[o], 17, true, seed++);
      check_reduce_scatter(G, dt, ops[o], 17, false, seed++);
    }
    check_all_gather(G, dt, 33, true, seed++);
    check_all_gather(G, dt, 33, false, seed++);
    check_all_to_all(G, dt, 9, seed++);
    for (int root = 0; root < G->n; root++) check_broadcast(G, dt, 257, root, seed++);
  }
  tsr_call barrier = {.kind = TSR_COLL_BARRIER, .dt = TSR_F32};
  check_ok(run(G, barrier));
}

/* The world, and on four ranks the rows and columns of a 2 x 2 mesh. */
static void check_comm(tsr_comm_t *c) {
  int ranks[64];
  for (int i = 0; i < nproc; i++) ranks[i] = i;
  grp G;
  grp_init(&G, c, nproc, ranks, "world");
  check_group(&G);
  if (nproc != 4) return;
  int row[2] = {me / 2 * 2, me / 2 * 2 + 1}, col[2] = {me % 2, me % 2 + 2};
  grp_init(&G, c, 2, row, "row");
  check_group(&G);
  grp_init(&G, c, 2, col, "col");
  check_group(&G);
}

static void test_collectives(void **state) {
  check_comm(world_comm);
}

/* Even counts through the per-member path (one NCCL call per member in a group). */
static void test_collectives_grouped(void **state) {
  setenv("TESSERA_NCCL_TEST_GROUPED", "1", 1);
  tsr_comm_t *c = NULL;
  tsr_status st = tsr_nccl_comm_new(TIMEOUT_S, &c);
  unsetenv("TESSERA_NCCL_TEST_GROUPED");
  check_ok(st);
  check_comm(c);
  tsr_nccl_comm_free(c);
}

/* ---- Errors ---- */

static void world_group(tsr_comm_t *c, grp *G) {
  int ranks[64];
  for (int i = 0; i < nproc; i++) ranks[i] = i;
  grp_init(G, c, nproc, ranks, "world");
}

static void test_mismatch(void **state) {
  grp G;
  world_group(world_comm, &G);
  bufs b;
  bufs_init(&b, TSR_F32, 16, 16, 3);
  tsr_call call = {.kind = TSR_COLL_ALL_REDUCE, .dt = TSR_F32, .count = 16};
  call.send = b.ds, call.recv = b.dr;
  if (nproc > 1) {
    /* Different ops: the mpi backend's check, before NCCL moves anything. */
    call.op = me == 1 ? TSR_REDUCE_MAX : TSR_REDUCE_SUM;
    expect_error(run(&G, call), TSR_ECOMM,
                 "rank 0 called all_reduce(f32, 16, sum), rank 1 called all_reduce(f32, 16, max)");
    call.op = TSR_REDUCE_SUM;
    /* Host memory on the last rank, device memory on the others. */
    tsr_call mixed = call;
    if (me == nproc - 1) mixed.send = b.hs, mixed.recv = b.hr;
    char want[128];
    snprintf(want, sizeof want, "rank %d passes host memory and rank 0 device memory", nproc - 1);
    expect_error(run(&G, mixed), TSR_ECOMM, want);
  }
  /* Host and device buffers in one call, on rank 0: an error on every rank. */
  tsr_call both = call;
  if (me == 0) both.send = b.hs;
  expect_error(run(&G, both), TSR_ECOMM, "rank 0 passes host and device buffers in one call");
  /* No data moved: the group works. */
  check_ok(run(&G, call));
  bufs_free(&b);
}

static void test_p2p(void **state) {
  if (nproc < 2) skip();
  grp G;
  world_group(world_comm, &G);
  int next = (me + 1) % nproc, prev = (me + nproc - 1) % nproc;
  int32_t host[4], got[4];
  int32_t *dev = dev_alloc(sizeof host), *dev2 = dev_alloc(sizeof host);
  /* A chain of device sends, in order. */
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 4; i++) host[i] = me * 100 + k * 10 + i;
    assert_int_equal(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    if (me % 2 == 0 && me + 1 < nproc) check_ok(tsr_comm_send(G.g, me + 1, dev, 4, TSR_I32));
    if (me % 2 == 1) {
      check_ok(tsr_comm_recv(G.g, me - 1, dev2, 4, TSR_I32));
      assert_int_equal(cudaMemcpy(got, dev2, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int i = 0; i < 4; i++) assert_int_equal(got[i], (me - 1) * 100 + k * 10 + i);
    }
  }
  /* A ring of device sendrecvs, the ring-attention pattern. */
  for (int i = 0; i < 4; i++) host[i] = me;
  assert_int_equal(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
  for (int step = 0; step < nproc; step++) {
    check_ok(tsr_comm_sendrecv(G.g, next, dev, 4, prev, dev2, 4, TSR_I32));
    int32_t *t = dev;
    dev = dev2;
    dev2 = t;
  }
  assert_int_equal(cudaMemcpy(got, dev, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(got[0], me);
  if (me < 2) {
    /* Count mismatch: both sides fail, no payload moves, and the pair stays in step. */
    tsr_status st =
        me == 0 ? tsr_comm_send(G.g, 1, dev, 4, TSR_I32) : tsr_comm_recv(G.g, 0, dev, 3, TSR_I32);
    expect_error(st, TSR_ECOMM, "rank 0 sends 4 i32 to rank 1, which receives 3 i32");
    /* Device send against a host recv. */
    st = me == 0 ? tsr_comm_send(G.g, 1, dev, 4, TSR_I32) : tsr_comm_recv(G.g, 0, got, 4, TSR_I32);
    expect_error(st, TSR_ECOMM,
                 "rank 0 sends 4 i32 (device memory) to rank 1, which receives 4 "
                 "i32 (host memory)");
    /* Host send against a device recv. */
    st = me == 0 ? tsr_comm_send(G.g, 1, host, 4, TSR_I32) : tsr_comm_recv(G.g, 0, dev, 4, TSR_I32);
    expect_error(st, TSR_ECOMM,
                 "rank 0 sends 4 i32 (host memory) to rank 1, which receives 4 "
                 "i32 (device memory)");
    st = me == 0 ? tsr_comm_send(G.g, 1, dev, 4, TSR_I32) : tsr_comm_recv(G.g, 0, dev2, 4, TSR_I32);
    check_ok(st);
  }
  check_ok(tsr_comm_barrier(G.g));
  cudaFree(dev);
  cudaFree(dev2);
}

/* The last rank arrives at a device all_reduce but never queues its part: its peers time out
 * inside NCCL, abort the communicator, and the group then fails at once. */
static void test_timeout(void **state) {
  if (nproc < 2) skip();
  grp W;
  world_group(world_comm, &W);
  check_ok(tsr_comm_barrier(W.g));
  char fault[64];
  snprintf(fault, sizeof fault, "stall:%d:0", nproc - 1);
  setenv("TESSERA_NCCL_TEST_FAULT", fault, 1);
  tsr_comm_t *c = NULL;
  /* Long enough for NCCL to create the communicators of a multi-GPU host. */
  tsr_status st = tsr_nccl_comm_new(10.0, &c);
  unsetenv("TESSERA_NCCL_TEST_FAULT");
  check_ok(st);
  grp G;
  world_group(c, &G);
  float *x = dev_alloc(64 * sizeof(float));
  st = tsr_comm_all_reduce(G.g, x, x, 64, TSR_F32, TSR_REDUCE_SUM);
  if (me == nproc - 1) {
    expect_error(st, TSR_ECOMM, "fault injected");
  } else {
    expect_error(st, TSR_ETIMEDOUT, "timed out after 10 s in NCCL");
    expect_error(tsr_comm_all_reduce(G.g, x, x, 64, TSR_F32, TSR_REDUCE_SUM), TSR_ECOMM,
                 "broken by an earlier failure");
  }
  cudaFree(x);
  tsr_nccl_comm_free(c);
  check_ok(tsr_comm_barrier(W.g));
}

/* ---- Launch ---- */

static tsr_status rank_fn(tsr_comm_t *c, void *arg) {
  int *device = arg;
  if (strcmp(tsr_comm_backend(c), "nccl") != 0)
    return tsr_error(TSR_EINTERNAL, "backend is '%s'", tsr_comm_backend(c));
  *device = tsr_nccl_comm_device(c);
  int cur = -1;
  cudaGetDevice(&cur);
  if (*device < 0 || cur != *device)
    return tsr_error(TSR_EINTERNAL, "device %d, current %d", *device, cur);
  return TSR_OK;
}

int main(int argc, char **argv) {
  world1 = argc > 1 && strcmp(argv[1], "--world1") == 0;
  const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int local = ls ? atoi(ls) : 1, gpus = 0;
  cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus < local) {
    printf("SKIP test_comm_nccl: %d rank(s) on this host need as many GPUs; the CUDA runtime "
           "sees %d (%s)\n",
           local, e == cudaSuccess ? gpus : 0,
           e == cudaSuccess ? "too few" : cudaGetErrorString(e));
    return SKIP_CODE;
  }
  tsr_status st = tsr_nccl_comm_new(TIMEOUT_S, &world_comm);
  if (st != TSR_OK) {
    fprintf(stderr, "test_comm_nccl: %s\n", tsr_last_error());
    return 1;
  }
  me = tsr_comm_rank(world_comm);
  nproc = tsr_comm_world(world_comm);
  if (world1 ? nproc != 1 : (nproc < 2 || nproc > 64 || (nproc & (nproc - 1)))) {
    fprintf(stderr, "test_comm_nccl: run %s, not with %d processes\n",
            world1 ? "--world1 on one process" : "with 2, 4, 8, ... processes", nproc);
    tsr_nccl_abort(2);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collectives), cmocka_unit_test(test_collectives_grouped),
      cmocka_unit_test(test_mismatch),    cmocka_unit_test(test_p2p),
      cmocka_unit_test(test_timeout),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  tsr_nccl_comm_free(world_comm);
  /* Last: tsr_nccl_launch finalises MPI. */
  int device = -1;
  st = tsr_nccl_launch(nproc, TIMEOUT_S, rank_fn, &device);
  if (st != TSR_OK) {
    fprintf(stderr, "test_comm_nccl: tsr_nccl_launch: %s\n", tsr_last_error());
    tsr_nccl_abort(1);
  }
  printf("rank %d: %d failed, GPU %d\n", me, failed, device);
  return failed ? 1 : 0;
}
