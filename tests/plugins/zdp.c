/* zdp: data parallelism on a mesh dim of its own name, `zdp`, by declaration alone.
 *
 * The plugin says one thing: its dim splits the batch. It registers no op rule, no hook and no
 * loss code. Everything else is the core's: the model lays the token ids and labels out as the
 * declaration says, the generic rules run each op on its rows, the loss weighs each shard by its
 * valid tokens over the dims that split the labels, and resolving the replicated weights'
 * Partial gradients is the gradient all-reduce. tests/e2e/fresh_dim.sh checks it against the
 * 1-rank run over several optimizer steps, alone and beside tp, pp and cp_ring. It is what a
 * third party's data-parallel plugin starts from (docs/plugin-guide.md).
 */
#include "tessera/plugin.h"

static const char *const zdp_dims[] = {"zdp", NULL};

static tsr_status zdp_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  *state = NULL;
  return TSR_OK;
}

static void zdp_fini(void *state) {
  (void)state;
}

static tsr_status zdp_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)state;
  return tsr_registry_add_data_split(reg, args->name, zdp_dims[0], tsr_shard(0));
}

static const tsr_strategy zdp_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "zdp",
    .version = "1.0.0",
    .description = "data parallelism on the zdp dim, declared and nothing else",
    .dims = zdp_dims,
    .init = zdp_init,
    .fini = zdp_fini,
    .register_rules = zdp_register,
};

TSR_PLUGIN_DEFINE(zdp_desc);
