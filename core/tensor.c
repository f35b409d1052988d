/* Dense tensors over reference-counted storage. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_pool.h"
#include "tensor_impl.h"
#include "kernel_table.h"
#include "tessera/tensor.h"

struct tsr_storage {
  atomic_int refs;
  void *data;
  size_t bytes;
  tsr_allocator *alloc; /* the allocator that made `data`, for free and its counters */
};

/* ---- dtypes ---- */

size_t tsr_dtype_size(tsr_dtype dt) {
  switch (dt) {
    case TSR_F32:
      return 4;
    case TSR_BF16:
      return 2;
    case TSR_F16:
      return 2;
    case TSR_I32:
      return 4;
    case TSR_I64:
      return 8;
    default:
      return 0;
  }
}

const char *tsr_dtype_name(tsr_dtype dt) {
  static const char *const names[] = {"f32", "bf16", "f16", "i32", "i64"};
  return (unsigned)dt < TSR_DTYPE_COUNT ? names[dt] : "?";
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float tsr_bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

uint16_t tsr_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float tsr_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    /* zero or subnormal: value = man * 2^-24 exactly representable in f32 */
    float v = ldexpf((float)man, -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t tsr_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;
  if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: infinity */
  if (abs < 0x38800000u) {
    /* below the smallest normal: round man * 2^-24 to an integer, nearest even */
    float v = bits_f32(abs);
    return sign | (uint16_t)lrintf(ldexpf(v, 24));
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0x7fffu);
}

/* ---- allocators ---- */

/* Host memory comes from the process's buffer pool (host_pool.c), which reuses freed buffers of
 * the same size: a step's activations are made and freed at the same sizes every step. */
static void *cpu_alloc(void *context, size_t bytes) {
  (void)context;
  return tsr_host_pool_alloc(bytes);
}

static void cpu_free(void *context, void *ptr, size_t bytes) {
  (void)context;
  tsr_host_pool_free(ptr, bytes);
}

void tsr_allocator_init_cpu(tsr_allocator *a) {
  memset(a, 0, sizeof *a);
  a->alloc = cpu_alloc;
  a->free = cpu_free;
  a->device.kind = TSR_DEVICE_CPU;
}

void *tsr_allocator_alloc(tsr_allocator *a, size_t bytes) {
  void *p = a->alloc(a->context, bytes);
  if (p) {
    a->bytes_in_use += bytes;
    if (a->bytes_in_use > a->peak_bytes) a->peak_bytes = a->bytes_in_use;
  }
  return p;
}

void tsr_allocator_free(tsr_allocator *a, void *ptr, size_t bytes) {
  if (!ptr) return;
  a->free(a->context, ptr, bytes);
  a->bytes_in_use -= bytes;
}

void tsr_allocator_reset_peak(tsr_allocator *a) {
  a->peak_bytes = a->bytes_in_use;
}

/* Tensors made without an allocator use plain malloc and are not counted. Stateless, so one
 * instance can serve every rank. */
static tsr_allocator untracked_cpu = {cpu_alloc, cpu_free, NULL, {TSR_DEVICE_CPU, 0}, 0, 0};

/* ---- tensors ---- */

static void set_contiguous_strides(tsr_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    t->stride[d] = s;
    s *= t->shape[d];
  }
}

static tsr_status check_shape(int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TSR_MAX_DIMS)
    return TSR_ERROR(TSR_EINVAL, "tensor rank %d out of range 0..%d", ndim, TSR_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0)
      return TSR_ERROR(TSR_EINVAL, "tensor dim %d has negative size %lld", d, (long long)shape[d]);
  return TSR_OK;
}

