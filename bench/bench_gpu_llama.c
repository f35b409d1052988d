/* GPU training-step benchmark: a Llama decoder stack trained in bf16 mixed precision directly on
 * the CUDA kernel table, with the cuBLAS bf16 GEMM peak measured in the same run.
 *
 * The step is written once against the kernel table (tessera/device.h) and a GEMM hook, so it
 * runs on three engines:
 *   gpu-bf16  CUDA table; every matrix product in bf16 through cuBLAS with f32 accumulation and
 *             f32 output; f32 master weights, gradients and AdamW state; bf16 weight copies
 *             refreshed after each optimizer step; norms, RoPE, SwiGLU, attention, loss in f32.
 *   gpu-f32   CUDA table with IEEE f32 GEMMs (TF32 off): for parity with the CPU engine.
 *   cpu       CPU table (CBLAS): the reference the --check mode compares against.
 * It is not the `tessera run` path: the core's ops and the strategy plugins do not dispatch to
 * CUDA yet (docs/cuda.md), so this measures what the kernels and cuBLAS deliver for the model.
 *
 * FLOPs per token are 6·N + 6·L·h·s (docs/design.md §8) with N the parameters in matrix
 * products (the embedding lookup does none); MFU is achieved FLOP/s over the bf16 GEMM peak
 * measured here.
 *
 *   bench_gpu_llama [--preset 1b|tiny] [--steps N] [--engine gpu-bf16|gpu-f32|cpu]
 *                   [--attn gemm|kernel]   GPU attention: batched cuBLAS GEMMs (default) or the
 *                                          kernel table's attention kernel
 *   bench_gpu_llama --check        tiny preset on cpu, gpu-f32 and gpu-bf16; compares the losses
 *   bench_gpu_llama --gradcheck    tiny preset on cpu: backward against central differences
 * The last line is machine-readable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "tessera/device.h"
#include "tessera/tensor.h"
#include "tessera_cuda.h"

#define MAX_STEPS 64

typedef struct cfg {
  const char *name;
  int V, h, F, L, Hq, Hkv, B, S;
  float init_std; /* of the matrices; norm weights start at 1 */
} cfg;

/* ~0.89 B parameters: Llama-style proportions at hidden 2048 (TinyLlama-like, 16 layers). */
static const cfg PRESET_1B = {"1b", 32000, 2048, 5632, 16, 16, 8, 4, 2048, 0.02f};
/* Large weights on purpose: attention far from uniform, so every path of the backward carries a
 * gradient the checks can see. */
static const cfg PRESET_TINY = {"tiny", 64, 32, 64, 2, 4, 2, 2, 16, 0.3f};

typedef enum engine { ENGINE_GPU_BF16, ENGINE_GPU_F32, ENGINE_CPU } engine;

typedef struct dev {
  engine eng;
  const tsr_kernel_table *kt;
  tsr_cuda_ctx *ctx;
  uint16_t *cast_a, *cast_b; /* (cast_cap) bf16 scratch for activation operands */
  int64_t cast_cap;
  bool attn_gemm; /* attention through batched cuBLAS GEMMs rather than the table's kernel */
  bool profile;
  double prof[5]; /* seconds: gemm, attention, loss, optimizer, other */
  double prof_t0;
} dev;

enum { P_GEMM, P_ATTN, P_LOSS, P_OPT, P_OTHER };
static const char *const prof_names[] = {"gemm", "attention", "loss", "optimizer", "other"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "bench_gpu_llama: %s: %s\n", what, tsr_last_error());
  exit(1);
}

static bool on_gpu(const dev *d) {
  return d->eng != ENGINE_CPU;
}

static void sync_dev(dev *d) {
  if (on_gpu(d) && tsr_cuda_ctx_sync(d->ctx) != TSR_OK) die("device");
}

/* Profiling: with d->profile the device is drained around each phase so host time is its time. */
static void prof_begin(dev *d) {
  if (!d->profile) return;
  sync_dev(d);
  d->prof_t0 = now_s();
}

static void prof_end(dev *d, int what) {
  if (!d->profile) return;
  sync_dev(d);
  d->prof[what] += now_s() - d->prof_t0;
}

/* ---- buffers ---- */

