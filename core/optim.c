/* AdamW, global-norm clipping and the learning-rate schedule over DTensor parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_table.h"
#include "tessera/kernels.h"
#include "tessera/optim.h"

#define TSR_PI 3.14159265358979323846

struct tsr_adamw_t {
  tsr_rank_t *rank;
  tsr_adamw_config cfg;
  int n;
  tsr_var **params;      /* (n) borrowed */
  tsr_dtensor **exp_avg; /* (n) NULL where this rank holds no shard */
  tsr_dtensor **exp_avg_sq;
  int64_t step;
};

static const char *param_name(const tsr_var *p, int i, char *buf, size_t len) {
  if (p->name) return p->name;
  snprintf(buf, len, "parameter %d", i);
  return buf;
}

/* A zeroed DTensor shaped and placed like `like`. */
static tsr_status state_like(tsr_rank_t *r, const tsr_dtensor *like, tsr_dtensor **out) {
  tsr_tensor *local = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, like->local->ndim, like->local->shape,
                           &local));
  tsr_status st = tsr_dtensor_from_local(r, like->mesh, local, like->shape, like->placements, out);
  if (st != TSR_OK) tsr_tensor_free(local);
  return st;
}

tsr_status tsr_adamw_new(tsr_rank_t *r, int n, tsr_var *const *params, const tsr_adamw_config *cfg,
                         tsr_adamw_t **out) {
  *out = NULL;
  if (n < 0 || (n > 0 && !params))
    return TSR_ERROR(TSR_EINVAL, "adamw: %d parameters and params %p", n, (const void *)params);
  /* eps = 0 divides 0 by 0 for a parameter whose gradient is 0 on the first step: NaN weights */
  if (!cfg || !(cfg->eps > 0) || !isfinite(cfg->eps))
    return TSR_ERROR(TSR_EINVAL, "adamw: eps is %g; it must be a finite number > 0 (e.g. 1e-8)",
                     cfg ? cfg->eps : 0.0);
  tsr_adamw_t *o = calloc(1, sizeof *o);
  if (!o) return TSR_ERROR(TSR_ENOMEM, "adamw: out of memory");
  tsr_status st = TSR_OK;
  o->rank = r;
  o->cfg = *cfg;
  o->n = n;
  o->params = calloc((size_t)n + 1, sizeof *o->params);
  o->exp_avg = calloc((size_t)n + 1, sizeof *o->exp_avg);
  o->exp_avg_sq = calloc((size_t)n + 1, sizeof *o->exp_avg_sq);
  if (!o->params || !o->exp_avg || !o->exp_avg_sq) {
    st = TSR_ERROR(TSR_ENOMEM, "adamw: out of memory for %d parameters", n);
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    char buf[32];
    const tsr_var *p = params[i];
    o->params[i] = params[i];
    const tsr_dtensor *v = p->value;
    if (!v->local) continue;
    if (v->dtype != TSR_F32 || !tsr_tensor_is_contiguous(v->local)) {
      st = TSR_ERROR(TSR_EINVAL,
                     "adamw: %s is %s%s; the optimizer updates contiguous f32 parameters only",
                     param_name(p, i, buf, sizeof buf), tsr_dtype_name(v->dtype),
                     tsr_tensor_is_contiguous(v->local) ? "" : " and not contiguous");
      goto cleanup;
    }
    TSR_CHECK_GOTO(state_like(r, v, &o->exp_avg[i]), st);
    TSR_CHECK_GOTO(state_like(r, v, &o->exp_avg_sq[i]), st);
  }
  *out = o;
  return TSR_OK;
cleanup:
  tsr_adamw_free(o);
  return st;
}

void tsr_adamw_free(tsr_adamw_t *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) {
    if (o->exp_avg) tsr_dtensor_free(o->exp_avg[i]);
    if (o->exp_avg_sq) tsr_dtensor_free(o->exp_avg_sq[i]);
  }
  free(o->params);
  free(o->exp_avg);
  free(o->exp_avg_sq);
  free(o);
}

