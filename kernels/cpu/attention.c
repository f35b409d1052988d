/* Causal attention with grouped-query heads, computed one (query block, key block) tile at a time
 * with an online softmax, and the merge of partial results by their log-sum-exp (ring attention's
 * combine). The tiles' products (scores, P·V and the four backward products) are CBLAS GEMMs. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tessera/kernels.h"

/* Keys per tile. The online softmax rescales its accumulators once per key tile. */
#define TSR_ATTN_BLOCK 64
/* Largest head_dim the kernels accept. */
#define TSR_ATTN_MAX_D 512
/* Tiles keep q_block · TSR_ATTN_BLOCK · D at or below this many multiply-adds, which is where
 * OpenBLAS runs a GEMM on the calling thread alone: the kernel's own threads then each run their
 * tiles' GEMMs concurrently instead of queueing for OpenBLAS's shared pool. */
#define TSR_ATTN_TILE_MACS (1 << 18)

typedef struct attn_args {
  float *out, *lse;         /* forward outputs */
  float *dq, *dk, *dv;      /* backward outputs */
  const float *q, *k, *v;   /* inputs */
  const float *dout, *fout; /* backward: upstream gradient and forward output */
  const float *flse;        /* backward: forward lse */
  const int32_t *q_pos, *k_pos;
  /* NULL, or the document of each row: a query sees only keys of its own document */
  const int32_t *q_seg, *k_seg; /* (B, Lq), (B, Lk) */
  int Hq, Hkv, Lq, Lk, D;
  int bq;    /* query rows per tile */
  bool blhd; /* q/out/dq/dout are (B, Lq, Hq, D) and k/v/dk/dv (B, Lk, Hkv, D) */
  bool causal;
  float scale;
  atomic_int nomem; /* a thread could not get its work buffers */
} attn_args;

static inline int32_t pos_at(const int32_t *pos, int i) {
  return pos != NULL ? pos[i] : i;
}

/* Offset of head h of batch b, and the distance between its rows, in a tensor with H heads of L
 * rows: (B, H, L, D) or (B, L, H, D). */
static inline int64_t head_at(const attn_args *a, int64_t b, int64_t h, int H, int L) {
  return a->blhd ? (b * L * H + h) * a->D : (b * H + h) * L * a->D;
}

static inline int64_t row_step(const attn_args *a, int H) {
  return a->blhd ? (int64_t)H * a->D : a->D;
}