static void *dnew(dev *d, size_t bytes) {
  void *p = NULL;
  if (on_gpu(d)) {
    /* Zeroed on the compute stream, so every later use is ordered after it. */
    p = tsr_allocator_alloc(tsr_cuda_ctx_allocator(d->ctx), bytes);
    if (p && cudaMemsetAsync(p, 0, bytes, (cudaStream_t)tsr_cuda_ctx_compute_stream(d->ctx)) !=
                 cudaSuccess)
      p = NULL;
  } else {
    p = calloc(1, bytes ? bytes : 1);
  }
  if (!p) {
    fprintf(stderr, "bench_gpu_llama: cannot allocate %zu bytes\n", bytes);
    exit(1);
  }
  return p;
}

static float *fnew(dev *d, int64_t n) {
  return dnew(d, (size_t)n * sizeof(float));
}

static void dzero(dev *d, void *p, size_t bytes) {
  if (on_gpu(d)) {
    if (cudaMemsetAsync(p, 0, bytes, (cudaStream_t)tsr_cuda_ctx_compute_stream(d->ctx)) !=
        cudaSuccess)
      die("cudaMemsetAsync");
  } else {
    memset(p, 0, bytes);
  }
}

static void dcopy(dev *d, float *dst, const float *src, int64_t n) {
  if (on_gpu(d)) {
    if (cudaMemcpyAsync(dst, src, (size_t)n * 4, cudaMemcpyDeviceToDevice,
                        (cudaStream_t)tsr_cuda_ctx_compute_stream(d->ctx)) != cudaSuccess)
      die("cudaMemcpyAsync");
  } else {
    memcpy(dst, src, (size_t)n * 4);
  }
}

static void upload(dev *d, void *dst, const void *src, size_t bytes) {
  if (on_gpu(d)) {
    if (tsr_cuda_copy_to_device(d->ctx, dst, src, bytes) != TSR_OK) die("upload");
  } else {
    memcpy(dst, src, bytes);
  }
}

/* c = op(a)·op(b) + beta·c, row-major. On gpu-bf16 operands without a bf16 copy are cast into
 * the scratch first (activations); weights pass their copy. */
static void mm(dev *d, float *c, const float *a, const uint16_t *a_bf, const float *b,
               const uint16_t *b_bf, int M, int N, int K, bool ta, bool tb, float beta) {
  prof_begin(d);
  if (d->eng != ENGINE_GPU_BF16) {
    d->kt->gemm(c, a, b, M, N, K, ta, tb, 1.0f, beta);
  } else {
    if (!a_bf) {
      tsr_cuda_f32_to_bf16(d->cast_a, a, (int64_t)M * K);
      a_bf = d->cast_a;
    }
    if (!b_bf) {
      tsr_cuda_f32_to_bf16(d->cast_b, b, (int64_t)K * N);
      b_bf = d->cast_b;
    }
    if (tsr_cuda_gemm_bf16(d->ctx, c, false, a_bf, b_bf, M, N, K, ta, tb, 1.0f, beta) != TSR_OK)
      die("bf16 gemm");
  }
  prof_end(d, P_GEMM);
}

/* ---- parameters ---- */

typedef struct param {
  int64_t n;
  float *w, *g, *m, *v; /* (n) master weight, gradient, AdamW moments */
  uint16_t *wb;         /* (n) bf16 copy, gpu-bf16 only */
} param;

typedef struct layer_p {
  param attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd;
} layer_p;

typedef struct layer_a { /* activations saved for backward; T = B·S tokens */
  float *n1, *rstd1, *q, *k, *v, *qh, *kh, *vh, *oh, *lse, *o, *x1, *n2, *rstd2, *g, *u, *m;
} layer_a;

typedef struct model {
  cfg c;
  int D, T;
  param embed, final_norm, lm_head;
  layer_p *lp;
  layer_a *la;
  float **xs; /* (L + 1) residual stream at each layer's input, xs[L] the last output */
  float *nf, *rstdf, *logits, *dlogits, *cos_t, *sin_t;
  float *dx, *dn, *dm, *dg, *du, *do_, *doh, *dqh, *dkh, *dvh, *dq, *dk, *dv, *dq2, *dk2;
  int32_t *ids, *targets;
  param **all;
  int n_all;
  int steps_done; /* AdamW's step count */
} model;

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform with std m->c.init_std (half-width std·√3), or all ones for norm weights. */
static void param_init(dev *d, model *m, param *p, int64_t n, bool ones, uint64_t *seed) {
  p->n = n;
  p->w = fnew(d, n), p->g = fnew(d, n), p->m = fnew(d, n), p->v = fnew(d, n);
  p->wb = d->eng == ENGINE_GPU_BF16 ? dnew(d, (size_t)n * 2) : NULL;
  float *host = malloc((size_t)n * 4);
  if (!host) die("host init buffer");
  const float a = m->c.init_std * sqrtf(3.0f);
  for (int64_t i = 0; i < n; i++)
    host[i] =
        ones ? 1.0f : (float)((double)(rng_next(seed) >> 11) / 9007199254740992.0 * 2 - 1) * a;
  upload(d, p->w, host, (size_t)n * 4);
  free(host);
  m->all[m->n_all++] = p;
}

