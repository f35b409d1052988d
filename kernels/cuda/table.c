/* The CUDA kernel table and the entry point the core's loader calls (core/kernel_table.h). */
#include <stdio.h>

#include "kernel_table.h"
#include "misc.h"

/* clip_coef, the one host entry, is arithmetic on two doubles: the CPU function is the
 * definition. */
#define CUDA_FN_dev(name)                          tsr_cuda_k_##name
#define CUDA_FN_mixed(name)                        tsr_cuda_k_##name
#define CUDA_FN_mem(name)                          tsr_cuda_k_##name
#define CUDA_FN_host(name)                         tsr_kernel_##name
#define CUDA_MEMBER(name, kind, ret, params, args) .name = CUDA_FN_##kind(name),
#define CUDA_NAMED(name, kind, ret, params, args)  {#name, (tsr_kernel_fn)CUDA_FN_##kind(name)},

static const tsr_kernel_table cuda_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "cuda",
    .device = TSR_DEVICE_CUDA,
    TSR_KERNEL_LIST(CUDA_MEMBER) /* each entry's CUDA_FN_<kind> */
};

static const tsr_kernel_named cuda_named[] = {
    TSR_KERNEL_LOOKUP_LIST(CUDA_NAMED) /* then the end: */ {NULL, NULL},
};

const tsr_kernel_table *tsr_cuda_kernel_table_v1(uint32_t abi, char *why, unsigned why_len) {
  if (abi != TSR_KERNEL_TABLE_ABI) {
    snprintf(why, why_len, "libtessera-cuda.so has kernel table ABI %d, the core asks for %u",
             TSR_KERNEL_TABLE_ABI, abi);
    return NULL;
  }
  char reason[256] = "";
  if (tsr_cuda_device_count(reason, sizeof reason) == 0) {
    snprintf(why, why_len, "no CUDA device (%s)", reason);
    return NULL;
  }
  return &cuda_table;
}

/* TSR_KERNEL_NAMED_ENTRY: the lookup-only kernels, which have no member of cuda_table. */
const tsr_kernel_named *tsr_cuda_kernel_named_v1(void) {
  return cuda_named;
}