static inline void gemm_ld(float *c, int64_t ldc, const float *x, int64_t ldx, const float *y,
                           int64_t ldy, int M, int N, int K, bool tx, bool ty, float alpha,
                           float beta) {
  tsr_gemm_strided(c, ldc, x, ldx, y, ldy, M, N, K, tx, ty, alpha, beta);
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

static int query_block(int D) {
  int bq = TSR_ATTN_TILE_MACS / (TSR_ATTN_BLOCK * D);
  return bq > TSR_ATTN_BLOCK ? TSR_ATTN_BLOCK : bq;
}

/* Work units are big enough that starting a thread is worth it (~1e5 multiply-adds). */
static int64_t min_units(int Lq, int Lk, int D) {
  int64_t per = (int64_t)Lq * Lk * D + 1;
  int64_t m = ((int64_t)1 << 17) / per;
  return m > 1 ? m : 1;
}

/* How the causal mask meets a tile: every pair visible, none, or some (checked per pair). */
typedef enum tile_mask { TILE_ALL, TILE_NONE, TILE_SOME } tile_mask;

typedef struct span {
  int32_t lo, hi; /* smallest and largest position in a block */
} span;

static span span_of(const int32_t *pos, int i0, int n) {
  span s = {pos_at(pos, i0), pos_at(pos, i0)};
  for (int i = 1; i < n; i++) {
    int32_t p = pos_at(pos, i0 + i);
    s.lo = p < s.lo ? p : s.lo;
    s.hi = p > s.hi ? p : s.hi;
  }
  return s;
}

static tile_mask classify(bool causal, span qs, span ks) {
  if (!causal || ks.hi <= qs.lo) return TILE_ALL;
  if (ks.lo > qs.hi) return TILE_NONE;
  return TILE_SOME;
}

/* The tile of batch row b with nq queries from i0 and nk keys from j0 (key positions ks): the
 * causal class, narrowed by the documents when there are segment ids. Tiles of two disjoint sets
 * of documents are skipped like future ones; a tile of one document on both sides is plain causal.
 */
static tile_mask tile_of(const attn_args *a, int64_t b, int i0, int nq, int j0, int nk, span ks) {
  tile_mask tm = classify(a->causal, span_of(a->q_pos, i0, nq), ks);
  if (tm == TILE_NONE || !a->q_seg) return tm;
  span qg = span_of(a->q_seg + b * a->Lq, i0, nq), kg = span_of(a->k_seg + b * a->Lk, j0, nk);
  if (qg.hi < kg.lo || kg.hi < qg.lo) return TILE_NONE;
  if (qg.lo == qg.hi && kg.lo == kg.hi) return tm;
  return TILE_SOME;
}

/* Sets the invisible entries of batch row b's (nq, nk) score tile to -inf. The key positions are
 * gathered first so that each row's comparisons are one vectorised select. */
TSR_VECTOR_CLONES static void mask_tile(float *restrict s, const attn_args *a, int64_t b, int i0,
                                        int nq, int j0, int nk) {
  const int32_t *qg = a->q_seg ? a->q_seg + b * a->Lq + i0 : NULL;
  const int32_t *kg = a->k_seg ? a->k_seg + b * a->Lk + j0 : NULL;
  int32_t kp[TSR_ATTN_BLOCK], khi = INT32_MIN;
  for (int j = 0; j < nk; j++) {
    kp[j] = pos_at(a->k_pos, j0 + j);
    khi = kp[j] > khi ? kp[j] : khi;
  }
  for (int i = 0; i < nq; i++) {
    int32_t qp = pos_at(a->q_pos, i0 + i);
    float *restrict si = s + (int64_t)i * nk;
    if (a->causal && khi > qp)
      for (int j = 0; j < nk; j++) si[j] = kp[j] > qp ? -INFINITY : si[j];
    if (qg) {
      int32_t g = qg[i];
      for (int j = 0; j < nk; j++) si[j] = kg[j] != g ? -INFINITY : si[j];
    }
  }
}

/* s[j] = exp(s[j] − m) for j < n (masked entries, -inf, give 0); returns their sum. */
static inline float exp_sum(float *restrict s, int n, float m) {
  float acc[TSR_ROW_LANES] = {0};
  int j = 0;
  for (; j + TSR_ROW_LANES <= n; j += TSR_ROW_LANES)
    for (int k = 0; k < TSR_ROW_LANES; k++) {
      float p = tsr_exp_neg(s[j + k] - m);
      s[j + k] = p;
      acc[k] += p;
    }
  float r = 0.0f;
  for (; j < n; j++) {
    float p = tsr_exp_neg(s[j] - m);
    s[j] = p;
    r += p;
  }
  for (int k = 0; k < TSR_ROW_LANES; k++) r += acc[k];
  return r;
}

/* Σ_d x[d] · y[d]. */
static inline float dot(const float *restrict x, const float *restrict y, int n) {
  float acc[TSR_ROW_LANES] = {0};
  int d = 0;
  for (; d + TSR_ROW_LANES <= n; d += TSR_ROW_LANES)
    for (int k = 0; k < TSR_ROW_LANES; k++) acc[k] += x[d + k] * y[d + k];
  float r = 0.0f;
  for (; d < n; d++) r += x[d] * y[d];
  for (int k = 0; k < TSR_ROW_LANES; k++) r += acc[k];
  return r;
}

/* 8 × 8 blocks of the transpose go through registers: element by element, every store of a column
 * lands on another cache line, and the transposes cost about a quarter of a tile's GEMM time. */
#if defined(__GNUC__) && !defined(__clang__)
typedef float tsr_v8 __attribute__((vector_size(32)));
typedef int32_t tsr_v8i __attribute__((vector_size(32)));

/* y (8 rows of stride ldy) = x (8 rows of stride ldx) transposed. The shuffles are AVX's
 * unpack, shuffle and 128-bit permute steps. */
__attribute__((always_inline)) static inline void transpose8(float *restrict y, int64_t ldy,
                                                             const float *restrict x, int64_t ldx) {
  tsr_v8 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) memcpy(&r[i], x + i * ldx, sizeof r[i]);
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], (tsr_v8i){0, 8, 1, 9, 4, 12, 5, 13});
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], (tsr_v8i){2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; h++) {
      u[i + h] = __builtin_shuffle(t[i + h], t[i + h + 2], (tsr_v8i){0, 1, 8, 9, 4, 5, 12, 13});
      u[i + h + 2] =
          __builtin_shuffle(t[i + h], t[i + h + 2], (tsr_v8i){2, 3, 10, 11, 6, 7, 14, 15});
    }
  /* u[0..3] hold columns 0, 2, 1, 3 of rows 0-3 and 4-7 of each 128-bit half; likewise u[4..7] */
  static const int order[4] = {0, 2, 1, 3};
  for (int c = 0; c < 4; c++) {
    tsr_v8 a = u[order[c]], b = u[4 + order[c]];
    tsr_v8 lo = __builtin_shuffle(a, b, (tsr_v8i){0, 1, 2, 3, 8, 9, 10, 11});
    tsr_v8 hi = __builtin_shuffle(a, b, (tsr_v8i){4, 5, 6, 7, 12, 13, 14, 15});
    memcpy(y + c * ldy, &lo, sizeof lo);
    memcpy(y + (c + 4) * ldy, &hi, sizeof hi);
  }
}
#else
static inline void transpose8(float *restrict y, int64_t ldy, const float *restrict x,
                              int64_t ldx) {
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) y[j * ldy + i] = x[i * ldx + j];
}
#endif