static tsr_status tensor_make(tsr_allocator *alloc, tsr_dtype dt, int ndim, const int64_t *shape,
                              bool zero, tsr_tensor **out) {
  *out = NULL;
  if ((unsigned)dt >= TSR_DTYPE_COUNT) return TSR_ERROR(TSR_EINVAL, "invalid dtype %d", (int)dt);
  TSR_CHECK(check_shape(ndim, shape));
  if (!alloc) alloc = &untracked_cpu; /* shared by ranks: never touch its counters */
  tsr_tensor *t = calloc(1, sizeof *t);
  tsr_storage *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a tensor header");
  }
  t->dtype = dt;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  set_contiguous_strides(t);
  s->bytes = tsr_tensor_nbytes(t);
  s->alloc = alloc;
  s->data =
      alloc == &untracked_cpu ? cpu_alloc(NULL, s->bytes) : tsr_allocator_alloc(alloc, s->bytes);
  if (!s->data) {
    char buf[128];
    size_t bytes = s->bytes;
    free(t);
    free(s);
    return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a %s tensor of shape %s (%zu bytes)",
                     tsr_dtype_name(dt), tsr_shape_str(ndim, shape, buf, sizeof buf), bytes);
  }
  if (zero && alloc->device.kind == TSR_DEVICE_CPU)
    memset(s->data, 0, s->bytes);
  else if (zero)
    tsr_kernel_table_of_device(alloc->device)->zero(s->data, s->bytes);
  atomic_init(&s->refs, 1);
  t->storage = s;
  *out = t;
  return TSR_OK;
}

tsr_status tsr_tensor_new(tsr_allocator *alloc, tsr_dtype dt, int ndim, const int64_t *shape,
                          tsr_tensor **out) {
  return tensor_make(alloc, dt, ndim, shape, true, out);
}

tsr_status tsr_tensor_new_uninit(tsr_allocator *alloc, tsr_dtype dt, int ndim, const int64_t *shape,
                                 tsr_tensor **out) {
  return tensor_make(alloc, dt, ndim, shape, false, out);
}

static void storage_release(tsr_storage *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1) return;
  if (s->alloc == &untracked_cpu)
    cpu_free(NULL, s->data, s->bytes);
  else
    tsr_allocator_free(s->alloc, s->data, s->bytes);
  free(s);
}

void tsr_tensor_free(tsr_tensor *t) {
  if (!t) return;
  storage_release(t->storage);
  free(t);
}

static tsr_status view_of(const tsr_tensor *t, tsr_tensor **out) {
  tsr_tensor *v = malloc(sizeof *v);
  if (!v) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a tensor view");
  *v = *t;
  atomic_fetch_add(&t->storage->refs, 1);
  *out = v;
  return TSR_OK;
}

bool tsr_tensor_is_shared(const tsr_tensor *t) {
  return atomic_load(&t->storage->refs) > 1;
}

int64_t tsr_tensor_numel(const tsr_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

size_t tsr_tensor_nbytes(const tsr_tensor *t) {
  return (size_t)tsr_tensor_numel(t) * tsr_dtype_size(t->dtype);
}

bool tsr_tensor_is_contiguous(const tsr_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return false;
    s *= t->shape[d];
  }
  return true;
}

void *tsr_tensor_data(const tsr_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)tsr_dtype_size(t->dtype);
}

tsr_device tsr_tensor_device(const tsr_tensor *t) {
  return t->storage->alloc->device;
}

const char *tsr_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = 0;
  n += (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (n < len) snprintf(buf + n, len - n, "]");
  return buf;
}

tsr_status tsr_tensor_narrow(const tsr_tensor *t, int dim, int64_t start, int64_t len,
                             tsr_tensor **out) {
  *out = NULL;
  if (dim < 0 || dim >= t->ndim)
    return TSR_ERROR(TSR_EINVAL, "narrow: dim %d out of range for a rank-%d tensor", dim, t->ndim);
  if (start < 0 || len < 0 || start + len > t->shape[dim])
    return TSR_ERROR(TSR_EINVAL, "narrow: [%lld, %lld) out of range for dim %d of size %lld",
                     (long long)start, (long long)(start + len), dim, (long long)t->shape[dim]);
  TSR_CHECK(view_of(t, out));
  (*out)->shape[dim] = len;
  (*out)->offset += start * t->stride[dim];
  return TSR_OK;
}

