/* Sparse mixture of experts: the router, the routed rows and the expert FFNs.
 *
 * The expert FFNs are GEMMs over each expert's rows; everything else is bookkeeping over at most
 * N * top_k rows. The order of every sum is fixed by the routed-row order (expert, then token), so
 * an expert-parallel run that moves rows between ranks and back adds the same numbers in the same
 * order as the 1-rank op.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tessera/kernels.h"

/* ---- router ---- */

void tsr_kernel_moe_router_forward(float *combine, float *probs, float *stats, const float *logits,
                                   int N, int E, int top_k, float scale) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t n = 0; n < N; n++) {
    const float *z = logits + n * E;
    float *p = probs + n * E, *c = combine + n * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++) {
      p[e] = expf(z[e] - mx);
      sum += p[e];
    }
    for (int e = 0; e < E; e++) {
      p[e] /= sum;
      c[e] = 0.0f;
    }
    /* top_k by repeated selection: the strict > keeps the lower index among equal p, as a stable
     * descending sort does; a selected expert is marked in c with -1 until renormalised */
    float kept = 0.0f;
    for (int j = 0; j < top_k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (c[e] == 0.0f && (best < 0 || p[e] > p[best])) best = e;
      c[best] = -1.0f;
      kept += p[best];
    }
    for (int e = 0; e < E; e++) {
      if (c[e] == 0.0f) continue;
      c[e] = p[e] / kept;
      stats[e] += scale;
    }
    for (int e = 0; e < E; e++) stats[E + e] += scale * p[e];
  }
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

void tsr_kernel_moe_router_backward(float *dlogits, const float *dcombine, const float *dstats,
                                    const float *probs, const float *combine, int N, int E,
                                    float scale) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t n = 0; n < N; n++) {
    const float *p = probs + n * E, *c = combine + n * E;
    const float *dc = dcombine ? dcombine + n * E : NULL;
    float *dz = dlogits + n * E;
    /* c_e = p_e / S over the selected set: dp_j = (dc_j - sum_i dc_i c_i) / S for selected j */
    float kept = 0.0f, dot = 0.0f;
    for (int e = 0; e < E; e++)
      if (c[e] != 0.0f) {
        kept += p[e];
        if (dc) dot += dc[e] * c[e];
      }
    float dp[E > 0 ? E : 1];
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) {
      float g = dstats ? scale * dstats[E + e] : 0.0f;
      if (dc && c[e] != 0.0f) g += (dc[e] - dot) / kept;
      dp[e] = g;
      pdp += p[e] * g;
    }
    for (int e = 0; e < E; e++) dz[e] += p[e] * (dp[e] - pdp);
  }
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

/* ---- routed rows ---- */

