/* cp_allgather: context parallelism by all-gathering K and V, as Llama 3 trains long sequences.
 *
 * The sequence is split over the plugin's dim (the model's inputs enter Shard(1) there), so every
 * row-wise op runs on its shard through the core's generic rules and parameters stay replicated,
 * their gradients resolved by an all-reduce over the dim. Attention is this plugin's one rule
 * (allgather_attention.c). Against ring attention it sends the same K/V bytes in one collective
 * instead of n - 1 exchanges, needs no equal blocks and no log-sum-exp merging, and keeps the
 * whole K and V of a layer while attention runs; with grouped-query attention K and V are the
 * small tensors, which is why Llama 3 chose it.
 *
 * Built out of tree against an installed Tessera (find_package(Tessera)): this file and
 * allgather_attention.c include only <tessera/...>.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_allgather_impl.h"
#include "tessera/mesh.h"
#include "tessera/plugin.h"

static const char *const ag_dims[] = {AG_DIM, NULL};

static const tsr_key_spec ag_keys[] = {
    {"regather_backward", TSR_KEY_BOOL, "false", 0, 0, NULL,
     "all-gather K and V again in backward instead of keeping them from forward (less memory, "
     "one more all-gather per layer)"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

/* Any split of the sequence works (uneven chunks included, as torch.chunk makes them), as long
 * as every rank holds at least one query row. */
static tsr_status ag_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int n = tsr_config_mesh_size(cfg, AG_DIM), u = tsr_config_mesh_size(cfg, "ulysses_cp");
  if (n == 1) return TSR_OK;
  int64_t L;
  TSR_CHECK(tsr_config_key_int(cfg, "data", "seq_len", &L));
  if (L < (int64_t)n * u)
    return tsr_config_error(cfg, TSR_EINVAL, "data", "seq_len",
                            "%lld tokens cannot give every one of the %d sequence shards (%s = %d"
                            "%s) a row; use at least %d tokens or a smaller %s",
                            (long long)L, n * u, AG_DIM, n, u > 1 ? " times ulysses_cp" : "", n * u,
                            AG_DIM);
  return TSR_OK;
}

static tsr_status ag_init(const tsr_plugin_args *args, void **state) {
  ag_state *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "cp_allgather: out of memory");
  tsr_status st =
      tsr_config_get_bool(args->config, args->name, ag_keys, "regather_backward", &s->regather);
  if (st != TSR_OK) {
    free(s);
    return st;
  }
  *state = s;
  return TSR_OK;
}

static void ag_fini(void *state) {
  free(state);
}

static tsr_status ag_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)args;
  const tsr_placement S1 = tsr_shard(1);
  tsr_op_rule sdpa = {.name = "cp_allgather.sdpa",
                      .op = "sdpa",
                      .mesh_dim = AG_DIM,
                      .ninputs = 3,
                      .inputs = {S1, S1, S1},
                      .noutputs = 1,
                      .outputs = {S1},
                      .grads = {S1, S1, S1},
                      .compute = ag_sdpa_forward,
                      .backward = ag_sdpa_backward,
                      .free_saved = ag_sdpa_saved_free,
                      .ctx = state};
  return tsr_registry_add_op_rule(reg, &sdpa);
}

static const tsr_strategy ag_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "cp_allgather",
    .version = "0.1.0",
    .description = "context parallelism on ring_cp by all-gathering K/V (Llama 3 style), dK/dV "
                   "reduce-scattered",
    .dims = ag_dims,
    .keys = ag_keys,
    .validate = ag_validate,
    .init = ag_init,
    .fini = ag_fini,
    .register_rules = ag_register,
};

TSR_PLUGIN_DEFINE(ag_desc);
