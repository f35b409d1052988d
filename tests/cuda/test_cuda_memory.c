/* The memory section of the CUDA kernel table (core/kernel_table.h, ABI 2) against CPU
 * references: pointer ownership, copies both ways, zero, the strided copy on permuted, sliced
 * and broadcast views for each element size, add, sync's error reporting, and allocator_init /
 * release on two threads sharing device 0 with the cache hit on a repeated step.
 *
 * Two groups. The first needs no device and runs everywhere: the strided copy's index plan
 * checked on the host against a naive walk, and the functions called with no current context
 * (they must keep an error for sync, not crash). The second needs a device; without one the test
 * prints the reason and exits 77 (ctest: Skipped), as the other CUDA tests do. Every comparison
 * is exact: these functions move bits, and add is one f32 rounding on both sides. */
#include <pthread.h>

#include <cuda_runtime_api.h>

#include "cuda_test_util.h"
#include "misc.h"
#include "strided.h"

static const tsr_kernel_table *gpu;

/* ---------------------------------------------------------------------------------------------
 * Strided copy cases and the CPU reference
 * ------------------------------------------------------------------------------------------- */

typedef struct copy_case {
  const char *name;
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  int64_t dst_stride[TSR_MAX_DIMS];
  int64_t src_stride[TSR_MAX_DIMS];
  int64_t src_offset; /* elements from the buffer's start to the view's first element */
} copy_case;

static void contiguous_strides(int64_t *stride, const int64_t *shape, int ndim) {
  int64_t s = 1;
  for (int d = ndim; d-- > 0;) stride[d] = s, s *= shape[d];
}

/* The view permute(perm) of a contiguous tensor of shape `base`: gathered into a contiguous dst
 * (gather) or a contiguous src scattered into it (!gather). */
static copy_case permuted(const char *name, const int64_t *base, const int *perm, int ndim,
                          bool gather) {
  copy_case c = {.name = name, .ndim = ndim};
  int64_t base_stride[TSR_MAX_DIMS], view_stride[TSR_MAX_DIMS], packed[TSR_MAX_DIMS];
  contiguous_strides(base_stride, base, ndim);
  for (int d = 0; d < ndim; d++) c.shape[d] = base[perm[d]], view_stride[d] = base_stride[perm[d]];
  contiguous_strides(packed, c.shape, ndim);
  for (int d = 0; d < ndim; d++) {
    c.src_stride[d] = gather ? view_stride[d] : packed[d];
    c.dst_stride[d] = gather ? packed[d] : view_stride[d];
  }
  return c;
}

/* Number of elements a side spans from its first element (strides >= 0 here). */
static int64_t span(const copy_case *c, const int64_t *stride) {
  int64_t last = 0;
  for (int d = 0; d < c->ndim; d++) {
    if (c->shape[d] == 0) return 0;
    last += (c->shape[d] - 1) * stride[d];
  }
  return last + 1;
}

