/* Softmax cross-entropy: the fused single-device loss and the pieces of a vocabulary-parallel one.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "internal.h"
#include "tessera/kernels.h"

/* the row maximum at this file's clone widths (tsr_row_max is inline) */
TSR_VECTOR_CLONES static float row_max(const float *restrict row, int V) {
  return tsr_row_max(row, V);
}

TSR_VECTOR_CLONES static double row_sumexp(const float *restrict row, int V, float m) {
  double s[TSR_ROW_LANES] = {0};
  int j = 0;
  for (; j + TSR_ROW_LANES <= V; j += TSR_ROW_LANES)
    for (int k = 0; k < TSR_ROW_LANES; k++) s[k] += (double)tsr_exp_neg(row[j + k] - m);
  double r = 0.0;
  for (; j < V; j++) r += (double)tsr_exp_neg(row[j] - m);
  for (int k = 0; k < TSR_ROW_LANES; k++) r += s[k];
  return r;
}

/* drow += scale · (softmax(row) − onehot(t)) with softmax = exp(row − m) / sumexp, m the row max:
 * the exponent's argument stays exact-ish in f32 and 1/sumexp is folded into one coefficient
 * (a few ulp in all, as an f32 softmax). t < 0 means no one-hot column. */
TSR_VECTOR_CLONES static void softmax_grad_row(float *restrict drow, const float *restrict row,
                                               int V, float m, double sumexp, int64_t t,
                                               double scale) {
  float coef = (float)(scale / sumexp);
  for (int j = 0; j < V; j++) drow[j] += coef * tsr_exp_neg(row[j] - m);
  if (t >= 0) drow[t] -= (float)scale;
}

typedef struct ce_args {
  double *row_loss; /* (N) lse − target logit, 0 for ignored rows */
  float *dlogits;
  const float *logits;
  const int32_t *targets;
  int V;
  double scale;
} ce_args;

static void ce_rows(void *ctx, int64_t begin, int64_t end) {
  ce_args *a = ctx;
  for (int64_t i = begin; i < end; i++) {
    int t = a->targets[i];
    a->row_loss[i] = 0.0;
    if (t == TSR_IGNORE_INDEX) continue;
    const float *row = a->logits + i * a->V;
    float m = row_max(row, a->V);
    double se = row_sumexp(row, a->V, m);
    a->row_loss[i] = m + log(se) - row[t];
    if (a->dlogits != NULL) softmax_grad_row(a->dlogits + i * a->V, row, a->V, m, se, t, a->scale);
  }
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
  double *row_loss = malloc(sizeof(double) * (size_t)(N > 0 ? N : 1));
  if (row_loss == NULL) return TSR_ERROR(TSR_ENOMEM, "cross_entropy: out of memory for %d rows", N);
  if (n_valid != NULL) *n_valid = count;
  ce_args a = {
      row_loss, dlogits,
      logits,   targets,
      V,        count > 0 ? (double)dloss / count : 0.0}; /* no valid row: nothing to scale */
  /* Rows are independent; ~2·V exponentials each, so a few rows per thread are worth it. */
  tsr_parallel_for(N, 1 + (1 << 16) / (V > 0 ? V : 1), ce_rows, &a);
  double total = 0.0;
  for (int i = 0; i < N; i++) total += row_loss[i]; /* in row order: thread-count independent */
  free(row_loss);
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
    bool here = local >= 0 && local < Vl;
    softmax_grad_row(dlogits + i * Vl, logits + i * Vl, Vl, rmax[i], (double)sumexp[i],
                     here ? local : -1, scale);
  }
  tsr_profile_end(TSR_KERNEL_LOSS, t0);
}
