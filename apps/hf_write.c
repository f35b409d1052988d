/* Writing a Hugging Face model folder: config.json, the weights in one file or in shards with
 * their index, generation_config.json and the tokenizer files. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "hf.h"

static tsr_status write_json(const char *path, cJSON *root) {
  char *text = root ? cJSON_Print(root) : NULL;
  if (!text) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  size_t n = strlen(text);
  char *buf = malloc(n + 2);
  tsr_status s = buf ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  if (buf) {
    memcpy(buf, text, n);
    buf[n] = '\n';
    s = tsr_file_write_atomic(path, buf, n + 1);
  }
  free(buf);
  cJSON_free(text);
  return s;
}

static void add_num(cJSON *o, const char *key, double v) {
  cJSON_AddItemToObject(o, key, cJSON_CreateNumber(v));
}

static cJSON *config_json(const tsr_config *cfg, const tsr_hf_write_opts *opts) {
  tsr_llama_config m = tsr_hf_model_config(cfg);
  bool moe = m.num_local_experts > 0;
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(moe ? "MixtralForCausalLM" : "LlamaForCausalLM"));
  cJSON_AddStringToObject(o, "model_type", moe ? "mixtral" : "llama");
  for (int k = 0; k < TSR_HF_NKEYS; k++) {
    if (k == TSR_HF_SPARSE_STEP || (!moe && k >= TSR_HF_EXPERTS)) continue;
    double v = tsr_hf_job_value(cfg, k);
    if (k == TSR_HF_TIE)
      cJSON_AddBoolToObject(o, tsr_hf_key_name(k), v != 0);
    else
      add_num(o, tsr_hf_key_name(k), v);
  }
  add_num(o, "head_dim", m.hidden_size / m.num_attention_heads);
  cJSON_AddStringToObject(o, "hidden_act", "silu");
  add_num(o, "max_position_embeddings", (double)opts->max_positions);
  cJSON_AddNullToObject(o, "rope_scaling");
  cJSON_AddBoolToObject(o, "attention_bias", false);
  add_num(o, "attention_dropout", 0);
  if (moe) {
    cJSON_AddNullToObject(o, "sliding_window");
    cJSON_AddBoolToObject(o, "output_router_logits", m.router_aux_loss_coef > 0);
    add_num(o, "router_jitter_noise", 0);
  } else {
    cJSON_AddBoolToObject(o, "mlp_bias", false);
    add_num(o, "pretraining_tp", 1);
  }
  add_num(o, "initializer_range", 0.02);
  if (opts->bos_token_id >= 0) add_num(o, "bos_token_id", opts->bos_token_id);
  if (opts->eos_token_id >= 0) add_num(o, "eos_token_id", opts->eos_token_id);
  cJSON_AddStringToObject(o, "torch_dtype", opts->dtype == TSR_BF16 ? "bfloat16" : "float32");
  cJSON_AddBoolToObject(o, "use_cache", true);
  return o;
}

static tsr_status copy_file(const char *from, const char *dir) {
  FILE *f = fopen(from, "rb");
  if (!f) return tsr_error(TSR_EIO, "%s: cannot read: %s", from, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  tsr_status s = TSR_OK;
  for (;;) {
    if (n + 65536 > cap) {
      cap = cap ? 2 * cap : 1 << 20;
      char *p = realloc(buf, cap);
      if (!p) {
        s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", from);
        break;
      }
      buf = p;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  fclose(f);
  if (s == TSR_OK) {
    const char *base = strrchr(from, '/');
    char path[TSR_MAX_PATH * 2];
    snprintf(path, sizeof path, "%s/%s", dir, base ? base + 1 : from);
    s = tsr_file_write_atomic(path, buf, n);
  }
  free(buf);
  return s;
}

/* Weight files of an earlier export that this one does not write: transformers takes
 * model.safetensors before an index, so a stale one would shadow the new shards. */
static void remove_stale(const char *dir, int nshards, char (*shard)[64]) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    bool ours = !strcmp(e->d_name, "model.safetensors") ||
                !strcmp(e->d_name, "model.safetensors.index.json") ||
                fnmatch("model-[0-9]*-of-[0-9]*.safetensors", e->d_name, 0) == 0;
    if (!ours) continue;
    bool keep = nshards > 1 && !strcmp(e->d_name, "model.safetensors.index.json");
    for (int i = 0; i < nshards && !keep; i++) keep = !strcmp(e->d_name, shard[i]);
    if (!keep) (void)unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

