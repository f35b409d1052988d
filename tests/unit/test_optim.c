/* Optimizer: AdamW against a double-precision transcription of torch.optim.AdamW over several
 * steps, clipping against a norm computed by hand, the global norm on 2- and 4-rank meshes with
 * Shard, Replicate and uneven shards against the 1-rank norm, and the learning-rate schedule.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/tessera.h"
#include "tessera/kernels.h"
#include "tessera/optim.h"

#define MAX_PARAMS 4

/* ---- helpers ---- */

static double grad_value(int param, int64_t i, int step) {
  return sin(0.7 * (double)i + 1.3 * param + 0.9 * step) * (0.5 + 0.25 * param);
}

/* A leaf var for the full tensor `full` placed on `mesh`. */
static tsr_status make_param(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_tensor *full,
                             const tsr_placement *pl, const char *name, tsr_var **out) {
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_dtensor_distribute(r, mesh, full, pl, &d));
  return tsr_var_new_leaf(d, true, name, out);
}

static tsr_status set_grad(tsr_rank_t *r, tsr_var *p, const tsr_tensor *full) {
  tsr_var_zero_grad(p);
  return tsr_dtensor_distribute(r, p->value->mesh, full, p->value->placements, &p->grad);
}

/* ---- AdamW against a double reference ---- */

typedef struct ref_adamw {
  double p[64], m[64], v[64];
} ref_adamw;

static void ref_step(ref_adamw *s, const double *g, int n, int step, double lr, double b1,
                     double b2, double eps, double wd) {
  double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
  for (int i = 0; i < n; i++) {
    s->p[i] *= 1.0 - lr * wd;
    s->m[i] = b1 * s->m[i] + (1.0 - b1) * g[i];
    s->v[i] = b2 * s->v[i] + (1.0 - b2) * g[i] * g[i];
    double denom = sqrt(s->v[i]) / sqrt(bc2) + eps;
    s->p[i] -= lr / bc1 * s->m[i] / denom;
  }
}

static tsr_status adamw_rank(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *mesh = NULL;
  tsr_var *p = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_tensor *full = NULL, *g = NULL;
  tsr_status st = TSR_OK;
  const char *names[] = {"dp"};
  int shape1[] = {1};
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(1, 1, shape1, names, &mesh), st);
  int64_t shape[] = {6, 7};
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 2, shape, &full), st);
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 2, shape, &g), st);
  ref_adamw ref;
  memset(&ref, 0, sizeof ref);
  float *fp = tsr_tensor_data(full);
  for (int i = 0; i < 42; i++) fp[i] = (float)(0.1 * cos(0.3 * i));
  for (int i = 0; i < 42; i++) ref.p[i] = fp[i];
  tsr_placement rep[] = {tsr_replicate()};
  TSR_CHECK_GOTO(make_param(r, mesh, full, rep, "w", &p), st);
  tsr_adamw_config cfg = {0.9, 0.95, 1e-8, 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, 1, &p, &cfg, &opt), st);
  for (int step = 1; step <= 6; step++) {
    double gd[42];
    float *gp = tsr_tensor_data(g);
    for (int i = 0; i < 42; i++) {
      gp[i] = (float)grad_value(0, i, step);
      gd[i] = gp[i];
    }
    double lr = 1e-2 * step;
    TSR_CHECK_GOTO(set_grad(r, p, g), st);
    TSR_CHECK_GOTO(tsr_adamw_step(opt, lr), st);
    ref_step(&ref, gd, 42, step, lr, 0.9, 0.95, 1e-8, 0.1);
    const float *got = tsr_tensor_data(p->value->local);
    for (int i = 0; i < 42; i++) {
      double err = fabs(got[i] - ref.p[i]);
      if (err > 1e-6 + 1e-5 * fabs(ref.p[i])) {
        st = tsr_error(TSR_EINTERNAL, "step %d element %d: %.9g vs reference %.9g", step, i, got[i],
                       ref.p[i]);
        goto cleanup;
      }
    }
    const float *m = tsr_tensor_data(tsr_adamw_exp_avg(opt, 0)->local);
    const float *v = tsr_tensor_data(tsr_adamw_exp_avg_sq(opt, 0)->local);
    for (int i = 0; i < 42; i++)
      if (fabs(m[i] - ref.m[i]) > 1e-6 || fabs(v[i] - ref.v[i]) > 1e-7) {
        st = tsr_error(TSR_EINTERNAL, "step %d state %d: m %.9g/%.9g v %.9g/%.9g", step, i, m[i],
                       ref.m[i], v[i], ref.v[i]);
        goto cleanup;
      }
  }
  if (tsr_adamw_get_step(opt) != 6) st = tsr_error(TSR_EINTERNAL, "step counter not 6");
