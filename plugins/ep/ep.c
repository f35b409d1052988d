/* ep: expert parallelism on the `ep` mesh dim.
 *
 * The dim splits the batch, as data parallelism does: the token ids, labels and activations are
 * Shard(0) on ep, the dense parameters are replicated there, and their Partial(sum) gradients are
 * resolved by the core's all-reduce over ep (tsr_var_resolve_grad, or dp's bucketed hook when dp
 * is loaded beside). What it adds is for the sparse MoE blocks: the "experts" module style splits
 * the stacked expert weights w13 (E, 2I, C) and w2 (E, C, I) by expert, each ep rank holding E / ep
 * consecutive experts, and the rule for moe_experts (ep_dispatch.c) sends every routed token to
 * the rank of its expert and its result back. The expert weights' gradients are Shard(0) like the
 * weights: each rank computes those of its own experts from every token routed to them, so nothing
 * is reduced over ep. The router and the load-balancing loss run on each rank's tokens through the
 * core's generic rules.
 *
 * A job whose model has no experts may still use ep: it is then plain data parallelism.
 */
#include <stdlib.h>
#include <string.h>

#include "ep_impl.h"
#include "tessera/plugin.h"

static const char *const ep_dims[] = {EP_DIM, NULL};

/* [model] num_local_experts, 0 for a dense model. */
static tsr_status read_experts(const tsr_config *cfg, int64_t *experts) {
  return tsr_config_key_int(cfg, "model", "num_local_experts", experts);
}

static tsr_status ep_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int n = tsr_config_mesh_size(cfg, EP_DIM);
  if (n == 1) return TSR_OK;
  int64_t experts = 0;
  TSR_CHECK(read_experts(cfg, &experts));
  if (experts == 0) return TSR_OK; /* a dense model: ep splits the batch and nothing else */
  if (experts % n)
    return tsr_config_error(cfg, TSR_EINVAL, "model", "num_local_experts",
                            "%lld experts cannot be split over ep = %d: each ep rank holds the "
                            "same number of consecutive experts; use a multiple of %d experts, or "
                            "an ep that divides %lld",
                            (long long)experts, n, n, (long long)experts);
  return tsr_plugin_require_host(args, "moves the routed tokens with the host kernels of "
                                       "tessera/kernels.h (tsr_kernel_moe_*)");
}

static tsr_status ep_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  *state = NULL;
  return TSR_OK;
}

static void ep_fini(void *state) {
  (void)state;
}

static tsr_status ep_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  const tsr_placement S0 = tsr_shard(0);
  /* the tokens, labels and activations are split along the batch; dense weights replicated */
  TSR_CHECK(tsr_registry_add_data_split(reg, args->name, EP_DIM, S0));
  tsr_module_style experts = {.style = TSR_STYLE_EXPERTS,
                              .mesh_dim = EP_DIM,
                              .owner = args->name,
                              .nparams = 1,
                              .params = {{"weight", S0}},
                              .input = S0,
                              .output = S0};
  TSR_CHECK(tsr_registry_add_module_style(reg, &experts));
  tsr_op_rule dispatch = {.name = "ep.moe_experts",
                          .op = TSR_OP_MOE_EXPERTS,
                          .mesh_dim = EP_DIM,
                          .ninputs = 4,
                          .inputs = {S0, S0, S0, S0},
                          .noutputs = 1,
                          .outputs = {S0},
                          .grads = {S0, S0, S0, S0},
                          .compute = ep_experts_forward,
                          .backward = ep_experts_backward,
                          .free_saved = ep_experts_saved_free,
                          .ctx = state};
  return tsr_registry_add_op_rule(reg, &dispatch);
}

/* The dispatch assumes ep alone splits the experts and is the one dim whose rule communicates
 * inside moe_experts: a job where another loaded plugin splits them too, or moves the op's rows
 * itself, is refused here rather than at its first step. */
static tsr_status ep_check_registry(const tsr_registry_t *reg, const tsr_plugin_args *args,
                                    void *state) {
  (void)state;
  const tsr_config *cfg = args->config;
  if (tsr_config_mesh_size(cfg, EP_DIM) == 1) return TSR_OK;
  for (int i = 0; i < tsr_registry_module_style_count(reg); i++) {
    const tsr_module_style *st = tsr_registry_module_style_at(reg, i);
    if (strcmp(st->style, TSR_STYLE_EXPERTS) || !strcmp(st->mesh_dim, EP_DIM) ||
        tsr_config_mesh_size(cfg, st->mesh_dim) == 1)
      continue;
    tsr_placement w = tsr_module_style_param(st, "weight");
    if (w.kind == TSR_SHARD && w.dim == 0)
      return tsr_config_error(
          cfg, TSR_EINVAL, "mesh", "dims",
          "plugin %s splits the experts over %s = %d and ep splits them "
          "over ep = %d; ep dispatches tokens to the experts of one split "
          "only: drop %s from the mesh, or leave %s out of [plugins] load",
          st->owner ? st->owner : "?", st->mesh_dim, tsr_config_mesh_size(cfg, st->mesh_dim),
          tsr_config_mesh_size(cfg, EP_DIM), st->mesh_dim, st->owner ? st->owner : "it");
  }
  for (int i = 0; i < tsr_registry_op_rule_count(reg); i++) {
    const tsr_op_rule *rule = tsr_registry_op_rule_at(reg, i);
    /* a rule that composes hands the op on to ep's (tsr_op_defer_forward): that works */
    if (strcmp(rule->op, TSR_OP_MOE_EXPERTS) || !rule->compute || rule->composes) continue;
    if (rule->mesh_dim && !strcmp(rule->mesh_dim, EP_DIM)) continue;
    if (rule->mesh_dim && tsr_config_mesh_size(cfg, rule->mesh_dim) == 1) continue;
    return tsr_config_error(cfg, TSR_EINVAL, "mesh", "dims",
                            "rule '%s' communicates inside moe_experts on %s and so does ep's "
                            "'ep.moe_experts' on ep = %d; one op can run one of them: drop %s "
                            "from the mesh, or ep",
                            rule->name, rule->mesh_dim ? rule->mesh_dim : "every dim",
                            tsr_config_mesh_size(cfg, EP_DIM),
                            rule->mesh_dim ? rule->mesh_dim : "the other plugin's dim");
  }
  return TSR_OK;
}

static const tsr_strategy ep_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = EP_NAME,
    .version = "0.1.0",
    .description = "expert parallelism: the batch split over ep, each rank holding E/ep experts, "
                   "tokens sent to their experts and back by all-to-all",
    .dims = ep_dims,
    .validate = ep_validate,
    .init = ep_init,
    .fini = ep_fini,
    .register_rules = ep_register,
    .check_registry = ep_check_registry,
};

TSR_PLUGIN_DEFINE(ep_desc);
