/* Safetensors reader: the whole header is validated on open; tensor data stays in the mapping
 * until it is asked for. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "io_internal.h"

/* The reference implementation refuses headers above 100 MB; a larger one is a corrupt length. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* JSON numbers are doubles: integers above 2^53 are not exact. */
#define ST_MAX_INT 9007199254740992.0

const tsr_st_dtype_info tsr_st_dtypes[] = {
    {"F64", 8, -1},      {"F32", 4, TSR_F32}, {"F16", 2, TSR_F16}, {"BF16", 2, TSR_BF16},
    {"I64", 8, TSR_I64}, {"I32", 4, TSR_I32}, {"I16", 2, -1},      {"I8", 1, -1},
    {"U64", 8, -1},      {"U32", 4, -1},      {"U16", 2, -1},      {"U8", 1, -1},
    {"BOOL", 1, -1},     {"F8_E4M3", 1, -1},  {"F8_E5M2", 1, -1},
};
const int tsr_st_dtype_count = (int)(sizeof tsr_st_dtypes / sizeof tsr_st_dtypes[0]);

typedef struct st_entry {
  char *name;
  int dtype; /* index into tsr_st_dtypes */
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  uint64_t begin, end; /* relative to the data buffer */
} st_entry;

struct tsr_safetensors_t {
  char *path;
  void *map;
  size_t map_len;
  const unsigned char *data; /* the data buffer, inside the mapping */
  uint64_t data_len;
  int n;
  st_entry *entries;  /* header order */
  st_entry **by_name; /* sorted by name, for lookups */
  int nmeta;
  char **meta_keys, **meta_values;
};

/* cJSON records its last parse error in a process-wide variable, so two ranks (threads) parsing
 * at once would race on it. Parses are rare and short: serialise them. */
static pthread_mutex_t json_lock = PTHREAD_MUTEX_INITIALIZER;

bool tsr_st_host_is_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

int tsr_st_dtype_from_tsr(tsr_dtype dt) {
  for (int i = 0; i < tsr_st_dtype_count; i++)
    if (tsr_st_dtypes[i].tsr == (int)dt) return i;
  return -1;
}

