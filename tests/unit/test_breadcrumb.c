/* The breadcrumb (tessera/breadcrumb.h): what each plugin callback sees while the core runs it,
 * that it is put back afterwards, and the owner recorded when the callback was registered.
 *
 * A registry is filled the way the loader fills it, with a plugin's register_rules in the
 * breadcrumb, and two ranks on the mesh dim `bc` (size 2) run every kind of callback the core
 * invokes on a rank: a redistribute transition, an op rule's compute and backward, gradient
 * hooks, a rank state's setup and teardown, an optimizer hook. Rank bodies return TSR_EINTERNAL
 * instead of asserting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/autograd.h"
#include "tessera/breadcrumb.h"
#include "tessera/mesh.h"
#include "tessera/ops.h"
#include "tessera/registry.h"

#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) return TSR_ERROR(TSR_EINTERNAL, __VA_ARGS__);                                     \
  } while (0)

enum {
  SEEN_MATCH,
  SEEN_FORWARD,
  SEEN_BACKWARD,
  SEEN_READY,
  SEEN_DONE,
  SEEN_SETUP,
  SEEN_TEARDOWN,
  SEEN_HOOK,
  SEEN_FREE_HOOK,
  SEEN_N
};

/* What each callback saw on each rank: "plugin|callback|name|phase|op|op_pass|rank|step|mb". */
typedef struct seen_log {
  char text[2][SEEN_N][160];
} seen_log;

static seen_log seen;

static void see(int rank, int which) {
  const tsr_breadcrumb *b = tsr_breadcrumb_here();
  if (rank < 0 || rank > 1 || seen.text[rank][which][0]) return; /* the first call of a kind */
  snprintf(seen.text[rank][which], sizeof seen.text[rank][which], "%s|%s|%s|%s|%s|%s|%d|%lld|%d",
           b->plugin ? b->plugin : "-", b->callback ? b->callback : "-", b->name ? b->name : "-",
           b->phase ? b->phase : "-", b->op ? b->op : "-", b->op_pass ? b->op_pass : "-", b->rank,
           (long long)b->step, b->microbatch);
}

static bool match_never(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst,
                        void *ctx) {
  (void)x, (void)dim, (void)src, (void)dst, (void)ctx;
  see(tsr_breadcrumb_here()->rank, SEEN_MATCH);
  return false;
}

static tsr_status apply_never(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                              tsr_dtensor **out, void *ctx) {
  (void)r, (void)x, (void)dim, (void)dst, (void)out, (void)ctx;
  return TSR_ERROR(TSR_EINTERNAL, "never matched");
}

static tsr_status copy_compute(tsr_rank_t *r, int dim, int ninputs,
                               const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                               tsr_dtensor **outputs, void **saved, void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)saved, (void)ctx;
  see(tsr_rank_id(r), SEEN_FORWARD);
  return tsr_dtensor_clone(r, inputs[0], &outputs[0]);
}

static tsr_status copy_backward(tsr_rank_t *r, int dim, int ninputs,
                                const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                                const tsr_dtensor *const *outputs,
                                const tsr_dtensor *const *grad_outputs, tsr_dtensor **grad_inputs,
                                void *saved, void *ctx) {
  (void)dim, (void)ninputs, (void)inputs, (void)attrs, (void)noutputs, (void)outputs;
  (void)saved, (void)ctx;
  see(tsr_rank_id(r), SEEN_BACKWARD);
  TSR_CHECK(tsr_dtensor_clone(r, grad_outputs[0], &grad_inputs[0]));
  return tsr_dtensor_clone(r, grad_outputs[0], &grad_inputs[1]);
}

static tsr_status grads_ready(tsr_rank_t *r, tsr_var *leaf, void *ctx) {
  (void)leaf, (void)ctx;
  see(tsr_rank_id(r), SEEN_READY);
  return TSR_OK;
}

static tsr_status grads_done(tsr_rank_t *r, void *ctx) {
  (void)ctx;
  see(tsr_rank_id(r), SEEN_DONE);
  return TSR_OK;
}