/* Calls f(ctx, dst_off, src_off) for every index of the case in row-major order. */
static void walk(const copy_case *c, void (*f)(void *, int64_t, int64_t), void *ctx) {
  int64_t idx[TSR_MAX_DIMS] = {0};
  for (int d = 0; d < c->ndim; d++)
    if (c->shape[d] == 0) return;
  for (;;) {
    int64_t od = 0, os = 0;
    for (int d = 0; d < c->ndim; d++)
      od += idx[d] * c->dst_stride[d], os += idx[d] * c->src_stride[d];
    f(ctx, od, os);
    int d = c->ndim - 1;
    while (d >= 0 && ++idx[d] == c->shape[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

typedef struct byte_copy {
  uint8_t *dst;
  const uint8_t *src;
  size_t elem;
} byte_copy;

static void copy_one(void *ctx, int64_t od, int64_t os) {
  byte_copy *b = ctx;
  memcpy(b->dst + od * (int64_t)b->elem, b->src + os * (int64_t)b->elem, b->elem);
}

/* A broad set: permutations in 3-D, 4-D and 8-D both ways, a sliced view with gaps and an
 * offset, a broadcast (stride 0), size-1 dims between merged ones, a contiguous copy that plans
 * to a memcpy, ndim 0, and a zero-size dim. */
static int make_cases(copy_case *out) {
  static const int64_t b3[] = {5, 7, 9}, b4[] = {3, 4, 5, 6}, b4big[] = {6, 33, 17, 5};
  static const int64_t b8[] = {2, 3, 2, 2, 3, 2, 2, 2};
  static const int p3[] = {2, 0, 1}, p4[] = {1, 3, 0, 2}, p4b[] = {3, 2, 1, 0};
  static const int p8[] = {7, 6, 5, 4, 3, 2, 1, 0};
  int n = 0;
  out[n++] = permuted("3-D permute gather", b3, p3, 3, true);
  out[n++] = permuted("3-D permute scatter", b3, p3, 3, false);
  out[n++] = permuted("4-D permute gather", b4, p4, 4, true);
  out[n++] = permuted("4-D permute scatter", b4, p4, 4, false);
  out[n++] = permuted("4-D reverse gather (many blocks)", b4big, p4b, 4, true);
  out[n++] = permuted("8-D reverse gather", b8, p8, 8, true);
  /* x[:, 1:6, ::2] of a contiguous (6, 7, 10): shape (6, 5, 5), starting one row in. */
  out[n++] = (copy_case){.name = "sliced view",
                         .ndim = 3,
                         .shape = {6, 5, 5},
                         .src_stride = {70, 10, 2},
                         .dst_stride = {25, 5, 1},
                         .src_offset = 10};
  out[n++] = (copy_case){.name = "broadcast",
                         .ndim = 3,
                         .shape = {4, 5, 6},
                         .src_stride = {0, 6, 1},
                         .dst_stride = {30, 6, 1}};
  out[n++] = (copy_case){.name = "size-1 dims",
                         .ndim = 5,
                         .shape = {3, 1, 4, 1, 5},
                         .src_stride = {20, 20, 5, 5, 1},
                         .dst_stride = {1, 3, 3, 12, 12}};
  out[n++] = (copy_case){.name = "contiguous",
                         .ndim = 3,
                         .shape = {4, 1, 33},
                         .src_stride = {33, 33, 1},
                         .dst_stride = {33, 7, 1}};
  out[n++] = (copy_case){.name = "ndim 0", .ndim = 0, .src_offset = 3};
  out[n++] = (copy_case){.name = "zero-size dim",
                         .ndim = 2,
                         .shape = {4, 0},
                         .src_stride = {1, 1},
                         .dst_stride = {1, 1}};
  return n;
}
#define MAX_CASES 16

static const copy_case *find_case(const copy_case *cases, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(cases[i].name, name) == 0) return &cases[i];
  fail_msg("no copy case '%s'", name);
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Group 1: no device needed
 * ------------------------------------------------------------------------------------------- */

typedef struct offsets {
  int64_t *dst, *src, n;
} offsets;

static void record(void *ctx, int64_t od, int64_t os) {
  offsets *o = ctx;
  o->dst[o->n] = od, o->src[o->n] = os, o->n++;
}

static void check_plan(const copy_case *c) {
  tsr_cuda_strided plan;
  int64_t n = -1;
  assert_int_equal(
      tsr_cuda_strided_plan(&plan, &n, c->dst_stride, c->src_stride, c->shape, c->ndim), TSR_OK);
  int64_t want_n = 1;
  for (int d = 0; d < c->ndim; d++) want_n *= c->shape[d];
  assert_int_equal(n, want_n);
  offsets o = {calloc((size_t)n + 1, 8), calloc((size_t)n + 1, 8), 0};
  assert_non_null(o.dst);
  assert_non_null(o.src);
  walk(c, record, &o);
  assert_int_equal(o.n, n);
  /* The kernel's i-th element must be the naive walk's i-th, so merging kept the order too. */
  for (int64_t i = 0; i < n; i++) {
    int64_t od, os;
    tsr_cuda_strided_offsets(&plan, i, &od, &os);
    if (od != o.dst[i] || os != o.src[i])
      fail_msg("%s: element %lld at (%lld, %lld), want (%lld, %lld)", c->name, (long long)i,
               (long long)od, (long long)os, (long long)o.dst[i], (long long)o.src[i]);
  }
  free(o.dst);
  free(o.src);
}

static void test_strided_plan(void **state) {
  (void)state;
  copy_case cases[MAX_CASES];
  int n = make_cases(cases);
  for (int i = 0; i < n; i++) check_plan(&cases[i]);
  /* Negative strides: a flipped view, addressed from its first element. */
  copy_case flip = {
      .name = "flip", .ndim = 2, .shape = {3, 4}, .src_stride = {-4, -1}, .dst_stride = {4, 1}};
  check_plan(&flip);
  /* What merging must give: a contiguous copy is one unit-stride dim (size-1 dims dropped);
   * permute(2, 0, 1) keeps base dims 0 and 1 adjacent, so they merge; a full reversal merges
   * nothing. */
  tsr_cuda_strided p;
  int64_t cnt;
  const copy_case *c = find_case(cases, n, "contiguous");
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, c->dst_stride, c->src_stride, c->shape, c->ndim),
                   TSR_OK);
  assert_int_equal(p.ndim, 1);
  assert_int_equal(p.dst_stride[0], 1);
  assert_int_equal(p.src_stride[0], 1);
  assert_int_equal(p.shape[0], 132);
  c = find_case(cases, n, "3-D permute gather");
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, c->dst_stride, c->src_stride, c->shape, c->ndim),
                   TSR_OK);
  assert_int_equal(p.ndim, 2);
  assert_int_equal(p.shape[0], 35);
  c = find_case(cases, n, "4-D reverse gather (many blocks)");
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, c->dst_stride, c->src_stride, c->shape, c->ndim),
                   TSR_OK);
  assert_int_equal(p.ndim, 4);
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, NULL, NULL, NULL, 0), TSR_OK);
  assert_int_equal(p.ndim, 0);
  assert_int_equal(cnt, 1);
  /* Refusals. */
  int64_t one[TSR_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[] = {-2};
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, one, one, one, TSR_MAX_DIMS + 1), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "ndim 9 is outside 0..8"));
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, one, one, neg, 1), TSR_EINVAL);
  assert_int_equal(tsr_cuda_strided_plan(&p, &cnt, NULL, one, one, 1), TSR_EINVAL);
}