static int dtype_lookup(const char *s) {
  for (int i = 0; i < tsr_st_dtype_count; i++)
    if (strcmp(tsr_st_dtypes[i].name, s) == 0) return i;
  return -1;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp((*(st_entry *const *)a)->name, (*(st_entry *const *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
  const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

void tsr_safetensors_close(tsr_safetensors_t *st) {
  if (!st) return;
  for (int i = 0; i < st->n; i++) free(st->entries[i].name);
  for (int i = 0; i < st->nmeta; i++) {
    free(st->meta_keys[i]);
    free(st->meta_values[i]);
  }
  free(st->entries);
  free(st->by_name);
  free(st->meta_keys);
  free(st->meta_values);
  if (st->map) munmap(st->map, st->map_len);
  free(st->path);
  free(st);
}

/* A JSON number that is a non-negative integer exactly representable in a double. */
static bool json_uint(const cJSON *j, uint64_t *v) {
  if (!cJSON_IsNumber(j)) return false;
  double d = j->valuedouble;
  if (!(d >= 0 && d <= ST_MAX_INT) || d != (double)(uint64_t)d) return false;
  *v = (uint64_t)d;
  return true;
}

static tsr_status parse_metadata(tsr_safetensors_t *st, const cJSON *meta) {
  if (!cJSON_IsObject(meta))
    return TSR_ERROR(TSR_EINVAL, "%s: \"__metadata__\" is not a JSON object of strings", st->path);
  int n = cJSON_GetArraySize(meta);
  st->meta_keys = calloc((size_t)n + 1, sizeof *st->meta_keys);
  st->meta_values = calloc((size_t)n + 1, sizeof *st->meta_values);
  if (!st->meta_keys || !st->meta_values)
    return TSR_ERROR(TSR_ENOMEM, "%s: out of memory reading the metadata", st->path);
  for (const cJSON *kv = meta->child; kv; kv = kv->next) {
    if (!cJSON_IsString(kv))
      return TSR_ERROR(TSR_EINVAL,
                       "%s: metadata '%s' is not a string; safetensors metadata "
                       "values are strings",
                       st->path, kv->string);
    for (int i = 0; i < st->nmeta; i++)
      if (strcmp(st->meta_keys[i], kv->string) == 0)
        return TSR_ERROR(TSR_EINVAL, "%s: metadata key '%s' appears twice", st->path, kv->string);
    st->meta_keys[st->nmeta] = dup_str(kv->string);
    st->meta_values[st->nmeta] = dup_str(kv->valuestring);
    st->nmeta++;
    if (!st->meta_keys[st->nmeta - 1] || !st->meta_values[st->nmeta - 1])
      return TSR_ERROR(TSR_ENOMEM, "%s: out of memory reading the metadata", st->path);
  }
  return TSR_OK;
}

static tsr_status parse_entry(tsr_safetensors_t *st, const cJSON *j, st_entry *e) {
  const char *path = st->path, *name = j->string;
  if (!cJSON_IsObject(j))
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s': entry is not a JSON object "
                     "{\"dtype\", \"shape\", \"data_offsets\"}",
                     path, name);
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
  if (!cJSON_IsString(jd))
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': missing \"dtype\" string", path, name);
  e->dtype = dtype_lookup(jd->valuestring);
  if (e->dtype < 0)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s': unknown dtype '%s'; expected one of F64, F32, "
                     "F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2",
                     path, name, jd->valuestring);
  if (!cJSON_IsArray(js))
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': missing \"shape\" array", path, name);
  e->ndim = cJSON_GetArraySize(js);
  if (e->ndim > TSR_MAX_DIMS)
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': rank %d exceeds the %d dims a tensor can have",
                     path, name, e->ndim, TSR_MAX_DIMS);
  /* Overflow of the element count is caught by comparing against the byte range, which is
   * bounded by the file size: stop multiplying once the product cannot fit. */
  uint64_t numel = 1;
  bool huge = false;
  int d = 0;
  for (const cJSON *x = js->child; x; x = x->next, d++) {
    uint64_t v;
    if (!json_uint(x, &v))
      return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': shape entry %d is not a non-negative integer",
                       path, name, d);
    e->shape[d] = (int64_t)v;
    if (v != 0 && numel > UINT64_MAX / 16 / v) huge = true;
    numel *= v;
  }
  if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
      !json_uint(cJSON_GetArrayItem(jo, 0), &e->begin) ||
      !json_uint(cJSON_GetArrayItem(jo, 1), &e->end))
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s': \"data_offsets\" must be [begin, end], two "
                     "non-negative integers",
                     path, name);
  if (e->end < e->begin)
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                     path, name, (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end > st->data_len)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s': data_offsets [%llu, %llu] reach past the end "
                     "of the %llu-byte data buffer: the file is truncated or its header is wrong",
                     path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)st->data_len);
  uint64_t need = numel * tsr_st_dtypes[e->dtype].size;
  if (huge || e->end - e->begin != need) {
    char buf[160];
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but "
                     "%s %s needs %s%llu",
                     path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)(e->end - e->begin), jd->valuestring,
                     tsr_shape_str(e->ndim, e->shape, buf, sizeof buf), huge ? "more than " : "",
                     huge ? (unsigned long long)UINT64_MAX / 16 : (unsigned long long)need);
  }
  e->name = dup_str(name);
  if (!e->name) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory reading the header", path);
  return TSR_OK;
}

/* Names are unique, and the tensors tile the data buffer exactly: no overlap, no stray bytes
 * (which the reference implementation also rejects, so that a file has one reading). */
