/* A Hugging Face folder's config.json, read and merged into the job's [model] keys. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "hf.h"
#include "train.h"

static const char *const key_names[TSR_HF_NKEYS] = {
    "vocab_size",          "hidden_size",         "intermediate_size",   "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "rms_norm_eps",        "rope_theta",
    "tie_word_embeddings", "num_local_experts",   "num_experts_per_tok", "decoder_sparse_step",
    "router_aux_loss_coef"};

const char *tsr_hf_key_name(int k) {
  return k >= 0 && k < TSR_HF_NKEYS ? key_names[k] : NULL;
}

static bool is_int_key(int k) {
  return k != TSR_HF_EPS && k != TSR_HF_THETA && k != TSR_HF_TIE && k != TSR_HF_AUX_COEF;
}

bool tsr_hf_is_folder(const char *path) {
  struct stat sb;
  return path && path[0] && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 8192;
      char *p = realloc(buf, cap);
      if (!p) break;
      buf = p;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
    if (r == 0) break;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  *len = n;
  return buf;
}

/* A number key: TSR_EINVAL naming it unless a number (an integer for integer keys). */
static tsr_status get_number(const tsr_hf_config *h, const cJSON *root, const char *key,
                             bool integer, bool *present, double *v) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
  *present = j && !cJSON_IsNull(j);
  if (!*present) return TSR_OK;
  if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) ||
      (integer && j->valuedouble != floor(j->valuedouble))) {
    char *text = cJSON_PrintUnformatted(j);
    tsr_status s = tsr_error(TSR_EINVAL, "%s: \"%s\" is %s, expected %s", h->path, key,
                             text ? text : "?", integer ? "an integer" : "a number");
    free(text);
    return s;
  }
  *v = j->valuedouble;
  return TSR_OK;
}

static tsr_status get_bool(const tsr_hf_config *h, const cJSON *root, const char *key,
                           bool *present, bool *v) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
  *present = j && !cJSON_IsNull(j);
  if (!*present) return TSR_OK;
  if (!cJSON_IsBool(j))
    return tsr_error(TSR_EINVAL, "%s: \"%s\" is not true or false", h->path, key);
  *v = cJSON_IsTrue(j);
  return TSR_OK;
}

/* Keys the model has no way to compute: refused, naming the key. */
static tsr_status check_unsupported(const tsr_hf_config *h, const cJSON *root) {
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (rs && !cJSON_IsNull(rs)) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    return tsr_error(TSR_EINVAL,
                     "%s: \"rope_scaling\" with rope_type '%s' is not supported: Tessera's RoPE "
                     "has plain frequencies theta^(-2i/D) (Llama 3.1's llama3 scaling would need "
                     "a change to the model's rope tables); use a model without rope_scaling",
                     h->path, cJSON_IsString(t) ? t->valuestring : "?");
  }
  const char *act = "silu";
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (a && !cJSON_IsNull(a) && (!cJSON_IsString(a) || strcmp(a->valuestring, act)))
    return tsr_error(TSR_EINVAL, "%s: \"hidden_act\" is %s: the model's MLP is SwiGLU (silu) only",
                     h->path, cJSON_IsString(a) ? a->valuestring : "not a string");
  static const char *const biases[] = {"attention_bias", "mlp_bias"};
  for (int i = 0; i < 2; i++) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, biases[i]);
    if (b && !cJSON_IsNull(b) && !cJSON_IsFalse(b))
      return tsr_error(TSR_EINVAL, "%s: \"%s\" is set: the model has no biases", h->path,
                       biases[i]);
  }
  return TSR_OK;
}

static tsr_status read_token_ids(tsr_hf_config *h, const cJSON *root) {
  h->bos_token_id = -1;
  h->neos = 0;
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
  if (cJSON_IsNumber(b) && b->valuedouble >= 0 && b->valuedouble < 1e9)
    h->bos_token_id = (int32_t)b->valuedouble;
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
  if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < 1e9) {
    h->eos_token_id[h->neos++] = (int32_t)e->valuedouble;
  } else if (cJSON_IsArray(e)) {
    for (const cJSON *x = e->child; x && h->neos < 8; x = x->next)
      if (cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < 1e9)
        h->eos_token_id[h->neos++] = (int32_t)x->valuedouble;
  }
  return TSR_OK;
}

