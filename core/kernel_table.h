/* The kernel table: one struct of function pointers with exactly the signatures of
 * include/tessera/kernels.h, so that the code that runs an op can pick the implementation by the
 * device its tensors live on.
 *
 * The CPU table holds the addresses of the tsr_kernel_* functions themselves, so a caller that
 * goes through it computes byte for byte what a direct call computes. The CUDA table lives in
 * libtessera-cuda.so, which the core opens on first use (as the mpi backend is opened), so that
 * neither libtessera nor anything linked against it depends on the CUDA runtime.
 *
 * Pointer conventions of a table follow its device: in the CUDA table every array argument is
 * device memory (positions and ids included), while the scalar outputs (cross-entropy's loss and
 * n_valid, the double returned by sum_squares / global_norm) are host values, and
 * global_norm's `bufs` / `sizes` arrays are host arrays naming device buffers. CUDA kernels run on
 * the calling thread's current CUDA context (tsr_cuda_ctx_make_current, kernels/cuda).
 *
 * Private to the core and its in-tree companions (kernels/cuda, tests); not part of the plugin
 * ABI. */
#ifndef TESSERA_CORE_KERNEL_TABLE_H
#define TESSERA_CORE_KERNEL_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/kernels.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raised when a field is added; the core refuses a table whose abi differs or whose struct_size
 * does not cover the fields it reads. */
#define TSR_KERNEL_TABLE_ABI 2

typedef struct tsr_kernel_table {
  uint32_t abi;         /* TSR_KERNEL_TABLE_ABI of the library that filled it */
  uint32_t struct_size; /* sizeof(tsr_kernel_table) in that library */
  const char *name;     /* "cpu", "cuda" */
  tsr_device_kind device;

  void (*gemm)(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
               bool trans_b, float alpha, float beta);
  void (*matmul_forward)(float *out, const float *x, const float *w, const float *bias, int N,
                         int C, int OC);
  void (*matmul_backward)(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                          const float *w, int N, int C, int OC);

  void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int N, int C,
                          float eps);
  void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           const float *rstd, int N, int C);

  tsr_status (*rope_tables)(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                            float theta);
  void (*rope_forward)(float *out, const float *x, const float *cos_t, const float *sin_t, int B,
                       int L, int H, int D);
  void (*rope_backward)(float *dx, const float *dout, const float *cos_t, const float *sin_t, int B,
                        int L, int H, int D);
  void (*blhd_to_bhld)(float *out, const float *x, int B, int L, int H, int D);
  void (*bhld_to_blhd)(float *out, const float *x, int B, int L, int H, int D);

  void (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
  void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, int64_t n);

  tsr_status (*embedding_forward)(float *out, const int32_t *ids, const float *table, int N, int V,
                                  int C);
  tsr_status (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids, int N,
                                   int V, int C);

  tsr_status (*cross_entropy)(float *loss, int *n_valid, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, float dloss);
  void (*logits_row_max)(float *row_max, const float *logits, int N, int Vl);
  void (*logits_row_sumexp)(float *sumexp, const float *logits, const float *row_max, int N,
                            int Vl);
  void (*logits_target)(float *target_logit, const float *logits, const int32_t *targets, int N,
                        int Vl, int vocab_start);
  void (*cross_entropy_shard_backward)(float *dlogits, const float *logits, const int32_t *targets,
                                       const float *row_max, const float *sumexp, int N, int Vl,
                                       int vocab_start, float scale);

  tsr_status (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *q_pos, const int32_t *k_pos, int B,
                                  int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
  tsr_status (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, const int32_t *q_pos, const int32_t *k_pos,
                                   int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
  /* The same on the projection layout: q, out, dq, dout (B, Lq, Hq, D); k, v, dk, dv
   * (B, Lk, Hkv, D); lse (B, Hq, Lq). */
  tsr_status (*attention_forward_blhd)(float *out, float *lse, const float *q, const float *k,
                                       const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                       int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
  tsr_status (*attention_backward_blhd)(float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v,
                                        const float *out, const float *lse, const int32_t *q_pos,
                                        const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                        int Lk, int D, bool causal);
  void (*attention_merge)(float *out, float *lse, const float *out_a, const float *lse_a,
                          const float *out_b, const float *lse_b, int R, int D);

  void (*adamw)(float *param, const float *grad, float *m, float *v, int64_t n, int step, double lr,
                double beta1, double beta2, double eps, double weight_decay);
  double (*sum_squares)(const float *x, int64_t n);
  double (*global_norm)(const float *const *bufs, const int64_t *sizes, int nbufs);
  float (*clip_coef)(double total_norm, double max_norm);
  void (*scale)(float *x, int64_t n, float s);

  /* ---- Memory of the table's device (ABI 2) ----
   * What the core needs to keep tensors on a device without touching their bytes from the host.
   * Byte counts; `h2d` / `d2h` name which side is host memory. Work is ordered after what the
   * calling thread queued before (CUDA: its compute stream). copy_h2d returns when `src` may be
   * reused, copy_d2h when `dst` holds the data. Void functions keep their first failure for
   * `sync`, as the kernels do. */

  /* Whether `p` points into memory of this device (false for every pointer on the CPU table). */
  bool (*owns)(const void *p);
  /* Makes `a` the calling thread's allocator on device `ordinal`; for CUDA this also creates the
   * thread's context (streams, cuBLAS, caching allocator) and makes it current. Every tensor made
   * from `a` is freed before allocator_release, on the same thread. */
  tsr_status (*allocator_init)(tsr_allocator *a, int ordinal);
  void (*allocator_release)(tsr_allocator *a);
  void (*copy_h2d)(void *dst, const void *src, size_t bytes);
  void (*copy_d2h)(void *dst, const void *src, size_t bytes);
  void (*copy_d2d)(void *dst, const void *src, size_t bytes);
  void (*zero)(void *dst, size_t bytes);
  /* dst[idx] = src[idx] for every idx of `shape` (ndim <= TSR_MAX_DIMS; ndim 0 is one element),
   * strides in elements of elem_size bytes (1, 2, 4 or 8), both sides on this device. */
  void (*copy_strided)(void *dst, const int64_t *dst_stride, const void *src,
                       const int64_t *src_stride, const int64_t *shape, int ndim, size_t elem_size);
  /* out[i] = a[i] + b[i] in f32; out may be a (accumulation) */
  void (*add)(float *out, const float *a, const float *b, int64_t n);
  /* Waits for the calling thread's queued work; the first failure since the last sync. */
  tsr_status (*sync)(void);
} tsr_kernel_table;

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

/* The table of the device a tensor lives on. Never NULL: the allocator that made the tensor's
 * storage opened that table already. */
const tsr_kernel_table *tsr_kernel_table_of(const tsr_tensor *t);

/* The table of the device whose memory `p` points into (an emulated or, once the CUDA library
 * is open, a CUDA pointer), else the CPU table. */
const tsr_kernel_table *tsr_kernel_table_of_ptr(const void *p);

/* The allocator for a kernel's scratch beside tensor `t`: NULL (the process's untracked CPU
 * allocator) for a host tensor, `t`'s own allocator for a device tensor. */
tsr_allocator *tsr_tensor_scratch_allocator(const tsr_tensor *t);

/* A new contiguous tensor in `alloc`'s memory holding `n` host int32 values. */
tsr_status tsr_tensor_from_i32(tsr_allocator *alloc, int64_t n, const int32_t *host,
                               tsr_tensor **out);

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

#ifdef __cplusplus
}
#endif
#endif
