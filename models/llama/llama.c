/* Llama (Hugging Face LlamaForCausalLM semantics) written against the public API only.
 *
 * Reads top to bottom: config checks, parameter layout (one allocation per rank, every
 * parameter's local tensor a view into it), deterministic initialisation, forward. The parallel
 * strategies never appear here: they reach the model through the module styles that place its
 * parameters and activations, and through the op rules the ops consult.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llama_impl.h"
#include "tessera/ops.h"
#include "tessera/registry.h"

/* The mesh of pipeline stage s: a pp coordinate holds the stages s, s + npp, s + 2 npp, ... */
static const tsr_mesh_t *smesh(const tsr_llama_t *m, int s) {
  return m->stages[s % m->npp];
}

tsr_status tsr_llama_config_check(const tsr_llama_config *c) {
  struct {
    const char *key;
    int value;
  } sizes[] = {{"vocab_size", c->vocab_size},
               {"hidden_size", c->hidden_size},
               {"intermediate_size", c->intermediate_size},
               {"num_hidden_layers", c->num_hidden_layers},
               {"num_attention_heads", c->num_attention_heads},
               {"num_key_value_heads", c->num_key_value_heads}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].value < 1)
      return TSR_ERROR(TSR_EINVAL, "[model] %s = %d; it must be >= 1", sizes[i].key,
                       sizes[i].value);
  if (c->hidden_size % c->num_attention_heads)
    return TSR_ERROR(TSR_EINVAL,
                     "[model] hidden_size = %d is not a multiple of num_attention_heads = %d; "
                     "the head dim is hidden_size / num_attention_heads",
                     c->hidden_size, c->num_attention_heads);
  if (c->num_attention_heads % c->num_key_value_heads)
    return TSR_ERROR(TSR_EINVAL,
                     "[model] num_attention_heads = %d is not a multiple of num_key_value_heads = "
                     "%d (grouped-query attention shares each kv head among a whole group)",
                     c->num_attention_heads, c->num_key_value_heads);
  if ((c->hidden_size / c->num_attention_heads) % 2)
    return TSR_ERROR(TSR_EINVAL,
                     "[model] head dim %d (hidden_size / num_attention_heads) is odd; "
                     "rotary embedding needs it even",
                     c->hidden_size / c->num_attention_heads);
  if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0))
    return TSR_ERROR(TSR_EINVAL, "[model] rms_norm_eps and rope_theta must be > 0");
  if (c->num_local_experts < 0 || c->decoder_sparse_step < 0 || !(c->router_aux_loss_coef >= 0))
    return TSR_ERROR(TSR_EINVAL,
                     "[model] num_local_experts, decoder_sparse_step and router_aux_loss_coef "
                     "must be >= 0");
  if (c->num_local_experts > 0 &&
      (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_local_experts))
    return TSR_ERROR(TSR_EINVAL,
                     "[model] num_experts_per_tok = %d with num_local_experts = %d; each token "
                     "goes to between 1 and num_local_experts experts",
                     c->num_experts_per_tok, c->num_local_experts);
  return TSR_OK;
}

bool tsr_llama_layer_is_moe(const tsr_llama_config *c, int layer) {
  int step = c->decoder_sparse_step > 1 ? c->decoder_sparse_step : 1;
  return c->num_local_experts > 0 && (layer + 1) % step == 0;
}

static int moe_layers(const tsr_llama_config *c) {
  int n = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) n += tsr_llama_layer_is_moe(c, l);
  return n;
}

int64_t tsr_llama_num_params(const tsr_llama_config *c) {
  int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  int64_t D = C / c->num_attention_heads, kv = (int64_t)c->num_key_value_heads * D;
  int64_t E = c->num_local_experts, nmoe = moe_layers(c);
  int64_t layer = 2 * C * C + 2 * kv * C + 3 * I * C + 2 * C;
  int64_t moe = nmoe * (E * C + (E - 1) * 3 * I * C); /* a router, and E experts for one MLP */
  return V * C + c->num_hidden_layers * layer + moe + C + (c->tie_word_embeddings ? 0 : V * C);
}

/* ---- parameter layout ---- */

typedef enum param_init { INIT_NORMAL = 0, INIT_ONES = 1 } param_init;

typedef struct param_spec {
  tsr_var **slot;
  int stage;         /* pipeline stage whose ranks hold it */
  const char *style; /* module style that places it */
  int ndim;
  int64_t shape[3];
  param_init init;
  int index; /* parameter whose name and initial values it takes (a replica: its source's) */
} param_spec;

/* The style for (style, mesh dim). k_proj and v_proj are column linears that a strategy may place
 * apart from q_proj (tensor parallelism keeps them whole when it has more ranks than kv heads):
 * they are TSR_STYLE_KV_LINEAR where a strategy registered that style, TSR_STYLE_COLUMN_LINEAR
 * elsewhere. */
/* The mesh dim the layers are split over in stages, as its owner declared it; "" (no dim has
 * that name) when none did and the model is one stage. */