static tsr_status check_layout(tsr_safetensors_t *st) {
  st_entry **order = malloc(((size_t)st->n + 1) * sizeof *order);
  if (!order) return TSR_ERROR(TSR_ENOMEM, "%s: out of memory checking the header", st->path);
  for (int i = 0; i < st->n; i++) st->by_name[i] = order[i] = &st->entries[i];
  qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_entry_name);
  qsort(order, (size_t)st->n, sizeof *order, cmp_entry_offset);
  tsr_status s = TSR_OK;
  for (int i = 1; i < st->n && s == TSR_OK; i++)
    if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
      s = TSR_ERROR(TSR_EINVAL, "%s: tensor '%s' appears twice in the header", st->path,
                    st->by_name[i]->name);
  uint64_t pos = 0;
  const st_entry *prev = NULL;
  for (int i = 0; i < st->n && s == TSR_OK; i++) {
    const st_entry *e = order[i];
    if (e->begin == e->end) continue; /* an empty tensor owns no bytes */
    if (e->begin < pos)
      s = TSR_ERROR(TSR_EINVAL,
                    "%s: tensor '%s' (bytes [%llu, %llu)) overlaps tensor '%s' "
                    "(bytes up to %llu)",
                    st->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                    prev->name, (unsigned long long)pos);
    else if (e->begin > pos)
      s = TSR_ERROR(TSR_EINVAL,
                    "%s: bytes [%llu, %llu) of the data buffer belong to no tensor "
                    "(the next is '%s'); tensors must be packed back to back",
                    st->path, (unsigned long long)pos, (unsigned long long)e->begin, e->name);
    pos = e->end;
    prev = e;
  }
  if (s == TSR_OK && pos != st->data_len)
    s = TSR_ERROR(TSR_EINVAL, "%s: %llu bytes after the last tensor belong to no tensor", st->path,
                  (unsigned long long)(st->data_len - pos));
  free(order);
  return s;
}

static tsr_status parse_header(tsr_safetensors_t *st, const char *hdr, size_t len) {
  const char *end = NULL;
  pthread_mutex_lock(&json_lock);
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, len, &end, 0);
  pthread_mutex_unlock(&json_lock);
  tsr_status s = TSR_OK;
  if (!root) {
    size_t at = end && end >= hdr && end <= hdr + len ? (size_t)(end - hdr) : 0;
    return TSR_ERROR(TSR_EINVAL,
                     "%s: the header is not valid JSON (error near byte %zu of %zu "
                     "header bytes)",
                     st->path, at, len);
  }
  for (const char *p = end; p < hdr + len && s == TSR_OK; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
      s = TSR_ERROR(TSR_EINVAL, "%s: unexpected bytes after the header's JSON object at byte %zu",
                    st->path, (size_t)(p - hdr));
  if (s == TSR_OK && !cJSON_IsObject(root))
    s = TSR_ERROR(TSR_EINVAL, "%s: the header is JSON but not an object of tensors", st->path);
  if (s != TSR_OK) goto cleanup;
  int count = 0;
  for (const cJSON *j = root->child; j; j = j->next)
    if (strcmp(j->string, "__metadata__") != 0) count++;
  st->entries = calloc((size_t)count + 1, sizeof *st->entries);
  st->by_name = calloc((size_t)count + 1, sizeof *st->by_name);
  if (!st->entries || !st->by_name) {
    s = TSR_ERROR(TSR_ENOMEM, "%s: out of memory reading the header", st->path);
    goto cleanup;
  }
  bool have_meta = false;
  for (const cJSON *j = root->child; j; j = j->next) {
    if (strcmp(j->string, "__metadata__") == 0) {
      if (have_meta) {
        s = TSR_ERROR(TSR_EINVAL, "%s: \"__metadata__\" appears twice", st->path);
        goto cleanup;
      }
      have_meta = true;
      TSR_CHECK_GOTO(parse_metadata(st, j), s);
      continue;
    }
    TSR_CHECK_GOTO(parse_entry(st, j, &st->entries[st->n]), s);
    st->n++;
  }
  TSR_CHECK_GOTO(check_layout(st), s);
cleanup:
  cJSON_Delete(root);
  return s;
}