tsr_status tsr_tensor_permute(const tsr_tensor *t, const int *perm, tsr_tensor **out) {
  *out = NULL;
  unsigned seen = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (perm[d] < 0 || perm[d] >= t->ndim || (seen & (1u << perm[d])))
      return TSR_ERROR(TSR_EINVAL, "permute: entry %d (%d) is not a permutation of 0..%d", d,
                       perm[d], t->ndim - 1);
    seen |= 1u << perm[d];
  }
  TSR_CHECK(view_of(t, out));
  for (int d = 0; d < t->ndim; d++) {
    (*out)->shape[d] = t->shape[perm[d]];
    (*out)->stride[d] = t->stride[perm[d]];
  }
  return TSR_OK;
}

tsr_status tsr_tensor_reshape(const tsr_tensor *t, int ndim, const int64_t *shape,
                              tsr_tensor **out) {
  *out = NULL;
  char a[128], b[128];
  if (!tsr_tensor_is_contiguous(t))
    return TSR_ERROR(TSR_EINVAL, "reshape of a non-contiguous tensor %s: clone it first",
                     tsr_shape_str(t->ndim, t->shape, a, sizeof a));
  if (ndim < 0 || ndim > TSR_MAX_DIMS)
    return TSR_ERROR(TSR_EINVAL, "reshape: rank %d out of range 0..%d", ndim, TSR_MAX_DIMS);
  int64_t s[TSR_MAX_DIMS], known = 1;
  int infer = -1;
  for (int d = 0; d < ndim; d++) {
    s[d] = shape[d];
    if (s[d] == -1) {
      if (infer >= 0) return TSR_ERROR(TSR_EINVAL, "reshape: more than one -1 in the shape");
      infer = d;
    } else {
      known *= s[d];
    }
  }
  int64_t numel = tsr_tensor_numel(t);
  if (infer >= 0 && known > 0 && numel % known == 0) s[infer] = numel / known;
  int64_t total = 1;
  for (int d = 0; d < ndim; d++) total *= s[d];
  if (total != numel || (infer >= 0 && known == 0))
    return TSR_ERROR(TSR_EINVAL, "reshape: cannot view %s (%lld elements) as %s",
                     tsr_shape_str(t->ndim, t->shape, a, sizeof a), (long long)numel,
                     tsr_shape_str(ndim, shape, b, sizeof b));
  TSR_CHECK(view_of(t, out));
  (*out)->ndim = ndim;
  for (int d = 0; d < ndim; d++) (*out)->shape[d] = s[d];
  set_contiguous_strides(*out);
  return TSR_OK;
}

/* Advances a row-major index odometer over `shape`. */
static void next_index(int ndim, const int64_t *shape, int64_t *idx) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

static bool on_host(const tsr_tensor *t) {
  return tsr_tensor_device(t).kind == TSR_DEVICE_CPU;
}

