/* dp: data parallelism on three mesh dims, with TorchTitan's names and meanings.
 *
 *   dp            replicated parameters (DDP): the batch is split, gradients are all-reduced
 *   dp_shard      FSDP: parameters, gradients and AdamW state Shard(0); each weight is gathered
 *                 just before the op that reads it and released after, gathered again for its
 *                 backward; its gradient is reduce-scattered back to Shard(0)
 *   dp_replicate  replicated parameters beside dp_shard: HSDP, reduce-scatter inside a shard
 *                 group, then all-reduce of the shards across the replicas
 *
 * The batch is Shard(0) on every dp dim (the model's input dict names them); a batch the ranks
 * do not divide is split as torch.chunk splits it, and the loss weighs each shard by its valid
 * tokens, so every mesh computes the 1-rank step on the same global batch.
 *
 * Nothing here computes a gradient sync by hand: the ops give replicated weights Partial(sum)
 * gradients, and resolving them to the parameters' placements is the all-reduce or the
 * reduce-scatter. What the plugin adds is when: a gradient hook hears of each parameter as soon
 * as backward has finished with it and syncs gradients in buckets of bucket_mb (dp_bucket.c),
 * while backward goes on with the layers below.
 */
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

static const char *const dp_dims[] = {"dp", "dp_shard", "dp_replicate", NULL};

static const tsr_key_spec dp_keys[] = {
    {"bucket_mb", TSR_KEY_FLOAT, "25", 0, 1048576, NULL,
     "sync gradients in buckets of this many MiB (0: each gradient alone)"},
    {"overlap", TSR_KEY_BOOL, "true", 0, 0, NULL,
     "sync each bucket as soon as backward has finished with it; false: after backward"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

/* Every module style of the model: parameters replicated on dp and dp_replicate and sharded
 * by rows on dp_shard; activations stay split by batch. */
static const char *const dp_styles[] = {"column_linear", "row_linear", "kv_linear", "embedding",
                                        "rmsnorm",       "attention",  "mlp"};

/* The ops that read a parameter, and the input that is the parameter. */
static const char *const dp_param_ops[] = {"linear", "rmsnorm", "embedding"};

bool dp_owns(const char *dim) {
  for (int i = 0; dp_dims[i]; i++)
    if (!strcmp(dp_dims[i], dim)) return true;
  return false;
}

static int mesh_size(const tsr_config *cfg, const char *name) {
  for (int i = 0; i < cfg->mesh.ndim && i < cfg->mesh.nshape; i++)
    if (!strcmp(cfg->mesh.names[i], name)) return cfg->mesh.shape[i];
  return 1;
}

static tsr_status dp_validate(const tsr_plugin_args *args) {
  const tsr_config *cfg = args->config;
  int dp = mesh_size(cfg, "dp"), rep = mesh_size(cfg, "dp_replicate");
  int shard = mesh_size(cfg, "dp_shard");
  if (dp > 1 && (rep > 1 || shard > 1))
    return tsr_config_error(cfg, TSR_EINVAL, "mesh", "dims",
                            "dp = %d beside dp_replicate = %d and dp_shard = %d: dp is replicated "
                            "data parallelism, which dp_replicate already is; use dp alone (DDP) "
                            "or dp_replicate x dp_shard (HSDP)",
                            dp, rep, shard);
  return TSR_OK;
}

static tsr_status dp_init(const tsr_plugin_args *args, void **state) {
  dp_state *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "dp: out of memory");
  double mb = 0;
  tsr_status st = tsr_config_get_float(args->config, args->name, dp_keys, "bucket_mb", &mb);
  if (st == TSR_OK)
    st = tsr_config_get_bool(args->config, args->name, dp_keys, "overlap", &s->overlap);
  s->bucket_bytes = (size_t)(mb * 1048576.0);
  s->world = (int)args->config->mesh.world;
  s->buckets = calloc((size_t)(s->world > 0 ? s->world : 1), sizeof *s->buckets);
  if (st == TSR_OK && !s->buckets)
    st = tsr_error(TSR_ENOMEM, "dp: out of memory for %d ranks", s->world);
  if (st != TSR_OK) {
    free(s->buckets);
    free(s);
    return st;
  }
  *state = s;
  return TSR_OK;
}

static void dp_fini(void *state) {
  dp_state *s = state;
  dp_buckets_free(s);
  free(s->buckets);
  free(s);
}

static tsr_status add_styles(tsr_registry_t *reg, const char *owner, const char *dim,
                             tsr_placement weight) {
  for (size_t i = 0; i < sizeof dp_styles / sizeof dp_styles[0]; i++) {
    tsr_module_style style = {
        .style = dp_styles[i],
        .mesh_dim = dim,
        .owner = owner,
        .nparams = 1,
        .params = {{"weight", weight}},
        .input = tsr_shard(0),
        .output = tsr_shard(0),
    };
    TSR_CHECK(tsr_registry_add_module_style(reg, &style));
  }
  return TSR_OK;
}

static tsr_status dp_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  const char *me = args->name;
  TSR_CHECK(add_styles(reg, me, "dp", tsr_replicate()));
  TSR_CHECK(add_styles(reg, me, "dp_replicate", tsr_replicate()));
  TSR_CHECK(add_styles(reg, me, "dp_shard", tsr_shard(0)));
  /* FSDP: an op reading a row-sharded weight gets it gathered for the op alone; the rest of the
   * op is planned as if the weight were replicated, so every other dim's rules apply unchanged */
  static const char *const names[] = {"dp.fsdp.linear", "dp.fsdp.rmsnorm", "dp.fsdp.embedding"};
  for (size_t i = 0; i < sizeof dp_param_ops / sizeof dp_param_ops[0]; i++) {
    tsr_op_rule rule = {.name = names[i],
                        .op = dp_param_ops[i],
                        .mesh_dim = "dp_shard",
                        .ninputs = 2,
                        .inputs = {tsr_replicate(), tsr_shard(0)},
                        .any_input = 1u << 0,
                        .noutputs = 1,
                        .use_mask = 1u << 1,
                        .use = {tsr_replicate(), tsr_replicate()}};
    TSR_CHECK(tsr_registry_add_op_rule(reg, &rule));
  }
  tsr_grad_hook hook = {"dp.bucket_sync", dp_grad_ready, dp_grad_done, state};
  return tsr_registry_add_grad_hook(reg, &hook);
}

static const tsr_strategy dp_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = "dp",
    .version = "0.1.0",
    .description = "data parallelism: DDP (dp), FSDP (dp_shard), HSDP (dp_replicate x dp_shard), "
                   "bucketed gradient sync during backward",
    .dims = dp_dims,
    .keys = dp_keys,
    .validate = dp_validate,
    .init = dp_init,
    .fini = dp_fini,
    .register_rules = dp_register,
};

TSR_PLUGIN_DEFINE(dp_desc);