cleanup:
  tsr_adamw_free(opt);
  tsr_var_free(p);
  tsr_tensor_free(full);
  tsr_tensor_free(g);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  return st;
}

static void test_adamw_matches_reference(void **state) {
  (void)state;
  tsr_status st = tsr_local_launch(1, 10, adamw_rank, NULL);
  if (st != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* A step with a missing gradient fails, names the parameter and leaves the counter alone. */
static tsr_status missing_grad_rank(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *mesh = NULL;
  tsr_var *p = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_tensor *full = NULL;
  tsr_status st = TSR_OK;
  const char *names[] = {"dp"};
  int shape1[] = {1};
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(1, 1, shape1, names, &mesh), st);
  int64_t shape[] = {3};
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 1, shape, &full), st);
  tsr_placement rep[] = {tsr_replicate()};
  TSR_CHECK_GOTO(make_param(r, mesh, full, rep, "model.norm.weight", &p), st);
  tsr_adamw_config cfg = {0.9, 0.999, 1e-8, 0.0};
  TSR_CHECK_GOTO(tsr_adamw_new(r, 1, &p, &cfg, &opt), st);
  tsr_status s2 = tsr_adamw_step(opt, 1e-3);
  if (s2 != TSR_EINVAL || !strstr(tsr_last_error(), "model.norm.weight") ||
      tsr_adamw_get_step(opt) != 0)
    st = tsr_error(TSR_EINTERNAL, "expected EINVAL naming the parameter, got %s: %s",
                   tsr_status_name(s2), tsr_last_error());
cleanup:
  tsr_adamw_free(opt);
  tsr_var_free(p);
  tsr_tensor_free(full);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  return st;
}

static void test_adamw_missing_grad(void **state) {
  (void)state;
  tsr_status st = tsr_local_launch(1, 10, missing_grad_rank, NULL);
  if (st != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* ---- norms on meshes ---- */

/* One norm case: a mesh and per-parameter placements on it, run on every rank. */
typedef struct norm_case {
  int ndim;
  int shape[2];
  int nparams;
  int pdims[MAX_PARAMS];
  int64_t pshape[MAX_PARAMS][2];
  tsr_placement pl[MAX_PARAMS][2];
  double max_norm;
  double norm[16];          /* each rank's result */
  double clipped_sumsq[16]; /* Σ over this rank's local shards after clipping */
  bool expect_partial_error;
  char error[16][512];
} norm_case;

static tsr_status norm_rank(tsr_comm_t *comm, void *arg) {
  norm_case *c = arg;
  int rank = tsr_comm_rank(comm), world = tsr_comm_world(comm);
  tsr_rank_t *r = NULL;
  tsr_mesh_t *mesh = NULL;
  tsr_var *p[MAX_PARAMS] = {0};
  tsr_tensor *full = NULL;
  tsr_status st = TSR_OK;
  const char *names[] = {"dp", "tp"};
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(world, c->ndim, c->shape, names, &mesh), st);
  for (int k = 0; k < c->nparams; k++) {
    TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, c->pdims[k], c->pshape[k], &full), st);
    float *f = tsr_tensor_data(full);
    for (int64_t i = 0; i < tsr_tensor_numel(full); i++) f[i] = (float)grad_value(k, i, 1);
    /* Gradients with a Partial placement are made by wrapping the full value as a local. */
    TSR_CHECK_GOTO(make_param(r, mesh, full, c->pl[k], NULL, &p[k]), st);
    TSR_CHECK_GOTO(set_grad(r, p[k], full), st);
    tsr_tensor_free(full);
    full = NULL;
  }
  double norm = -1;
  tsr_var *const *pp = p;
  st = tsr_clip_grad_norm(r, mesh, c->nparams, pp, c->max_norm, &norm);
  if (st != TSR_OK) {
    snprintf(c->error[rank], sizeof c->error[rank], "%s", tsr_last_error());
    if (c->expect_partial_error) st = TSR_OK;
    goto cleanup;
  }
  c->norm[rank] = norm;
  double s = 0;
  for (int k = 0; k < c->nparams; k++)
    s += tsr_kernel_sum_squares(tsr_tensor_data(p[k]->grad->local),
                                tsr_tensor_numel(p[k]->grad->local));
  c->clipped_sumsq[rank] = s;
