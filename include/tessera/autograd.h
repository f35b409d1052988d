/* Reverse-mode autograd over DTensor ops: one tape per rank.
 *
 * A tsr_var is a DTensor in a computation together with its gradient. Leaves (parameters, model
 * inputs) are made by the caller and outlive the tape; every op appends a node to the tape and
 * returns a var the tape owns until tsr_tape_reset. tsr_tape_backward walks the nodes in reverse:
 * each runs the adjoint of its forward, and gradients that meet at a var are summed (a gradient
 * arriving with other placements than the one already there is redistributed to it first).
 *
 * Gradient sync is not a special case: after backward a parameter's gradient has whatever
 * placements the ops gave it (Partial over the batch-sharded dims, for instance), and
 * tsr_var_resolve_grad redistributes it to the parameter's own placements, which is the data
 * parallel all-reduce, or the reduce-scatter of a sharded parameter.
 */
#ifndef TESSERA_AUTOGRAD_H
#define TESSERA_AUTOGRAD_H

#include <stdbool.h>

#include "tessera/export.h"
#include "tessera/dtensor.h"
#include "tessera/rank.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_tape_t tsr_tape_t;

typedef struct tsr_var {
  tsr_dtensor *value; /* owned */
  tsr_dtensor *grad;  /* owned; NULL until backward reaches this var */
  bool requires_grad;
  int node;         /* tape node that produced it; -1 for a leaf */
  const char *name; /* optional, for messages (parameters: the HF name); borrowed */
} tsr_var;

/* A new tape for rank `r` (borrowed; must outlive the tape). */
TSR_API tsr_status tsr_tape_new(tsr_rank_t *r, tsr_tape_t **out);
/* Frees every node and every var the tape made. Leaves are untouched. */
TSR_API void tsr_tape_reset(tsr_tape_t *t);
TSR_API void tsr_tape_free(tsr_tape_t *t);
TSR_API tsr_rank_t *tsr_tape_rank(tsr_tape_t *t);
/* While false, ops record nothing and their outputs do not require grad (inference). */
TSR_API void tsr_tape_set_recording(tsr_tape_t *t, bool on);
/* Since ABI 1.2: whether the tape records (tsr_tape_set_recording). */
TSR_API bool tsr_tape_recording(const tsr_tape_t *t);
/* Since ABI 1.2. While false, this tape's backward fires no gradient hook: a tape that a node of
 * another tape runs inside its own backward (activation checkpointing recomputes a layer so),
 * whose leaves the outer tape's hooks already hear of. On by default. */
TSR_API void tsr_tape_set_hooks(tsr_tape_t *t, bool on);
TSR_API int tsr_tape_node_count(const tsr_tape_t *t);
/* Since ABI 1.4. Selective activation checkpointing. While on, the outputs of the element-wise
 * ops the core computes on each rank's local tensors (rmsnorm, rope, rope_doc, swiglu; not one
 * a plugin's rule computes) are recomputable; turning it off releases their local tensors, so
 * that the tape keeps the GEMMs' and attention's outputs and the inputs these ops need. A
 * backward that reads a released value runs the op's kernel again on the same inputs first (the
 * same bits) and releases it again once the node that made it has been differentiated; a
 * forward op that reads one makes it again too. A recompute never communicates. A model turns
 * it on for a layer and off at the layer's end. Off by default. */
TSR_API void tsr_tape_set_selective(tsr_tape_t *t, bool on);
TSR_API bool tsr_tape_selective(const tsr_tape_t *t);

/* A leaf holding `value` (ownership moves to the var). Free with tsr_var_free. */
TSR_API tsr_status tsr_var_new_leaf(tsr_dtensor *value, bool requires_grad, const char *name,
                                    tsr_var **out);
TSR_API void tsr_var_free(tsr_var *v);
/* Drops the gradient (the next backward starts from zero). */
TSR_API void tsr_var_zero_grad(tsr_var *v);

/* Runs backward from `loss`, a var with one element (any placements). Its gradient is seeded
 * with 1 (Replicate on every mesh dim). */
TSR_API tsr_status tsr_tape_backward(tsr_tape_t *t, tsr_var *loss);
/* Runs backward from `out` with the given output gradient (ownership moves; same global shape
 * as out, any placements), as torch's out.backward(gradient). */