static const char *stage_dim(const tsr_rank_t *r) {
  const char *d = tsr_registry_stage_dim(tsr_rank_registry(r));
  return d ? d : "";
}

static const tsr_module_style *find_style(const tsr_llama_t *m, const char *style,
                                          const char *dim) {
  const tsr_registry_t *reg = tsr_rank_registry(m->r);
  if (!reg) return NULL;
  const tsr_module_style *s = tsr_registry_find_module_style(reg, style, dim);
  if (!s && !strcmp(style, TSR_STYLE_KV_LINEAR))
    s = tsr_registry_find_module_style(reg, TSR_STYLE_COLUMN_LINEAR, dim);
  return s;
}

/* Placement of a parameter on every mesh dim: what the dim's strategy registered for the
 * module style, Replicate where none did. */
static void param_placements(const tsr_llama_t *m, const tsr_mesh_t *mesh, const char *style,
                             tsr_placement *p) {
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    const tsr_module_style *s = style ? find_style(m, style, tsr_mesh_dim_name(mesh, i)) : NULL;
    p[i] = tsr_module_style_param(s, "weight");
  }
}

/* Counter-based normal samples: the value of element k of parameter `index` depends only on
 * (seed, index, k), so every mesh initialises the same model. */
static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double uniform01(uint64_t seed, uint64_t index, uint64_t k) {
  uint64_t h = splitmix64(seed ^ splitmix64(index * 0x100000001b3ull + k));
  return ((double)(h >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
}

static void fill_init(tsr_tensor *full, param_init init, uint64_t seed, uint64_t index) {
  float *p = tsr_tensor_data(full);
  int64_t n = tsr_tensor_numel(full);
  for (int64_t k = 0; k < n; k++) {
    if (init == INIT_ONES) {
      p[k] = 1.0f;
      continue;
    }
    double u1 = uniform01(seed, index, 2 * (uint64_t)k),
           u2 = uniform01(seed, index, 2 * (uint64_t)k + 1);
    p[k] = (float)(0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

static int64_t local_count(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static tsr_status build_params(tsr_llama_t *m, const param_spec *specs, int n, uint64_t seed) {
  tsr_placement(*pl)[TSR_MAX_MESH_DIMS] = malloc(sizeof *pl * (size_t)n);
  int64_t(*ls)[TSR_MAX_DIMS] = malloc(sizeof *ls * (size_t)n);
  int64_t total = 0;
  tsr_status st = TSR_OK;
  tsr_tensor *full = NULL, *piece = NULL;
  tsr_dtensor *dist = NULL;
  if (!pl || !ls) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory laying out %d parameters", n);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    const tsr_mesh_t *mesh = smesh(m, specs[i].stage);
    param_placements(m, mesh, specs[i].style, pl[i]);
    TSR_CHECK_GOTO(tsr_dtensor_check_placements(mesh, pl[i], specs[i].ndim), st);
    /* a rank of another stage holds nothing of this parameter */
    if (!tsr_dtensor_local_shape(mesh, pl[i], specs[i].ndim, specs[i].shape, tsr_rank_id(m->r),
                                 ls[i], NULL))
      ls[i][0] = ls[i][1] = ls[i][2] = 0;
    total += local_count(ls[i], specs[i].ndim);
  }
  /* One allocation for every parameter of this rank, as the locals of their DTensors. */
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(m->r), TSR_F32, 1, &total, &m->storage), st);
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    const param_spec *s = &specs[i];
    TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, s->ndim, s->shape, &full), st);
    fill_init(full, s->init, seed, (uint64_t)s->index);
    TSR_CHECK_GOTO(tsr_dtensor_distribute(m->r, smesh(m, s->stage), full, pl[i], &dist), st);
    int64_t count = local_count(ls[i], s->ndim);
    if (dist->local) {
      TSR_CHECK_GOTO(tsr_tensor_narrow(m->storage, 0, at, count, &piece), st);
      tsr_tensor *view = NULL;
      TSR_CHECK_GOTO(tsr_tensor_reshape(piece, s->ndim, ls[i], &view), st);
      st = tsr_tensor_copy(view, dist->local);
      tsr_tensor_free(dist->local);
      dist->local = view;
      TSR_CHECK_GOTO(st, st);
    }
    TSR_CHECK_GOTO(tsr_var_new_leaf(dist, true, m->names[s->index], s->slot), st);
    dist = NULL;
    if (i < m->nparams) m->params[i] = *s->slot;
    tsr_tensor_free(piece);
    piece = NULL;
    tsr_tensor_free(full);
    full = NULL;
    at += count;
  }
cleanup:
  tsr_tensor_free(piece);
  tsr_tensor_free(full);
  tsr_dtensor_free(dist);
  free(pl);
  free(ls);
  return st;
}

tsr_status tsr_llama_new(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_llama_config *cfg,
                         uint64_t seed, tsr_llama_t **out) {
  return tsr_llama_new_staged(r, mesh, cfg, seed, NULL, out);
}