tsr_status tsr_safetensors_open(const char *path, tsr_safetensors_t **out) {
  *out = NULL;
  if (!tsr_st_host_is_little_endian())
    return TSR_ERROR(TSR_ENOTSUP, "%s: safetensors data is little-endian and this host is not",
                     path);
  tsr_status s = TSR_OK;
  tsr_safetensors_t *st = calloc(1, sizeof *st);
  if (!st || !(st->path = dup_str(path))) {
    free(st);
    return TSR_ERROR(TSR_ENOMEM, "%s: out of memory opening the file", path);
  }
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    s = TSR_ERROR(TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto cleanup;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    s = TSR_ERROR(TSR_EIO, "%s: cannot stat: %s", path, strerror(errno));
    goto cleanup;
  }
  if (!S_ISREG(sb.st_mode)) {
    s = TSR_ERROR(TSR_EIO, "%s: not a regular file (%s); give a safetensors file", path,
                  S_ISDIR(sb.st_mode)    ? "a directory"
                  : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                         : "a device or socket");
    goto cleanup;
  }
  uint64_t size = (uint64_t)sb.st_size;
  if (size < 8) {
    s = TSR_ERROR(TSR_EINVAL,
                  "%s: truncated: %llu bytes, but a safetensors file starts with an "
                  "8-byte header length",
                  path, (unsigned long long)size);
    goto cleanup;
  }
  st->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (st->map == MAP_FAILED) {
    st->map = NULL;
    s = TSR_ERROR(TSR_EIO, "%s: cannot map %llu bytes: %s", path, (unsigned long long)size,
                  strerror(errno));
    goto cleanup;
  }
  st->map_len = (size_t)size;
  const unsigned char *b = st->map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
  if (hlen > size - 8) {
    s = TSR_ERROR(TSR_EINVAL,
                  "%s: truncated or not safetensors: the header length is %llu bytes "
                  "but only %llu bytes follow it",
                  path, (unsigned long long)hlen, (unsigned long long)(size - 8));
    goto cleanup;
  }
  if (hlen < 2 || hlen > ST_MAX_HEADER) {
    s = TSR_ERROR(TSR_EINVAL,
                  "%s: header length %llu is not plausible (2 .. %u bytes): not a "
                  "safetensors file",
                  path, (unsigned long long)hlen, ST_MAX_HEADER);
    goto cleanup;
  }
  st->data = b + 8 + hlen;
  st->data_len = size - 8 - hlen;
  TSR_CHECK_GOTO(parse_header(st, (const char *)b + 8, (size_t)hlen), s);
  *out = st;
  st = NULL;
cleanup:
  if (fd >= 0) close(fd);
  tsr_safetensors_close(st);
  return s;
}

const char *tsr_safetensors_path(const tsr_safetensors_t *st) {
  return st->path;
}

int tsr_safetensors_count(const tsr_safetensors_t *st) {
  return st->n;
}

const char *tsr_safetensors_name(const tsr_safetensors_t *st, int i) {
  return i >= 0 && i < st->n ? st->entries[i].name : NULL;
}

static const st_entry *find(const tsr_safetensors_t *st, const char *name) {
  st_entry key = {.name = (char *)name}, *pkey = &key;
  st_entry **hit = bsearch(&pkey, st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_entry_name);
  return hit ? *hit : NULL;
}

static tsr_status find_or_fail(const tsr_safetensors_t *st, const char *name, const st_entry **e) {
  *e = find(st, name);
  if (!*e) return TSR_ERROR(TSR_EINVAL, "no tensor '%s' in %s", name, st->path);
  return TSR_OK;
}

bool tsr_safetensors_has(const tsr_safetensors_t *st, const char *name) {
  return find(st, name) != NULL;
}

const char *tsr_safetensors_dtype_str(const tsr_safetensors_t *st, const char *name) {
  const st_entry *e = find(st, name);
  return e ? tsr_st_dtypes[e->dtype].name : NULL;
}

static tsr_status tensor_dtype(const tsr_safetensors_t *st, const st_entry *e, tsr_dtype *dt) {
  if (tsr_st_dtypes[e->dtype].tsr < 0)
    return TSR_ERROR(TSR_ENOTSUP,
                     "%s: tensor '%s' has dtype %s, which Tessera cannot load as a "
                     "tensor (F32, BF16, F16, I32, I64 only)",
                     st->path, e->name, tsr_st_dtypes[e->dtype].name);
  *dt = (tsr_dtype)tsr_st_dtypes[e->dtype].tsr;
  return TSR_OK;
}

tsr_status tsr_safetensors_info(const tsr_safetensors_t *st, const char *name, tsr_dtype *dt,
                                int *ndim, int64_t *shape) {
  const st_entry *e;
  TSR_CHECK(find_or_fail(st, name, &e));
  if (ndim) *ndim = e->ndim;
  if (shape) memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
  return dt ? tensor_dtype(st, e, dt) : TSR_OK;
}

static bool is_float(tsr_dtype dt) {
  return dt == TSR_F32 || dt == TSR_BF16 || dt == TSR_F16;
}

