/* Softmax cross-entropy: the fused single-device loss and the pieces of a vocabulary-parallel one.
 */
#include <math.h>
#include <stddef.h>

#include "internal.h"
#include "tessera/kernels.h"

static float row_max(const float *row, int V) {
  float m = -INFINITY;
  for (int j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
  return m;
}

/* Σ exp(row − m) in double: for a large vocabulary most terms are tiny and an f32 running sum
 * would drop them. */
static double row_sumexp(const float *row, int V, float m) {
  double s = 0.0;
  for (int j = 0; j < V; j++) s += exp((double)row[j] - m);
  return s;
}

static tsr_status cross_entropy_impl(float *loss, int *n_valid, float *dlogits, const float *logits,
                                     const int32_t *targets, int N, int V, float dloss) {
  int count = 0;
  for (int i = 0; i < N; i++) {
    if (targets[i] == TSR_IGNORE_INDEX) continue;
    if (targets[i] < 0 || targets[i] >= V) {
      return TSR_ERROR(TSR_EINVAL,
                       "cross_entropy: target %d at position %d is outside [0, %d) and is not the "
                       "ignore index %d",
                       (int)targets[i], i, V, TSR_IGNORE_INDEX);
    }
    count++;
  }
  if (n_valid != NULL) *n_valid = count;

  double total = 0.0;
  double scale = count > 0 ? (double)dloss / count : 0.0; /* no valid row: nothing to scale */
  for (int64_t i = 0; i < N; i++) {
    int t = targets[i];
    if (t == TSR_IGNORE_INDEX) continue;
    const float *row = logits + i * V;
    float m = row_max(row, V);
    double lse = m + log(row_sumexp(row, V, m));
    total += lse - row[t];
    if (dlogits != NULL) {
      float *drow = dlogits + i * V;
      for (int j = 0; j < V; j++) {
        double p = exp((double)row[j] - lse);
        drow[j] += (float)(scale * (p - (j == t ? 1.0 : 0.0)));
      }
    }
  }
  *loss = count > 0 ? (float)(total / count) : NAN;
  return TSR_OK;
}

tsr_status tsr_kernel_cross_entropy(float *loss, int *n_valid, float *dlogits, const float *logits,
                                    const int32_t *targets, int N, int V, float dloss) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = cross_entropy_impl(loss, n_valid, dlogits, logits, targets, N, V, dloss);
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
  return r;
}

void tsr_kernel_logits_row_max(float *out, const float *logits, int N, int Vl) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t i = 0; i < N; i++) out[i] = row_max(logits + i * Vl, Vl);
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
}

void tsr_kernel_logits_row_sumexp(float *sumexp, const float *logits, const float *rmax, int N,
                                  int Vl) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t i = 0; i < N; i++) sumexp[i] = (float)row_sumexp(logits + i * Vl, Vl, rmax[i]);
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
}

void tsr_kernel_logits_target(float *target_logit, const float *logits, const int32_t *targets,
                              int N, int Vl, int vocab_start) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t i = 0; i < N; i++) {
    int64_t local = (int64_t)targets[i] - vocab_start;
    bool here = targets[i] != TSR_IGNORE_INDEX && local >= 0 && local < Vl;
    target_logit[i] = here ? logits[i * Vl + local] : 0.0f;
  }
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
}

void tsr_kernel_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                             const int32_t *targets, const float *rmax,
                                             const float *sumexp, int N, int Vl, int vocab_start,
                                             float scale) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t i = 0; i < N; i++) {
    if (targets[i] == TSR_IGNORE_INDEX) continue;
    int64_t local = (int64_t)targets[i] - vocab_start;
    double lse = rmax[i] + log((double)sumexp[i]);
    const float *row = logits + i * Vl;
    float *drow = dlogits + i * Vl;
    for (int64_t j = 0; j < Vl; j++) {
      double p = exp((double)row[j] - lse);
      drow[j] += (float)(scale * (p - (j == local ? 1.0 : 0.0)));
    }
  }
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
}