static tsr_status parse_config(tsr_hf_config *h, const cJSON *root) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (!cJSON_IsString(mt))
    return tsr_error(TSR_EINVAL, "%s: no \"model_type\" string; expected llama, mistral or mixtral",
                     h->path);
  if (strcmp(mt->valuestring, "llama") && strcmp(mt->valuestring, "mistral") &&
      strcmp(mt->valuestring, "mixtral"))
    return tsr_error(TSR_EINVAL,
                     "%s: \"model_type\" is '%s'; Tessera's model is a Llama: llama, mistral or "
                     "mixtral",
                     h->path, mt->valuestring);
  snprintf(h->model_type, sizeof h->model_type, "%s", mt->valuestring);
  bool mixtral = !strcmp(h->model_type, "mixtral"), llama = !strcmp(h->model_type, "llama");
  TSR_CHECK(check_unsupported(h, root));
  for (int k = 0; k < TSR_HF_NKEYS; k++) {
    bool present = false;
    if (k == TSR_HF_TIE) {
      bool v = false;
      TSR_CHECK(get_bool(h, root, key_names[k], &present, &v));
      h->value[k] = v;
    } else if (k != TSR_HF_SPARSE_STEP) {
      TSR_CHECK(get_number(h, root, key_names[k], is_int_key(k), &present, &h->value[k]));
    }
    h->given[k] = h->known[k] = present;
  }
  /* transformers' defaults for what the file leaves out (LlamaConfig, MistralConfig,
   * MixtralConfig); the sizes have no default worth taking */
  double eps = mixtral ? 1e-5 : 1e-6, theta = mixtral ? 1e6 : 10000;
  const struct {
    int k;
    double v;
  } defaults[] = {{TSR_HF_EPS, eps},   {TSR_HF_THETA, theta}, {TSR_HF_TIE, 0},
                  {TSR_HF_EXPERTS, 8}, {TSR_HF_TOP_K, 2},     {TSR_HF_AUX_COEF, 0.001}};
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (!h->known[defaults[i].k]) {
      h->known[defaults[i].k] = true;
      h->value[defaults[i].k] = defaults[i].v;
    }
  if (h->known[TSR_HF_HEADS] && !h->known[TSR_HF_KV_HEADS]) {
    h->known[TSR_HF_KV_HEADS] = true;
    h->value[TSR_HF_KV_HEADS] = h->value[TSR_HF_HEADS];
  }
  /* the model type says dense or all-MoE: implied, so a job that says otherwise disagrees */
  h->given[TSR_HF_SPARSE_STEP] = h->known[TSR_HF_SPARSE_STEP] = true;
  h->value[TSR_HF_SPARSE_STEP] = 1;
  if (!mixtral) {
    if (h->given[TSR_HF_EXPERTS])
      return tsr_error(TSR_EINVAL,
                       "%s: \"num_local_experts\" in a '%s' config: experts need model_type "
                       "mixtral",
                       h->path, h->model_type);
    h->given[TSR_HF_EXPERTS] = true;
    h->value[TSR_HF_EXPERTS] = 0;
  }
  const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
  if (hd && !cJSON_IsNull(hd) && h->known[TSR_HF_HIDDEN] && h->known[TSR_HF_HEADS]) {
    double want = h->value[TSR_HF_HIDDEN] / h->value[TSR_HF_HEADS];
    if (!cJSON_IsNumber(hd) || hd->valuedouble != want)
      return tsr_error(TSR_EINVAL,
                       "%s: \"head_dim\" is %g but hidden_size / num_attention_heads is %g: the "
                       "model's head dim is always that quotient (an explicit head_dim needs "
                       "a change to the model's projections)",
                       h->path, cJSON_IsNumber(hd) ? hd->valuedouble : NAN, want);
  }
  bool p = false;
  double v = 0;
  TSR_CHECK(get_number(h, root, "sliding_window", true, &p, &v));
  h->sliding_window = p ? (int64_t)v : 0;
  TSR_CHECK(get_number(h, root, "max_position_embeddings", true, &p, &v));
  h->max_position_embeddings = p ? (int64_t)v : 0;
  (void)llama;
  return read_token_ids(h, root);
}