/* Run before any context is made current on this thread. */
static void test_no_context_keeps_error(void **state) {
  (void)state;
  assert_null(tsr_cuda_ctx_current());
  char host[16] = {0};
  int64_t shape[1] = {4}, stride[1] = {1};
  float f[4] = {0};
  tsr_cuda_k_copy_h2d(host, host, sizeof host);
  tsr_cuda_k_copy_d2h(host, host, sizeof host);
  tsr_cuda_k_copy_d2d(host, host, sizeof host);
  tsr_cuda_k_zero(host, sizeof host);
  tsr_cuda_k_copy_strided(f, stride, f, stride, shape, 1, 4);
  tsr_cuda_k_add(f, f, f, 4);
  /* Nothing was touched, the first call is the one reported, then sync's own complaint. */
  for (int i = 0; i < 16; i++) assert_int_equal(host[i], 0);
  assert_int_equal(tsr_cuda_k_sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "copy_h2d: no CUDA context is current on this thread"));
  assert_int_equal(tsr_cuda_k_sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "sync: no CUDA context is current on this thread"));
  /* Host memory is never the device's, and asking leaves no error behind. */
  assert_false(tsr_cuda_k_owns(NULL));
  assert_false(tsr_cuda_k_owns(host));
  tsr_allocator a;
  memset(&a, 0x5a, sizeof a);
  a.device.kind = TSR_DEVICE_CPU;
  tsr_cuda_k_allocator_release(&a); /* not a CUDA allocator: left alone */
  assert_int_equal(a.device.kind, TSR_DEVICE_CPU);
  assert_int_equal(tsr_cuda_k_allocator_init(NULL, 0), TSR_EINVAL);
}

