/* Rule registries: op sharding rules, module styles, schedules and optimizer hooks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/comm.h"
#include "tessera/registry.h"

static tsr_registry_t *new_registry(void) {
  tsr_registry_t *reg = NULL;
  assert_int_equal(tsr_registry_new(&reg), TSR_OK);
  return reg;
}

static tsr_op_rule linear_rule(const char *name, const char *dim, tsr_placement a, tsr_placement b,
                               tsr_placement out) {
  tsr_op_rule r = {.name = name, .op = "linear", .mesh_dim = dim, .ninputs = 2, .noutputs = 1};
  r.inputs[0] = a;
  r.inputs[1] = b;
  r.outputs[0] = out;
  return r;
}

static void test_op_rules(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  assert_null(tsr_registry_find_op_rule(reg, "linear", "tp", 0, NULL));
  tsr_op_rule col =
      linear_rule("core.linear.col", NULL, tsr_replicate(), tsr_shard(1), tsr_shard(1));
  tsr_op_rule row =
      linear_rule("core.linear.row", NULL, tsr_shard(1), tsr_shard(0), tsr_partial(TSR_REDUCE_SUM));
  tsr_op_rule tp_col =
      linear_rule("tp.linear.col", "tp", tsr_replicate(), tsr_shard(1), tsr_shard(1));
  assert_int_equal(tsr_registry_add_op_rule(reg, &col), TSR_OK);
  assert_int_equal(tsr_registry_add_op_rule(reg, &row), TSR_OK);
  assert_int_equal(tsr_registry_add_op_rule(reg, &tp_col), TSR_OK);
  assert_int_equal(tsr_registry_op_rule_count(reg), 3);

  tsr_placement in[2] = {tsr_replicate(), tsr_shard(1)};
  /* A rule for the named dim beats the generic one; other dims get the generic one. */
  assert_string_equal(tsr_registry_find_op_rule(reg, "linear", "tp", 2, in)->name, "tp.linear.col");
  assert_string_equal(tsr_registry_find_op_rule(reg, "linear", "dp", 2, in)->name,
                      "core.linear.col");
  tsr_placement in_row[2] = {tsr_shard(1), tsr_shard(0)};
  const tsr_op_rule *r = tsr_registry_find_op_rule(reg, "linear", "tp", 2, in_row);
  assert_non_null(r);
  assert_int_equal(r->outputs[0].kind, TSR_PARTIAL);
  /* Placements must match exactly: S(0) is not S(1). */
  tsr_placement in_bad[2] = {tsr_replicate(), tsr_shard(0)};
  assert_null(tsr_registry_find_op_rule(reg, "linear", "tp", 2, in_bad));
  assert_null(tsr_registry_find_op_rule(reg, "add", "tp", 2, in));

  /* The same key twice is refused, naming both rules. */
  tsr_op_rule again = linear_rule("other.col", "tp", tsr_replicate(), tsr_shard(1), tsr_shard(1));
  assert_int_equal(tsr_registry_add_op_rule(reg, &again), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "duplicates rule 'tp.linear.col'"));

  /* A wildcard input matches any placement. */
  tsr_op_rule any = linear_rule("x.any", "cp", tsr_shard(0), tsr_replicate(), tsr_shard(0));
  any.any_input = 1u << 1;
  assert_int_equal(tsr_registry_add_op_rule(reg, &any), TSR_OK);
  tsr_placement in_any[2] = {tsr_shard(0), tsr_partial(TSR_REDUCE_MAX)};
  assert_string_equal(tsr_registry_find_op_rule(reg, "linear", "cp", 2, in_any)->name, "x.any");

  tsr_op_rule bad = {.name = "bad", .op = "linear", .ninputs = 0, .noutputs = 1};
  assert_int_equal(tsr_registry_add_op_rule(reg, &bad), TSR_EINVAL);
  bad.ninputs = 1;
  bad.op = NULL;
  assert_int_equal(tsr_registry_add_op_rule(reg, &bad), TSR_EINVAL);
  tsr_registry_free(reg);
}

