/* Per-token layers of the Llama block: RMSNorm, RoPE, SwiGLU, embedding, head layout changes. */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "tessera/kernels.h"

/* ---------------------------------------------------------------------------------------------
 * RMSNorm
 * ------------------------------------------------------------------------------------------- */

/* Element-wise work is split into chunks of at least this many values (~10 µs), so that a thread
 * is started only where it pays. Every split below writes disjoint outputs and sums in a fixed
 * order, so results do not depend on the thread count. */
#define TSR_MIN_CHUNK_ELEMS (1 << 14)

static int64_t min_rows(int C) {
  return 1 + TSR_MIN_CHUNK_ELEMS / (C > 0 ? C : 1);
}

typedef struct rms_args {
  float *out, *rstd, *dx, *dw;
  const float *x, *w, *dout, *frstd;
  int N, C;
  float eps;
} rms_args;

TSR_VECTOR_CLONES static void rms_forward_rows(void *ctx, int64_t begin, int64_t end) {
  const rms_args *a = ctx;
  const int C = a->C;
  for (int64_t i = begin; i < end; i++) {
    const float *restrict xi = a->x + i * C;
    float *restrict oi = a->out + i * C;
    /* The mean of squares is summed in double so that a wide row loses nothing to the order of
     * the additions; the result is rounded to f32 once, as the f32 reference does. */
    double ss = 0.0;
    for (int j = 0; j < C; j++) ss += (double)xi[j] * xi[j];
    float var = (float)(ss / C);
    float r = 1.0f / sqrtf(var + a->eps);
    /* (x · rstd) · w in this order, as LlamaRMSNorm normalises before applying the weight. */
    for (int j = 0; j < C; j++) oi[j] = (xi[j] * r) * a->w[j];
    a->rstd[i] = r;
  }
}

