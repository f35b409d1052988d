/* crash: a plugin that crashes, or fails, on one rank, for the tests of `tessera run`'s crash
 * reports and of the failure it names as the cause (tests/plugins/CMakeLists.txt).
 *
 * It owns the dim `crash`, which splits the batch, and registers a rule for swiglu on it that
 * computes swiglu on the rank's rows (forward and backward), an optimizer hook before each step
 * and one after it. [strategy.crash] says what goes wrong where:
 *   action     segv (writes through NULL), fpe (raises SIGFPE), bus (raises SIGBUS), abort, or
 *              fail (returns an error, after which the other ranks fail in turn);
 *   where      forward or backward (the swiglu rule), hook (the before-step hook), or init
 *              (the plugin's init, before any rank starts);
 *   rank, step, microbatch: on which rank, in which optimizer step and in which microbatch
 *              (gradient accumulation step; not for the hook).
 * The plugin counts steps and microbatches itself (its after-step hook, and its rule's calls per
 * layer), so what it does does not depend on the breadcrumb the reports are read from. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/kernels.h"
#include "tessera/plugin.h"

static const char *const crash_dims[] = {"crash", NULL};

static const tsr_key_spec crash_keys[] = {
    {"action", TSR_KEY_ENUM, "segv", 0, 0, "segv|fpe|bus|abort|fail", "what goes wrong"},
    {"where", TSR_KEY_ENUM, "forward", 0, 0, "forward|backward|hook|init", "in which callback"},
    {"rank", TSR_KEY_INT, "1", 0, 1023, NULL, "the rank it happens on"},
    {"step", TSR_KEY_INT, "2", 1, 1000000, NULL, "the optimizer step it happens in"},
    {"microbatch", TSR_KEY_INT, "0", 0, 1000000, NULL, "the microbatch it happens in"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct crash_job {
  char action[16], where[16];
  int64_t rank, step, microbatch, layers;
} crash_job;

/* Each rank's count, on the rank's thread (a rank is a thread, or a process under mpi). */
static _Thread_local int64_t steps_done, forwards, backwards;

static tsr_status go_wrong(const crash_job *j, int rank) {
  if (!strcmp(j->action, "segv")) {
    volatile int *volatile nowhere = NULL;
    *nowhere = 1;
  } else if (!strcmp(j->action, "fpe")) {
    raise(SIGFPE);
  } else if (!strcmp(j->action, "bus")) {
    raise(SIGBUS);
  } else if (!strcmp(j->action, "abort")) {
    abort();
  }
  return tsr_error(TSR_EINTERNAL, "crash fixture: deliberate failure on rank %d in step %lld", rank,
                   (long long)(steps_done + 1));
}

/* Whether the `n`-th call (from 1) this step of a rule run once per layer is the chosen one. */
static bool chosen(const crash_job *j, int rank, const char *where, int64_t n) {
  return !strcmp(j->where, where) && rank == j->rank && steps_done + 1 == j->step &&
         (n - 1) / j->layers == j->microbatch;
}

static tsr_status swiglu_compute(tsr_rank_t *r, int dim, int ninputs,
                                 const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                                 tsr_dtensor **outputs, void **saved, void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)saved;
  const crash_job *j = ctx;
  if (chosen(j, tsr_rank_id(r), "forward", ++forwards)) TSR_CHECK(go_wrong(j, tsr_rank_id(r)));
  TSR_CHECK(tsr_dtensor_clone(r, inputs[0], &outputs[0]));
  tsr_kernel_swiglu_forward(tsr_tensor_data(outputs[0]->local), tsr_tensor_data(inputs[0]->local),
                            tsr_tensor_data(inputs[1]->local), tsr_tensor_numel(inputs[0]->local));
  return TSR_OK;
}

