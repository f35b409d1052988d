/* The core's generic sharding rules: facts about the ops that hold on any mesh dim, consulted
 * after the rules plugins registered. They cover replicated computation and activations sharded
 * along a dim the op treats row by row (batch, sequence, heads), which is what data parallelism,
 * the norm regions of sequence parallelism and the non-attention ops of context parallelism
 * need. Anything that must communicate inside an op (tensor-parallel matmuls, ring attention,
 * vocab-parallel loss) is a plugin's rule. */
#include <string.h>

#include "ops_impl.h"

static bool is_shard(tsr_placement p, int d) {
  return p.kind == TSR_SHARD && p.dim == d;
}

/* Sets outputs and grads for mesh dim `dim` and returns true when a generic rule applies. */
bool tsr_op_generic_rule(const char *op, tsr_var *const *in, int nin, int dim,
                         tsr_placement *outputs, tsr_placement *grads) {
  tsr_placement p[TSR_MAX_OP_INPUTS];
  bool all_replicate = true;
  for (int j = 0; j < nin; j++) {
    p[j] = in[j]->value->placements[dim];
    all_replicate = all_replicate && p[j].kind == TSR_REPLICATE;
    grads[j] = p[j];
  }
  outputs[0] = outputs[1] = tsr_replicate();
  if (all_replicate) return true; /* every rank computes the same thing */
  int n = tsr_mesh_dim_size(in[0]->value->mesh, dim);
  int last = in[0]->value->ndim - 1;
  tsr_placement x = p[0];
  if (x.kind == TSR_PARTIAL && !strcmp(op, "add")) {
    /* sums of pieces add piecewise (the router stats of several MoE blocks) */
    if (!tsr_placement_equal(p[1], x)) return false;
    outputs[0] = x;
    grads[0] = grads[1] = tsr_replicate(); /* the gradient of a sum's pieces is the sum's */
    return true;
  }
  if (x.kind != TSR_SHARD) return false;
  int d = x.dim;
  outputs[0] = x;
  if (!strcmp(op, "add") || !strcmp(op, "swiglu")) {
    for (int j = 1; j < nin; j++)
      if (!tsr_placement_equal(p[j], x)) return false;
    return true;
  }
  if (!strcmp(op, "linear") || !strcmp(op, "rmsnorm")) {
    /* rows are independent; the replicated weight's gradient sums over them */
    if (d >= last || p[1].kind != TSR_REPLICATE) return false;
    grads[1] = tsr_partial(TSR_REDUCE_SUM);
    return true;
  }
  if (!strcmp(op, "embedding")) {
    if (d > 1 || p[1].kind != TSR_REPLICATE) return false;
    grads[1] = tsr_partial(TSR_REDUCE_SUM);
    return true;
  }
  if (!strcmp(op, "rope")) return d != 3; /* positions follow the sequence shard's offset */
  if (!strcmp(op, "sdpa")) {
    for (int j = 1; j < nin; j++)
      if (!tsr_placement_equal(p[j], x)) return false;
    if (d == 0) return true;
    /* heads are independent when every rank keeps whole query groups */
    return d == 2 && in[0]->value->shape[2] % n == 0 && in[1]->value->shape[2] % n == 0;
  }
  if (!strcmp(op, TSR_OP_ROPE_DOC)) {
    /* the positions come laid out like x's rows: a batch or sequence shard carries its own */
    if (d == 3) return false;
    return d == 2 ? p[1].kind == TSR_REPLICATE : is_shard(p[1], d);
  }
  if (!strcmp(op, TSR_OP_SDPA_DOC)) {
    /* as sdpa, with the segment ids of the same rows: a batch shard's, or whole over heads */
    if (!tsr_placement_equal(p[1], x) || !tsr_placement_equal(p[2], x)) return false;
    if (d == 0) return is_shard(p[3], 0);
    return d == 2 && p[3].kind == TSR_REPLICATE && in[0]->value->shape[2] % n == 0 &&
           in[1]->value->shape[2] % n == 0;
  }
  if (!strcmp(op, "moe_router")) {
    /* tokens are independent; the stats are sums over them, scaled by the whole batch's count */
    if (d >= last) return false;
    outputs[1] = tsr_partial(TSR_REDUCE_SUM);
    return true;
  }
  if (!strcmp(op, "moe_experts")) {
    /* replicated experts see their shard of the tokens; their gradients sum over the shards */
    if (d >= last || !tsr_placement_equal(p[1], x) || p[2].kind != TSR_REPLICATE ||
        p[3].kind != TSR_REPLICATE)
      return false;
    grads[2] = grads[3] = tsr_partial(TSR_REDUCE_SUM);
    return true;
  }
  if (!strcmp(op, "cross_entropy")) {
    /* the op divides by the valid-token count of the whole batch, so the pieces sum to it */
    if (d > 1 || !is_shard(p[1], d)) return false;
    outputs[0] = tsr_partial(TSR_REDUCE_SUM);
    grads[1] = p[1];
    return true;
  }
  return false;
}
