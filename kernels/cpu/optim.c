/* AdamW and global-norm gradient clipping. */
#include <math.h>

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
void tsr_kernel_adamw(float *param, const float *grad, float *m, float *v, int64_t n, int step,
                      double lr, double beta1, double beta2, double eps, double weight_decay) {
  int64_t t0 = tsr_profile_begin();
  float decay = (float)(1.0 - lr * weight_decay);
  float w1 = (float)(1.0 - beta1);
  float b2 = (float)beta2;
  float w2 = (float)(1.0 - beta2);
  double bias_correction1 = 1.0 - pow(beta1, step);
  double bias_correction2 = 1.0 - pow(beta2, step);
  float neg_step_size = (float)(-(lr / bias_correction1));
  float bias_correction2_sqrt = (float)sqrt(bias_correction2);
  float epsf = (float)eps;
  bool small_weight = fabsf(w1) < 0.5f;
  for (int64_t i = 0; i < n; i++) {
    float p = param[i] * decay;
    float g = grad[i];
    float mi = small_weight ? fmaf(w1, g - m[i], m[i]) : fmaf(w1 - 1.0f, g - m[i], g);
    float vi = v[i] * b2;
    vi = vi + (w2 * g) * g;
    float denom = sqrtf(vi) / bias_correction2_sqrt + epsf;
    param[i] = p + (neg_step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
}

static double sum_squares_impl(const float *x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
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

void tsr_kernel_scale(float *x, int64_t n, float s) {
  int64_t t0 = tsr_profile_begin();
  for (int64_t i = 0; i < n; i++) x[i] *= s;
  tsr_profile_end(TSR_KERNEL_OPTIM, t0);
}
