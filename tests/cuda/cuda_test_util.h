/* Helpers of the CUDA tests: the skip when no device is present, device buffers from the
 * context's caching allocator, and CPU-vs-CUDA comparisons. */
#ifndef TESSERA_CUDA_TEST_UTIL_H
#define TESSERA_CUDA_TEST_UTIL_H

#include <string.h>

#include "test_kernels_util.h"
#include "tessera/device.h"
#include "tessera/tensor.h"
#include "tessera_cuda.h"

/* ctest's SKIP_RETURN_CODE for these tests (tests/cuda/CMakeLists.txt). */
#define CUDA_TEST_SKIP 77

static tsr_cuda_ctx *g_ctx;

/* Creates the context on device 0 and makes it current, or prints why the test is skipped.
 * Returns 0 to run, CUDA_TEST_SKIP to skip, 1 on a real failure. */
static inline int cuda_test_setup(const char *test) {
  char why[256] = "";
  if (tsr_cuda_device_count(why, sizeof why) == 0) {
    printf("SKIP %s: no CUDA device (%s)\n", test, why);
    return CUDA_TEST_SKIP;
  }
  if (tsr_cuda_ctx_create(0, &g_ctx) != TSR_OK) {
    printf("FAIL %s: a device is present but the context failed: %s\n", test, tsr_last_error());
    return 1;
  }
  tsr_cuda_ctx_make_current(g_ctx);
  return 0;
}

/* The kernel table the core serves for tensors of `alloc` (NULL: the CPU), read off a tensor as
 * rules and plugins read it (tsr_kernel_table_of): for the CUDA context's allocator, the table
 * the core loaded from libtessera-cuda.so. On failure the last error says why. */
static inline tsr_status core_kernel_table(tsr_allocator *alloc, const tsr_kernel_table **out) {
  *out = NULL;
  TSR_CHECK(tsr_device_check(alloc ? alloc->device : (tsr_device){TSR_DEVICE_CPU, 0}));
  int64_t one = 1;
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_tensor_new(alloc, TSR_F32, 1, &one, &t));
  *out = tsr_kernel_table_of(t);
  tsr_tensor_free(t);
  return TSR_OK;
}

static inline void *dev_alloc(size_t bytes) {
  void *p = tsr_allocator_alloc(tsr_cuda_ctx_allocator(g_ctx), bytes);
  assert_non_null(p);
  return p;
}

static inline void dev_free(void *p, size_t bytes) {
  tsr_allocator_free(tsr_cuda_ctx_allocator(g_ctx), p, bytes);
}

static inline void *dev_copy(const void *host, size_t bytes) {
  void *p = dev_alloc(bytes);
  assert_int_equal(tsr_cuda_copy_to_device(g_ctx, p, host, bytes), TSR_OK);
  return p;
}

static inline float *dev_f(const float *host, int64_t n) {
  return dev_copy(host, (size_t)n * sizeof(float));
}

static inline int32_t *dev_i(const int32_t *host, int64_t n) {
  return dev_copy(host, (size_t)n * sizeof(int32_t));
}

/* Waits for the device (failing on any kept error) and copies n floats back. */
static inline void down(float *host, const float *dev, int64_t n) {
  assert_int_equal(tsr_cuda_ctx_sync(g_ctx), TSR_OK);
  assert_int_equal(tsr_cuda_copy_to_host(g_ctx, host, dev, (size_t)n * sizeof(float)), TSR_OK);
}

/* Copies the device result back and compares it with the CPU kernel's. */
static inline void check_dev(const char *what, const float *dev, const float *cpu, int64_t n,
                             double rtol, double atol) {
  float *got = test_alloc(n);
  double *want = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  assert_non_null(want);
  down(got, dev, n);
  for (int64_t i = 0; i < n; i++) want[i] = cpu[i];
  test_check_close(what, got, want, n, rtol, atol);
  free(want);
  free(got);
}

#endif
