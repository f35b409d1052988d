/* Checkpoints: a Hugging Face-compatible model file and a Tessera optimizer file. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_internal.h"

/* Most extra names listed in one error: enough to see the pattern, short enough to read. */
#define MAX_LISTED_EXTRAS 5

const char *const tsr_checkpoint_hf_buffers[] = {
    "model.rotary_emb.inv_freq",
    "model.layers.*.self_attn.rotary_emb.inv_freq",
};
const int tsr_checkpoint_hf_buffers_count =
    (int)(sizeof tsr_checkpoint_hf_buffers / sizeof tsr_checkpoint_hf_buffers[0]);

static const char suffix[] = ".safetensors";
static const char optim_suffix[] = ".optim.safetensors";

tsr_status tsr_checkpoint_optim_path(const char *model_path, char *buf, size_t len) {
  size_t n = strlen(model_path), sl = sizeof suffix - 1;
  size_t stem = n >= sl && strcmp(model_path + n - sl, suffix) == 0 ? n - sl : n;
  if (stem + sizeof optim_suffix > len)
    return TSR_ERROR(TSR_EINVAL, "%s: the optimizer file name does not fit in %zu bytes",
                     model_path, len);
  memcpy(buf, model_path, stem);
  memcpy(buf + stem, optim_suffix, sizeof optim_suffix);
  return TSR_OK;
}

static char *join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *s = malloc(la + lb + 1);
  if (!s) return NULL;
  memcpy(s, a, la);
  memcpy(s + la, b, lb + 1);
  return s;
}

static void free_names(char **names, int n) {
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(names);
}

/* `<name>.exp_avg` for every parameter, then `<name>.exp_avg_sq`. */
static tsr_status optim_names(const char *path, int n, const char *const *names, char ***out) {
  char **s = calloc(2 * (size_t)n + 1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    s[i] = join(names[i], ".exp_avg");
    s[n + i] = join(names[i], ".exp_avg_sq");
    if (!s[i] || !s[n + i]) {
      free_names(s, 2 * n);
      return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
    }
  }
  *out = s;
  return TSR_OK;
}

static tsr_status check_list(const char *what, int n, const char *const *names,
                             const void *const *tensors) {
  if (n < 0 || (n > 0 && (!names || !tensors)))
    return TSR_ERROR(TSR_EINVAL, "checkpoint %s: bad parameter list (n = %d)", what, n);
  for (int i = 0; i < n; i++) {
    if (!names[i]) return TSR_ERROR(TSR_EINVAL, "checkpoint %s: parameter %d has no name", what, i);
    if (!tensors[i])
      return TSR_ERROR(TSR_EINVAL, "checkpoint %s: tensor of parameter '%s' is NULL", what,
                       names[i]);
  }
  return TSR_OK;
}

/* ---- the checkpoint id ---- */

/* 64-bit mixing hash over 8-byte words (FNV-style step, then a finaliser): fast enough to run over
 * a whole checkpoint before writing it. Not cryptographic: it tells saves apart. */
static uint64_t mix(uint64_t h, uint64_t w) {
  return (h ^ w) * 0x100000001b3ull + (h >> 29);
}

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; k++) tail |= (uint64_t)p[i + k] << (8 * k);
  return mix(h, tail ^ (uint64_t)n << 56);
}