static void refresh_bf16(dev *d, model *m) {
  if (d->eng != ENGINE_GPU_BF16) return;
  for (int i = 0; i < m->n_all; i++)
    tsr_cuda_f32_to_bf16(m->all[i]->wb, m->all[i]->w, m->all[i]->n);
}

static void model_init(dev *d, model *m, cfg c) {
  memset(m, 0, sizeof *m);
  m->c = c;
  m->D = c.h / c.Hq;
  m->T = c.B * c.S;
  int64_t T = m->T, h = c.h, F = c.F, qd = (int64_t)c.Hq * m->D, kd = (int64_t)c.Hkv * m->D;
  m->all = calloc((size_t)(3 + 9 * c.L), sizeof *m->all);
  m->lp = calloc((size_t)c.L, sizeof *m->lp);
  m->la = calloc((size_t)c.L, sizeof *m->la);
  m->xs = calloc((size_t)c.L + 1, sizeof *m->xs);
  uint64_t seed = 1234;
  param_init(d, m, &m->embed, (int64_t)c.V * h, false, &seed);
  for (int l = 0; l < c.L; l++) {
    layer_p *p = &m->lp[l];
    param_init(d, m, &p->attn_norm, h, true, &seed);
    param_init(d, m, &p->wq, qd * h, false, &seed);
    param_init(d, m, &p->wk, kd * h, false, &seed);
    param_init(d, m, &p->wv, kd * h, false, &seed);
    param_init(d, m, &p->wo, h * qd, false, &seed);
    param_init(d, m, &p->mlp_norm, h, true, &seed);
    param_init(d, m, &p->wg, F * h, false, &seed);
    param_init(d, m, &p->wu, F * h, false, &seed);
    param_init(d, m, &p->wd, h * F, false, &seed);
    layer_a *a = &m->la[l];
    a->n1 = fnew(d, T * h), a->rstd1 = fnew(d, T), a->q = fnew(d, T * qd);
    a->k = fnew(d, T * kd), a->v = fnew(d, T * kd), a->qh = fnew(d, T * qd);
    a->kh = fnew(d, T * kd), a->vh = fnew(d, T * kd), a->oh = fnew(d, T * qd);
    a->lse = fnew(d, (int64_t)c.B * c.Hq * c.S), a->o = fnew(d, T * qd), a->x1 = fnew(d, T * h);
    a->n2 = fnew(d, T * h), a->rstd2 = fnew(d, T), a->g = fnew(d, T * F), a->u = fnew(d, T * F);
    a->m = fnew(d, T * F);
  }
  param_init(d, m, &m->final_norm, h, true, &seed);
  param_init(d, m, &m->lm_head, (int64_t)c.V * h, false, &seed);
  for (int l = 0; l <= c.L; l++) m->xs[l] = fnew(d, T * h);
  m->nf = fnew(d, T * h), m->rstdf = fnew(d, T);
  m->logits = fnew(d, T * c.V), m->dlogits = fnew(d, T * c.V);
  m->cos_t = fnew(d, (int64_t)c.S * m->D), m->sin_t = fnew(d, (int64_t)c.S * m->D);
  m->dx = fnew(d, T * h), m->dn = fnew(d, T * h);
  m->dm = fnew(d, T * F), m->dg = fnew(d, T * F), m->du = fnew(d, T * F);
  m->do_ = fnew(d, T * qd), m->doh = fnew(d, T * qd), m->dqh = fnew(d, T * qd);
  m->dkh = fnew(d, T * kd), m->dvh = fnew(d, T * kd), m->dq = fnew(d, T * qd);
  m->dk = fnew(d, T * kd), m->dv = fnew(d, T * kd), m->dq2 = fnew(d, T * qd);
  m->dk2 = fnew(d, T * kd);
  /* A learnable stream: token t of row b is (7t + 3b) mod V and its target the next id. */
  int32_t *ids = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
  for (int b = 0; b < c.B; b++)
    for (int s = 0; s < c.S; s++) {
      ids[b * c.S + s] = (7 * s + 3 * b) % c.V;
      tg[b * c.S + s] = (7 * s + 3 * b + 1) % c.V;
    }
  m->ids = dnew(d, (size_t)T * 4), m->targets = dnew(d, (size_t)T * 4);
  upload(d, m->ids, ids, (size_t)T * 4);
  upload(d, m->targets, tg, (size_t)T * 4);
  free(ids), free(tg);
  if (d->kt->rope_tables(m->cos_t, m->sin_t, NULL, c.S, m->D, 10000.0f) != TSR_OK)
    die("rope tables");
  if (d->eng == ENGINE_GPU_BF16) {
    int64_t cap = T * (c.V > F ? c.V : F);
    if ((int64_t)c.V * h > cap) cap = (int64_t)c.V * h;
    d->cast_cap = cap;
    d->cast_a = dnew(d, (size_t)cap * 2), d->cast_b = dnew(d, (size_t)cap * 2);
  }
  refresh_bf16(d, m);
}

