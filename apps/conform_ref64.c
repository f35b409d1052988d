/* `tessera conform`: float64 references of the ops of the vocabulary, forward and backward.
 *
 * The L2 tests hold a plugin's f32 result against these, so that what is left is the error of
 * the f32 computation alone: a bound at the level f32 rounding explains then sees a systematic
 * error (a scale off by 1e-5 everywhere) that a comparison with another f32 run at rtol 1e-4
 * cannot. Every function is the op as the core defines it (kernels/cpu), computed in double from
 * the same f32 inputs: linear is x·Wᵀ; rmsnorm normalises by (mean x² + eps)^(-1/2) and then
 * applies the weight; rope rotates the two halves of each head by the angles of theta^(-2i/D)
 * at each row's position; sdpa is softmax(q·kᵀ/√D) v with query head h reading kv head
 * h / (Hq / Hkv), causal by position (rope_doc and sdpa_doc: at per-token positions, and within
 * each segment); cross_entropy is the mean over the labels that are not
 * the ignore index; swiglu is silu(gate)·up. The mixture-of-experts ops are conform_moe.c's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"
#include "tessera/kernels.h"
#include "tessera/ops.h"

static double *dalloc(int64_t n) {
  return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

/* The values of an f32 or i32 tensor as doubles (contiguous, row-major). */
static double *as_double(const tsr_tensor *t) {
  int64_t n = tsr_tensor_numel(t);
  double *d = dalloc(n);
  tsr_tensor *c = NULL;
  if (!d || tsr_tensor_cast(t, TSR_F32, &c) != TSR_OK) {
    free(d);
    return NULL;
  }
  const float *p = tsr_tensor_data(c);
  for (int64_t i = 0; i < n; i++) d[i] = p[i];
  tsr_tensor_free(c);
  return d;
}

void cf_ref64_free(cf_ref64 *r) {
  free(r->out);
  free(r->out2);
  for (int i = 0; i < TSR_MAX_OP_INPUTS; i++) free(r->grads[i]), free(r->defined[i]);
  memset(r, 0, sizeof *r);
}

static void linear(cf_ref64 *r, const double *x, const double *w, const double *g, int64_t N,
                   int64_t C, int64_t OC) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double s = 0;
      for (int64_t c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
      r->out[n * OC + o] = s;
    }
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double gv = g[n * OC + o];
      for (int64_t c = 0; c < C; c++) {
        r->grads[0][n * C + c] += gv * w[o * C + c];
        r->grads[1][o * C + c] += gv * x[n * C + c];
      }
    }
}

static void rmsnorm(cf_ref64 *r, const double *x, const double *w, const double *g, int64_t N,
                    int64_t C, double eps) {
  for (int64_t n = 0; n < N; n++) {
    const double *xi = x + n * C, *gi = g + n * C;
    double ss = 0, dot = 0;
    for (int64_t c = 0; c < C; c++) ss += xi[c] * xi[c];
    double rs = 1.0 / sqrt(ss / (double)C + eps);
    for (int64_t c = 0; c < C; c++) {
      r->out[n * C + c] = xi[c] * rs * w[c];
      dot += gi[c] * w[c] * xi[c];
    }
    double coef = dot / (double)C * rs * rs;
    for (int64_t c = 0; c < C; c++) {
      r->grads[0][n * C + c] = rs * (w[c] * gi[c] - xi[c] * coef);
      r->grads[1][c] += gi[c] * xi[c] * rs;
    }
  }
}

/* pos (B, L): rope_doc's per-token positions; NULL: the row's index (rope). */
static void rope(cf_ref64 *r, const double *x, const double *g, int64_t B, int64_t L, int64_t H,
                 int64_t D, double theta, const double *pos) {
  int64_t half = D / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t l = 0; l < L; l++)
      for (int64_t h = 0; h < H; h++) {
        int64_t off = ((b * L + l) * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          double at = pos ? pos[b * L + l] : (double)l;
          double a = at * pow(theta, -(double)(2 * i) / (double)D);
          double c = cos(a), s = sin(a);
          double x1 = x[off + i], x2 = x[off + i + half];
          double g1 = g[off + i], g2 = g[off + i + half];
          r->out[off + i] = x1 * c - x2 * s;
          r->out[off + i + half] = x2 * c + x1 * s;
          r->grads[0][off + i] = g1 * c + g2 * s;
          r->grads[0][off + i + half] = g2 * c - g1 * s;
        }
      }
}

