/* Core registries that strategy plugins add to when they load.
 *
 * A registry belongs to a job: plugins register into it before any rank starts, and ranks read it
 * (through tsr_rank_registry) while they run. The core consults it; it knows no plugin by name.
 */
#ifndef TESSERA_REGISTRY_H
#define TESSERA_REGISTRY_H

#include <stdbool.h>

#include "tessera/export.h"
#include "tessera/autograd.h"
#include "tessera/dtensor.h"
#include "tessera/rank.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

TSR_API tsr_status tsr_registry_new(tsr_registry_t **out);
TSR_API void tsr_registry_free(tsr_registry_t *reg);

/* ---- Redistribute transitions ----
 * A transition replaces the core's step for one mesh dim changing from `src` to `dst`. The
 * planner asks every registered transition, newest first, before using its own step. */
typedef struct tsr_redistribute_rule {
  const char *name;     /* for messages and `tessera plugins`, e.g. "cp_ring.shard_roll" */
  const char *mesh_dim; /* the mesh dim name it applies to; NULL for any */
  /* True when this rule handles x's mesh dim `dim` going from src to dst. */
  bool (*match)(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst, void *ctx);
  /* Produces the DTensor with placement dst on `dim` and x's placements elsewhere. */
  tsr_status (*apply)(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                      tsr_dtensor **out, void *ctx);
  void *ctx; /* passed back to match and apply */
} tsr_redistribute_rule;

/* Copies `rule` into the registry. TSR_EINVAL if a mandatory member is missing. */
TSR_API tsr_status tsr_registry_add_redistribute(tsr_registry_t *reg,
                                                 const tsr_redistribute_rule *rule);
TSR_API int tsr_registry_redistribute_count(const tsr_registry_t *reg);
TSR_API const tsr_redistribute_rule *tsr_registry_redistribute_at(const tsr_registry_t *reg, int i);
/* How many times transition i was applied so far, summed over every rank that reads the
 * registry: what a run reached of what the plugins registered (`tessera conform` checks that
 * its runs reach every registration). */
TSR_API int64_t tsr_registry_redistribute_uses(const tsr_registry_t *reg, int i);

/* ---- The vocabulary ----
 * The ops the model runs through sharding rules and the module styles it applies: the only names
 * a rule's `op` and a style's `style` may hold. A registration naming anything else is refused
 * with TSR_EINVAL and a message listing these, since nothing would ever consult it. */
#define TSR_OP_EMBEDDING     "embedding"     /* (ids (B, L) i32, weight (V, C)) -> (B, L, C) */
#define TSR_OP_RMSNORM       "rmsnorm"       /* (x (.., C), weight (C)) -> (.., C) */
#define TSR_OP_LINEAR        "linear"        /* (x (.., C), weight (OC, C)) -> (.., OC) */
#define TSR_OP_ROPE          "rope"          /* (x (B, L, H, D)) -> (B, L, H, D) */
#define TSR_OP_SDPA          "sdpa"          /* (q (B, L, Hq, D), k, v (B, L, Hkv, D)) -> q's */
#define TSR_OP_ADD           "add"           /* (a, b) -> a + b */
#define TSR_OP_SWIGLU        "swiglu"        /* (gate, up) -> silu(gate) * up */
#define TSR_OP_CROSS_ENTROPY "cross_entropy" /* (logits (B, L, V), labels (B, L) i32) -> () */
/* Since ABI 1.2, the sparse mixture-of-experts block (tessera/ops.h):
 *   moe_router   (logits (B, L, E)) -> (combine (B, L, E), stats (2, E))
 *   moe_experts  (x (B, L, C), combine (B, L, E), w13 (E, 2I, C), w2 (E, C, I)) -> (B, L, C)
 *   moe_aux_loss (stats (2, E)) -> () */
#define TSR_OP_MOE_ROUTER   "moe_router"
#define TSR_OP_MOE_EXPERTS  "moe_experts"
#define TSR_OP_MOE_AUX_LOSS "moe_aux_loss"
/* Since ABI 1.3, document masking ([data] mask = document; tessera/ops.h): the per-token data is
 * an i32 input laid out like the activation's rows (its batch and sequence shards, whole over
 * heads). Rules for rope and sdpa are never asked for these ops.
 *   rope_doc (x (B, L, H, D), pos (B, L) i32) -> (B, L, H, D)
 *   sdpa_doc (q (B, L, Hq, D), k, v (B, L, Hkv, D), seg (B, L) i32) -> q's */