/* Registrations the core could never honour are refused when made, naming the choices. */
static void test_vocabulary_refusals(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  /* an op the model never calls */
  tsr_op_rule mm = linear_rule("x.matmul", "tp", tsr_replicate(), tsr_shard(1), tsr_shard(1));
  mm.op = "matmul";
  assert_int_equal(tsr_registry_add_op_rule(reg, &mm), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "op 'matmul', which the model never calls"));
  assert_non_null(strstr(tsr_last_error(), "embedding, rmsnorm, linear, rope, sdpa, add, swiglu, "
                                           "cross_entropy"));
  /* the op's arity */
  tsr_op_rule sdpa = {.name = "x.sdpa", .op = TSR_OP_SDPA, .ninputs = 2, .noutputs = 1};
  assert_int_equal(tsr_registry_add_op_rule(reg, &sdpa), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "sdpa takes 3 inputs (q, k, v)"));
  /* gathering an input of an op without parameters: the loss's labels */
  tsr_op_rule loss = {.name = "x.loss",
                      .op = TSR_OP_CROSS_ENTROPY,
                      .mesh_dim = "zdp",
                      .ninputs = 2,
                      .noutputs = 1,
                      .use_mask = 1u << 1,
                      .use = {tsr_replicate(), tsr_replicate()}};
  assert_int_equal(tsr_registry_add_op_rule(reg, &loss), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "use_mask may only mark the weight"));
  /* ... and of an activation of one with parameters */
  tsr_op_rule act = loss;
  act.op = TSR_OP_LINEAR;
  act.use_mask = 1u << 0;
  assert_int_equal(tsr_registry_add_op_rule(reg, &act), TSR_EINVAL);
  act.use_mask = 1u << 1;
  assert_int_equal(tsr_registry_add_op_rule(reg, &act), TSR_OK);
  /* a module the model does not have */
  tsr_module_style shared = {.style = "shared_experts", .mesh_dim = "tp", .owner = "x"};
  assert_int_equal(tsr_registry_add_module_style(reg, &shared), TSR_EINVAL);
  assert_non_null(
      strstr(tsr_last_error(), "module style 'shared_experts' on dim tp (by x) is not a module"));
  assert_non_null(strstr(tsr_last_error(), "embedding, column_linear, kv_linear, row_linear, "
                                           "rmsnorm, attention, mlp, experts"));
  /* a parameter the module does not have */
  tsr_module_style bias = {.style = TSR_STYLE_ROW_LINEAR,
                           .mesh_dim = "tp",
                           .owner = "x",
                           .nparams = 1,
                           .params = {{"bias", tsr_shard(0)}}};
  assert_int_equal(tsr_registry_add_module_style(reg, &bias), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "no parameter 'bias'"));
  /* a data split that is neither the batch nor the sequence */
  assert_int_equal(tsr_registry_add_data_split(reg, "x", "zdp", tsr_shard(2)), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "Shard(0) (the batch) or Shard(1) (the sequence)"));
  assert_int_equal(tsr_registry_add_data_split(reg, "x", "zdp", tsr_shard(0)), TSR_OK);
  const tsr_module_style *e = tsr_registry_find_module_style(reg, TSR_STYLE_EMBEDDING, "zdp");
  assert_non_null(e);
  assert_true(tsr_placement_equal(e->input, tsr_shard(0)));
  assert_true(tsr_placement_equal(e->output, tsr_shard(0)));
  assert_int_equal(tsr_module_style_param(e, "weight").kind, TSR_REPLICATE);
  /* one stage dim */
  assert_null(tsr_registry_stage_dim(reg));
  assert_int_equal(tsr_registry_set_stage_dim(reg, "a", "pp"), TSR_OK);
  assert_int_equal(tsr_registry_set_stage_dim(reg, "b", "stages"), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "but a declared 'pp'"));
  assert_string_equal(tsr_registry_stage_dim(reg), "pp");
  /* the published lists end in NULL and hold what the model calls */
  int n = 0;
  while (tsr_op_names()[n]) n++;
  assert_int_equal(n, 13); /* 8, the three MoE ops of 1.2, the two document ops of 1.3 */
  n = 0;
  while (tsr_module_style_names()[n]) n++;
  assert_int_equal(n, 8); /* 7, and the experts style of 1.2 */
  tsr_registry_free(reg);
}

