/* DTensor ops with autograd: the vocabulary the model is written in.
 *
 * Every op takes vars (tessera/autograd.h), decides the placements of its outputs and of its
 * inputs' gradients from the sharding rules of each mesh dim of size > 1 (tsr_op_plan), runs the
 * local kernel on the local tensors, and records its backward on the tape. A mesh dim whose
 * placements no rule covers is an error naming the op, the dim and the placements: never a
 * silent gather. Data is f32 unless said otherwise; layouts are the model's, (B, L, ...).
 */
#ifndef TESSERA_OPS_H
#define TESSERA_OPS_H

#include "tessera/export.h"
#include "tessera/autograd.h"
#include "tessera/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Placement planning ---- */

/* Placements, on every mesh dim, of an op's outputs and of its inputs' gradients. */
typedef struct tsr_op_placements {
  tsr_placement outputs[TSR_MAX_OP_OUTPUTS][TSR_MAX_MESH_DIMS];
  tsr_placement grads[TSR_MAX_OP_INPUTS][TSR_MAX_MESH_DIMS];
  const tsr_op_rule *rules[TSR_MAX_MESH_DIMS]; /* per mesh dim; NULL for size-1 dims */
} tsr_op_placements;

/* Finds, for each mesh dim of size > 1, the rule for `op` with the inputs' placements there:
 * first the rules plugins registered, then the core's generic ones (replicated computation, and
 * activations sharded along a dim the op treats row by row: batch, sequence, heads). Size-1 dims
 * plan Replicate. All inputs must share a mesh. */
TSR_API tsr_status tsr_op_plan(tsr_tape_t *t, const char *op, tsr_var *const *inputs, int ninputs,
                               int noutputs, tsr_op_placements *plan);

/* Applies the rules that want some of the op's inputs in other placements first (use_mask in
 * tsr_op_rule, e.g. FSDP gathering a Shard(0) weight): for each mesh dim of size > 1 whose rule
 * asks, inputs[j] is replaced by a transient var (tsr_tape_set_transient) redistributed to the
 * wanted placements, whose backward leaves the gradient Partial(sum) on the dims it gathered.
 * Ops that take parameters call it before tsr_op_plan and read their inputs from the array. */
TSR_API tsr_status tsr_op_prepare_inputs(tsr_tape_t *t, const char *op, tsr_var **inputs,
                                         int ninputs);

/* ---- Op attributes, as a communicating rule's compute receives them ---- */

typedef struct tsr_sdpa_attrs {
  bool causal;
} tsr_sdpa_attrs;

typedef struct tsr_rmsnorm_attrs {
  float eps;
} tsr_rmsnorm_attrs;

typedef struct tsr_rope_attrs {
  float theta;
} tsr_rope_attrs;

/* Since ABI 1.2. */
typedef struct tsr_moe_router_attrs {
  int top_k;   /* experts per token */
  float scale; /* 1 / tokens of the whole batch: what each token adds to the stats */
} tsr_moe_router_attrs;

typedef struct tsr_moe_aux_attrs {
  float scale; /* out = scale * sum_e stats[0, e] * stats[1, e] */
} tsr_moe_aux_attrs;

/* ---- Ops ----
 * A rule with a compute function on one mesh dim replaces the op's local kernel (forward and
 * backward); the other ops' attributes are NULL. */

/* out (B, L, C) = weight[ids]; ids (B, L) i32 (no gradient), weight (V, C). An id outside
 * [0, V) is TSR_EINVAL naming it and its position. */
TSR_API tsr_status tsr_op_embedding(tsr_tape_t *t, tsr_var *ids, tsr_var *weight, tsr_var **out);

/* out (..., C) = x * rsqrt(mean(x^2) + eps) * weight; x (..., C), weight (C). */
TSR_API tsr_status tsr_op_rmsnorm(tsr_tape_t *t, tsr_var *x, tsr_var *weight, float eps,
                                  tsr_var **out);

/* out (..., OC) = x (..., C) @ weight^T, weight (OC, C): nn.Linear without bias. */
TSR_API tsr_status tsr_op_linear(tsr_tape_t *t, tsr_var *x, tsr_var *weight, tsr_var **out);

/* A view of x with a new global shape (same element count, row-major). */
TSR_API tsr_status tsr_op_view(tsr_tape_t *t, tsr_var *x, int ndim, const int64_t *shape,
                               tsr_var **out);

/* Rotary embedding on x (B, L, H, D), Hugging Face rotate_half convention. Positions are the
 * global sequence positions of x's local rows (a sequence-sharded x rotates by its offset). */
TSR_API tsr_status tsr_op_rope(tsr_tape_t *t, tsr_var *x, float theta, tsr_var **out);

