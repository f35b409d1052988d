/* Causal attention with grouped-query heads, computed one key block at a time with an online
 * softmax, and the merge of partial results by their log-sum-exp (ring attention's combine). */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "tessera/kernels.h"

/* Keys per block: the scores of one block live on the stack and are rescaled once per block
 * rather than once per key. */
#define TSR_ATTN_BLOCK 64
/* Largest head_dim the kernels accept; the per-row accumulator is a stack array of this size. */
#define TSR_ATTN_MAX_D 512

typedef struct attn_args {
  float *out, *lse;         /* forward outputs */
  float *dq, *dk, *dv;      /* backward outputs */
  const float *q, *k, *v;   /* inputs */
  const float *dout, *fout; /* backward: upstream gradient and forward output */
  const float *flse;        /* backward: forward lse */
  const int32_t *q_pos, *k_pos;
  int Hq, Hkv, Lq, Lk, D;
  bool causal;
  float scale;
} attn_args;

static inline int32_t pos_at(const int32_t *pos, int i) {
  return pos != NULL ? pos[i] : i;
}

static inline bool visible(const attn_args *a, int32_t qp, int j) {
  return !a->causal || pos_at(a->k_pos, j) <= qp;
}

static inline float dot(const float *x, const float *y, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; d++) s += x[d] * y[d];
  return s;
}

static tsr_status check_shapes(const char *what, int B, int Hq, int Hkv, int Lq, int Lk, int D) {
  if (B < 0 || Lq < 0 || Lk < 0) {
    return TSR_ERROR(TSR_EINVAL, "%s: negative size (B=%d, Lq=%d, Lk=%d)", what, B, Lq, Lk);
  }
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0) {
    return TSR_ERROR(TSR_EINVAL,
                     "%s: query heads %d must be a positive multiple of key/value heads %d", what,
                     Hq, Hkv);
  }
  if (D <= 0 || D > TSR_ATTN_MAX_D) {
    return TSR_ERROR(TSR_EINVAL, "%s: head_dim %d outside [1, %d]", what, D, TSR_ATTN_MAX_D);
  }
  return TSR_OK;
}

/* Work units are big enough that starting a thread is worth it (~1e5 multiply-adds). */
static int64_t min_units(int Lq, int Lk, int D) {
  int64_t per = (int64_t)Lq * Lk * D + 1;
  int64_t m = ((int64_t)1 << 17) / per;
  return m > 1 ? m : 1;
}

/* ---------------------------------------------------------------------------------------------
 * Forward: one unit is one (batch, query head).
 * ------------------------------------------------------------------------------------------- */

static void forward_row(const attn_args *a, const float *qi, int32_t qp, const float *kh,
                        const float *vh, float *oi, float *lse_i) {
  int D = a->D;
  float acc[TSR_ATTN_MAX_D];
  float s[TSR_ATTN_BLOCK];
  memset(acc, 0, (size_t)D * sizeof(float));
  float m = -INFINITY; /* running max of the scores seen so far */
  float l = 0.0f;      /* running Σ exp(score − m) */
  for (int j0 = 0; j0 < a->Lk; j0 += TSR_ATTN_BLOCK) {
    int n = a->Lk - j0 < TSR_ATTN_BLOCK ? a->Lk - j0 : TSR_ATTN_BLOCK;
    float bm = -INFINITY;
    for (int j = 0; j < n; j++) {
      if (visible(a, qp, j0 + j)) {
        s[j] = a->scale * dot(qi, kh + (int64_t)(j0 + j) * D, D);
        bm = s[j] > bm ? s[j] : bm;
      } else {
        s[j] = -INFINITY;
      }
    }
    if (bm == -INFINITY) continue; /* a fully masked block changes nothing */
    float m_new = m > bm ? m : bm;
    /* m == -inf before the first visible block: expf(-inf) = 0 and acc, l are still 0. */
    float corr = expf(m - m_new);
    l *= corr;
    for (int d = 0; d < D; d++) acc[d] *= corr;
    for (int j = 0; j < n; j++) {
      if (s[j] == -INFINITY) continue;
      float p = expf(s[j] - m_new);
      l += p;
      const float *vj = vh + (int64_t)(j0 + j) * D;
      for (int d = 0; d < D; d++) acc[d] += p * vj[d];
    }
    m = m_new;
  }
  if (l == 0.0f) {
    memset(oi, 0, (size_t)D * sizeof(float));
    *lse_i = -INFINITY;
    return;
  }
  float inv = 1.0f / l;
  for (int d = 0; d < D; d++) oi[d] = acc[d] * inv;
  *lse_i = m + logf(l);
}

static void forward_units(void *ctx, int64_t begin, int64_t end) {
  const attn_args *a = ctx;
  int group = a->Hq / a->Hkv;
  int64_t qsz = (int64_t)a->Lq * a->D, ksz = (int64_t)a->Lk * a->D;
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->Hq, h = u % a->Hq;
    int64_t kvh = b * a->Hkv + h / group;
    const float *qh = a->q + u * qsz;
    const float *kh = a->k + kvh * ksz;
    const float *vh = a->v + kvh * ksz;
    for (int i = 0; i < a->Lq; i++) {
      forward_row(a, qh + (int64_t)i * a->D, pos_at(a->q_pos, i), kh, vh,
                  a->out + u * qsz + (int64_t)i * a->D, a->lse + u * a->Lq + i);
    }
  }
}

