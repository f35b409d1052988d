/* Dense tensors: dtype, up to TSR_MAX_DIMS dims, row-major strides, reference-counted storage.
 *
 * A tsr_tensor is a view: shape, strides and offset over a tsr_storage that may be shared with
 * other views. Views are made where they cost nothing (narrow, permute, reshape of contiguous
 * data); everything else is an explicit copy. Strides and offsets are in elements, not bytes.
 */
#ifndef TESSERA_TENSOR_H
#define TESSERA_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_MAX_DIMS 8

typedef enum tsr_dtype {
  TSR_F32 = 0,
  TSR_BF16 = 1,
  TSR_F16 = 2,
  TSR_I32 = 3,
  TSR_I64 = 4,
  TSR_DTYPE_COUNT
} tsr_dtype;

TSR_API size_t tsr_dtype_size(tsr_dtype dt);
TSR_API const char *
tsr_dtype_name(tsr_dtype dt); /* "f32", "bf16", ... ; "?" for an invalid value */

/* Scalar conversions. bf16 and f16 are stored as uint16_t bit patterns; the conversions from
 * f32 round to nearest even, as PyTorch does. */
TSR_API float tsr_bf16_to_f32(uint16_t h);
TSR_API uint16_t tsr_f32_to_bf16(float f);
TSR_API float tsr_f16_to_f32(uint16_t h);
TSR_API uint16_t tsr_f32_to_f16(float f);

/* TSR_DEVICE_EMU is a device emulated on the CPU for testing device code without a GPU: its
 * memory is host memory behind pointers the host cannot dereference (a touch from host code
 * faults at once), and its kernels are the CPU kernels. A run on it computes exactly what the same
 * run on the CPU computes, so any difference, or a crash, is a place where code reads or writes
 * device memory from the host. */
typedef enum tsr_device_kind {
  TSR_DEVICE_CPU = 0,
  TSR_DEVICE_CUDA = 1,
  TSR_DEVICE_EMU = 2
} tsr_device_kind;

TSR_API const char *tsr_device_name(tsr_device_kind kind); /* "cpu", "cuda", "emu"; "?" otherwise */

typedef struct tsr_device {
  tsr_device_kind kind;
  int index; /* device ordinal; 0 for the CPU */
} tsr_device;

/* Allocator interface. A backend (CPU, CUDA caching allocator) fills `alloc`/`free` and keeps
 * its state behind `context`. Counters are kept by the core for every allocator. */
typedef struct tsr_allocator {
  void *(*alloc)(void *context, size_t bytes); /* NULL on failure; alignment >= 64 */
  void (*free)(void *context, void *ptr, size_t bytes);
  void *context;
  tsr_device device;
  /* Bookkeeping done by tsr_allocator_alloc/free, read by tsr_allocator_stats. */
  size_t bytes_in_use;
  size_t peak_bytes;
} tsr_allocator;

/* Initialises `a` as a CPU allocator (aligned malloc). Each rank should own one, so that its
 * counters measure that rank's memory. */
TSR_API void tsr_allocator_init_cpu(tsr_allocator *a);
TSR_API void *tsr_allocator_alloc(tsr_allocator *a, size_t bytes);
TSR_API void tsr_allocator_free(tsr_allocator *a, void *ptr, size_t bytes);
TSR_API void tsr_allocator_reset_peak(tsr_allocator *a);

/* Every CPU allocator draws on one host buffer pool per process, which keeps freed buffers by
 * size and hands them out again, within the most bytes ever handed out at once (ABI 1.3). Its
 * counters since the process started, for tests and benchmarks: a steady-state training step
 * makes no system allocation. */
typedef struct tsr_host_pool_stats {
  int64_t system_allocations; /* buffers asked of the system (malloc) */
  int64_t reuses;             /* buffers handed out again from the pool */
  int64_t evictions;          /* kept buffers given back to the system to stay within the bound */
  size_t kept_bytes;          /* bytes kept for reuse now */
  size_t live_bytes;          /* bytes handed out now */
  size_t bound_bytes;         /* the most bytes handed out at once: kept + live never exceeds it */
} tsr_host_pool_stats;

TSR_API void tsr_host_pool_read(tsr_host_pool_stats *out);

/* Shared, reference-counted buffer. Opaque to users; tensors point at it. */
typedef struct tsr_storage tsr_storage;