/* Parameters in matrix products: q, k, v, o, gate, up, down of every layer and the lm head (not
 * the embedding table, a lookup, nor the norm weights, element-wise). */
static double matmul_params(const cfg *c) {
  double qd = (double)c->Hq * (c->h / c->Hq), kd = (double)c->Hkv * (c->h / c->Hq);
  double layer = 2.0 * qd * c->h + 2.0 * kd * c->h + 3.0 * c->F * c->h;
  return c->L * layer + (double)c->V * c->h;
}

static void dev_init(dev *d, engine eng);

/* ---- the step ---- */

static void linear_fwd(dev *d, float *y, const float *x, const param *w, int T, int OC, int C) {
  mm(d, y, x, NULL, w->w, w->wb, T, OC, C, false, true, 0.0f);
}

/* dx (= or += by beta) dy·W and dW += dyᵀ·x. */
static void linear_bwd(dev *d, float *dx, float beta, const float *dy, const float *x, param *w,
                       int T, int OC, int C) {
  if (dx) mm(d, dx, dy, NULL, w->w, w->wb, T, C, OC, false, false, beta);
  mm(d, w->g, dy, NULL, x, NULL, OC, C, T, true, false, 1.0f);
}

/* Forward and backward: returns the loss and leaves the gradients in each param's g. */
static float forward_backward(dev *d, model *m) {
  const cfg *c = &m->c;
  const tsr_kernel_table *kt = d->kt;
  int T = m->T, h = c->h, F = c->F, D = m->D, qd = c->Hq * D, kd = c->Hkv * D;
  prof_begin(d);
  if (kt->embedding_forward(m->xs[0], m->ids, m->embed.w, T, c->V, h) != TSR_OK) die("embedding");
  prof_end(d, P_OTHER);
  for (int l = 0; l < c->L; l++) {
    layer_p *p = &m->lp[l];
    layer_a *a = &m->la[l];
    const float *x = m->xs[l];
    prof_begin(d);
    kt->rmsnorm_forward(a->n1, a->rstd1, x, p->attn_norm.w, T, h, 1e-5f);
    prof_end(d, P_OTHER);
    linear_fwd(d, a->q, a->n1, &p->wq, T, qd, h);
    linear_fwd(d, a->k, a->n1, &p->wk, T, kd, h);
    linear_fwd(d, a->v, a->n1, &p->wv, T, kd, h);
    prof_begin(d);
    kt->rope_forward(a->q, a->q, m->cos_t, m->sin_t, c->B, c->S, c->Hq, D);
    kt->rope_forward(a->k, a->k, m->cos_t, m->sin_t, c->B, c->S, c->Hkv, D);
    kt->blhd_to_bhld(a->qh, a->q, c->B, c->S, c->Hq, D);
    kt->blhd_to_bhld(a->kh, a->k, c->B, c->S, c->Hkv, D);
    kt->blhd_to_bhld(a->vh, a->v, c->B, c->S, c->Hkv, D);
    prof_end(d, P_OTHER);
    prof_begin(d);
    tsr_status ast = d->attn_gemm
                         ? tsr_cuda_attention_gemm_forward(d->ctx, a->oh, a->lse, a->qh, a->kh,
                                                           a->vh, c->B, c->Hq, c->Hkv, c->S, c->S,
                                                           D, true, d->eng == ENGINE_GPU_BF16)
                         : kt->attention_forward(a->oh, a->lse, a->qh, a->kh, a->vh, NULL, NULL,
                                                 c->B, c->Hq, c->Hkv, c->S, c->S, D, true);
    if (ast != TSR_OK) die("attention forward");
    prof_end(d, P_ATTN);
    prof_begin(d);
    kt->bhld_to_blhd(a->o, a->oh, c->B, c->S, c->Hq, D);
    dcopy(d, a->x1, x, (int64_t)T * h);
    prof_end(d, P_OTHER);
    mm(d, a->x1, a->o, NULL, p->wo.w, p->wo.wb, T, h, qd, false, true, 1.0f); /* x1 = x + o·Woᵀ */
    prof_begin(d);
    kt->rmsnorm_forward(a->n2, a->rstd2, a->x1, p->mlp_norm.w, T, h, 1e-5f);
    prof_end(d, P_OTHER);
    linear_fwd(d, a->g, a->n2, &p->wg, T, F, h);
    linear_fwd(d, a->u, a->n2, &p->wu, T, F, h);
    prof_begin(d);
    kt->swiglu_forward(a->m, a->g, a->u, (int64_t)T * F);
    dcopy(d, m->xs[l + 1], a->x1, (int64_t)T * h);
    prof_end(d, P_OTHER);
    mm(d, m->xs[l + 1], a->m, NULL, p->wd.w, p->wd.wb, T, h, F, false, true, 1.0f);
  }
  prof_begin(d);
  kt->rmsnorm_forward(m->nf, m->rstdf, m->xs[c->L], m->final_norm.w, T, h, 1e-5f);
  prof_end(d, P_OTHER);
  linear_fwd(d, m->logits, m->nf, &m->lm_head, T, c->V, h);
  float loss = NAN;
  prof_begin(d);
  dzero(d, m->dlogits, (size_t)T * c->V * 4);
  if (kt->cross_entropy(&loss, NULL, m->dlogits, m->logits, m->targets, T, c->V, 1.0f) != TSR_OK)
    die("cross entropy");
  prof_end(d, P_LOSS);

  /* Backward. m->dx carries d(residual stream) downwards. */
  linear_bwd(d, m->dn, 0.0f, m->dlogits, m->nf, &m->lm_head, T, c->V, h);
  prof_begin(d);
  dzero(d, m->dx, (size_t)T * h * 4);
  kt->rmsnorm_backward(m->dx, m->final_norm.g, m->dn, m->xs[c->L], m->final_norm.w, m->rstdf, T, h);
  prof_end(d, P_OTHER);
  for (int l = c->L - 1; l >= 0; l--) {
    layer_p *p = &m->lp[l];
    layer_a *a = &m->la[l];
    linear_bwd(d, m->dm, 0.0f, m->dx, a->m, &p->wd, T, h, F);
    prof_begin(d);
    dzero(d, m->dg, (size_t)T * F * 4);
    dzero(d, m->du, (size_t)T * F * 4);
    kt->swiglu_backward(m->dg, m->du, m->dm, a->g, a->u, (int64_t)T * F);
    prof_end(d, P_OTHER);
    linear_bwd(d, m->dn, 0.0f, m->dg, a->n2, &p->wg, T, F, h);
    linear_bwd(d, m->dn, 1.0f, m->du, a->n2, &p->wu, T, F, h);
    prof_begin(d);
    kt->rmsnorm_backward(m->dx, p->mlp_norm.g, m->dn, a->x1, p->mlp_norm.w, a->rstd2, T, h);
    prof_end(d, P_OTHER);
    linear_bwd(d, m->do_, 0.0f, m->dx, a->o, &p->wo, T, h, qd);
    prof_begin(d);
    kt->blhd_to_bhld(m->doh, m->do_, c->B, c->S, c->Hq, D);
    dzero(d, m->dqh, (size_t)T * qd * 4);
    dzero(d, m->dkh, (size_t)T * kd * 4);
    dzero(d, m->dvh, (size_t)T * kd * 4);
    prof_end(d, P_OTHER);
    prof_begin(d);
    tsr_status ast =
        d->attn_gemm
            ? tsr_cuda_attention_gemm_backward(d->ctx, m->dqh, m->dkh, m->dvh, m->doh, a->qh, a->kh,
                                               a->vh, a->oh, a->lse, c->B, c->Hq, c->Hkv, c->S,
                                               c->S, D, true, d->eng == ENGINE_GPU_BF16)
            : kt->attention_backward(m->dqh, m->dkh, m->dvh, m->doh, a->qh, a->kh, a->vh, a->oh,
                                     a->lse, NULL, NULL, c->B, c->Hq, c->Hkv, c->S, c->S, D, true);
    if (ast != TSR_OK) die("attention backward");
    prof_end(d, P_ATTN);
    prof_begin(d);
    kt->bhld_to_blhd(m->dq, m->dqh, c->B, c->S, c->Hq, D);
    kt->bhld_to_blhd(m->dk, m->dkh, c->B, c->S, c->Hkv, D);
    kt->bhld_to_blhd(m->dv, m->dvh, c->B, c->S, c->Hkv, D);
    dzero(d, m->dq2, (size_t)T * qd * 4);
    dzero(d, m->dk2, (size_t)T * kd * 4);
    kt->rope_backward(m->dq2, m->dq, m->cos_t, m->sin_t, c->B, c->S, c->Hq, D);
    kt->rope_backward(m->dk2, m->dk, m->cos_t, m->sin_t, c->B, c->S, c->Hkv, D);
    prof_end(d, P_OTHER);
    linear_bwd(d, m->dn, 0.0f, m->dq2, a->n1, &p->wq, T, qd, h);
    linear_bwd(d, m->dn, 1.0f, m->dk2, a->n1, &p->wk, T, kd, h);
    linear_bwd(d, m->dn, 1.0f, m->dv, a->n1, &p->wv, T, kd, h);
    prof_begin(d);
    kt->rmsnorm_backward(m->dx, p->attn_norm.g, m->dn, m->xs[l], p->attn_norm.w, a->rstd1, T, h);
    prof_end(d, P_OTHER);
  }
  prof_begin(d);
  if (kt->embedding_backward(m->embed.g, m->dx, m->ids, T, c->V, h) != TSR_OK)
    die("embedding backward");
  prof_end(d, P_OTHER);
  return loss;
}

