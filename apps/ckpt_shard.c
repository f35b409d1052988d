/* Sharded checkpoints: the index, reading boxes out of the rank files, the folders of a dir. */
#include "ckpt_shard.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* cJSON keeps its last parse error in a process-wide variable: the ranks of a local job (threads)
 * parse the index one at a time. */
static pthread_mutex_t json_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct {
  const char *name;
  tsr_dtype dt;
} dtypes[] = {
    {"F32", TSR_F32}, {"BF16", TSR_BF16}, {"F16", TSR_F16}, {"I32", TSR_I32}, {"I64", TSR_I64}};

static const char *dtype_str(tsr_dtype dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return "?";
}

static bool dtype_parse(const char *s, tsr_dtype *dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(dtypes[i].name, s)) {
      *dt = dtypes[i].dt;
      return true;
    }
  return false;
}

/* ---- building ---- */

tsr_status tsr_ckpt_index_add_tensor(tsr_ckpt_index *ix, const char *name, tsr_dtype dt, int ndim,
                                     const int64_t *shape, int *i) {
  if (ix->n == ix->cap) {
    int cap = ix->cap ? 2 * ix->cap : 64;
    tsr_ckpt_tensor *t = realloc(ix->tensors, (size_t)cap * sizeof *t);
    if (!t) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
    ix->tensors = t;
    ix->cap = cap;
  }
  tsr_ckpt_tensor *t = &ix->tensors[ix->n];
  memset(t, 0, sizeof *t);
  if (!(t->name = strdup(name))) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
  t->dtype = dt;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  *i = ix->n++;
  return TSR_OK;
}

tsr_status tsr_ckpt_index_add_file(tsr_ckpt_index *ix, const char *file, int *f) {
  for (int k = 0; k < ix->nfiles; k++)
    if (!strcmp(ix->files[k], file)) {
      *f = k;
      return TSR_OK;
    }
  if (ix->nfiles == ix->fcap) {
    int cap = ix->fcap ? 2 * ix->fcap : 16;
    char **files = realloc(ix->files, (size_t)cap * sizeof *files);
    if (!files) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
    ix->files = files;
    ix->fcap = cap;
  }
  if (!(ix->files[ix->nfiles] = strdup(file)))
    return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
  *f = ix->nfiles++;
  return TSR_OK;
}

tsr_status tsr_ckpt_index_add_slice(tsr_ckpt_index *ix, int i, int f, const int64_t *off,
                                    const int64_t *shape) {
  tsr_ckpt_tensor *t = &ix->tensors[i];
  if (t->nslices == t->cap) {
    int cap = t->cap ? 2 * t->cap : 4;
    tsr_ckpt_slice *s = realloc(t->slices, (size_t)cap * sizeof *s);
    if (!s) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
    t->slices = s;
    t->cap = cap;
  }
  tsr_ckpt_slice *s = &t->slices[t->nslices++];
  memset(s, 0, sizeof *s);
  s->file = f;
  for (int d = 0; d < t->ndim; d++) {
    s->off[d] = off[d];
    s->shape[d] = shape[d];
  }
  return TSR_OK;
}

void tsr_ckpt_index_free(tsr_ckpt_index *ix) {
  for (int i = 0; i < ix->n; i++) {
    free(ix->tensors[i].name);
    free(ix->tensors[i].slices);
  }
  for (int f = 0; f < ix->nfiles; f++) free(ix->files[f]);
  free(ix->tensors);
  free(ix->files);
  memset(ix, 0, sizeof *ix);
}

const tsr_ckpt_tensor *tsr_ckpt_index_find(const tsr_ckpt_index *ix, const char *name) {
  for (int i = 0; i < ix->n; i++)
    if (!strcmp(ix->tensors[i].name, name)) return &ix->tensors[i];
  return NULL;
}

/* ---- writing ---- */

static cJSON *int_array(int n, const int64_t *v) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
  return a;
}