static tsr_status swiglu_backward(tsr_rank_t *r, int dim, int ninputs,
                                  const tsr_dtensor *const *inputs, const void *attrs, int noutputs,
                                  const tsr_dtensor *const *outputs,
                                  const tsr_dtensor *const *grad_outputs, tsr_dtensor **grad_inputs,
                                  void *saved, void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)outputs, (void)saved;
  const crash_job *j = ctx;
  if (chosen(j, tsr_rank_id(r), "backward", ++backwards)) TSR_CHECK(go_wrong(j, tsr_rank_id(r)));
  TSR_CHECK(tsr_dtensor_clone(r, inputs[0], &grad_inputs[0]));
  TSR_CHECK(tsr_dtensor_clone(r, inputs[1], &grad_inputs[1]));
  tsr_kernel_swiglu_backward(
      tsr_tensor_data(grad_inputs[0]->local), tsr_tensor_data(grad_inputs[1]->local),
      tsr_tensor_data(grad_outputs[0]->local), tsr_tensor_data(inputs[0]->local),
      tsr_tensor_data(inputs[1]->local), tsr_tensor_numel(inputs[0]->local));
  return TSR_OK;
}

static tsr_status before_step(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                              void *ctx) {
  (void)when;
  const crash_job *j = ctx;
  if (!strcmp(j->where, "hook") && tsr_rank_id(r) == j->rank && step->step == j->step)
    return go_wrong(j, tsr_rank_id(r));
  return TSR_OK;
}

static tsr_status after_step(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                             void *ctx) {
  (void)r, (void)when, (void)ctx;
  steps_done = step->step;
  forwards = backwards = 0;
  return TSR_OK;
}

static tsr_status crash_init(const tsr_plugin_args *args, void **state) {
  crash_job *j = calloc(1, sizeof *j);
  if (!j) return tsr_error(TSR_ENOMEM, "crash fixture: out of memory");
  const tsr_config *c = args->config;
  snprintf(j->action, sizeof j->action, "%s", tsr_config_get(c, args->name, crash_keys, "action"));
  snprintf(j->where, sizeof j->where, "%s", tsr_config_get(c, args->name, crash_keys, "where"));
  tsr_status st = tsr_config_get_int(c, args->name, crash_keys, "rank", &j->rank);
  if (st == TSR_OK) st = tsr_config_get_int(c, args->name, crash_keys, "step", &j->step);
  if (st == TSR_OK)
    st = tsr_config_get_int(c, args->name, crash_keys, "microbatch", &j->microbatch);
  if (st == TSR_OK) st = tsr_config_key_int(c, "model", "num_hidden_layers", &j->layers);
  if (st == TSR_OK && !strcmp(j->where, "init")) st = go_wrong(j, -1);
  if (st != TSR_OK) {
    free(j);
    return st;
  }
  *state = j;
  return TSR_OK;
}

static void crash_fini(void *state) {
  free(state);
}

static tsr_status crash_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  TSR_CHECK(tsr_registry_add_data_split(reg, args->name, crash_dims[0], tsr_shard(0)));
  tsr_op_rule rule = {.name = "crash.swiglu",
                      .op = TSR_OP_SWIGLU,
                      .mesh_dim = crash_dims[0],
                      .ninputs = 2,
                      .inputs = {tsr_shard(0), tsr_shard(0)},
                      .noutputs = 1,
                      .outputs = {tsr_shard(0)},
                      .grads = {tsr_shard(0), tsr_shard(0)},
                      .compute = swiglu_compute,
                      .backward = swiglu_backward,
                      .ctx = state};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &rule));
  tsr_optim_hook before = {"crash.hook", TSR_HOOK_BEFORE_STEP, before_step, state};
  tsr_optim_hook after = {"crash.count", TSR_HOOK_AFTER_STEP, after_step, state};
  TSR_CHECK(tsr_registry_add_optim_hook(reg, &before));
  return tsr_registry_add_optim_hook(reg, &after);
}

static tsr_status crash_validate(const tsr_plugin_args *args) {
  return tsr_plugin_require_host(args, "computes swiglu on the host");
}

static const tsr_strategy crash_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "crash",
    .version = "0.0.1",
    .description = "crashes or fails on one rank, for the crash-report tests",
    .dims = crash_dims,
    .keys = crash_keys,
    .validate = crash_validate,
    .init = crash_init,
    .fini = crash_fini,
    .register_rules = crash_register,
};

TSR_PLUGIN_DEFINE(crash_desc);