/* clip_grad_norm_(1.0), AdamW, zero the gradients, refresh the bf16 copies. */
static void optimizer_step(dev *d, model *m) {
  const tsr_kernel_table *kt = d->kt;
  prof_begin(d);
  int step_no = ++m->steps_done;
  const float **bufs = malloc((size_t)m->n_all * sizeof *bufs);
  int64_t *sizes = malloc((size_t)m->n_all * sizeof *sizes);
  for (int i = 0; i < m->n_all; i++) bufs[i] = m->all[i]->g, sizes[i] = m->all[i]->n;
  double norm = kt->global_norm(bufs, sizes, m->n_all);
  float coef = kt->clip_coef(norm, 1.0);
  for (int i = 0; i < m->n_all; i++) {
    param *p = m->all[i];
    if (coef < 1.0f) kt->scale(p->g, p->n, coef);
    kt->adamw(p->w, p->g, p->m, p->v, p->n, step_no, 1e-3, 0.9, 0.95, 1e-8, 0.1);
    dzero(d, p->g, (size_t)p->n * 4);
  }
  refresh_bf16(d, m);
  free(bufs), free(sizes);
  prof_end(d, P_OPT);
  sync_dev(d);
}

static float step(dev *d, model *m) {
  float loss = forward_backward(d, m);
  optimizer_step(d, m);
  return loss;
}

