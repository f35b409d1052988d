/* The kernels and memory operations of the device a tensor lives on, for code that computes on
 * tensors without knowing where they are: the core's ops, and strategy plugins whose rules run
 * their own kernels (tensor-parallel attention, ring attention, the vocabulary-parallel loss).
 *
 * A table has one function pointer per function of tessera/kernels.h, with the same signature,
 * plus the memory entries a device needs so that its bytes are never touched from the host. The
 * CPU table holds the addresses of the tsr_kernel_* functions themselves, so a call through it
 * computes byte for byte what a direct call computes; a rule written against the table therefore
 * runs unchanged on the CPU, on CUDA and on the emulated device (`device = emu`, tensor.h), which
 * is how to check it without a GPU.
 *
 * Pointer conventions follow the table's device: every array argument is memory of that device
 * (positions, ids and targets included), while the scalar outputs (cross_entropy's loss and
 * n_valid, the double returned by sum_squares / global_norm) are host values, and global_norm's
 * `bufs` / `sizes` are host arrays naming device buffers. Device kernels are queued in the calling
 * thread's order (CUDA: on its rank's compute stream); a void kernel keeps its first failure for
 * `sync`. Host values that a rule needs (a scalar, the labels to count) come through
 * tsr_tensor_get or tsr_tensor_to, which wait for the queued work.
 *
 * Compatibility: fields are only ever appended, and TSR_KERNEL_TABLE_ABI grows when they are; a
 * plugin built against an older table reads only the fields it knew. */
#ifndef TESSERA_DEVICE_H
#define TESSERA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/kernels.h"
#include "tessera/rank.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raised when a field is added; the core refuses a table whose abi differs or whose struct_size
 * does not cover the fields it reads. */
#define TSR_KERNEL_TABLE_ABI 3

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

  /* ---- Mixed precision (ABI 3) ----
   * nn.Linear with bf16 operands and f32 accumulation and outputs: tsr_kernel_matmul_forward_bf16
   * and tsr_kernel_matmul_backward_bf16 (kernels.h). */
  tsr_status (*matmul_forward_bf16)(float *out, const float *x, const float *w, const float *bias,
                                    int N, int C, int OC);
  tsr_status (*matmul_backward_bf16)(float *dx, float *dw, float *dbias, const float *dout,
                                     const float *x, const float *w, int N, int C, int OC);
} tsr_kernel_table;

/* nn.Linear through table `k` at the rank's precision of matrix products
 * (tsr_rank_matmul_dtype): matmul_forward / matmul_backward, or their _bf16 entries. What a rule
 * that multiplies matrices calls, so that it rounds as the core's linear does. */
tsr_status tsr_linear_forward(const tsr_rank_t *r, const tsr_kernel_table *k, float *out,
                              const float *x, const float *w, const float *bias, int N, int C,
                              int OC);
tsr_status tsr_linear_backward(const tsr_rank_t *r, const tsr_kernel_table *k, float *dx, float *dw,
                               float *dbias, const float *dout, const float *x, const float *w,
                               int N, int C, int OC);

/* The table of the device `t` lives on. Never NULL: the allocator that made `t`'s storage opened
 * that table already. */
const tsr_kernel_table *tsr_kernel_table_of(const tsr_tensor *t);

/* The allocator for scratch that a kernel call beside `t` needs (saved activations, packed
 * heads): NULL, the process's untracked CPU allocator, for a host tensor, as the CPU kernels'
 * own scratch is; `t`'s own allocator for a device tensor, so the scratch is on the same device. */
tsr_allocator *tsr_tensor_scratch_allocator(const tsr_tensor *t);

/* A new contiguous i32 tensor of `n` elements in `alloc`'s memory (NULL: the process's CPU
 * allocator) holding the host values `host`: positions and ids for the kernels. */
tsr_status tsr_tensor_from_i32(tsr_allocator *alloc, int64_t n, const int32_t *host,
                               tsr_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