tsr_status tsr_llama_layout_check(const tsr_llama_layout *layout, int pp, int num_layers) {
  int chunks = layout && layout->stages_per_rank > 1 ? layout->stages_per_rank : 1;
  int S = pp * chunks;
  if (S > num_layers)
    return TSR_ERROR(TSR_EINVAL,
                     "%d pipeline stages (pp = %d x stages_per_rank = %d) but the model has %d "
                     "layers; every stage needs at least one layer: lower pp or stages_per_rank, "
                     "or raise num_hidden_layers",
                     S, pp, chunks, num_layers);
  if (!layout || !layout->nlayers_per_stage) return TSR_OK;
  int sum = 0;
  for (int s = 0; s < layout->nlayers_per_stage; s++) {
    if (layout->layers_per_stage[s] < 1)
      return TSR_ERROR(TSR_EINVAL,
                       "layers_per_stage: stage %d has %d layers; every stage needs at least one",
                       s, layout->layers_per_stage[s]);
    sum += layout->layers_per_stage[s];
  }
  if (layout->nlayers_per_stage != S)
    return TSR_ERROR(TSR_EINVAL,
                     "layers_per_stage gives %d stages but the pipeline has %d (pp = %d x "
                     "stages_per_rank = %d); give one count per stage",
                     layout->nlayers_per_stage, S, pp, chunks);
  if (sum != num_layers)
    return TSR_ERROR(TSR_EINVAL,
                     "layers_per_stage sums to %d but the model has %d layers "
                     "(num_hidden_layers); the counts must add up to it",
                     sum, num_layers);
  return TSR_OK;
}

tsr_status tsr_llama_new_staged(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_llama_config *cfg,
                                uint64_t seed, const tsr_llama_layout *layout, tsr_llama_t **out) {
  *out = NULL;
  TSR_CHECK(tsr_llama_config_check(cfg));
  tsr_llama_t *m = calloc(1, sizeof *m);
  if (!m) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating the model");
  m->r = r;
  m->mesh = mesh;
  m->cfg = *cfg;
  m->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  int Lyr = cfg->num_hidden_layers, n = 2 + 9 * Lyr + (cfg->tie_word_embeddings ? 0 : 1);
  int nspecs = n; /* n, and the tied replica when there is one */
  tsr_status st = tsr_mesh_unbind(mesh, stage_dim(r), &m->stages, &m->npp);
  if (st != TSR_OK) {
    free(m);
    return st;
  }
  m->chunks = layout && layout->stages_per_rank > 1 ? layout->stages_per_rank : 1;
  m->nstages = m->npp * m->chunks;
  if (m->nstages > 1 && moe_layers(cfg) > 0 && cfg->router_aux_loss_coef > 0) {
    /* the loss multiplies sums over every block's tokens, which would have to cross stages */
    st = TSR_ERROR(TSR_EINVAL,
                   "[model] router_aux_loss_coef = %g with %d pipeline stages: the "
                   "load-balancing loss over blocks on several stages is not supported yet; "
                   "set router_aux_loss_coef = 0 or run the MoE model in one stage",
                   (double)cfg->router_aux_loss_coef, m->nstages);
    tsr_llama_free(m);
    return st;
  }
  if (cfg->tie_word_embeddings && m->nstages > 1) nspecs = n + 1;
  int64_t C = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
  int64_t E = cfg->num_local_experts;
  int64_t Q = (int64_t)cfg->num_attention_heads * m->head_dim;
  int64_t KV = (int64_t)cfg->num_key_value_heads * m->head_dim;
  m->layers = calloc((size_t)Lyr, sizeof *m->layers);
  m->params = calloc((size_t)n, sizeof *m->params);
  m->names = calloc((size_t)n, sizeof *m->names);
  param_spec *specs = calloc((size_t)nspecs, sizeof *specs);
  m->layer_stage = calloc((size_t)Lyr, sizeof *m->layer_stage);
  if (!m->layers || !m->params || !m->names || !specs || !m->layer_stage) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory allocating the model");
    goto cleanup;
  }
  m->nparams = n;
  if (m->chunks > 1 && m->npp < 2) {
    const char *sd = stage_dim(r);
    st = TSR_ERROR(TSR_EINVAL,
                   "stages_per_rank = %d needs a pipeline stage dim%s%s%s of at least 2 (virtual "
                   "stages alternate between its ranks)",
                   m->chunks, sd[0] ? " ('" : "", sd, sd[0] ? "')" : "");
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_llama_layout_check(layout, m->npp, Lyr), st);
  if (layout && layout->nlayers_per_stage) {
    for (int s = 0, l = 0; s < m->nstages; s++)
      for (int i = 0; i < layout->layers_per_stage[s]; i++) m->layer_stage[l++] = s;
  } else {
    tsr_llama_assign_layers(Lyr, m->nstages, m->layer_stage);
  }
  int k = 0, last = m->nstages - 1, stage = 0;
  /* Specs in HF order; layer names get the layer index. */
