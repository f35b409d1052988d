/* mirror: replicated execution along one mesh dim, as a determinism check.
 *
 * Every rank along the `mirror` dim holds every parameter and sees the same data (all module
 * styles are Replicate on the dim), so the ranks along it must compute bit-identical results.
 * After every `check_every`-th optimizer step, the plugin compares each parameter with the copy
 * on coordinate 0 of the dim and fails the step, naming the parameter and the rank, at the first
 * difference. It is the smallest strategy that does real work, which makes it the example plugin
 * of docs/plugin-guide.md and the owner of the multi-rank mesh in examples/mirror.ini.
 */
#include <stdlib.h>
#include <string.h>

#include "tessera/plugin.h"

typedef struct mirror_state {
  int64_t check_every; /* 0: never compare */
} mirror_state;

static const char *const mirror_dims[] = {"mirror", NULL};

static const tsr_key_spec mirror_keys[] = {
    {"check_every", TSR_KEY_INT, "1", 0, 1000000, NULL,
     "compare the replicas after every N-th optimizer step; 0 = never"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static const char *const mirror_styles[] = {"column_linear", "row_linear", "embedding", "rmsnorm"};

static tsr_status mirror_validate(const tsr_plugin_args *args) {
  int64_t every;
  TSR_CHECK(tsr_config_get_int(args->config, args->name, mirror_keys, "check_every", &every));
  if (every > args->config->job.steps && args->config->job.mode == TSR_MODE_TRAIN)
    return tsr_config_error(args->config, TSR_EINVAL, "strategy.mirror", "check_every",
                            "%lld is more than [job] steps = %lld, so no step would be checked; "
                            "lower it, or 0 to disable the check",
                            (long long)every, (long long)args->config->job.steps);
  return TSR_OK;
}

static tsr_status mirror_init(const tsr_plugin_args *args, void **state) {
  mirror_state *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "mirror: out of memory");
  tsr_status st =
      tsr_config_get_int(args->config, args->name, mirror_keys, "check_every", &s->check_every);
  if (st != TSR_OK) {
    free(s);
    return st;
  }
  *state = s;
  return TSR_OK;
}

static void mirror_fini(void *state) {
  free(state);
}

/* True in *same when `local` equals the copy of it that member 0 of `g` holds. Collective. */
static tsr_status same_as_first(tsr_group_t *g, const tsr_tensor *local, bool *same) {
  tsr_tensor *ref = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_tensor_clone(local, &ref), st);
  TSR_CHECK_GOTO(
      tsr_comm_broadcast(g, tsr_tensor_data(ref), (size_t)tsr_tensor_numel(ref), ref->dtype, 0),
      st);
  *same = tsr_tensor_equal(ref, local);
cleanup:
  tsr_tensor_free(ref);
  return st;
}

/* Compares every parameter with the replica on coordinate 0 of the mirror dim. */
static tsr_status mirror_check(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                               void *ctx) {
  const mirror_state *s = ctx;
  if (s->check_every == 0 || step->step % s->check_every != 0) return TSR_OK;
  int dim = tsr_mesh_find_dim(step->mesh, "mirror");
  if (dim < 0 || tsr_mesh_dim_size(step->mesh, dim) == 1) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(step->mesh, tsr_rank_comm(r), 1u << dim, &g));
  for (int i = 0; i < step->nparams; i++) {
    if (!step->params[i]->local) continue;
    bool same = false;
    TSR_CHECK(same_as_first(g, step->params[i]->local, &same));
    if (!same)
      return tsr_error(TSR_EINTERNAL,
                       "mirror: parameter %s on rank %d differs from its replica on mirror "
                       "coordinate 0 after step %lld; the computation is not deterministic",
                       step->names[i], tsr_rank_id(r), (long long)step->step);
  }
  return TSR_OK;
}

static tsr_status mirror_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  for (size_t i = 0; i < sizeof mirror_styles / sizeof mirror_styles[0]; i++) {
    tsr_module_style style = {
        .style = mirror_styles[i],
        .mesh_dim = "mirror",
        .owner = args->name,
        .nparams = 1,
        .params = {{"weight", tsr_replicate()}},
        .input = tsr_replicate(),
        .output = tsr_replicate(),
    };
    TSR_CHECK(tsr_registry_add_module_style(reg, &style));
  }
  tsr_optim_hook hook = {"mirror.check", TSR_HOOK_AFTER_STEP, mirror_check, state};
  return tsr_registry_add_optim_hook(reg, &hook);
}

static const tsr_strategy mirror_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "mirror",
    .version = "0.1.0",
    .description = "replicated execution along a dim; checks that replicas stay bit-identical",
    .dims = mirror_dims,
    .keys = mirror_keys,
    .validate = mirror_validate,
    .init = mirror_init,
    .fini = mirror_fini,
    .register_rules = mirror_register,
};

TSR_PLUGIN_DEFINE(mirror_desc);
