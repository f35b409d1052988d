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
 * Compatibility: members are only ever appended, and TSR_KERNEL_TABLE_ABI grows when they are; a
 * plugin built against an older table reads only the members it knew. Kernels may also be
 * reached by name (tsr_kernel_lookup), which is how ones added later come without a new ABI. */
#ifndef TESSERA_DEVICE_H
#define TESSERA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/kernels.h"
#include "tessera/rank.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raised when a member is added; the core refuses a table whose abi differs or whose struct_size
 * does not cover the members it reads. */
#define TSR_KERNEL_TABLE_ABI 3

/* ---------------------------------------------------------------------------------------------
 * The entries of the table, each written once
 *
 * One X(name, kind, ret, params, args) per entry, in the struct's order. The struct's members,
 * every backend's table, the CUDA declarations and the emulated device's wrappers are all made
 * from this list, so an entry cannot be missing from one of them, and a signature changed here
 * but not in an implementation fails to compile.
 *
 *   name    the member; the functions that implement it are named after it
 *           (tsr_kernel_<name> on the CPU, tsr_cuda_k_<name> on CUDA)
 *   kind    how a device serves the entry, which decides what can be generated for it:
 *             dev    a kernels.h function whose array arguments are all memory of the table's
 *                    device, so a device only has to translate pointers
 *             mixed  a kernels.h function that also takes host values through pointers
 *                    (cross_entropy's loss and n_valid, global_norm's bufs and sizes)
 *             host   a kernels.h function that touches no device memory: the CPU's serves
 *                    every table
 *             mem    a memory operation of the device (ABI 2), with no kernels.h function
 *   ret, params  the entry's type: ret (*name) params
 *   args    the parameters' names, for code that forwards a call
 *
 * Order is the ABI: append only, and raise TSR_KERNEL_TABLE_ABI. A kernel that should not grow
 * the struct goes into TSR_KERNEL_LOOKUP_LIST instead.
 * ------------------------------------------------------------------------------------------- */

