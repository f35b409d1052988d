/* Tensors: dtype conversions, views, copies, cat, errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/tensor.h"

static void test_dtype_sizes_and_names(void **state) {
  assert_int_equal(tsr_dtype_size(TSR_F32), 4);
  assert_int_equal(tsr_dtype_size(TSR_BF16), 2);
  assert_int_equal(tsr_dtype_size(TSR_F16), 2);
  assert_int_equal(tsr_dtype_size(TSR_I32), 4);
  assert_int_equal(tsr_dtype_size(TSR_I64), 8);
  assert_string_equal(tsr_dtype_name(TSR_BF16), "bf16");
  assert_string_equal(tsr_dtype_name((tsr_dtype)99), "?");
}

static void test_half_conversions(void **state) {
  /* Every integer a half type holds exactly survives the round trip. */
  for (int i = -256; i <= 256; i++) assert_true(tsr_bf16_to_f32(tsr_f32_to_bf16((float)i)) == i);
  for (int i = -2048; i <= 2048; i++) assert_true(tsr_f16_to_f32(tsr_f32_to_f16((float)i)) == i);
  /* Round to nearest even: 257 lies halfway between bf16 256 and 258 -> 256; 259 -> 260. */
  assert_true(tsr_bf16_to_f32(tsr_f32_to_bf16(257.0f)) == 256.0f);
  assert_true(tsr_bf16_to_f32(tsr_f32_to_bf16(259.0f)) == 260.0f);
  assert_true(tsr_f16_to_f32(tsr_f32_to_f16(2049.0f)) == 2048.0f);
  assert_true(tsr_f16_to_f32(tsr_f32_to_f16(2051.0f)) == 2052.0f);
  /* f16 range, subnormals and specials. */
  assert_true(isinf(tsr_f16_to_f32(tsr_f32_to_f16(70000.0f))));
  assert_true(tsr_f16_to_f32(tsr_f32_to_f16(65504.0f)) == 65504.0f);
  float sub = ldexpf(1.0f, -24);
  assert_true(tsr_f16_to_f32(tsr_f32_to_f16(sub)) == sub);
  assert_true(tsr_f16_to_f32(tsr_f32_to_f16(3 * sub)) == 3 * sub);
  assert_true(isnan(tsr_f16_to_f32(tsr_f32_to_f16(NAN))));
  assert_true(isnan(tsr_bf16_to_f32(tsr_f32_to_bf16(NAN))));
  assert_true(tsr_bf16_to_f32(tsr_f32_to_bf16(0.1f)) == 0.10009765625f);
}

static void test_new_is_zero_and_contiguous(void **state) {
  int64_t shape[3] = {2, 3, 4};
  tsr_tensor *t;
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 3, shape, &t), TSR_OK);
  assert_int_equal(tsr_tensor_numel(t), 24);
  assert_int_equal(tsr_tensor_nbytes(t), 96);
  assert_true(tsr_tensor_is_contiguous(t));
  assert_int_equal(t->stride[0], 12);
  assert_int_equal(t->stride[2], 1);
  const float *p = tsr_tensor_data(t);
  for (int i = 0; i < 24; i++) assert_true(p[i] == 0.0f);
  tsr_tensor_free(t);
}

static void test_narrow_permute_reshape_views(void **state) {
  int64_t shape[2] = {4, 6};
  tsr_tensor *t, *n, *p, *r, *c;
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, shape, &t), TSR_OK);
  tsr_tensor_fill_arange(t, 1, 0);
  assert_int_equal(tsr_tensor_narrow(t, 1, 2, 3, &n), TSR_OK);
  assert_false(tsr_tensor_is_contiguous(n));
  int64_t idx[2] = {1, 0};
  assert_true(tsr_tensor_get(n, idx) == 8.0); /* row 1, col 2 */
  /* A view writes through to the storage it shares. */
  tsr_tensor_set(n, idx, -5);
  int64_t orig[2] = {1, 2};
  assert_true(tsr_tensor_get(t, orig) == -5.0);
  int perm[2] = {1, 0};
  assert_int_equal(tsr_tensor_permute(t, perm, &p), TSR_OK);
  assert_int_equal(p->shape[0], 6);
  int64_t pi[2] = {5, 3};
  assert_true(tsr_tensor_get(p, pi) == 23.0);
  int64_t rs[3] = {2, -1, 3};
  assert_int_equal(tsr_tensor_reshape(t, 3, rs, &r), TSR_OK);
  assert_int_equal(r->shape[1], 4);
  /* A strided view cannot be reshaped without a copy. */
  assert_int_equal(tsr_tensor_reshape(n, 3, rs, &c), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "clone it first"));
  assert_int_equal(tsr_tensor_clone(n, &c), TSR_OK);
  assert_true(tsr_tensor_is_contiguous(c));
  assert_true(tsr_tensor_equal(c, n));
  tsr_tensor_free(c);
  tsr_tensor_free(r);
  tsr_tensor_free(p);
  tsr_tensor_free(n);
  /* The storage outlives the first view freed. */
  tsr_tensor_free(t);
}