/* Central differences of the loss against the backward's gradients, on the CPU engine, for a few
 * entries of every parameter (h = 1e-2: the f32 loss of ~4 is exact to ~5e-7, i.e. 3e-5 after
 * dividing by 2h, far below the tolerance). */
static int run_gradcheck(void) {
  dev d;
  model m;
  dev_init(&d, ENGINE_CPU);
  model_init(&d, &m, PRESET_TINY);
  for (int s = 0; s < 3; s++) (void)step(&d, &m); /* away from the symmetric start */
  (void)forward_backward(&d, &m);
  int bad = 0, checked = 0;
  uint64_t seed = 99;
  /* The perturbed passes accumulate into g as well: keep the gradients of the unperturbed one. */
  float **grads = malloc((size_t)m.n_all * sizeof *grads);
  for (int i = 0; i < m.n_all; i++) {
    grads[i] = malloc((size_t)m.all[i]->n * 4);
    memcpy(grads[i], m.all[i]->g, (size_t)m.all[i]->n * 4);
  }
  for (int i = 0; i < m.n_all; i++) {
    param *p = m.all[i];
    const float *g = grads[i];
    for (int r = 0; r < 4; r++) {
      int64_t j = (int64_t)(rng_next(&seed) % (uint64_t)p->n);
      const float h = 1e-2f;
      float w0 = p->w[j];
      p->w[j] = w0 + h;
      double lp = forward_backward(&d, &m);
      p->w[j] = w0 - h;
      double lm = forward_backward(&d, &m);
      p->w[j] = w0;
      double num = (lp - lm) / (2.0 * h);
      checked++;
      if (!(fabs(num - g[j]) <= 2e-2 * fabs(num) + 2e-3)) {
        printf("gradcheck param %d entry %lld: backward %.6g, central difference %.6g\n", i,
               (long long)j, g[j], num);
        bad++;
      }
    }
  }
  for (int i = 0; i < m.n_all; i++) free(grads[i]);
  free(grads);
  printf("bench_gpu_llama gradcheck=%s (%d entries of %d parameters)\n", bad ? "FAIL" : "ok",
         checked, m.n_all);
  return bad ? 1 : 0;
}

