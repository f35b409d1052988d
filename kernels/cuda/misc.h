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

#ifdef __cplusplus
}
#endif
#endif