TSR_API tsr_status tsr_tape_backward_with(tsr_tape_t *t, tsr_var *out, tsr_dtensor *grad);

/* Split backward, for zero-bubble pipeline schedules: the part of a backward that the previous
 * pipeline stage waits for (the input gradients) runs first, and the weight gradients later.
 *
 * tsr_tape_backward_input runs backward from `out` (as tsr_tape_backward_with; `grad`'s
 * ownership moves) but computes only what the gradients of `inputs` (ninputs vars, may be 0)
 * need. The rest is deferred: a "linear" node on the path to an input computes only its input
 * gradient now and keeps its output gradient, its weight gradient (the second GEMM) running
 * later; a node with no path to an input (an embedding, a weight's gather) runs later whole.
 * Other nodes on the path run whole now (their weight gradients are a few reductions). No
 * gradient hook fires; afterwards each of `inputs` has its final gradient.
 * tsr_tape_backward_weight then runs the deferred work in reverse node order and fires the
 * gradient hooks as tsr_tape_backward_with does, leaving every parameter's gradient as one
 * tsr_tape_backward_with would have. TSR_EINVAL when nothing is deferred (no
 * tsr_tape_backward_input before) or, for backward_input, when a split is already pending.
 * tsr_tape_reset drops a pending split. */
TSR_API tsr_status tsr_tape_backward_input(tsr_tape_t *t, tsr_var *out, tsr_dtensor *grad,
                                           tsr_var *const *inputs, int ninputs);
TSR_API tsr_status tsr_tape_backward_weight(tsr_tape_t *t);
/* Number of nodes whose work tsr_tape_backward_input deferred (0 when none is pending). */
TSR_API int tsr_tape_deferred_count(const tsr_tape_t *t);

/* Gradient hooks. While backward runs, the hooks of the rank's registry (tsr_grad_hook in
 * tessera/registry.h) hear of every leaf that requires grad as soon as its gradient is final:
 * right after the node of the leaf's first use in forward order has been differentiated, since
 * no earlier node can add to it. This is where data parallelism starts its gradient sync while
 * the rest of backward still runs. */

/* Redistributes v's gradient to v's own mesh and placements (Partial sums resolved). A var
 * without a gradient gets a zero one. */
TSR_API tsr_status tsr_var_resolve_grad(tsr_tape_t *t, tsr_var *v);

/* ---- For op implementations (core and plugins). ---- */

/* Backward of one node: reads the gradients of `outputs` (any may be NULL: not reached) and
 * adds into the gradients of `inputs` with tsr_var_accumulate_grad. */
typedef tsr_status (*tsr_backward_fn)(tsr_tape_t *t, tsr_var *const *inputs, int ninputs,
                                      tsr_var *const *outputs, int noutputs, void *saved);

/* Records a node. `saved` (may be NULL) is owned by the tape from here on and released with
 * free_saved (may be NULL for plain free). When the tape is not recording, or no input requires
 * grad, nothing is recorded and `saved` is released at once. */
TSR_API tsr_status tsr_tape_record(tsr_tape_t *t, const char *op, tsr_var *const *inputs,
                                   int ninputs, tsr_var *const *outputs, int noutputs,
                                   tsr_backward_fn backward, void *saved,
                                   void (*free_saved)(void *));
/* Marks `v`, a var this tape made from `src` by a redistribute, as held only while it is used:
 * its local tensor is released once the next node that reads it has been recorded (that op's
 * forward is done) and rebuilt, by redistributing src->value to v's placements again, just
 * before that node's backward, then released again. A gathered FSDP parameter lives so: one
 * op's worth at a time instead of the whole model's. v must be read by one node only. */
TSR_API tsr_status tsr_tape_set_transient(tsr_tape_t *t, tsr_var *v, tsr_var *src);
/* A new var owned by the tape, holding `value` (ownership moves). */
TSR_API tsr_status tsr_tape_new_var(tsr_tape_t *t, tsr_dtensor *value, tsr_var **out);
/* Adds `grad` (ownership moves) into v's gradient. */
TSR_API tsr_status tsr_var_accumulate_grad(tsr_tape_t *t, tsr_var *v, tsr_dtensor *grad);

#ifdef __cplusplus
}
#endif
#endif
