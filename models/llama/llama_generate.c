/* Generation forward with a KV cache (llama_generate.h). */
#include "llama_generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/comm.h"
#include "tessera/kernels.h"

typedef struct gen_layer {
  const float *q, *k, *v, *o, *in_norm, *post_norm;
  const float *gate, *up, *down; /* dense MLP */
  const float *router;           /* (E, C); MoE layers */
  const float **w1, **w3, **w2;  /* (E) experts */
  float *kc, *vc;                /* (max_len, KV) caches */
} gen_layer;

struct tsr_llama_gen {
  tsr_llama_config cfg;
  tsr_group_t *group; /* tensor parallelism: NULL on one rank */
  int tp, tpr;        /* its size and this rank's index */
  float **owned;      /* column slices copied out of the weights */
  int nowned;
  int max_len, len;
  int C, V, I, H, Hkv, D, Q, KV, E;
  const float *embed, *norm, *lm_head;
  gen_layer *layers;
  float *cache;
  /* scratch for max_len rows */
  float *x, *h, *qb, *kb, *vb, *att, *tmp, *g, *u, *cos_t, *sin_t, *rlog, *comb, *probs, *rows,
      *rows_out, *last;
  int32_t *pos, *tok;
};

/* Weight `name`, checked to be (r, c) (c = 0: a vector), f32, contiguous, on the CPU. */
static const float *find(int n, const char *const *names, const tsr_tensor *const *ts,
                         const char *name, int64_t r, int64_t c, tsr_status *st) {
  if (*st != TSR_OK) return NULL;
  for (int i = 0; i < n; i++) {
    if (strcmp(names[i], name)) continue;
    const tsr_tensor *t = ts[i];
    bool ok = t->dtype == TSR_F32 && tsr_tensor_is_contiguous(t) &&
              tsr_tensor_device(t).kind == TSR_DEVICE_CPU && t->ndim == (c ? 2 : 1) &&
              t->shape[0] == r && (!c || t->shape[1] == c);
    if (!ok) {
      *st = tsr_error(TSR_EINVAL,
                      "generate: tensor '%s' must be a contiguous f32 CPU tensor of shape "
                      "(%lld%s%lld)",
                      name, (long long)r, c ? ", " : "", (long long)c);
      return NULL;
    }
    return tsr_tensor_data(t);
  }
  *st = tsr_error(TSR_EINVAL, "generate: no tensor '%s' among the weights", name);
  return NULL;
}

/* Rows [r0, r0 + nr) of a (r, c) weight: a pointer into it. */
static const float *rows_of(const float *w, int64_t c, int64_t r0) {
  return w ? w + r0 * c : NULL;
}

/* Columns [c0, c0 + nc) of a (r, c) weight, copied (the generator owns the copy). */
static const float *cols_of(tsr_llama_gen *g, const float *w, int64_t r, int64_t c, int64_t c0,
                            int64_t nc, tsr_status *st) {
  if (!w || *st != TSR_OK) return NULL;
  if (c0 == 0 && nc == c) return w;
  float **list = realloc(g->owned, ((size_t)g->nowned + 1) * sizeof *list);
  float *out = malloc((size_t)(r * nc) * sizeof *out);
  if (list) g->owned = list;
  if (!list || !out) {
    free(out);
    *st = TSR_ERROR(TSR_ENOMEM, "generate: out of memory slicing the weights");
    return NULL;
  }
  g->owned[g->nowned++] = out;
  for (int64_t i = 0; i < r; i++) memcpy(out + i * nc, w + i * c + c0, (size_t)nc * sizeof *out);
  return out;
}

void tsr_llama_gen_free(tsr_llama_gen *g) {
  if (!g) return;
  for (int l = 0; g->layers && l < g->cfg.num_hidden_layers; l++) {
    free(g->layers[l].w1);
    free(g->layers[l].w3);
    free(g->layers[l].w2);
  }
  free(g->layers);
  float *bufs[] = {g->cache, g->x,    g->h,     g->qb,   g->kb,       g->vb,
                   g->att,   g->tmp,  g->g,     g->u,    g->cos_t,    g->sin_t,
                   g->rlog,  g->comb, g->probs, g->rows, g->rows_out, g->last};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  for (int i = 0; i < g->nowned; i++) free(g->owned[i]);
  free(g->owned);
  free(g->pos);
  free(g->tok);
  free(g);
}

static float *fbuf(size_t n, bool *oom) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  if (!p) *oom = true;
  return p;
}

tsr_status tsr_llama_gen_new(const tsr_llama_config *cfg, int n, const char *const *names,
                             const tsr_tensor *const *tensors, int max_len, tsr_llama_gen **out) {
  return tsr_llama_gen_new_tp(cfg, n, names, tensors, max_len, NULL, out);
}