/* Only without a device: allocator_init says why and leaves nothing to release. */
static void test_allocator_init_without_device(void **state) {
  (void)state;
  tsr_allocator a;
  memset(&a, 0x5a, sizeof a);
  assert_int_equal(tsr_cuda_k_allocator_init(&a, 0), TSR_ENOTSUP);
  assert_non_null(strstr(tsr_last_error(), "no CUDA device"));
  assert_null(a.context);
  assert_null(tsr_cuda_ctx_current());
  tsr_cuda_k_allocator_release(&a);
}

/* ---------------------------------------------------------------------------------------------
 * Group 2: on device 0
 * ------------------------------------------------------------------------------------------- */

static void test_table_fields(void **state) {
  (void)state;
  assert_int_equal(gpu->abi, TSR_KERNEL_TABLE_ABI);
  assert_int_equal(gpu->struct_size, sizeof(tsr_kernel_table));
  assert_true(gpu->owns == tsr_cuda_k_owns);
  assert_true(gpu->allocator_init == tsr_cuda_k_allocator_init);
  assert_true(gpu->allocator_release == tsr_cuda_k_allocator_release);
  assert_true(gpu->copy_h2d == tsr_cuda_k_copy_h2d);
  assert_true(gpu->copy_d2h == tsr_cuda_k_copy_d2h);
  assert_true(gpu->copy_d2d == tsr_cuda_k_copy_d2d);
  assert_true(gpu->zero == tsr_cuda_k_zero);
  assert_true(gpu->copy_strided == tsr_cuda_k_copy_strided);
  assert_true(gpu->add == tsr_cuda_k_add);
  assert_true(gpu->sync == tsr_cuda_k_sync);
}

static void test_owns(void **state) {
  (void)state;
  uint8_t *d = dev_alloc(4096);
  void *pinned = NULL, *managed = NULL;
  assert_int_equal(cudaMallocHost(&pinned, 256), cudaSuccess);
  assert_int_equal(cudaMallocManaged(&managed, 256, cudaMemAttachGlobal), cudaSuccess);
  char stack[8];
  void *heap = malloc(64);
  assert_true(gpu->owns(d));
  assert_true(gpu->owns(d + 1000)); /* inside an allocation */
  assert_true(gpu->owns(managed));
  assert_false(gpu->owns(pinned));
  assert_false(gpu->owns(stack));
  assert_false(gpu->owns(heap));
  assert_false(gpu->owns(NULL));
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  assert_int_equal(gpu->sync(), TSR_OK);
  free(heap);
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  assert_int_equal(cudaFree(managed), cudaSuccess);
  dev_free(d, 4096);
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)test_rng_next(&seed);
}

static void test_round_trips(void **state) {
  (void)state;
  const size_t n = (1u << 20) + 13; /* odd length, past the small size classes */
  uint8_t *host = malloc(n), *back = malloc(n), *pinned = NULL;
  assert_int_equal(cudaMallocHost((void **)&pinned, n), cudaSuccess);
  fill_bytes(host, n, 1);
  uint8_t *a = dev_alloc(n), *b = dev_alloc(n);
  gpu->copy_h2d(a, host, n);
  gpu->copy_d2d(b, a, n);
  gpu->copy_d2h(back, b, n); /* holds the data on return: no sync before reading */
  assert_memory_equal(back, host, n);
  /* A pinned source may be overwritten as soon as copy_h2d returns. */
  memcpy(pinned, host, n);
  gpu->copy_h2d(a, pinned, n);
  memset(pinned, 0xa5, n);
  gpu->copy_d2h(back, a, n);
  assert_memory_equal(back, host, n);
  /* Unaligned sub-ranges and zero bytes. */
  gpu->copy_d2d(b + 3, a + 1001, 777);
  gpu->copy_h2d(a, host, 0);
  gpu->copy_d2h(back, b, 1000);
  assert_memory_equal(back + 3, host + 1001, 777);
  assert_memory_equal(back, host, 3);
  assert_int_equal(gpu->sync(), TSR_OK);
  dev_free(a, n), dev_free(b, n);
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  free(host), free(back);
}

