/* The emulated device (TSR_DEVICE_EMU, tensor.h): CPU memory behind pointers the host cannot
 * dereference, and the CPU kernels behind a table that translates them.
 *
 * A device pointer is the host address with bit 62 set. On x86-64 and AArch64 user addresses
 * live far below that bit, so the tagged value is a non-canonical (or unmapped) address: a load
 * or store through it faults on the spot, the way host code touching CUDA memory would have read
 * garbage or crashed later. Pointer arithmetic keeps the tag, so views and offsets work unchanged;
 * only this table strips it, immediately before the CPU kernel runs. Since the kernels are the
 * CPU's own, a run on this device must compute bit for bit what the same run on the CPU computes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_table.h"

#define EMU_TAG ((uintptr_t)1 << 62)

static void *real(const void *p) {
  return p ? (void *)((uintptr_t)p & ~EMU_TAG) : NULL;
}

static bool emu_owns(const void *p) {
  return ((uintptr_t)p & EMU_TAG) != 0;
}

bool tsr_emu_owns(const void *p) {
  return emu_owns(p);
}

/* The emulated device's function for each entry of the list (tessera/device.h). Declared from
 * the list, so the hand-written ones below must have the list's signatures. */
#define EMU_FN_dev(name)   emu_##name
#define EMU_FN_mixed(name) emu_##name
#define EMU_FN_host(name)  tsr_kernel_##name /* no device memory: the CPU's */
#define EMU_FN_mem(name)   emu_##name

#define EMU_DECLARE(name, kind, ret, params, args) EMU_DECLARE_##kind(name, ret, params)
#define EMU_DECLARE_dev(name, ret, params)         static ret emu_##name params;
#define EMU_DECLARE_mixed                          EMU_DECLARE_dev
#define EMU_DECLARE_mem                            EMU_DECLARE_dev
#define EMU_DECLARE_host(name, ret, params)
TSR_KERNEL_LIST(EMU_DECLARE)
TSR_KERNEL_LOOKUP_LIST(EMU_DECLARE)

/* ---- memory ---- */

static void *emu_alloc(void *context, size_t bytes) {
  (void)context;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
  return (void *)((uintptr_t)p | EMU_TAG);
}

static void emu_free(void *context, void *ptr, size_t bytes) {
  (void)context;
  (void)bytes;
  free(real(ptr));
}

static tsr_status emu_allocator_init(tsr_allocator *a, int ordinal) {
  memset(a, 0, sizeof *a);
  a->alloc = emu_alloc;
  a->free = emu_free;
  a->device = (tsr_device){TSR_DEVICE_EMU, ordinal};
  return TSR_OK;
}

static void emu_allocator_release(tsr_allocator *a) {
  (void)a;
}

static void emu_copy_h2d(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(real(dst), src, bytes);
}
static void emu_copy_d2h(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, real(src), bytes);
}
static void emu_copy_d2d(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(real(dst), real(src), bytes);
}
static void emu_zero(void *dst, size_t bytes) {
  if (bytes) memset(real(dst), 0, bytes);
}
static void emu_copy_strided(void *dst, const int64_t *dst_stride, const void *src,
                             const int64_t *src_stride, const int64_t *shape, int ndim,
                             size_t elem_size) {
  tsr_copy_strided_host(real(dst), dst_stride, real(src), src_stride, shape, ndim, elem_size);
}
static void emu_add(float *out, const float *a, const float *b, int64_t n) {
  tsr_add_host(real(out), real(a), real(b), n);
}
static tsr_status emu_sync(void) {
  return TSR_OK;
}

/* ---- kernels: strip the tag, call the CPU kernel ---- */

/* EMU_ARG(x): x with its tag stripped if it is a pointer, else x. Only the argument types of the
 * dev kernels are listed, so a kernel with a new type fails to compile here instead of handing
 * the CPU a tagged pointer. The detour through uintptr_t keeps the branches that are not taken
 * valid for every type. */
#define EMU_UNTAG(type, x) ((type)real((const void *)(uintptr_t)(x)))
#define EMU_ARG(x)                                                                                 \
  _Generic((x),                                                                                    \
      float *: EMU_UNTAG(float *, x),                                                              \
      const float *: EMU_UNTAG(const float *, x),                                                  \
      const int32_t *: EMU_UNTAG(const int32_t *, x),                                              \
      int: (x),                                                                                    \
      int64_t: (x),                                                                                \
      bool: (x),                                                                                   \
      float: (x),                                                                                  \
      double: (x))

/* EMU_ARGS(a, b, ...) is EMU_ARG(a), EMU_ARG(b), ...: up to 20 arguments, the most a kernel
 * takes being 18. */
#define EMU_ARGS(...)       EMU_ARGS_N(EMU_COUNT(__VA_ARGS__), __VA_ARGS__)
#define EMU_ARGS_N(n, ...)  EMU_ARGS_N_(n, __VA_ARGS__)
#define EMU_ARGS_N_(n, ...) EMU_ARGS_##n(__VA_ARGS__)
#define EMU_COUNT(...)                                                                             \
  EMU_COUNT_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define EMU_COUNT_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,     \
                   a18, a19, a20, n, ...)                                                          \
  n