cleanup:
  for (int k = 0; k < c->nparams; k++) tsr_var_free(p[k]);
  tsr_tensor_free(full);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  return st;
}

static double full_norm(const norm_case *c) {
  double s = 0;
  for (int k = 0; k < c->nparams; k++) {
    int64_t n = c->pshape[k][0] * (c->pdims[k] > 1 ? c->pshape[k][1] : 1);
    for (int64_t i = 0; i < n; i++) {
      float v = (float)grad_value(k, i, 1);
      s += (double)v * v;
    }
  }
  return sqrt(s);
}

static void run_norm_case(norm_case *c) {
  int world = c->shape[0] * (c->ndim > 1 ? c->shape[1] : 1);
  tsr_status st = tsr_local_launch(world, 10, norm_rank, c);
  if (st != TSR_OK) fail_msg("%s", tsr_last_error());
}

static norm_case base_case(void) {
  norm_case c;
  memset(&c, 0, sizeof c);
  c.nparams = 3;
  c.pdims[0] = 2, c.pshape[0][0] = 5, c.pshape[0][1] = 3; /* uneven rows over 2 */
  c.pdims[1] = 1, c.pshape[1][0] = 4;
  c.pdims[2] = 2, c.pshape[2][0] = 2, c.pshape[2][1] = 7; /* uneven columns */
  return c;
}

static void test_norm_two_ranks_matches_one(void **state) {
  (void)state;
  norm_case one = base_case();
  one.ndim = 1, one.shape[0] = 1;
  for (int k = 0; k < 3; k++) one.pl[k][0] = tsr_replicate();
  run_norm_case(&one);
  double expect = full_norm(&one);
  assert_true(fabs(one.norm[0] - expect) <= 1e-12 * expect);

  norm_case two = base_case();
  two.ndim = 1, two.shape[0] = 2;
  two.pl[0][0] = tsr_shard(0);
  two.pl[1][0] = tsr_replicate();
  two.pl[2][0] = tsr_shard(1);
  run_norm_case(&two);
  for (int rk = 0; rk < 2; rk++) {
    assert_true(fabs(two.norm[rk] - one.norm[0]) <= 1e-12 * expect);
    assert_memory_equal(&two.norm[rk], &two.norm[0], sizeof(double)); /* same bits everywhere */
  }
}

static void test_norm_2d_mesh(void **state) {
  (void)state;
  norm_case c = base_case();
  c.ndim = 2, c.shape[0] = 2, c.shape[1] = 2;
  c.pl[0][0] = tsr_shard(0), c.pl[0][1] = tsr_shard(1); /* sharded along both dims */
  c.pl[1][0] = tsr_replicate(), c.pl[1][1] = tsr_shard(0);
  c.pl[2][0] = tsr_replicate(), c.pl[2][1] = tsr_replicate();
  run_norm_case(&c);
  double expect = full_norm(&c);
  for (int rk = 0; rk < 4; rk++) assert_true(fabs(c.norm[rk] - expect) <= 1e-12 * expect);
}

static void test_norm_rejects_partial(void **state) {
  (void)state;
  norm_case c = base_case();
  c.ndim = 1, c.shape[0] = 2;
  c.pl[0][0] = tsr_shard(0);
  c.pl[1][0] = tsr_partial(TSR_REDUCE_SUM);
  c.pl[2][0] = tsr_replicate();
  c.expect_partial_error = true;
  run_norm_case(&c);
  for (int rk = 0; rk < 2; rk++) {
    assert_non_null(strstr(c.error[rk], "P(sum)"));
    assert_non_null(strstr(c.error[rk], "tsr_var_resolve_grad"));
  }
}

/* clip_grad_norm_ by hand: grads (3, 4) and (12): norm 13, coefficient max / (13 + 1e-6). */
static void test_clip_by_hand(void **state) {
  (void)state;
  float a[] = {3, 4}, b[] = {12};
  double expect_norm = 13.0;
  for (int variant = 0; variant < 3; variant++) {
    double max_norm = variant == 0 ? 1.0 : variant == 1 ? 100.0 : 0.0;
    float coef = tsr_kernel_clip_coef(expect_norm, max_norm);
    if (variant == 0) assert_true(fabsf(coef - (float)(1.0 / (13.0 + 1e-6))) < 1e-9f);
    float sa[2] = {a[0], a[1]}, sb[1] = {b[0]};
    if (max_norm > 0 && coef < 1.0f) {
      tsr_kernel_scale(sa, 2, coef);
      tsr_kernel_scale(sb, 1, coef);
    }
    double after = sqrt((double)sa[0] * sa[0] + (double)sa[1] * sa[1] + (double)sb[0] * sb[0]);
    if (variant == 0)
      assert_true(fabs(after - 1.0) < 1e-6);
    else
      assert_true(after == 13.0);
  }
}

