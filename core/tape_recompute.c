/* Selective activation checkpointing on the tape (tessera/autograd.h, docs/training.md).
 *
 * While the tape is selective, the ops whose local path is an element-wise kernel (rmsnorm, rope,
 * rope_doc, swiglu) mark their output recomputable. Turning it off releases those outputs' local
 * tensors: what stays is what costs a GEMM or attention to make. A backward that reads a
 * released value first runs the op's kernel again on the same inputs, giving the same bits, and
 * the value is released again once the node that made it has been differentiated, since no node
 * before it in forward order can read it. A recompute is local: it never communicates, so it
 * cannot change the order of any rank's collectives (a transient input, an FSDP-gathered norm
 * weight, is gathered again for it, as that node's own backward would). */
#include "tape_impl.h"
#include "tensor_impl.h"

/* A recompute within a recompute: a released value whose inputs were released too. */
#define RECOMPUTE_DEPTH 32

void tsr_tape_mark_recomputable(tsr_tape_t *t, tsr_var *out, tsr_recompute_fn fn) {
  if (t->selective_from < 0 || out->node < 0 || out->node != t->nnodes - 1) return;
  tape_node *n = &t->nodes[out->node];
  if (n->noutputs == 1 && n->outputs[0] == out) n->recompute = fn;
}

static void release(tape_node *n) {
  if (n->dropped || !n->outputs[0]->value->local) return;
  tsr_tape_drop_local(n->outputs[0]);
  n->dropped = true;
}

void tsr_tape_set_selective(tsr_tape_t *t, bool on) {
  if (on) {
    if (t->selective_from < 0) t->selective_from = t->nnodes;
    return;
  }
  if (t->selective_from < 0) return;
  for (int i = t->selective_from; i < t->nnodes; i++)
    if (t->nodes[i].recompute) release(&t->nodes[i]);
  t->selective_from = -1;
}

bool tsr_tape_selective(const tsr_tape_t *t) {
  return t->selective_from >= 0;
}

/* The node of this tape that made v, or NULL (a leaf, or a var of another tape). */
static tape_node *producer(tsr_tape_t *t, const tsr_var *v) {
  if (v->node < 0 || v->node >= t->nnodes) return NULL;
  tape_node *n = &t->nodes[v->node];
  return n->noutputs >= 1 && n->outputs[0] == v ? n : NULL;
}

static tsr_status materialize(tsr_tape_t *t, tsr_var *v, int depth);

static tsr_status recompute(tsr_tape_t *t, tape_node *n, int depth) {
  if (depth > RECOMPUTE_DEPTH)
    return TSR_ERROR(TSR_EINTERNAL, "recomputing '%s' needs more than %d released values in turn",
                     n->op, RECOMPUTE_DEPTH);
  for (int j = 0; j < n->ninputs; j++) TSR_CHECK(materialize(t, n->inputs[j], depth + 1));
  tsr_var *o = n->outputs[0];
  const tsr_dtensor *ov = o->value;
  tsr_dtensor *d = NULL;
  /* a transient is read by this node alone, whose own backward gathers it again itself */
  tsr_status st = tsr_tape_rebuild_transients(t, n);
  if (st == TSR_OK)
    st = tsr_dtensor_uninit(t->r, ov->mesh, ov->dtype, ov->ndim, ov->shape, ov->placements, &d);
  if (st == TSR_OK) {
    o->value->local = d->local;
    d->local = NULL;
    tsr_breadcrumb *b = tsr_breadcrumb_here();
    const char *op = b->op, *pass = b->op_pass;
    b->op = n->op;
    b->op_pass = "recompute";
    int64_t t0 = tsr_trace_clock();
    st = n->recompute(t, n->inputs, n->ninputs, o, n->saved);
    tsr_trace_op(n->op, "recompute", t0);
    b->op = op;
    b->op_pass = pass;
  }
  tsr_dtensor_free(d);
  tsr_tape_drop_transients(n);
  if (st != TSR_OK) {
    tsr_tape_drop_local(o);
    return tsr_error_prefix(st, "recomputing '%s' (selective activation checkpointing)", n->op);
  }
  n->dropped = false;
  return TSR_OK;
}

static tsr_status materialize(tsr_tape_t *t, tsr_var *v, int depth) {
  tape_node *n = producer(t, v);
  return n && n->dropped ? recompute(t, n, depth) : TSR_OK;
}

tsr_status tsr_tape_materialize(tsr_tape_t *t, tsr_var *const *in, int n) {
  for (int j = 0; j < n; j++) TSR_CHECK(materialize(t, in[j], 0));
  return TSR_OK;
}

tsr_status tsr_tape_recompute_inputs(tsr_tape_t *t, const tape_node *node) {
  return tsr_tape_materialize(t, node->inputs, node->ninputs);
}

void tsr_tape_recompute_release(tsr_tape_t *t, tape_node *node) {
  if (node->recompute) {
    node->differentiated = true;
    release(node);
  }
  for (int j = 0; j < node->ninputs; j++) {
    tape_node *p = producer(t, node->inputs[j]);
    if (p && p->recompute && p->differentiated) release(p);
  }
}