static void test_module_styles(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  tsr_module_style col = {.style = "column_linear",
                          .mesh_dim = "tp",
                          .owner = "tp",
                          .nparams = 1,
                          .params = {{"weight", tsr_shard(0)}},
                          .input = tsr_replicate(),
                          .output = tsr_shard(2)};
  assert_int_equal(tsr_registry_add_module_style(reg, &col), TSR_OK);
  const tsr_module_style *s = tsr_registry_find_module_style(reg, "column_linear", "tp");
  assert_non_null(s);
  assert_int_equal(tsr_module_style_param(s, "weight").kind, TSR_SHARD);
  assert_int_equal(tsr_module_style_param(s, "weight").dim, 0);
  assert_int_equal(s->output.dim, 2);
  /* Unlisted parameters and dims without a style are dense and replicated. */
  assert_int_equal(tsr_module_style_param(s, "scale").kind, TSR_REPLICATE);
  assert_null(tsr_registry_find_module_style(reg, "column_linear", "dp"));
  assert_int_equal(tsr_module_style_param(NULL, "weight").kind, TSR_REPLICATE);

  tsr_module_style dup = col;
  dup.owner = "sp";
  assert_int_equal(tsr_registry_add_module_style(reg, &dup), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "registered by tp and again by sp"));

  tsr_module_style cp = {.style = "rmsnorm", .mesh_dim = "ulysses_cp", .owner = "cp_ulysses"};
  assert_int_equal(tsr_registry_add_module_style(reg, &cp), TSR_OK);
  assert_non_null(tsr_registry_find_module_style(reg, "rmsnorm", "ulysses_cp"));
  assert_int_equal(tsr_registry_module_style_count(reg), 2);
  assert_string_equal(tsr_registry_module_style_at(reg, 1)->owner, "cp_ulysses");
  assert_null(tsr_registry_module_style_at(reg, 2));

  tsr_module_style noname = {.style = "rmsnorm"};
  assert_int_equal(tsr_registry_add_module_style(reg, &noname), TSR_EINVAL);
  tsr_registry_free(reg);
}

/* Forward of every microbatch, then backward in reverse: GPipe's order, enough to test dispatch. */
static tsr_status gpipe(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                        int *n, void *ctx) {
  (void)stages, (void)stage, (void)ctx;
  if (2 * microbatches > cap) return tsr_error(TSR_EINVAL, "capacity %d too small", cap);
  *n = 0;
  for (int m = 0; m < microbatches; m++)
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_FORWARD, m, 0};
  for (int m = microbatches - 1; m >= 0; m--)
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_BACKWARD, m, 0};
  return TSR_OK;
}

static void test_schedules(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  tsr_schedule s = {"gpipe", "pp", gpipe, NULL};
  assert_int_equal(tsr_registry_add_schedule(reg, &s), TSR_OK);
  assert_int_equal(tsr_registry_add_schedule(reg, &s), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "schedule 'gpipe' is registered by pp and again by pp"));
  const tsr_schedule *found = tsr_registry_find_schedule(reg, "gpipe");
  assert_non_null(found);
  assert_null(tsr_registry_find_schedule(reg, "1f1b"));
  tsr_pipe_action acts[8];
  int n = 0;
  assert_int_equal(found->build(2, 3, 0, acts, 8, &n, found->ctx), TSR_OK);
  assert_int_equal(n, 6);
  assert_int_equal(acts[3].kind, TSR_PIPE_BACKWARD);
  assert_int_equal(acts[3].microbatch, 2);
  assert_int_equal(tsr_registry_schedule_count(reg), 1);
  tsr_schedule nobuild = {"x", "pp", NULL, NULL};
  assert_int_equal(tsr_registry_add_schedule(reg, &nobuild), TSR_EINVAL);
  tsr_registry_free(reg);
}

typedef struct hook_log {
  char text[128];
  int fail_on; /* id that fails, or -1 */
} hook_log;

typedef struct hook_id {
  hook_log *log;
  int id;
} hook_id;

static tsr_status record(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step, void *ctx) {
  (void)r, (void)step;
  hook_id *h = ctx;
  size_t o = strlen(h->log->text);
  snprintf(h->log->text + o, sizeof h->log->text - o, "%c%d ",
           when == TSR_HOOK_BEFORE_STEP ? 'b' : 'a', h->id);
  if (h->id == h->log->fail_on) return tsr_error(TSR_ECOMM, "replica check lost a peer");
  return TSR_OK;
}