static float load_float(const unsigned char *p, tsr_dtype dt) {
  if (dt == TSR_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return dt == TSR_BF16 ? tsr_bf16_to_f32(h) : tsr_f16_to_f32(h);
}

static void store_float(unsigned char *p, tsr_dtype dt, float f) {
  if (dt == TSR_F32) {
    memcpy(p, &f, 4);
    return;
  }
  uint16_t h = dt == TSR_BF16 ? tsr_f32_to_bf16(f) : tsr_f32_to_f16(f);
  memcpy(p, &h, 2);
}

/* Converts `n` elements of file data into contiguous memory. Only I64 -> I32 can fail. */
static tsr_status convert(const tsr_safetensors_t *st, const st_entry *e, tsr_dtype from,
                          unsigned char *dst, tsr_dtype to, int64_t n) {
  const unsigned char *src = st->data + e->begin;
  if (from == to) {
    if (n) memcpy(dst, src, (size_t)(e->end - e->begin));
    return TSR_OK;
  }
  size_t fs = tsr_dtype_size(from), ts = tsr_dtype_size(to);
  for (int64_t i = 0; i < n; i++) {
    const unsigned char *p = src + (size_t)i * fs;
    unsigned char *q = dst + (size_t)i * ts;
    if (is_float(from)) {
      store_float(q, to, load_float(p, from));
    } else if (from == TSR_I32) {
      int32_t v;
      memcpy(&v, p, 4);
      int64_t w = v;
      memcpy(q, &w, 8);
    } else {
      int64_t v;
      memcpy(&v, p, 8);
      if (v < INT32_MIN || v > INT32_MAX)
        return TSR_ERROR(TSR_EINVAL,
                         "%s: tensor '%s': element %lld is %lld, which does not fit "
                         "in i32",
                         st->path, e->name, (long long)i, (long long)v);
      int32_t w = (int32_t)v;
      memcpy(q, &w, 4);
    }
  }
  return TSR_OK;
}

static tsr_status check_convertible(const tsr_safetensors_t *st, const st_entry *e, tsr_dtype from,
                                    tsr_dtype to) {
  bool ok = from == to || (is_float(from) && is_float(to)) || (!is_float(from) && !is_float(to));
  if (!ok)
    return TSR_ERROR(TSR_EINVAL,
                     "%s: tensor '%s' is %s and cannot be read as %s (floats convert "
                     "among f32/bf16/f16, integers between i32/i64)",
                     st->path, e->name, tsr_dtype_name(from), tsr_dtype_name(to));
  return TSR_OK;
}

tsr_status tsr_safetensors_read_as(const tsr_safetensors_t *st, const char *name, tsr_dtype dt,
                                   tsr_tensor **out) {
  *out = NULL;
  const st_entry *e;
  tsr_dtype from = TSR_F32;
  TSR_CHECK(find_or_fail(st, name, &e));
  TSR_CHECK(tensor_dtype(st, e, &from));
  if ((unsigned)dt >= TSR_DTYPE_COUNT)
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s': invalid target dtype %d", st->path, name,
                     (int)dt);
  TSR_CHECK(check_convertible(st, e, from, dt));
  tsr_tensor *t = NULL;
  tsr_status s = tsr_tensor_new(NULL, dt, e->ndim, e->shape, &t);
  if (s != TSR_OK) return tsr_error_prefix(s, "%s: tensor '%s'", st->path, name);
  s = convert(st, e, from, tsr_tensor_data(t), dt, tsr_tensor_numel(t));
  if (s != TSR_OK) {
    tsr_tensor_free(t);
    return s;
  }
  *out = t;
  return TSR_OK;
}

tsr_status tsr_safetensors_read(const tsr_safetensors_t *st, const char *name, tsr_tensor **out) {
  *out = NULL;
  const st_entry *e;
  tsr_dtype dt = TSR_F32;
  TSR_CHECK(find_or_fail(st, name, &e));
  TSR_CHECK(tensor_dtype(st, e, &dt));
  return tsr_safetensors_read_as(st, name, dt, out);
}