/* seg (B, L): sdpa_doc's segment ids, a query seeing only keys of its own; NULL: sdpa. */
static void sdpa(cf_ref64 *r, const double *q, const double *k, const double *v, const double *g,
                 int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D, bool causal,
                 const double *seg, double *p, double *dp) {
  double scale = 1.0 / sqrt((double)D);
  int64_t group = Hq / Hkv;
  double *dq = r->grads[0], *dk = r->grads[1], *dv = r->grads[2];
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Hq; h++) {
      int64_t kh = h / group;
#define Q(l)     (q + ((b * L + (l)) * Hq + h) * D)
#define KV(t, l) (t + ((b * L + (l)) * Hkv + kh) * D)
      for (int64_t i = 0; i < L; i++) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < L; j++) {
          double s = -INFINITY;
          if ((!causal || j <= i) && (!seg || seg[b * L + i] == seg[b * L + j])) {
            s = 0;
            for (int64_t d = 0; d < D; d++) s += Q(i)[d] * KV(k, j)[d];
            s *= scale;
          }
          p[j] = s;
          if (s > m) m = s;
        }
        for (int64_t j = 0; j < L; j++) sum += p[j] = isinf(p[j]) ? 0 : exp(p[j] - m);
        for (int64_t j = 0; j < L; j++) p[j] /= sum;
        double *o = r->out + ((b * L + i) * Hq + h) * D;
        const double *go = g + ((b * L + i) * Hq + h) * D;
        for (int64_t d = 0; d < D; d++) {
          double s = 0;
          for (int64_t j = 0; j < L; j++) s += p[j] * KV(v, j)[d];
          o[d] = s;
        }
        /* dP = dO·Vᵀ, dS = P ∘ (dP − Σ dP∘P) */
        double rowdot = 0;
        for (int64_t j = 0; j < L; j++) {
          double s = 0;
          for (int64_t d = 0; d < D; d++) s += go[d] * KV(v, j)[d];
          dp[j] = s;
          rowdot += s * p[j];
        }
        for (int64_t j = 0; j < L; j++) {
          double ds = p[j] * (dp[j] - rowdot) * scale;
          double *dkj = dk + ((b * L + j) * Hkv + kh) * D, *dvj = dv + ((b * L + j) * Hkv + kh) * D;
          double *dqi = dq + ((b * L + i) * Hq + h) * D;
          for (int64_t d = 0; d < D; d++) {
            dvj[d] += p[j] * go[d];
            dqi[d] += ds * KV(k, j)[d];
            dkj[d] += ds * Q(i)[d];
          }
        }
      }
#undef Q
#undef KV
    }
}

static void cross_entropy(cf_ref64 *r, const double *z, const double *y, double g, int64_t N,
                          int64_t V) {
  int64_t valid = 0;
  for (int64_t n = 0; n < N; n++) valid += y[n] != TSR_IGNORE_INDEX;
  double loss = 0;
  for (int64_t n = 0; n < N; n++) {
    if (y[n] == TSR_IGNORE_INDEX) continue;
    const double *zi = z + n * V;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) m = zi[j] > m ? zi[j] : m;
    for (int64_t j = 0; j < V; j++) s += exp(zi[j] - m);
    int64_t t = (int64_t)y[n];
    loss += log(s) + m - zi[t];
    for (int64_t j = 0; j < V; j++)
      r->grads[0][n * V + j] = g * (exp(zi[j] - m) / s - (j == t)) / (double)valid;
  }
  r->out[0] = valid ? loss / (double)valid : NAN;
}

static void swiglu(cf_ref64 *r, const double *a, const double *b, const double *g, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double sg = 1.0 / (1.0 + exp(-a[i])), silu = a[i] * sg;
    r->out[i] = silu * b[i];
    r->grads[0][i] = g[i] * b[i] * sg * (1.0 + a[i] * (1.0 - sg));
    r->grads[1][i] = g[i] * silu;
  }
}