#define TSR_OP_ROPE_DOC "rope_doc"
#define TSR_OP_SDPA_DOC "sdpa_doc"

/* The Llama model's modules. "embedding" also lays out the model's data on each dim: its `input`
 * is the placement of the token ids and of the labels (B, L), its `output` that of the hidden
 * states (B, L, C), which is what they keep where they cross pipeline stages. A dim that shards
 * the batch declares input = output = Shard(0); one that shards the sequence, Shard(1). */
#define TSR_STYLE_EMBEDDING     "embedding"     /* embed_tokens, and the data layout */
#define TSR_STYLE_COLUMN_LINEAR "column_linear" /* q_proj, gate_proj, up_proj, lm_head */
#define TSR_STYLE_KV_LINEAR     "kv_linear"     /* k_proj, v_proj; column_linear where unset */
#define TSR_STYLE_ROW_LINEAR    "row_linear"    /* o_proj, down_proj */
#define TSR_STYLE_RMSNORM       "rmsnorm"       /* the norms */
#define TSR_STYLE_ATTENTION     "attention"     /* the attention block, from its input (B, L, C) */
#define TSR_STYLE_MLP           "mlp"           /* the MLP block, from its input (B, L, C) */
/* Since ABI 1.2. The experts of a sparse MoE block: its "weight" placement applies to both
 * stacked expert weights, w13 (E, 2I, C) and w2 (E, C, I), so Shard(0) splits the experts; its
 * input and output are those of the moe_experts op, (B, L, C) and the combine weights (B, L, E)
 * on entry, (B, L, C) on exit. */
#define TSR_STYLE_EXPERTS "experts"

/* The op names above, NULL-terminated. */
TSR_API const char *const *tsr_op_names(void);
/* The module style names above, NULL-terminated. */
TSR_API const char *const *tsr_module_style_names(void);

/* ---- Op sharding rules ----
 * A rule says, for one op on one mesh dim, which input placements it accepts, what the local
 * computation is and what placements the outputs get, e.g. linear on tp (x, weight (OC, C)):
 * R·S(0) -> S(-1) (column-parallel), S(-1)·S(1) -> P(sum) (row-parallel). Lookup is by (op, mesh
 * dim, input placements); newer registrations win, and a rule for a named dim wins over one for any
 * dim. No rule is an error for the caller to report (naming the op, the dim and the placements),
 * never a silent gather. */
#define TSR_MAX_OP_INPUTS  4
#define TSR_MAX_OP_OUTPUTS 2

/* Local computation of a rule that communicates (ring attention, vocab-parallel loss). `inputs`
 * are the op's DTensors with the matched placements on mesh dim `dim`; the function makes
 * `outputs` (noutputs DTensors, with the rule's output placements on `dim`). `attrs` is
 * op-specific (tessera/ops.h defines it per op). It may set *saved to state its backward needs;
 * the core releases it with the rule's free_saved. */
typedef tsr_status (*tsr_op_local_fn)(tsr_rank_t *r, int dim, int ninputs,
                                      const tsr_dtensor *const *inputs, const void *attrs,
                                      int noutputs, tsr_dtensor **outputs, void **saved, void *ctx);

/* Backward of a communicating rule: given the gradients of the outputs (grad_outputs, placed as
 * the outputs with Partial read as Replicate), makes one gradient per input in grad_inputs (NULL
 * for an input without gradient), placed as the rule's `grads`. */
typedef tsr_status (*tsr_op_backward_fn)(tsr_rank_t *r, int dim, int ninputs,
                                         const tsr_dtensor *const *inputs, const void *attrs,
                                         int noutputs, const tsr_dtensor *const *outputs,
                                         const tsr_dtensor *const *grad_outputs,
                                         tsr_dtensor **grad_inputs, void *saved, void *ctx);

