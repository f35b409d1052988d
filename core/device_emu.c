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
#define R(p) ((__typeof__(p))real(p))

bool tsr_emu_owns(const void *p) {
  return ((uintptr_t)p & EMU_TAG) != 0;
}

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
  tsr_add_host(R(out), R(a), R(b), n);
}
static tsr_status emu_sync(void) {
  return TSR_OK;
}

/* ---- kernels: strip the tag, call the CPU kernel ---- */

static void emu_gemm(float *c, const float *a, const float *b, int M, int N, int K, bool ta,
                     bool tb, float alpha, float beta) {
  tsr_kernel_gemm(R(c), R(a), R(b), M, N, K, ta, tb, alpha, beta);
}
static void emu_matmul_forward(float *out, const float *x, const float *w, const float *bias, int N,
                               int C, int OC) {
  tsr_kernel_matmul_forward(R(out), R(x), R(w), R(bias), N, C, OC);
}
static void emu_matmul_backward(float *dx, float *dw, float *dbias, const float *dout,
                                const float *x, const float *w, int N, int C, int OC) {
  tsr_kernel_matmul_backward(R(dx), R(dw), R(dbias), R(dout), R(x), R(w), N, C, OC);
}
static tsr_status emu_matmul_forward_bf16(float *out, const float *x, const float *w,
                                          const float *bias, int N, int C, int OC) {
  return tsr_kernel_matmul_forward_bf16(R(out), R(x), R(w), R(bias), N, C, OC);
}
static tsr_status emu_matmul_backward_bf16(float *dx, float *dw, float *dbias, const float *dout,
                                           const float *x, const float *w, int N, int C, int OC) {
  return tsr_kernel_matmul_backward_bf16(R(dx), R(dw), R(dbias), R(dout), R(x), R(w), N, C, OC);
}
static void emu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                                int C, float eps) {
  tsr_kernel_rmsnorm_forward(R(out), R(rstd), R(x), R(w), N, C, eps);
}
static void emu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                 const float *w, const float *rstd, int N, int C) {
  tsr_kernel_rmsnorm_backward(R(dx), R(dw), R(dout), R(x), R(w), R(rstd), N, C);
}
static tsr_status emu_rope_tables(float *cos_t, float *sin_t, const int32_t *pos, int L, int D,
                                  float theta) {
  return tsr_kernel_rope_tables(R(cos_t), R(sin_t), R(pos), L, D, theta);
}
static void emu_rope_forward(float *out, const float *x, const float *cos_t, const float *sin_t,
                             int B, int L, int H, int D) {
  tsr_kernel_rope_forward(R(out), R(x), R(cos_t), R(sin_t), B, L, H, D);
}
static void emu_rope_backward(float *dx, const float *dout, const float *cos_t, const float *sin_t,
                              int B, int L, int H, int D) {
  tsr_kernel_rope_backward(R(dx), R(dout), R(cos_t), R(sin_t), B, L, H, D);
}
static void emu_blhd_to_bhld(float *out, const float *x, int B, int L, int H, int D) {
  tsr_kernel_blhd_to_bhld(R(out), R(x), B, L, H, D);
}
static void emu_bhld_to_blhd(float *out, const float *x, int B, int L, int H, int D) {
  tsr_kernel_bhld_to_blhd(R(out), R(x), B, L, H, D);
}
static void emu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
  tsr_kernel_swiglu_forward(R(out), R(gate), R(up), n);
}
static void emu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, int64_t n) {
  tsr_kernel_swiglu_backward(R(dgate), R(dup), R(dout), R(gate), R(up), n);
}
static tsr_status emu_embedding_forward(float *out, const int32_t *ids, const float *table, int N,
                                        int V, int C) {
  return tsr_kernel_embedding_forward(R(out), R(ids), R(table), N, V, C);
}
static tsr_status emu_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                         int N, int V, int C) {
  return tsr_kernel_embedding_backward(R(dtable), R(dout), R(ids), N, V, C);
}
/* loss and n_valid are host values, as on every device table. */
static tsr_status emu_cross_entropy(float *loss, int *n_valid, float *dlogits, const float *logits,
                                    const int32_t *targets, int N, int V, float dloss) {
  return tsr_kernel_cross_entropy(loss, n_valid, R(dlogits), R(logits), R(targets), N, V, dloss);
}
static void emu_logits_row_max(float *row_max, const float *logits, int N, int Vl) {
  tsr_kernel_logits_row_max(R(row_max), R(logits), N, Vl);
}
static void emu_logits_row_sumexp(float *sumexp, const float *logits, const float *row_max, int N,
                                  int Vl) {
  tsr_kernel_logits_row_sumexp(R(sumexp), R(logits), R(row_max), N, Vl);
}
static void emu_logits_target(float *target_logit, const float *logits, const int32_t *targets,
                              int N, int Vl, int vocab_start) {
  tsr_kernel_logits_target(R(target_logit), R(logits), R(targets), N, Vl, vocab_start);
}
static void emu_cross_entropy_shard_backward(float *dlogits, const float *logits,
                                             const int32_t *targets, const float *row_max,
                                             const float *sumexp, int N, int Vl, int vocab_start,
                                             float scale) {
  tsr_kernel_cross_entropy_shard_backward(R(dlogits), R(logits), R(targets), R(row_max), R(sumexp),
                                          N, Vl, vocab_start, scale);
}
static tsr_status emu_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *q_pos, const int32_t *k_pos,
                                        int B, int Hq, int Hkv, int Lq, int Lk, int D,
                                        bool causal) {
  return tsr_kernel_attention_forward(R(out), R(lse), R(q), R(k), R(v), R(q_pos), R(k_pos), B, Hq,
                                      Hkv, Lq, Lk, D, causal);
}
static tsr_status emu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *out, const float *lse, const int32_t *q_pos,
                                         const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                         int Lk, int D, bool causal) {
  return tsr_kernel_attention_backward(R(dq), R(dk), R(dv), R(dout), R(q), R(k), R(v), R(out),
                                       R(lse), R(q_pos), R(k_pos), B, Hq, Hkv, Lq, Lk, D, causal);
}
static tsr_status emu_attention_forward_blhd(float *out, float *lse, const float *q, const float *k,
                                             const float *v, const int32_t *q_pos,
                                             const int32_t *k_pos, int B, int Hq, int Hkv, int Lq,
                                             int Lk, int D, bool causal) {
  return tsr_kernel_attention_forward_blhd(R(out), R(lse), R(q), R(k), R(v), R(q_pos), R(k_pos), B,
                                           Hq, Hkv, Lq, Lk, D, causal);
}
static tsr_status emu_attention_backward_blhd(float *dq, float *dk, float *dv, const float *dout,
                                              const float *q, const float *k, const float *v,
                                              const float *out, const float *lse,
                                              const int32_t *q_pos, const int32_t *k_pos, int B,
                                              int Hq, int Hkv, int Lq, int Lk, int D, bool causal) {
  return tsr_kernel_attention_backward_blhd(R(dq), R(dk), R(dv), R(dout), R(q), R(k), R(v), R(out),
                                            R(lse), R(q_pos), R(k_pos), B, Hq, Hkv, Lq, Lk, D,
                                            causal);
}
static void emu_attention_merge(float *out, float *lse, const float *out_a, const float *lse_a,
                                const float *out_b, const float *lse_b, int R_, int D) {
  tsr_kernel_attention_merge(R(out), R(lse), R(out_a), R(lse_a), R(out_b), R(lse_b), R_, D);
}
static void emu_adamw(float *param, const float *grad, float *m, float *v, int64_t n, int step,
                      double lr, double beta1, double beta2, double eps, double weight_decay) {
  tsr_kernel_adamw(R(param), R(grad), R(m), R(v), n, step, lr, beta1, beta2, eps, weight_decay);
}
static double emu_sum_squares(const float *x, int64_t n) {
  return tsr_kernel_sum_squares(R(x), n);
}
/* bufs is a host array naming device buffers. Unused by the core (it sums sum_squares per
 * parameter), kept so the table is complete; NaN when the translation cannot be allocated. */