tsr_status tsr_hf_config_read(const char *dir, tsr_hf_config *h) {
  memset(h, 0, sizeof *h);
  snprintf(h->path, sizeof h->path, "%s/config.json", dir);
  size_t len = 0;
  char *text = read_text(h->path, &len);
  if (!text)
    return tsr_error(TSR_EIO, "%s: cannot read: %s; a Hugging Face model folder has a config.json",
                     h->path, strerror(errno));
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  tsr_status s = TSR_OK;
  if (!root)
    s = tsr_error(TSR_EINVAL, "%s: not valid JSON (error near byte %ld of %zu)", h->path,
                  end ? (long)(end - text) : 0L, len);
  else if (!cJSON_IsObject(root))
    s = tsr_error(TSR_EINVAL, "%s: not a JSON object", h->path);
  else
    s = parse_config(h, root);
  cJSON_Delete(root);
  free(text);
  return s;
}

double tsr_hf_job_value(const tsr_config *cfg, int k) {
  const tsr_config_ext *x = tsr_config_ext_of(cfg);
  switch (k) {
    case TSR_HF_VOCAB:
      return (double)cfg->model.vocab_size;
    case TSR_HF_HIDDEN:
      return (double)cfg->model.hidden_size;
    case TSR_HF_INTERMEDIATE:
      return (double)cfg->model.intermediate_size;
    case TSR_HF_LAYERS:
      return (double)cfg->model.num_hidden_layers;
    case TSR_HF_HEADS:
      return (double)cfg->model.num_attention_heads;
    case TSR_HF_KV_HEADS:
      return (double)(cfg->model.num_key_value_heads ? cfg->model.num_key_value_heads
                                                     : cfg->model.num_attention_heads);
    case TSR_HF_EPS:
      return cfg->model.rms_norm_eps;
    case TSR_HF_THETA:
      return cfg->model.rope_theta;
    case TSR_HF_TIE:
      return cfg->model.tie_word_embeddings;
    case TSR_HF_EXPERTS:
      return (double)x->model.num_local_experts;
    case TSR_HF_TOP_K:
      return (double)x->model.num_experts_per_tok;
    case TSR_HF_SPARSE_STEP:
      return (double)x->model.decoder_sparse_step;
    default:
      return x->model.router_aux_loss_coef;
  }
}

static void set_job_value(tsr_config *cfg, int k, double v) {
  /* the extension struct belongs to the config; the job is being assembled, nothing reads it yet */
  tsr_config_ext *x = (tsr_config_ext *)tsr_config_ext_of(cfg);
  switch (k) {
    case TSR_HF_VOCAB:
      cfg->model.vocab_size = (int64_t)v;
      break;
    case TSR_HF_HIDDEN:
      cfg->model.hidden_size = (int64_t)v;
      break;
    case TSR_HF_INTERMEDIATE:
      cfg->model.intermediate_size = (int64_t)v;
      break;
    case TSR_HF_LAYERS:
      cfg->model.num_hidden_layers = (int64_t)v;
      break;
    case TSR_HF_HEADS:
      cfg->model.num_attention_heads = (int64_t)v;
      break;
    case TSR_HF_KV_HEADS:
      cfg->model.num_key_value_heads = (int64_t)v;
      break;
    case TSR_HF_EPS:
      cfg->model.rms_norm_eps = v;
      break;
    case TSR_HF_THETA:
      cfg->model.rope_theta = v;
      break;
    case TSR_HF_TIE:
      cfg->model.tie_word_embeddings = v != 0;
      break;
    case TSR_HF_EXPERTS:
      x->model.num_local_experts = (int64_t)v;
      break;
    case TSR_HF_TOP_K:
      x->model.num_experts_per_tok = (int64_t)v;
      break;
    case TSR_HF_SPARSE_STEP:
      x->model.decoder_sparse_step = (int64_t)v;
      break;
    default:
      x->model.router_aux_loss_coef = v;
      break;
  }
}