typedef struct tsr_op_rule {
  const char *name;     /* for messages, e.g. "core.matmul.col" or "cp_ring.sdpa" */
  const char *op;       /* the op it applies to, e.g. "matmul", "sdpa" */
  const char *mesh_dim; /* the mesh dim name it applies to; NULL for any */
  int ninputs;
  tsr_placement inputs[TSR_MAX_OP_INPUTS]; /* placement of each input on the dim */
  uint32_t any_input;                      /* bit i set: input i matches any placement */
  int noutputs;
  tsr_placement outputs[TSR_MAX_OP_OUTPUTS]; /* placement of each output on the dim */
  /* Placement of each input's gradient on the dim. A Replicate input combined with a sharded
   * one usually gets a Partial gradient (the weight of a batch-sharded matmul). */
  tsr_placement grads[TSR_MAX_OP_INPUTS];
  /* NULL: the op's own kernel on the local tensors gives the local result (the usual case,
   * e.g. a shard-wise matmul); set for rules that communicate, such as ring attention. */
  tsr_op_local_fn compute;
  tsr_op_backward_fn backward;     /* mandatory with compute */
  void (*free_saved)(void *saved); /* optional: releases what compute saved; NULL for free() */
  void *ctx;                       /* passed back to compute and backward */
  /* Set when compute itself runs the communicating rules the op finds on the other mesh dims,
   * on the inputs it has transformed (Ulysses attention moves the sequence shard to the heads and
   * hands the call to ring attention). An op whose plan has several compute rules runs the one
   * that composes; with none or several that compose it is an error naming them. */
  bool composes;
  /* Inputs the op needs in other placements on this dim, e.g. a weight stored Shard(0) that
   * the op reads gathered (FSDP). Bit j set: input j is redistributed on this dim to use[j] just
   * before the op (tsr_op_prepare_inputs) and the op is planned again with the new placements,
   * so outputs and grads above are not read. The redistributed value is held only while the op
   * runs (tsr_tape_set_transient) and its gradient comes back Partial(sum) on this dim, left
   * for tsr_var_resolve_grad or a gradient hook to reduce. Needs compute == NULL. */
  uint32_t use_mask;
  tsr_placement use[TSR_MAX_OP_INPUTS];
} tsr_op_rule;

/* Copies `rule` into the registry. TSR_EINVAL, with the fix, for: a missing name or op; an op not
 * in the vocabulary (the message lists tsr_op_names); ninputs other than the op's; counts out of
 * range; a use_mask bit on an input that is not a parameter of the op (only embedding, rmsnorm
 * and linear take one, their weight); a rule with the same op, dim and inputs as one already
 * registered (naming both). */
TSR_API tsr_status tsr_registry_add_op_rule(tsr_registry_t *reg, const tsr_op_rule *rule);
/* The rule for `op` on the mesh dim called `mesh_dim` with inputs placed as `inputs` (ninputs
 * entries), or NULL. */
TSR_API const tsr_op_rule *tsr_registry_find_op_rule(const tsr_registry_t *reg, const char *op,
                                                     const char *mesh_dim, int ninputs,
                                                     const tsr_placement *inputs);
TSR_API int tsr_registry_op_rule_count(const tsr_registry_t *reg);
TSR_API const tsr_op_rule *tsr_registry_op_rule_at(const tsr_registry_t *reg, int i);
/* How many times the planner chose op rule i for an op so far, summed over every rank that reads
 * the registry (as tsr_registry_redistribute_uses). */
TSR_API int64_t tsr_registry_op_rule_uses(const tsr_registry_t *reg, int i);

/* ---- Composition: a rule hands the op on to another mesh dim's rule ----
 * A communicating rule that has transformed its inputs may leave work for another dim: Ulysses
 * attention moves the sequence shard to the heads, but the sequence can still be split over
 * ring_cp, whose rule must then run the attention. Such a rule sets `composes` and, between its
 * own moves, calls tsr_op_defer_forward with the transformed inputs; in its backward it calls
 * tsr_op_defer_backward with the handle, and frees the handle with its saved state:
 *
 *   st = tsr_op_defer_forward(r, TSR_OP_SDPA, dim, 3, moved, attrs, 1, &out, &s->deferred);
 *   if (st == TSR_OK && !s->deferred) st = attend_locally(r, moved, &out); // no other rule
 *   ...
 *   if (s->deferred) st = tsr_op_defer_backward(r, s->deferred, 3, moved, attrs, 1, outs, gouts,
 *                                                grads);
 *   ...
 *   tsr_op_deferral_free(s->deferred);
 *
 * plugins/cp_ulysses/ulysses_attention.c is the in-tree use. */