static tsr_status state_setup(tsr_rank_t *r, void *ctx, void **state) {
  (void)ctx;
  see(tsr_rank_id(r), SEEN_SETUP);
  *state = NULL;
  return TSR_OK;
}

static void state_teardown(tsr_rank_t *r, void *state, void *ctx) {
  (void)state, (void)ctx;
  see(tsr_rank_id(r), SEEN_TEARDOWN);
}

static tsr_status hook(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step, void *ctx) {
  (void)when, (void)step;
  see(tsr_rank_id(r), ctx ? SEEN_FREE_HOOK : SEEN_HOOK);
  return TSR_OK;
}

typedef struct crumb_case {
  tsr_mesh_t *mesh;
  tsr_registry_t *reg;
} crumb_case;

/* After a callback the breadcrumb holds no callback and no op again. */
static tsr_status expect_idle(const char *after) {
  const tsr_breadcrumb *b = tsr_breadcrumb_here();
  EXPECT(!b->plugin && !b->callback && !b->name && !b->phase && !b->op && !b->op_pass,
         "after %s the breadcrumb still says %s %s %s", after, b->plugin ? b->plugin : "-",
         b->callback ? b->callback : "-", b->op ? b->op : "-");
  return TSR_OK;
}

static tsr_status run_callbacks(tsr_comm_t *comm, void *arg) {
  crumb_case *c = arg;
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  EXPECT(b->rank == tsr_comm_rank(comm), "rank %d's breadcrumb says rank %d", tsr_comm_rank(comm),
         b->rank);
  EXPECT(b->step == 0 && b->microbatch == -1, "a fresh rank is in step %lld, microbatch %d",
         (long long)b->step, b->microbatch);
  b->step = 4; /* as a training loop sets them */
  b->microbatch = 1;
  tsr_rank_t *r = NULL;
  TSR_CHECK(tsr_rank_new(comm, c->reg, &r));
  void *state = NULL;
  TSR_CHECK(tsr_rank_state(r, "bc.state", &state));
  TSR_CHECK(expect_idle("rank state setup"));

  int64_t shape[2] = {4, 3};
  tsr_tensor *full = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 2, shape, &full));
  tsr_tensor_fill_arange(full, 1, 0);
  tsr_placement s0 = tsr_shard(0), rep = tsr_replicate();
  tsr_dtensor *gate = NULL, *up = NULL, *moved = NULL, *grad = NULL;
  TSR_CHECK(tsr_dtensor_distribute(r, c->mesh, full, &s0, &gate));
  TSR_CHECK(tsr_dtensor_distribute(r, c->mesh, full, &s0, &up));
  tsr_tensor_free(full);
  TSR_CHECK(tsr_dtensor_redistribute(r, gate, c->mesh, &rep, &moved));
  tsr_dtensor_free(moved);
  TSR_CHECK(expect_idle("a redistribute"));

  tsr_var *g = NULL, *u = NULL, *out = NULL;
  tsr_tape_t *tape = NULL;
  TSR_CHECK(tsr_var_new_leaf(gate, true, "gate", &g));
  TSR_CHECK(tsr_var_new_leaf(up, true, "up", &u));
  TSR_CHECK(tsr_tape_new(r, &tape));
  TSR_CHECK(tsr_op_swiglu(tape, g, u, &out));
  TSR_CHECK(expect_idle("an op's forward"));
  TSR_CHECK(tsr_dtensor_clone(r, out->value, &grad));
  TSR_CHECK(tsr_tape_backward_with(tape, out, grad));
  TSR_CHECK(expect_idle("backward"));
  tsr_optim_step step = {.step = 4};
  TSR_CHECK(tsr_registry_run_optim_hooks(c->reg, r, TSR_HOOK_BEFORE_STEP, &step));
  TSR_CHECK(expect_idle("the optimizer hooks"));
  tsr_tape_free(tape);
  tsr_var_free(g);
  tsr_var_free(u);
  tsr_rank_free(r);
  return expect_idle("rank state teardown");
}

