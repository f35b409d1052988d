/* The CPU kernel table and the loader of the CUDA one (kernel_table.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_table.h"
#include "tessera/plugin.h"
#include "tessera/rank.h"

#ifndef TSR_CUDA_BUILT
#define TSR_CUDA_BUILT 0
#endif
#ifndef TSR_CUDA_BUILD_LIB
#define TSR_CUDA_BUILD_LIB ""
#endif
#ifndef TSR_CUDA_INSTALL_LIB
#define TSR_CUDA_INSTALL_LIB ""
#endif

/* ---- the CPU's memory entries ---- */

static bool cpu_owns(const void *p) {
  (void)p;
  return false;
}
static tsr_status cpu_allocator_init(tsr_allocator *a, int ordinal) {
  (void)ordinal;
  tsr_allocator_init_cpu(a);
  return TSR_OK;
}
static void cpu_allocator_release(tsr_allocator *a) {
  (void)a;
}
/* Host memory on both sides: the three directions are one memmove. */
static void cpu_copy_h2d(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
}
static void cpu_copy_d2h(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
}
static void cpu_copy_d2d(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(void *dst, size_t bytes) {
  if (bytes) memset(dst, 0, bytes);
}
static tsr_status cpu_sync(void) {
  return TSR_OK;
}

void tsr_copy_strided_host(void *dst, const int64_t *dst_stride, const void *src,
                           const int64_t *src_stride, const int64_t *shape, int ndim,
                           size_t elem_size) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (numel == 0) return;
  if (ndim == 0) {
    memcpy(dst, src, elem_size);
    return;
  }
  /* The innermost dim is a tight loop; the outer dims advance an index odometer. */
  int64_t idx[TSR_MAX_DIMS] = {0};
  int64_t inner = shape[ndim - 1], es = (int64_t)elem_size;
  int64_t ds = dst_stride[ndim - 1] * es, ss = src_stride[ndim - 1] * es;
  for (int64_t done = 0; done < numel; done += inner) {
    int64_t doff = 0, soff = 0;
    for (int d = 0; d < ndim - 1; d++) {
      doff += idx[d] * dst_stride[d];
      soff += idx[d] * src_stride[d];
    }
    char *drow = (char *)dst + doff * es;
    const char *srow = (const char *)src + soff * es;
    if (ds == es && ss == es)
      memcpy(drow, srow, (size_t)(inner * es));
    else
      for (int64_t i = 0; i < inner; i++) memcpy(drow + i * ds, srow + i * ss, elem_size);
    for (int d = ndim - 2; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

void tsr_add_host(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_copy_strided(void *dst, const int64_t *dst_stride, const void *src,
                             const int64_t *src_stride, const int64_t *shape, int ndim,
                             size_t elem_size) {
  tsr_copy_strided_host(dst, dst_stride, src, src_stride, shape, ndim, elem_size);
}
static void cpu_add(float *out, const float *a, const float *b, int64_t n) {
  tsr_add_host(out, a, b, n);
}

/* ---- the CPU table, from the list (tessera/device.h) ----
 * The kernels are the kernels.h functions themselves, so a call through the table computes what
 * a direct call computes. Redeclaring them from the list turns any difference between the list
 * and kernels.h into a compile error ("conflicting types") rather than a silent cast. */

#define CPU_DECLARE(name, kind, ret, params, args) CPU_DECLARE_##kind(name, ret, params)
#define CPU_DECLARE_dev(name, ret, params)         ret tsr_kernel_##name params;
#define CPU_DECLARE_mixed                          CPU_DECLARE_dev
#define CPU_DECLARE_host                           CPU_DECLARE_dev
#define CPU_DECLARE_mem(name, ret, params)         static ret cpu_##name params;
TSR_KERNEL_LIST(CPU_DECLARE)
TSR_KERNEL_LOOKUP_LIST(CPU_DECLARE)

#define CPU_FN_dev(name)                          tsr_kernel_##name
#define CPU_FN_mixed(name)                        tsr_kernel_##name
#define CPU_FN_host(name)                         tsr_kernel_##name
#define CPU_FN_mem(name)                          cpu_##name
#define CPU_MEMBER(name, kind, ret, params, args) .name = CPU_FN_##kind(name),
#define CPU_NAMED(name, kind, ret, params, args)  {#name, (tsr_kernel_fn)CPU_FN_##kind(name)},

static const tsr_kernel_table cpu_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "cpu",
    .device = TSR_DEVICE_CPU,
    TSR_KERNEL_LIST(CPU_MEMBER) /* each entry's CPU_FN_<kind> */
};

static const tsr_kernel_named cpu_named[] = {
    TSR_KERNEL_LOOKUP_LIST(CPU_NAMED) /* then the end: */ {NULL, NULL},
};

const tsr_kernel_table *tsr_kernel_table_cpu(void) {
  return &cpu_table;
}

bool tsr_kernel_table_cuda_built(void) {
  return TSR_CUDA_BUILT;
}

/* Process-wide on purpose: the library and the device are shared by every rank of the process.
 * The outcome of the first attempt (table or message) is kept, so every rank sees the same. */
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const tsr_kernel_table *cuda_table;
static const tsr_kernel_named *cuda_named; /* written before cuda_open, so read after it */
static char cuda_why[2048];
/* cuda_table once open, readable without the once (tsr_kernel_table_of_ptr). */
static _Atomic(const tsr_kernel_table *) cuda_open;

/* The first member of `t` that is NULL, or NULL when every one is set. A table is used without
 * checks on the hot path, so one from another build is checked once, when it is opened. */
static const char *missing_entry(const tsr_kernel_table *t) {
#define MISSING(entry, kind, ret, params, args)                                                    \
  if (!t->entry) return #entry;
  TSR_KERNEL_LIST(MISSING)
#undef MISSING
  return NULL;
}

static void open_cuda(void) {
  if (!TSR_CUDA_BUILT) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': this tessera was built without CUDA (nvcc and the CUDA Toolkit were "
             "not found when it was configured, or TESSERA_CUDA=OFF). Install the CUDA Toolkit, "
             "reconfigure with -DTESSERA_CUDA=ON and rebuild, or use device = cpu");
    return;
  }
  char tried[1536] = "";
  void *lib = tsr_core_dlopen("libtessera-cuda.so", "TESSERA_CUDA_LIB", TSR_CUDA_INSTALL_LIB,
                              TSR_CUDA_BUILD_LIB, RTLD_NOW | RTLD_LOCAL, tried, sizeof tried);
  if (!lib) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': cannot open libtessera-cuda.so; set TESSERA_CUDA_LIB to its absolute "
             "path. Tried:%s",
             tried);
    return;
  }
  tsr_kernel_table_entry_fn entry =
      (tsr_kernel_table_entry_fn)(uintptr_t)dlsym(lib, TSR_KERNEL_TABLE_ENTRY);
  if (!entry) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': libtessera-cuda.so lacks %s; it is from another build of tessera",
             TSR_KERNEL_TABLE_ENTRY);
    return;
  }
  char why[1024] = "";
  const tsr_kernel_table *t = entry(TSR_KERNEL_TABLE_ABI, why, sizeof why);
  if (!t) {
    snprintf(cuda_why, sizeof cuda_why, "device 'cuda': %s", why[0] ? why : "unusable");
    return;
  }
  if (t->abi != TSR_KERNEL_TABLE_ABI || t->struct_size < sizeof(tsr_kernel_table)) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': libtessera-cuda.so has kernel table ABI %u (size %u), this core "
             "needs %d (size %zu); rebuild them together",
             t->abi, t->struct_size, TSR_KERNEL_TABLE_ABI, sizeof(tsr_kernel_table));
    return;
  }
  const char *missing = missing_entry(t);
  if (missing) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': the kernel table of libtessera-cuda.so has no '%s'; rebuild it with "
             "this core",
             missing);
    return;
  }
  tsr_kernel_named_entry_fn named =
      (tsr_kernel_named_entry_fn)(uintptr_t)dlsym(lib, TSR_KERNEL_NAMED_ENTRY);
  cuda_named = named ? named() : NULL;
  cuda_table = t;
  atomic_store_explicit(&cuda_open, t, memory_order_release);
}

