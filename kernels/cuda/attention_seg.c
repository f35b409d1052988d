/* Attention with segment ids (document masking, tessera/kernels.h) is not written for CUDA yet:
 * these entries refuse with a message, so that a document-masked job on a GPU stops at its first
 * attention instead of computing plain causal attention. */
#include "misc.h"

static tsr_status refuse(const char *what) {
  return TSR_ERROR(TSR_ENOTSUP,
                   "%s: attention with segment ids ([data] mask = document) has no CUDA kernel "
                   "yet; run the job with [job] device = cpu or [data] mask = causal",
                   what);
}

tsr_status tsr_cuda_k_attention_forward_seg(float *out, float *lse, const float *q, const float *k,
                                            const float *v, const int32_t *q_pos,
                                            const int32_t *k_pos, const int32_t *q_seg,
                                            const int32_t *k_seg, int B, int Hq, int Hkv, int Lq,
                                            int Lk, int D, bool causal) {
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)q_pos, (void)k_pos, (void)q_seg;
  (void)k_seg, (void)B, (void)Hq, (void)Hkv, (void)Lq, (void)Lk, (void)D, (void)causal;
  return refuse("attention forward");
}

tsr_status tsr_cuda_k_attention_forward_seg_blhd(float *out, float *lse, const float *q,
                                                 const float *k, const float *v,
                                                 const int32_t *q_pos, const int32_t *k_pos,
                                                 const int32_t *q_seg, const int32_t *k_seg, int B,
                                                 int Hq, int Hkv, int Lq, int Lk, int D,
                                                 bool causal) {
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)q_pos, (void)k_pos, (void)q_seg;
  (void)k_seg, (void)B, (void)Hq, (void)Hkv, (void)Lq, (void)Lk, (void)D, (void)causal;
  return refuse("attention forward");
}

tsr_status tsr_cuda_k_attention_backward_seg(float *dq, float *dk, float *dv, const float *dout,
                                             const float *q, const float *k, const float *v,
                                             const float *out, const float *lse,
                                             const int32_t *q_pos, const int32_t *k_pos,
                                             const int32_t *q_seg, const int32_t *k_seg, int B,
                                             int Hq, int Hkv, int Lq, int Lk, int D, bool causal) {
  (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
  (void)q_pos, (void)k_pos, (void)q_seg, (void)k_seg, (void)B, (void)Hq, (void)Hkv, (void)Lq;
  (void)Lk, (void)D, (void)causal;
  return refuse("attention backward");
}

tsr_status tsr_cuda_k_attention_backward_seg_blhd(float *dq, float *dk, float *dv,
                                                  const float *dout, const float *q, const float *k,
                                                  const float *v, const float *out,
                                                  const float *lse, const int32_t *q_pos,
                                                  const int32_t *k_pos, const int32_t *q_seg,
                                                  const int32_t *k_seg, int B, int Hq, int Hkv,
                                                  int Lq, int Lk, int D, bool causal) {
  (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse;
  (void)q_pos, (void)k_pos, (void)q_seg, (void)k_seg, (void)B, (void)Hq, (void)Hkv, (void)Lq;
  (void)Lk, (void)D, (void)causal;
  return refuse("attention backward");
}
