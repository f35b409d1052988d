/* cp_allgather: context parallelism by all-gathering K and V, as Llama 3 trains long sequences.
 *
 * The plugin owns a mesh dim of its own name, ag_cp, and declares in one call that the dim splits
 * the sequence (tsr_registry_add_data_split with Shard(1)): the model's token ids and labels enter
 * Shard(1) there, every row-wise op runs on its shard through the core's generic rules, parameters
 * stay replicated and their gradients are resolved by an all-reduce over the dim. Attention is
 * this plugin's one rule (allgather_attention.c). Against ring attention it sends the same K/V
 * bytes in one collective instead of n - 1 exchanges, needs no equal blocks and no log-sum-exp
 * merging, and keeps the whole K and V of a layer while attention runs; with grouped-query
 * attention K and V are the small tensors, which is why Llama 3 chose it.
 *
 * Built out of tree against an installed Tessera (find_package(Tessera)): this file and
 * allgather_attention.c include only <tessera/...>.
 */
#include <stdio.h>
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
 * as every rank holds at least one query row. Other dims may split the sequence too (cp_ulysses's,
 * or any plugin's that declares a Shard(1) data split); which ones is known only once every plugin
 * has registered, so the check runs in check_registry and asks the registry, not dim names. */
static tsr_status ag_check_registry(const tsr_registry_t *reg, const tsr_plugin_args *args,
                                    void *state) {
  (void)state;
  const tsr_config *cfg = args->config;
  if (tsr_config_mesh_size(cfg, AG_DIM) == 1) return TSR_OK;
  int64_t shards = 1, L;
  char dims[256] = "";
  size_t o = 0;
  for (int i = 0; i < tsr_config_mesh_ndim(cfg); i++) {
    const char *dim = tsr_config_mesh_dim(cfg, i);
    const tsr_module_style *split = tsr_registry_find_module_style(reg, TSR_STYLE_EMBEDDING, dim);
    int n = tsr_config_mesh_size(cfg, dim);
    if (n == 1 || !split || !tsr_placement_equal(split->input, tsr_shard(1))) continue;
    shards *= n;
    if (o < sizeof dims)
      o += (size_t)snprintf(dims + o, sizeof dims - o, "%s%s = %d", o ? " x " : "", dim, n);
  }
  TSR_CHECK(tsr_config_key_int(cfg, "data", "seq_len", &L));
  if (L < shards)
    return tsr_config_error(cfg, TSR_EINVAL, "data", "seq_len",
                            "%lld tokens cannot give every one of the %lld sequence shards (%s) "
                            "a row; use at least %lld tokens or a smaller %s",
                            (long long)L, (long long)shards, dims, (long long)shards, AG_DIM);
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
  const tsr_placement S1 = tsr_shard(1);
  tsr_op_rule sdpa = {.name = "cp_allgather.sdpa",
                      .op = TSR_OP_SDPA,
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
  TSR_CHECK(tsr_registry_add_op_rule(reg, &sdpa));
  /* The data layout: the token ids, the labels and the hidden states between pipeline stages are
   * split along the sequence (tensor dim 1) on AG_DIM. Without it they would stay replicated
   * there and attention would never see a sequence shard. */
  return tsr_registry_add_data_split(reg, args->name, AG_DIM, S1);
}

static const tsr_strategy ag_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "cp_allgather",
    .version = "0.1.0",
    .description = "context parallelism on its own ag_cp dim by all-gathering K/V (Llama 3 "
                   "style), dK/dV reduce-scattered",
    .dims = ag_dims,
    .keys = ag_keys,
    .init = ag_init,
    .fini = ag_fini,
    .register_rules = ag_register,
    .check_registry = ag_check_registry,
};

TSR_PLUGIN_DEFINE(ag_desc);
