/* The CPU kernel table and the loader of the CUDA one (kernel_table.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_table.h"
#include "tessera/plugin.h"

#ifndef TSR_CUDA_BUILT
#define TSR_CUDA_BUILT 0
#endif
#ifndef TSR_CUDA_BUILD_LIB
#define TSR_CUDA_BUILD_LIB ""
#endif
#ifndef TSR_CUDA_INSTALL_LIB
#define TSR_CUDA_INSTALL_LIB ""
#endif

static const tsr_kernel_table cpu_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "cpu",
    .device = TSR_DEVICE_CPU,
    .gemm = tsr_kernel_gemm,
    .matmul_forward = tsr_kernel_matmul_forward,
    .matmul_backward = tsr_kernel_matmul_backward,
    .rmsnorm_forward = tsr_kernel_rmsnorm_forward,
    .rmsnorm_backward = tsr_kernel_rmsnorm_backward,
    .rope_tables = tsr_kernel_rope_tables,
    .rope_forward = tsr_kernel_rope_forward,
    .rope_backward = tsr_kernel_rope_backward,
    .blhd_to_bhld = tsr_kernel_blhd_to_bhld,
    .bhld_to_blhd = tsr_kernel_bhld_to_blhd,
    .swiglu_forward = tsr_kernel_swiglu_forward,
    .swiglu_backward = tsr_kernel_swiglu_backward,
    .embedding_forward = tsr_kernel_embedding_forward,
    .embedding_backward = tsr_kernel_embedding_backward,
    .cross_entropy = tsr_kernel_cross_entropy,
    .logits_row_max = tsr_kernel_logits_row_max,
    .logits_row_sumexp = tsr_kernel_logits_row_sumexp,
    .logits_target = tsr_kernel_logits_target,
    .cross_entropy_shard_backward = tsr_kernel_cross_entropy_shard_backward,
    .attention_forward = tsr_kernel_attention_forward,
    .attention_backward = tsr_kernel_attention_backward,
    .attention_forward_blhd = tsr_kernel_attention_forward_blhd,
    .attention_backward_blhd = tsr_kernel_attention_backward_blhd,
    .attention_merge = tsr_kernel_attention_merge,
    .adamw = tsr_kernel_adamw,
    .sum_squares = tsr_kernel_sum_squares,
    .global_norm = tsr_kernel_global_norm,
    .clip_coef = tsr_kernel_clip_coef,
    .scale = tsr_kernel_scale,
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
static char cuda_why[2048];

static void open_cuda(void) {
  if (!TSR_CUDA_BUILT) {
    snprintf(cuda_why, sizeof cuda_why,
             "device 'cuda': this tessera was built without CUDA (nvcc and the CUDA Toolkit were "
             "not found when it was configured, or TESSERA_CUDA=OFF). Install the CUDA Toolkit, "
             "reconfigure with -DTESSERA_CUDA=ON and rebuild, or use device = cpu");
    return;
  }
  const char *env = getenv("TESSERA_CUDA_LIB");
  /* beside the loaded libtessera first: an install under any --prefix finds its own */
  char beside[4096 + 32] = "", lib_dir[4096];
  if (tsr_core_library_dir(lib_dir, sizeof lib_dir))
    snprintf(beside, sizeof beside, "%s/libtessera-cuda.so", lib_dir); /* cannot be cut */
  const char *paths[] = {env && env[0] == '/' ? env : NULL, beside, TSR_CUDA_INSTALL_LIB,
                         TSR_CUDA_BUILD_LIB};
  char tried[1536] = "";
  size_t pos = 0;
  void *lib = NULL;
  for (size_t i = 0; i < sizeof paths / sizeof paths[0] && !lib; i++) {
    if (!paths[i] || !paths[i][0]) continue;
    lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char *why = dlerror();
    int w = snprintf(tried + pos, sizeof tried - pos, "\n  %s: %s", paths[i], why ? why : "?");
    if (w > 0) pos = pos + (size_t)w < sizeof tried ? pos + (size_t)w : sizeof tried - 1;
  }
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
  cuda_table = t;
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
    case TSR_DEVICE_CUDA:
      return tsr_kernel_table_cuda(out);
  }
  *out = NULL;
  return TSR_ERROR(TSR_EINVAL, "kernel table: unknown device kind %d", (int)dev.kind);
}
