/* The Llama step on meshes that need no strategy-specific rule, against the 1-rank run, with the
 * dims declared as a plugin declares them and named as no in-tree plugin names its dims: the
 * batch split over `rows` (even and uneven, so the loss must weigh shards by their tokens), an
 * undeclared `wide` beside it (replicated), the gradient sync that falls out of resolving Partial
 * gradients to the parameters' Replicate placement, and pipeline stages over `stage` run in order
 * (one micro-batch; the schedules are the pipeline strategy's). Also: splitting the sequence
 * without a rule for attention is an error naming it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "llama.h"
#include "tessera/ops.h"

#define MAX_PARAMS 64

typedef struct step_result {
  tsr_tensor *logits, *loss;
  int nparams;
  tsr_tensor *grads[MAX_PARAMS];
} step_result;

typedef struct mesh_case {
  int ndim, shape[3];
  const char *names[3];
  int batch, seq;
  int layers; /* 0: tsr_test_llama's */
  bool tied;
  step_result res; /* filled by rank 0 */
  tsr_status st0;
  char msg0[512];
} mesh_case;

/* Tokens with some labels ignored (-100), so shards hold different numbers of valid tokens. */
static tsr_status batch_var(tsr_rank_t *r, const tsr_mesh_t *m, int B, int L, bool labels,
                            tsr_var **out) {
  int32_t p[256];
  TSR_INVARIANT(B * L <= 256);
  for (int i = 0; i < B * L; i++)
    p[i] = labels && (i % 7 == 3 || i >= B * L - 3)
               ? -100
               : (i * 5 + (labels ? 1 : 0)) % tsr_test_llama.vocab_size;
  return tsr_llama_batch(r, m, B, L, p, out);
}

/* The data layout and stages, declared as a plugin would: dims of names the model has never
 * heard of, with no rule of their own. */
static tsr_registry_t *layout;

static int layout_new(void **s) {
  (void)s;
  if (tsr_registry_new(&layout) != TSR_OK ||
      tsr_registry_add_data_split(layout, "test", "rows", tsr_shard(0)) != TSR_OK ||
      tsr_registry_add_data_split(layout, "test", "seq", tsr_shard(1)) != TSR_OK ||
      tsr_registry_set_stage_dim(layout, "test", "stage") != TSR_OK)
    return -1;
  return 0;
}

static int layout_free(void **s) {
  (void)s;
  tsr_registry_free(layout);
  return 0;
}

static tsr_status run_step(tsr_comm_t *comm, void *arg) {
  mesh_case *mc = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_var *ids = NULL, *labels = NULL, *logits, *loss;
  bool me0 = tsr_comm_rank(comm) == 0;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, layout, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), mc->ndim, mc->shape, mc->names, &m), st);
  tsr_llama_config c = tsr_test_llama;
  if (mc->layers) c.num_hidden_layers = mc->layers;
  c.tie_word_embeddings = mc->tied;
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &c, 99, &model), st);
  TSR_CHECK_GOTO(batch_var(r, m, mc->batch, mc->seq, false, &ids), st);
  TSR_CHECK_GOTO(batch_var(r, m, mc->batch, mc->seq, true, &labels), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  st = tsr_llama_forward(model, t, ids, labels, &logits, &loss);
  if (me0) {
    mc->st0 = st;
    snprintf(mc->msg0, sizeof mc->msg0, "%s", st ? tsr_last_error() : "");
  }
  if (st != TSR_OK) {
    st = TSR_OK; /* an expected failure is inspected by the test */
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, logits->value, me0, &mc->res.logits), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, loss->value, me0, &mc->res.loss), st);
  if (me0) mc->res.nparams = tsr_llama_param_count(model);
  for (int i = 0; i < tsr_llama_param_count(model); i++) {
    tsr_var *p = tsr_llama_param(model, i);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, p), st);
    /* the gradient now has the parameter's placements: replicated over every dim */
    for (int k = 0; k < tsr_mesh_ndim(p->grad->mesh); k++)
      TSR_INVARIANT(p->grad->placements[k].kind == TSR_REPLICATE);
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, p->grad, me0, &mc->res.grads[i]), st);
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

static void result_free(step_result *s) {
  tsr_tensor_free(s->logits);
  tsr_tensor_free(s->loss);
  for (int i = 0; i < s->nparams; i++) tsr_tensor_free(s->grads[i]);
}

static void expect_close(const tsr_tensor *a, const tsr_tensor *b, const char *what, int k) {
  tsr_test_expect_close(a, b, 1e-4f, 1e-5f, what, k);
}