typedef struct tsr_tensor {
  tsr_dtype dtype;
  int ndim;                     /* 0 ..= TSR_MAX_DIMS; 0 is a scalar */
  int64_t shape[TSR_MAX_DIMS];  /* (ndim) */
  int64_t stride[TSR_MAX_DIMS]; /* (ndim) elements between neighbours along each dim */
  int64_t offset;               /* elements from the start of the storage */
  tsr_storage *storage;         /* shared with other views; never NULL */
} tsr_tensor;

/* A new zero-filled contiguous tensor. `alloc` may be NULL for the process's CPU allocator. */
TSR_API tsr_status tsr_tensor_new(tsr_allocator *alloc, tsr_dtype dt, int ndim,
                                  const int64_t *shape, tsr_tensor **out);
/* A new contiguous tensor holding a copy of `src` (any strides). */
TSR_API tsr_status tsr_tensor_clone(const tsr_tensor *src, tsr_tensor **out);
/* Releases the view and, with the last view, the storage. NULL is a no-op. */
TSR_API void tsr_tensor_free(tsr_tensor *t);

TSR_API int64_t tsr_tensor_numel(const tsr_tensor *t);
TSR_API size_t tsr_tensor_nbytes(const tsr_tensor *t); /* numel * dtype size */
TSR_API bool tsr_tensor_is_contiguous(const tsr_tensor *t);
/* Pointer to the first element of the view (storage base + offset). */
TSR_API void *tsr_tensor_data(const tsr_tensor *t);
TSR_API tsr_device tsr_tensor_device(const tsr_tensor *t);
/* "[2, 3, 4]" into buf (always terminated). Returns buf. */
TSR_API const char *tsr_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

/* Views sharing storage. */
TSR_API tsr_status tsr_tensor_narrow(const tsr_tensor *t, int dim, int64_t start, int64_t len,
                                     tsr_tensor **out);
TSR_API tsr_status tsr_tensor_permute(const tsr_tensor *t, const int *perm, tsr_tensor **out);
/* A view with a new shape; `t` must be contiguous (else TSR_EINVAL: clone first). One entry of
 * `shape` may be -1 and is inferred. */
TSR_API tsr_status tsr_tensor_reshape(const tsr_tensor *t, int ndim, const int64_t *shape,
                                      tsr_tensor **out);

/* Element-wise copy between tensors of the same shape and dtype, any strides, on any devices
 * (host to device, device to host, within a device). */
TSR_API tsr_status tsr_tensor_copy(tsr_tensor *dst, const tsr_tensor *src);
/* A new contiguous copy of `src` in `alloc`'s memory (NULL: the process's CPU allocator), on
 * whatever device either lives: how data enters and leaves a device. */
TSR_API tsr_status tsr_tensor_to(const tsr_tensor *src, tsr_allocator *alloc, tsr_tensor **out);
/* A contiguous host copy of `src` converted to `dt` (through f64 for integers, f32 for floats). */
TSR_API tsr_status tsr_tensor_cast(const tsr_tensor *src, tsr_dtype dt, tsr_tensor **out);
/* Concatenates `n` tensors along `dim` into a new contiguous tensor. */
TSR_API tsr_status tsr_tensor_cat(tsr_tensor *const *parts, int n, int dim, tsr_tensor **out);
TSR_API void tsr_tensor_zero(tsr_tensor *t);
/* x *= s for a contiguous f32 tensor, on its device. */
TSR_API tsr_status tsr_tensor_scale(tsr_tensor *t, float s);

/* TSR_OK when tensors can live on `dev` in this process; otherwise TSR_ENOTSUP saying why (this
 * build has no CUDA, the CUDA library cannot be opened, the machine has no device). */
TSR_API tsr_status tsr_device_check(tsr_device dev);

/* Element access for tests and I/O, with the value widened to double. `idx` has ndim entries.
 * On a device tensor each call is one transfer: fine for tests, not for loops over data. */
TSR_API double tsr_tensor_get(const tsr_tensor *t, const int64_t *idx);
TSR_API void tsr_tensor_set(tsr_tensor *t, const int64_t *idx, double v);
/* Fills with (flat index * scale + bias), cast to the dtype: exact integer test data. */
TSR_API void tsr_tensor_fill_arange(tsr_tensor *t, double scale, double bias);
/* True when shapes, dtypes and every element are equal (NaNs are unequal). */
TSR_API bool tsr_tensor_equal(const tsr_tensor *a, const tsr_tensor *b);

#ifdef __cplusplus
}
#endif
#endif