#define EMU_ARGS_1(a)       EMU_ARG(a)
#define EMU_ARGS_2(a, ...)  EMU_ARG(a), EMU_ARGS_1(__VA_ARGS__)
#define EMU_ARGS_3(a, ...)  EMU_ARG(a), EMU_ARGS_2(__VA_ARGS__)
#define EMU_ARGS_4(a, ...)  EMU_ARG(a), EMU_ARGS_3(__VA_ARGS__)
#define EMU_ARGS_5(a, ...)  EMU_ARG(a), EMU_ARGS_4(__VA_ARGS__)
#define EMU_ARGS_6(a, ...)  EMU_ARG(a), EMU_ARGS_5(__VA_ARGS__)
#define EMU_ARGS_7(a, ...)  EMU_ARG(a), EMU_ARGS_6(__VA_ARGS__)
#define EMU_ARGS_8(a, ...)  EMU_ARG(a), EMU_ARGS_7(__VA_ARGS__)
#define EMU_ARGS_9(a, ...)  EMU_ARG(a), EMU_ARGS_8(__VA_ARGS__)
#define EMU_ARGS_10(a, ...) EMU_ARG(a), EMU_ARGS_9(__VA_ARGS__)
#define EMU_ARGS_11(a, ...) EMU_ARG(a), EMU_ARGS_10(__VA_ARGS__)
#define EMU_ARGS_12(a, ...) EMU_ARG(a), EMU_ARGS_11(__VA_ARGS__)
#define EMU_ARGS_13(a, ...) EMU_ARG(a), EMU_ARGS_12(__VA_ARGS__)
#define EMU_ARGS_14(a, ...) EMU_ARG(a), EMU_ARGS_13(__VA_ARGS__)
#define EMU_ARGS_15(a, ...) EMU_ARG(a), EMU_ARGS_14(__VA_ARGS__)
#define EMU_ARGS_16(a, ...) EMU_ARG(a), EMU_ARGS_15(__VA_ARGS__)
#define EMU_ARGS_17(a, ...) EMU_ARG(a), EMU_ARGS_16(__VA_ARGS__)
#define EMU_ARGS_18(a, ...) EMU_ARG(a), EMU_ARGS_17(__VA_ARGS__)
#define EMU_ARGS_19(a, ...) EMU_ARG(a), EMU_ARGS_18(__VA_ARGS__)
#define EMU_ARGS_20(a, ...) EMU_ARG(a), EMU_ARGS_19(__VA_ARGS__)

/* C allows no `return f();` in a void function, so whether the wrapper returns depends on the
 * entry's type. */
#define EMU_RETURN_void
#define EMU_RETURN_tsr_status return
#define EMU_RETURN_double     return
#define EMU_RETURN_float      return
#define EMU_RETURN_bool       return

/* Every dev kernel is the CPU kernel on the untagged pointers. */
#define EMU_WRAP(name, kind, ret, params, args) EMU_WRAP_##kind(name, ret, params, args)
#define EMU_WRAP_dev(name, ret, params, args)                                                      \
  static ret emu_##name params {                                                                   \
    EMU_RETURN_##ret tsr_kernel_##name(EMU_ARGS args);                                             \
  }
#define EMU_WRAP_mixed(name, ret, params, args) /* host values too: written out below */
#define EMU_WRAP_host(name, ret, params, args)
#define EMU_WRAP_mem(name, ret, params, args)
TSR_KERNEL_LIST(EMU_WRAP)
TSR_KERNEL_LOOKUP_LIST(EMU_WRAP)

/* loss and n_valid are host values, as on every device table. */
static tsr_status emu_cross_entropy(float *loss, int *n_valid, float *dlogits, const float *logits,
                                    const int32_t *targets, int N, int V, float dloss) {
  return tsr_kernel_cross_entropy(loss, n_valid, real(dlogits), real(logits), real(targets), N, V,
                                  dloss);
}
/* bufs is a host array naming device buffers. Unused by the core (it sums sum_squares per
 * parameter), kept so the table is complete; NaN when the translation cannot be allocated. */
static double emu_global_norm(const float *const *bufs, const int64_t *sizes, int nbufs) {
  const float **host = malloc((size_t)(nbufs > 0 ? nbufs : 1) * sizeof *host);
  if (!host) return __builtin_nan("");
  for (int i = 0; i < nbufs; i++) host[i] = real(bufs[i]);
  double r = tsr_kernel_global_norm(host, sizes, nbufs);
  free(host);
  return r;
}

#define EMU_MEMBER(name, kind, ret, params, args) .name = EMU_FN_##kind(name),
#define EMU_NAMED(name, kind, ret, params, args)  {#name, (tsr_kernel_fn)EMU_FN_##kind(name)},

static const tsr_kernel_table emu_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "emu",
    .device = TSR_DEVICE_EMU,
    TSR_KERNEL_LIST(EMU_MEMBER) /* each entry's EMU_FN_<kind> */
};

static const tsr_kernel_named emu_named[] = {
    TSR_KERNEL_LOOKUP_LIST(EMU_NAMED) /* then the end: */ {NULL, NULL},
};

const tsr_kernel_table *tsr_kernel_table_emu(void) {
  return &emu_table;
}

const tsr_kernel_named *tsr_kernel_named_emu(void) {
  return emu_named;
}