/* clang-format off */
#define TSR_KERNEL_LIST(X)                                                                         \
  X(gemm, dev, void,                                                                               \
    (float *c, const float *a, const float *b, int M, int N, int K, bool trans_a, bool trans_b,    \
     float alpha, float beta),                                                                     \
    (c, a, b, M, N, K, trans_a, trans_b, alpha, beta))                                             \
  X(matmul_forward, dev, void,                                                                     \
    (float *out, const float *x, const float *w, const float *bias, int N, int C, int OC),         \
    (out, x, w, bias, N, C, OC))                                                                   \
  X(matmul_backward, dev, void,                                                                    \
    (float *dx, float *dw, float *dbias, const float *dout, const float *x, const float *w, int N, \
     int C, int OC),                                                                               \
    (dx, dw, dbias, dout, x, w, N, C, OC))                                                         \
                                                                                                   \
  X(rmsnorm_forward, dev, void,                                                                    \
    (float *out, float *rstd, const float *x, const float *w, int N, int C, float eps),            \
    (out, rstd, x, w, N, C, eps))                                                                  \
  X(rmsnorm_backward, dev, void,                                                                   \
    (float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,   \
     int N, int C),                                                                                \
    (dx, dw, dout, x, w, rstd, N, C))                                                              \
                                                                                                   \
  X(rope_tables, dev, tsr_status,                                                                  \
    (float *cos_t, float *sin_t, const int32_t *pos, int L, int D, float theta),                   \
    (cos_t, sin_t, pos, L, D, theta))                                                              \
  X(rope_forward, dev, void,                                                                       \
    (float *out, const float *x, const float *cos_t, const float *sin_t, int B, int L, int H,      \
     int D),                                                                                       \
    (out, x, cos_t, sin_t, B, L, H, D))                                                            \
  X(rope_backward, dev, void,                                                                      \
    (float *dx, const float *dout, const float *cos_t, const float *sin_t, int B, int L, int H,    \
     int D),                                                                                       \
    (dx, dout, cos_t, sin_t, B, L, H, D))                                                          \
  X(blhd_to_bhld, dev, void, (float *out, const float *x, int B, int L, int H, int D),             \
    (out, x, B, L, H, D))                                                                          \
  X(bhld_to_blhd, dev, void, (float *out, const float *x, int B, int L, int H, int D),             \
    (out, x, B, L, H, D))                                                                          \
                                                                                                   \
  X(swiglu_forward, dev, void, (float *out, const float *gate, const float *up, int64_t n),        \
    (out, gate, up, n))                                                                            \
  X(swiglu_backward, dev, void,                                                                    \
    (float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n),  \
    (dgate, dup, dout, gate, up, n))                                                               \
                                                                                                   \
  X(embedding_forward, dev, tsr_status,                                                            \
    (float *out, const int32_t *ids, const float *table, int N, int V, int C),                     \
    (out, ids, table, N, V, C))                                                                    \
  X(embedding_backward, dev, tsr_status,                                                           \
    (float *dtable, const float *dout, const int32_t *ids, int N, int V, int C),                   \
    (dtable, dout, ids, N, V, C))                                                                  \
                                                                                                   \
  X(cross_entropy, mixed, tsr_status,                                                              \
    (float *loss, int *n_valid, float *dlogits, const float *logits, const int32_t *targets,       \
     int N, int V, float dloss),                                                                   \
    (loss, n_valid, dlogits, logits, targets, N, V, dloss))                                        \
  X(logits_row_max, dev, void, (float *row_max, const float *logits, int N, int Vl),               \
    (row_max, logits, N, Vl))                                                                      \
  X(logits_row_sumexp, dev, void,                                                                  \
    (float *sumexp, const float *logits, const float *row_max, int N, int Vl),                     \
    (sumexp, logits, row_max, N, Vl))                                                              \
  X(logits_target, dev, void,                                                                      \
    (float *target_logit, const float *logits, const int32_t *targets, int N, int Vl,              \
     int vocab_start),                                                                             \
    (target_logit, logits, targets, N, Vl, vocab_start))                                           \
  X(cross_entropy_shard_backward, dev, void,                                                       \
    (float *dlogits, const float *logits, const int32_t *targets, const float *row_max,            \
     const float *sumexp, int N, int Vl, int vocab_start, float scale),                            \
    (dlogits, logits, targets, row_max, sumexp, N, Vl, vocab_start, scale))                        \
                                                                                                   \
  X(attention_forward, dev, tsr_status,                                                            \
    (float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *q_pos, \
     const int32_t *k_pos, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal),            \
    (out, lse, q, k, v, q_pos, k_pos, B, Hq, Hkv, Lq, Lk, D, causal))                              \
  X(attention_backward, dev, tsr_status,                                                           \
    (float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,           \
     const float *v, const float *out, const float *lse, const int32_t *q_pos,                     \
     const int32_t *k_pos, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal),            \
    (dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, B, Hq, Hkv, Lq, Lk, D, causal))            \
  /* The same on the projection layout: q, out, dq, dout (B, Lq, Hq, D); k, v, dk, dv            \
   * (B, Lk, Hkv, D); lse (B, Hq, Lq). */                                                          \
  X(attention_forward_blhd, dev, tsr_status,                                                       \
    (float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *q_pos, \
     const int32_t *k_pos, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal),            \
    (out, lse, q, k, v, q_pos, k_pos, B, Hq, Hkv, Lq, Lk, D, causal))                              \
  X(attention_backward_blhd, dev, tsr_status,                                                      \
    (float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,           \
     const float *v, const float *out, const float *lse, const int32_t *q_pos,                     \
     const int32_t *k_pos, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal),            \
    (dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, B, Hq, Hkv, Lq, Lk, D, causal))            \
  X(attention_merge, dev, void,                                                                    \
    (float *out, float *lse, const float *out_a, const float *lse_a, const float *out_b,           \
     const float *lse_b, int R, int D),                                                            \
    (out, lse, out_a, lse_a, out_b, lse_b, R, D))                                                  \
                                                                                                   \
  X(adamw, dev, void,                                                                              \
    (float *param, const float *grad, float *m, float *v, int64_t n, int step, double lr,          \
     double beta1, double beta2, double eps, double weight_decay),                                 \
    (param, grad, m, v, n, step, lr, beta1, beta2, eps, weight_decay))                             \
  X(sum_squares, dev, double, (const float *x, int64_t n), (x, n))                                 \
  X(global_norm, mixed, double, (const float *const *bufs, const int64_t *sizes, int nbufs),       \
    (bufs, sizes, nbufs))                                                                          \
  X(clip_coef, host, float, (double total_norm, double max_norm), (total_norm, max_norm))          \
  X(scale, dev, void, (float *x, int64_t n, float s), (x, n, s))                                   \
                                                                                                   \
  /* ---- Memory of the table's device (ABI 2) ----                                               \
   * What the core needs to keep tensors on a device without touching their bytes from the host. \
   * Byte counts; h2d / d2h name which side is host memory. Work is ordered after what the        \
   * calling thread queued before (CUDA: its compute stream). copy_h2d returns when src may be    \
   * reused, copy_d2h when dst holds the data. Void functions keep their first failure for sync, \
   * as the kernels do. */                                                                         \
                                                                                                   \
  /* Whether p points into memory of this device (false for every pointer on the CPU table). */  \
  X(owns, mem, bool, (const void *p), (p))                                                         \
  /* Makes a the calling thread's allocator on device ordinal; for CUDA this also creates the     \
   * thread's context (streams, cuBLAS, caching allocator) and makes it current. Every tensor     \
   * made from a is freed before allocator_release, on the same thread. */                        \
  X(allocator_init, mem, tsr_status, (tsr_allocator *a, int ordinal), (a, ordinal))                \
  X(allocator_release, mem, void, (tsr_allocator *a), (a))                                         \
  X(copy_h2d, mem, void, (void *dst, const void *src, size_t bytes), (dst, src, bytes))            \
  X(copy_d2h, mem, void, (void *dst, const void *src, size_t bytes), (dst, src, bytes))            \
  X(copy_d2d, mem, void, (void *dst, const void *src, size_t bytes), (dst, src, bytes))            \
  X(zero, mem, void, (void *dst, size_t bytes), (dst, bytes))                                      \
  /* dst[idx] = src[idx] for every idx of shape (ndim <= TSR_MAX_DIMS; ndim 0 is one element),    \
   * strides in elements of elem_size bytes (1, 2, 4 or 8), both sides on this device. */         \
  X(copy_strided, mem, void,                                                                       \
    (void *dst, const int64_t *dst_stride, const void *src, const int64_t *src_stride,             \
     const int64_t *shape, int ndim, size_t elem_size),                                            \
    (dst, dst_stride, src, src_stride, shape, ndim, elem_size))                                    \
  /* out[i] = a[i] + b[i] in f32; out may be a (accumulation) */                                  \
  X(add, mem, void, (float *out, const float *a, const float *b, int64_t n), (out, a, b, n))      \
  /* Waits for the calling thread's queued work; the first failure since the last sync. */        \
  X(sync, mem, tsr_status, (void), ())                                                             \
                                                                                                   \
  /* ---- Mixed precision (ABI 3) ----                                                            \
   * nn.Linear with bf16 operands and f32 accumulation and outputs: tsr_kernel_matmul_forward_bf16 \
   * and tsr_kernel_matmul_backward_bf16 (kernels.h). */                                           \
  X(matmul_forward_bf16, dev, tsr_status,                                                          \
    (float *out, const float *x, const float *w, const float *bias, int N, int C, int OC),         \
    (out, x, w, bias, N, C, OC))                                                                   \
  X(matmul_backward_bf16, dev, tsr_status,                                                         \
    (float *dx, float *dw, float *dbias, const float *dout, const float *x, const float *w, int N, \
     int C, int OC),                                                                               \
    (dx, dw, dbias, dout, x, w, N, C, OC))

