/* sp: sequence parallelism over the tp mesh dim (Megatron's, TorchTitan's SequenceParallel).
 *
 * Under plain tp the norms and residual adds run replicated: every rank of tp computes the same
 * (B, L, C) values. sp splits those regions along the sequence instead, Shard(1) on tp:
 *   rmsnorm      input and output S(1); the weight stays replicated (its gradient is Partial
 *                over the sequence shards and is all-reduced when resolved);
 *   row_linear   output S(1): its Partial sums are reduce-scattered onto the sequence instead of
 *                all-reduced;
 *   embedding    output S(1): the hidden-split lookup is moved onto the sequence by all-to-all.
 * Before a column linear the tp style gathers the input (S(1) -> R, an all-gather; its adjoint in
 * backward is the reduce-scatter). Per layer that is the same bytes as tp's all-reduces, with the
 * activations of the norm regions divided by tp.
 *
 * sp owns no mesh dim and requires tp; tp leaves these three styles to sp when the job loads it.
 * A sequence that tp does not divide is split unevenly as torch.chunk does (7 over 4: 2, 2, 2, 1);
 * every op of the norm regions works row by row, so nothing else changes. A split that would
 * leave a rank without tokens (5 over 4: 2, 2, 1, 0) is a plan-time error.
 */
#include <stdlib.h>
#include <string.h>

#include "tessera/plugin.h"

static const char *const sp_required[] = {"tp", NULL};

static tsr_status sp_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int tp = tsr_config_mesh_size(cfg, "tp");
  /* torch.chunk leaves trailing ranks empty when ceil(L / tp) is too coarse (5 over 4 gives 2, 2,
   * 1, 0): the step would still be right, but a rank would hold no tokens of the norm regions,
   * which is never what a job means */
  int64_t L;
  TSR_CHECK(tsr_config_key_int(cfg, "data", "seq_len", &L));
  if (tp > 1 && tsr_chunk_size(L, tp, tp - 1) == 0)
    return tsr_config_error(cfg, TSR_EINVAL, "data", "seq_len",
                            "%lld tokens over tp = %d split into chunks of %lld, leaving the last "
                            "rank without tokens for sequence parallelism; use a multiple of %d "
                            "or drop sp from [plugins] load",
                            (long long)L, tp, (long long)tsr_chunk_size(L, tp, 0), tp);
  return TSR_OK;
}

static tsr_status sp_init(const tsr_plugin_args *args, void **state) {
  *state = NULL;
  return TSR_OK;
}

static void sp_fini(void *state) {}

static tsr_status add_style(tsr_registry_t *reg, const char *owner, const char *style,
                            tsr_placement weight, tsr_placement input, tsr_placement output) {
  tsr_module_style s = {
      .style = style,
      .mesh_dim = "tp",
      .owner = owner,
      .nparams = 1,
      .params = {{"weight", weight}},
      .input = input,
      .output = output,
  };
  return tsr_registry_add_module_style(reg, &s);
}

static tsr_status sp_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  const tsr_placement R = tsr_replicate(), S1 = tsr_shard(1), S2 = tsr_shard(2);
  /* the weights are placed as tp places them; only the activations move to the sequence */
  TSR_CHECK(add_style(reg, args->name, "rmsnorm", R, S1, S1));
  TSR_CHECK(add_style(reg, args->name, "row_linear", S1, S2, S1));
  return add_style(reg, args->name, "embedding", S1, R, S1);
}

static const tsr_strategy sp_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "sp",
    .version = "0.1.0",
    .description = "sequence parallelism: norm and residual regions split by sequence over tp",
    .required = sp_required,
    .validate = sp_validate,
    .init = sp_init,
    .fini = sp_fini,
    .register_rules = sp_register,
};

TSR_PLUGIN_DEFINE(sp_desc);