static void test_zero(void **state) {
  (void)state;
  const size_t n = 100003;
  uint8_t *host = malloc(n), *back = malloc(n);
  fill_bytes(host, n, 2);
  uint8_t *d = dev_alloc(n);
  gpu->copy_h2d(d, host, n);
  gpu->zero(d + 5, 70001);
  gpu->zero(d, 0);
  memset(host + 5, 0, 70001);
  gpu->copy_d2h(back, d, n);
  assert_int_equal(gpu->sync(), TSR_OK);
  assert_memory_equal(back, host, n);
  dev_free(d, n);
  free(host), free(back);
}

static void strided_case(const copy_case *c, size_t elem) {
  int64_t ns = span(c, c->src_stride) + c->src_offset, nd = span(c, c->dst_stride);
  size_t sb = (size_t)(ns > 0 ? ns : 1) * elem, db = (size_t)(nd > 0 ? nd : 1) * elem;
  uint8_t *src = malloc(sb), *want = malloc(db), *got = malloc(db);
  fill_bytes(src, sb, elem * 977 + (uint64_t)ns);
  memset(want, 0xee, db); /* elements outside the view must stay as they were */
  byte_copy ref = {want, src + c->src_offset * elem, elem};
  walk(c, copy_one, &ref);
  uint8_t *d_src = dev_alloc(sb), *d_dst = dev_alloc(db);
  gpu->copy_h2d(d_src, src, sb);
  memset(got, 0xee, db);
  gpu->copy_h2d(d_dst, got, db);
  gpu->copy_strided(d_dst, c->dst_stride, d_src + c->src_offset * elem, c->src_stride, c->shape,
                    c->ndim, elem);
  gpu->copy_d2h(got, d_dst, db);
  if (gpu->sync() != TSR_OK) fail_msg("%s, %zu-byte elements: %s", c->name, elem, tsr_last_error());
  if (memcmp(got, want, db) != 0) {
    size_t i = 0;
    while (got[i] == want[i]) i++;
    fail_msg("%s, %zu-byte elements: byte %zu is 0x%02x, want 0x%02x", c->name, elem, i, got[i],
             want[i]);
  }
  dev_free(d_src, sb), dev_free(d_dst, db);
  free(src), free(want), free(got);
}

static void test_copy_strided(void **state) {
  (void)state;
  copy_case cases[MAX_CASES];
  int n = make_cases(cases);
  static const size_t elems[] = {1, 2, 4, 8};
  for (int e = 0; e < 4; e++)
    for (int i = 0; i < n; i++) strided_case(&cases[i], elems[e]);
}

static void test_copy_strided_refuses(void **state) {
  (void)state;
  int64_t shape[TSR_MAX_DIMS + 1] = {2, 2, 1, 1, 1, 1, 1, 1, 1}, stride[TSR_MAX_DIMS + 1] = {0};
  uint8_t *d = dev_alloc(64);
  gpu->copy_strided(d, stride, d + 32, stride, shape, 2, 3);
  assert_int_equal(gpu->sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "elem_size 3 is not 1, 2, 4 or 8"));
  gpu->copy_strided(d, stride, d + 32, stride, shape, TSR_MAX_DIMS + 1, 4);
  assert_int_equal(gpu->sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "ndim 9"));
  gpu->copy_strided(d + 4, stride, d + 32, stride, shape, 2, 8);
  assert_int_equal(gpu->sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "not aligned"));
  /* Only the first failure is kept, and sync clears it. */
  gpu->copy_strided(d, stride, d, stride, shape, -1, 4);
  gpu->copy_strided(d, stride, d, stride, shape, 2, 5);
  assert_int_equal(gpu->sync(), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "ndim -1"));
  assert_int_equal(gpu->sync(), TSR_OK);
  dev_free(d, 64);
}