/* kt (D, n) = x (n, D) transposed, so that every tile product is a plain NN or TN GEMM (OpenBLAS's
 * NT path is slower at these sizes, and a key tile's transpose serves all its query tiles). */
TSR_VECTOR_CLONES static void transpose(float *restrict kt, const float *restrict x, int64_t ldx,
                                        int n, int D) {
  int n8 = n & ~7, D8 = D & ~7;
  for (int j = 0; j < n8; j += 8)
    for (int d = 0; d < D8; d += 8) transpose8(kt + (int64_t)d * n + j, n, x + j * ldx + d, ldx);
  for (int j = 0; j < n; j++)
    for (int d = j < n8 ? D8 : 0; d < D; d++) kt[(int64_t)d * n + j] = x[(int64_t)j * ldx + d];
}

/* ---------------------------------------------------------------------------------------------
 * Forward: one unit is one (batch, query head). Key tiles are the outer loop (each transposed
 * once), query tiles the inner one; the unit's `out` rows are the accumulators and m, l keep each
 * row's running max and Σ exp(score − m).
 * ------------------------------------------------------------------------------------------- */

TSR_VECTOR_CLONES static void forward_units(void *ctx, int64_t begin, int64_t end) {
  attn_args *a = ctx;
  const int D = a->D, Lq = a->Lq, Lk = a->Lk, bq = a->bq, bk = TSR_ATTN_BLOCK;
  int group = a->Hq / a->Hkv;
  const int64_t sq = row_step(a, a->Hq), sk = row_step(a, a->Hkv);
  float *work = malloc(sizeof(float) * ((size_t)D * bk + (size_t)bq * bk + 2 * (size_t)Lq + 1));
  if (work == NULL) {
    atomic_store(&a->nomem, 1);
    return;
  }
  float *kt = work, *s = kt + (int64_t)D * bk, *m = s + (int64_t)bq * bk, *l = m + Lq;
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->Hq, h = u % a->Hq;
    int64_t kvh = h / group;
    const float *qh = a->q + head_at(a, b, h, a->Hq, Lq);
    const float *kh = a->k + head_at(a, b, kvh, a->Hkv, Lk);
    const float *vh = a->v + head_at(a, b, kvh, a->Hkv, Lk);
    float *oh = a->out + head_at(a, b, h, a->Hq, Lq);
    float *lh = a->lse + u * Lq;
    for (int i = 0; i < Lq; i++) {
      memset(oh + i * sq, 0, sizeof(float) * (size_t)D);
      m[i] = -INFINITY, l[i] = 0.0f;
    }
    for (int j0 = 0; j0 < Lk; j0 += bk) {
      int nk = Lk - j0 < bk ? Lk - j0 : bk;
      span ks = span_of(a->k_pos, j0, nk);
      bool transposed = false;
      for (int i0 = 0; i0 < Lq; i0 += bq) {
        int nq = Lq - i0 < bq ? Lq - i0 : bq;
        tile_mask tm = tile_of(a, b, i0, nq, j0, nk, ks);
        if (tm == TILE_NONE) continue; /* a fully masked tile changes nothing */
        if (!transposed) transpose(kt, kh + j0 * sk, sk, nk, D), transposed = true;
        gemm_ld(s, nk, qh + i0 * sq, sq, kt, nk, nq, nk, D, false, false, a->scale, 0.0f);
        if (tm == TILE_SOME) mask_tile(s, a, b, i0, nq, j0, nk);
        for (int i = 0; i < nq; i++) {
          float *si = s + (int64_t)i * nk;
          float bm = tsr_row_max(si, nk);
          if (bm == -INFINITY) { /* this row sees no key of the tile: it adds nothing */
            memset(si, 0, sizeof(float) * (size_t)nk);
            continue;
          }
          float mi = m[i0 + i], m_new = mi > bm ? mi : bm;
          /* mi == -inf before the row's first visible key: corr = 0 and acc, l are still 0. */
          float corr = tsr_exp_neg(mi - m_new);
          float sum = exp_sum(si, nk, m_new);
          l[i0 + i] = l[i0 + i] * corr + sum;
          m[i0 + i] = m_new;
          if (corr != 1.0f) {
            float *oi = oh + (i0 + i) * sq;
            for (int d = 0; d < D; d++) oi[d] *= corr;
          }
        }
        gemm_ld(oh + i0 * sq, sq, s, nk, vh + j0 * sk, sk, nq, D, nk, false, false, 1.0f, 1.0f);
      }
    }
    for (int i = 0; i < Lq; i++) {
      float *oi = oh + i * sq;
      if (l[i] == 0.0f) { /* saw no key: out stays 0 */
        lh[i] = -INFINITY;
        continue;
      }
      float inv = 1.0f / l[i];
      for (int d = 0; d < D; d++) oi[d] *= inv;
      lh[i] = m[i] + logf(l[i]);
    }
  }
  free(work);
}

