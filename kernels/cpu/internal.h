/* Helpers shared by the CPU kernel files; not part of the public interface. */
#ifndef TESSERA_KERNELS_CPU_INTERNAL_H
#define TESSERA_KERNELS_CPU_INTERNAL_H

#include <stdbool.h>
#include <math.h>
#include <stdint.h>

#include "tessera/kernels.h"

/* Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread of the calling
 * thread's budget (tsr_kernel_threads), never more chunks than `n / min_chunk`. The calling
 * thread runs the first chunk itself. Chunks must write disjoint memory. If a thread cannot be
 * started its chunk runs on the caller, so the result never depends on thread availability. */
typedef void (*tsr_range_fn)(void *ctx, int64_t begin, int64_t end);
void tsr_parallel_for(int64_t n, int64_t min_chunk, tsr_range_fn fn, void *ctx);

/* Hot loops are compiled twice where the compiler can: for x86-64-v3 (AVX2, FMA) and for the
 * baseline, picked at load time. Both give the same results: the sources contract nothing into
 * FMAs (ISO C mode) and reassociate nothing, so only the vector width differs (an explicit fmaf is
 * exact either way). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TSR_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TSR_VECTOR_CLONES
#endif

/* Lanes of the row reductions (softmax, cross-entropy): fixed, so that the order of the additions,
 * and so the result, is the same in both clones, on every machine and for any thread count, and
 * wide enough (two AVX2 vectors) for the compiler to vectorise them, where an in-order loop over a
 * row is a chain of dependent scalar operations. */
#define TSR_ROW_LANES 16

/* Largest of row[0..n). Inline, so that each clone of its caller compiles it at its own width. */
static inline float tsr_row_max(const float *restrict row, int n) {
  float mx[TSR_ROW_LANES];
  for (int k = 0; k < TSR_ROW_LANES; k++) mx[k] = -INFINITY;
  int j = 0;
  for (; j + TSR_ROW_LANES <= n; j += TSR_ROW_LANES)
    for (int k = 0; k < TSR_ROW_LANES; k++) mx[k] = row[j + k] > mx[k] ? row[j + k] : mx[k];
  float r = -INFINITY;
  for (; j < n; j++) r = row[j] > r ? row[j] : r;
  for (int k = 0; k < TSR_ROW_LANES; k++) r = mx[k] > r ? mx[k] : r;
  return r;
}

/* Kernel timing (tsr_kernel_profile_enable): tsr_profile_begin at the top of a public kernel,
 * tsr_profile_end with its kind and the value begin returned on every way out. */
int64_t tsr_profile_begin(void);
void tsr_profile_end(tsr_kernel_kind kind, int64_t t0);

/* CBLAS row-major sgemm without timing, for kernels that run GEMMs inside their own (timed) work,
 * possibly on helper threads. Same arguments as tsr_kernel_gemm. */
void tsr_gemm_raw(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                  bool trans_b, float alpha, float beta);

/* The same with explicit row strides (leading dimensions) of c, a and b. */
void tsr_gemm_strided(float *c, int64_t ldc, const float *a, int64_t lda, const float *b,
                      int64_t ldb, int M, int N, int K, bool trans_a, bool trans_b, float alpha,
                      float beta);

/* e^x in f32 for x <= 0 (larger x, +inf included, are clamped to 0), within 2 ulp of expf and 0
 * below -87.3 (including -inf); NaN gives NaN. Branch-free so that loops over it vectorise:
 * x = n·ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n put into the exponent bits.
 * The clamp is written so that NaN fails every comparison towards -87.3: n stays a small integer
 * and the exponent arithmetic never overflows (a NaN cast to int32 would). */
static inline float tsr_exp_neg(float x) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  const float shift = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
  float xc = x > -87.3f ? (x > 0.0f ? 0.0f : x) : -87.3f;
  float n = (xc * log2e + shift) - shift;
  float r = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = (p * r) * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } two_n = {.i = ((int32_t)n + 127) * (1 << 23)};
  return x < -87.3f ? 0.0f : (x == x ? y * two_n.f : x);
}

#endif