static void test_optim_hooks(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  assert_int_equal(tsr_registry_run_optim_hooks(reg, NULL, TSR_HOOK_BEFORE_STEP, NULL), TSR_OK);
  hook_log log = {"", -1};
  hook_id ids[3] = {{&log, 1}, {&log, 2}, {&log, 3}};
  for (int i = 0; i < 3; i++) {
    /* Names are kept by pointer: use storage that outlives the registry. */
    static const char *const names[] = {"h1", "h2", "h3"};
    tsr_optim_hook before = {names[i], TSR_HOOK_BEFORE_STEP, record, &ids[i]};
    tsr_optim_hook after = {names[i], TSR_HOOK_AFTER_STEP, record, &ids[i]};
    assert_int_equal(tsr_registry_add_optim_hook(reg, &before), TSR_OK);
    assert_int_equal(tsr_registry_add_optim_hook(reg, &after), TSR_OK);
  }
  assert_int_equal(tsr_registry_optim_hook_count(reg), 6);
  tsr_optim_step step = {.step = 7};
  assert_int_equal(tsr_registry_run_optim_hooks(reg, NULL, TSR_HOOK_BEFORE_STEP, &step), TSR_OK);
  assert_int_equal(tsr_registry_run_optim_hooks(reg, NULL, TSR_HOOK_AFTER_STEP, &step), TSR_OK);
  assert_string_equal(log.text, "b1 b2 b3 a3 a2 a1 ");

  log.text[0] = '\0';
  log.fail_on = 2;
  assert_int_equal(tsr_registry_run_optim_hooks(reg, NULL, TSR_HOOK_AFTER_STEP, &step), TSR_ECOMM);
  assert_string_equal(log.text, "a3 a2 ");
  assert_non_null(strstr(tsr_last_error(), "optimizer hook h2 (after step 7): replica check lost"));

  tsr_optim_hook bad = {"bad", (tsr_hook_when)5, record, NULL};
  assert_int_equal(tsr_registry_add_optim_hook(reg, &bad), TSR_EINVAL);
  tsr_registry_free(reg);
}

/* Per-rank state: made once per rank on first use from the rank's allocator (so it counts in the
 * rank's memory), torn down in tsr_rank_free. */
typedef struct rank_state_log {
  int setups, teardowns;
  size_t bytes_seen; /* the rank allocator's bytes in use right after setup */
} rank_state_log;

static tsr_status state_setup(tsr_rank_t *r, void *ctx, void **state) {
  rank_state_log *log = ctx;
  int64_t shape[1] = {256};
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, shape, &t));
  log->setups++;
  log->bytes_seen = tsr_rank_allocator(r)->bytes_in_use;
  *state = t;
  return TSR_OK;
}

static void state_teardown(tsr_rank_t *r, void *state, void *ctx) {
  (void)r;
  ((rank_state_log *)ctx)->teardowns++;
  tsr_tensor_free(state);
}

typedef struct rank_state_case {
  const tsr_registry_t *reg;
  tsr_status unknown;
  bool same;
} rank_state_case;

static tsr_status use_state(tsr_comm_t *comm, void *arg) {
  rank_state_case *c = arg;
  tsr_rank_t *r = NULL;
  TSR_CHECK(tsr_rank_new(comm, c->reg, &r));
  void *a = NULL, *b = NULL, *none = NULL;
  tsr_status st = tsr_rank_state(r, "test.buffer", &a);
  if (st == TSR_OK) st = tsr_rank_state(r, "test.buffer", &b);
  c->same = st == TSR_OK && a && a == b;
  c->unknown = tsr_rank_state(r, "test.nothing", &none);
  tsr_rank_free(r);
  return st;
}

static void test_rank_state(void **state) {
  (void)state;
  tsr_registry_t *reg = new_registry();
  rank_state_log log = {0};
  tsr_rank_state_spec spec = {"test.buffer", state_setup, state_teardown, &log};
  assert_int_equal(tsr_registry_add_rank_state(reg, &spec), TSR_OK);
  assert_int_equal(tsr_registry_add_rank_state(reg, &spec), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "rank state 'test.buffer' is registered twice"));
  tsr_rank_state_spec nosetup = {"test.nosetup", NULL, NULL, NULL};
  assert_int_equal(tsr_registry_add_rank_state(reg, &nosetup), TSR_EINVAL);
  rank_state_case c = {.reg = reg};
  assert_int_equal(tsr_local_launch(1, 10.0, use_state, &c), TSR_OK);
  assert_true(c.same);
  assert_int_equal(log.setups, 1);
  assert_int_equal(log.teardowns, 1);
  assert_true(log.bytes_seen >= 256 * sizeof(float));
  assert_int_equal(c.unknown, TSR_EINVAL);
  tsr_registry_free(reg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_rules),   cmocka_unit_test(test_vocabulary_refusals),
      cmocka_unit_test(test_rank_state), cmocka_unit_test(test_module_styles),
      cmocka_unit_test(test_schedules),  cmocka_unit_test(test_optim_hooks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
