/* Test harness shared by the model-on-a-mesh tests (see harness.h). */
#include <pthread.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "tessera/optim.h"

const tsr_llama_config tsr_test_llama = {.vocab_size = 19,
                                         .hidden_size = 16,
                                         .intermediate_size = 20,
                                         .num_hidden_layers = 2,
                                         .num_attention_heads = 4,
                                         .num_key_value_heads = 2,
                                         .rms_norm_eps = 1e-5f,
                                         .rope_theta = 10000.0f};

tsr_status tsr_test_keep_full(tsr_rank_t *r, const tsr_mesh_t *job_mesh, const tsr_dtensor *x,
                              bool keep, tsr_tensor **out) {
  tsr_tensor *full = NULL;
  tsr_status st;
  if (!job_mesh || tsr_mesh_equal(x->mesh, job_mesh)) {
    st = tsr_dtensor_full_tensor(r, x, &full);
  } else {
    tsr_placement rep[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < tsr_mesh_ndim(job_mesh); i++) rep[i] = tsr_replicate();
    tsr_dtensor *y = NULL;
    TSR_CHECK(tsr_dtensor_redistribute(r, x, job_mesh, rep, &y));
    st = tsr_dtensor_full_tensor(r, y, &full);
    tsr_dtensor_free(y);
  }
  if (st == TSR_OK && keep) st = tsr_tensor_cast(full, full->dtype, out);
  tsr_tensor_free(full);
  return st;
}

void tsr_test_expect_close(const tsr_tensor *a, const tsr_tensor *b, float rtol, float atol,
                           const char *what, int index) {
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(tsr_tensor_numel(a), tsr_tensor_numel(b));
  const float *x = tsr_tensor_data(a), *y = tsr_tensor_data(b);
  for (int64_t i = 0; i < tsr_tensor_numel(a); i++)
    if (!(fabsf(x[i] - y[i]) <= atol + rtol * fabsf(y[i])))
      fail_msg("%s %d [%lld]: %.8g on the mesh, %.8g on one rank (rtol %g, atol %g)", what, index,
               (long long)i, x[i], y[i], rtol, atol);
}

tsr_status tsr_test_step(tsr_rank_t *r, const tsr_mesh_t *m, tsr_llama_t *model, tsr_var *ids,
                         tsr_var *labels, double lr, tsr_test_step_hook hook, void *hook_arg,
                         tsr_test_step_result *res, bool *in_model) {
  tsr_tape_t *t = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_var *logits, *loss, *params[TSR_TEST_MAX_PARAMS];
  bool me0 = tsr_rank_id(r) == 0;
  int n = tsr_llama_param_count(model);
  *in_model = false;
  TSR_INVARIANT(n <= TSR_TEST_MAX_PARAMS);
  tsr_status st = tsr_tape_new(r, &t);
  if (st != TSR_OK) return st;
  st = tsr_llama_forward(model, t, ids, labels, &logits, &loss);
  if (st == TSR_OK) st = tsr_tape_backward(t, loss);
  if (st != TSR_OK) {
    *in_model = true;
    goto cleanup;
  }
  for (int i = 0; i < n; i++) {
    params[i] = tsr_llama_param(model, i);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, params[i]), st);
  }
  if (hook) hook(r, hook_arg);
  if (me0) res->nparams = n;
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, logits->value, me0, &res->logits), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, loss->value, me0, &res->loss), st);
  for (int i = 0; i < n; i++)
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, params[i]->grad, me0, &res->grads[i]), st);
  tsr_adamw_config oc = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, n, params, &oc, &opt), st);
  TSR_CHECK_GOTO(tsr_adamw_step(opt, lr), st);
  for (int i = 0; i < n; i++)
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, params[i]->value, me0, &res->after[i]), st);
cleanup:
  tsr_adamw_free(opt);
  tsr_tape_free(t);
  return st;
}

void tsr_test_step_result_free(tsr_test_step_result *res) {
  tsr_tensor_free(res->logits);
  tsr_tensor_free(res->loss);
  for (int i = 0; i < res->nparams; i++) {
    tsr_tensor_free(res->grads[i]);
    tsr_tensor_free(res->after[i]);
  }
  memset(res, 0, sizeof *res);
}

void tsr_test_step_expect_close(const tsr_test_step_result *mesh, const tsr_test_step_result *one,
                                float rtol, float atol) {
  assert_int_equal(mesh->nparams, one->nparams);
  tsr_test_expect_close(mesh->logits, one->logits, rtol, atol, "logits", 0);
  tsr_test_expect_close(mesh->loss, one->loss, rtol, atol, "loss", 0);
  for (int i = 0; i < one->nparams; i++) {
    tsr_test_expect_close(mesh->grads[i], one->grads[i], rtol, atol, "gradient of parameter", i);
    tsr_test_expect_close(mesh->after[i], one->after[i], rtol, atol, "after the step, parameter",
                          i);
  }
}

static tsr_registry_t *layout;
static pthread_once_t layout_once = PTHREAD_ONCE_INIT;

static void layout_make(void) {
  static const char *const batch[] = {"dp", "dp_shard", "dp_replicate"};
  static const char *const seq[] = {"ring_cp", "ulysses_cp"};
  tsr_registry_t *reg = NULL;
  tsr_status st = tsr_registry_new(&reg);
  for (int i = 0; i < 3 && st == TSR_OK; i++)
    st = tsr_registry_add_data_split(reg, "test", batch[i], tsr_shard(0));
  for (int i = 0; i < 2 && st == TSR_OK; i++)
    st = tsr_registry_add_data_split(reg, "test", seq[i], tsr_shard(1));
  if (st == TSR_OK) st = tsr_registry_set_stage_dim(reg, "test", "pp");
  if (st != TSR_OK) fail_msg("test layout: %s", tsr_last_error());
  layout = reg;
}

const tsr_registry_t *tsr_test_layout(void) {
  pthread_once(&layout_once, layout_make);
  return layout;
}

tsr_mesh_t *tsr_test_one_rank_mesh(void) {
  int shape[1] = {1};
  const char *names[1] = {"dp"};
  tsr_mesh_t *m = NULL;
  tsr_mesh_init(1, 1, shape, names, &m);
  return m;
}