tsr_status tsr_ckpt_index_write(const char *folder, const tsr_ckpt_index *ix) {
  cJSON *root = cJSON_CreateObject(), *files = NULL, *tensors = NULL;
  if (!root) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
  cJSON_AddStringToObject(root, "format", TSR_CKPT_FORMAT);
  cJSON_AddNumberToObject(root, "step", (double)ix->step);
  cJSON_AddNumberToObject(root, "data_step", (double)ix->data_step);
  cJSON_AddNumberToObject(root, "world", ix->world);
  cJSON_AddStringToObject(root, "mesh", ix->mesh);
  cJSON_AddItemToObject(root, "files", files = cJSON_CreateArray());
  for (int f = 0; files && f < ix->nfiles; f++)
    cJSON_AddItemToArray(files, cJSON_CreateString(ix->files[f]));
  cJSON_AddItemToObject(root, "tensors", tensors = cJSON_CreateObject());
  for (int i = 0; tensors && i < ix->n; i++) {
    const tsr_ckpt_tensor *t = &ix->tensors[i];
    cJSON *o = cJSON_CreateObject(), *slices = NULL;
    if (!o) break;
    cJSON_AddItemToObject(tensors, t->name, o);
    cJSON_AddStringToObject(o, "dtype", dtype_str(t->dtype));
    cJSON_AddItemToObject(o, "shape", int_array(t->ndim, t->shape));
    cJSON_AddItemToObject(o, "slices", slices = cJSON_CreateArray());
    for (int k = 0; slices && k < t->nslices; k++) {
      cJSON *s = cJSON_CreateObject();
      if (!s) break;
      cJSON_AddItemToArray(slices, s);
      cJSON_AddStringToObject(s, "file", ix->files[t->slices[k].file]);
      cJSON_AddItemToObject(s, "offsets", int_array(t->ndim, t->slices[k].off));
      cJSON_AddItemToObject(s, "shape", int_array(t->ndim, t->slices[k].shape));
    }
  }
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) return TSR_ERROR(TSR_ENOMEM, "checkpoint index: out of memory");
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", folder, TSR_CKPT_INDEX);
  tsr_status s = tsr_file_write_atomic(path, text, strlen(text));
  free(text);
  return s;
}

/* ---- reading ---- */

static bool json_i64(const cJSON *j, int64_t *v) {
  if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
      j->valuedouble != (double)(int64_t)j->valuedouble)
    return false;
  *v = (int64_t)j->valuedouble;
  return true;
}

/* An array of `want` (or, with want < 0, up to TSR_MAX_DIMS) non-negative integers. */
static int json_ints(const cJSON *a, int want, int64_t *v) {
  if (!cJSON_IsArray(a)) return -1;
  int n = cJSON_GetArraySize(a);
  if ((want >= 0 && n != want) || n > TSR_MAX_DIMS) return -1;
  for (int i = 0; i < n; i++)
    if (!json_i64(cJSON_GetArrayItem(a, i), &v[i])) return -1;
  return n;
}

static tsr_status parse_tensor(tsr_ckpt_index *ix, const char *path, const cJSON *o) {
  const char *name = o->string;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
  const cJSON *slices = cJSON_GetObjectItemCaseSensitive(o, "slices");
  tsr_dtype dtype;
  int64_t shape[TSR_MAX_DIMS];
  int ndim = json_ints(cJSON_GetObjectItemCaseSensitive(o, "shape"), -1, shape);
  if (!cJSON_IsString(dt) || !dtype_parse(dt->valuestring, &dtype) || ndim < 0 ||
      !cJSON_IsArray(slices))
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s' needs a dtype (F32, BF16, F16, I32, I64), a shape of at "
                     "most %d dims and a list of slices",
                     path, name, TSR_MAX_DIMS);
  int i;
  TSR_CHECK(tsr_ckpt_index_add_tensor(ix, name, dtype, ndim, shape, &i));
  const cJSON *s;
  cJSON_ArrayForEach(s, slices) {
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
    int64_t off[TSR_MAX_DIMS], sh[TSR_MAX_DIMS];
    int f = -1;
    for (int k = 0; cJSON_IsString(file) && k < ix->nfiles; k++)
      if (!strcmp(ix->files[k], file->valuestring)) f = k;
    if (f < 0 || json_ints(cJSON_GetObjectItemCaseSensitive(s, "offsets"), ndim, off) < 0 ||
        json_ints(cJSON_GetObjectItemCaseSensitive(s, "shape"), ndim, sh) < 0)
      return TSR_ERROR(TSR_EINVAL,
                       "%s: a slice of tensor '%s' needs a file listed in \"files\" and offsets "
                       "and a shape of %d entries",
                       path, name, ndim);
    for (int d = 0; d < ndim; d++)
      if (off[d] + sh[d] > shape[d])
        return TSR_ERROR(TSR_EINVAL,
                         "%s: a slice of tensor '%s' in %s reaches %lld along dim %d, past its "
                         "size %lld",
                         path, name, ix->files[f], (long long)(off[d] + sh[d]), d,
                         (long long)shape[d]);
    TSR_CHECK(tsr_ckpt_index_add_slice(ix, i, f, off, sh));
  }
  return TSR_OK;
}

