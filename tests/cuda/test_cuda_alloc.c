/* The caching device allocator and the stream/event helpers of the CUDA context. Skips with the
 * reason when the machine has no CUDA device. */
#include <cuda_runtime_api.h>

#include "cuda_test_util.h"

/* One "training step" worth of allocations: a mix of small and large blocks, freed in an order
 * unlike the allocation order. */
static const size_t step_sizes[] = {4, 1000, 4096, 70000, 1 << 20, (3 << 20) + 5, 12345678, 512};
#define STEP_N (sizeof step_sizes / sizeof step_sizes[0])

static void run_step(void *ptrs[STEP_N]) {
  for (size_t i = 0; i < STEP_N; i++) {
    ptrs[i] = dev_alloc(step_sizes[i]);
    assert_int_equal((uintptr_t)ptrs[i] % 64, 0);
    for (size_t j = 0; j < i; j++) assert_ptr_not_equal(ptrs[i], ptrs[j]);
  }
  for (size_t i = STEP_N; i-- > 0;) dev_free(ptrs[(i * 5) % STEP_N], step_sizes[(i * 5) % STEP_N]);
}

static void test_steady_state_reuses(void **state) {
  (void)state;
  void *ptrs[STEP_N];
  run_step(ptrs);
  tsr_cuda_alloc_stats first = tsr_cuda_ctx_alloc_stats(g_ctx);
  assert_int_equal(first.device_mallocs, STEP_N);
  assert_int_equal(first.cached_bytes, first.reserved_bytes);
  for (int step = 0; step < 5; step++) run_step(ptrs);
  tsr_cuda_alloc_stats later = tsr_cuda_ctx_alloc_stats(g_ctx);
  /* No cudaMalloc after the first step: every block came from the cache. */
  assert_int_equal(later.device_mallocs, first.device_mallocs);
  assert_int_equal(later.cache_hits, first.cache_hits + 5 * STEP_N);
  assert_int_equal(later.reserved_bytes, first.reserved_bytes);
  /* The core's counters see the requested bytes come and go. */
  assert_int_equal(tsr_cuda_ctx_allocator(g_ctx)->bytes_in_use, 0);
  assert_true(tsr_cuda_ctx_allocator(g_ctx)->peak_bytes >= 12345678);
  assert_int_equal(tsr_cuda_ctx_release_cache(g_ctx), TSR_OK);
  tsr_cuda_alloc_stats empty = tsr_cuda_ctx_alloc_stats(g_ctx);
  assert_int_equal(empty.cached_bytes, 0);
  assert_int_equal(empty.reserved_bytes, 0);
}

static void test_size_classes(void **state) {
  (void)state;
  /* 600 and 1000 bytes round to the same 1 KiB class; 2000 does not. */
  void *a = dev_alloc(600);
  dev_free(a, 600);
  void *b = dev_alloc(1000);
  assert_ptr_equal(a, b);
  void *c = dev_alloc(2000);
  assert_ptr_not_equal(c, b);
  dev_free(b, 1000);
  dev_free(c, 2000);
  assert_int_equal(tsr_cuda_ctx_release_cache(g_ctx), TSR_OK);
}

static void test_streams_ordered_by_events(void **state) {
  (void)state;
  const int64_t n = 1 << 22;
  float *host = test_alloc(n), *back = test_alloc(n);
  for (int64_t i = 0; i < n; i++) host[i] = (float)(i % 1000);
  float *x = dev_f(host, n), *y = dev_alloc((size_t)n * 4);
  /* Compute writes x, comm copies it to y, compute scales y: correct only if both waits hold. */
  const tsr_kernel_table *gpu = NULL;
  assert_int_equal(core_kernel_table(tsr_cuda_ctx_allocator(g_ctx), &gpu), TSR_OK);
  gpu->scale(x, n, 2.0f);
  assert_int_equal(tsr_cuda_ctx_comm_waits_compute(g_ctx), TSR_OK);
  assert_int_equal(cudaMemcpyAsync(y, x, (size_t)n * 4, cudaMemcpyDeviceToDevice,
                                   (cudaStream_t)tsr_cuda_ctx_comm_stream(g_ctx)),
                   cudaSuccess);
  assert_int_equal(tsr_cuda_ctx_compute_waits_comm(g_ctx), TSR_OK);
  gpu->scale(y, n, 0.5f);
  down(back, y, n);
  assert_memory_equal(back, host, (size_t)n * 4);
  dev_free(x, (size_t)n * 4);
  dev_free(y, (size_t)n * 4);
  free(host);
  free(back);
}

/* Ops that take scratch from the allocator (attention through GEMMs, both precisions) call
 * cudaMalloc only the first time a shape is seen. */
static void test_ops_steady_state(void **state) {
  (void)state;
  const int B = 2, Hq = 4, Hkv = 2, L = 64, D = 32;
  const int64_t nq = (int64_t)B * Hq * L * D, nk = (int64_t)B * Hkv * L * D,
                nl = (int64_t)B * Hq * L;
  float *host = test_alloc(nq);
  for (int64_t i = 0; i < nq; i++) host[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  float *q = dev_f(host, nq), *k = dev_f(host, nk), *v = dev_f(host, nk), *g = dev_f(host, nq);
  float *out = dev_alloc((size_t)nq * 4), *lse = dev_alloc((size_t)nl * 4);
  float *dq = dev_f(host, nq), *dk = dev_f(host, nk), *dv = dev_f(host, nk);
  uint64_t mallocs = 0;
  for (int round = 0; round < 3; round++) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
      assert_int_equal(tsr_cuda_attention_gemm_forward(g_ctx, out, lse, q, k, v, B, Hq, Hkv, L, L,
                                                       D, true, bf16),
                       TSR_OK);
      assert_int_equal(tsr_cuda_attention_gemm_backward(g_ctx, dq, dk, dv, g, q, k, v, out, lse, B,
                                                        Hq, Hkv, L, L, D, true, bf16),
                       TSR_OK);
    }
    assert_int_equal(tsr_cuda_ctx_sync(g_ctx), TSR_OK);
    tsr_cuda_alloc_stats st = tsr_cuda_ctx_alloc_stats(g_ctx);
    if (round == 0)
      mallocs = st.device_mallocs;
    else
      assert_int_equal(st.device_mallocs, mallocs);
  }
  dev_free(q, nq * 4), dev_free(k, nk * 4), dev_free(v, nk * 4), dev_free(g, nq * 4);
  dev_free(out, nq * 4), dev_free(lse, nl * 4);
  dev_free(dq, nq * 4), dev_free(dk, nk * 4), dev_free(dv, nk * 4);
  free(host);
}

static void test_errors_name_the_device(void **state) {
  (void)state;
  tsr_cuda_ctx *other = NULL;
  assert_int_equal(tsr_cuda_ctx_create(4096, &other), TSR_EINVAL);
  assert_null(other);
  assert_non_null(strstr(tsr_last_error(), "CUDA device 4096 does not exist"));
}

int main(void) {
  int rc = cuda_test_setup("test_cuda_alloc");
  if (rc) return rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steady_state_reuses),       cmocka_unit_test(test_size_classes),
      cmocka_unit_test(test_streams_ordered_by_events), cmocka_unit_test(test_ops_steady_state),
      cmocka_unit_test(test_errors_name_the_device),
  };
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  tsr_cuda_ctx_destroy(g_ctx);
  return rc;
}