/* The gradient of parameter i, checked to sit exactly on the parameter's shards. */
static tsr_status checked_grad(const tsr_var *p, int i, const tsr_tensor **g) {
  char buf[32], pa[16], pb[16];
  const char *name = param_name(p, i, buf, sizeof buf);
  const tsr_dtensor *v = p->value, *gr = p->grad;
  if (!gr || !gr->local)
    return TSR_ERROR(TSR_EINVAL,
                     "%s has no gradient on this rank; run backward and tsr_var_resolve_grad "
                     "before the optimizer step",
                     name);
  if (gr->mesh != v->mesh && !tsr_mesh_equal(gr->mesh, v->mesh))
    return TSR_ERROR(TSR_EINVAL, "gradient of %s is on another mesh than the parameter", name);
  for (int d = 0; d < tsr_mesh_ndim(v->mesh); d++)
    if (!tsr_placement_equal(gr->placements[d], v->placements[d]))
      return TSR_ERROR(TSR_EINVAL,
                       "gradient of %s is %s on mesh dim %s but the parameter is %s; resolve it "
                       "with tsr_var_resolve_grad first",
                       name, tsr_placement_str(gr->placements[d], pa, sizeof pa),
                       tsr_mesh_dim_name(v->mesh, d),
                       tsr_placement_str(v->placements[d], pb, sizeof pb));
  if (gr->dtype != TSR_F32 || tsr_tensor_numel(gr->local) != tsr_tensor_numel(v->local) ||
      !tsr_tensor_is_contiguous(gr->local))
    return TSR_ERROR(TSR_EINVAL,
                     "gradient of %s: local tensor is %s with %lld elements%s, parameter shard has "
                     "%lld f32 elements",
                     name, tsr_dtype_name(gr->dtype), (long long)tsr_tensor_numel(gr->local),
                     tsr_tensor_is_contiguous(gr->local) ? "" : " (not contiguous)",
                     (long long)tsr_tensor_numel(v->local));
  *g = gr->local;
  return TSR_OK;
}

tsr_status tsr_adamw_step(tsr_adamw_t *o, double lr) {
  /* Check every gradient before touching any parameter, so a failed step changes nothing. */
  for (int i = 0; i < o->n; i++) {
    const tsr_tensor *g;
    if (o->params[i]->value->local) TSR_CHECK(checked_grad(o->params[i], i, &g));
  }
  o->step++;
  for (int i = 0; i < o->n; i++) {
    tsr_var *p = o->params[i];
    if (!p->value->local) continue;
    const tsr_tensor *g = p->grad->local;
    tsr_kernel_table_of(g)->adamw(
        tsr_tensor_data(p->value->local), tsr_tensor_data(g), tsr_tensor_data(o->exp_avg[i]->local),
        tsr_tensor_data(o->exp_avg_sq[i]->local), tsr_tensor_numel(g), (int)o->step, lr,
        o->cfg.beta1, o->cfg.beta2, o->cfg.eps, o->cfg.weight_decay);
  }
  return TSR_OK;
}

int64_t tsr_adamw_get_step(const tsr_adamw_t *o) {
  return o->step;
}

void tsr_adamw_set_step(tsr_adamw_t *o, int64_t step) {
  o->step = step;
}

int tsr_adamw_param_count(const tsr_adamw_t *o) {
  return o->n;
}

tsr_dtensor *tsr_adamw_exp_avg(tsr_adamw_t *o, int i) {
  return i >= 0 && i < o->n ? o->exp_avg[i] : NULL;
}

tsr_dtensor *tsr_adamw_exp_avg_sq(tsr_adamw_t *o, int i) {
  return i >= 0 && i < o->n ? o->exp_avg_sq[i] : NULL;
}

/* ---- Gradient norm ---- */

/* Squares of the gradients that reduce over the same ranks: one mesh, one set of Shard dims. */
typedef struct norm_part {
  const tsr_mesh_t *mesh;
  uint32_t mask;
  double sum;
} norm_part;

/* Σ over the members of g of each member's `x`, added in member order so that every member gets
 * the same bits. The values travel as their bit patterns: the collectives have no f64. */
static tsr_status sum_over_group(tsr_group_t *g, double *x) {
  int n = tsr_group_size(g);
  if (n == 1) return TSR_OK;
  int64_t *all = malloc((size_t)n * sizeof *all);
  if (!all) return TSR_ERROR(TSR_ENOMEM, "grad norm: out of memory for %d ranks", n);
  int64_t mine;
  memcpy(&mine, x, sizeof mine);
  tsr_status st = tsr_comm_all_gather(g, &mine, 1, all, NULL, TSR_I64);
  if (st == TSR_OK) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
      double v;
      memcpy(&v, &all[i], sizeof v);
      s += v;
    }
    *x = s;
  }
  free(all);
  return st;
}