static tsr_status parse_index(tsr_ckpt_index *ix, const char *path, const cJSON *root) {
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(format) || strcmp(format->valuestring, TSR_CKPT_FORMAT))
    return TSR_ERROR(TSR_EINVAL, "%s: format is not \"%s\": not a Tessera sharded checkpoint", path,
                     TSR_CKPT_FORMAT);
  int64_t world = 0;
  const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(root, "mesh");
  if (!json_i64(cJSON_GetObjectItemCaseSensitive(root, "step"), &ix->step) ||
      !json_i64(cJSON_GetObjectItemCaseSensitive(root, "data_step"), &ix->data_step) ||
      !json_i64(cJSON_GetObjectItemCaseSensitive(root, "world"), &world) || world > 1 << 24)
    return TSR_ERROR(TSR_EINVAL, "%s: step, data_step and world must be non-negative integers",
                     path);
  ix->world = (int)world;
  snprintf(ix->mesh, sizeof ix->mesh, "%s", cJSON_IsString(mesh) ? mesh->valuestring : "?");
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files"), *f;
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors"), *o;
  if (!cJSON_IsArray(files) || !cJSON_IsObject(tensors))
    return TSR_ERROR(TSR_EINVAL, "%s: needs a \"files\" list and a \"tensors\" object", path);
  cJSON_ArrayForEach(f, files) {
    int k;
    if (!cJSON_IsString(f) || !f->valuestring[0] || strchr(f->valuestring, '/') ||
        !strcmp(f->valuestring, "..") || !strcmp(f->valuestring, "."))
      return TSR_ERROR(TSR_EINVAL, "%s: \"files\" must be names of files in the folder", path);
    TSR_CHECK(tsr_ckpt_index_add_file(ix, f->valuestring, &k));
  }
  cJSON_ArrayForEach(o, tensors) TSR_CHECK(parse_tensor(ix, path, o));
  return TSR_OK;
}

tsr_status tsr_ckpt_index_read(const char *folder, tsr_ckpt_index *ix) {
  memset(ix, 0, sizeof *ix);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", folder, TSR_CKPT_INDEX);
  FILE *f = fopen(path, "rb");
  if (!f) return TSR_ERROR(TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
  char *text = NULL;
  size_t len = 0, cap = 0;
  tsr_status s = TSR_OK;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 65536;
      char *p = realloc(text, cap);
      if (!p) {
        s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory", path);
        break;
      }
      text = p;
    }
    size_t got = fread(text + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  bool bad_read = ferror(f);
  fclose(f);
  if (s == TSR_OK && bad_read) s = TSR_ERROR(TSR_EIO, "%s: read failed", path);
  if (s != TSR_OK) {
    free(text);
    return s;
  }
  text[len] = '\0';
  pthread_mutex_lock(&json_lock);
  cJSON *root = cJSON_ParseWithLength(text, len);
  pthread_mutex_unlock(&json_lock);
  free(text);
  if (!root)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: not valid JSON (cut short or damaged); load an earlier checkpoint", path);
  s = parse_index(ix, path, root);
  cJSON_Delete(root);
  if (s != TSR_OK) tsr_ckpt_index_free(ix);
  return s;
}

/* ---- reading boxes ---- */

tsr_status tsr_ckpt_reader_init(tsr_ckpt_reader *r, const char *folder, const tsr_ckpt_index *ix) {
  memset(r, 0, sizeof *r);
  r->folder = folder;
  r->ix = ix;
  r->open = calloc((size_t)ix->nfiles + 1, sizeof *r->open);
  if (!r->open) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  return TSR_OK;
}

void tsr_ckpt_reader_close(tsr_ckpt_reader *r) {
  for (int f = 0; r->open && f < r->ix->nfiles; f++) tsr_safetensors_close(r->open[f]);
  free(r->open);
  r->open = NULL;
}

/* The bytes of slice `s` of tensor `t`, checked against the file's header. */
static tsr_status slice_bytes(tsr_ckpt_reader *r, const tsr_ckpt_tensor *t, const tsr_ckpt_slice *s,
                              const unsigned char **data) {
  if (!r->open[s->file]) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", r->folder, r->ix->files[s->file]);
    tsr_status st = tsr_safetensors_open(path, &r->open[s->file]);
    if (st != TSR_OK)
      return tsr_error_prefix(st,
                              "%s: a file the index names is missing or damaged (copy a "
                              "checkpoint folder whole, or load another one)",
                              r->folder);
    r->files_opened++;
  }
  tsr_safetensors_t *st = r->open[s->file];
  tsr_dtype dt;
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  TSR_CHECK(tsr_safetensors_info(st, t->name, &dt, &ndim, shape));
  bool same = dt == t->dtype && ndim == t->ndim;
  for (int d = 0; same && d < ndim; d++) same = shape[d] == s->shape[d];
  if (!same) {
    char a[160], b[160];
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s' is %s %s, but the index says this file holds %s %s of it",
                     tsr_safetensors_path(st), t->name, tsr_dtype_name(dt),
                     tsr_shape_str(ndim, shape, a, sizeof a), tsr_dtype_name(t->dtype),
                     tsr_shape_str(t->ndim, s->shape, b, sizeof b));
  }
  const void *p;
  size_t n;
  TSR_CHECK(tsr_safetensors_bytes(st, t->name, &p, &n));
  *data = p;
  return TSR_OK;
}