tsr_status tsr_tensor_copy(tsr_tensor *dst, const tsr_tensor *src) {
  char a[128], b[128];
  if (dst->dtype != src->dtype)
    return TSR_ERROR(TSR_EINVAL, "copy: dtype %s into %s; use tsr_tensor_cast",
                     tsr_dtype_name(src->dtype), tsr_dtype_name(dst->dtype));
  bool same = dst->ndim == src->ndim;
  for (int d = 0; same && d < dst->ndim; d++) same = dst->shape[d] == src->shape[d];
  if (!same)
    return TSR_ERROR(TSR_EINVAL, "copy: shape %s into %s",
                     tsr_shape_str(src->ndim, src->shape, a, sizeof a),
                     tsr_shape_str(dst->ndim, dst->shape, b, sizeof b));
  size_t es = tsr_dtype_size(dst->dtype);
  if (tsr_tensor_device(dst).kind == tsr_tensor_device(src).kind) {
    /* CPU to CPU, or within one device (two virtual ranks of one GPU included). */
    const tsr_kernel_table *k = tsr_kernel_table_of(dst);
    if (tsr_tensor_is_contiguous(dst) && tsr_tensor_is_contiguous(src))
      k->copy_d2d(tsr_tensor_data(dst), tsr_tensor_data(src), tsr_tensor_nbytes(dst));
    else
      k->copy_strided(tsr_tensor_data(dst), dst->stride, tsr_tensor_data(src), src->stride,
                      dst->shape, dst->ndim, es);
    return TSR_OK;
  }
  /* Across devices the transfer is one contiguous block; a strided side is packed (or unpacked)
   * on its own device first. */
  tsr_status st = TSR_OK;
  tsr_tensor *packed_src = NULL, *packed_dst = NULL;
  if (!tsr_tensor_is_contiguous(src)) TSR_CHECK_GOTO(tsr_tensor_clone(src, &packed_src), st);
  if (!tsr_tensor_is_contiguous(dst)) TSR_CHECK_GOTO(tsr_tensor_clone(dst, &packed_dst), st);
  tsr_memcpy_any(tsr_tensor_data(packed_dst ? packed_dst : dst),
                 tsr_tensor_data(packed_src ? packed_src : src), tsr_tensor_nbytes(dst));
  if (packed_dst) st = tsr_tensor_copy(dst, packed_dst);
cleanup:
  tsr_tensor_free(packed_src);
  tsr_tensor_free(packed_dst);
  return st;
}