tsr_status cf_ref64_run(const char *op, tsr_tensor *const *in, int nin, const cf_op_attrs *attrs,
                        const tsr_tensor *gout, const tsr_tensor *gout2, cf_ref64 *r) {
  memset(r, 0, sizeof *r);
  double *x[TSR_MAX_OP_INPUTS] = {0}, *g = NULL, *g2 = NULL, *scratch = NULL;
  tsr_status st = TSR_OK;
  for (int i = 0; i < nin; i++) {
    if (!(x[i] = as_double(in[i]))) {
      st = TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
      goto done;
    }
    r->has_grad[i] = in[i]->dtype == TSR_F32;
    r->ngrad[i] = tsr_tensor_numel(in[i]);
    if (r->has_grad[i] && !(r->grads[i] = dalloc(r->ngrad[i]))) {
      st = TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
      goto done;
    }
  }
  r->nout = tsr_tensor_numel(gout);
  g = as_double(gout);
  g2 = gout2 ? as_double(gout2) : NULL;
  r->out = dalloc(r->nout);
  if (!g || !r->out || (gout2 && !g2)) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
    goto done;
  }
  const tsr_tensor *a = in[0];
  int64_t rows = 1;
  for (int d = 0; d + 1 < a->ndim; d++) rows *= a->shape[d];
  if (!strcmp(op, TSR_OP_LINEAR)) {
    linear(r, x[0], x[1], g, rows, a->shape[a->ndim - 1], in[1]->shape[0]);
  } else if (!strcmp(op, TSR_OP_RMSNORM)) {
    rmsnorm(r, x[0], x[1], g, rows, a->shape[a->ndim - 1], 1e-5);
  } else if (!strcmp(op, TSR_OP_ROPE)) {
    rope(r, x[0], g, a->shape[0], a->shape[1], a->shape[2], a->shape[3], 10000.0, NULL);
  } else if (!strcmp(op, TSR_OP_ROPE_DOC)) {
    rope(r, x[0], g, a->shape[0], a->shape[1], a->shape[2], a->shape[3], 10000.0, x[1]);
  } else if (!strcmp(op, TSR_OP_SDPA) || !strcmp(op, TSR_OP_SDPA_DOC)) {
    bool doc = !strcmp(op, TSR_OP_SDPA_DOC);
    int64_t L = a->shape[1];
    scratch = dalloc(2 * L);
    if (!scratch) {
      st = TSR_ERROR(TSR_ENOMEM, "out of memory for the float64 reference");
      goto done;
    }
    sdpa(r, x[0], x[1], x[2], g, a->shape[0], L, a->shape[2], in[1]->shape[2], a->shape[3],
         doc || attrs->causal, doc ? x[3] : NULL, scratch, scratch + L);
  } else if (!strcmp(op, TSR_OP_ADD)) {
    for (int64_t i = 0; i < r->nout; i++) {
      r->out[i] = x[0][i] + x[1][i];
      r->grads[0][i] = r->grads[1][i] = g[i];
    }
  } else if (!strcmp(op, TSR_OP_SWIGLU)) {
    swiglu(r, x[0], x[1], g, r->nout);
  } else if (!strcmp(op, TSR_OP_EMBEDDING)) {
    int64_t C = in[1]->shape[1], n = tsr_tensor_numel(in[0]);
    for (int64_t t = 0; t < n; t++) {
      int64_t id = (int64_t)x[0][t];
      for (int64_t c = 0; c < C; c++) {
        r->out[t * C + c] = x[1][id * C + c];
        r->grads[1][id * C + c] += g[t * C + c];
      }
    }
  } else if (!strcmp(op, TSR_OP_CROSS_ENTROPY)) {
    cross_entropy(r, x[0], x[1], g[0], rows, a->shape[a->ndim - 1]);
  } else if (cf_moe_op(op)) {
    st = cf_moe_ref64(op, in, (const double *const *)x, attrs, g, g2, r);
  } else {
    st = TSR_ERROR(TSR_ENOTSUP, "the suite has no float64 reference for op '%s'", op);
  }
done:
  for (int i = 0; i < nin; i++) free(x[i]);
  free(g);
  free(g2);
  free(scratch);
  if (st != TSR_OK) cf_ref64_free(r);
  return st;
}

/* How far an f32 result is from the float64 reference: ||got − ref|| / ||ref|| and
 * max |got − ref| / max |ref|, with the worst element, over the elements `defined` marks. */
void cf_ref64_error(const tsr_tensor *got, const double *ref, const unsigned char *defined,
                    int64_t n, cf_error *e) {
  memset(e, 0, sizeof *e);
  tsr_tensor *c = NULL;
  e->worst = -1;
  if (tsr_tensor_numel(got) != n || tsr_tensor_cast(got, TSR_F32, &c) != TSR_OK) {
    e->rel_l2 = e->rel_max = INFINITY;
    return;
  }
  const float *p = tsr_tensor_data(c);
  double d2 = 0, r2 = 0, dmax = -1, rmax = 0;
  for (int64_t i = 0; i < n; i++) {
    if (defined && !defined[i]) {
      e->skipped++;
      continue;
    }
    double d = (double)p[i] - ref[i];
    if (!isfinite(d)) d = INFINITY;
    d2 += d * d;
    r2 += ref[i] * ref[i];
    if (fabs(ref[i]) > rmax) rmax = fabs(ref[i]);
    if (fabs(d) > dmax) {
      dmax = fabs(d);
      e->worst = i;
      e->got = p[i];
      e->want = ref[i];
    }
  }
  tsr_tensor_free(c);
  /* an all-zero reference (a gradient nothing reaches) must be met exactly */
  e->rel_l2 = r2 > 0 ? sqrt(d2 / r2) : d2 > 0 ? INFINITY : 0;
  e->rel_max = rmax > 0 ? dmax / rmax : dmax > 0 ? INFINITY : 0;
}