/* Copies the box lo..hi (global coordinates) from a row-major source box starting at `soff` with
 * shape `sshape` into a row-major destination box starting at `doff` with shape `dshape`. */
static void copy_box(int ndim, size_t es, const int64_t *lo, const int64_t *hi,
                     const unsigned char *src, const int64_t *soff, const int64_t *sshape,
                     unsigned char *dst, const int64_t *doff, const int64_t *dshape) {
  if (ndim == 0) {
    memcpy(dst, src, es);
    return;
  }
  int64_t idx[TSR_MAX_DIMS];
  for (int d = 0; d < ndim; d++) idx[d] = lo[d];
  size_t row = (size_t)(hi[ndim - 1] - lo[ndim - 1]) * es;
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < ndim; d++) {
      so = so * sshape[d] + (idx[d] - soff[d]);
      dof = dof * dshape[d] + (idx[d] - doff[d]);
    }
    memcpy(dst + (size_t)dof * es, src + (size_t)so * es, row);
    int d = ndim - 2;
    for (; d >= 0; d--) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d < 0) return;
  }
}

tsr_status tsr_ckpt_read_box(tsr_ckpt_reader *r, const char *name, const int64_t *start,
                             tsr_tensor *dst) {
  const tsr_ckpt_tensor *t = tsr_ckpt_index_find(r->ix, name);
  if (!t)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: no tensor '%s' in the index; the checkpoint does not match the model "
                     "(check [model] against the one that saved it)",
                     r->folder, name);
  if (t->ndim != dst->ndim || t->dtype != dst->dtype) {
    char a[160];
    return TSR_ERROR(
        TSR_EINVAL, "%s: tensor '%s' is %s %s in the index, the model's is %s of %d dims",
        r->folder, name, tsr_dtype_name(t->dtype), tsr_shape_str(t->ndim, t->shape, a, sizeof a),
        tsr_dtype_name(dst->dtype), dst->ndim);
  }
  bool host = tsr_tensor_device(dst).kind == TSR_DEVICE_CPU && tsr_tensor_is_contiguous(dst);
  tsr_tensor *buf = dst;
  if (!host) TSR_CHECK(tsr_tensor_new(NULL, dst->dtype, dst->ndim, dst->shape, &buf));
  size_t es = tsr_dtype_size(dst->dtype);
  int64_t covered = 0;
  tsr_status st = TSR_OK;
  for (int k = 0; k < t->nslices && st == TSR_OK; k++) {
    const tsr_ckpt_slice *s = &t->slices[k];
    int64_t lo[TSR_MAX_DIMS], hi[TSR_MAX_DIMS], n = 1;
    for (int d = 0; d < t->ndim; d++) {
      lo[d] = s->off[d] > start[d] ? s->off[d] : start[d];
      int64_t a = s->off[d] + s->shape[d], b = start[d] + dst->shape[d];
      hi[d] = a < b ? a : b;
      n *= hi[d] > lo[d] ? hi[d] - lo[d] : 0;
    }
    if (n == 0) continue;
    const unsigned char *src = NULL;
    st = slice_bytes(r, t, s, &src);
    if (st != TSR_OK) break;
    copy_box(t->ndim, es, lo, hi, src, s->off, s->shape, tsr_tensor_data(buf), start, dst->shape);
    covered += n;
    r->bytes_read += n * (int64_t)es;
  }
  if (st == TSR_OK && covered != tsr_tensor_numel(dst)) {
    char a[160];
    st = TSR_ERROR(TSR_EINVAL,
                   "%s: the slices of tensor '%s' cover %lld of the %lld elements of the part "
                   "this rank needs (%s from offset %lld...): files are missing or overlap; "
                   "load another checkpoint",
                   r->folder, name, (long long)covered, (long long)tsr_tensor_numel(dst),
                   tsr_shape_str(dst->ndim, dst->shape, a, sizeof a),
                   (long long)(dst->ndim ? start[0] : 0));
  }
  if (!host) {
    if (st == TSR_OK) st = tsr_tensor_copy(dst, buf);
    tsr_tensor_free(buf);
  }
  return st;
}

