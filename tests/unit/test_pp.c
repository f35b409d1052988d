/* Pipeline schedules run by tsr_llama_pipe_step against the 1-rank step on the whole batch:
 * logits, loss and every gradient for pp 4, dp x pp and pp beside a replicated tp, each under
 * gpipe and 1f1b with several microbatch counts; 1F1B's peak of microbatches in flight per stage;
 * per-rank parameter bytes about 1/pp; the schedules' analytic bubble. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../plugins/pp/pp_schedule.c"
#include "llama_pipe.h"

#define MAX_PARAMS 64
#define B          6
#define L          5

static const tsr_llama_config cfg = {.vocab_size = 19,
                                     .hidden_size = 16,
                                     .intermediate_size = 20,
                                     .num_hidden_layers = 4,
                                     .num_attention_heads = 4,
                                     .num_key_value_heads = 2,
                                     .rms_norm_eps = 1e-5f,
                                     .rope_theta = 10000.0f};

typedef struct pp_case {
  int ndim, shape[3];
  const char *names[3];
  const tsr_schedule *sched; /* NULL: the plain forward on one rank */
  int microbatches;
  tsr_tensor *logits, *grads[MAX_PARAMS];
  float loss;
  int nparams, peak[8];
  size_t param_bytes[8];
} pp_case;

static void fill(int32_t *ids, int32_t *labels) {
  for (int i = 0; i < B * L; i++) {
    ids[i] = (i * 5) % cfg.vocab_size;
    labels[i] = i % 7 == 3 || i >= B * L - 3 ? -100 : (i * 5 + 1) % cfg.vocab_size;
  }
}

static tsr_status leaf(tsr_rank_t *r, const tsr_mesh_t *m, const int32_t *data, tsr_var **out) {
  int64_t shape[2] = {B, L};
  tsr_tensor *t;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &t));
  memcpy(tsr_tensor_data(t), data, sizeof(int32_t) * B * L);
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(m); i++) rep[i] = tsr_replicate();
  tsr_dtensor *d;
  tsr_status st = tsr_dtensor_distribute(r, m, t, rep, &d);
  tsr_tensor_free(t);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, false, NULL, out);
}

/* The full tensor on every rank, also for a value on one pipeline stage. */
static tsr_status gather(tsr_rank_t *r, const tsr_mesh_t *m, const tsr_dtensor *x,
                         tsr_tensor **out) {
  tsr_tensor *full = NULL;
  if (tsr_mesh_equal(x->mesh, m)) {
    TSR_CHECK(tsr_dtensor_full_tensor(r, x, &full));
  } else {
    tsr_placement rep[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < tsr_mesh_ndim(m); i++) rep[i] = tsr_replicate();
    tsr_dtensor *y;
    TSR_CHECK(tsr_dtensor_redistribute(r, x, m, rep, &y));
    tsr_status st = tsr_dtensor_full_tensor(r, y, &full);
    tsr_dtensor_free(y);
    TSR_CHECK(st);
  }
  tsr_status st = tsr_tensor_cast(full, full->dtype, out); /* untracked: outlives the rank */
  tsr_tensor_free(full);
  return st;
}

static tsr_status run(tsr_comm_t *comm, void *arg) {
  pp_case *pc = arg;
  int me = tsr_comm_rank(comm);
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  int32_t hid[B * L], hlab[B * L];
  tsr_status st = TSR_OK;
  fill(hid, hlab);
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), pc->ndim, pc->shape, pc->names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &cfg, 7, &model), st);
  pc->param_bytes[me] = tsr_rank_allocator(r)->bytes_in_use;
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_tensor *logits = NULL;
  if (pc->sched) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(tsr_llama_pipe_step(model, m, pc->sched, pc->microbatches, hid, hlab, B, L, true,
                                       true, &res),
                   st);
    pc->peak[me] = res.peak_in_flight;
    if (me == 0) pc->loss = (float)res.loss;
    logits = res.logits;
    res.logits = NULL;
    tsr_pipe_result_free(&res);
  } else {
    tsr_var *lg, *loss;
    TSR_CHECK_GOTO(leaf(r, m, hid, &ids), st);
    TSR_CHECK_GOTO(leaf(r, m, hlab, &labels), st);
    TSR_CHECK_GOTO(tsr_llama_forward(model, t, ids, labels, &lg, &loss), st);
    TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
    TSR_CHECK_GOTO(gather(r, m, lg->value, &logits), st);
    pc->loss = *(const float *)tsr_tensor_data(loss->value->local);
  }
  if (me == 0)
    pc->logits = logits;
  else
    tsr_tensor_free(logits);
  pc->nparams = tsr_llama_param_count(model);
  for (int i = 0; i < pc->nparams; i++) {
    tsr_var *p = tsr_llama_param(model, i);
    tsr_tensor *full;
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, p), st);
    TSR_CHECK_GOTO(gather(r, m, p->grad, &full), st);
    if (me == 0)
      pc->grads[i] = full;
    else
      tsr_tensor_free(full);
  }
cleanup:
  tsr_tape_free(t);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void expect_close(const tsr_tensor *a, const tsr_tensor *b, const char *what, int i) {
  assert_int_equal(tsr_tensor_numel(a), tsr_tensor_numel(b));
  const float *x = tsr_tensor_data(a), *y = tsr_tensor_data(b);
  for (int64_t k = 0; k < tsr_tensor_numel(a); k++)
    if (!(fabsf(x[k] - y[k]) <= 1e-5f + 1e-4f * fabsf(y[k])))
      fail_msg("%s %d [%lld]: %.8g in the pipeline, %.8g on one rank", what, i, (long long)k, x[k],
               y[k]);
}

