/* The weights of a Hugging Face folder: model.safetensors, or the shards an index names. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "hf.h"

#define MAX_LISTED 5

struct tsr_hf_weights {
  int nfiles;
  tsr_safetensors_t **files;
};

void tsr_hf_weights_close(tsr_hf_weights *w) {
  if (!w) return;
  for (int i = 0; i < w->nfiles; i++) tsr_safetensors_close(w->files[i]);
  free(w->files);
  free(w);
}

static tsr_status add_file(tsr_hf_weights *w, const char *path) {
  tsr_safetensors_t **f = realloc(w->files, ((size_t)w->nfiles + 1) * sizeof *f);
  if (!f) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  w->files = f;
  TSR_CHECK(tsr_safetensors_open(path, &w->files[w->nfiles]));
  w->nfiles++;
  return TSR_OK;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
      *len = fread(buf, 1, (size_t)n, f);
      buf[*len] = '\0';
    }
  }
  fclose(f);
  return buf;
}

/* The shards of `index` (DIR/model.safetensors.index.json), each opened once, and the index
 * checked against them both ways. */
static tsr_status open_index(tsr_hf_weights *w, const char *dir, const char *index) {
  size_t len = 0;
  char *text = slurp(index, &len);
  if (!text) return tsr_error(TSR_EIO, "%s: cannot read: %s", index, strerror(errno));
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  tsr_status s = TSR_OK;
  const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  char **shard_of = NULL; /* per file: its name */
  if (!root) {
    s = tsr_error(TSR_EINVAL, "%s: not valid JSON", index);
    goto cleanup;
  }
  if (!cJSON_IsObject(map) || !map->child) {
    s = tsr_error(TSR_EINVAL, "%s: no \"weight_map\" object of tensor names to shard files", index);
    goto cleanup;
  }
  int nmap = cJSON_GetArraySize(map);
  shard_of = calloc((size_t)nmap + 1, sizeof *shard_of);
  if (!shard_of) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", index);
    goto cleanup;
  }
  for (const cJSON *e = map->child; e; e = e->next) {
    if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
        !strcmp(e->valuestring, "..")) {
      s = tsr_error(TSR_EINVAL, "%s: weight_map[\"%s\"] is not the name of a file in the folder",
                    index, e->string);
      goto cleanup;
    }
    int f = 0;
    while (f < w->nfiles && strcmp(shard_of[f], e->valuestring)) f++;
    if (f < w->nfiles) continue;
    char path[TSR_MAX_PATH * 2];
    snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
    shard_of[f] = e->valuestring;
    s = add_file(w, path);
    if (s != TSR_OK) {
      s = tsr_error_prefix(s, "%s: shard '%s' (of tensor '%s')", index, e->valuestring, e->string);
      goto cleanup;
    }
  }
  for (const cJSON *e = map->child; e; e = e->next) {
    int f = 0;
    while (strcmp(shard_of[f], e->valuestring)) f++;
    if (!tsr_safetensors_has(w->files[f], e->string)) {
      s = tsr_error(TSR_EINVAL, "%s: tensor '%s' is in shard %s by the index, but not in that file",
                    index, e->string, tsr_safetensors_path(w->files[f]));
      goto cleanup;
    }
  }
  for (int f = 0; f < w->nfiles; f++)
    for (int i = 0; i < tsr_safetensors_count(w->files[f]); i++) {
      const char *name = tsr_safetensors_name(w->files[f], i);
      const cJSON *e = cJSON_GetObjectItemCaseSensitive(map, name);
      if (!e || strcmp(e->valuestring, shard_of[f])) {
        s = tsr_error(TSR_EINVAL, "%s: tensor '%s' is in %s, but the index %s", index, name,
                      tsr_safetensors_path(w->files[f]),
                      e ? "puts it in another shard" : "does not list it");
        goto cleanup;
      }
    }
cleanup:
  free(shard_of);
  cJSON_Delete(root);
  return s;
}

tsr_status tsr_hf_weights_open(const char *path, tsr_hf_weights **out) {
  *out = NULL;
  tsr_hf_weights *w = calloc(1, sizeof *w);
  if (!w) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  tsr_status s = TSR_OK;
  if (!tsr_hf_is_folder(path)) {
    s = add_file(w, path);
  } else {
    char single[TSR_MAX_PATH * 2], index[TSR_MAX_PATH * 2];
    snprintf(single, sizeof single, "%s/model.safetensors", path);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
    FILE *f = fopen(single, "rb");
    if (f) {
      fclose(f);
      s = add_file(w, single);
    } else if ((f = fopen(index, "rb"))) {
      fclose(f);
      s = open_index(w, path, index);
    } else {
      s = tsr_error(TSR_EINVAL,
                    "%s: no model.safetensors and no model.safetensors.index.json: not a Hugging "
                    "Face model folder with safetensors weights",
                    path);
    }
  }
  if (s != TSR_OK) {
    tsr_hf_weights_close(w);
    return s;
  }
  *out = w;
  return TSR_OK;
}

