/* `tessera conform`: the mixture-of-experts ops at L2, their inputs and float64 references.
 *
 * The ops are those of tessera/ops.h: moe_router (logits (B, L, E) -> combine (B, L, E) and
 * stats (2, E)), moe_experts (x (B, L, C), combine (B, L, E), w13 (E, 2I, C), w2 (E, C, I) ->
 * (B, L, C)) and moe_aux_loss (stats (2, E) -> ()).
 *
 * Inputs. The router's logits are random, with two kinds of ties on purpose (every fifth token
 * has all its experts equal, another fifth has its top_k-th largest logit repeated at the lowest
 * expert not selected), so that the rule "ties go to the lower index" decides which experts a
 * token uses; and, in the starved variant, the logits of the last experts are lowered by 8 so that
 * no token selects them (an expert-parallel rank whose experts receive no row). The experts op
 * takes a combine made from such logits on the host by the rule the router documents (softmax,
 * top_k with ties to the lower index, renormalised), so that each token has exactly top_k
 * nonzero weights summing to 1, as the model gives it; the aux loss takes the stats of the same
 * routing (row 0 the fraction of tokens choosing each expert, row 1 the mean probability).
 *
 * References, in double from the same f32 values:
 *   router   combine as above, stats with scale 1 / tokens; the logits' gradient through both
 *            outputs: dp_j = [j selected] (dc_j - sum_i dc_i c_i) / K + scale ds[1, j], where K
 *            is the sum of the selected p, then dz = p (dp - sum p dp); row 0 of the stats has no
 *            gradient;
 *   experts  out[n] = sum over e with combine[n, e] != 0 of combine[n, e] w2[e] (silu(w1 x) *
 *            w3 x), w1 = w13[e, :I], w3 = w13[e, I:], and the gradients of x, w13, w2 and
 *            combine. The combine's gradient is defined at its nonzero entries only: a zero there
 *            means "not routed" (making it nonzero routes the token, a different computation),
 *            so the reference marks those entries undefined and they are not compared;
 *   aux      out = scale sum_e s[0, e] s[1, e], gradient scale s[0, e] into row 1, 0 into row 0.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"
#include "tessera/ops.h"

bool cf_moe_op(const char *op) {
  return !strcmp(op, TSR_OP_MOE_ROUTER) || !strcmp(op, TSR_OP_MOE_EXPERTS) ||
         !strcmp(op, TSR_OP_MOE_AUX_LOSS);
}

float cf_moe_aux_scale(int64_t E) {
  return 0.02f * (float)E; /* router_aux_loss_coef 0.02 times E over one block */
}

/* The router on logits z (N, E) in double: p the softmax, sel the top_k experts of largest p
 * (ties to the lower index), c those p renormalised and 0 elsewhere; K (N) the selected p's sum.
 * Any of c, K may be NULL. */
static void route64(const double *z, int64_t N, int64_t E, int top_k, double *p, double *c,
                    unsigned char *sel, double *K) {
  for (int64_t n = 0; n < N; n++) {
    const double *zn = z + n * E;
    double *pn = p + n * E, mx = -INFINITY, sum = 0, kept = 0;
    unsigned char *sn = sel + n * E;
    for (int64_t e = 0; e < E; e++) mx = zn[e] > mx ? zn[e] : mx;
    for (int64_t e = 0; e < E; e++) sum += pn[e] = exp(zn[e] - mx);
    for (int64_t e = 0; e < E; e++) pn[e] /= sum, sn[e] = 0;
    for (int j = 0; j < top_k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (!sn[e] && (best < 0 || pn[e] > pn[best])) best = e;
      if (best < 0) break; /* top_k > E: no more experts */
      sn[best] = 1;
      kept += pn[best];
    }
    for (int64_t e = 0; c && e < E; e++) c[n * E + e] = sn[e] ? pn[e] / kept : 0.0;
    if (K) K[n] = kept;
  }
}

/* Logits (N, E) with the ties and the starved experts of the header, from random values. */
static void make_logits(float *z, int64_t N, int64_t E, int top_k, int64_t starved) {
  int64_t live = E - starved; /* experts 0 ..< live can be chosen */
  double p[64], zd[64];
  unsigned char sel[64];
  for (int64_t n = 0; n < N; n++) {
    float *zn = z + n * E;
    for (int64_t e = live; e < E; e++) zn[e] -= 8.0f;
    if (n % 5 == 1)
      for (int64_t e = 0; e < live; e++) zn[e] = 0.25f;
    if (n % 5 != 3 || live <= top_k || E > 64) continue;
    for (int64_t e = 0; e < E; e++) zd[e] = zn[e];
    route64(zd, 1, E, top_k, p, NULL, sel, NULL);
    /* the top_k-th largest, and the lowest-index expert left out: give it the same logit */
    int64_t last = -1, out = -1;
    for (int64_t e = 0; e < E; e++)
      if (sel[e] && (last < 0 || p[e] <= p[last])) last = e;
    for (int64_t e = 0; e < live && out < 0; e++)
      if (!sel[e]) out = e;
    if (last >= 0 && out >= 0) zn[out] = zn[last];
  }
}