typedef struct tsr_op_deferral tsr_op_deferral; /* opaque: the rule found and its saved state */

/* Finds the rule with a compute function for `op` on a mesh dim of size > 1 other than `dim`
 * whose input placements match `inputs` on that dim, and runs its compute on them: *out holds
 * what its backward needs. *out = NULL and TSR_OK when no other dim has such a rule (the caller
 * computes the op itself); TSR_ENOTSUP when two dims have one, naming both rules. */
TSR_API tsr_status tsr_op_defer_forward(tsr_rank_t *r, const char *op, int dim, int ninputs,
                                        const tsr_dtensor *const *inputs, const void *attrs,
                                        int noutputs, tsr_dtensor **outputs, tsr_op_deferral **out);
/* The backward of the rule tsr_op_defer_forward ran, with the same inputs and outputs. */
TSR_API tsr_status tsr_op_defer_backward(tsr_rank_t *r, const tsr_op_deferral *d, int ninputs,
                                         const tsr_dtensor *const *inputs, const void *attrs,
                                         int noutputs, const tsr_dtensor *const *outputs,
                                         const tsr_dtensor *const *grad_outputs,
                                         tsr_dtensor **grad_inputs);
/* The rule a deferral runs (for messages), or NULL for NULL. */
TSR_API const tsr_op_rule *tsr_op_deferral_rule(const tsr_op_deferral *d);
/* Releases the rule's saved state and the handle. NULL is a no-op. */
TSR_API void tsr_op_deferral_free(tsr_op_deferral *d);

/* ---- Module styles ----
 * For one module style (tsr_module_style_names) on one mesh dim, the strategy that owns the dim
 * decides the placements of the module's parameters and of its input and output activations on
 * that dim: every module with the style has its input redistributed to `input` on entry and its
 * output to `output` on exit (the embedding's input is the token ids). A dim with no style for a
 * module is dense there (tsr_module_style_param returns Replicate) and its activations keep
 * their placement; the embedding style is also the data layout (see TSR_STYLE_EMBEDDING). The Llama
 * model places k_proj and v_proj by "kv_linear" where a strategy registered it on the dim, and by
 * "column_linear" elsewhere (tensor parallelism keeps them whole when tp > kv heads). */
#define TSR_MAX_STYLE_PARAMS 4

typedef struct tsr_style_param {
  const char *name;        /* parameter name within the module: "weight" (Llama has no bias) */
  tsr_placement placement; /* its placement on the dim */
} tsr_style_param;

typedef struct tsr_module_style {
  const char *style;    /* "column_linear", ... */
  const char *mesh_dim; /* the dim this placement applies to (not NULL) */
  const char *owner;    /* who registered it, for messages: the plugin name */
  int nparams;
  tsr_style_param params[TSR_MAX_STYLE_PARAMS];
  tsr_placement input;  /* what the module's input is redistributed to on entry */
  tsr_placement output; /* what its output is redistributed to on exit */
} tsr_module_style;

/* Copies `style` into the registry. TSR_EINVAL, with the fix, for missing names, a style not in
 * the vocabulary (the message lists tsr_module_style_names), a parameter the module does not have
 * (each has one, "weight"), or when (style, dim) already has a style: the message names both
 * owners. */
TSR_API tsr_status tsr_registry_add_module_style(tsr_registry_t *reg,
                                                 const tsr_module_style *style);
/* Declares how mesh dim `mesh_dim` splits the model's data: `split` = Shard(0) splits the batch,
 * Shard(1) the sequence. It registers the embedding style for the dim (a replicated weight,
 * input = output = split), so it cannot be combined with another embedding style on the dim. It
 * is all a strategy that only splits the data needs: the core's generic rules run each op on its
 * shard, the loss weighs every shard by its valid tokens over the dims that split the labels,
 * and resolving the replicated weights' Partial gradients is the gradient all-reduce. Attention
 * over a split sequence still needs a rule for sdpa on the dim. TSR_EINVAL for another split. */