/* ---- the folders of a dir ---- */

int64_t tsr_ckpt_folder_step(const char *name) {
  if (strncmp(name, "step-", 5)) return -1;
  const char *p = name + 5;
  size_t n = strlen(p);
  if (n < 6 || n > 15) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9') return -1;
    v = v * 10 + (p[i] - '0');
  }
  return v;
}

bool tsr_ckpt_is_folder(const char *path) {
  struct stat sb;
  char idx[4096];
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return false;
  snprintf(idx, sizeof idx, "%s/%s", path, TSR_CKPT_INDEX);
  return stat(idx, &sb) == 0;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The steps of the step-NNNNNN folders of `dir`, ascending (malloc'd; *n of them). */
static int64_t *folder_steps(const char *dir, size_t *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  int64_t *steps = NULL;
  size_t cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s = tsr_ckpt_folder_step(e->d_name);
    if (s < 0) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *p = realloc(steps, cap * sizeof *p);
      if (!p) break;
      steps = p;
    }
    steps[(*n)++] = s;
  }
  closedir(d);
  if (steps) qsort(steps, *n, sizeof *steps, cmp_i64);
  return steps;
}

void tsr_ckpt_latest(const char *dir, char *out, size_t len, int64_t *step) {
  out[0] = '\0';
  *step = -1;
  size_t n;
  int64_t *steps = folder_steps(dir, &n);
  /* the newest first; a folder whose index does not read is not a complete checkpoint */
  for (size_t i = n; i-- > 0;) {
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%06lld", dir, (long long)steps[i]);
    tsr_ckpt_index ix;
    if (tsr_ckpt_index_read(path, &ix) != TSR_OK) continue;
    tsr_ckpt_index_free(&ix);
    *step = steps[i];
    snprintf(out, len, "%s", path);
    break;
  }
  free(steps);
  tsr_clear_error();
}

tsr_status tsr_ckpt_remove_folder(const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? TSR_OK : TSR_ERROR(TSR_EIO, "%s: %s", path, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    unlink(p);
  }
  closedir(d);
  if (rmdir(path) != 0 && errno != ENOENT)
    return TSR_ERROR(TSR_EIO, "%s: cannot remove: %s", path, strerror(errno));
  return TSR_OK;
}

void tsr_ckpt_sync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

void tsr_ckpt_prune(const char *dir, int64_t keep) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (!strncmp(e->d_name, ".step-", 6) && len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      tsr_ckpt_remove_folder(path); /* a killed save's */
    }
  }
  closedir(d);
  size_t n;
  int64_t *steps = keep > 0 ? folder_steps(dir, &n) : NULL;
  for (size_t i = 0; steps && i + (size_t)keep < n; i++) {
    snprintf(path, sizeof path, "%s/step-%06lld", dir, (long long)steps[i]);
    tsr_ckpt_remove_folder(path);
  }
  free(steps);
  tsr_ckpt_sync_dir(dir);
  tsr_clear_error();
}