#define PARAM(slot_, style_, rows, cols, init_)                                                    \
  (specs[k] = (param_spec){&(slot_), stage, style_, (cols) ? 2 : 1, {rows, cols, 0}, init_, k}, k++)
#define PARAM3(slot_, style_, d0, d1, d2)                                                          \
  (specs[k] = (param_spec){&(slot_), stage, style_, 3, {d0, d1, d2}, INIT_NORMAL, k}, k++)
  snprintf(m->names[k], NAME_LEN, "model.embed_tokens.weight");
  PARAM(m->embed_tokens, "embedding", V, C, INIT_NORMAL);
  static const char *const layer_names[9] = {
      "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
      "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
      "mlp.down_proj",    "input_layernorm",  "post_attention_layernorm"};
  for (int l = 0; l < Lyr; l++) {
    llama_layer *y = &m->layers[l];
    stage = m->layer_stage[l];
    bool moe = tsr_llama_layer_is_moe(cfg, l);
    for (int j = 0; j < 9; j++)
      snprintf(m->names[k + j], NAME_LEN, "model.layers.%d.%s.weight", l, layer_names[j]);
    if (moe) {
      /* the stacked experts are written per expert under Mixtral's names (tsr_llama_hf_tensor) */
      snprintf(m->names[k + 4], NAME_LEN, "model.layers.%d.block_sparse_moe.gate.weight", l);
      snprintf(m->names[k + 5], NAME_LEN, "model.layers.%d.block_sparse_moe.experts.w13", l);
      snprintf(m->names[k + 6], NAME_LEN, "model.layers.%d.block_sparse_moe.experts.w2", l);
    }
    PARAM(y->q_proj, TSR_STYLE_COLUMN_LINEAR, Q, C, INIT_NORMAL);
    PARAM(y->k_proj, TSR_STYLE_KV_LINEAR, KV, C, INIT_NORMAL);
    PARAM(y->v_proj, TSR_STYLE_KV_LINEAR, KV, C, INIT_NORMAL);
    PARAM(y->o_proj, TSR_STYLE_ROW_LINEAR, C, Q, INIT_NORMAL);
    if (moe) {
      /* the router has no style: every rank routes its own tokens with the whole of it */
      PARAM(y->router, NULL, E, C, INIT_NORMAL);
      PARAM3(y->w13, TSR_STYLE_EXPERTS, E, 2 * I, C);
      PARAM3(y->w2, TSR_STYLE_EXPERTS, E, C, I);
    } else {
      PARAM(y->gate_proj, TSR_STYLE_COLUMN_LINEAR, I, C, INIT_NORMAL);
      PARAM(y->up_proj, TSR_STYLE_COLUMN_LINEAR, I, C, INIT_NORMAL);
      PARAM(y->down_proj, TSR_STYLE_ROW_LINEAR, C, I, INIT_NORMAL);
    }
    PARAM(y->input_layernorm, "rmsnorm", C, 0, INIT_ONES);
    PARAM(y->post_attention_layernorm, "rmsnorm", C, 0, INIT_ONES);
  }
  stage = last; /* the final norm and lm_head close the last stage */
  snprintf(m->names[k], NAME_LEN, "model.norm.weight");
  PARAM(m->norm, "rmsnorm", C, 0, INIT_ONES);
  if (!cfg->tie_word_embeddings) {
    snprintf(m->names[k], NAME_LEN, "lm_head.weight");
    PARAM(m->lm_head, TSR_STYLE_COLUMN_LINEAR, V, C, INIT_NORMAL);
  }
  if (nspecs > n) {
    /* Megatron's tied head: placed and initialised as the embedding (index 0), so both copies
     * start equal and, with summed gradients, take the same steps */
    specs[k] = specs[0];
    specs[k].slot = &m->tied_head;
    specs[k].stage = last;
  }
#undef PARAM
#undef PARAM3
  TSR_CHECK_GOTO(build_params(m, specs, nspecs, seed), st);
  free(specs);
  *out = m;
  return TSR_OK;
cleanup:
  free(specs);
  tsr_llama_free(m);
  return st;
}

void tsr_llama_free(tsr_llama_t *m) {
  if (!m) return;
  for (int i = 0; i < m->nparams; i++) tsr_var_free(m->params[i]);
  tsr_var_free(m->tied_head);
  tsr_tensor_free(m->storage);
  for (int i = 0; i < m->npp; i++) tsr_mesh_free(m->stages[i]);
  free(m->stages);
  free(m->layer_stage);
  free(m->params);
  free(m->names);
  free(m->layers);
  free(m);
}

void tsr_llama_assign_layers(int num_layers, int num_stages, int *stage_of_layer) {
  /* as even as possible; the first num_layers % num_stages stages take one layer more */
  int base = num_layers / num_stages, extra = num_layers % num_stages, l = 0;
  for (int s = 0; s < num_stages; s++)
    for (int i = 0; i < base + (s < extra); i++) stage_of_layer[l++] = s;
}