TSR_API tsr_status tsr_registry_add_data_split(tsr_registry_t *reg, const char *owner,
                                               const char *mesh_dim, tsr_placement split);
/* The style registered for (style, mesh_dim), alias-aware on the dim name, or NULL. */
TSR_API const tsr_module_style *
tsr_registry_find_module_style(const tsr_registry_t *reg, const char *style, const char *mesh_dim);
/* Placement of parameter `param` under `s`: Replicate when s is NULL or does not list it. */
TSR_API tsr_placement tsr_module_style_param(const tsr_module_style *s, const char *param);
TSR_API int tsr_registry_module_style_count(const tsr_registry_t *reg);
TSR_API const tsr_module_style *tsr_registry_module_style_at(const tsr_registry_t *reg, int i);

/* ---- Pipeline schedules ----
 * A schedule turns (stages, microbatches, this stage) into the ordered list of actions that
 * stage runs in one step. The pipeline strategy picks one by the name in its INI section. */
typedef enum tsr_pipe_action_kind {
  TSR_PIPE_FORWARD = 0,   /* run the stage's forward on a microbatch */
  TSR_PIPE_BACKWARD = 1,  /* run its backward */
  TSR_PIPE_SEND_ACT = 2,  /* send the forward output to the next stage */
  TSR_PIPE_RECV_ACT = 3,  /* receive the forward input from the previous stage */
  TSR_PIPE_SEND_GRAD = 4, /* send the input gradient to the previous stage */
  TSR_PIPE_RECV_GRAD = 5, /* receive the output gradient from the next stage */
  /* Split backward (zero-bubble schedules): the input-gradient part, which the previous stage
   * waits for, and the weight-gradient part, which nothing downstream waits for. */
  TSR_PIPE_BACKWARD_INPUT = 6,
  TSR_PIPE_BACKWARD_WEIGHT = 7,
} tsr_pipe_action_kind;

typedef struct tsr_pipe_action {
  tsr_pipe_action_kind kind;
  int microbatch;
  int chunk; /* model chunk on this stage (interleaved schedules); 0 otherwise */
} tsr_pipe_action;

/* Writes the actions of `stage` (0 ..= stages-1) into `actions` (capacity `cap`) and sets *n.
 * TSR_EINVAL when the arguments do not fit the schedule (the message says why). */
typedef tsr_status (*tsr_schedule_fn)(int stages, int microbatches, int stage,
                                      tsr_pipe_action *actions, int cap, int *n, void *ctx);

typedef struct tsr_schedule {
  const char *name;  /* "gpipe", "1f1b", ... */
  const char *owner; /* who registered it */
  tsr_schedule_fn build;
  void *ctx;
} tsr_schedule;

/* Copies `sched` into the registry. TSR_EINVAL for a missing name or build, or a name taken. */
TSR_API tsr_status tsr_registry_add_schedule(tsr_registry_t *reg, const tsr_schedule *sched);
/* The schedule called `name`, or NULL. */
TSR_API const tsr_schedule *tsr_registry_find_schedule(const tsr_registry_t *reg, const char *name);
TSR_API int tsr_registry_schedule_count(const tsr_registry_t *reg);
TSR_API const tsr_schedule *tsr_registry_schedule_at(const tsr_registry_t *reg, int i);

/* ---- Optimizer-step hooks ----
 * Hooks run on every rank around each optimizer step: before it (after gradients are final,
 * e.g. to check or clip them) and after it (e.g. to check that replicas still agree). */
typedef enum tsr_hook_when { TSR_HOOK_BEFORE_STEP = 0, TSR_HOOK_AFTER_STEP = 1 } tsr_hook_when;

/* What an optimizer step shows its hooks. Arrays have nparams entries; the model owns them. */
typedef struct tsr_optim_step {
  int64_t step; /* 1-based */
  double lr;
  const tsr_mesh_t *mesh;
  int nparams;
  const char *const *names; /* HF parameter names */
  tsr_dtensor *const *params;
  tsr_dtensor *const *grads;
} tsr_optim_step;

typedef tsr_status (*tsr_optim_hook_fn)(tsr_rank_t *r, tsr_hook_when when,
                                        const tsr_optim_step *step, void *ctx);