tsr_status tsr_kernel_table_cuda(const tsr_kernel_table **out) {
  pthread_once(&cuda_once, open_cuda);
  *out = cuda_table;
  if (!cuda_table) return TSR_ERROR(TSR_ENOTSUP, "%s", cuda_why);
  return TSR_OK;
}

tsr_status tsr_kernel_table_for(tsr_device dev, const tsr_kernel_table **out) {
  switch (dev.kind) {
    case TSR_DEVICE_CPU:
      *out = &cpu_table;
      return TSR_OK;
    case TSR_DEVICE_EMU:
      *out = tsr_kernel_table_emu();
      return TSR_OK;
    case TSR_DEVICE_CUDA:
      return tsr_kernel_table_cuda(out);
  }
  *out = NULL;
  return TSR_ERROR(TSR_EINVAL, "kernel table: unknown device kind %d", (int)dev.kind);
}

const tsr_kernel_table *tsr_kernel_table_of_device(tsr_device dev) {
  const tsr_kernel_table *k = NULL;
  return tsr_kernel_table_for(dev, &k) == TSR_OK ? k : &cpu_table;
}

const tsr_kernel_table *tsr_kernel_table_of(const tsr_tensor *t) {
  return tsr_kernel_table_of_device(tsr_tensor_device(t));
}