static const char *value_text(int k, double v, char *buf, size_t len) {
  if (k == TSR_HF_TIE)
    snprintf(buf, len, "%s", v != 0 ? "true" : "false");
  else if (is_int_key(k))
    snprintf(buf, len, "%.0f", v);
  else
    snprintf(buf, len, "%.17g", v);
  return buf;
}

/* The schema's range for [model] key k, checked against a value from config.json. */
static tsr_status check_range(const tsr_hf_config *h, int k, double v) {
  char text[64];
  value_text(k, v, text, sizeof text);
  for (int i = 0; i < tsr_config_schema_count(); i++) {
    const tsr_config_key *e = tsr_config_schema_at(i);
    if (strcmp(e->section, "model") || strcmp(e->spec.name, key_names[k])) continue;
    tsr_status s = tsr_key_check(&e->spec, text);
    if (s != TSR_OK) return tsr_error_prefix(s, "%s: \"%s\" is %s", h->path, key_names[k], text);
  }
  return TSR_OK;
}

static bool job_sets(const tsr_config *cfg, const char *key) {
  char where[TSR_MAX_PATH + 160];
  return tsr_config_line(cfg, "model", key) > 0 ||
         !strncmp(tsr_config_where(cfg, "model", key, where, sizeof where), "--set ", 6);
}

tsr_status tsr_hf_job_apply(tsr_config *cfg) {
  if (!cfg->checkpoint.load[0]) return TSR_OK;
  char dir[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160], a[64], b[64];
  tsr_train_path(cfg, cfg->checkpoint.load, dir, sizeof dir);
  if (!tsr_hf_is_folder(dir)) return TSR_OK;
  tsr_hf_config h;
  tsr_status s = tsr_hf_config_read(dir, &h);
  if (s != TSR_OK)
    return tsr_error_prefix(s, "%s",
                            tsr_config_where(cfg, "checkpoint", "load", where, sizeof where));
  bool moe = h.value[TSR_HF_EXPERTS] > 0;
  for (int k = 0; k < TSR_HF_NKEYS; k++) {
    bool set = job_sets(cfg, key_names[k]);
    /* a dense folder leaves the other MoE keys meaningless: the job's stand */
    if (!moe && k > TSR_HF_EXPERTS) continue;
    if (h.given[k]) {
      if (set && tsr_hf_job_value(cfg, k) != h.value[k])
        return tsr_error(TSR_EINVAL,
                         "%s: \"%s\" is %s, but %s is %s: a key set in both must agree; remove it "
                         "from the job to take the folder's value",
                         h.path, key_names[k], value_text(k, h.value[k], a, sizeof a),
                         tsr_config_where(cfg, "model", key_names[k], where, sizeof where),
                         value_text(k, tsr_hf_job_value(cfg, k), b, sizeof b));
    } else if (set) {
      continue; /* only the job says: the job's value */
    } else if (!h.known[k]) {
      return tsr_error(TSR_EINVAL,
                       "%s: no \"%s\"; give it in config.json or as [model] %s in the job", h.path,
                       key_names[k], key_names[k]);
    }
    TSR_CHECK(check_range(&h, k, h.value[k]));
    set_job_value(cfg, k, h.value[k]);
  }
  if (h.sliding_window > 0 && h.sliding_window < cfg->data.seq_len)
    return tsr_error(TSR_EINVAL,
                     "%s: \"sliding_window\" is %lld, shorter than [data] seq_len = %lld: the "
                     "model's attention is full causal, which equals a sliding window only up "
                     "to its length; use seq_len <= %lld",
                     h.path, (long long)h.sliding_window, (long long)cfg->data.seq_len,
                     (long long)h.sliding_window);
  tsr_llama_config mc = tsr_hf_model_config(cfg);
  s = tsr_llama_config_check(&mc);
  if (s != TSR_OK) return tsr_error_prefix(s, "%s (with the job's [model] keys)", h.path);
  return TSR_OK;
}