typedef struct tsr_optim_hook {
  const char *name; /* for messages */
  tsr_hook_when when;
  tsr_optim_hook_fn fn;
  void *ctx;
} tsr_optim_hook;

/* Copies `hook` into the registry. TSR_EINVAL for a missing name or fn. */
TSR_API tsr_status tsr_registry_add_optim_hook(tsr_registry_t *reg, const tsr_optim_hook *hook);
/* Runs every hook registered for `when`: before-step hooks in registration order, after-step
 * hooks in reverse (so that pairs nest). Stops at the first failure, prefixing the hook's name. */
TSR_API tsr_status tsr_registry_run_optim_hooks(const tsr_registry_t *reg, tsr_rank_t *r,
                                                tsr_hook_when when, const tsr_optim_step *step);
TSR_API int tsr_registry_optim_hook_count(const tsr_registry_t *reg);

/* ---- Gradient hooks ----
 * Hooks that tsr_tape_backward runs on every rank while backward is running: `ready` for each
 * leaf that requires grad (a parameter), as soon as no node still to run can add to its
 * gradient (the node of its first use in forward order has been differentiated), and `done`
 * once when backward has finished, so that work a hook buffered (a partly filled bucket) can
 * complete. `ready` may replace leaf->grad by an equal value with other placements (resolving a
 * Partial early: the data-parallel gradient sync) on the same mesh with the same global shape.
 * Hooks that communicate are collective: every rank sees the leaves in the same order. */
typedef struct tsr_grad_hook {
  const char *name; /* for messages */
  tsr_status (*ready)(tsr_rank_t *r, tsr_var *leaf, void *ctx);
  tsr_status (*done)(tsr_rank_t *r, void *ctx); /* optional */
  void *ctx;
} tsr_grad_hook;

/* Copies `hook` into the registry. TSR_EINVAL for a missing name or ready. */
TSR_API tsr_status tsr_registry_add_grad_hook(tsr_registry_t *reg, const tsr_grad_hook *hook);
TSR_API int tsr_registry_grad_hook_count(const tsr_registry_t *reg);
TSR_API const tsr_grad_hook *tsr_registry_grad_hook_at(const tsr_registry_t *reg, int i);

/* ---- Pipeline stages ----
 * The mesh dim over which the model's layers are split into stages (the model unbinds it), as
 * the strategy that owns the dim declares it; without one the model runs as one stage. */

/* TSR_EINVAL when another dim was declared already (naming both owners). */
TSR_API tsr_status tsr_registry_set_stage_dim(tsr_registry_t *reg, const char *owner,
                                              const char *mesh_dim);
/* The declared stage dim, or NULL. */
TSR_API const char *tsr_registry_stage_dim(const tsr_registry_t *reg);

/* ---- Per-rank state ----
 * State a plugin keeps per rank for the whole job (buffers, shards of optimizer state, scratch)
 * belongs to the rank: made from its allocator, on its device, and counted in its memory.
 * `setup` runs on the rank's thread the first time tsr_rank_state asks for it (after the rank
 * has its device); `teardown` runs in tsr_rank_free, newest first, before the rank's allocator
 * goes away. ctx is the plugin's job state (init's), shared by every rank; the per-rank part is
 * what setup returns. */
typedef struct tsr_rank_state_spec {
  const char *name; /* unique in the job, e.g. "zero1.shards" */
  tsr_status (*setup)(tsr_rank_t *r, void *ctx, void **state);
  void (*teardown)(tsr_rank_t *r, void *state, void *ctx); /* optional */
  void *ctx;
} tsr_rank_state_spec;

/* Copies `spec` into the registry. TSR_EINVAL for a missing name or setup, or a name taken. */
TSR_API tsr_status tsr_registry_add_rank_state(tsr_registry_t *reg,
                                               const tsr_rank_state_spec *spec);
TSR_API int tsr_registry_rank_state_count(const tsr_registry_t *reg);
TSR_API const tsr_rank_state_spec *tsr_registry_rank_state_at(const tsr_registry_t *reg, int i);

/* This rank's state `name`, made by its setup on first use. TSR_EINVAL when the rank's registry
 * has no such state; setup's own error otherwise. */
TSR_API tsr_status tsr_rank_state(tsr_rank_t *r, const char *name, void **out);

#ifdef __cplusplus
}
#endif
#endif