int tsr_llama_stage_count(const tsr_llama_t *m) {
  return m->nstages;
}
const tsr_mesh_t *tsr_llama_stage_mesh(const tsr_llama_t *m, int s) {
  return smesh(m, s);
}
int tsr_llama_stages_per_rank(const tsr_llama_t *m) {
  return m->chunks;
}
int tsr_llama_layer_stage(const tsr_llama_t *m, int layer) {
  return m->layer_stage[layer];
}

const tsr_llama_config *tsr_llama_get_config(const tsr_llama_t *m) {
  return &m->cfg;
}
int tsr_llama_param_count(const tsr_llama_t *m) {
  return m->nparams;
}
tsr_var *tsr_llama_param(tsr_llama_t *m, int i) {
  return m->params[i];
}
const char *tsr_llama_param_name(const tsr_llama_t *m, int i) {
  return m->names[i];
}
tsr_var *tsr_llama_tied_replica(tsr_llama_t *m) {
  return m->tied_head;
}

tsr_status tsr_llama_tied_grad_sync(tsr_llama_t *m) {
  if (!m->tied_head) return TSR_OK;
  int d = tsr_mesh_find_dim(m->mesh, stage_dim(m->r)), me = tsr_rank_id(m->r);
  int coords[TSR_MAX_MESH_DIMS], ranks[2];
  if (d < 0 || !tsr_mesh_coords(m->mesh, me, coords)) return TSR_OK;
  int mine = coords[d], lastpp = m->npp - 1;
  if (mine != 0 && mine != lastpp) return TSR_OK;
  /* the pp dim restricted to its first and last coordinate, at this rank's other coordinates */
  coords[d] = 0;
  ranks[0] = tsr_mesh_rank_at(m->mesh, coords);
  coords[d] = lastpp;
  ranks[1] = tsr_mesh_rank_at(m->mesh, coords);
  tsr_var *v = mine == 0 ? m->embed_tokens : m->tied_head;
  const char *which = mine == 0 ? "model.embed_tokens.weight" : "its last-stage replica";
  tsr_dtensor *g = v->grad;
  if (!g || !g->local)
    return TSR_ERROR(TSR_EINVAL,
                     "tied embeddings: %s has no gradient on rank %d; sum the tied gradients "
                     "after the step's backward and tsr_var_resolve_grad",
                     which, me);
  if (g->dtype != TSR_F32 || !tsr_tensor_is_contiguous(g->local))
    return TSR_ERROR(TSR_EINVAL,
                     "tied embeddings: the gradient of %s is not a contiguous f32 tensor", which);
  tsr_group_t *grp = NULL;
  TSR_CHECK(tsr_comm_group(tsr_rank_comm(m->r), 2, ranks, stage_dim(m->r), &grp));
  void *data = tsr_tensor_data(g->local);
  /* a + b == b + a in floating point: both copies get the same bits */
  TSR_CHECK(tsr_comm_all_reduce(grp, data, data, (size_t)tsr_tensor_numel(g->local), TSR_F32,
                                TSR_REDUCE_SUM));
  return TSR_OK;
}

tsr_status tsr_llama_batch(tsr_rank_t *r, const tsr_mesh_t *mesh, int64_t B, int64_t L,
                           const int32_t *data, tsr_var **out) {
  int64_t shape[2] = {B, L};
  tsr_tensor *full = NULL;
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &full));
  memcpy(tsr_tensor_data(full), data, (size_t)(B * L) * sizeof *data);
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int k = 0; k < tsr_mesh_ndim(mesh); k++) rep[k] = tsr_replicate();
  tsr_status st = tsr_dtensor_distribute(r, mesh, full, rep, &d);
  tsr_tensor_free(full);
  if (st != TSR_OK) return st;
  st = tsr_var_new_leaf(d, false, NULL, out);
  if (st != TSR_OK) tsr_dtensor_free(d);
  return st;
}

/* ---- forward ---- */

/* The model's data layout on each mesh dim, as the dim's owner declared it through the embedding
 * style: the token ids and labels (B, L) take its input placement, the hidden states (B, L, C)
 * where they cross pipeline stages its output. A dim without the style keeps the data
 * replicated. The model names no dim: a plugin that shards the batch or the sequence on a dim of
 * its own says so there, and the core's generic rules do the rest. */
static void data_placements(const tsr_llama_t *m, const tsr_mesh_t *mesh, bool hidden,
                            tsr_placement *p) {
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    const tsr_module_style *s = find_style(m, TSR_STYLE_EMBEDDING, tsr_mesh_dim_name(mesh, i));
    p[i] = s && tsr_mesh_dim_size(mesh, i) > 1 ? (hidden ? s->output : s->input) : tsr_replicate();
  }
}

/* Token ids or labels, from wherever the caller placed them, to the data layout on `mesh`. */
static tsr_status place_input(tsr_llama_t *m, tsr_tape_t *t, tsr_var *x, const tsr_mesh_t *mesh,
                              tsr_var **out) {
  tsr_placement p[TSR_MAX_MESH_DIMS];
  data_placements(m, mesh, false, p);
  return tsr_op_redistribute(t, x, mesh, p, out);
}

