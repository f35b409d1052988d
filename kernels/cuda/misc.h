/* Declarations of the table functions (tsr_cuda_k_*, one per kernels.h function, same
 * signature) and the helpers the .cu files share. Internal. */
#ifndef TESSERA_CUDA_MISC_H
#define TESSERA_CUDA_MISC_H

#include "cuda_internal.h"
#include "tessera/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks ids (or targets) on the device and waits for the answer: first_bad is the smallest bad
 * position or -1, count the in-range entries. A sync point, taken because the op must refuse
 * bad input before it writes, as the CPU kernel does. */
tsr_status tsr_cuda_check_ids(tsr_cuda_ctx *ctx, const int32_t *ids, int N, int V,
                              bool allow_ignore, int *first_bad, int *count);

/* Reads ids[pos] back for an error message. */
int32_t tsr_cuda_read_id(tsr_cuda_ctx *ctx, const int32_t *ids, int pos);

void tsr_cuda_k_gemm(float *c, const float *a, const float *b, int M, int N, int K, bool trans_a,
                     bool trans_b, float alpha, float beta);
void tsr_cuda_k_matmul_forward(float *out, const float *x, const float *w, const float *bias, int N,
                               int C, int OC);
void tsr_cuda_k_matmul_backward(float *dx, float *dw, float *dbias, const float *dout,
                                const float *x, const float *w, int N, int C, int OC);
tsr_status tsr_cuda_k_matmul_forward_bf16(float *out, const float *x, const float *w,
                                          const float *bias, int N, int C, int OC);
tsr_status tsr_cuda_k_matmul_backward_bf16(float *dx, float *dw, float *dbias, const float *dout,
                                           const float *x, const float *w, int N, int C, int OC);
void tsr_cuda_k_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                                int C, float eps);
void tsr_cuda_k_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                 const float *w, const float *rstd, int N, int C);
tsr_status tsr_cuda_k_rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                                  float theta);
void tsr_cuda_k_rope_forward(float *out, const float *x, const float *cos_t, const float *sin_t,
                             int B, int L, int H, int D);
void tsr_cuda_k_rope_backward(float *dx, const float *dout, const float *cos_t, const float *sin_t,
                              int B, int L, int H, int D);
void tsr_cuda_k_blhd_to_bhld(float *out, const float *x, int B, int L, int H, int D);
void tsr_cuda_k_bhld_to_blhd(float *out, const float *x, int B, int L, int H, int D);
void tsr_cuda_k_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void tsr_cuda_k_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n);
tsr_status tsr_cuda_k_embedding_forward(float *out, const int32_t *ids, const float *table, int N,
                                        int V, int C);
tsr_status tsr_cuda_k_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                         int N, int V, int C);
tsr_status tsr_cuda_k_cross_entropy(float *loss, int *n_valid, float *dlogits, const float *logits,
                                    const int32_t *targets, int N, int V, float dloss);
void tsr_cuda_k_logits_row_max(float *row_max, const float *logits, int N, int Vl);
void tsr_cuda_k_logits_row_sumexp(float *sumexp, const float *logits, const float *row_max, int N,
                                  int Vl);
void tsr_cuda_k_logits_target(float *target_logit, const float *logits, const int32_t *targets,
                              int N, int Vl, int vocab_start);
void tsr_cuda_k_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                             const int32_t *targets, const float *row_max,
                                             const float *sumexp, int N, int Vl, int vocab_start,
                                             float scale);
tsr_status tsr_cuda_k_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                        int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
tsr_status tsr_cuda_k_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *out, const float *lse, const int32_t *q_pos,
                                         const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                         int Lk, int D, bool causal);
tsr_status tsr_cuda_k_attention_forward_blhd(float *out, float *lse, const float *q, const float *k,
                                             const float *v, const int32_t *q_pos,
                                             const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                             int Lk, int D, bool causal);