static tsr_status hash_tensors(uint64_t *h, int n, const char *const *names,
                               const tsr_tensor *const *ts) {
  for (int i = 0; i < n; i++) {
    const tsr_tensor *t = ts[i];
    *h = hash_bytes(*h, (const unsigned char *)names[i], strlen(names[i]));
    *h = mix(*h, (uint64_t)t->dtype << 32 | (uint64_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) *h = mix(*h, (uint64_t)t->shape[d]);
    if (tsr_tensor_device(t).kind == TSR_DEVICE_CPU && tsr_tensor_is_contiguous(t)) {
      *h = hash_bytes(*h, tsr_tensor_data(t), tsr_tensor_nbytes(t));
      continue;
    }
    tsr_tensor *c = NULL; /* a strided or device tensor is hashed from a contiguous host copy */
    tsr_status s = tsr_tensor_to(t, NULL, &c);
    if (s != TSR_OK) return tsr_error_prefix(s, "checkpoint: tensor '%s'", names[i]);
    *h = hash_bytes(*h, tsr_tensor_data(c), tsr_tensor_nbytes(c));
    tsr_tensor_free(c);
  }
  return TSR_OK;
}

/* The id both files of a save carry: a hash of the step and of every name, shape and byte of
 * both. A function of the contents, so that saving the same state twice gives the same bytes. */
static tsr_status checkpoint_id(int64_t step, int n, const char *const *names,
                                const tsr_tensor *const *params, const char *const *onames,
                                const tsr_tensor *const *otensors, char *out, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, (uint64_t)step);
  TSR_CHECK(hash_tensors(&h, n, names, params));
  TSR_CHECK(hash_tensors(&h, 2 * n, onames, otensors));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  snprintf(out, len, "%016llx", (unsigned long long)h);
  return TSR_OK;
}

void tsr_save_point_reached(tsr_save_point p) {
  static const char *const names[] = {"",           "optim-half",      "optim-temp", "model-half",
                                      "model-temp", "optim-published", "published"};
  const char *want = getenv("TESSERA_TEST_SAVE_KILL");
  if (!want || p <= TSR_SAVE_NONE || p > TSR_SAVE_PUBLISHED || strcmp(want, names[p])) return;
  raise(SIGKILL);
}

tsr_status tsr_checkpoint_save(const char *model_path, const char *optim_path, int n,
                               const char *const *names, const tsr_tensor *const *params,
                               const tsr_tensor *const *exp_avg,
                               const tsr_tensor *const *exp_avg_sq, int64_t step) {
  if (!model_path) return TSR_ERROR(TSR_EINVAL, "checkpoint save: NULL model path");
  if (!exp_avg != !exp_avg_sq)
    return TSR_ERROR(TSR_EINVAL, "%s: exp_avg and exp_avg_sq must both be given or both be NULL",
                     model_path);
  TSR_CHECK(check_list(model_path, n, names, (const void *const *)params));
  char step_str[32];
  snprintf(step_str, sizeof step_str, "%" PRId64, step);
  /* transformers refuses safetensors whose "format" is not one of its frameworks. */
  const char *mkeys[3] = {"format", "step", "checkpoint"}, *mvals[3] = {"pt", step_str, NULL};
  if (!exp_avg) return tsr_safetensors_save(model_path, n, names, params, 2, mkeys, mvals);

  TSR_CHECK(check_list(model_path, n, names, (const void *const *)exp_avg));
  TSR_CHECK(check_list(model_path, n, names, (const void *const *)exp_avg_sq));
  tsr_status s = TSR_OK;
  char *derived = NULL, **onames = NULL, *otmp = NULL, *mtmp = NULL;
  const tsr_tensor **otensors = NULL;
  if (!optim_path) {
    size_t len = strlen(model_path) + sizeof optim_suffix;
    if (!(derived = malloc(len))) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", model_path);
    TSR_CHECK_GOTO(tsr_checkpoint_optim_path(model_path, derived, len), s);
    optim_path = derived;
  }
  TSR_CHECK_GOTO(optim_names(optim_path, n, names, &onames), s);
  otensors = calloc(2 * (size_t)n + 1, sizeof *otensors);
  if (!otensors) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", optim_path);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    otensors[i] = exp_avg[i];
    otensors[n + i] = exp_avg_sq[i];
  }
  char id[32];
  TSR_CHECK_GOTO(
      checkpoint_id(step, n, names, params, (const char *const *)onames, otensors, id, sizeof id),
      s);
  mvals[2] = id;
  const char *okeys[3] = {"format", "step", "checkpoint"},
             *ovals[3] = {TSR_CHECKPOINT_OPTIM_FORMAT, step_str, id};
  /* Both files complete and synced under temporary names before either is published: a failed
   * or killed write leaves the previous pair as it was. The optimizer file is published first
   * and is the commit point: once it is in place the model temporary is complete, and a load
   * that finds the pair split by a crash between the two renames takes that temporary
   * (tsr_checkpoint_pair). */
  TSR_CHECK_GOTO(tsr_st_write_temp(optim_path, 2 * n, (const char *const *)onames, otensors, 3,
                                   okeys, ovals, TSR_SAVE_OPTIM_HALF, &otmp),
                 s);
  tsr_save_point_reached(TSR_SAVE_OPTIM_TEMP);
  TSR_CHECK_GOTO(
      tsr_st_write_temp(model_path, n, names, params, 3, mkeys, mvals, TSR_SAVE_MODEL_HALF, &mtmp),
      s);
  tsr_save_point_reached(TSR_SAVE_MODEL_TEMP);
  s = tsr_st_publish(otmp, optim_path);
  free(otmp);
  otmp = NULL;
  if (s != TSR_OK) goto cleanup;
  tsr_save_point_reached(TSR_SAVE_OPTIM_PUBLISHED);
  s = tsr_st_publish(mtmp, model_path);
  free(mtmp);
  mtmp = NULL;
  if (s != TSR_OK) goto cleanup;
  tsr_save_point_reached(TSR_SAVE_PUBLISHED);
  tsr_st_remove_stale(optim_path);
  tsr_st_remove_stale(model_path);