static void test_add(void **state) {
  (void)state;
  const int64_t n = (1 << 20) + 7;
  uint64_t s = 5;
  float *x = test_alloc(n), *y = test_alloc(n), *got = test_alloc(n);
  test_fill(x, n, &s, -3, 3);
  test_fill(y, n, &s, -1e3f, 1e3f); /* mixed magnitudes: most sums round */
  float *dx = dev_f(x, n), *dy = dev_f(y, n);
  gpu->add(dy, dy, dx, n); /* in place, as gradients accumulate */
  gpu->add(dy, dy, dx, 0);
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
  gpu->copy_d2h(got, dy, (size_t)n * sizeof(float));
  assert_int_equal(gpu->sync(), TSR_OK);
  assert_memory_equal(got, y, (size_t)n * sizeof(float));
  /* out of place, as the residual add: z = x + y, x and y untouched */
  float *dz = dev_f(x, n); /* holds x: a call that wrote nothing would not pass */
  gpu->add(dz, dx, dy, n);
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
  gpu->copy_d2h(got, dz, (size_t)n * sizeof(float));
  assert_int_equal(gpu->sync(), TSR_OK);
  assert_memory_equal(got, y, (size_t)n * sizeof(float));
  dev_free(dz, n * 4);
  dev_free(dx, n * 4), dev_free(dy, n * 4);
  free(x), free(y), free(got);
}

/* Two rank threads on device 0, each with its own context from allocator_init, both alive at
 * once (the N-virtual-ranks-on-one-GPU case). cmocka cannot fail from a thread: each records
 * what went wrong and the main thread asserts. */
typedef struct rank_run {
  int rank;
  pthread_barrier_t *both;
  tsr_cuda_ctx *ctx, *current_after;
  bool released;
  char why[512];
} rank_run;

static const size_t rank_sizes[] = {4, 1000, 70000, (3u << 20) + 5, 512, 70000};
#define RANK_N (sizeof rank_sizes / sizeof rank_sizes[0])

#define RCHECK(r, cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      snprintf((r)->why, sizeof(r)->why, __VA_ARGS__);                                             \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

static void *rank_main(void *arg) {
  rank_run *r = arg;
  tsr_allocator a;
  void *p[RANK_N] = {0};
  const int64_t nf = 70000 / 4;
  float *x = test_alloc(nf), *back = test_alloc(nf);
  tsr_status st = gpu->allocator_init(&a, 0);
  r->ctx = tsr_cuda_ctx_current();
  pthread_barrier_wait(r->both);
  RCHECK(r, st == TSR_OK, "allocator_init: %s", tsr_last_error());
  RCHECK(r, r->ctx != NULL && r->ctx == a.context, "context not current or not the allocator's");
  RCHECK(r, a.device.kind == TSR_DEVICE_CUDA && a.device.index == 0, "device not cuda:0");
  RCHECK(r, a.bytes_in_use == 0 && a.peak_bytes == 0, "counters not zero");
  tsr_cuda_alloc_stats first = {0};
  for (int step = 0; step < 2; step++) {
    for (size_t i = 0; i < RANK_N; i++) {
      p[i] = tsr_allocator_alloc(&a, rank_sizes[i]);
      RCHECK(r, p[i] && gpu->owns(p[i]), "step %d: block %zu missing or not device", step, i);
    }
    /* Work on this rank's stream with data of its own: no cross-talk between the contexts. */
    for (int64_t i = 0; i < nf; i++) x[i] = (float)(i % 1000) * 0.25f + (float)r->rank;
    gpu->copy_h2d(p[2], x, 70000);
    gpu->zero(p[5], 70000);
    gpu->add(p[5], p[5], p[2], nf);
    gpu->add(p[5], p[5], p[2], nf);
    gpu->copy_d2h(back, p[5], 70000);
    st = gpu->sync();
    RCHECK(r, st == TSR_OK, "step %d: sync: %s", step, tsr_last_error());
    for (int64_t i = 0; i < nf; i++)
      RCHECK(r, back[i] == 2 * x[i], "step %d: element %lld is %g, want %g", step, (long long)i,
             back[i], 2 * x[i]);
    for (size_t k = RANK_N; k-- > 0;) { /* freed in an order unlike the allocation order */
      size_t i = (k * 5) % RANK_N;
      tsr_allocator_free(&a, p[i], rank_sizes[i]);
      p[i] = NULL;
    }
    tsr_cuda_alloc_stats now = tsr_cuda_ctx_alloc_stats(r->ctx);
    if (step == 0) {
      first = now;
      /* Two blocks share the 70000-byte class but are live at once: one malloc each. */
      RCHECK(r, first.device_mallocs == RANK_N, "step 0: %llu mallocs, want %zu",
             (unsigned long long)first.device_mallocs, RANK_N);
    } else {
      RCHECK(r, now.device_mallocs == first.device_mallocs, "step 1 called cudaMalloc %llu times",
             (unsigned long long)(now.device_mallocs - first.device_mallocs));
      RCHECK(r, now.cache_hits == first.cache_hits + RANK_N, "step 1: %llu cache hits, want %zu",
             (unsigned long long)(now.cache_hits - first.cache_hits), RANK_N);
    }
  }
  RCHECK(r, a.bytes_in_use == 0, "%zu bytes still in use", a.bytes_in_use);
  RCHECK(r, a.peak_bytes >= (3u << 20) + 5 + 2 * 70000, "peak %zu too small", a.peak_bytes);
done:
  for (size_t i = 0; i < RANK_N; i++)
    if (p[i]) tsr_allocator_free(&a, p[i], rank_sizes[i]);
  /* Both contexts stay alive until both ranks are done, then each releases its own. */
  pthread_barrier_wait(r->both);
  gpu->allocator_release(&a);
  r->released = a.context == NULL;
  r->current_after = tsr_cuda_ctx_current();
  free(x), free(back);
  return NULL;
}

