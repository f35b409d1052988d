/* tp: Megatron-style tensor parallelism on the `tp` mesh dim.
 *
 * Parameters (module styles on tp):
 *   column_linear  q, k, v, gate, up, lm_head   weight S(0) (output features), output S(2)
 *   row_linear     o, down                      weight S(1) (input features), output P -> R
 *   embedding      embed_tokens                 weight S(1) (hidden), output S(2) -> R, as the
 *                                               seed's EmbeddingWithReplicateOutput
 *   rmsnorm        the norms                    weight R, runs replicated
 *   kv_linear      k, v when tp > kv heads      weight R: every rank keeps the kv heads whole
 * Activations between a column and a row linear stay split by heads / features, so a layer
 * costs one all-reduce after attention and one after the MLP (and their adjoints in backward).
 * The logits stay split by vocabulary; the loss is computed on the shards (loss_parallel).
 *
 * Op rules on tp: the column and row matmuls and the hidden-split embedding run the op's own
 * kernel on the shards; the vocabulary-parallel loss, attention with replicated kv heads and the
 * tied lm_head (input replicated, weight split by hidden) communicate or slice, so they bring
 * their own forward and backward (tp_loss.c, tp_attention.c, tp_linear.c). Those call the
 * kernels of the device their tensors live on (tessera/device.h) and move data only by tensor
 * copies, views and collectives, so tp runs under every [job] device.
 *
 * With sp loaded, sp places the norm regions (rmsnorm, row_linear's output, embedding's output)
 * on the sequence and tp leaves those three styles to it.
 */
#include <stdlib.h>
#include <string.h>

#include "tp_impl.h"

static const char *const tp_dims[] = {"tp", NULL};

static const tsr_key_spec tp_keys[] = {
    {"loss_parallel", TSR_KEY_BOOL, "true", 0, 0, NULL,
     "cross-entropy on the vocabulary-sharded logits (max and sum-exp reduced over tp) instead of "
     "gathering them"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

int tp_coord(tsr_rank_t *r, const tsr_dtensor *x, int dim) {
  int c[TSR_MAX_MESH_DIMS] = {0};
  tsr_mesh_coords(x->mesh, tsr_rank_id(r), c);
  return c[dim];
}

tsr_status tp_check_other_dims(const char *rule, int dim, int n, const tsr_dtensor *const *in,
                               int max_shard_dim) {
  const tsr_mesh_t *m = in[0]->mesh;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    if (i == dim || tsr_mesh_dim_size(m, i) == 1) continue;
    tsr_placement p = in[0]->placements[i];
    bool ok = p.kind == TSR_REPLICATE || (p.kind == TSR_SHARD && p.dim < max_shard_dim);
    for (int j = 1; j < n; j++) ok = ok && tsr_placement_equal(in[j]->placements[i], p);
    if (!ok) {
      char a[32], b[32];
      return TSR_ERROR(TSR_ENOTSUP,
                       "%s: inputs placed %s, %s on mesh dim '%s'; beside tp this rule takes "
                       "inputs that agree there and are replicated or split along dims below %d",
                       rule, tsr_placement_str(p, a, sizeof a),
                       tsr_placement_str(in[n > 1 ? 1 : 0]->placements[i], b, sizeof b),
                       tsr_mesh_dim_name(m, i), max_shard_dim);
    }
  }
  return TSR_OK;
}

static tsr_status tp_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int tp = tsr_config_mesh_size(cfg, "tp");
  if (tp == 1) return TSR_OK;
  int64_t h, kv;
  TSR_CHECK(tsr_config_key_int(cfg, "model", "num_attention_heads", &h));
  TSR_CHECK(tsr_config_key_int(cfg, "model", "num_key_value_heads", &kv));
  if (h % tp)
    return tsr_config_error(cfg, TSR_EINVAL, "model", "num_attention_heads",
                            "%lld attention heads cannot be split over tp = %d; use a multiple of "
                            "%d heads or a tp that divides %lld",
                            (long long)h, tp, tp, (long long)h);
  /* kv heads split as the query heads do, or, with more ranks than kv heads, every rank keeps
   * them all and uses the one its query heads read: that needs each kv head's query group to be
   * spread over whole ranks */
  if (kv % tp && tp % kv)
    return tsr_config_error(cfg, TSR_EINVAL, "model", "num_key_value_heads",
                            "%lld kv heads over tp = %d: tp must divide the kv heads (they are "
                            "split) or be a multiple of them (they are replicated); use e.g. "
                            "num_key_value_heads = %d",
                            (long long)kv, tp, tp);
  return TSR_OK;
}

