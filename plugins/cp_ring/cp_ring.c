/* cp_ring: ring context parallelism on the `ring_cp` mesh dim.
 *
 * The model's inputs enter sequence-sharded on ring_cp (the seed's placement dict), so every
 * row-wise op runs on its shard through the core's generic rules and parameters stay replicated
 * there; their gradients come out Partial over ring_cp and resolving them is the all-reduce. The
 * one op that mixes rows, attention, is this plugin's rule (ring_attention.c). With
 * load_balance = zigzag the ring dim's sequence shards are the chunk pairs of layout.c, which also
 * supplies the transitions and RoPE for them.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_ring_impl.h"
#include "tessera/plugin.h"

static const char *const ring_dims[] = {RING_DIM, NULL};

static const tsr_key_spec ring_keys[] = {
    {"load_balance", TSR_KEY_ENUM, "none", 0, 0, "none|zigzag",
     "sequence layout on ring_cp: contiguous chunks, or chunks r and 2n-1-r of 2n (equal causal "
     "work per rank)"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static tsr_status read_balance(const tsr_plugin_args *args, ring_balance *out) {
  const char *v = tsr_config_get(args->config, args->name, ring_keys, "load_balance");
  if (!v) return tsr_error(TSR_EINVAL, "cp_ring: load_balance has no value");
  *out = strcmp(v, "zigzag") == 0 ? RING_BALANCE_ZIGZAG : RING_BALANCE_NONE;
  return TSR_OK;
}

static tsr_status ring_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int n = tsr_config_mesh_size(cfg, RING_DIM);
  if (n == 1) return TSR_OK;
  ring_balance b = RING_BALANCE_NONE;
  TSR_CHECK(read_balance(args, &b));
  int64_t L, need = b == RING_BALANCE_ZIGZAG ? 2 * n : n;
  TSR_CHECK(tsr_config_key_int(cfg, "data", "seq_len", &L));
  if (L % need)
    return tsr_config_error(cfg, TSR_EINVAL, "data", "seq_len",
                            "%lld tokens cannot be split into %lld equal ring blocks (ring_cp = "
                            "%d%s); use a multiple of %lld",
                            (long long)L, (long long)need, n,
                            b == RING_BALANCE_ZIGZAG ? ", two chunks per rank with zigzag" : "",
                            (long long)need);
  /* zigzag is a split of the extent the outer sequence sharders leave; the core applies the
   * outer ones after this plugin's transition, so ring_cp has to be the outer one */
  int u = tsr_config_mesh_index(cfg, "ulysses_cp"), ri = tsr_config_mesh_index(cfg, RING_DIM);
  if (b == RING_BALANCE_ZIGZAG && u >= 0 && tsr_config_mesh_size(cfg, "ulysses_cp") > 1 && u < ri)
    return tsr_config_error(cfg, TSR_EINVAL, "mesh", "dims",
                            "ulysses_cp comes before ring_cp, which load_balance = zigzag does "
                            "not support; list ring_cp before ulysses_cp, or set [strategy.%s] "
                            "load_balance = none",
                            args->name);
  return TSR_OK;
}

static tsr_status ring_init(const tsr_plugin_args *args, void **state) {
  ring_state *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "cp_ring: out of memory");
  tsr_status st = read_balance(args, &s->balance);
  if (st != TSR_OK) {
    free(s);
    return st;
  }
  *state = s;
  return TSR_OK;
}

static void ring_fini(void *state) {
  free(state);
}

static tsr_status ring_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  ring_state *s = state;
  const tsr_placement S1 = tsr_shard(1);
  tsr_op_rule sdpa = {.name = "cp_ring.sdpa",
                      .op = "sdpa",
                      .mesh_dim = RING_DIM,
                      .ninputs = 3,
                      .inputs = {S1, S1, S1},
                      .noutputs = 1,
                      .outputs = {S1},
                      .grads = {S1, S1, S1},
                      .compute = ring_sdpa_forward,
                      .backward = ring_sdpa_backward,
                      .free_saved = ring_sdpa_saved_free,
                      .ctx = s};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &sdpa));
  /* document masking: the same ring, with the segment ids of q's rows as a fourth input */
  tsr_op_rule doc = sdpa;
  doc.name = "cp_ring.sdpa_doc";
  doc.op = TSR_OP_SDPA_DOC;
  doc.ninputs = 4;
  doc.inputs[3] = doc.grads[3] = S1;
  TSR_CHECK(tsr_registry_add_op_rule(reg, &doc));
  /* the tokens, labels and hidden states are split along the sequence on the ring */
  TSR_CHECK(tsr_registry_add_data_split(reg, args->name, RING_DIM, S1));
  if (s->balance != RING_BALANCE_ZIGZAG) return TSR_OK;
  tsr_op_rule rope = {.name = "cp_ring.rope.zigzag",
                      .op = "rope",
                      .mesh_dim = RING_DIM,
                      .ninputs = 1,
                      .inputs = {S1},
                      .noutputs = 1,
                      .outputs = {S1},
                      .grads = {S1},
                      .compute = ring_rope_forward,
                      .backward = ring_rope_backward,
                      .free_saved = ring_rope_saved_free,
                      .ctx = s};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &rope));
  tsr_redistribute_rule zz = {.name = "cp_ring.zigzag",
                              .mesh_dim = RING_DIM,
                              .match = ring_zigzag_match,
                              .apply = ring_zigzag_apply,
                              .ctx = s};
  return tsr_registry_add_redistribute(reg, &zz);
}

static const tsr_strategy ring_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "cp_ring",
    .version = "0.1.0",
    .description = "ring attention over a sequence-sharded dim (context parallelism), zigzag "
                   "load balancing",
    .dims = ring_dims,
    .keys = ring_keys,
    .validate = ring_validate,
    .init = ring_init,
    .fini = ring_fini,
    .register_rules = ring_register,
};

TSR_PLUGIN_DEFINE(ring_desc);
