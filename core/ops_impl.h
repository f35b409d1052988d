/* Private helpers shared by the op implementations (ops_*.c). */
#ifndef TESSERA_OPS_IMPL_H
#define TESSERA_OPS_IMPL_H

#include "kernel_table.h"
#include "tessera/breadcrumb.h"
#include "tessera/kernels.h"
#include "tessera/ops.h"
#include "trace_impl.h"

/* The op in the breadcrumb while its forward runs: enter before, leave with the result. The
 * forward is also a trace event when the thread records one (tessera/trace.h). */
typedef struct tsr_op_crumb {
  const char *op, *pass;
  int64_t t0; /* tsr_trace_clock at the start; -1 when the thread records no trace */
} tsr_op_crumb;

static inline tsr_op_crumb tsr_op_crumb_enter(const char *op) {
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  tsr_op_crumb c = {b->op, b->op_pass, tsr_trace_clock()};
  b->op = op;
  b->op_pass = "forward";
  return c;
}

static inline tsr_status tsr_op_crumb_leave(tsr_op_crumb c, tsr_status st) {
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  if (c.t0 >= 0) tsr_trace_op(b->op, "forward", c.t0);
  b->op = c.op;
  b->op_pass = c.pass;
  return st;
}

/* The kernels of the device a DTensor's local tensor lives on. */
static inline const tsr_kernel_table *tsr_op_kernels(const tsr_dtensor *x) {
  return tsr_kernel_table_of(x->local);
}

/* Fails with TSR_EINVAL unless `v` is f32 (or `dt`) with `ndim` dims, naming the op and role. */
tsr_status tsr_op_check(const char *op, const char *role, const tsr_var *v, tsr_dtype dt, int ndim);

/* A new tape var of zeros: global `shape`, placements `p` on x's mesh. */
tsr_status tsr_op_new_output(tsr_tape_t *t, const tsr_var *like, int ndim, const int64_t *shape,
                             const tsr_placement *p, tsr_var **out);
/* As tsr_op_new_output, the local tensor left unzeroed: for the core's own kernels that write
 * every element of their output (add, linear, rmsnorm, rope, swiglu), not for one that adds into
 * it. */
tsr_status tsr_op_new_output_whole(tsr_tape_t *t, const tsr_var *like, int ndim,
                                   const int64_t *shape, const tsr_placement *p, tsr_var **out);

/* The core's own attention on q, k, v = in[0..2] once no rule has taken the op: the output, the
 * saved log-sum-exp and positions, and the tape node, for `op` ("sdpa", or "sdpa_doc" with
 * in[3] the segment ids laid out like q's rows, nin = 4, through the kernels with segment ids). */
tsr_status tsr_op_sdpa_local(tsr_tape_t *t, const char *op, tsr_var *const *in, int nin,
                             bool causal, const tsr_op_placements *plan, tsr_var **out);

/* A zero gradient for `v` with placements `p`. */
tsr_status tsr_op_new_grad(tsr_tape_t *t, const tsr_var *v, const tsr_placement *p,
                           tsr_dtensor **out);

/* out's gradient with the placements `want` (redistributed when it arrived otherwise), in *g;
 * *owned says whether the caller must free it. */
tsr_status tsr_op_grad_of(tsr_tape_t *t, const tsr_var *out, const tsr_placement *want,
                          const tsr_dtensor **g, tsr_dtensor **owned);

/* The placements a gradient of a value placed `p` arrives with: Partial becomes Replicate. */
void tsr_op_grad_placements(const tsr_mesh_t *m, const tsr_placement *p, tsr_placement *out);

/* Selective activation checkpointing (tsr_tape_set_selective, tape_recompute.c): writes the
 * output's local tensor (allocated, not zeroed) again from the node's inputs and saved state,
 * exactly as the op's forward did. */
typedef tsr_status (*tsr_recompute_fn)(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *out,
                                       void *saved);
/* Marks `out`, the one output of the node just recorded, recomputable when the tape is
 * selective; a no-op otherwise. For an op's local path only: a recompute runs no collective. */
void tsr_tape_mark_recomputable(tsr_tape_t *t, tsr_var *out, tsr_recompute_fn fn);
/* Makes the local tensors of `in` that selective checkpointing released again, for a forward op
 * that reads them after the tape stopped being selective. */
tsr_status tsr_tape_materialize(tsr_tape_t *t, tsr_var *const *in, int n);

/* The core's generic rule for op on mesh dim `dim` (ops_rules.c): true and the placements set
 * when one applies. */
bool tsr_op_generic_rule(const char *op, tsr_var *const *in, int nin, int dim,
                         tsr_placement *outputs, tsr_placement *grads);

/* When the plan has a rule with a compute function on one mesh dim, runs it as the op's forward,
 * records its backward and sets *handled; otherwise leaves *handled false. `attrs` (attrs_size
 * bytes, at most 64) is copied for the backward. */
tsr_status tsr_op_run_rule(tsr_tape_t *t, const char *op, tsr_var *const *in, int nin,
                           const void *attrs, size_t attrs_size, const tsr_op_placements *plan,
                           int nout, tsr_var **outs, bool *handled);

/* The global positions of x's local rows along the sequence dim (1), as an i32 tensor on x's
 * device (untracked on the host); *L is their count. RoPE and attention read them. */
tsr_status tsr_op_positions(tsr_tape_t *t, const tsr_dtensor *x, int *L, tsr_tensor **out);

/* Product of a local tensor's dims except the last. */
int64_t tsr_op_rows(const tsr_tensor *t);

/* Plan saved by ops whose backward only needs their placement plan. */
typedef struct tsr_op_saved_plan {
  tsr_op_placements plan;
  float eps;       /* rmsnorm */
  float theta;     /* rope */
  float scale;     /* cross_entropy: this rank's valid tokens over the whole batch's */
  tsr_tensor *aux; /* op-specific saved tensor (rmsnorm rstd, attention lse/out), owned */
  tsr_tensor *aux2;
  bool causal;
} tsr_op_saved_plan;

tsr_status tsr_op_saved_new(const tsr_op_placements *plan, tsr_op_saved_plan **out);
void tsr_op_saved_free(void *p);

#endif