static void test_cat_and_copy(void **state) {
  int64_t a_shape[2] = {2, 3}, b_shape[2] = {2, 1};
  tsr_tensor *a, *b, *out, *back;
  assert_int_equal(tsr_tensor_new(NULL, TSR_I64, 2, a_shape, &a), TSR_OK);
  assert_int_equal(tsr_tensor_new(NULL, TSR_I64, 2, b_shape, &b), TSR_OK);
  tsr_tensor_fill_arange(a, 1, 0);
  tsr_tensor_fill_arange(b, 1, 100);
  tsr_tensor *parts[2] = {a, b};
  assert_int_equal(tsr_tensor_cat(parts, 2, 1, &out), TSR_OK);
  assert_int_equal(out->shape[1], 4);
  int64_t i13[2] = {1, 3}, i12[2] = {1, 2};
  assert_true(tsr_tensor_get(out, i13) == 101.0);
  assert_true(tsr_tensor_get(out, i12) == 5.0);
  assert_int_equal(tsr_tensor_narrow(out, 1, 0, 3, &back), TSR_OK);
  assert_true(tsr_tensor_equal(back, a));
  tsr_tensor_free(back);
  /* Mismatched parts name the offending part. */
  assert_int_equal(tsr_tensor_cat(parts, 2, 0, &back), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "part 1"));
  /* copy refuses dtype and shape mismatches. */
  tsr_tensor *f;
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, a_shape, &f), TSR_OK);
  assert_int_equal(tsr_tensor_copy(f, a), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "tsr_tensor_cast"));
  assert_int_equal(tsr_tensor_copy(b, a), TSR_EINVAL);
  tsr_tensor *cast;
  assert_int_equal(tsr_tensor_cast(a, TSR_F32, &cast), TSR_OK);
  assert_int_equal(tsr_tensor_copy(f, cast), TSR_OK);
  int64_t i02[2] = {0, 2};
  assert_true(tsr_tensor_get(f, i02) == 2.0);
  tsr_tensor_free(cast);
  tsr_tensor_free(f);
  tsr_tensor_free(out);
  tsr_tensor_free(a);
  tsr_tensor_free(b);
}

static void test_bad_shapes_rejected(void **state) {
  int64_t neg[2] = {2, -1}, big[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  tsr_tensor *t;
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, neg, &t), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "negative"));
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 9, big, &t), TSR_EINVAL);
  int64_t ok[1] = {4};
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 1, ok, &t), TSR_OK);
  tsr_tensor *v;
  assert_int_equal(tsr_tensor_narrow(t, 0, 3, 2, &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "out of range"));
  tsr_tensor_free(t);
}

static void test_allocator_counts(void **state) {
  tsr_allocator a;
  tsr_allocator_init_cpu(&a);
  int64_t shape[1] = {1000};
  tsr_tensor *t, *v;
  assert_int_equal(tsr_tensor_new(&a, TSR_F32, 1, shape, &t), TSR_OK);
  assert_int_equal(a.bytes_in_use, 4000);
  assert_int_equal(tsr_tensor_narrow(t, 0, 0, 10, &v), TSR_OK);
  tsr_tensor_free(t);
  assert_int_equal(a.bytes_in_use, 4000); /* the view keeps the storage alive */
  tsr_tensor_free(v);
  assert_int_equal(a.bytes_in_use, 0);
  assert_int_equal(a.peak_bytes, 4000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_sizes_and_names),
      cmocka_unit_test(test_half_conversions),
      cmocka_unit_test(test_new_is_zero_and_contiguous),
      cmocka_unit_test(test_narrow_permute_reshape_views),
      cmocka_unit_test(test_cat_and_copy),
      cmocka_unit_test(test_bad_shapes_rejected),
      cmocka_unit_test(test_allocator_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