tsr_status tsr_safetensors_check_into(const tsr_safetensors_t *st, const char *name,
                                      const tsr_tensor *dst, bool conv) {
  const st_entry *e;
  tsr_dtype from = TSR_F32;
  TSR_CHECK(find_or_fail(st, name, &e));
  TSR_CHECK(tensor_dtype(st, e, &from));
  bool same = e->ndim == dst->ndim;
  for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == dst->shape[d];
  if (!same) {
    char a[160], b[160];
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s' has shape %s, expected %s", st->path, name,
                     tsr_shape_str(e->ndim, e->shape, a, sizeof a),
                     tsr_shape_str(dst->ndim, dst->shape, b, sizeof b));
  }
  if (from != dst->dtype && !conv)
    return TSR_ERROR(TSR_EINVAL, "%s: tensor '%s' is %s, expected %s (read_as converts)", st->path,
                     name, tsr_dtype_name(from), tsr_dtype_name(dst->dtype));
  TSR_CHECK(check_convertible(st, e, from, dst->dtype));
  return TSR_OK;
}

tsr_status tsr_safetensors_check_finite(const tsr_safetensors_t *st, const char *name) {
  const st_entry *e;
  tsr_dtype dt = TSR_F32;
  TSR_CHECK(find_or_fail(st, name, &e));
  TSR_CHECK(tensor_dtype(st, e, &dt));
  if (!is_float(dt)) return TSR_OK;
  size_t es = tsr_dtype_size(dt);
  uint64_t n = (e->end - e->begin) / es;
  const unsigned char *p = st->data + e->begin;
  for (uint64_t i = 0; i < n; i++) {
    /* all exponent bits set: Inf or NaN, in each of the three formats */
    bool bad;
    if (dt == TSR_F32) {
      uint32_t u;
      memcpy(&u, p + i * 4, 4);
      bad = (u & 0x7f800000u) == 0x7f800000u;
    } else {
      uint16_t u;
      memcpy(&u, p + i * 2, 2);
      bad = dt == TSR_BF16 ? (u & 0x7f80u) == 0x7f80u : (u & 0x7c00u) == 0x7c00u;
    }
    if (bad)
      return TSR_ERROR(TSR_EINVAL,
                       "%s: tensor '%s' holds %s at element %llu: a checkpoint must be finite "
                       "(it was saved from a diverged run or is damaged); load an earlier one",
                       st->path, name, isnan(load_float(p + i * es, dt)) ? "NaN" : "Inf",
                       (unsigned long long)i);
  }
  return TSR_OK;
}

tsr_status tsr_safetensors_copy_into(const tsr_safetensors_t *st, const char *name, tsr_tensor *dst,
                                     bool conv) {
  TSR_CHECK(tsr_safetensors_check_into(st, name, dst, conv));
  const st_entry *e = find(st, name);
  tsr_dtype from = (tsr_dtype)tsr_st_dtypes[e->dtype].tsr;
  if (tsr_tensor_is_contiguous(dst) && tsr_tensor_device(dst).kind == TSR_DEVICE_CPU)
    return convert(st, e, from, tsr_tensor_data(dst), dst->dtype, tsr_tensor_numel(dst));
  tsr_tensor *tmp = NULL; /* a strided or device destination is filled from a host copy */
  TSR_CHECK(tsr_safetensors_read_as(st, name, dst->dtype, &tmp));
  tsr_status s = tsr_tensor_copy(dst, tmp);
  tsr_tensor_free(tmp);
  return s;
}

tsr_status tsr_safetensors_read_into(const tsr_safetensors_t *st, const char *name,
                                     tsr_tensor *dst) {
  return tsr_safetensors_copy_into(st, name, dst, false);
}

tsr_status tsr_safetensors_bytes(const tsr_safetensors_t *st, const char *name, const void **data,
                                 size_t *nbytes) {
  const st_entry *e;
  TSR_CHECK(find_or_fail(st, name, &e));
  *data = st->data + e->begin;
  *nbytes = (size_t)(e->end - e->begin);
  return TSR_OK;
}

const char *tsr_safetensors_meta(const tsr_safetensors_t *st, const char *key) {
  for (int i = 0; i < st->nmeta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
  return NULL;
}

int tsr_safetensors_meta_count(const tsr_safetensors_t *st) {
  return st->nmeta;
}

const char *tsr_safetensors_meta_key(const tsr_safetensors_t *st, int i) {
  return i >= 0 && i < st->nmeta ? st->meta_keys[i] : NULL;
}
