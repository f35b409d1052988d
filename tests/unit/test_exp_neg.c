/* tsr_exp_neg (kernels/cpu/internal.h) on every kind of float, NaN and the infinities included.
 * Built with UBSan where the compiler has it (tests/CMakeLists.txt): attention and SwiGLU run it
 * on whatever the model holds, and NaN once overflowed a signed int in its exponent arithmetic. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "../../kernels/cpu/internal.h"

static float through(float x) {
  volatile float v = x; /* no constant folding: the code runs as the kernels run it */
  return tsr_exp_neg(v);
}

static void test_non_finite(void **state) {
  (void)state;
  assert_true(isnan(through(NAN)));
  assert_true(isnan(through(-NAN)));
  assert_true(through(-INFINITY) == 0.0f);
  assert_true(through(INFINITY) == 1.0f); /* larger x are clamped to 0 */
  assert_true(through(-FLT_MAX) == 0.0f);
  assert_true(through(FLT_MAX) == 1.0f);
  assert_true(through(0.0f) == 1.0f);
  assert_true(through(-0.0f) == 1.0f);
  assert_true(through(-87.4f) == 0.0f);
}

static int32_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return ia > ib ? ia - ib : ib - ia;
}

static void test_against_expf(void **state) {
  (void)state;
  for (int i = 0; i <= 87000; i++) {
    float x = -(float)i * 1e-3f;
    float want = expf(x), got = through(x);
    if (want < FLT_MIN) continue; /* subnormal results: the flush below -87.3 is documented */
    if (ulps(got, want) > 2) fail_msg("exp(%g) = %.9g, expf gives %.9g", (double)x, got, want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_non_finite),
      cmocka_unit_test(test_against_expf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
