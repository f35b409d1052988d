/* The optimizer: AdamW as torch.optim.AdamW, global-norm clipping as clip_grad_norm_, and the
 * learning-rate schedule.
 *
 * Everything here works on each rank's local tensors. A parameter and its (resolved) gradient are
 * DTensors with identical placements, so the update is element-wise on the local shards and
 * needs no communication; only the gradient norm is collective.
 */
#ifndef TESSERA_OPTIM_H
#define TESSERA_OPTIM_H

#include <stdint.h>

#include "tessera/autograd.h"
#include "tessera/config.h"
#include "tessera/dtensor.h"
#include "tessera/rank.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AdamW ---- */

/* Hyper-parameters of torch.optim.AdamW with one parameter group (amsgrad=False). */
typedef struct tsr_adamw_config {
  double beta1, beta2, eps, weight_decay;
} tsr_adamw_config;

typedef struct tsr_adamw_t tsr_adamw_t;

/* An optimizer over `n` parameters (borrowed; they must outlive it). Its state, exp_avg and
 * exp_avg_sq, is one zeroed DTensor per parameter with the parameter's global shape, mesh and
 * placements, allocated from r's allocator; the step counter starts at 0. Every parameter must
 * be f32 with a contiguous local tensor. */
tsr_status tsr_adamw_new(tsr_rank_t *r, int n, tsr_var *const *params, const tsr_adamw_config *cfg,
                         tsr_adamw_t **out);
/* NULL is a no-op. */
void tsr_adamw_free(tsr_adamw_t *o);

/* One step at learning rate `lr`: increments the step counter, then updates every parameter from
 * its gradient (tsr_kernel_adamw on the local shards). Each gradient must already be resolved to
 * its parameter's placements (tsr_var_resolve_grad); a missing or differently placed gradient is
 * TSR_EINVAL naming the parameter. Ranks that hold no shard of a parameter skip it. */
tsr_status tsr_adamw_step(tsr_adamw_t *o, double lr);

/* Steps taken so far (torch's state["step"]); set it when loading a checkpoint. */
int64_t tsr_adamw_get_step(const tsr_adamw_t *o);
void tsr_adamw_set_step(tsr_adamw_t *o, int64_t step);
int tsr_adamw_param_count(const tsr_adamw_t *o);
/* The state of parameter i (owned by the optimizer; write into its local tensor to load). */
tsr_dtensor *tsr_adamw_exp_avg(tsr_adamw_t *o, int i);
tsr_dtensor *tsr_adamw_exp_avg_sq(tsr_adamw_t *o, int i);

/* ---- Gradient norm and clipping ---- */

/* The 2-norm of all `n` gradients taken together, as clip_grad_norm_ computes it over the full
 * tensors, the same on every rank whatever the mesh. Each rank sums the squares of its local
 * shards in double; the sums are combined over the mesh dims on which a gradient is Shard and
 * taken once along dims on which it is Replicate. A Partial gradient on a dim of size > 1 has
 * not been resolved and is TSR_EINVAL naming the parameter and the dim. Parameters whose mesh
 * omits a dim of `job_mesh` (pipeline stages: tsr_mesh_unbound_dim) hold different tensors
 * along it, so the squares are also summed over that dim of `job_mesh` (may be NULL). Collective
 * over every rank of the parameters' meshes, in the same order on every rank. */
tsr_status tsr_grad_norm(tsr_rank_t *r, const tsr_mesh_t *job_mesh, int n, tsr_var *const *params,
                         double *norm);

/* clip_grad_norm_(params, max_norm): computes the norm as tsr_grad_norm does, then scales every
 * gradient by tsr_kernel_clip_coef(norm, max_norm) when that is below 1. max_norm <= 0 disables
 * the scaling (the norm is still computed, for the log). *norm gets the norm before clipping. */
tsr_status tsr_clip_grad_norm(tsr_rank_t *r, const tsr_mesh_t *job_mesh, int n,
                              tsr_var *const *params, double max_norm, double *norm);

/* ---- Learning-rate schedule ---- */

typedef struct tsr_lr_config {
  tsr_lr_schedule kind; /* TSR_LR_CONSTANT or TSR_LR_COSINE (tessera/config.h) */
  double lr;            /* peak rate */
  double min_lr;        /* end of the cosine */
  int64_t warmup_steps;
  int64_t total_steps; /* the step at which the cosine reaches min_lr */
} tsr_lr_config;

/* The rate of optimizer step `step` (1-based), as docs/training.md defines it: with W warmup steps
 * and T total steps,
 *   step <= W:          lr * step / W
 *   constant, step > W: lr
 *   cosine,   step > W: min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2, p = min(1, (step - W) / (T
 * - W)) Steps past T stay at min_lr. */
double tsr_lr_at(const tsr_lr_config *c, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