tsr_status tsr_cuda_k_attention_backward_blhd(float *dq, float *dk, float *dv, const float *dout,
                                              const float *q, const float *k, const float *v,
                                              const float *out, const float *lse,
                                              const int32_t *q_pos, const int32_t *k_pos, int B,
                                              int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
void tsr_cuda_k_attention_merge(float *out, float *lse, const float *out_a, const float *lse_a,
                                const float *out_b, const float *lse_b, int R, int D);
void tsr_cuda_k_adamw(float *param, const float *grad, float *m, float *v, int64_t n, int step,
                      double lr, double beta1, double beta2, double eps, double weight_decay);
double tsr_cuda_k_sum_squares(const float *x, int64_t n);
double tsr_cuda_k_global_norm(const float *const *bufs, const int64_t *sizes, int nbufs);
void tsr_cuda_k_scale(float *x, int64_t n, float s);

/* ---- Memory of the device (kernel table ABI 2; memory.c, memory.cu) ----
 * The semantics are the table's (core/kernel_table.h). All but owns and allocator_init work on
 * the calling thread's current context and queue on its compute stream; with no current context
 * they do nothing but keep an error for sync (tsr_cuda_try_ctx), so a caller bug cannot crash the
 * process. Void functions keep their first failure in the context for sync. */

/* True when cudaPointerGetAttributes calls `p` device or managed memory (of any device); false
 * for host memory, pinned or not, for NULL and when the runtime cannot answer, with the error the
 * query may leave behind cleared. Needs no context. */
bool tsr_cuda_k_owns(const void *p);
/* Creates a context on device `ordinal` for the calling thread, makes it current, and makes `a`
 * a view of that context's caching allocator (context = the tsr_cuda_ctx, device
 * {TSR_DEVICE_CUDA, ordinal}, counters zero). Several threads may each hold a context on the same
 * device. On failure `a` is zeroed and the context error returned (TSR_ENOTSUP without a device,
 * TSR_EINVAL for an ordinal out of range). */
tsr_status tsr_cuda_k_allocator_init(tsr_allocator *a, int ordinal);
/* Destroys the context behind `a` (after waiting for both its streams; cached blocks are freed,
 * blocks still in use are not), clears the thread's current context if it was that one, and
 * zeroes `a`. A zeroed or non-CUDA allocator: no-op. Call on the thread that made it. */
void tsr_cuda_k_allocator_release(tsr_allocator *a);
/* Host to device; returns when `src` may be reused, which is when the copy has completed: waits
 * for the compute stream, because a pinned source is read by the DMA engine after
 * cudaMemcpyAsync returns. A sync point. */
void tsr_cuda_k_copy_h2d(void *dst, const void *src, size_t bytes);
/* Device to host; returns when `dst` holds the data (waits for the compute stream). */
void tsr_cuda_k_copy_d2h(void *dst, const void *src, size_t bytes);
/* Device to device, queued on the compute stream; no host wait. Regions must not overlap. */
void tsr_cuda_k_copy_d2d(void *dst, const void *src, size_t bytes);
/* Sets `bytes` bytes at `dst` to zero, queued on the compute stream. */
void tsr_cuda_k_zero(void *dst, size_t bytes);
/* dst[idx] = src[idx] over `shape`, strides in elements (any sign), bit copies of elem_size
 * (1, 2, 4, 8) bytes, queued on the compute stream; dst and src must not overlap. ndim 0 copies
 * one element; a zero-size dim copies nothing. Dims that are contiguous on both sides are merged
 * first, and a copy that is contiguous after merging is a cudaMemcpyAsync. Bad arguments (ndim
 * outside 0..TSR_MAX_DIMS, a negative size, another elem_size, a pointer not aligned to
 * elem_size) are kept as TSR_EINVAL. */
void tsr_cuda_k_copy_strided(void *dst, const int64_t *dst_stride, const void *src,
                             const int64_t *src_stride, const int64_t *shape, int ndim,
                             size_t elem_size);
/* out[i] = a[i] + b[i] in f32 with one rounding (__fadd_rn), as the CPU's; out may be a. */
void tsr_cuda_k_add(float *out, const float *a, const float *b, int64_t n);
/* Waits for the current context's streams and returns the first failure kept since the last
 * sync; an error kept with no context current (tsr_cuda_try_ctx) comes first. With no context
 * current: TSR_EINVAL naming that. */
tsr_status tsr_cuda_k_sync(void);

#ifdef __cplusplus
}
#endif
#endif