cleanup:
  if (otmp) unlink(otmp);
  if (mtmp) unlink(mtmp);
  free(otmp);
  free(mtmp);
  free(otensors);
  free_names(onames, 2 * n);
  free(derived);
  return s;
}

/* ---- pairing the two files ---- */

typedef struct pair_meta {
  char step[32], id[32];
  bool has_id;
} pair_meta;

static tsr_status read_pair_meta(const char *path, pair_meta *m) {
  memset(m, 0, sizeof *m);
  tsr_safetensors_t *st = NULL;
  TSR_CHECK(tsr_safetensors_open(path, &st));
  const char *step = tsr_safetensors_meta(st, "step"), *id = tsr_safetensors_meta(st, "checkpoint");
  snprintf(m->step, sizeof m->step, "%s", step ? step : "none");
  snprintf(m->id, sizeof m->id, "%s", id ? id : "none");
  m->has_id = id != NULL;
  tsr_safetensors_close(st);
  return TSR_OK;
}

static bool same_save(const pair_meta *a, const pair_meta *b) {
  return !strcmp(a->step, b->step) && !strcmp(a->id, b->id);
}

/* A complete temporary of `model_path` (left by a save killed between its two renames) that
 * belongs to the save of `want`; malloc'd path in *out, NULL when there is none. */
static void find_model_temp(const char *model_path, const pair_meta *want, char **out) {
  *out = NULL;
  const char *slash = strrchr(model_path, '/');
  size_t dl = slash ? (size_t)(slash - model_path) + 1 : 0;
  char *dir = malloc(dl + 2);
  if (!dir) return;
  if (dl)
    memcpy(dir, model_path, dl);
  else
    dir[dl++] = '.';
  dir[dl] = '\0';
  DIR *d = opendir(dir);
  free(dir);
  if (!d) return;
  struct dirent *e;
  while (!*out && (e = readdir(d))) {
    if (!tsr_st_temp_of(model_path, e->d_name, NULL)) continue;
    size_t len = (slash ? (size_t)(slash - model_path) + 1 : 0) + strlen(e->d_name) + 1;
    char *p = malloc(len);
    if (!p) break;
    snprintf(p, len, "%.*s%s", slash ? (int)(slash - model_path) + 1 : 0, model_path, e->d_name);
    pair_meta m;
    if (read_pair_meta(p, &m) == TSR_OK && m.has_id && same_save(&m, want))
      *out = p;
    else
      free(p);
  }
  closedir(d);
  tsr_clear_error();
}