tsr_status tsr_tensor_to(const tsr_tensor *src, tsr_allocator *alloc, tsr_tensor **out) {
  TSR_CHECK(tsr_tensor_new(alloc, src->dtype, src->ndim, src->shape, out));
  tsr_status st = tsr_tensor_copy(*out, src);
  if (st != TSR_OK) {
    tsr_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

tsr_status tsr_tensor_scale(tsr_tensor *t, float s) {
  if (t->dtype != TSR_F32 || !tsr_tensor_is_contiguous(t))
    return TSR_ERROR(TSR_EINVAL, "scale: needs a contiguous f32 tensor, got %s",
                     tsr_dtype_name(t->dtype));
  tsr_kernel_table_of(t)->scale(tsr_tensor_data(t), tsr_tensor_numel(t), s);
  return TSR_OK;
}

tsr_status tsr_device_check(tsr_device dev) {
  const tsr_kernel_table *k = NULL;
  return tsr_kernel_table_for(dev, &k);
}

tsr_allocator *tsr_tensor_scratch_allocator(const tsr_tensor *t) {
  return on_host(t) ? NULL : t->storage->alloc;
}

tsr_status tsr_tensor_from_i32(tsr_allocator *alloc, int64_t n, const int32_t *host,
                               tsr_tensor **out) {
  TSR_CHECK(tsr_tensor_new(alloc, TSR_I32, 1, &n, out));
  tsr_memcpy_any(tsr_tensor_data(*out), host, (size_t)n * sizeof *host);
  return TSR_OK;
}

tsr_status tsr_tensor_clone(const tsr_tensor *src, tsr_tensor **out) {
  TSR_CHECK(tsr_tensor_new(src->storage->alloc == &untracked_cpu ? NULL : src->storage->alloc,
                           src->dtype, src->ndim, src->shape, out));
  tsr_status st = tsr_tensor_copy(*out, src);
  if (st != TSR_OK) {
    tsr_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

static void *elem_ptr(const tsr_tensor *t, const int64_t *idx) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
  return (char *)tsr_tensor_data(t) + off * (int64_t)tsr_dtype_size(t->dtype);
}

static double load(const void *p, tsr_dtype dt) {
  switch (dt) {
    case TSR_F32:
      return *(const float *)p;
    case TSR_BF16:
      return tsr_bf16_to_f32(*(const uint16_t *)p);
    case TSR_F16:
      return tsr_f16_to_f32(*(const uint16_t *)p);
    case TSR_I32:
      return *(const int32_t *)p;
    case TSR_I64:
      return (double)*(const int64_t *)p;
    default:
      return 0.0;
  }
}

static void store(void *p, tsr_dtype dt, double v) {
  switch (dt) {
    case TSR_F32:
      *(float *)p = (float)v;
      break;
    case TSR_BF16:
      *(uint16_t *)p = tsr_f32_to_bf16((float)v);
      break;
    case TSR_F16:
      *(uint16_t *)p = tsr_f32_to_f16((float)v);
      break;
    case TSR_I32:
      *(int32_t *)p = (int32_t)v;
      break;
    case TSR_I64:
      *(int64_t *)p = (int64_t)v;
      break;
    default:
      break;
  }
}

double tsr_tensor_get(const tsr_tensor *t, const int64_t *idx) {
  if (on_host(t)) return load(elem_ptr(t, idx), t->dtype);
  char v[8];
  tsr_kernel_table_of(t)->copy_d2h(v, elem_ptr(t, idx), tsr_dtype_size(t->dtype));
  return load(v, t->dtype);
}

void tsr_tensor_set(tsr_tensor *t, const int64_t *idx, double v) {
  if (on_host(t)) {
    store(elem_ptr(t, idx), t->dtype, v);
    return;
  }
  char b[8];
  store(b, t->dtype, v);
  tsr_kernel_table_of(t)->copy_h2d(elem_ptr(t, idx), b, tsr_dtype_size(t->dtype));
}

/* A host tensor holding `t`'s values: `t` itself on the CPU, else a copy in *tmp (freed by the
 * caller). NULL when the copy cannot be made. */
static const tsr_tensor *host_view(const tsr_tensor *t, tsr_tensor **tmp) {
  *tmp = NULL;
  if (on_host(t)) return t;
  return tsr_tensor_to(t, NULL, tmp) == TSR_OK ? *tmp : NULL;
}

void tsr_tensor_zero(tsr_tensor *t) {
  if (tsr_tensor_is_contiguous(t)) {
    tsr_kernel_table_of(t)->zero(tsr_tensor_data(t), tsr_tensor_nbytes(t));
    return;
  }
  if (!on_host(t)) {
    tsr_tensor *z = NULL;
    if (tsr_tensor_new(NULL, t->dtype, t->ndim, t->shape, &z) == TSR_OK) tsr_tensor_copy(t, z);
    tsr_tensor_free(z);
    return;
  }
  int64_t idx[TSR_MAX_DIMS] = {0}, n = tsr_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    tsr_tensor_set(t, idx, 0.0);
    next_index(t->ndim, t->shape, idx);
  }
}

void tsr_tensor_fill_arange(tsr_tensor *t, double scale, double bias) {
  if (!on_host(t)) {
    tsr_tensor *h = NULL;
    if (tsr_tensor_new(NULL, t->dtype, t->ndim, t->shape, &h) == TSR_OK) {
      tsr_tensor_fill_arange(h, scale, bias);
      tsr_tensor_copy(t, h);
    }
    tsr_tensor_free(h);
    return;
  }
  int64_t idx[TSR_MAX_DIMS] = {0}, n = tsr_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    tsr_tensor_set(t, idx, (double)i * scale + bias);
    next_index(t->ndim, t->shape, idx);
  }
}

tsr_status tsr_tensor_cast(const tsr_tensor *src, tsr_dtype dt, tsr_tensor **out) {
  if (!on_host(src)) {
    tsr_tensor *h = NULL;
    TSR_CHECK(tsr_tensor_to(src, NULL, &h));
    tsr_status st = tsr_tensor_cast(h, dt, out);
    tsr_tensor_free(h);
    return st;
  }
  TSR_CHECK(tsr_tensor_new(NULL, dt, src->ndim, src->shape, out));
  int64_t idx[TSR_MAX_DIMS] = {0}, n = tsr_tensor_numel(src);
  size_t es = tsr_dtype_size(dt);
  char *dp = tsr_tensor_data(*out);
  for (int64_t i = 0; i < n; i++) {
    double v = load(elem_ptr(src, idx), src->dtype);
    /* Integers go through int64 so that large i64 values survive an i64 -> i64 cast. */
    if (src->dtype == TSR_I64 && dt == TSR_I64)
      *(int64_t *)(dp + (size_t)i * es) = *(const int64_t *)elem_ptr(src, idx);
    else
      store(dp + (size_t)i * es, dt, v);
    next_index(src->ndim, src->shape, idx);
  }
  return TSR_OK;
}

tsr_status tsr_tensor_cat(tsr_tensor *const *parts, int n, int dim, tsr_tensor **out) {
  *out = NULL;
  char a[128], b[128];
  if (n <= 0) return TSR_ERROR(TSR_EINVAL, "cat of %d tensors", n);
  const tsr_tensor *p0 = parts[0];
  if (dim < 0 || dim >= p0->ndim)
    return TSR_ERROR(TSR_EINVAL, "cat: dim %d out of range for rank %d", dim, p0->ndim);
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, p0->shape, sizeof shape);
  shape[dim] = 0;
  for (int i = 0; i < n; i++) {
    const tsr_tensor *p = parts[i];
    bool ok = p->ndim == p0->ndim && p->dtype == p0->dtype;
    for (int d = 0; ok && d < p->ndim; d++) ok = d == dim || p->shape[d] == p0->shape[d];
    if (!ok)
      return TSR_ERROR(TSR_EINVAL, "cat along dim %d: part %d is %s %s, part 0 is %s %s", dim, i,
                       tsr_dtype_name(p->dtype), tsr_shape_str(p->ndim, p->shape, a, sizeof a),
                       tsr_dtype_name(p0->dtype), tsr_shape_str(p0->ndim, p0->shape, b, sizeof b));
    shape[dim] += p->shape[dim];
  }
  tsr_status st = TSR_OK;
  tsr_tensor *full = NULL, *slot = NULL;
  /* Device parts stay on their device; host parts give an untracked host tensor, as before. */
  tsr_allocator *alloc = on_host(p0) ? NULL : p0->storage->alloc;
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, p0->dtype, p0->ndim, shape, &full), st);
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    TSR_CHECK_GOTO(tsr_tensor_narrow(full, dim, at, parts[i]->shape[dim], &slot), st);
    TSR_CHECK_GOTO(tsr_tensor_copy(slot, parts[i]), st);
    tsr_tensor_free(slot);
    slot = NULL;
    at += parts[i]->shape[dim];
  }
  *out = full;
  return TSR_OK;