/* Moves an activation to what the loaded strategies' module style says for the module's input
 * (or output) on each mesh dim that has a style; other dims keep their placement. This is how
 * tensor and sequence parallelism reach the model: an all-reduce after a row-parallel linear, an
 * all-gather before a column-parallel one, without a line here that names them. */
static tsr_status styled(tsr_llama_t *m, tsr_tape_t *t, const char *style, bool output, tsr_var *x,
                         tsr_var **out) {
  const tsr_mesh_t *mesh = x->value->mesh;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  bool change = false;
  for (int i = 0; i < tsr_mesh_ndim(mesh); i++) {
    const tsr_module_style *s = find_style(m, style, tsr_mesh_dim_name(mesh, i));
    p[i] = s && tsr_mesh_dim_size(mesh, i) > 1 ? (output ? s->output : s->input)
                                               : x->value->placements[i];
    change = change || !tsr_placement_equal(p[i], x->value->placements[i]);
  }
  if (!change) {
    *out = x;
    return TSR_OK;
  }
  return tsr_op_redistribute(t, x, mesh, p, out);
}

/* Moves an activation (or a tied weight) to pipeline stage `s`, keeping its placements; a no-op
 * without pipeline stages. */
static tsr_status to_stage(tsr_llama_t *m, tsr_tape_t *t, tsr_var *x, int s, tsr_var **out) {
  if (tsr_mesh_equal(x->value->mesh, smesh(m, s))) {
    *out = x;
    return TSR_OK;
  }
  return tsr_op_redistribute(t, x, smesh(m, s), x->value->placements, out);
}

static tsr_status linear(tsr_llama_t *m, tsr_tape_t *t, const char *style, tsr_var *x, tsr_var *w,
                         tsr_var **out) {
  tsr_var *xi, *y;
  TSR_CHECK(styled(m, t, style, false, x, &xi));
  TSR_CHECK(tsr_op_linear(t, xi, w, &y));
  return styled(m, t, style, true, y, out);
}

static tsr_status rmsnorm(tsr_llama_t *m, tsr_tape_t *t, tsr_var *x, tsr_var *w, tsr_var **out) {
  tsr_var *xi, *y;
  TSR_CHECK(styled(m, t, TSR_STYLE_RMSNORM, false, x, &xi));
  TSR_CHECK(tsr_op_rmsnorm(t, xi, w, m->cfg.rms_norm_eps, &y));
  return styled(m, t, TSR_STYLE_RMSNORM, true, y, out);
}

/* (B, L, n*D) <-> (B, L, n, D) */
static tsr_status split_heads(tsr_tape_t *t, tsr_var *x, int heads, int D, tsr_var **out) {
  int64_t shape[4] = {x->value->shape[0], x->value->shape[1], heads, D};
  return tsr_op_view(t, x, 4, shape, out);
}

static tsr_status merge_heads(tsr_tape_t *t, tsr_var *x, tsr_var **out) {
  int64_t shape[3] = {x->value->shape[0], x->value->shape[1],
                      x->value->shape[2] * x->value->shape[3]};
  return tsr_op_view(t, x, 3, shape, out);
}

static tsr_status attention(tsr_llama_t *m, tsr_tape_t *t, const llama_layer *y, tsr_var *x,
                            tsr_var **out) {
  const tsr_llama_config *c = &m->cfg;
  int D = m->head_dim;
  tsr_var *q, *k, *v, *qh, *kh, *vh, *qr, *kr, *a, *am, *o;
  TSR_CHECK(styled(m, t, TSR_STYLE_ATTENTION, false, x, &x));
  /* placed once for the three projections that share it: one all-gather under sequence
   * parallelism, not three */
  TSR_CHECK(styled(m, t, TSR_STYLE_COLUMN_LINEAR, false, x, &x));
  TSR_CHECK(linear(m, t, TSR_STYLE_COLUMN_LINEAR, x, y->q_proj, &q));
  TSR_CHECK(linear(m, t, TSR_STYLE_KV_LINEAR, x, y->k_proj, &k));
  TSR_CHECK(linear(m, t, TSR_STYLE_KV_LINEAR, x, y->v_proj, &v));
  TSR_CHECK(split_heads(t, q, c->num_attention_heads, D, &qh));
  TSR_CHECK(split_heads(t, k, c->num_key_value_heads, D, &kh));
  TSR_CHECK(split_heads(t, v, c->num_key_value_heads, D, &vh));
  if (m->doc_seg) { /* [data] mask = document */
    TSR_CHECK(tsr_op_rope_doc(t, qh, m->doc_pos, c->rope_theta, &qr));
    TSR_CHECK(tsr_op_rope_doc(t, kh, m->doc_pos, c->rope_theta, &kr));
    TSR_CHECK(tsr_op_sdpa_doc(t, qr, kr, vh, m->doc_seg, &a));
  } else {
    TSR_CHECK(tsr_op_rope(t, qh, c->rope_theta, &qr));
    TSR_CHECK(tsr_op_rope(t, kh, c->rope_theta, &kr));
    TSR_CHECK(tsr_op_sdpa(t, qr, kr, vh, true, &a));
  }
  TSR_CHECK(merge_heads(t, a, &am));
  TSR_CHECK(linear(m, t, TSR_STYLE_ROW_LINEAR, am, y->o_proj, &o));
  return styled(m, t, TSR_STYLE_ATTENTION, true, o, out);
}