static double *as_f64(const float *f, int64_t n) {
  double *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
  for (int64_t i = 0; d && i < n; i++) d[i] = f[i];
  return d;
}

tsr_status cf_moe_inputs(const char *op, const cf_moe_shape *s, tsr_tensor **in, int *nin) {
  int64_t N = s->B * s->L, E = s->E;
  int64_t lg[3] = {s->B, s->L, E}, x3[3] = {s->B, s->L, s->C};
  int64_t a[3] = {E, 2 * s->I, s->C}, b[3] = {E, s->C, s->I}, st2[2] = {2, E};
  tsr_tensor *logits = NULL;
  double *z = NULL, *p = NULL, *c = NULL;
  unsigned char *sel = NULL;
  tsr_status st = TSR_OK;
  *nin = 0;
  TSR_CHECK(cf_rand_tensor(3, lg, 20, &logits));
  make_logits(tsr_tensor_data(logits), N, E, s->top_k, s->starved);
  if (!strcmp(op, TSR_OP_MOE_ROUTER)) {
    in[0] = logits;
    *nin = 1;
    return TSR_OK;
  }
  z = as_f64(tsr_tensor_data(logits), N * E);
  p = calloc((size_t)(N * E), sizeof *p);
  c = calloc((size_t)(N * E), sizeof *c);
  sel = calloc((size_t)(N * E), 1);
  if (!z || !p || !c || !sel) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory making the moe inputs");
    goto cleanup;
  }
  route64(z, N, E, s->top_k, p, c, sel, NULL);
  if (!strcmp(op, TSR_OP_MOE_EXPERTS)) {
    *nin = 4;
    TSR_CHECK_GOTO(cf_rand_tensor(3, x3, 21, &in[0]), st);
    TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 3, lg, &in[1]), st);
    float *cf = tsr_tensor_data(in[1]);
    for (int64_t i = 0; i < N * E; i++) cf[i] = (float)c[i];
    TSR_CHECK_GOTO(cf_rand_tensor(3, a, 22, &in[2]), st);
    TSR_CHECK_GOTO(cf_rand_tensor(3, b, 23, &in[3]), st);
  } else if (!strcmp(op, TSR_OP_MOE_AUX_LOSS)) {
    *nin = 1;
    TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 2, st2, &in[0]), st);
    float *sv = tsr_tensor_data(in[0]);
    for (int64_t e = 0; e < E; e++) {
      double s0 = 0, s1 = 0;
      for (int64_t n = 0; n < N; n++) s0 += sel[n * E + e], s1 += p[n * E + e];
      sv[e] = (float)(s0 / (double)N);
      sv[E + e] = (float)(s1 / (double)N);
    }
  } else {
    st = TSR_ERROR(TSR_ENOTSUP, "the suite has no generator for op '%s'", op);
  }
cleanup:
  tsr_tensor_free(logits);
  free(z);
  free(p);
  free(c);
  free(sel);
  return st;
}

/* ---- float64 references ---- */

static tsr_status router64(const double *z, int64_t N, int64_t E, int top_k, const double *gc,
                           const double *gs, cf_ref64 *r) {
  double *p = calloc((size_t)(N * E), sizeof *p), *K = calloc((size_t)N, sizeof *K);
  double *dp = calloc((size_t)E, sizeof *dp);
  unsigned char *sel = calloc((size_t)(N * E), 1);
  r->nout2 = 2 * E;
  r->out2 = calloc((size_t)r->nout2, sizeof *r->out2);
  if (!p || !K || !dp || !sel || !r->out2) {
    free(p), free(K), free(dp), free(sel);
    return TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
  }
  route64(z, N, E, top_k, p, r->out, sel, K);
  double scale = 1.0 / (double)N, *dz = r->grads[0];
  for (int64_t n = 0; n < N; n++) {
    const double *pn = p + n * E, *cn = r->out + n * E, *gn = gc + n * E;
    const unsigned char *sn = sel + n * E;
    double dot = 0, pdp = 0;
    for (int64_t e = 0; e < E; e++) {
      r->out2[e] += sn[e] * scale;
      r->out2[E + e] += pn[e] * scale;
      if (sn[e]) dot += gn[e] * cn[e];
    }
    for (int64_t e = 0; e < E; e++) {
      dp[e] = (gs ? scale * gs[E + e] : 0.0) + (sn[e] ? (gn[e] - dot) / K[n] : 0.0);
      pdp += pn[e] * dp[e];
    }
    for (int64_t e = 0; e < E; e++) dz[n * E + e] = pn[e] * (dp[e] - pdp);
  }
  free(p), free(K), free(dp), free(sel);
  return TSR_OK;
}