static void run_model_variant(int world, int ndim, const int *shape, const char *const *names,
                              int batch, int seq, int layers, bool tied) {
  mesh_case one = {.ndim = 1,
                   .shape = {1},
                   .names = {"rows"},
                   .batch = batch,
                   .seq = seq,
                   .layers = layers,
                   .tied = tied};
  mesh_case many = {.ndim = ndim, .batch = batch, .seq = seq, .layers = layers, .tied = tied};
  for (int i = 0; i < ndim; i++) {
    many.shape[i] = shape[i];
    many.names[i] = names[i];
  }
  if (tsr_local_launch(1, 30.0, run_step, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (tsr_local_launch(world, 30.0, run_step, &many) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (many.st0 != TSR_OK) fail_msg("%s", many.msg0);
  expect_close(many.res.logits, one.res.logits, "logits", 0);
  expect_close(many.res.loss, one.res.loss, "loss", 0);
  for (int i = 0; i < one.res.nparams; i++)
    expect_close(many.res.grads[i], one.res.grads[i], "grad", i);
  result_free(&one.res);
  result_free(&many.res);
}

static void run_and_compare(int world, int ndim, const int *shape, const char *const *names,
                            int batch, int seq) {
  run_model_variant(world, ndim, shape, names, batch, seq, 0, false);
}

static void test_dp2_even_batch(void **s) {
  int shape[1] = {2};
  const char *names[1] = {"rows"};
  run_and_compare(2, 1, shape, names, 4, 6);
}

static void test_dp4_uneven_batch(void **s) {
  /* 6 rows over 4 ranks split 2, 2, 2, 0 and the labels ignore more tokens in some rows: the loss
   * must still be the mean over every valid token of the batch */
  int shape[1] = {4};
  const char *names[1] = {"rows"};
  run_and_compare(4, 1, shape, names, 6, 5);
}

static void test_dp2_with_replicated_tp(void **s) {
  int shape[2] = {2, 2};
  const char *names[2] = {"rows", "wide"};
  run_and_compare(4, 2, shape, names, 3, 4);
}

static void test_pp2_stages(void **s) {
  int shape[1] = {2};
  const char *names[1] = {"stage"};
  run_and_compare(2, 1, shape, names, 3, 5);
}

static void test_pp2_uneven_layers(void **s) {
  /* 3 layers over 2 stages: [0, 0, 1] */
  int shape[1] = {2};
  const char *names[1] = {"stage"};
  run_model_variant(2, 1, shape, names, 2, 4, 3, false);
}

static void test_pp3(void **s) {
  int shape[1] = {3};
  const char *names[1] = {"stage"};
  run_model_variant(3, 1, shape, names, 2, 4, 3, false);
}

static void test_pp2_tied_embeddings(void **s) {
  /* the embedding weight serves lm_head on the last stage; its gradient returns to stage 0 */
  int shape[1] = {2};
  const char *names[1] = {"stage"};
  run_model_variant(2, 1, shape, names, 2, 4, 0, true);
}

static void test_dp2_pp2(void **s) {
  int shape[3] = {2, 2, 1};
  const char *names[3] = {"rows", "stage", "wide"};
  run_and_compare(4, 3, shape, names, 4, 3);
}

static void test_assign_layers(void **s) {
  int st[4];
  tsr_llama_assign_layers(4, 2, st);
  assert_int_equal(st[0], 0);
  assert_int_equal(st[1], 0);
  assert_int_equal(st[2], 1);
  assert_int_equal(st[3], 1);
  tsr_llama_assign_layers(3, 2, st);
  assert_int_equal(st[1], 0);
  assert_int_equal(st[2], 1);
  tsr_llama_assign_layers(4, 3, st);
  assert_int_equal(st[0], 0);
  assert_int_equal(st[1], 0);
  assert_int_equal(st[2], 1);
  assert_int_equal(st[3], 2);
}

static void test_sequence_shard_needs_a_cp_rule(void **s) {
  mesh_case mc = {.ndim = 1, .shape = {2}, .names = {"seq"}, .batch = 2, .seq = 6};
  if (tsr_local_launch(2, 30.0, run_step, &mc) != TSR_OK) fail_msg("%s", tsr_last_error());
  assert_int_equal(mc.st0, TSR_ENOTSUP);
  assert_non_null(strstr(mc.msg0, "no sharding rule for op 'sdpa' on mesh dim 'seq'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dp2_even_batch),
      cmocka_unit_test(test_dp4_uneven_batch),
      cmocka_unit_test(test_dp2_with_replicated_tp),
      cmocka_unit_test(test_pp2_stages),
      cmocka_unit_test(test_pp2_uneven_layers),
      cmocka_unit_test(test_pp3),
      cmocka_unit_test(test_pp2_tied_embeddings),
      cmocka_unit_test(test_dp2_pp2),
      cmocka_unit_test(test_assign_layers),
      cmocka_unit_test(test_sequence_shard_needs_a_cp_rule),
  };
  return cmocka_run_group_tests(tests, layout_new, layout_free);
}