typedef struct entry {
  const char *name;
  int shard;
} entry;

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* mkdir -p */
static int make_dirs(const char *dir) {
  char buf[TSR_MAX_PATH * 2];
  snprintf(buf, sizeof buf, "%s", dir);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

tsr_status tsr_hf_folder_write(const char *dir, const tsr_config *cfg, int n,
                               const char *const *names, const tsr_tensor *const *tensors,
                               const tsr_hf_write_opts *opts) {
  struct stat sb;
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return tsr_error(TSR_EINVAL, "%s: exists and is not a directory; give a folder", dir);
  if (stat(dir, &sb) != 0 && make_dirs(dir) != 0)
    return tsr_error(TSR_EIO, "%s: cannot create the folder: %s", dir, strerror(errno));
  tsr_status s = TSR_OK;
  tsr_tensor **cast = calloc((size_t)n + 1, sizeof *cast);
  int *shard_of = calloc((size_t)n + 1, sizeof *shard_of);
  entry *order = calloc((size_t)n + 1, sizeof *order);
  char(*shard)[64] = calloc((size_t)n + 1, sizeof *shard);
  cJSON *index = NULL, *config = NULL;
  if (!cast || !shard_of || !order || !shard) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", dir);
    goto cleanup;
  }
  /* greedy packing in the model's order: a new shard when the next tensor would overflow */
  int nshards = 0;
  int64_t used = 0, total = 0;
  for (int i = 0; i < n && s == TSR_OK; i++) {
    s = tensors[i]->dtype == opts->dtype ? tsr_tensor_to(tensors[i], NULL, &cast[i])
                                         : tsr_tensor_cast(tensors[i], opts->dtype, &cast[i]);
    int64_t bytes = (int64_t)tsr_tensor_nbytes(tensors[i]) /
                    (int64_t)tsr_dtype_size(tensors[i]->dtype) *
                    (int64_t)tsr_dtype_size(opts->dtype);
    if (nshards == 0 || (used > 0 && used + bytes > opts->shard_bytes)) {
      nshards++;
      used = 0;
    }
    used += bytes;
    total += bytes;
    shard_of[i] = nshards - 1;
  }
  if (s != TSR_OK) goto cleanup;
  for (int k = 0; k < nshards; k++) {
    if (nshards == 1)
      snprintf(shard[k], sizeof shard[k], "model.safetensors");
    else
      snprintf(shard[k], sizeof shard[k], "model-%05d-of-%05d.safetensors", k + 1, nshards);
  }
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  for (int k = 0, first = 0; k < nshards && s == TSR_OK; k++) {
    int last = first;
    while (last < n && shard_of[last] == k) last++;
    char path[TSR_MAX_PATH * 2];
    snprintf(path, sizeof path, "%s/%s", dir, shard[k]);
    s = tsr_safetensors_save(path, last - first, names + first,
                             (const tsr_tensor *const *)cast + first, 1, mk, mv);
    first = last;
  }
  if (s != TSR_OK) goto cleanup;
  char path[TSR_MAX_PATH * 2];
  if (nshards > 1) {
    index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    add_num(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    for (int i = 0; i < n; i++) order[i] = (entry){names[i], shard_of[i]};
    qsort(order, (size_t)n, sizeof *order, cmp_entry);
    for (int i = 0; i < n; i++) cJSON_AddStringToObject(map, order[i].name, shard[order[i].shard]);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    TSR_CHECK_GOTO(write_json(path, index), s);
  }
  config = config_json(cfg, opts);
  snprintf(path, sizeof path, "%s/config.json", dir);
  TSR_CHECK_GOTO(write_json(path, config), s);
  if (opts->bos_token_id >= 0 || opts->eos_token_id >= 0) {
    cJSON *gen = cJSON_CreateObject();
    if (opts->bos_token_id >= 0) add_num(gen, "bos_token_id", opts->bos_token_id);
    if (opts->eos_token_id >= 0) add_num(gen, "eos_token_id", opts->eos_token_id);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    s = write_json(path, gen);
    cJSON_Delete(gen);
    if (s != TSR_OK) goto cleanup;
  }
  for (int i = 0; i < opts->ntokenizer && s == TSR_OK; i++) s = copy_file(opts->tokenizer[i], dir);
  if (s == TSR_OK) remove_stale(dir, nshards, shard);
cleanup:
  cJSON_Delete(index);
  cJSON_Delete(config);
  for (int i = 0; cast && i < n; i++) tsr_tensor_free(cast[i]);
  free(cast);
  free(shard_of);
  free(order);
  free(shard);
  return s;
}