void tsr_kernel_moe_route(int64_t *offsets, int32_t *token, const float *combine, int N, int E) {
  for (int e = 0; e <= E; e++) offsets[e] = 0;
  for (int64_t n = 0; n < N; n++)
    for (int e = 0; e < E; e++) offsets[e + 1] += combine[n * E + e] != 0.0f;
  for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  /* offsets[e] serves as expert e's cursor, which ends at offsets[e + 1]'s value; a shift by one
   * then restores the starts, so the rows are placed in one pass with no scratch memory */
  for (int64_t n = 0; n < N; n++)
    for (int e = 0; e < E; e++)
      if (combine[n * E + e] != 0.0f) token[offsets[e]++] = (int32_t)n;
  for (int e = E; e > 0; e--) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

void tsr_kernel_moe_gather(float *xs, const float *x, const int32_t *token, int64_t M, int C) {
  for (int64_t m = 0; m < M; m++)
    memcpy(xs + m * C, x + (int64_t)token[m] * C, (size_t)C * sizeof *xs);
}

void tsr_kernel_moe_scatter_add(float *dx, const float *dxs, const int32_t *token, int64_t M,
                                int C) {
  for (int64_t m = 0; m < M; m++) {
    float *d = dx + (int64_t)token[m] * C;
    const float *s = dxs + m * C;
    for (int i = 0; i < C; i++) d[i] += s[i];
  }
}

void tsr_kernel_moe_combine(float *out, const float *y, const float *combine, const int32_t *token,
                            const int64_t *offsets, int E, int C) {
  for (int e = 0; e < E; e++)
    for (int64_t m = offsets[e]; m < offsets[e + 1]; m++) {
      float w = combine[(int64_t)token[m] * E + e];
      float *o = out + (int64_t)token[m] * C;
      const float *s = y + m * C;
      for (int i = 0; i < C; i++) o[i] += w * s[i];
    }
}

void tsr_kernel_moe_combine_backward(float *dy, float *dcombine, const float *dout, const float *y,
                                     const float *combine, const int32_t *token,
                                     const int64_t *offsets, int E, int C) {
  for (int e = 0; e < E; e++)
    for (int64_t m = offsets[e]; m < offsets[e + 1]; m++) {
      int64_t n = token[m];
      float w = combine[n * E + e];
      const float *g = dout + n * C, *s = y + m * C;
      float *d = dy + m * C;
      float dot = 0.0f;
      for (int i = 0; i < C; i++) {
        d[i] = w * g[i];
        dot += g[i] * s[i];
      }
      if (dcombine) dcombine[n * E + e] += dot;
    }
}

/* ---- expert FFNs ---- */

/* act (rows, F) = silu(h[:, :F]) * h[:, F:], h (rows, 2I) */
static void ffn_act(float *act, const float *h, int64_t rows, int F) {
  for (int64_t m = 0; m < rows; m++)
    tsr_kernel_swiglu_forward(act + m * F, h + m * 2 * F, h + m * 2 * F + F, F);
}

tsr_status tsr_kernel_moe_ffn_forward(float *out, float *h, const float *x, const float *w13,
                                      const float *w2, const int64_t *offsets, int E, int C,
                                      int F) {
  int64_t M = offsets[E];
  if (M == 0) return TSR_OK;
  float *act = malloc((size_t)M * (size_t)F * sizeof *act);
  if (!act)
    return TSR_ERROR(TSR_ENOMEM, "moe experts: no memory for %lld x %d activations", (long long)M,
                     F);
  for (int e = 0; e < E; e++) {
    int64_t m0 = offsets[e], rows = offsets[e + 1] - m0;
    if (rows == 0) continue;
    const float *we13 = w13 + (int64_t)e * 2 * F * C, *we2 = w2 + (int64_t)e * C * F;
    tsr_kernel_matmul_forward(h + m0 * 2 * F, x + m0 * C, we13, NULL, (int)rows, C, 2 * F);
    ffn_act(act + m0 * F, h + m0 * 2 * F, rows, F);
    tsr_kernel_matmul_forward(out + m0 * C, act + m0 * F, we2, NULL, (int)rows, F, C);
  }
  free(act);
  return TSR_OK;
}

tsr_status tsr_kernel_moe_ffn_backward(float *dx, float *dw13, float *dw2, const float *dout,
                                       const float *x, const float *h, const float *w13,
                                       const float *w2, const int64_t *offsets, int E, int C,
                                       int F) {
  int64_t M = offsets[E];
  if (M == 0) return TSR_OK;
  /* act (M, F), dact (M, F), dh (M, 2I) */
  float *act = malloc((size_t)M * (size_t)F * 4 * sizeof *act);
  if (!act)
    return TSR_ERROR(TSR_ENOMEM, "moe experts backward: no memory for %lld x %d scratch",
                     (long long)M, 4 * F);
  float *dact = act + M * F, *dh = dact + M * F;
  ffn_act(act, h, M, F);
  memset(dact, 0, (size_t)M * (size_t)F * 3 * sizeof *dact);
  for (int e = 0; e < E; e++) {
    int64_t m0 = offsets[e], rows = offsets[e + 1] - m0;
    if (rows == 0) continue;
    const float *we13 = w13 + (int64_t)e * 2 * F * C, *we2 = w2 + (int64_t)e * C * F;
    float *dwe13 = dw13 ? dw13 + (int64_t)e * 2 * F * C : NULL;
    float *dwe2 = dw2 ? dw2 + (int64_t)e * C * F : NULL;
    tsr_kernel_matmul_backward(dact + m0 * F, dwe2, NULL, dout + m0 * C, act + m0 * F, we2,
                               (int)rows, F, C);
    for (int64_t m = m0; m < m0 + rows; m++)
      tsr_kernel_swiglu_backward(dh + m * 2 * F, dh + m * 2 * F + F, dact + m * F, h + m * 2 * F,
                                 h + m * 2 * F + F, F);
    tsr_kernel_matmul_backward(dx ? dx + m0 * C : NULL, dwe13, NULL, dh + m0 * 2 * F, x + m0 * C,
                               we13, (int)rows, C, 2 * F);
  }
  free(act);
  return TSR_OK;
}