static double emu_global_norm(const float *const *bufs, const int64_t *sizes, int nbufs) {
  const float **host = malloc((size_t)(nbufs > 0 ? nbufs : 1) * sizeof *host);
  if (!host) return __builtin_nan("");
  for (int i = 0; i < nbufs; i++) host[i] = R(bufs[i]);
  double r = tsr_kernel_global_norm(host, sizes, nbufs);
  free(host);
  return r;
}
static void emu_scale(float *x, int64_t n, float s) {
  tsr_kernel_scale(R(x), n, s);
}

static const tsr_kernel_table emu_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "emu",
    .device = TSR_DEVICE_EMU,
    .gemm = emu_gemm,
    .matmul_forward = emu_matmul_forward,
    .matmul_backward = emu_matmul_backward,
    .rmsnorm_forward = emu_rmsnorm_forward,
    .rmsnorm_backward = emu_rmsnorm_backward,
    .rope_tables = emu_rope_tables,
    .rope_forward = emu_rope_forward,
    .rope_backward = emu_rope_backward,
    .blhd_to_bhld = emu_blhd_to_bhld,
    .bhld_to_blhd = emu_bhld_to_blhd,
    .swiglu_forward = emu_swiglu_forward,
    .swiglu_backward = emu_swiglu_backward,
    .embedding_forward = emu_embedding_forward,
    .embedding_backward = emu_embedding_backward,
    .cross_entropy = emu_cross_entropy,
    .logits_row_max = emu_logits_row_max,
    .logits_row_sumexp = emu_logits_row_sumexp,
    .logits_target = emu_logits_target,
    .cross_entropy_shard_backward = emu_cross_entropy_shard_backward,
    .attention_forward = emu_attention_forward,
    .attention_backward = emu_attention_backward,
    .attention_forward_blhd = emu_attention_forward_blhd,
    .attention_backward_blhd = emu_attention_backward_blhd,
    .attention_merge = emu_attention_merge,
    .adamw = emu_adamw,
    .sum_squares = emu_sum_squares,
    .global_norm = emu_global_norm,
    .clip_coef = tsr_kernel_clip_coef,
    .scale = emu_scale,
    .owns = tsr_emu_owns,
    .allocator_init = emu_allocator_init,
    .allocator_release = emu_allocator_release,
    .copy_h2d = emu_copy_h2d,
    .copy_d2h = emu_copy_d2h,
    .copy_d2d = emu_copy_d2d,
    .zero = emu_zero,
    .copy_strided = emu_copy_strided,
    .add = emu_add,
    .sync = emu_sync,
    .matmul_forward_bf16 = emu_matmul_forward_bf16,
    .matmul_backward_bf16 = emu_matmul_backward_bf16,
};

const tsr_kernel_table *tsr_kernel_table_emu(void) {
  return &emu_table;
}