/* The same through tsr_clip_grad_norm on one rank: norm reported before clipping, grads after. */
static void test_clip_through_optimizer(void **state) {
  (void)state;
  norm_case c = base_case();
  c.ndim = 1, c.shape[0] = 2;
  c.pl[0][0] = tsr_shard(0), c.pl[1][0] = tsr_replicate(), c.pl[2][0] = tsr_shard(1);
  c.max_norm = 0.5;
  run_norm_case(&c);
  double expect = full_norm(&c);
  assert_true(fabs(c.norm[0] - expect) <= 1e-12 * expect);
  /* After clipping the full gradient has norm max_norm: the shards' squares plus the replicated
   * parameter counted once. */
  double rep = 0;
  for (int i = 0; i < 4; i++) {
    float v = (float)grad_value(1, i, 1) * tsr_kernel_clip_coef(expect, 0.5);
    rep += (double)v * v;
  }
  double total = c.clipped_sumsq[0] + c.clipped_sumsq[1] - rep;
  assert_true(fabs(sqrt(total) - 0.5) < 1e-5);
}

/* ---- schedule ---- */

static void test_schedule(void **state) {
  (void)state;
  tsr_lr_config c = {TSR_LR_COSINE, 1e-3, 0.0, 10, 110};
  assert_true(fabs(tsr_lr_at(&c, 1) - 1e-4) < 1e-18);
  assert_true(fabs(tsr_lr_at(&c, 5) - 5e-4) < 1e-18);
  assert_true(tsr_lr_at(&c, 10) == 1e-3);
  /* Half way through the cosine (step 60 of 10 + 100) the rate is half the peak. */
  assert_true(fabs(tsr_lr_at(&c, 60) - 5e-4) < 1e-15);
  /* A quarter: (1 + cos(pi/4)) / 2. */
  assert_true(fabs(tsr_lr_at(&c, 35) - 1e-3 * (1 + sqrt(0.5)) / 2) < 1e-15);
  assert_true(tsr_lr_at(&c, 110) == 0.0);
  assert_true(tsr_lr_at(&c, 200) == 0.0);
  c.min_lr = 1e-4;
  assert_true(fabs(tsr_lr_at(&c, 60) - 5.5e-4) < 1e-15);
  assert_true(fabs(tsr_lr_at(&c, 110) - 1e-4) < 1e-18);

  tsr_lr_config k = {TSR_LR_CONSTANT, 3e-3, 0.0, 4, 100};
  assert_true(fabs(tsr_lr_at(&k, 2) - 1.5e-3) < 1e-18);
  assert_true(tsr_lr_at(&k, 4) == 3e-3);
  assert_true(tsr_lr_at(&k, 99) == 3e-3);
  tsr_lr_config none = {TSR_LR_COSINE, 1e-3, 0.0, 0, 3};
  assert_true(tsr_lr_at(&none, 1) < 1e-3 && tsr_lr_at(&none, 1) > 0.5e-3);
  assert_true(tsr_lr_at(&none, 3) == 0.0);
}

/* eps = 0 turns a zero gradient into 0 / 0: refused when the optimizer is made. */
static void test_adamw_eps_must_be_positive(void **state) {
  (void)state;
  tsr_adamw_t *opt = (tsr_adamw_t *)1;
  const double bad[] = {0.0, -1e-8, NAN, INFINITY};
  for (int i = 0; i < 4; i++) {
    tsr_adamw_config cfg = {0.9, 0.95, bad[i], 0.1};
    assert_int_equal(tsr_adamw_new(NULL, 0, NULL, &cfg, &opt), TSR_EINVAL);
    assert_null(opt);
    assert_non_null(strstr(tsr_last_error(), "eps"));
    opt = (tsr_adamw_t *)1;
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adamw_eps_must_be_positive),
      cmocka_unit_test(test_adamw_matches_reference),
      cmocka_unit_test(test_adamw_missing_grad),
      cmocka_unit_test(test_norm_two_ranks_matches_one),
      cmocka_unit_test(test_norm_2d_mesh),
      cmocka_unit_test(test_norm_rejects_partial),
      cmocka_unit_test(test_clip_by_hand),
      cmocka_unit_test(test_clip_through_optimizer),
      cmocka_unit_test(test_schedule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