static void test_allocator_two_threads(void **state) {
  (void)state;
  pthread_barrier_t both;
  assert_int_equal(pthread_barrier_init(&both, NULL, 2), 0);
  rank_run runs[2] = {{.rank = 0, .both = &both}, {.rank = 1, .both = &both}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, rank_main, &runs[i]), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  pthread_barrier_destroy(&both);
  for (int i = 0; i < 2; i++) {
    if (runs[i].why[0]) fail_msg("rank %d: %s", i, runs[i].why);
    assert_true(runs[i].released);
    assert_null(runs[i].current_after);
  }
  assert_ptr_not_equal(runs[0].ctx, runs[1].ctx);
  /* The main thread's context is its own business. */
  assert_ptr_equal(tsr_cuda_ctx_current(), g_ctx);
  assert_int_equal(gpu->sync(), TSR_OK);
}

int main(void) {
  char why[256] = "";
  int devices = tsr_cuda_device_count(why, sizeof why);
  const struct CMUnitTest host_tests[] = {
      cmocka_unit_test(test_strided_plan),
      cmocka_unit_test(test_no_context_keeps_error),
  };
  const struct CMUnitTest no_device_tests[] = {
      cmocka_unit_test(test_allocator_init_without_device),
  };
  int rc = cmocka_run_group_tests(host_tests, NULL, NULL);
  if (devices == 0 && rc == 0) rc = cmocka_run_group_tests(no_device_tests, NULL, NULL);
  if (rc) return 1;
  rc = cuda_test_setup("test_cuda_memory");
  if (rc) return rc;
  if (core_kernel_table(tsr_cuda_ctx_allocator(g_ctx), &gpu) != TSR_OK) {
    printf("FAIL: a device is present but the CUDA kernel table did not load: %s\n",
           tsr_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_fields), cmocka_unit_test(test_owns),
      cmocka_unit_test(test_round_trips),  cmocka_unit_test(test_zero),
      cmocka_unit_test(test_copy_strided), cmocka_unit_test(test_copy_strided_refuses),
      cmocka_unit_test(test_add),          cmocka_unit_test(test_allocator_two_threads),
  };
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  tsr_cuda_ctx_destroy(g_ctx);
  return rc;
}