static tsr_status mlp(tsr_llama_t *m, tsr_tape_t *t, const llama_layer *y, tsr_var *x,
                      tsr_var **out) {
  tsr_var *g, *u, *s, *d;
  TSR_CHECK(styled(m, t, TSR_STYLE_MLP, false, x, &x));
  TSR_CHECK(styled(m, t, TSR_STYLE_COLUMN_LINEAR, false, x, &x));
  TSR_CHECK(linear(m, t, TSR_STYLE_COLUMN_LINEAR, x, y->gate_proj, &g));
  TSR_CHECK(linear(m, t, TSR_STYLE_COLUMN_LINEAR, x, y->up_proj, &u));
  TSR_CHECK(tsr_op_swiglu(t, g, u, &s));
  TSR_CHECK(linear(m, t, TSR_STYLE_ROW_LINEAR, s, y->down_proj, &d));
  return styled(m, t, TSR_STYLE_MLP, true, d, out);
}

/* Mixtral's sparse MoE block: router logits from the whole gate on every rank's own tokens,
 * top-k routing, then the experts, placed by the "experts" style (an expert-parallel plugin
 * shards them and moves the tokens). The block's router stats are added to *stats, the sum the
 * load-balancing loss is taken over. */
static tsr_status moe(tsr_llama_t *m, tsr_tape_t *t, const llama_layer *y, tsr_var *x,
                      tsr_var **stats, tsr_var **out) {
  tsr_var *logits, *combine, *s, *xi, *ci, *o;
  TSR_CHECK(tsr_op_linear(t, x, y->router, &logits));
  TSR_CHECK(tsr_op_moe_router(t, logits, m->cfg.num_experts_per_tok, &combine, &s));
  TSR_CHECK(styled(m, t, TSR_STYLE_EXPERTS, false, x, &xi));
  TSR_CHECK(styled(m, t, TSR_STYLE_EXPERTS, false, combine, &ci));
  TSR_CHECK(tsr_op_moe_experts(t, xi, ci, y->w13, y->w2, &o));
  if (*stats)
    TSR_CHECK(tsr_op_add(t, *stats, s, stats));
  else
    *stats = s;
  return styled(m, t, TSR_STYLE_EXPERTS, true, o, out);
}

tsr_status llama_layer_ops(tsr_llama_t *m, tsr_tape_t *t, const llama_layer *y, tsr_var *h,
                           tsr_var **stats, tsr_var **out) {
  tsr_var *n, *a, *f;
  TSR_CHECK(rmsnorm(m, t, h, y->input_layernorm, &n));
  TSR_CHECK(attention(m, t, y, n, &a));
  TSR_CHECK(tsr_op_add(t, h, a, &h));
  TSR_CHECK(rmsnorm(m, t, h, y->post_attention_layernorm, &n));
  if (y->w13)
    TSR_CHECK(moe(m, t, y, n, stats, &f));
  else
    TSR_CHECK(mlp(m, t, y, n, &f));
  return tsr_op_add(t, h, f, out);
}

/* loss + router_aux_loss_coef * Hugging Face's load_balancing_loss_func over every MoE block:
 * E * sum_e (fraction of routed tokens to e) * (mean router probability of e), both means over
 * the tokens of all blocks, which is the blocks' summed stats over their count. Both terms are
 * made whole (Replicate) first: the stats' pieces multiply, so they are summed before. */
static tsr_status add_aux_loss(tsr_llama_t *m, tsr_tape_t *t, tsr_var *stats, tsr_var **loss) {
  const tsr_llama_config *c = &m->cfg;
  if (!stats || !(c->router_aux_loss_coef > 0)) return TSR_OK;
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < TSR_MAX_MESH_DIMS; i++) rep[i] = tsr_replicate();
  tsr_var *s, *aux, *ce;
  double nl = moe_layers(c);
  float scale = (float)(c->router_aux_loss_coef * c->num_local_experts / (nl * nl));
  TSR_CHECK(tsr_op_redistribute(t, stats, stats->value->mesh, rep, &s));
  TSR_CHECK(tsr_op_moe_aux_loss(t, s, scale, &aux));
  TSR_CHECK(tsr_op_redistribute(t, *loss, (*loss)->value->mesh, rep, &ce));
  return tsr_op_add(t, ce, aux, loss);
}