cleanup:
  tsr_tensor_free(slot);
  tsr_tensor_free(full);
  return st;
}

bool tsr_tensor_equal(const tsr_tensor *a, const tsr_tensor *b) {
  if (a->ndim != b->ndim || a->dtype != b->dtype) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  if (!on_host(a) || !on_host(b)) {
    tsr_tensor *ta = NULL, *tb = NULL;
    const tsr_tensor *ha = host_view(a, &ta), *hb = host_view(b, &tb);
    bool eq = ha && hb && tsr_tensor_equal(ha, hb);
    tsr_tensor_free(ta);
    tsr_tensor_free(tb);
    return eq;
  }
  int64_t idx[TSR_MAX_DIMS] = {0}, n = tsr_tensor_numel(a);
  size_t es = tsr_dtype_size(a->dtype);
  for (int64_t i = 0; i < n; i++) {
    const void *pa = elem_ptr(a, idx), *pb = elem_ptr(b, idx);
    if (a->dtype == TSR_F32 || a->dtype == TSR_BF16 || a->dtype == TSR_F16) {
      if (!(load(pa, a->dtype) == load(pb, b->dtype))) return false;
    } else if (memcmp(pa, pb, es) != 0) {
      return false;
    }
    next_index(a->ndim, a->shape, idx);
  }
  return true;
}