tsr_status tsr_checkpoint_pair(const char *model_path, const char *optim_path, char **model_out) {
  *model_out = NULL;
  pair_meta om, mm;
  TSR_CHECK(read_pair_meta(optim_path, &om));
  tsr_status s = read_pair_meta(model_path, &mm);
  if (s == TSR_OK && same_save(&mm, &om)) goto found;
  tsr_status model_st = s;
  char *tmp = NULL;
  if (om.has_id) find_model_temp(model_path, &om, &tmp);
  if (tmp) {
    *model_out = tmp;
    return TSR_OK;
  }
  if (model_st != TSR_OK) return model_st;
  return TSR_ERROR(TSR_EINVAL,
                   "%s (step %s, checkpoint %s) and %s (step %s, checkpoint %s) are not one "
                   "checkpoint: they come from different saves, or a save was cut short; load "
                   "the model file alone (remove or move the optimizer file) or restore the "
                   "optimizer file that was saved with it",
                   model_path, mm.step, mm.id, optim_path, om.step, om.id);
found:
  *model_out = malloc(strlen(model_path) + 1);
  if (!*model_out) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", model_path);
  strcpy(*model_out, model_path);
  return TSR_OK;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool ignored(const char *name, const tsr_checkpoint_opts *opts) {
  for (int i = 0; opts && i < opts->n_ignore; i++)
    if (fnmatch(opts->ignore[i], name, 0) == 0) return true;
  return false;
}

/* Fails on tensors of the file that were not asked for, listing the first few. */
static tsr_status check_extras(const tsr_safetensors_t *st, const char **sorted, int n,
                               const tsr_checkpoint_opts *opts) {
  const char *listed[MAX_LISTED_EXTRAS];
  int nextra = 0;
  for (int i = 0; i < tsr_safetensors_count(st); i++) {
    const char *name = tsr_safetensors_name(st, i);
    if (bsearch(&name, sorted, (size_t)n, sizeof *sorted, cmp_str) || ignored(name, opts)) continue;
    if (nextra < MAX_LISTED_EXTRAS) listed[nextra] = name;
    nextra++;
  }
  if (nextra == 0) return TSR_OK;
  char list[1024];
  size_t used = 0;
  list[0] = '\0';
  int shown = nextra < MAX_LISTED_EXTRAS ? nextra : MAX_LISTED_EXTRAS;
  for (int i = 0; i < shown && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "", listed[i]);
  if (nextra > shown && used < sizeof list)
    snprintf(list + used, sizeof list - used, " and %d more", nextra - shown);
  return TSR_ERROR(TSR_EINVAL,
                   "%s: %d tensor%s the model does not have: %s; skip names that are "
                   "not parameters with ignore patterns (tsr_checkpoint_opts)",
                   tsr_safetensors_path(st), nextra, nextra == 1 ? "" : "s", list);
}

/* Checks the whole file against every destination, then copies: a failed load writes nothing. */
static tsr_status load_all(const tsr_safetensors_t *st, int n, const char *const *names,
                           tsr_tensor *const *dst, const tsr_checkpoint_opts *opts) {
  const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
  if (!sorted) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory", tsr_safetensors_path(st));
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  tsr_status s = TSR_OK;
  for (int i = 1; i < n; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) {
      s = TSR_ERROR(TSR_EINVAL, "%s: parameter '%s' is asked for twice", tsr_safetensors_path(st),
                    sorted[i]);
      goto cleanup;
    }
  for (int i = 0; i < n; i++) {
    if (!tsr_safetensors_has(st, names[i])) {
      s = TSR_ERROR(TSR_EINVAL,
                    "%s: no tensor '%s'; the checkpoint does not match the model "
                    "(check [model] against the file)",
                    tsr_safetensors_path(st), names[i]);
      goto cleanup;
    }
    s = tsr_safetensors_check_into(st, names[i], dst[i], true);
    /* a dtype Tessera has no tensor for (U8, F64, ...) is a bad file, not a missing feature */
    if (s == TSR_ENOTSUP) s = TSR_EINVAL;
    if (s != TSR_OK) goto cleanup;
    TSR_CHECK_GOTO(tsr_safetensors_check_finite(st, names[i]), s);
  }
  TSR_CHECK_GOTO(check_extras(st, sorted, n, opts), s);
  for (int i = 0; i < n; i++)
    TSR_CHECK_GOTO(tsr_safetensors_copy_into(st, names[i], dst[i], true), s);
cleanup:
  free(sorted);
  return s;
}

tsr_status tsr_checkpoint_load_model(const char *path, int n, const char *const *names,
                                     tsr_tensor *const *params, const tsr_checkpoint_opts *opts) {
  TSR_CHECK(check_list(path, n, names, (const void *const *)params));
  if (opts && opts->n_ignore > 0 && !opts->ignore)
    return TSR_ERROR(TSR_EINVAL, "%s: %d ignore patterns given as NULL", path, opts->n_ignore);
  tsr_safetensors_t *st = NULL;
  TSR_CHECK(tsr_safetensors_open(path, &st));
  tsr_status s = load_all(st, n, names, params, opts);
  tsr_safetensors_close(st);
  return s;
}

static tsr_status parse_step(const tsr_safetensors_t *st, int64_t *step) {
  const char *v = tsr_safetensors_meta(st, "step");
  if (!v)
    return TSR_ERROR(TSR_EINVAL, "%s: no \"step\" in the metadata of an optimizer file",
                     tsr_safetensors_path(st));
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < 0)
    return TSR_ERROR(TSR_EINVAL, "%s: metadata step '%s' is not a non-negative integer",
                     tsr_safetensors_path(st), v);
  *step = (int64_t)x;
  return TSR_OK;
}