tsr_status tsr_grad_norm(tsr_rank_t *r, const tsr_mesh_t *job_mesh, int n, tsr_var *const *params,
                         double *norm) {
  *norm = 0.0;
  norm_part *parts = calloc((size_t)n + 1, sizeof *parts);
  if (!parts) return TSR_ERROR(TSR_ENOMEM, "grad norm: out of memory");
  tsr_status st = TSR_OK;
  int nparts = 0;
  uint32_t job_mask = 0;
  for (int i = 0; i < n; i++) {
    const tsr_var *p = params[i];
    const tsr_mesh_t *mesh = p->value->mesh;
    const char *unbound = tsr_mesh_unbound_dim(mesh);
    int jd = job_mesh && unbound ? tsr_mesh_find_dim(job_mesh, unbound) : -1;
    if (jd >= 0 && tsr_mesh_dim_size(job_mesh, jd) > 1) job_mask |= 1u << jd;
    if (!p->value->local) continue;
    char buf[32], pl[16];
    const tsr_dtensor *g = p->grad;
    if (!g || !g->local) {
      st = TSR_ERROR(TSR_EINVAL, "grad norm: %s has no gradient on this rank",
                     param_name(p, i, buf, sizeof buf));
      goto cleanup;
    }
    uint32_t mask = 0;
    for (int d = 0; d < tsr_mesh_ndim(g->mesh); d++) {
      if (tsr_mesh_dim_size(g->mesh, d) == 1) continue;
      if (g->placements[d].kind == TSR_PARTIAL) {
        st = TSR_ERROR(TSR_EINVAL,
                       "grad norm: gradient of %s is still %s on mesh dim %s; resolve it with "
                       "tsr_var_resolve_grad before clipping",
                       param_name(p, i, buf, sizeof buf),
                       tsr_placement_str(g->placements[d], pl, sizeof pl),
                       tsr_mesh_dim_name(g->mesh, d));
        goto cleanup;
      }
      if (g->placements[d].kind == TSR_SHARD) mask |= 1u << d;
    }
    if (g->dtype != TSR_F32 || !tsr_tensor_is_contiguous(g->local)) {
      st = TSR_ERROR(TSR_EINVAL, "grad norm: gradient of %s is not a contiguous f32 tensor",
                     param_name(p, i, buf, sizeof buf));
      goto cleanup;
    }
    int k = 0;
    while (k < nparts && !(parts[k].mask == mask && parts[k].mesh == g->mesh)) k++;
    if (k == nparts) parts[nparts++] = (norm_part){g->mesh, mask, 0.0};
    parts[k].sum += tsr_kernel_table_of(g->local)->sum_squares(tsr_tensor_data(g->local),
                                                               tsr_tensor_numel(g->local));
  }
  double total = 0.0;
  for (int k = 0; k < nparts; k++) {
    if (parts[k].mask) {
      tsr_group_t *grp;
      TSR_CHECK_GOTO(tsr_mesh_group(parts[k].mesh, tsr_rank_comm(r), parts[k].mask, &grp), st);
      TSR_CHECK_GOTO(sum_over_group(grp, &parts[k].sum), st);
    }
    total += parts[k].sum;
  }
  if (job_mask) {
    tsr_group_t *grp;
    TSR_CHECK_GOTO(tsr_mesh_group(job_mesh, tsr_rank_comm(r), job_mask, &grp), st);
    TSR_CHECK_GOTO(sum_over_group(grp, &total), st);
  }
  *norm = sqrt(total);
cleanup:
  free(parts);
  return st;
}

tsr_status tsr_clip_grad_norm(tsr_rank_t *r, const tsr_mesh_t *job_mesh, int n,
                              tsr_var *const *params, double max_norm, double *norm) {
  TSR_CHECK(tsr_grad_norm(r, job_mesh, n, params, norm));
  if (max_norm <= 0.0) return TSR_OK;
  float coef = tsr_kernel_clip_coef(*norm, max_norm);
  /* torch multiplies by the clamped coefficient even when it is 1; x * 1.0f is x, so skip it. */
  if (coef >= 1.0f) return TSR_OK;
  for (int i = 0; i < n; i++) {
    tsr_dtensor *g = params[i]->grad;
    if (g && g->local)
      tsr_kernel_table_of(g->local)->scale(tsr_tensor_data(g->local), tsr_tensor_numel(g->local),
                                           coef);
  }
  return TSR_OK;
}

/* ---- Schedule ---- */

double tsr_lr_at(const tsr_lr_config *c, int64_t step) {
  int64_t w = c->warmup_steps;
  if (w > 0 && step <= w) return c->lr * (double)step / (double)w;
  if (c->kind == TSR_LR_CONSTANT) return c->lr;
  int64_t span = c->total_steps - w;
  if (span <= 0) return c->min_lr;
  double p = (double)(step - w) / (double)span;
  if (p > 1.0) p = 1.0;
  return c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(TSR_PI * p));
}