const tsr_kernel_table *tsr_kernel_table_of_ptr(const void *p) {
  if (tsr_emu_owns(p)) return tsr_kernel_table_emu();
  /* Only a table that is already open can own memory; asking must not open the library. */
  const tsr_kernel_table *cuda = atomic_load_explicit(&cuda_open, memory_order_acquire);
  if (cuda && cuda->owns(p)) return cuda;
  return &cpu_table;
}

/* The lookup-only kernels of a table the core serves; NULL for any other table. */
static const tsr_kernel_named *named_of(const tsr_kernel_table *t) {
  if (t == &cpu_table) return cpu_named;
  if (t == tsr_kernel_table_emu()) return tsr_kernel_named_emu();
  if (t == atomic_load_explicit(&cuda_open, memory_order_acquire)) return cuda_named;
  return NULL;
}

/* A member exists only if the library that filled t had it: t's struct_size says how far t
 * goes, and nothing past it may be read. */
tsr_kernel_fn tsr_kernel_lookup(const tsr_kernel_table *t, const char *name) {
  if (!t || !name) return NULL;
#define LOOKUP_MEMBER(entry, kind, ret, params, args)                                              \
  if (strcmp(name, #entry) == 0)                                                                   \
    return offsetof(tsr_kernel_table, entry) + sizeof t->entry <= t->struct_size                   \
               ? (tsr_kernel_fn)t->entry                                                           \
               : NULL;
  TSR_KERNEL_LIST(LOOKUP_MEMBER)
#undef LOOKUP_MEMBER
  for (const tsr_kernel_named *k = named_of(t); k && k->name; k++)
    if (strcmp(name, k->name) == 0) return k->fn;
  return NULL;
}

tsr_status tsr_linear_forward(const tsr_rank_t *r, const tsr_kernel_table *k, float *out,
                              const float *x, const float *w, const float *bias, int N, int C,
                              int OC) {
  if (tsr_rank_matmul_dtype(r) == TSR_BF16)
    return k->matmul_forward_bf16(out, x, w, bias, N, C, OC);
  k->matmul_forward(out, x, w, bias, N, C, OC);
  return TSR_OK;
}

tsr_status tsr_linear_backward(const tsr_rank_t *r, const tsr_kernel_table *k, float *dx, float *dw,
                               float *dbias, const float *dout, const float *x, const float *w,
                               int N, int C, int OC) {
  if (tsr_rank_matmul_dtype(r) == TSR_BF16)
    return k->matmul_backward_bf16(dx, dw, dbias, dout, x, w, N, C, OC);
  k->matmul_backward(dx, dw, dbias, dout, x, w, N, C, OC);
  return TSR_OK;
}

bool tsr_on_device(const void *p) {
  return p && tsr_kernel_table_of_ptr(p)->device != TSR_DEVICE_CPU;
}

void tsr_memcpy_any(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  const tsr_kernel_table *kd = tsr_kernel_table_of_ptr(dst), *ks = tsr_kernel_table_of_ptr(src);
  if (kd->device == TSR_DEVICE_CPU && ks->device == TSR_DEVICE_CPU)
    memmove(dst, src, bytes);
  else if (kd->device == TSR_DEVICE_CPU)
    ks->copy_d2h(dst, src, bytes);
  else if (ks->device == TSR_DEVICE_CPU)
    kd->copy_h2d(dst, src, bytes);
  else
    kd->copy_d2d(dst, src, bytes);
}

const char *tsr_device_name(tsr_device_kind kind) {
  switch (kind) {
    case TSR_DEVICE_CPU:
      return "cpu";
    case TSR_DEVICE_CUDA:
      return "cuda";
    case TSR_DEVICE_EMU:
      return "emu";
  }
  return "?";
}