/* Scaled dot-product attention, q (B, L, Hq, D), k and v (B, L, Hkv, D), Hq % Hkv == 0 (grouped
 * query attention: q head h reads kv head h / (Hq / Hkv)); out (B, L, Hq, D). */
TSR_API tsr_status tsr_op_sdpa(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, bool causal,
                               tsr_var **out);

/* Document masking (since ABI 1.3). rope_doc rotates x (B, L, H, D) by per-token positions
 * pos (B, L) i32 (a document's tokens from 0); sdpa_doc is causal attention in which query i sees
 * key j only when seg[b, i] == seg[b, j] (the same document of a packed row). pos and seg are
 * global (B, L) vars placed anywhere; the op moves them to the activation's batch and sequence
 * shards first. A communicating rule receives them as the last input and tsr_sdpa_attrs /
 * tsr_rope_attrs as attributes; the kernels with segment ids are the *_seg entries of
 * tessera/kernels.h. */
TSR_API tsr_status tsr_op_rope_doc(tsr_tape_t *t, tsr_var *x, tsr_var *pos, float theta,
                                   tsr_var **out);
TSR_API tsr_status tsr_op_sdpa_doc(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, tsr_var *seg,
                                   tsr_var **out);

/* out = a + b, same shapes. */
TSR_API tsr_status tsr_op_add(tsr_tape_t *t, tsr_var *a, tsr_var *b, tsr_var **out);

/* out = silu(gate) * up, same shapes. */
TSR_API tsr_status tsr_op_swiglu(tsr_tape_t *t, tsr_var *gate, tsr_var *up, tsr_var **out);

/* Mean cross-entropy of logits (B, L, V) against labels (B, L) i32, ignoring label -100, as
 * F.cross_entropy(ignore_index=-100); out is a scalar (0-d). With the batch or sequence sharded,
 * each rank's piece is its share of the mean over the whole batch (Partial(sum)), so uneven
 * shards weigh by their valid tokens. */
TSR_API tsr_status tsr_op_cross_entropy(tsr_tape_t *t, tsr_var *logits, tsr_var *labels,
                                        tsr_var **out);

/* ---- Sparse mixture of experts (Mixtral's block), since ABI 1.2 ----
 * A block is router logits = linear(x, gate (E, C)), then moe_router, then moe_experts; the
 * load-balancing loss sums every block's stats and ends in moe_aux_loss. */

/* Router on logits (B, L, E): p = softmax over the experts; each token's top_k experts of largest
 * p (ties go to the lower expert index: a stable descending sort); their p renormalised to sum
 * to 1. combine (B, L, E) holds those weights and 0 for the experts a token does not use. stats
 * (2, E): row 0 the fraction of the whole batch's tokens that select expert e, row 1 the mean of
 * p[e] over them, the two factors of Mixtral's load-balancing loss. With the tokens sharded, each
 * rank holds its tokens' share of the stats (Partial(sum)); row 0 has no gradient. */
TSR_API tsr_status tsr_op_moe_router(tsr_tape_t *t, tsr_var *logits, int top_k, tsr_var **combine,
                                     tsr_var **stats);
/* The experts: out (B, L, C) = sum over e of combine[.., e] * FFN_e(x), each token's experts
 * added in ascending order, FFN_e(x) = w2[e] (silu(w1[e] x) * w3[e] x), where w13 (E, 2I, C)
 * stacks each expert's w1 (rows 0 ..< I) over its w3 (rows I ..< 2I) and w2 is (E, C, I). A token
 * goes to the experts whose combine weight is nonzero; nothing is dropped (no capacity). */
TSR_API tsr_status tsr_op_moe_experts(tsr_tape_t *t, tsr_var *x, tsr_var *combine, tsr_var *w13,
                                      tsr_var *w2, tsr_var **out);
/* The load-balancing loss from stats (2, E) summed over the blocks:
 * out () = scale * sum_e stats[0, e] * stats[1, e]; the gradient reaches row 1 only. The model
 * takes scale = router_aux_loss_coef * E / blocks^2, which is Hugging Face's
 * load_balancing_loss_func over every block's router logits. */
TSR_API tsr_status tsr_op_moe_aux_loss(tsr_tape_t *t, tsr_var *stats, float scale, tsr_var **out);

/* Redistribute with autograd: the backward is the adjoint (tsr_dtensor_redistribute_adjoint). */
TSR_API tsr_status tsr_op_redistribute(tsr_tape_t *t, tsr_var *x, const tsr_mesh_t *mesh,
                                       const tsr_placement *placements, tsr_var **out);

#ifdef __cplusplus
}
#endif
#endif