tsr_status tsr_checkpoint_load_optim(const char *path, int n, const char *const *names,
                                     tsr_tensor *const *exp_avg, tsr_tensor *const *exp_avg_sq,
                                     int64_t *step) {
  TSR_CHECK(check_list(path, n, names, (const void *const *)exp_avg));
  TSR_CHECK(check_list(path, n, names, (const void *const *)exp_avg_sq));
  tsr_safetensors_t *st = NULL;
  char **onames = NULL;
  tsr_tensor **dst = NULL;
  tsr_status s = TSR_OK;
  TSR_CHECK_GOTO(tsr_safetensors_open(path, &st), s);
  const char *format = tsr_safetensors_meta(st, "format");
  if (!format || strcmp(format, TSR_CHECKPOINT_OPTIM_FORMAT) != 0) {
    s = TSR_ERROR(TSR_EINVAL,
                  "%s: metadata format is %s%s%s, expected '%s': not a Tessera "
                  "optimizer file",
                  path, format ? "'" : "", format ? format : "missing", format ? "'" : "",
                  TSR_CHECKPOINT_OPTIM_FORMAT);
    goto cleanup;
  }
  int64_t saved_step = 0;
  TSR_CHECK_GOTO(parse_step(st, &saved_step), s);
  TSR_CHECK_GOTO(optim_names(path, n, names, &onames), s);
  dst = calloc(2 * (size_t)n + 1, sizeof *dst);
  if (!dst) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    dst[i] = exp_avg[i];
    dst[n + i] = exp_avg_sq[i];
  }
  TSR_CHECK_GOTO(load_all(st, 2 * n, (const char *const *)onames, dst, NULL), s);
  if (step) *step = saved_step;
cleanup:
  free(dst);
  free_names(onames, 2 * n);
  tsr_safetensors_close(st);
  return s;
}