/* Kernels reached only by name, through tsr_kernel_lookup, with the columns of TSR_KERNEL_LIST.
 * A kernel added here changes neither the struct nor TSR_KERNEL_TABLE_ABI, so code built
 * against an older header keeps working unchanged, and code that uses the kernel runs with any
 * library: lookup answers NULL where the kernel is not served yet. Since ABI 1.3: attention with
 * segment ids (document masking, tessera/kernels.h). */
#define TSR_KERNEL_LOOKUP_LIST(X)                                                                  \
  X(attention_forward_seg, dev, tsr_status,                                                        \
    (float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *q_pos, \
     const int32_t *k_pos, const int32_t *q_seg, const int32_t *k_seg, int B, int Hq, int Hkv,     \
     int Lq, int Lk, int D, bool causal),                                                          \
    (out, lse, q, k, v, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv, Lq, Lk, D, causal))                \
  X(attention_backward_seg, dev, tsr_status,                                                       \
    (float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,           \
     const float *v, const float *out, const float *lse, const int32_t *q_pos,                     \
     const int32_t *k_pos, const int32_t *q_seg, const int32_t *k_seg, int B, int Hq, int Hkv,     \
     int Lq, int Lk, int D, bool causal),                                                          \
    (dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv, Lq, Lk, D,       \
     causal))                                                                                      \
  X(attention_forward_seg_blhd, dev, tsr_status,                                                   \
    (float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *q_pos, \
     const int32_t *k_pos, const int32_t *q_seg, const int32_t *k_seg, int B, int Hq, int Hkv,     \
     int Lq, int Lk, int D, bool causal),                                                          \
    (out, lse, q, k, v, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv, Lq, Lk, D, causal))                \
  X(attention_backward_seg_blhd, dev, tsr_status,                                                  \
    (float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,           \
     const float *v, const float *out, const float *lse, const int32_t *q_pos,                     \
     const int32_t *k_pos, const int32_t *q_seg, const int32_t *k_seg, int B, int Hq, int Hkv,     \
     int Lq, int Lk, int D, bool causal),                                                          \
    (dq, dk, dv, dout, q, k, v, out, lse, q_pos, k_pos, q_seg, k_seg, B, Hq, Hkv, Lq, Lk, D,       \
     causal))