static tsr_status attention_forward_impl(float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                         const int32_t *q_seg, const int32_t *k_seg, int B, int Hq,
                                         int Hkv, int Lq, int Lk, int D, bool causal, bool blhd) {
  TSR_CHECK(check_shapes("attention forward", B, Hq, Hkv, Lq, Lk, D));
  attn_args a = {.out = out,
                 .lse = lse,
                 .q = q,
                 .k = k,
                 .v = v,
                 .q_pos = q_pos,
                 .k_pos = k_pos,
                 .q_seg = q_seg,
                 .k_seg = k_seg,
                 .Hq = Hq,
                 .Hkv = Hkv,
                 .Lq = Lq,
                 .Lk = Lk,
                 .D = D,
                 .bq = query_block(D),
                 .blhd = blhd,
                 .causal = causal,
                 .scale = 1.0f / sqrtf((float)D)};
  atomic_init(&a.nomem, 0);
  tsr_parallel_for((int64_t)B * Hq, min_units(Lq, Lk, D), forward_units, &a);
  if (atomic_load(&a.nomem))
    return TSR_ERROR(TSR_ENOMEM, "attention forward: out of memory for the tile buffers");
  return TSR_OK;
}

tsr_status tsr_kernel_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                        int B, int Hq, int Hkv, int Lq, int Lk, int D,
                                        bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_forward_impl(out, lse, q, k, v, q_pos, k_pos, NULL, NULL, B, Hq, Hkv, Lq,
                                        Lk, D, causal, false);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

