/* Helpers shared by the kernel tests: deterministic random data, tolerance checks and the
 * central finite-difference gradient check. */
#ifndef TESSERA_TEST_KERNELS_UTIL_H
#define TESSERA_TEST_KERNELS_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <setjmp.h>
#include <cmocka.h>

/* Finite differences: the loss is evaluated in double from an f32 forward, the perturbation is
 * 1e-3, and an analytic gradient g passes against the numeric one n when
 * |g − n| <= FD_RTOL · max(|g|, |n|) + FD_ATOL. f32 rounding in the forward perturbs the loss by
 * about 1e-7 · sqrt(outputs), i.e. ~1e-4 after dividing by 2e-3, well inside these bounds. */
#define FD_EPS  1e-3f
#define FD_RTOL 1e-2
#define FD_ATOL 1e-3

/* splitmix64: deterministic across platforms, so failures reproduce. */
static inline uint64_t test_rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline float test_uniform(uint64_t *s, float lo, float hi) {
  double u = (double)(test_rng_next(s) >> 11) / 9007199254740992.0;
  return (float)(lo + (hi - lo) * u);
}

static inline void test_fill(float *x, int64_t n, uint64_t *s, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = test_uniform(s, lo, hi);
}

static inline float *test_alloc(int64_t n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  assert_non_null(p);
  return p;
}

/* Σ out · w in double: the scalar loss whose gradient with respect to out is w. */
static inline double test_weighted_sum(const float *out, const float *w, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)out[i] * w[i];
  return s;
}

/* Fails the test, printing the worst element, unless every got[i] is within
 * atol + rtol · |want[i]| of want[i]. */
static inline void test_check_close(const char *what, const float *got, const double *want,
                                    int64_t n, double rtol, double atol) {
  int64_t worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    double excess = err - (atol + rtol * fabs(want[i]));
    if (!(excess <= 0.0) && (worst < 0 || excess > worst_excess || isnan(excess))) {
      worst = i;
      worst_excess = excess;
    }
  }
  if (worst >= 0) {
    fail_msg("%s: element %lld is %.9g, expected %.9g (rtol %g, atol %g)", what, (long long)worst,
             (double)got[worst], want[worst], rtol, atol);
  }
}

/* Checks analytic[i] against the central difference of loss() with respect to x[i], for every i.
 * loss() must recompute the forward from x each time it is called. */
typedef double (*test_loss_fn)(void *ctx);

static inline void test_check_grad(const char *what, float *x, int64_t n, const float *analytic,
                                   test_loss_fn loss, void *ctx) {
  for (int64_t i = 0; i < n; i++) {
    float x0 = x[i];
    float xp = x0 + FD_EPS, xm = x0 - FD_EPS;
    x[i] = xp;
    double lp = loss(ctx);
    x[i] = xm;
    double lm = loss(ctx);
    x[i] = x0;
    /* The step actually taken, after rounding x ± eps to f32. */
    double numeric = (lp - lm) / ((double)xp - (double)xm);
    double a = analytic[i];
    double tol = FD_RTOL * fmax(fabs(a), fabs(numeric)) + FD_ATOL;
    if (!(fabs(a - numeric) <= tol)) {
      fail_msg("%s: d/dx[%lld] analytic %.7g vs numeric %.7g (tol %.3g)", what, (long long)i, a,
               numeric, tol);
    }
  }
}

#endif
