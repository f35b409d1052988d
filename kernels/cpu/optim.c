/* AdamW and global-norm gradient clipping. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "tessera/kernels.h"

/* One step of torch.optim.AdamW's single-tensor path (foreach=False, amsgrad=False), rounded the
 * same way, so that a run can be compared with PyTorch bit for bit where the platform allows:
 *
 *   param.mul_(1 - lr * weight_decay)
 *   exp_avg.lerp_(grad, 1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   bias_correction1 = 1 - beta1 ** step
 *   bias_correction2 = 1 - beta2 ** step
 *   step_size = lr / bias_correction1
 *   bias_correction2_sqrt = sqrt(bias_correction2)
 *   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 *
 * Scalars (1 - lr·wd, the bias corrections, step_size) are Python floats, i.e. double, and each is
 * rounded to f32 only where torch's kernel converts it to the tensor's dtype. Element-wise:
 *  - lerp with weight w < 0.5 is m + w·(g − m) evaluated as one fused multiply-add (torch's
 *    vectorised CPU lerp), and g − (1 − w)·(g − m) otherwise;
 *  - addcmul is v + (value·g)·g, addcdiv is p + (value·m) / denom, in that association. */
typedef struct adamw_args {
  float *param, *m, *v;
  const float *grad;
  float decay, w1, b2, w2, neg_step_size, bias_correction2_sqrt, eps;
  bool small_weight;
} adamw_args;

TSR_VECTOR_CLONES static void adamw_range(void *ctx, int64_t begin, int64_t end) {
  const adamw_args *a = ctx;
  float *restrict param = a->param, *restrict m = a->m, *restrict v = a->v;
  const float *restrict grad = a->grad;
  const float decay = a->decay, w1 = a->w1, b2 = a->b2, w2 = a->w2;
  const float neg_step_size = a->neg_step_size, bc2 = a->bias_correction2_sqrt, eps = a->eps;
  if (a->small_weight) {
    for (int64_t i = begin; i < end; i++) {
      float p = param[i] * decay;
      float g = grad[i];
      float mi = fmaf(w1, g - m[i], m[i]);
      float vi = v[i] * b2;
      vi = vi + (w2 * g) * g;
      float denom = sqrtf(vi) / bc2 + eps;
      param[i] = p + (neg_step_size * mi) / denom;
      m[i] = mi;
      v[i] = vi;
    }
  } else {
    for (int64_t i = begin; i < end; i++) {
      float p = param[i] * decay;
      float g = grad[i];
      float mi = fmaf(w1 - 1.0f, g - m[i], g);
      float vi = v[i] * b2;
      vi = vi + (w2 * g) * g;
      float denom = sqrtf(vi) / bc2 + eps;
      param[i] = p + (neg_step_size * mi) / denom;
      m[i] = mi;
      v[i] = vi;
    }
  }
}

void tsr_kernel_adamw(float *param, const float *grad, float *m, float *v, int64_t n, int step,
                      double lr, double beta1, double beta2, double eps, double weight_decay) {
  int64_t t0 = tsr_profile_begin();
  double bias_correction1 = 1.0 - pow(beta1, step);
  double bias_correction2 = 1.0 - pow(beta2, step);
  float w1 = (float)(1.0 - beta1);
  adamw_args a = {.param = param,
                  .m = m,
                  .v = v,
                  .grad = grad,
                  .decay = (float)(1.0 - lr * weight_decay),
                  .w1 = w1,
                  .b2 = (float)beta2,
                  .w2 = (float)(1.0 - beta2),
                  .neg_step_size = (float)(-(lr / bias_correction1)),
                  .bias_correction2_sqrt = (float)sqrt(bias_correction2),
                  .eps = (float)eps,
                  .small_weight = fabsf(w1) < 0.5f};
  /* Element-wise: any split gives the same values. */
  tsr_parallel_for(n, 1 << 15, adamw_range, &a);
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
}

/* Sums of squares go by fixed blocks of this many values, block sums added in block order: the
 * result depends on n only, not on the thread count. */
#define TSR_SQ_BLOCK (1 << 15)

typedef struct sq_args {
  const float *x;
  int64_t n;
  double *block_sums;
} sq_args;

TSR_VECTOR_CLONES static void sq_blocks(void *ctx, int64_t begin, int64_t end) {
  const sq_args *a = ctx;
  for (int64_t blk = begin; blk < end; blk++) {
    const float *restrict x = a->x + blk * TSR_SQ_BLOCK;
    int64_t len =
        a->n - blk * TSR_SQ_BLOCK < TSR_SQ_BLOCK ? a->n - blk * TSR_SQ_BLOCK : TSR_SQ_BLOCK;
    /* 8 lanes in a fixed pattern: the same additions in the same order on every machine. */
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
      for (int k = 0; k < 8; k++) lane[k] += (double)x[i + k] * x[i + k];
    double s = 0.0;
    for (; i < len; i++) s += (double)x[i] * x[i];
    for (int k = 0; k < 8; k++) s += lane[k];
    a->block_sums[blk] = s;
  }
}

static double sum_squares_impl(const float *x, int64_t n) {
  if (n <= 0) return 0.0;
  int64_t nblk = (n + TSR_SQ_BLOCK - 1) / TSR_SQ_BLOCK;
  double stack_sums[256];
  double *sums = nblk <= 256 ? stack_sums : malloc(sizeof(double) * (size_t)nblk);
  sq_args a = {x, n, sums};
  if (sums == NULL) { /* no memory for the block sums: the same blocks, one at a time */
    double s = 0.0, one;
    a.block_sums = &one;
    for (int64_t blk = 0; blk < nblk; blk++) {
      a.x = x + blk * TSR_SQ_BLOCK;
      a.n = n - blk * TSR_SQ_BLOCK;
      sq_blocks(&a, 0, 1);
      s += one;
    }
    return s;
  }
  tsr_parallel_for(nblk, 1, sq_blocks, &a);
  double s = 0.0;
  for (int64_t blk = 0; blk < nblk; blk++) s += sums[blk];
  if (sums != stack_sums) free(sums);
  return s;
}

double tsr_kernel_sum_squares(const float *x, int64_t n) {
  int64_t t0 = tsr_profile_begin();
  double r = sum_squares_impl(x, n);
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
  return r;
}

static double global_norm_impl(const float *const *bufs, const int64_t *sizes, int nbufs) {
  double s = 0.0;
  for (int b = 0; b < nbufs; b++) s += tsr_kernel_sum_squares(bufs[b], sizes[b]);
  return sqrt(s);
}

double tsr_kernel_global_norm(const float *const *bufs, const int64_t *sizes, int nbufs) {
  int64_t t0 = tsr_profile_begin();
  double r = global_norm_impl(bufs, sizes, nbufs);
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
  return r;
}

float tsr_kernel_clip_coef(double total_norm, double max_norm) {
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? (float)c : 1.0f;
}

typedef struct scale_args {
  float *x;
  float s;
} scale_args;

static void scale_range(void *ctx, int64_t begin, int64_t end) {
  const scale_args *a = ctx;
  for (int64_t i = begin; i < end; i++) a->x[i] *= a->s;
}

void tsr_kernel_scale(float *x, int64_t n, float s) {
  int64_t t0 = tsr_profile_begin();
  tsr_parallel_for(n, 1 << 16, scale_range, &(scale_args){x, s});
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
}