static void case_free(pp_case *c) {
  tsr_tensor_free(c->logits);
  for (int i = 0; i < c->nparams; i++) tsr_tensor_free(c->grads[i]);
}

static const tsr_schedule gpipe = {"gpipe", "test", tsr_pp_gpipe, NULL};
static const tsr_schedule onef1b = {"1f1b", "test", tsr_pp_1f1b, NULL};

/* Runs every schedule and microbatch count on the mesh against the 1-rank step. */
static void against_one_rank(int ndim, const int *shape, const char *const *names, int pp) {
  pp_case one = {.ndim = 1, .shape = {1}, .names = {"dp"}};
  if (tsr_local_launch(1, 30.0, run, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  int world = 1;
  for (int i = 0; i < ndim; i++) world *= shape[i];
  const tsr_schedule *scheds[2] = {&gpipe, &onef1b};
  const int mbs[] = {1, 2, 3, 6};
  for (int s = 0; s < 2; s++)
    for (size_t k = 0; k < sizeof mbs / sizeof mbs[0]; k++) {
      pp_case c = {.ndim = ndim, .sched = scheds[s], .microbatches = mbs[k]};
      for (int i = 0; i < ndim; i++) c.shape[i] = shape[i], c.names[i] = names[i];
      if (tsr_local_launch(world, 30.0, run, &c) != TSR_OK)
        fail_msg("%s, %d microbatches: %s", scheds[s]->name, mbs[k], tsr_last_error());
      expect_close(c.logits, one.logits, "logits", 0);
      if (!(fabsf(c.loss - one.loss) <= 1e-5f + 1e-4f * fabsf(one.loss)))
        fail_msg("loss %.8g in the pipeline, %.8g on one rank", c.loss, one.loss);
      for (int i = 0; i < one.nparams; i++) expect_close(c.grads[i], one.grads[i], "grad", i);
      /* ranks are row-major with pp outermost here: rank r is on stage r / (world / pp) */
      for (int rk = 0; rk < world; rk++) {
        int stage = rk / (world / pp), want = mbs[k];
        if (scheds[s] == &onef1b && pp - stage < want) want = pp - stage;
        if (c.peak[rk] != want)
          fail_msg("%s, %d microbatches: rank %d (stage %d) held %d at once, want %d",
                   scheds[s]->name, mbs[k], rk, stage, c.peak[rk], want);
        /* a rank holds its stage's parameters only: about 1/pp of them (the embedding and
         * lm_head make the end stages a little heavier) */
        if ((double)c.param_bytes[rk] > 1.35 * (double)one.param_bytes[0] / pp)
          fail_msg("rank %d holds %zu parameter bytes of %zu", rk, c.param_bytes[rk],
                   one.param_bytes[0]);
      }
      case_free(&c);
    }
  case_free(&one);
}

static void test_pp4(void **s) {
  (void)s;
  int shape[1] = {4};
  const char *names[1] = {"pp"};
  against_one_rank(1, shape, names, 4);
}

static void test_pp2_dp2(void **s) {
  (void)s;
  int shape[2] = {2, 2};
  const char *names[2] = {"pp", "dp"};
  against_one_rank(2, shape, names, 2);
}

static void test_pp2_replicated_tp2(void **s) {
  (void)s;
  int shape[2] = {2, 2};
  const char *names[2] = {"pp", "tp"};
  against_one_rank(2, shape, names, 2);
}

/* The analytic bubble of gpipe and 1f1b is (pp - 1) / (microbatches + pp - 1). */
static void test_bubble(void **s) {
  (void)s;
  const tsr_schedule *scheds[2] = {&gpipe, &onef1b};
  for (int k = 0; k < 2; k++)
    for (int pp = 1; pp <= 8; pp *= 2)
      for (int m = 1; m <= 16; m *= 2) {
        double want = (double)(pp - 1) / (m + pp - 1);
        double got = tsr_pipe_simulate(scheds[k], pp, m, 1.0, 2.0, NULL, NULL);
        if (fabs(got - want) > 1e-12)
          fail_msg("%s pp %d, %d microbatches: bubble %g, want %g", scheds[k]->name, pp, m, got,
                   want);
      }
}

/* A schedule whose lists wait on each other never finishes: the simulation says so. */
static tsr_status backward_first(int stages, int mb, int stage, tsr_pipe_action *a, int cap, int *n,
                                 void *ctx) {
  (void)stages, (void)stage, (void)cap, (void)ctx;
  int k = 0;
  for (int i = 0; i < mb; i++) a[k++] = (tsr_pipe_action){TSR_PIPE_BACKWARD, i, 0};
  for (int i = 0; i < mb; i++) a[k++] = (tsr_pipe_action){TSR_PIPE_FORWARD, i, 0};
  *n = k;
  return TSR_OK;
}

static void test_stuck_schedule(void **s) {
  (void)s;
  tsr_schedule bad = {"bad", "test", backward_first, NULL};
  assert_true(tsr_pipe_simulate(&bad, 2, 2, 1.0, 2.0, NULL, NULL) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bubble),
      cmocka_unit_test(test_stuck_schedule),
      cmocka_unit_test(test_pp4),
      cmocka_unit_test(test_pp2_dp2),
      cmocka_unit_test(test_pp2_replicated_tp2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
