/* The core's side of the kernel tables (tessera/device.h): which table serves which device, the
 * opening of libtessera-cuda.so, the emulated device, and the copies between any two pointers.
 *
 * The CUDA table lives in libtessera-cuda.so, which the core opens on first use (as the mpi
 * backend is opened), so that neither libtessera nor anything linked against it depends on the
 * CUDA runtime. CUDA kernels run on the calling thread's current CUDA context
 * (tsr_cuda_ctx_make_current, kernels/cuda).
 *
 * Private to the core and its in-tree companions (kernels/cuda, tests); plugins see only
 * tessera/device.h. */
#ifndef TESSERA_CORE_KERNEL_TABLE_H
#define TESSERA_CORE_KERNEL_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table of kernels/cpu. Never NULL. */
const tsr_kernel_table *tsr_kernel_table_cpu(void);

/* Whether this libtessera was configured with the CUDA parts (TESSERA_CUDA found nvcc). */
bool tsr_kernel_table_cuda_built(void);

/* The CUDA table, opening libtessera-cuda.so on first use. Looked up in TESSERA_CUDA_LIB (an
 * absolute path), then the install's lib directory, then this build tree; never the current
 * directory. TSR_ENOTSUP with a message saying why when the build has no CUDA ("built without
 * CUDA"), the library cannot be opened, or the machine has no usable device ("no CUDA device").
 * Thread-safe; the library stays open for the life of the process. */
tsr_status tsr_kernel_table_cuda(const tsr_kernel_table **out);

/* The emulated device's table (tensor.h, TSR_DEVICE_EMU; core/device_emu.c). Never NULL. */
const tsr_kernel_table *tsr_kernel_table_emu(void);
/* Whether `p` is an emulated-device pointer. */
bool tsr_emu_owns(const void *p);

/* The table for tensors on `dev`: the CPU table for TSR_DEVICE_CPU, the emulated device's for
 * TSR_DEVICE_EMU, the CUDA one for TSR_DEVICE_CUDA (with tsr_kernel_table_cuda's errors). */
tsr_status tsr_kernel_table_for(tsr_device dev, const tsr_kernel_table **out);

/* The table of a device an allocator already serves (its creation opened the table). Never
 * NULL. */
const tsr_kernel_table *tsr_kernel_table_of_device(tsr_device dev);

/* The table of the device whose memory `p` points into (an emulated or, once the CUDA library
 * is open, a CUDA pointer), else the CPU table. */
const tsr_kernel_table *tsr_kernel_table_of_ptr(const void *p);

/* Whether `p` is memory of a device (not NULL and not host memory). */
bool tsr_on_device(const void *p);

/* Copies `bytes` between any two pointers, host or device, in either direction. */
void tsr_memcpy_any(void *dst, const void *src, size_t bytes);

/* The CPU implementations of the memory entries, shared with the emulated device. */
void tsr_copy_strided_host(void *dst, const int64_t *dst_stride, const void *src,
                           const int64_t *src_stride, const int64_t *shape, int ndim,
                           size_t elem_size);
void tsr_add_host(float *out, const float *a, const float *b, int64_t n);

/* The symbol libtessera-cuda.so exports: returns its table, or NULL after writing why (no device,
 * ABI mismatch) into why[why_len]. */
typedef const tsr_kernel_table *(*tsr_kernel_table_entry_fn)(uint32_t abi, char *why,
                                                             unsigned why_len);
#define TSR_KERNEL_TABLE_ENTRY "tsr_cuda_kernel_table_v1"

/* One device's lookup-only kernels (TSR_KERNEL_LOOKUP_LIST, tessera/device.h), which have no
 * member to live in: arrays of them end with a NULL name. */
typedef struct tsr_kernel_named {
  const char *name;
  tsr_kernel_fn fn;
} tsr_kernel_named;

/* The emulated device's. */
const tsr_kernel_named *tsr_kernel_named_emu(void);

/* The symbol through which libtessera-cuda.so hands over its lookup-only kernels. Optional: a
 * library without it serves none, and its table is used all the same. */
typedef const tsr_kernel_named *(*tsr_kernel_named_entry_fn)(void);
#define TSR_KERNEL_NAMED_ENTRY "tsr_cuda_kernel_named_v1"

#ifdef __cplusplus
}
#endif
#endif