void tsr_kernel_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                                int C, float eps) {
  int64_t t0 = tsr_profile_begin();
  rms_args a = {.out = out, .rstd = rstd, .x = x, .w = w, .N = N, .C = C, .eps = eps};
  tsr_parallel_for(N, min_rows(C), rms_forward_rows, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

TSR_VECTOR_CLONES static void rms_backward_rows(void *ctx, int64_t begin, int64_t end) {
  const rms_args *a = ctx;
  const int C = a->C;
  const float *restrict w = a->w;
  for (int64_t i = begin; i < end; i++) {
    const float *restrict xi = a->x + i * C;
    const float *restrict gi = a->dout + i * C;
    float *restrict dxi = a->dx + i * C;
    float r = a->frstd[i];
    /* y_j = w_j x_j r with r = (mean x² + eps)^(-1/2), so ∂r/∂x_k = -r³ x_k / C and
     * dx_k = r (w_k g_k − x_k r² · (1/C) Σ_j w_j g_j x_j). */
    double dot = 0.0;
    for (int j = 0; j < C; j++) dot += (double)gi[j] * w[j] * xi[j];
    float coef = (float)(dot / C) * r * r;
    for (int j = 0; j < C; j++) dxi[j] += r * (w[j] * gi[j] - xi[j] * coef);
  }
}

/* dw over a range of columns: each column sums its rows in row order, as one thread would. */
TSR_VECTOR_CLONES static void rms_backward_dw_cols(void *ctx, int64_t begin, int64_t end) {
  const rms_args *a = ctx;
  const int C = a->C;
  for (int64_t i = 0; i < a->N; i++) {
    const float *restrict xi = a->x + i * C;
    const float *restrict gi = a->dout + i * C;
    float *restrict dw = a->dw;
    float r = a->frstd[i];
    for (int64_t j = begin; j < end; j++) dw[j] += gi[j] * xi[j] * r;
  }
}

void tsr_kernel_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                 const float *w, const float *rstd, int N, int C) {
  int64_t t0 = tsr_profile_begin();
  rms_args a = {.dx = dx, .dw = dw, .x = x, .w = w, .dout = dout, .frstd = rstd, .N = N, .C = C};
  tsr_parallel_for(N, min_rows(C), rms_backward_rows, &a);
  if (dw != NULL)
    tsr_parallel_for(C, 1 + TSR_MIN_CHUNK_ELEMS / (N > 0 ? N : 1) + 15, rms_backward_dw_cols, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

/* ---------------------------------------------------------------------------------------------
 * RoPE
 * ------------------------------------------------------------------------------------------- */

static tsr_status rope_tables_impl(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                                   float theta) {
  if (D <= 0 || D % 2 != 0) {
    return TSR_ERROR(TSR_EINVAL, "rope: head_dim %d must be positive and even", D);
  }
  if (L < 0) return TSR_ERROR(TSR_EINVAL, "rope: sequence length %d is negative", L);
  if (!(theta > 0.0f)) return TSR_ERROR(TSR_EINVAL, "rope: rope_theta %g must be > 0", theta);
  int half = D / 2;
  for (int64_t l = 0; l < L; l++) {
    float p = (float)(pos != NULL ? pos[l] : l);
    for (int i = 0; i < half; i++) {
      float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
      float angle = p * inv_freq;
      float c = cosf(angle), s = sinf(angle);
      cos_t[l * D + i] = c;
      cos_t[l * D + i + half] = c;
      sin_t[l * D + i] = s;
      sin_t[l * D + i + half] = s;
    }
  }
  return TSR_OK;
}

tsr_status tsr_kernel_rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                                  float theta) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = rope_tables_impl(cos_t, sin_t, pos, L, D, theta);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
  return r;
}

typedef struct rope_args {
  float *out;
  const float *x, *cos_t, *sin_t;
  int L, H, D;
} rope_args;

/* One unit is one (b, l) token: its H heads share the position's cos/sin row. */
TSR_VECTOR_CLONES static void rope_forward_tokens(void *ctx, int64_t begin, int64_t end) {
  const rope_args *a = ctx;
  const int half = a->D / 2, D = a->D;
  for (int64_t bl = begin; bl < end; bl++) {
    int64_t l = bl % a->L;
    const float *restrict c = a->cos_t + l * D;
    const float *restrict s = a->sin_t + l * D;
    for (int64_t h = 0; h < a->H; h++) {
      int64_t off = (bl * a->H + h) * D;
      const float *xh = a->x + off;
      float *oh = a->out + off;
      for (int i = 0; i < half; i++) {
        /* Both halves are read before either is written, which makes out == x safe. */
        float x1 = xh[i], x2 = xh[i + half];
        oh[i] = x1 * c[i] - x2 * s[i];
        oh[i + half] = x2 * c[i + half] + x1 * s[i + half];
      }
    }
  }
}

void tsr_kernel_rope_forward(float *out, const float *x, const float *cos_t, const float *sin_t,
                             int B, int L, int H, int D) {
  int64_t t0 = tsr_profile_begin();
  rope_args a = {out, x, cos_t, sin_t, L, H, D};
  tsr_parallel_for((int64_t)B * L, min_rows(H * D), rope_forward_tokens, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

TSR_VECTOR_CLONES static void rope_backward_tokens(void *ctx, int64_t begin, int64_t end) {
  const rope_args *a = ctx;
  const int half = a->D / 2, D = a->D;
  for (int64_t bl = begin; bl < end; bl++) {
    int64_t l = bl % a->L;
    const float *restrict c = a->cos_t + l * D;
    const float *restrict s = a->sin_t + l * D;
    for (int64_t h = 0; h < a->H; h++) {
      int64_t off = (bl * a->H + h) * D;
      const float *restrict g = a->x + off;
      float *restrict d = a->out + off;
      for (int i = 0; i < half; i++) {
        float g1 = g[i], g2 = g[i + half];
        d[i] += g1 * c[i] + g2 * s[i + half];
        d[i + half] += g2 * c[i + half] - g1 * s[i];
      }
    }
  }
}

void tsr_kernel_rope_backward(float *dx, const float *dout, const float *cos_t, const float *sin_t,
                              int B, int L, int H, int D) {
  int64_t t0 = tsr_profile_begin();
  rope_args a = {dx, dout, cos_t, sin_t, L, H, D};
  tsr_parallel_for((int64_t)B * L, min_rows(H * D), rope_backward_tokens, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

void tsr_kernel_blhd_to_bhld(float *out, const float *x, int B, int L, int H, int D) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t b = 0; b < B; b++) {
    for (int64_t l = 0; l < L; l++) {
      for (int64_t h = 0; h < H; h++) {
        memcpy(out + ((b * H + h) * L + l) * D, x + ((b * L + l) * H + h) * D,
               (size_t)D * sizeof(float));
      }
    }
  }
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

void tsr_kernel_bhld_to_blhd(float *out, const float *x, int B, int L, int H, int D) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      for (int64_t l = 0; l < L; l++) {
        memcpy(out + ((b * L + l) * H + h) * D, x + ((b * H + h) * L + l) * D,
               (size_t)D * sizeof(float));
      }
    }
  }
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU
 * ------------------------------------------------------------------------------------------- */

/* sigmoid(g) from e = exp(−|g|) <= 1, so the exponential never overflows: 1 / (1 + e) for g >= 0,
 * e / (1 + e) below. */
static inline float sigmoid_of(float g, float e) {
  float d = 1.0f + e;
  return g >= 0.0f ? 1.0f / d : e / d;
}

typedef struct swiglu_args {
  float *out, *dgate, *dup;
  const float *gate, *up, *dout;
} swiglu_args;

TSR_VECTOR_CLONES static void swiglu_forward_range(void *ctx, int64_t begin, int64_t end) {
  const swiglu_args *a = ctx;
  const float *restrict gate = a->gate, *restrict up = a->up;
  float *restrict out = a->out;
  for (int64_t i = begin; i < end; i++) {
    float g = gate[i];
    float e = tsr_exp_neg(g >= 0.0f ? -g : g);
    /* silu(g) = g · sigmoid(g): g / (1 + e^-g) as torch writes it for g >= 0 */
    float silu = g >= 0.0f ? g / (1.0f + e) : (g * e) / (1.0f + e);
    out[i] = silu * up[i];
  }
}

void tsr_kernel_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
  int64_t t0 = tsr_profile_begin();
  swiglu_args a = {.out = out, .gate = gate, .up = up};
  tsr_parallel_for(n, TSR_MIN_CHUNK_ELEMS, swiglu_forward_range, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

TSR_VECTOR_CLONES static void swiglu_backward_range(void *ctx, int64_t begin, int64_t end) {
  const swiglu_args *a = ctx;
  const float *restrict gate = a->gate, *restrict up = a->up, *restrict dout = a->dout;
  float *restrict dgate = a->dgate, *restrict dup = a->dup;
  for (int64_t i = begin; i < end; i++) {
    float g = gate[i];
    float s = sigmoid_of(g, tsr_exp_neg(g >= 0.0f ? -g : g));
    float silu = g * s;
    /* d silu / dg = s + g s (1 − s) */
    dgate[i] += dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
    dup[i] += dout[i] * silu;
  }
}

void tsr_kernel_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n) {
  int64_t t0 = tsr_profile_begin();
  swiglu_args a = {.dgate = dgate, .dup = dup, .gate = gate, .up = up, .dout = dout};
  tsr_parallel_for(n, TSR_MIN_CHUNK_ELEMS, swiglu_backward_range, &a);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding
 * ------------------------------------------------------------------------------------------- */

static tsr_status check_ids(const char *what, const int32_t *ids, int N, int V) {
  for (int i = 0; i < N; i++) {
    if (ids[i] < 0 || ids[i] >= V) {
      return TSR_ERROR(TSR_EINVAL,
                       "%s: token id %d at position %d is outside the vocabulary [0, %d)", what,
                       (int)ids[i], i, V);
    }
  }
  return TSR_OK;
}

static tsr_status embedding_forward_impl(float *out, const int32_t *ids, const float *table, int N,
                                         int V, int C) {
  TSR_CHECK(check_ids("embedding forward", ids, N, V));
  for (int64_t i = 0; i < N; i++) {
    memcpy(out + i * C, table + (int64_t)ids[i] * C, (size_t)C * sizeof(float));
  }
  return TSR_OK;
}

tsr_status tsr_kernel_embedding_forward(float *out, const int32_t *ids, const float *table, int N,
                                        int V, int C) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = embedding_forward_impl(out, ids, table, N, V, C);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
  return r;
}

static tsr_status embedding_backward_impl(float *dtable, const float *dout, const int32_t *ids,
                                          int N, int V, int C) {
  TSR_CHECK(check_ids("embedding backward", ids, N, V));
  for (int64_t i = 0; i < N; i++) {
    float *row = dtable + (int64_t)ids[i] * C;
    const float *g = dout + i * C;
    for (int j = 0; j < C; j++) row[j] += g[j];
  }
  return TSR_OK;
}

tsr_status tsr_kernel_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                         int N, int V, int C) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = embedding_backward_impl(dtable, dout, ids, N, V, C);
  tsr_profile_end(TSR_KERNEL_LAYERS, t0);
  return r;
}
