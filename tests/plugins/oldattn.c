/* oldattn: a plugin as written before document masking (ABI 1.2): it owns the `oldcp` dim,
 * splits the sequence over it and registers attention for it, a rule for `sdpa` only. A job with
 * [data] mask = document on an oldcp mesh must be refused, naming this plugin, rather than run
 * its rule and attend across documents (tests/e2e/doc_mask.sh errors). The rule itself only
 * declares placements: each rank would attend within its own shard, which no test runs. */
#include "tessera/plugin.h"

static const char *const old_dims[] = {"oldcp", NULL};

static tsr_status old_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  *state = NULL;
  return TSR_OK;
}

static void old_fini(void *state) {
  (void)state;
}

static tsr_status old_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)state;
  const tsr_placement S1 = tsr_shard(1);
  tsr_op_rule sdpa = {.name = "oldattn.sdpa",
                      .op = TSR_OP_SDPA,
                      .mesh_dim = old_dims[0],
                      .ninputs = 3,
                      .inputs = {S1, S1, S1},
                      .noutputs = 1,
                      .outputs = {S1},
                      .grads = {S1, S1, S1}};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &sdpa));
  return tsr_registry_add_data_split(reg, args->name, old_dims[0], S1);
}

static const tsr_strategy old_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = 2, /* built before document masking */
    .struct_size = sizeof(tsr_strategy),
    .name = "oldattn",
    .version = "1.2.0",
    .description = "a sequence split with an attention rule that predates document masking",
    .dims = old_dims,
    .init = old_init,
    .fini = old_fini,
    .register_rules = old_register,
};

TSR_PLUGIN_DEFINE(old_desc);