const tsr_safetensors_t *tsr_hf_weights_find(const tsr_hf_weights *w, const char *name) {
  for (int i = 0; i < w->nfiles; i++)
    if (tsr_safetensors_has(w->files[i], name)) return w->files[i];
  return NULL;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static tsr_status check_extras(const tsr_hf_weights *w, int n, const char *const *names,
                               int nignore, const char *const *ignore) {
  const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
  if (!sorted) return TSR_ERROR(TSR_ENOMEM, "out of memory");
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  char list[1024] = "";
  size_t used = 0;
  int extra = 0;
  const char *first_file = NULL;
  for (int f = 0; f < w->nfiles; f++)
    for (int i = 0; i < tsr_safetensors_count(w->files[f]); i++) {
      const char *name = tsr_safetensors_name(w->files[f], i);
      if (bsearch(&name, sorted, (size_t)n, sizeof *sorted, cmp_str)) continue;
      bool skip = false;
      for (int k = 0; k < nignore && !skip; k++) skip = fnmatch(ignore[k], name, 0) == 0;
      if (skip) continue;
      if (!first_file) first_file = tsr_safetensors_path(w->files[f]);
      if (extra++ < MAX_LISTED && used < sizeof list)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", extra > 1 ? ", " : "",
                                 name);
    }
  free(sorted);
  if (!extra) return TSR_OK;
  return tsr_error(TSR_EINVAL,
                   "%s: %d tensor%s the model does not have: %s%s; check the config against the "
                   "weights",
                   first_file, extra, extra == 1 ? "" : "s", list,
                   extra > MAX_LISTED ? " and more" : "");
}

tsr_status tsr_hf_weights_load(const tsr_hf_weights *w, int n, const char *const *names,
                               tsr_tensor *const *dst, int nignore, const char *const *ignore) {
  for (int i = 0; i < n; i++) {
    const tsr_safetensors_t *st = tsr_hf_weights_find(w, names[i]);
    if (!st)
      return tsr_error(TSR_EINVAL, "%s: no tensor '%s'; the weights do not match the model",
                       tsr_safetensors_path(w->files[0]), names[i]);
    tsr_dtype dt = TSR_F32;
    int ndim = 0;
    int64_t shape[TSR_MAX_DIMS];
    tsr_status s = tsr_safetensors_info(st, names[i], &dt, &ndim, shape);
    if (s == TSR_OK && dt != TSR_F32 && dt != TSR_BF16 && dt != TSR_F16) s = TSR_EINVAL;
    if (s != TSR_OK)
      return tsr_error(TSR_EINVAL, "%s: tensor '%s' is %s; weights must be F32, BF16 or F16",
                       tsr_safetensors_path(st), names[i], tsr_safetensors_dtype_str(st, names[i]));
    bool same = ndim == dst[i]->ndim;
    for (int d = 0; same && d < ndim; d++) same = shape[d] == dst[i]->shape[d];
    if (!same) {
      char a[128], b[128];
      return tsr_error(TSR_EINVAL, "%s: tensor '%s' has shape %s, the model's is %s",
                       tsr_safetensors_path(st), names[i], tsr_shape_str(ndim, shape, a, sizeof a),
                       tsr_shape_str(dst[i]->ndim, dst[i]->shape, b, sizeof b));
    }
    tsr_tensor *tmp = NULL;
    TSR_CHECK(tsr_safetensors_read_as(st, names[i], TSR_F32, &tmp));
    const float *p = tsr_tensor_data(tmp);
    int64_t numel = tsr_tensor_numel(tmp);
    for (int64_t k = 0; k < numel; k++)
      if (!isfinite(p[k])) {
        tsr_tensor_free(tmp);
        return tsr_error(TSR_EINVAL, "%s: tensor '%s' holds %s at element %lld",
                         tsr_safetensors_path(st), names[i], isnan(p[k]) ? "NaN" : "Inf",
                         (long long)k);
      }
    s = tsr_tensor_copy(dst[i], tmp);
    tsr_tensor_free(tmp);
    TSR_CHECK(s);
  }
  return check_extras(w, n, names, nignore, ignore);
}