tsr_status tsr_kernel_attention_forward_blhd(float *out, float *lse, const float *q, const float *k,
                                             const float *v, const int32_t *q_pos,
                                             const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                             int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_forward_impl(out, lse, q, k, v, q_pos, k_pos, NULL, NULL, B, Hq, Hkv, Lq,
                                        Lk, D, causal, true);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

/* ---------------------------------------------------------------------------------------------
 * Backward: one unit is one (batch, key/value head), so that the dk/dv of a group are written by
 * one thread only; its query heads are visited in turn, key tiles outer, query tiles inner.
 *
 * With p_ij = exp(s_ij − lse_i) and D_i = Σ_d dout_id · out_id (= Σ_j p_ij dp_ij), per tile:
 *   dV += Pᵀ dout,  dP = dout Vᵀ,  dS = P ∘ (dP − D) · scale,  dQ += dS K,  dK += dSᵀ Q.
 * ------------------------------------------------------------------------------------------- */

TSR_VECTOR_CLONES static void backward_units(void *ctx, int64_t begin, int64_t end) {
  attn_args *a = ctx;
  const int D = a->D, Lq = a->Lq, Lk = a->Lk, bq = a->bq, bk = TSR_ATTN_BLOCK;
  int group = a->Hq / a->Hkv;
  const int64_t sq = row_step(a, a->Hq), sk = row_step(a, a->Hkv);
  float *work = malloc(sizeof(float) * (2 * (size_t)D * bk + 2 * (size_t)bq * bk + (size_t)Lq + 1));
  if (work == NULL) {
    atomic_store(&a->nomem, 1);
    return;
  }
  float *kt = work, *vt = kt + (int64_t)D * bk, *p = vt + (int64_t)D * bk;
  float *ds = p + (int64_t)bq * bk, *di = ds + (int64_t)bq * bk;
  for (int64_t u = begin; u < end; u++) {
    int64_t b = u / a->Hkv, kvh = u % a->Hkv;
    int64_t koff = head_at(a, b, kvh, a->Hkv, Lk);
    const float *kh = a->k + koff, *vh = a->v + koff;
    float *dkh = a->dk + koff, *dvh = a->dv + koff;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
      int64_t qoff = head_at(a, b, h, a->Hq, Lq);
      const float *qb = a->q + qoff, *gb = a->dout + qoff, *ob = a->fout + qoff;
      const float *lb = a->flse + (b * a->Hq + h) * Lq;
      float *dqb = a->dq + qoff;
      for (int i = 0; i < Lq; i++) {
        di[i] = dot(gb + i * sq, ob + i * sq, D);
      }
      for (int j0 = 0; j0 < Lk; j0 += bk) {
        int nk = Lk - j0 < bk ? Lk - j0 : bk;
        span ks = span_of(a->k_pos, j0, nk);
        bool transposed = false;
        for (int i0 = 0; i0 < Lq; i0 += bq) {
          int nq = Lq - i0 < bq ? Lq - i0 : bq;
          tile_mask tm = tile_of(a, b, i0, nq, j0, nk, ks);
          if (tm == TILE_NONE) continue;
          if (!transposed) {
            transpose(kt, kh + j0 * sk, sk, nk, D);
            transpose(vt, vh + j0 * sk, sk, nk, D);
            transposed = true;
          }
          const float *qt = qb + i0 * sq, *gt = gb + i0 * sq;
          gemm_ld(p, nk, qt, sq, kt, nk, nq, nk, D, false, false, a->scale, 0.0f);
          if (tm == TILE_SOME) mask_tile(p, a, b, i0, nq, j0, nk);
          for (int i = 0; i < nq; i++) {
            float *pi = p + (int64_t)i * nk;
            float li = lb[i0 + i];
            if (li == -INFINITY) { /* saw no key: no probability, no gradient */
              memset(pi, 0, sizeof(float) * (size_t)nk);
              continue;
            }
            /* s − lse <= 0 up to rounding; the exponential clamps the rest to 0 */
            for (int j = 0; j < nk; j++) pi[j] = tsr_exp_neg(pi[j] - li);
          }
          gemm_ld(dvh + j0 * sk, sk, p, nk, gt, sq, nk, D, nq, true, false, 1.0f, 1.0f);
          gemm_ld(ds, nk, gt, sq, vt, nk, nq, nk, D, false, false, 1.0f, 0.0f);
          for (int i = 0; i < nq; i++) {
            const float *pi = p + (int64_t)i * nk;
            float *dsi = ds + (int64_t)i * nk, dd = di[i0 + i];
            for (int j = 0; j < nk; j++) dsi[j] = pi[j] * (dsi[j] - dd) * a->scale;
          }
          gemm_ld(dqb + i0 * sq, sq, ds, nk, kh + j0 * sk, sk, nq, D, nk, false, false, 1.0f, 1.0f);
          gemm_ld(dkh + j0 * sk, sk, ds, nk, qt, sq, nk, D, nq, true, false, 1.0f, 1.0f);
        }
      }
    }
  }
  free(work);
}