static double sigmoid(double v) {
  return 1.0 / (1.0 + exp(-v));
}

static tsr_status experts64(const double *x, const double *cb, const double *w13, const double *w2,
                            const double *g, int64_t N, int64_t C, int64_t E, int64_t I,
                            cf_ref64 *r) {
  double *h = calloc((size_t)(2 * I), sizeof *h), *a = calloc((size_t)I, sizeof *a);
  double *y = calloc((size_t)C, sizeof *y), *da = calloc((size_t)I, sizeof *da);
  double *dh = calloc((size_t)(2 * I), sizeof *dh);
  r->defined[1] = calloc((size_t)(N * E), 1);
  if (!h || !a || !y || !da || !dh || !r->defined[1]) {
    free(h), free(a), free(y), free(da), free(dh);
    return TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
  }
  double *dx = r->grads[0], *dc = r->grads[1], *dw13 = r->grads[2], *dw2 = r->grads[3];
  for (int64_t n = 0; n < N; n++)
    for (int64_t e = 0; e < E; e++) {
      double w = cb[n * E + e];
      if (w == 0) continue; /* not routed: nothing computed, the gradient undefined */
      r->defined[1][n * E + e] = 1;
      const double *xn = x + n * C, *gn = g + n * C, *W13 = w13 + e * 2 * I * C,
                   *W2 = w2 + e * C * I;
      for (int64_t i = 0; i < 2 * I; i++) {
        double s = 0;
        for (int64_t k = 0; k < C; k++) s += W13[i * C + k] * xn[k];
        h[i] = s;
      }
      for (int64_t i = 0; i < I; i++) a[i] = h[i] * sigmoid(h[i]) * h[I + i];
      double dot = 0;
      for (int64_t k = 0; k < C; k++) {
        double s = 0;
        for (int64_t i = 0; i < I; i++) s += W2[k * I + i] * a[i];
        y[k] = s;
        r->out[n * C + k] += w * s;
        dot += gn[k] * s;
      }
      dc[n * E + e] = dot;
      /* dy = w g; dw2 = dy a^T; da = W2^T dy; then through silu(gate) * up */
      for (int64_t i = 0; i < I; i++) da[i] = 0;
      for (int64_t k = 0; k < C; k++)
        for (int64_t i = 0; i < I; i++) {
          dw2[e * C * I + k * I + i] += w * gn[k] * a[i];
          da[i] += W2[k * I + i] * w * gn[k];
        }
      for (int64_t i = 0; i < I; i++) {
        double sg = sigmoid(h[i]), silu = h[i] * sg;
        dh[i] = da[i] * h[I + i] * sg * (1.0 + h[i] * (1.0 - sg));
        dh[I + i] = da[i] * silu;
      }
      for (int64_t i = 0; i < 2 * I; i++)
        for (int64_t k = 0; k < C; k++) {
          dw13[e * 2 * I * C + i * C + k] += dh[i] * xn[k];
          dx[n * C + k] += dh[i] * W13[i * C + k];
        }
    }
  free(h), free(a), free(y), free(da), free(dh);
  return TSR_OK;
}

tsr_status cf_moe_ref64(const char *op, tsr_tensor *const *in, const double *const *x,
                        const cf_op_attrs *attrs, const double *g, const double *g2, cf_ref64 *r) {
  const tsr_tensor *a = in[0];
  if (!strcmp(op, TSR_OP_MOE_ROUTER)) {
    int64_t E = a->shape[2];
    return router64(x[0], a->shape[0] * a->shape[1], E, attrs->top_k, g, g2, r);
  }
  if (!strcmp(op, TSR_OP_MOE_EXPERTS)) {
    int64_t N = a->shape[0] * a->shape[1], C = a->shape[2], E = in[1]->shape[2];
    return experts64(x[0], x[1], x[2], x[3], g, N, C, E, in[3]->shape[2], r);
  }
  if (!strcmp(op, TSR_OP_MOE_AUX_LOSS)) {
    int64_t E = a->shape[1];
    double scale = attrs->aux_scale, sum = 0;
    for (int64_t e = 0; e < E; e++) {
      sum += x[0][e] * x[0][E + e];
      r->grads[0][E + e] = g[0] * scale * x[0][e];
    }
    r->out[0] = scale * sum;
    return TSR_OK;
  }
  return TSR_ERROR(TSR_ENOTSUP, "the suite has no float64 reference for op '%s'", op);
}
