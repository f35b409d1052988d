/* cp_ulysses: Ulysses (all-to-all) context parallelism on the `ulysses_cp` mesh dim.
 *
 * As with ring attention, the inputs enter sequence-sharded on the dim and every row-wise op
 * runs on its shard through the core's generic rules, parameters replicated there. Attention is
 * this plugin's rule (ulysses_attention.c): the sequence shard moves to the heads and back. The
 * rule composes: when another dim still shards the sequence after the move, it hands the call to
 * that dim's attention rule, so Ulysses and ring attention combine in either mesh order.
 *
 * The dim also answers to the seed's spelling `ulysess_cp`: the plugin declares it an alias, and
 * the loader renames it in the job's mesh before anything reads it.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_ulysses_impl.h"
#include "tessera/plugin.h"

static const char *const ulysses_dims[] = {ULYSSES_DIM, NULL};
static const char *const ulysses_aliases[] = {"ulysess_cp", ULYSSES_DIM, NULL};

/* Heads and sequence must split over the degree; tensor parallelism splits the heads first, so
 * the per-rank counts after tp are the ones checked. */
static tsr_status ulysses_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int n = tsr_config_mesh_size(cfg, ULYSSES_DIM), tp = tsr_config_mesh_size(cfg, "tp");
  if (n == 1) return TSR_OK;
  int64_t hq, hkv, L;
  TSR_CHECK(tsr_config_key_int(cfg, "model", "num_attention_heads", &hq));
  TSR_CHECK(tsr_config_key_int(cfg, "model", "num_key_value_heads", &hkv));
  TSR_CHECK(tsr_config_key_int(cfg, "data", "seq_len", &L));
  if (hq % tp == 0 && hkv % tp == 0) {
    hq /= tp;
    hkv /= tp;
  } else {
    tp = 1; /* kv heads replicated or not split by tp: its own checks apply */
  }
  if (hq % n)
    return tsr_config_error(cfg, TSR_EINVAL, "model", "num_attention_heads",
                            "%lld attention heads%s cannot be split over ulysses_cp = %d; use a "
                            "multiple of %d heads",
                            (long long)hq, tp > 1 ? " per tp rank" : "", n, n * tp);
  if (hkv % n && n % hkv)
    return tsr_config_error(cfg, TSR_EINVAL, "model", "num_key_value_heads",
                            "%lld kv heads%s over ulysses_cp = %d: the degree must divide them "
                            "(they are split) or be a multiple of them (they are replicated)",
                            (long long)hkv, tp > 1 ? " per tp rank" : "", n);
  if (L % n)
    return tsr_config_error(cfg, TSR_EINVAL, "data", "seq_len",
                            "%lld tokens cannot be split over ulysses_cp = %d; use a multiple of "
                            "%d",
                            (long long)L, n, n);
  return TSR_OK;
}

static tsr_status ulysses_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  *state = NULL;
  return TSR_OK;
}

static void ulysses_fini(void *state) {
  (void)state;
}

static tsr_status ulysses_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)state;
  const tsr_placement S1 = tsr_shard(1);
  tsr_op_rule sdpa = {.name = "cp_ulysses.sdpa",
                      .op = "sdpa",
                      .mesh_dim = ULYSSES_DIM,
                      .ninputs = 3,
                      .inputs = {S1, S1, S1},
                      .noutputs = 1,
                      .outputs = {S1},
                      .grads = {S1, S1, S1},
                      .compute = ulysses_sdpa_forward,
                      .backward = ulysses_sdpa_backward,
                      .free_saved = ulysses_sdpa_saved_free,
                      .composes = true};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &sdpa));
  /* document masking: the same moves, with the segment ids of q's rows as a fourth input */
  tsr_op_rule doc = sdpa;
  doc.name = "cp_ulysses.sdpa_doc";
  doc.op = TSR_OP_SDPA_DOC;
  doc.ninputs = 4;
  doc.inputs[3] = doc.grads[3] = S1;
  TSR_CHECK(tsr_registry_add_op_rule(reg, &doc));
  /* the tokens, labels and hidden states are split along the sequence */
  return tsr_registry_add_data_split(reg, args->name, ULYSSES_DIM, S1);
}

static const tsr_strategy ulysses_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "cp_ulysses",
    .version = "0.1.0",
    .description = "Ulysses context parallelism: sequence-to-heads all-to-all around attention",
    .dims = ulysses_dims,
    .validate = ulysses_validate,
    .init = ulysses_init,
    .fini = ulysses_fini,
    .register_rules = ulysses_register,
    .dim_aliases = ulysses_aliases,
};

TSR_PLUGIN_DEFINE(ulysses_desc);