tsr_status tsr_llama_gen_new_tp(const tsr_llama_config *cfg, int n, const char *const *names,
                                const tsr_tensor *const *tensors, int max_len, tsr_group_t *tp,
                                tsr_llama_gen **out) {
  *out = NULL;
  TSR_CHECK(tsr_llama_config_check(cfg));
  if (max_len < 1) return tsr_error(TSR_EINVAL, "generate: max_len %d must be positive", max_len);
  int ntp = tp ? tsr_group_size(tp) : 1, r = tp ? tsr_group_index(tp) : 0;
  int H = cfg->num_attention_heads,
      Hkv = cfg->num_key_value_heads ? cfg->num_key_value_heads : cfg->num_attention_heads;
  if (H % ntp || Hkv % ntp)
    return tsr_error(TSR_EINVAL,
                     "generate: tp %d must divide num_attention_heads %d and num_key_value_heads "
                     "%d (each rank runs whole heads)",
                     ntp, H, Hkv);
  if (cfg->intermediate_size < ntp)
    return tsr_error(TSR_EINVAL, "generate: tp %d is more than intermediate_size %d", ntp,
                     cfg->intermediate_size);
  tsr_llama_gen *g = calloc(1, sizeof *g);
  if (!g) return TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  g->cfg = *cfg;
  g->group = ntp > 1 ? tp : NULL;
  g->tp = ntp;
  g->tpr = r;
  g->max_len = max_len;
  g->C = cfg->hidden_size;
  g->V = cfg->vocab_size;
  g->D = g->C / H;
  /* Megatron's split: this rank's heads (rows of q, k, v; columns of o) and its slice of the
   * MLP's width (rows of gate and up, columns of down; the same for each expert); embeddings,
   * norms, the router and lm_head whole on every rank */
  int64_t I = cfg->intermediate_size, i0 = tsr_chunk_start(I, ntp, r);
  g->I = (int)tsr_chunk_size(I, ntp, r);
  g->H = H / ntp;
  g->Hkv = Hkv / ntp;
  g->Q = g->H * g->D;
  g->KV = g->Hkv * g->D;
  g->E = cfg->num_local_experts;
  tsr_status st = TSR_OK;
  int L = cfg->num_hidden_layers, C = g->C, V = g->V, Q = g->Q, KV = g->KV, E = g->E;
  int64_t Qf = (int64_t)H * g->D, KVf = (int64_t)Hkv * g->D;
  g->embed = find(n, names, tensors, "model.embed_tokens.weight", V, C, &st);
  g->norm = find(n, names, tensors, "model.norm.weight", C, 0, &st);
  g->lm_head =
      cfg->tie_word_embeddings ? g->embed : find(n, names, tensors, "lm_head.weight", V, C, &st);
  g->layers = calloc((size_t)L, sizeof *g->layers);
  if (!g->layers) st = TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  bool oom = false;
  g->cache = st == TSR_OK ? fbuf((size_t)L * 2 * (size_t)max_len * (size_t)KV, &oom) : NULL;
  char nm[192];
#define W(r_, c_, ...)                                                                             \
  (snprintf(nm, sizeof nm, __VA_ARGS__), find(n, names, tensors, nm, r_, c_, &st))
  for (int l = 0; l < L && st == TSR_OK && !oom; l++) {
    gen_layer *y = &g->layers[l];
    y->q = rows_of(W(Qf, C, "model.layers.%d.self_attn.q_proj.weight", l), C, (int64_t)r * Q);
    y->k = rows_of(W(KVf, C, "model.layers.%d.self_attn.k_proj.weight", l), C, (int64_t)r * KV);
    y->v = rows_of(W(KVf, C, "model.layers.%d.self_attn.v_proj.weight", l), C, (int64_t)r * KV);
    y->o = cols_of(g, W(C, Qf, "model.layers.%d.self_attn.o_proj.weight", l), C, Qf, (int64_t)r * Q,
                   Q, &st);
    y->in_norm = W(C, 0, "model.layers.%d.input_layernorm.weight", l);
    y->post_norm = W(C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
    if (tsr_llama_layer_is_moe(cfg, l)) {
      y->router = W(E, C, "model.layers.%d.block_sparse_moe.gate.weight", l);
      y->w1 = calloc((size_t)E, sizeof *y->w1);
      y->w3 = calloc((size_t)E, sizeof *y->w3);
      y->w2 = calloc((size_t)E, sizeof *y->w2);
      if (!y->w1 || !y->w3 || !y->w2) oom = true;
      for (int e = 0; e < E && !oom; e++) {
        y->w1[e] =
            rows_of(W(I, C, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e), C, i0);
        y->w3[e] =
            rows_of(W(I, C, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), C, i0);
        y->w2[e] =
            cols_of(g, W(C, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), C, I,
                    i0, g->I, &st);
      }
    } else {
      y->gate = rows_of(W(I, C, "model.layers.%d.mlp.gate_proj.weight", l), C, i0);
      y->up = rows_of(W(I, C, "model.layers.%d.mlp.up_proj.weight", l), C, i0);
      y->down = cols_of(g, W(C, I, "model.layers.%d.mlp.down_proj.weight", l), C, I, i0, g->I, &st);
    }
    y->kc = g->cache + (size_t)l * 2 * (size_t)max_len * (size_t)KV;
    y->vc = y->kc + (size_t)max_len * (size_t)KV;
  }
#undef W
  int I_l = g->I;
  if (st == TSR_OK && !oom) {
    size_t T = (size_t)max_len, wide = (size_t)(Q > C ? Q : C);
    g->x = fbuf(T * (size_t)C, &oom);
    g->h = fbuf(T * (size_t)C, &oom);
    g->qb = fbuf(T * (size_t)Q, &oom);
    g->kb = fbuf(T * (size_t)KV, &oom);
    g->vb = fbuf(T * (size_t)KV, &oom);
    g->att = fbuf(T * (size_t)Q, &oom);
    g->tmp = fbuf(T * wide, &oom);
    g->g = fbuf(T * (size_t)I_l, &oom);
    g->u = fbuf(T * (size_t)I_l, &oom);
    g->cos_t = fbuf(T * (size_t)g->D, &oom);
    g->sin_t = fbuf(T * (size_t)g->D, &oom);
    g->rlog = fbuf(T * (size_t)(E ? E : 1), &oom);
    g->comb = fbuf(T * (size_t)(E ? E : 1), &oom);
    g->probs = fbuf(T * (size_t)(E ? E : 1), &oom);
    g->rows = fbuf(T * (size_t)C, &oom);
    g->rows_out = fbuf(T * (size_t)C, &oom);
    g->last = fbuf((size_t)C, &oom);
    g->pos = malloc(T * sizeof *g->pos);
    g->tok = malloc(T * sizeof *g->tok);
    if (!g->pos || !g->tok) oom = true;
  }
  if (st == TSR_OK && oom)
    st = TSR_ERROR(TSR_ENOMEM, "generate: out of memory for a cache of %d tokens", max_len);
  if (st != TSR_OK) {
    tsr_llama_gen_free(g);
    return st;
  }
  *out = g;
  return TSR_OK;
}

int tsr_llama_gen_len(const tsr_llama_gen *g) {
  return g->len;
}

void tsr_llama_gen_reset(tsr_llama_gen *g) {
  g->len = 0;
}

/* Mixtral's sparse block on T rows of h into out (T, C): the router's top-k, and each selected
 * expert's SwiGLU weighted by its renormalised probability, added in ascending expert order. */
static void moe_block(tsr_llama_gen *g, const gen_layer *y, const float *h, float *out, int T) {
  int C = g->C, I = g->I, E = g->E;
  float stats[2 * 4096];
  float *st = E <= 2048 ? stats : NULL;
  float *heap = st ? NULL : calloc(2 * (size_t)E, sizeof *heap);
  if (!st) st = heap;
  memset(st, 0, 2 * (size_t)E * sizeof *st);
  tsr_kernel_matmul_forward(g->rlog, h, y->router, NULL, T, C, E);
  tsr_kernel_moe_router_forward(g->comb, g->probs, st, g->rlog, T, E, g->cfg.num_experts_per_tok,
                                0.0f);
  free(heap);
  memset(out, 0, (size_t)T * (size_t)C * sizeof *out);
  for (int e = 0; e < E; e++) {
    int m = 0;
    for (int t = 0; t < T; t++) {
      if (g->comb[(size_t)t * E + e] == 0.0f) continue;
      memcpy(g->rows + (size_t)m * C, h + (size_t)t * C, (size_t)C * sizeof *h);
      g->tok[m++] = t;
    }
    if (!m) continue;
    tsr_kernel_matmul_forward(g->g, g->rows, y->w1[e], NULL, m, C, I);
    tsr_kernel_matmul_forward(g->u, g->rows, y->w3[e], NULL, m, C, I);
    tsr_kernel_swiglu_forward(g->g, g->g, g->u, (int64_t)m * I);
    tsr_kernel_matmul_forward(g->rows_out, g->g, y->w2[e], NULL, m, I, C);
    for (int r = 0; r < m; r++) {
      float w = g->comb[(size_t)g->tok[r] * E + e];
      float *o = out + (size_t)g->tok[r] * C;
      const float *yr = g->rows_out + (size_t)r * C;
      for (int c = 0; c < C; c++) o[c] += yr[c] * w;
    }
  }
}

/* Under tp: the sum over the ranks of their partial rows (T, C), in place. */
static tsr_status reduce(tsr_llama_gen *g, float *x, int T) {
  if (!g->group) return TSR_OK;
  return tsr_comm_all_reduce(g->group, x, x, (size_t)T * (size_t)g->C, TSR_F32, TSR_REDUCE_SUM);
}

tsr_status tsr_llama_gen_step(tsr_llama_gen *g, const int32_t *ids, int T, float *logits) {
  if (T < 1) return tsr_error(TSR_EINVAL, "generate: a step needs at least one token");
  if (g->len + T > g->max_len)
    return tsr_error(TSR_EINVAL,
                     "generate: %d tokens after %d would pass the cache's %d; give a smaller "
                     "prompt or fewer new tokens",
                     T, g->len, g->max_len);
  int C = g->C, Q = g->Q, KV = g->KV, I = g->I, D = g->D, p0 = g->len;
  float eps = g->cfg.rms_norm_eps;
  TSR_CHECK(tsr_kernel_embedding_forward(g->x, ids, g->embed, T, g->V, C));
  for (int t = 0; t < T; t++) g->pos[t] = p0 + t;
  TSR_CHECK(tsr_kernel_rope_tables(g->cos_t, g->sin_t, g->pos, T, D, g->cfg.rope_theta));
  float *rstd = g->rlog; /* T floats of room: rlog holds T * max(E, 1) */
  for (int l = 0; l < g->cfg.num_hidden_layers; l++) {
    gen_layer *y = &g->layers[l];
    tsr_kernel_rmsnorm_forward(g->h, rstd, g->x, y->in_norm, T, C, eps);
    tsr_kernel_matmul_forward(g->qb, g->h, y->q, NULL, T, C, Q);
    tsr_kernel_matmul_forward(g->kb, g->h, y->k, NULL, T, C, KV);
    tsr_kernel_matmul_forward(g->vb, g->h, y->v, NULL, T, C, KV);
    tsr_kernel_rope_forward(g->qb, g->qb, g->cos_t, g->sin_t, 1, T, g->H, D);
    tsr_kernel_rope_forward(g->kb, g->kb, g->cos_t, g->sin_t, 1, T, g->Hkv, D);
    memcpy(y->kc + (size_t)p0 * KV, g->kb, (size_t)T * KV * sizeof(float));
    memcpy(y->vc + (size_t)p0 * KV, g->vb, (size_t)T * KV * sizeof(float));
    float *lse_buf = malloc((size_t)g->H * (size_t)T * sizeof *lse_buf);
    if (!lse_buf) return TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
    tsr_status st = tsr_kernel_attention_forward_blhd(g->att, lse_buf, g->qb, y->kc, y->vc, g->pos,
                                                      NULL, 1, g->H, g->Hkv, T, p0 + T, D, true);
    free(lse_buf);
    TSR_CHECK(st);
    tsr_kernel_matmul_forward(g->tmp, g->att, y->o, NULL, T, Q, C);
    TSR_CHECK(reduce(g, g->tmp, T));
    for (size_t i = 0; i < (size_t)T * C; i++) g->x[i] += g->tmp[i];
    tsr_kernel_rmsnorm_forward(g->h, rstd, g->x, y->post_norm, T, C, eps);
    if (y->router) {
      moe_block(g, y, g->h, g->tmp, T);
    } else {
      tsr_kernel_matmul_forward(g->g, g->h, y->gate, NULL, T, C, I);
      tsr_kernel_matmul_forward(g->u, g->h, y->up, NULL, T, C, I);
      tsr_kernel_swiglu_forward(g->g, g->g, g->u, (int64_t)T * I);
      tsr_kernel_matmul_forward(g->tmp, g->g, y->down, NULL, T, I, C);
    }
    TSR_CHECK(reduce(g, g->tmp, T));
    for (size_t i = 0; i < (size_t)T * C; i++) g->x[i] += g->tmp[i];
  }
  /* only the last position's logits are wanted */
  float r;
  tsr_kernel_rmsnorm_forward(g->last, &r, g->x + (size_t)(T - 1) * C, g->norm, 1, C, eps);
  tsr_kernel_matmul_forward(logits, g->last, g->lm_head, NULL, 1, C, g->V);
  g->len += T;
  return TSR_OK;
}
