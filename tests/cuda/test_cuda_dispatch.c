/* The kernel table and its CUDA loader, in every build: the CPU table is the kernels.h
 * functions themselves (so dispatch through it cannot change a result), and device 'cuda' is
 * either a working table or refused with the reason ("built without CUDA", "no CUDA device"). */
#include <string.h>

#include "test_kernels_util.h"
#include "tessera/device.h"
#include "tessera/tensor.h"
#if TSR_TEST_CUDA_BUILT
#include "tessera_cuda.h"
#endif

/* The table the core serves for a tensor of `alloc` (NULL: the CPU), as a rule reads it. */
static const tsr_kernel_table *table_of_new_tensor(tsr_allocator *alloc) {
  int64_t one = 1;
  tsr_tensor *x = NULL;
  assert_int_equal(tsr_tensor_new(alloc, TSR_F32, 1, &one, &x), TSR_OK);
  const tsr_kernel_table *t = tsr_kernel_table_of(x);
  tsr_tensor_free(x);
  assert_non_null(t);
  return t;
}

static void test_cpu_table_is_the_kernels(void **state) {
  (void)state;
  assert_int_equal(tsr_device_check((tsr_device){TSR_DEVICE_CPU, 0}), TSR_OK);
  const tsr_kernel_table *t = table_of_new_tensor(NULL);
  assert_int_equal(t->abi, TSR_KERNEL_TABLE_ABI);
  assert_int_equal(t->struct_size, sizeof(tsr_kernel_table));
  assert_int_equal(t->device, TSR_DEVICE_CPU);
  assert_true(t->gemm == tsr_kernel_gemm);
  assert_true(t->matmul_forward == tsr_kernel_matmul_forward);
  assert_true(t->matmul_backward == tsr_kernel_matmul_backward);
  assert_true(t->rmsnorm_forward == tsr_kernel_rmsnorm_forward);
  assert_true(t->rmsnorm_backward == tsr_kernel_rmsnorm_backward);
  assert_true(t->rope_tables == tsr_kernel_rope_tables);
  assert_true(t->rope_forward == tsr_kernel_rope_forward);
  assert_true(t->rope_backward == tsr_kernel_rope_backward);
  assert_true(t->blhd_to_bhld == tsr_kernel_blhd_to_bhld);
  assert_true(t->bhld_to_blhd == tsr_kernel_bhld_to_blhd);
  assert_true(t->swiglu_forward == tsr_kernel_swiglu_forward);
  assert_true(t->swiglu_backward == tsr_kernel_swiglu_backward);
  assert_true(t->embedding_forward == tsr_kernel_embedding_forward);
  assert_true(t->embedding_backward == tsr_kernel_embedding_backward);
  assert_true(t->cross_entropy == tsr_kernel_cross_entropy);
  assert_true(t->logits_row_max == tsr_kernel_logits_row_max);
  assert_true(t->logits_row_sumexp == tsr_kernel_logits_row_sumexp);
  assert_true(t->logits_target == tsr_kernel_logits_target);
  assert_true(t->cross_entropy_shard_backward == tsr_kernel_cross_entropy_shard_backward);
  assert_true(t->attention_forward == tsr_kernel_attention_forward);
  assert_true(t->attention_backward == tsr_kernel_attention_backward);
  assert_true(t->attention_forward_blhd == tsr_kernel_attention_forward_blhd);
  assert_true(t->attention_backward_blhd == tsr_kernel_attention_backward_blhd);
  assert_true(t->attention_merge == tsr_kernel_attention_merge);
  assert_true(t->adamw == tsr_kernel_adamw);
  assert_true(t->sum_squares == tsr_kernel_sum_squares);
  assert_true(t->global_norm == tsr_kernel_global_norm);
  assert_true(t->clip_coef == tsr_kernel_clip_coef);
  assert_true(t->scale == tsr_kernel_scale);
  assert_ptr_equal(table_of_new_tensor(NULL), t);
}

static void test_cuda_table_or_reason(void **state) {
  (void)state;
  const tsr_device cuda0 = {TSR_DEVICE_CUDA, 0};
  tsr_status st = tsr_device_check(cuda0);
#if TSR_TEST_CUDA_BUILT
  char why[256] = "";
  int devices = tsr_cuda_device_count(why, sizeof why);
  printf("CUDA devices: %d%s%s\n", devices, devices ? "" : ": ", devices ? "" : why);
  if (devices > 0) {
    assert_int_equal(st, TSR_OK);
    tsr_cuda_ctx *ctx = NULL;
    assert_int_equal(tsr_cuda_ctx_create(0, &ctx), TSR_OK);
    tsr_cuda_ctx_make_current(ctx);
    const tsr_kernel_table *t = table_of_new_tensor(tsr_cuda_ctx_allocator(ctx));
    assert_int_equal(t->device, TSR_DEVICE_CUDA);
    assert_string_equal(t->name, "cuda");
    assert_true(t->clip_coef == tsr_kernel_clip_coef);
    /* The table is opened once: a second tensor (another rank's) gets the same one. */
    assert_ptr_equal(table_of_new_tensor(tsr_cuda_ctx_allocator(ctx)), t);
    tsr_cuda_ctx_make_current(NULL);
    tsr_cuda_ctx_destroy(ctx);
  } else {
    assert_int_equal(st, TSR_ENOTSUP);
    assert_non_null(strstr(tsr_last_error(), "no CUDA device"));
  }
#else
  assert_int_equal(st, TSR_ENOTSUP);
  assert_non_null(strstr(tsr_last_error(), "built without CUDA"));
#endif
  /* The outcome is kept: a second rank asking gets the same answer. */
  tsr_clear_error();
  assert_int_equal(tsr_device_check(cuda0), st);
  if (st != TSR_OK)
    assert_non_null(
        strstr(tsr_last_error(), TSR_TEST_CUDA_BUILT ? "no CUDA device" : "built without CUDA"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_table_is_the_kernels),
      cmocka_unit_test(test_cuda_table_or_reason),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