/* clang-format on */

#define TSR_KERNEL_MEMBER_(name, kind, ret, params, args) ret(*name) params;

typedef struct tsr_kernel_table {
  uint32_t abi;         /* TSR_KERNEL_TABLE_ABI of the library that filled it */
  uint32_t struct_size; /* sizeof(tsr_kernel_table) in that library */
  const char *name;     /* "cpu", "cuda", "emu" */
  tsr_device_kind device;
  TSR_KERNEL_LIST(TSR_KERNEL_MEMBER_) /* one function pointer per entry, in the list's order */
} tsr_kernel_table;

#undef TSR_KERNEL_MEMBER_

/* The type of each TSR_KERNEL_LOOKUP_LIST entry, to cast tsr_kernel_lookup's answer to:
 * tsr_kernel_attention_forward_seg_fn and so on. */
#define TSR_KERNEL_LOOKUP_TYPE_(name, kind, ret, params, args)                                     \
  typedef ret(*tsr_kernel_##name##_fn) params;
TSR_KERNEL_LOOKUP_LIST(TSR_KERNEL_LOOKUP_TYPE_)
#undef TSR_KERNEL_LOOKUP_TYPE_

/* An entry as tsr_kernel_lookup returns it; cast it to the entry's own type to call it. */
typedef void (*tsr_kernel_fn)(void);

/* The entry `name` of table `t` (a name of TSR_KERNEL_LIST or TSR_KERNEL_LOOKUP_LIST, e.g.
 * "attention_merge"), or NULL: for an unknown name, for a member that a table filled by an older
 * library does not have (its struct_size ends before it), and for a lookup-only kernel that t's
 * device does not serve. What code calls for a kernel that may be newer than the library it runs
 * with; the answer does not change, so look it up once. */
TSR_API tsr_kernel_fn tsr_kernel_lookup(const tsr_kernel_table *t, const char *name);

/* nn.Linear through table `k` at the rank's precision of matrix products
 * (tsr_rank_matmul_dtype): matmul_forward / matmul_backward, or their _bf16 entries. What a rule
 * that multiplies matrices calls, so that it rounds as the core's linear does. */
TSR_API tsr_status tsr_linear_forward(const tsr_rank_t *r, const tsr_kernel_table *k, float *out,
                                      const float *x, const float *w, const float *bias, int N,
                                      int C, int OC);
TSR_API tsr_status tsr_linear_backward(const tsr_rank_t *r, const tsr_kernel_table *k, float *dx,
                                       float *dw, float *dbias, const float *dout, const float *x,
                                       const float *w, int N, int C, int OC);

/* The table of the device `t` lives on. Never NULL: the allocator that made `t`'s storage opened
 * that table already. */
TSR_API const tsr_kernel_table *tsr_kernel_table_of(const tsr_tensor *t);

/* The allocator for scratch that a kernel call beside `t` needs (saved activations, packed
 * heads): NULL, the process's untracked CPU allocator, for a host tensor, as the CPU kernels'
 * own scratch is; `t`'s own allocator for a device tensor, so the scratch is on the same device. */
TSR_API tsr_allocator *tsr_tensor_scratch_allocator(const tsr_tensor *t);

/* A new contiguous i32 tensor of `n` elements in `alloc`'s memory (NULL: the process's CPU
 * allocator) holding the host values `host`: positions and ids for the kernels. */
TSR_API tsr_status tsr_tensor_from_i32(tsr_allocator *alloc, int64_t n, const int32_t *host,
                                       tsr_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