/* ---- engines and modes ---- */

/* The kernel table the core serves for tensors of `alloc` (NULL: the CPU), as a rule reads it. */
static const tsr_kernel_table *core_table(tsr_allocator *alloc, const char *what) {
  int64_t one = 1;
  tsr_tensor *t = NULL;
  if (tsr_device_check(alloc ? alloc->device : (tsr_device){TSR_DEVICE_CPU, 0}) != TSR_OK ||
      tsr_tensor_new(alloc, TSR_F32, 1, &one, &t) != TSR_OK)
    die(what);
  const tsr_kernel_table *k = tsr_kernel_table_of(t);
  tsr_tensor_free(t);
  return k;
}

static void dev_init(dev *d, engine eng) {
  memset(d, 0, sizeof *d);
  d->eng = eng;
  if (eng == ENGINE_CPU) {
    d->kt = core_table(NULL, "CPU kernel table");
    return;
  }
  if (tsr_cuda_ctx_create(0, &d->ctx) != TSR_OK) die("CUDA context");
  tsr_cuda_ctx_make_current(d->ctx);
  tsr_cuda_ctx_set_tf32(d->ctx, false); /* f32 GEMMs are IEEE on gpu-f32; bf16 ones are bf16 */
  d->kt = core_table(tsr_cuda_ctx_allocator(d->ctx), "CUDA kernel table");
  d->attn_gemm = true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int run_check(void) {
  char why[256] = "";
  if (tsr_cuda_device_count(why, sizeof why) == 0) {
    printf("SKIP bench_gpu_llama --check: no CUDA device (%s)\n", why);
    return 77;
  }
  const int steps = 4;
  /* cpu; gpu-f32 with each attention; gpu-bf16 (GEMM attention). */
  const engine engs[4] = {ENGINE_CPU, ENGINE_GPU_F32, ENGINE_GPU_F32, ENGINE_GPU_BF16};
  const bool gemm_attn[4] = {false, true, false, true};
  const char *names[4] = {"cpu", "gpu-f32", "gpu-f32/kernel-attn", "gpu-bf16"};
  float loss[4][4];
  for (int e = 0; e < 4; e++) {
    dev d;
    model m;
    dev_init(&d, engs[e]);
    d.attn_gemm = gemm_attn[e];
    model_init(&d, &m, PRESET_TINY);
    for (int s = 0; s < steps; s++) loss[e][s] = step(&d, &m);
    if (d.ctx) tsr_cuda_ctx_destroy(d.ctx); /* the process ends soon; buffers go with it */
  }
  /* gpu-f32 runs the CPU's algorithm with other summation orders: 1e-4 relative over 4 steps.
   * gpu-bf16 rounds every GEMM operand to 8 mantissa bits: 2e-2 relative is what bf16 training
   * of this size keeps to; larger is a bug, not rounding. */
  int bad = 0;
  for (int s = 0; s < steps; s++) {
    printf("check step %d: loss cpu %.7f", s, loss[0][s]);
    for (int e = 1; e < 4; e++) {
      double rel = fabs(loss[e][s] - loss[0][s]) / fabs(loss[0][s]);
      printf("  %s %.7f (rel %.2e)", names[e], loss[e][s], rel);
      bad += !(rel <= (engs[e] == ENGINE_GPU_BF16 ? 2e-2 : 1e-4));
    }
    printf("\n");
  }
  bad += !(loss[0][steps - 1] < loss[0][0]);
  printf("bench_gpu_llama check=%s\n", bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  cfg c = PRESET_1B;
  int steps = 5;
  engine eng = ENGINE_GPU_BF16;
  bool kernel_attn = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) return run_check();
    if (!strcmp(argv[i], "--gradcheck")) return run_gradcheck();
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
      i++;
      c = !strcmp(argv[i], "tiny") ? PRESET_TINY : PRESET_1B;
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--attn") && i + 1 < argc) {
      kernel_attn = !strcmp(argv[++i], "kernel");
    } else if (!strcmp(argv[i], "--engine") && i + 1 < argc) {
      i++;
      eng = !strcmp(argv[i], "cpu")       ? ENGINE_CPU
            : !strcmp(argv[i], "gpu-f32") ? ENGINE_GPU_F32
                                          : ENGINE_GPU_BF16;
    } else {
      fprintf(stderr, "usage: bench_gpu_llama [--preset 1b|tiny] [--steps N] "
                      "[--engine gpu-bf16|gpu-f32|cpu] [--attn gemm|kernel] | --check | "
                      "--gradcheck\n");
      return 2;
    }
  }
  if (steps < 1 || steps > MAX_STEPS) steps = 5;
  dev d;
  dev_init(&d, eng);
  if (kernel_attn) d.attn_gemm = false;
  double peak_tflops, peak_tf32 = 0.0;
  if (on_gpu(&d)) {
    peak_tflops = tsr_cuda_gemm_peak_tflops(d.ctx, true, 8192, 2.0);
    tsr_cuda_ctx_set_tf32(d.ctx, true);
    peak_tf32 = tsr_cuda_gemm_peak_tflops(d.ctx, false, 8192, 1.0);
    tsr_cuda_ctx_set_tf32(d.ctx, false);
    printf("cuBLAS peak, 8192^3: bf16 %.1f TFLOP/s, tf32 %.1f TFLOP/s\n", peak_tflops, peak_tf32);
  } else {
    peak_tflops = tsr_kernel_sgemm_peak_gflops(1, 1.0) * 1e-3;
    printf("CBLAS sgemm peak, 1 thread: %.4f TFLOP/s\n", peak_tflops);
  }
  if (!(peak_tflops > 0)) die("peak GEMM measurement");
  model m;
  double t0 = now_s();
  model_init(&d, &m, c);
  sync_dev(&d);
  double n_mm = matmul_params(&c);
  double n_all = n_mm + (double)c.V * c.h + (2.0 * c.L + 1) * c.h;
  printf("preset %s: vocab %d hidden %d ffn %d layers %d heads %d/%d batch %d seq %d; %.3f B "
         "params (%.3f B in matmuls); init %.1f s\n",
         c.name, c.V, c.h, c.F, c.L, c.Hq, c.Hkv, c.B, c.S, n_all * 1e-9, n_mm * 1e-9,
         now_s() - t0);
  float loss0 = step(&d, &m); /* warm-up: cuBLAS heuristics, allocator */
  double times[MAX_STEPS];
  float loss = loss0;
  for (int s = 0; s < steps; s++) {
    double ts = now_s();
    loss = step(&d, &m);
    times[s] = now_s() - ts;
  }
  d.profile = true;
  (void)step(&d, &m);
  qsort(times, (size_t)steps, sizeof times[0], cmp_double);
  double med = times[steps / 2];
  double tokens = (double)c.B * c.S;
  double flops = (6.0 * n_mm + 6.0 * c.L * c.h * c.S) * tokens;
  double tflops = flops / med * 1e-12;
  double mfu = tflops / peak_tflops;
  printf("step (median of %d): %.4f s, %.0f tokens/s, %.1f TFLOP/s achieved, MFU %.1f %% of "
         "the measured %s peak\n",
         steps, med, tokens / med, tflops, 100 * mfu, on_gpu(&d) ? "bf16 GEMM" : "sgemm");
  double tot = 0;
  for (int i = 0; i < 5; i++) tot += d.prof[i];
  printf("profiled step (device drained around each phase, %.3f s):", tot);
  for (int i = 0; i < 5; i++)
    printf(" %s %.1f%%", prof_names[i], tot > 0 ? 100 * d.prof[i] / tot : 0);
  printf("\nloss: warm-up step %.4f, last timed step %.4f (ln V = %.4f)\n", loss0, loss,
         log((double)c.V));
  printf("bench_gpu_llama preset=%s engine=%s attn=%s tokens_per_s=%.1f step_s=%.4f tflops=%.2f "
         "peak_tflops=%.2f mfu=%.4f loss0=%.4f loss=%.4f\n",
         c.name,
         eng == ENGINE_CPU       ? "cpu"
         : eng == ENGINE_GPU_F32 ? "gpu-f32"
                                 : "gpu-bf16",
         d.attn_gemm ? "gemm" : "kernel", tokens / med, med, tflops, peak_tflops, mfu, loss0, loss);
  if (d.ctx) tsr_cuda_ctx_destroy(d.ctx);
  return isfinite(loss) ? 0 : 1;
}
