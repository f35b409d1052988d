/* Core registries that strategy plugins add to when they load.
 *
 * A registry belongs to a job: plugins register into it before any rank starts, and ranks read it
 * (through tsr_rank_registry) while they run. The core consults it; it knows no plugin by name.
 */
#ifndef TESSERA_REGISTRY_H
#define TESSERA_REGISTRY_H

#include <stdbool.h>

#include "tessera/autograd.h"
#include "tessera/dtensor.h"
#include "tessera/rank.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

tsr_status tsr_registry_new(tsr_registry_t **out);
void tsr_registry_free(tsr_registry_t *reg);

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
tsr_status tsr_registry_add_redistribute(tsr_registry_t *reg, const tsr_redistribute_rule *rule);
int tsr_registry_redistribute_count(const tsr_registry_t *reg);
const tsr_redistribute_rule *tsr_registry_redistribute_at(const tsr_registry_t *reg, int i);

/* ---- Op sharding rules ----
 * A rule says, for one op on one mesh dim, which input placements it accepts, what the local
 * computation is and what placements the outputs get, e.g. matmul on tp: S(0)·R -> S(0),
 * R·S(1) -> S(1), S(1)·S(0) -> P(sum). Lookup is by (op, mesh dim, input placements); newer
 * registrations win, and a rule for a named dim wins over one for any dim. No rule is an error
 * for the caller to report (naming the op, the dim and the placements), never a silent gather. */
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

/* Copies `rule` into the registry. TSR_EINVAL for a missing name or op, counts out of range, or a
 * rule with the same op, dim and inputs as one already registered (naming both). */
tsr_status tsr_registry_add_op_rule(tsr_registry_t *reg, const tsr_op_rule *rule);
/* The rule for `op` on the mesh dim called `mesh_dim` with inputs placed as `inputs` (ninputs
 * entries), or NULL. */
const tsr_op_rule *tsr_registry_find_op_rule(const tsr_registry_t *reg, const char *op,
                                             const char *mesh_dim, int ninputs,
                                             const tsr_placement *inputs);
int tsr_registry_op_rule_count(const tsr_registry_t *reg);
const tsr_op_rule *tsr_registry_op_rule_at(const tsr_registry_t *reg, int i);

/* ---- Module styles ----
 * For one module style ("column_linear", "row_linear", "embedding", "rmsnorm", "attention",
 * "mlp") on one mesh dim, the strategy that owns the dim decides the placements of the module's
 * parameters and of its input and output activations on that dim. A dim with no style for a
 * module is dense and replicated there (tsr_module_style_param returns Replicate). The Llama
 * model places k_proj and v_proj by "kv_linear" where a strategy registered it on the dim, and by
 * "column_linear" elsewhere (tensor parallelism keeps them whole when tp > kv heads). */
#define TSR_MAX_STYLE_PARAMS 4

typedef struct tsr_style_param {
  const char *name;        /* parameter name within the module: "weight", "bias" */
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

/* Copies `style` into the registry. TSR_EINVAL for missing names, or when (style, dim) already
 * has a style: the message names both owners. */
tsr_status tsr_registry_add_module_style(tsr_registry_t *reg, const tsr_module_style *style);
/* The style registered for (style, mesh_dim), alias-aware on the dim name, or NULL. */
const tsr_module_style *tsr_registry_find_module_style(const tsr_registry_t *reg, const char *style,
                                                       const char *mesh_dim);
/* Placement of parameter `param` under `s`: Replicate when s is NULL or does not list it. */
tsr_placement tsr_module_style_param(const tsr_module_style *s, const char *param);
int tsr_registry_module_style_count(const tsr_registry_t *reg);
const tsr_module_style *tsr_registry_module_style_at(const tsr_registry_t *reg, int i);

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
tsr_status tsr_registry_add_schedule(tsr_registry_t *reg, const tsr_schedule *sched);
/* The schedule called `name`, or NULL. */
const tsr_schedule *tsr_registry_find_schedule(const tsr_registry_t *reg, const char *name);
int tsr_registry_schedule_count(const tsr_registry_t *reg);
const tsr_schedule *tsr_registry_schedule_at(const tsr_registry_t *reg, int i);

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
tsr_status tsr_registry_add_optim_hook(tsr_registry_t *reg, const tsr_optim_hook *hook);
/* Runs every hook registered for `when`: before-step hooks in registration order, after-step
 * hooks in reverse (so that pairs nest). Stops at the first failure, prefixing the hook's name. */
tsr_status tsr_registry_run_optim_hooks(const tsr_registry_t *reg, tsr_rank_t *r,
                                        tsr_hook_when when, const tsr_optim_step *step);
int tsr_registry_optim_hook_count(const tsr_registry_t *reg);

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
tsr_status tsr_registry_add_grad_hook(tsr_registry_t *reg, const tsr_grad_hook *hook);
int tsr_registry_grad_hook_count(const tsr_registry_t *reg);
const tsr_grad_hook *tsr_registry_grad_hook_at(const tsr_registry_t *reg, int i);

#ifdef __cplusplus
}
#endif
#endif