tsr_status tsr_kernel_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                        int B, int Hq, int Hkv, int Lq, int Lk, int D,
                                        bool causal) {
  TSR_CHECK(check_shapes("attention forward", B, Hq, Hkv, Lq, Lk, D));
  attn_args a = {.out = out,
                 .lse = lse,
                 .q = q,
                 .k = k,
                 .v = v,
                 .q_pos = q_pos,
                 .k_pos = k_pos,
                 .Hq = Hq,
                 .Hkv = Hkv,
                 .Lq = Lq,
                 .Lk = Lk,
                 .D = D,
                 .causal = causal,
                 .scale = 1.0f / sqrtf((float)D)};
  tsr_parallel_for((int64_t)B * Hq, min_units(Lq, Lk, D), forward_units, &a);
  return TSR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Backward: one unit is one (batch, key/value head), so that the dk/dv of a group are written by
 * one thread only; its query heads are visited in turn.
 *
 * With p_ij = exp(s_ij − lse_i) and D_i = Σ_d dout_id · out_id (= Σ_j p_ij dp_ij):
 *   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i · v_j − D_i),
 *   dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i.
 * ------------------------------------------------------------------------------------------- */

static void backward_units(void *ctx, int64_t begin, int64_t end) {
  const attn_args *a = ctx;
  int D = a->D;
  int group = a->Hq / a->Hkv;
  int64_t qsz = (int64_t)a->Lq * D, ksz = (int64_t)a->Lk * D;
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->Hkv;
    const float *kh = a->k + u * ksz;
    const float *vh = a->v + u * ksz;
    float *dkh = a->dk + u * ksz;
    float *dvh = a->dv + u * ksz;
    for (int64_t h = (u % a->Hkv) * group; h < (u % a->Hkv + 1) * group; h++) {
      int64_t qh = b * a->Hq + h;
      for (int i = 0; i < a->Lq; i++) {
        int64_t row = qh * a->Lq + i;
        float lse_i = a->flse[row];
        if (lse_i == -INFINITY) continue; /* saw no key: no probability, no gradient */
        const float *qi = a->q + qh * qsz + (int64_t)i * D;
        const float *gi = a->dout + qh * qsz + (int64_t)i * D;
        float *dqi = a->dq + qh * qsz + (int64_t)i * D;
        float di = dot(gi, a->fout + qh * qsz + (int64_t)i * D, D);
        int32_t qp = pos_at(a->q_pos, i);
        for (int j = 0; j < a->Lk; j++) {
          if (!visible(a, qp, j)) continue;
          const float *kj = kh + (int64_t)j * D;
          const float *vj = vh + (int64_t)j * D;
          float p = expf(a->scale * dot(qi, kj, D) - lse_i);
          float ds = p * (dot(gi, vj, D) - di) * a->scale;
          float *dkj = dkh + (int64_t)j * D;
          float *dvj = dvh + (int64_t)j * D;
          for (int d = 0; d < D; d++) {
            dvj[d] += p * gi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
    }
  }
}

tsr_status tsr_kernel_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *out, const float *lse, const int32_t *q_pos,
                                         const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                         int Lk, int D, bool causal) {
  TSR_CHECK(check_shapes("attention backward", B, Hq, Hkv, Lq, Lk, D));
  attn_args a = {.dq = dq,
                 .dk = dk,
                 .dv = dv,
                 .q = q,
                 .k = k,
                 .v = v,
                 .dout = dout,
                 .fout = out,
                 .flse = lse,
                 .q_pos = q_pos,
                 .k_pos = k_pos,
                 .Hq = Hq,
                 .Hkv = Hkv,
                 .Lq = Lq,
                 .Lk = Lk,
                 .D = D,
                 .causal = causal,
                 .scale = 1.0f / sqrtf((float)D)};
  int group = Hq / Hkv;
  tsr_parallel_for((int64_t)B * Hkv, min_units(Lq * group, Lk, D), backward_units, &a);
  return TSR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Merge by log-sum-exp
 * ------------------------------------------------------------------------------------------- */

void tsr_kernel_attention_merge(float *out, float *lse, const float *out_a, const float *lse_a,
                                const float *out_b, const float *lse_b, int R, int D) {
  for (int64_t r = 0; r < R; r++) {
    float la = lse_a[r], lb = lse_b[r];
    float mx = la > lb ? la : lb;
    float *o = out + r * D;
    const float *oa = out_a + r * D, *ob = out_b + r * D;
    if (mx == -INFINITY) {
      for (int d = 0; d < D; d++) o[d] = 0.0f;
      lse[r] = -INFINITY;
      continue;
    }
    /* The larger side has weight exactly 1, so lse = mx + log1p(other) keeps full precision
     * when one side dominates. */
    float wa = expf(la - mx), wb = expf(lb - mx);
    float other = la > lb ? wb : wa;
    float sum = 1.0f + other;
    float ca = wa / sum, cb = wb / sum;
    for (int d = 0; d < D; d++) o[d] = ca * oa[d] + cb * ob[d];
    lse[r] = mx + log1pf(other);
  }
}