tsr_status tsr_llama_forward(tsr_llama_t *m, tsr_tape_t *t, tsr_var *ids, tsr_var *labels,
                             tsr_var **logits, tsr_var **loss) {
  const tsr_llama_config *c = &m->cfg;
  *logits = NULL;
  if (loss) *loss = NULL;
  tsr_var *x, *e, *h, *n, *stats = NULL;
  int last = m->nstages - 1;
  TSR_CHECK(place_input(m, t, ids, smesh(m, 0), &x));
  TSR_CHECK(tsr_op_embedding(t, x, m->embed_tokens, &e));
  TSR_CHECK(styled(m, t, TSR_STYLE_EMBEDDING, true, e, &h));
  for (int l = 0; l < c->num_hidden_layers; l++) {
    TSR_CHECK(to_stage(m, t, h, m->layer_stage[l], &h));
    TSR_CHECK(llama_decoder_layer(m, t, l, h, &stats, &h));
  }
  TSR_CHECK(to_stage(m, t, h, last, &h));
  TSR_CHECK(rmsnorm(m, t, h, m->norm, &n));
  /* Tied: the embedding's weight, placed by the embedding style, serves as lm_head; with
   * pipeline stages it travels to the last one, and its gradient comes back the same way. */
  tsr_var *head = m->lm_head;
  if (!head) TSR_CHECK(to_stage(m, t, m->embed_tokens, last, &head));
  TSR_CHECK(linear(m, t, TSR_STYLE_COLUMN_LINEAR, n, head, logits));
  if (!labels || !loss) return TSR_OK;
  tsr_var *lab;
  TSR_CHECK(place_input(m, t, labels, smesh(m, last), &lab));
  TSR_CHECK(tsr_op_cross_entropy(t, *logits, lab, loss));
  return add_aux_loss(m, t, stats, loss);
}

tsr_status tsr_llama_set_documents(tsr_llama_t *m, tsr_var *seg, tsr_var *pos) {
  if (!seg != !pos)
    return TSR_ERROR(TSR_EINVAL, "document masking takes both segment ids and positions");
  m->doc_seg = seg;
  m->doc_pos = pos;
  return TSR_OK;
}

/* ---- one pipeline stage at a time ---- */

const char *tsr_llama_stage_dim(const tsr_llama_t *m) {
  return stage_dim(m->r);
}

tsr_rank_t *tsr_llama_rank(const tsr_llama_t *m) {
  return m->r;
}

/* Placements of the residual stream where it crosses stages: the data layout's, so that both
 * sides of a transfer agree without sending metadata. */
void tsr_llama_stage_io_placements(const tsr_llama_t *m, int stage, tsr_placement *p) {
  data_placements(m, smesh(m, stage), true, p);
}

tsr_status tsr_llama_forward_stage(tsr_llama_t *m, tsr_tape_t *t, int stage, tsr_var *ids,
                                   tsr_var *in, tsr_var *labels, tsr_var **out, tsr_var **logits,
                                   tsr_var **loss) {
  int last = m->nstages - 1;
  *out = NULL;
  if (logits) *logits = NULL;
  if (loss) *loss = NULL;
  if (stage < 0 || stage > last)
    return TSR_ERROR(TSR_EINVAL, "pipeline stage %d out of range (%d stages)", stage, m->nstages);
  tsr_var *h, *x, *e, *n, *stats = NULL;
  if (stage == 0) {
    TSR_CHECK(place_input(m, t, ids, smesh(m, 0), &x));
    TSR_CHECK(tsr_op_embedding(t, x, m->embed_tokens, &e));
    TSR_CHECK(styled(m, t, TSR_STYLE_EMBEDDING, true, e, &h));
  } else {
    h = in;
  }
  for (int l = 0; l < m->cfg.num_hidden_layers; l++)
    if (m->layer_stage[l] == stage) TSR_CHECK(llama_decoder_layer(m, t, l, h, &stats, &h));
  if (stage < last) {
    /* the receiving stage builds its input with these placements */
    tsr_placement p[TSR_MAX_MESH_DIMS];
    bool same = true;
    tsr_llama_stage_io_placements(m, stage, p);
    for (int i = 0; i < tsr_mesh_ndim(smesh(m, stage)); i++)
      same = same && tsr_placement_equal(p[i], h->value->placements[i]);
    if (same) {
      *out = h;
      return TSR_OK;
    }
    return tsr_op_redistribute(t, h, smesh(m, stage), p, out);
  }
  TSR_CHECK(rmsnorm(m, t, h, m->norm, &n));
  tsr_var *head = m->lm_head ? m->lm_head : m->tied_head ? m->tied_head : m->embed_tokens;
  TSR_CHECK(linear(m, t, TSR_STYLE_COLUMN_LINEAR, n, head, &h));
  *out = h;
  if (logits) *logits = h;
  if (!labels || !loss) return TSR_OK;
  tsr_var *lab;
  TSR_CHECK(place_input(m, t, labels, smesh(m, last), &lab));
  TSR_CHECK(tsr_op_cross_entropy(t, h, lab, loss));
  return add_aux_loss(m, t, stats, loss);
}