tsr_status tsr_hf_job_weights(const tsr_config *cfg, const char *override, char *buf, size_t len) {
  char path[TSR_TRAIN_PATH_LEN];
  struct stat sb;
  if (override)
    snprintf(buf, len, "%s", override);
  else if (cfg->checkpoint.save[0] &&
           stat(tsr_train_path(cfg, cfg->checkpoint.save, path, sizeof path), &sb) == 0)
    snprintf(buf, len, "%s", path);
  else if (cfg->checkpoint.load[0])
    snprintf(buf, len, "%s", tsr_train_path(cfg, cfg->checkpoint.load, path, sizeof path));
  else
    return tsr_error(TSR_EINVAL,
                     "%s: no weights: [checkpoint] save names no existing file and [checkpoint] "
                     "load is empty; give --checkpoint PATH",
                     cfg->path);
  return TSR_OK;
}

tsr_llama_config tsr_hf_model_config(const tsr_config *c) {
  return tsr_train_model_config(c);
}

tsr_status tsr_hf_tensors(const tsr_llama_config *m, tsr_hf_tensor **out, int *n) {
  *out = NULL;
  *n = 0;
  int64_t C = m->hidden_size, V = m->vocab_size, I = m->intermediate_size;
  int64_t D = C / m->num_attention_heads, Q = D * m->num_attention_heads,
          KV = D * m->num_key_value_heads, E = m->num_local_experts;
  int cap = 3 + m->num_hidden_layers * (9 + (int)(3 * E));
  tsr_hf_tensor *t = calloc((size_t)cap, sizeof *t);
  if (!t) return TSR_ERROR(TSR_ENOMEM, "out of memory listing %d tensors", cap);
  int k = 0;
#define ADD(r_, c_, ...)                                                                           \
  do {                                                                                             \
    snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__);                                            \
    t[k].ndim = (c_) ? 2 : 1;                                                                      \
    t[k].shape[0] = (r_);                                                                          \
    t[k].shape[1] = (c_);                                                                          \
    k++;                                                                                           \
  } while (0)
  ADD(V, C, "model.embed_tokens.weight");
  for (int l = 0; l < m->num_hidden_layers; l++) {
    ADD(Q, C, "model.layers.%d.self_attn.q_proj.weight", l);
    ADD(KV, C, "model.layers.%d.self_attn.k_proj.weight", l);
    ADD(KV, C, "model.layers.%d.self_attn.v_proj.weight", l);
    ADD(C, Q, "model.layers.%d.self_attn.o_proj.weight", l);
    if (tsr_llama_layer_is_moe(m, l)) {
      ADD(E, C, "model.layers.%d.block_sparse_moe.gate.weight", l);
      for (int e = 0; e < E; e++) {
        ADD(I, C, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
        ADD(I, C, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
      }
      for (int e = 0; e < E; e++)
        ADD(C, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
    } else {
      ADD(I, C, "model.layers.%d.mlp.gate_proj.weight", l);
      ADD(I, C, "model.layers.%d.mlp.up_proj.weight", l);
      ADD(C, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(C, 0, "model.layers.%d.input_layernorm.weight", l);
    ADD(C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
  }
  ADD(C, 0, "model.norm.weight");
  if (!m->tie_word_embeddings) ADD(V, C, "lm_head.weight");
#undef ADD
  *out = t;
  *n = k;
  return TSR_OK;
}