static tsr_status tp_init(const tsr_plugin_args *args, void **state) {
  tp_state *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "tp: out of memory");
  const tsr_config *cfg = args->config;
  int64_t kv = 0;
  tsr_status st = tsr_config_get_bool(cfg, args->name, tp_keys, "loss_parallel", &s->loss_parallel);
  if (st == TSR_OK) st = tsr_config_key_int(cfg, "model", "num_key_value_heads", &kv);
  if (st != TSR_OK) {
    free(s);
    return st;
  }
  s->kv_replicated = tsr_config_mesh_size(cfg, "tp") > kv;
  s->sp = tsr_config_loads_plugin(cfg, "sp");
  *state = s;
  return TSR_OK;
}

static void tp_fini(void *state) {
  free(state);
}

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

static tsr_status add_rule(tsr_registry_t *reg, tsr_op_rule rule) {
  rule.mesh_dim = "tp";
  return tsr_registry_add_op_rule(reg, &rule);
}

static tsr_status tp_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  tp_state *s = state;
  const tsr_placement R = tsr_replicate(), P = tsr_partial(TSR_REDUCE_SUM);
  const tsr_placement S0 = tsr_shard(0), S1 = tsr_shard(1), S2 = tsr_shard(2);
  const char *me = args->name;
  TSR_CHECK(add_style(reg, me, "column_linear", S0, R, S2));
  if (s->kv_replicated) TSR_CHECK(add_style(reg, me, "kv_linear", R, R, R));
  if (!s->sp) {
    TSR_CHECK(add_style(reg, me, "row_linear", S1, S2, R));
    TSR_CHECK(add_style(reg, me, "embedding", S1, R, R));
    TSR_CHECK(add_style(reg, me, "rmsnorm", R, R, R));
  }

  /* y = x Wᵀ with W's output rows split: each rank computes its columns of y; the input's
   * gradient is each rank's share of the sum over all output columns */
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.linear.column",
                                        .op = "linear",
                                        .ninputs = 2,
                                        .inputs = {R, S0},
                                        .noutputs = 1,
                                        .outputs = {S2},
                                        .grads = {P, S0}}));
  /* W's input columns split along with x's features: each rank's product is a partial sum */
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.linear.row",
                                        .op = "linear",
                                        .ninputs = 2,
                                        .inputs = {S2, S1},
                                        .noutputs = 1,
                                        .outputs = {P},
                                        .grads = {S2, S1}}));
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.linear.tied",
                                        .op = "linear",
                                        .ninputs = 2,
                                        .inputs = {R, S1},
                                        .noutputs = 1,
                                        .outputs = {P},
                                        .grads = {S2, S1},
                                        .compute = tp_linear_in_split_forward,
                                        .backward = tp_linear_in_split_backward,
                                        .free_saved = tp_linear_saved_free,
                                        .ctx = s}));
  /* a lookup in a table split by columns gives those columns of every row */
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.embedding.hidden",
                                        .op = "embedding",
                                        .ninputs = 2,
                                        .inputs = {R, S1},
                                        .noutputs = 1,
                                        .outputs = {S2},
                                        .grads = {R, S1}}));
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.cross_entropy.vocab",
                                        .op = "cross_entropy",
                                        .ninputs = 2,
                                        .inputs = {S2, R},
                                        .noutputs = 1,
                                        .outputs = {R},
                                        .grads = {S2, R},
                                        .compute = tp_loss_forward,
                                        .backward = tp_loss_backward,
                                        .free_saved = tp_loss_saved_free,
                                        .ctx = s}));
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.sdpa.kv_replicated",
                                        .op = "sdpa",
                                        .ninputs = 3,
                                        .inputs = {S2, R, R},
                                        .noutputs = 1,
                                        .outputs = {S2},
                                        .grads = {S2, P, P},
                                        .compute = tp_sdpa_forward,
                                        .backward = tp_sdpa_backward,
                                        .free_saved = tp_sdpa_saved_free,
                                        .ctx = s}));
  /* document masking: the same, with the segment ids (whole on tp) as a fourth input */
  TSR_CHECK(add_rule(reg, (tsr_op_rule){.name = "tp.sdpa_doc.kv_replicated",
                                        .op = TSR_OP_SDPA_DOC,
                                        .ninputs = 4,
                                        .inputs = {S2, R, R, R},
                                        .noutputs = 1,
                                        .outputs = {S2},
                                        .grads = {S2, P, P, R},
                                        .compute = tp_sdpa_forward,
                                        .backward = tp_sdpa_backward,
                                        .free_saved = tp_sdpa_saved_free,
                                        .ctx = s}));
  return TSR_OK;
}

static const tsr_strategy tp_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "tp",
    .version = "0.1.0",
    .description = "tensor parallelism: column/row-parallel linears, heads split, "
                   "vocabulary-parallel loss",
    .dims = tp_dims,
    .keys = tp_keys,
    .validate = tp_validate,
    .init = tp_init,
    .fini = tp_fini,
    .register_rules = tp_register,
};

TSR_PLUGIN_DEFINE(tp_desc);
