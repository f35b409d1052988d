/* Generation forward with a KV cache (llama_generate.h). */
#include "llama_generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const float *find(const tsr_llama_config *cfg, int n, const char *const *names,
                         const tsr_tensor *const *ts, const char *name, int64_t r, int64_t c,
                         tsr_status *st) {
  (void)cfg;
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
  *out = NULL;
  TSR_CHECK(tsr_llama_config_check(cfg));
  if (max_len < 1) return tsr_error(TSR_EINVAL, "generate: max_len %d must be positive", max_len);
  tsr_llama_gen *g = calloc(1, sizeof *g);
  if (!g) return TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  g->cfg = *cfg;
  g->max_len = max_len;
  g->C = cfg->hidden_size;
  g->V = cfg->vocab_size;
  g->I = cfg->intermediate_size;
  g->H = cfg->num_attention_heads;
  g->Hkv = cfg->num_key_value_heads ? cfg->num_key_value_heads : cfg->num_attention_heads;
  g->D = g->C / g->H;
  g->Q = g->H * g->D;
  g->KV = g->Hkv * g->D;
  g->E = cfg->num_local_experts;
  tsr_status st = TSR_OK;
  int L = cfg->num_hidden_layers, C = g->C, V = g->V, I = g->I, Q = g->Q, KV = g->KV, E = g->E;
  g->embed = find(cfg, n, names, tensors, "model.embed_tokens.weight", V, C, &st);
  g->norm = find(cfg, n, names, tensors, "model.norm.weight", C, 0, &st);
  g->lm_head = cfg->tie_word_embeddings ? g->embed
                                        : find(cfg, n, names, tensors, "lm_head.weight", V, C, &st);
  g->layers = calloc((size_t)L, sizeof *g->layers);
  if (!g->layers) st = TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  bool oom = false;
  g->cache = st == TSR_OK ? fbuf((size_t)L * 2 * (size_t)max_len * (size_t)KV, &oom) : NULL;
  char nm[192];
#define W(field, r, c, ...)                                                                        \
  do {                                                                                             \
    snprintf(nm, sizeof nm, __VA_ARGS__);                                                          \
    field = find(cfg, n, names, tensors, nm, r, c, &st);                                           \
  } while (0)
  for (int l = 0; l < L && st == TSR_OK && !oom; l++) {
    gen_layer *y = &g->layers[l];
    W(y->q, Q, C, "model.layers.%d.self_attn.q_proj.weight", l);
    W(y->k, KV, C, "model.layers.%d.self_attn.k_proj.weight", l);
    W(y->v, KV, C, "model.layers.%d.self_attn.v_proj.weight", l);
    W(y->o, C, Q, "model.layers.%d.self_attn.o_proj.weight", l);
    W(y->in_norm, C, 0, "model.layers.%d.input_layernorm.weight", l);
    W(y->post_norm, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
    if (tsr_llama_layer_is_moe(cfg, l)) {
      W(y->router, E, C, "model.layers.%d.block_sparse_moe.gate.weight", l);
      y->w1 = calloc((size_t)E, sizeof *y->w1);
      y->w3 = calloc((size_t)E, sizeof *y->w3);
      y->w2 = calloc((size_t)E, sizeof *y->w2);
      if (!y->w1 || !y->w3 || !y->w2) oom = true;
      for (int e = 0; e < E && !oom; e++) {
        W(y->w1[e], I, C, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
        W(y->w3[e], I, C, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
        W(y->w2[e], C, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
      }
    } else {
      W(y->gate, I, C, "model.layers.%d.mlp.gate_proj.weight", l);
      W(y->up, I, C, "model.layers.%d.mlp.up_proj.weight", l);
      W(y->down, C, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    y->kc = g->cache + (size_t)l * 2 * (size_t)max_len * (size_t)KV;
    y->vc = y->kc + (size_t)max_len * (size_t)KV;
  }
#undef W
  if (st == TSR_OK && !oom) {
    size_t T = (size_t)max_len, wide = (size_t)(Q > C ? Q : C);
    g->x = fbuf(T * (size_t)C, &oom);
    g->h = fbuf(T * (size_t)C, &oom);
    g->qb = fbuf(T * (size_t)Q, &oom);
    g->kb = fbuf(T * (size_t)KV, &oom);
    g->vb = fbuf(T * (size_t)KV, &oom);
    g->att = fbuf(T * (size_t)Q, &oom);
    g->tmp = fbuf(T * wide, &oom);
    g->g = fbuf(T * (size_t)I, &oom);
    g->u = fbuf(T * (size_t)I, &oom);
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
    for (size_t i = 0; i < (size_t)T * C; i++) g->x[i] += g->tmp[i];
  }
  /* only the last position's logits are wanted */
  float r;
  tsr_kernel_rmsnorm_forward(g->last, &r, g->x + (size_t)(T - 1) * C, g->norm, 1, C, eps);
  tsr_kernel_matmul_forward(logits, g->last, g->lm_head, NULL, 1, C, g->V);
  g->len += T;
  return TSR_OK;
}