static void test_callbacks_see_the_breadcrumb(void **state) {
  (void)state;
  memset(&seen, 0, sizeof seen);
  crumb_case c = {0};
  int shape[1] = {2};
  const char *names[1] = {"bc"};
  assert_int_equal(tsr_mesh_init(2, 1, shape, names, &c.mesh), TSR_OK);
  assert_int_equal(tsr_registry_new(&c.reg), TSR_OK);

  /* The loader runs register_rules with the plugin in the breadcrumb; what it adds is the
   * plugin's. */
  tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter("bcplug", "register_rules", NULL, NULL);
  tsr_redistribute_rule move = {"bc.move", "bc", match_never, apply_never, NULL};
  assert_int_equal(tsr_registry_add_redistribute(c.reg, &move), TSR_OK);
  tsr_op_rule rule = {.name = "bc.swiglu",
                      .op = TSR_OP_SWIGLU,
                      .mesh_dim = "bc",
                      .ninputs = 2,
                      .inputs = {tsr_shard(0), tsr_shard(0)},
                      .noutputs = 1,
                      .outputs = {tsr_shard(0)},
                      .grads = {tsr_shard(0), tsr_shard(0)},
                      .compute = copy_compute,
                      .backward = copy_backward};
  assert_int_equal(tsr_registry_add_op_rule(c.reg, &rule), TSR_OK);
  tsr_grad_hook grads = {"bc.grads", grads_ready, grads_done, NULL};
  assert_int_equal(tsr_registry_add_grad_hook(c.reg, &grads), TSR_OK);
  tsr_rank_state_spec spec = {"bc.state", state_setup, state_teardown, NULL};
  assert_int_equal(tsr_registry_add_rank_state(c.reg, &spec), TSR_OK);
  tsr_optim_hook before = {"bc.hook", TSR_HOOK_BEFORE_STEP, hook, NULL};
  assert_int_equal(tsr_registry_add_optim_hook(c.reg, &before), TSR_OK);
  tsr_breadcrumb_leave(&crumb);
  /* registered by the program itself: no plugin to name */
  static int mark;
  tsr_optim_hook free_hook = {"free.hook", TSR_HOOK_BEFORE_STEP, hook, &mark};
  assert_int_equal(tsr_registry_add_optim_hook(c.reg, &free_hook), TSR_OK);
  assert_null(tsr_breadcrumb_here()->plugin);
  assert_int_equal(tsr_breadcrumb_here()->rank, -1); /* the test's thread runs no rank */

  if (tsr_local_launch(2, 30.0, run_callbacks, &c) != TSR_OK) fail_msg("%s", tsr_last_error());
  for (int q = 0; q < 2; q++) {
    char want[SEEN_N][160];
    const char *const fmt[SEEN_N] = {
        "bcplug|redistribute transition|bc.move|match|-|-|%d|4|1",
        "bcplug|op rule|bc.swiglu|forward|swiglu|forward|%d|4|1",
        "bcplug|op rule|bc.swiglu|backward|swiglu|backward|%d|4|1",
        "bcplug|gradient hook|bc.grads|ready|-|-|%d|4|1",
        "bcplug|gradient hook|bc.grads|done|-|-|%d|4|1",
        "bcplug|rank state|bc.state|setup|-|-|%d|4|1",
        "bcplug|rank state|bc.state|teardown|-|-|%d|4|1",
        "bcplug|optimizer hook|bc.hook|before step|-|-|%d|4|1",
        "-|optimizer hook|free.hook|before step|-|-|%d|4|1",
    };
    for (int k = 0; k < SEEN_N; k++) {
      snprintf(want[k], sizeof want[k], fmt[k], q);
      assert_string_equal(seen.text[q][k], want[k]);
    }
  }
  tsr_registry_free(c.reg);
  tsr_mesh_free(c.mesh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_callbacks_see_the_breadcrumb),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