static tsr_status attention_backward_impl(float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v,
                                          const float *out, const float *lse, const int32_t *q_pos,
                                          const int32_t *k_pos, const int32_t *q_seg,
                                          const int32_t *k_seg, int B, int Hq, int Hkv, int Lq,
                                          int Lk, int D, bool causal, bool blhd) {
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
                 .q_seg = q_seg,
                 .k_seg = k_seg,
                 .Hq = Hq,
                 .Hkv = Hkv,
                 .Lq = Lq,
                 .Lk = Lk,
                 .D = D,
                 .bq = query_block(D),
                 .blhd = blhd,
                 .causal = causal,
                 .scale = 1.0f / sqrtf((float)D)};
  atomic_init(&a.nomem, 0);
  int group = Hq / Hkv;
  tsr_parallel_for((int64_t)B * Hkv, min_units(Lq * group, Lk, D), backward_units, &a);
  if (atomic_load(&a.nomem))
    return TSR_ERROR(TSR_ENOMEM, "attention backward: out of memory for the tile buffers");
  return TSR_OK;
}

tsr_status tsr_kernel_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *out, const float *lse, const int32_t *q_pos,
                                         const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                         int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, NULL,
                                         NULL, B, Hq, Hkv, Lq, Lk, D, causal, false);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

tsr_status tsr_kernel_attention_backward_blhd(float *dq, float *dk, float *dv, const float *dout,
                                              const float *q, const float *k, const float *v,
                                              const float *out, const float *lse,
                                              const int32_t *q_pos, const int32_t *k_pos, int B,
                                              int Hq, int Hkv, int Lq, int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, NULL,
                                         NULL, B, Hq, Hkv, Lq, Lk, D, causal, true);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

/* Document masking: the same kernels with segment ids (tessera/kernels.h). */

tsr_status tsr_kernel_attention_forward_seg(float *out, float *lse, const float *q, const float *k,
                                            const float *v, const int32_t *q_pos,
                                            const int32_t *k_pos, const int32_t *q_seg,
                                            const int32_t *k_seg, int B, int Hq, int Hkv, int Lq,
                                            int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_forward_impl(out, lse, q, k, v, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv,
                                        Lq, Lk, D, causal, false);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

tsr_status tsr_kernel_attention_forward_seg_blhd(float *out, float *lse, const float *q,
                                                 const float *k, const float *v,
                                                 const int32_t *q_pos, const int32_t *k_pos,
                                                 const int32_t *q_seg, const int32_t *k_seg, int B,
                                                 int Hq, int Hkv, int Lq, int Lk, int D,
                                                 bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_forward_impl(out, lse, q, k, v, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv,
                                        Lq, Lk, D, causal, true);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

tsr_status tsr_kernel_attention_backward_seg(float *dq, float *dk, float *dv, const float *dout,
                                             const float *q, const float *k, const float *v,
                                             const float *out, const float *lse,
                                             const int32_t *q_pos, const int32_t *k_pos,
                                             const int32_t *q_seg, const int32_t *k_seg, int B,
                                             int Hq, int Hkv, int Lq, int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_seg,
                                         k_seg, B, Hq, Hkv, Lq, Lk, D, causal, false);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

tsr_status tsr_kernel_attention_backward_seg_blhd(float *dq, float *dk, float *dv,
                                                  const float *dout, const float *q, const float *k,
                                                  const float *v, const float *out,
                                                  const float *lse, const int32_t *q_pos,
                                                  const int32_t *k_pos, const int32_t *q_seg,
                                                  const int32_t *k_seg, int B, int Hq, int Hkv,
                                                  int Lq, int Lk, int D, bool causal) {
  int64_t t0 = tsr_profile_begin();
  tsr_status r = attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_seg,
                                         k_seg, B, Hq, Hkv, Lq, Lk, D, causal, true);
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
  return r;
}

/* ---------------------------------------------------------------------------------------------
 * Merge by log-sum-exp
 * ------------------------------------------------------------------------------------------- */

void tsr_kernel_attention_merge(float *out, float *lse, const float *out_a, const float *lse_a,
                                const float *out_b, const float *lse_b, int R, int D) {
  int64_t t0 = tsr_profile_begin();
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
  tsr_profile_end(TSR_KERNEL_ATTENTION, t0);
}
