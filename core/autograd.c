/* The per-rank tape. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_table.h"
#include "registry_impl.h"
#include "tape_impl.h"
#include "tensor_impl.h"
#include "tessera/autograd.h"
#include "tessera/breadcrumb.h"
#include "trace_impl.h"

tsr_status tsr_tape_new(tsr_rank_t *r, tsr_tape_t **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a tape");
  (*out)->r = r;
  (*out)->recording = true;
  (*out)->selective_from = -1;
  return TSR_OK;
}

static void release_saved(void *saved, void (*free_saved)(void *)) {
  if (!saved) return;
  if (free_saved)
    free_saved(saved);
  else
    free(saved);
}

static void split_free(tsr_tape_t *t) {
  split_state *sp = t->split;
  if (!sp) return;
  for (int i = 0; sp->grads && i < sp->nnodes * TAPE_MAX_IO; i++) tsr_dtensor_free(sp->grads[i]);
  free(sp->act);
  free(sp->kind);
  free(sp->grads);
  free(sp->inputs);
  free(sp);
  t->split = NULL;
}

void tsr_tape_reset(tsr_tape_t *t) {
  split_free(t);
  for (int i = 0; i < t->nnodes; i++) release_saved(t->nodes[i].saved, t->nodes[i].free_saved);
  for (int i = 0; i < t->nvars; i++) tsr_var_free(t->vars[i]);
  t->nnodes = 0;
  t->nvars = 0;
  t->npending = 0;
  if (t->selective_from > 0) t->selective_from = 0;
}

void tsr_tape_free(tsr_tape_t *t) {
  if (!t) return;
  tsr_tape_reset(t);
  free(t->nodes);
  free(t->vars);
  free(t->pending);
  free(t);
}

tsr_rank_t *tsr_tape_rank(tsr_tape_t *t) {
  return t->r;
}
void tsr_tape_set_recording(tsr_tape_t *t, bool on) {
  t->recording = on;
}
bool tsr_tape_recording(const tsr_tape_t *t) {
  return t->recording;
}
void tsr_tape_set_hooks(tsr_tape_t *t, bool on) {
  t->no_hooks = !on;
}
int tsr_tape_node_count(const tsr_tape_t *t) {
  return t->nnodes;
}

tsr_status tsr_var_new_leaf(tsr_dtensor *value, bool requires_grad, const char *name,
                            tsr_var **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return TSR_ERROR(TSR_ENOMEM, "out of memory allocating a var");
  (*out)->value = value;
  (*out)->requires_grad = requires_grad;
  (*out)->node = -1;
  (*out)->name = name;
  return TSR_OK;
}

void tsr_var_free(tsr_var *v) {
  if (!v) return;
  tsr_dtensor_free(v->value);
  tsr_dtensor_free(v->grad);
  free(v);
}

void tsr_var_zero_grad(tsr_var *v) {
  tsr_dtensor_free(v->grad);
  v->grad = NULL;
}

tsr_status tsr_tape_new_var(tsr_tape_t *t, tsr_dtensor *value, tsr_var **out) {
  *out = NULL;
  if (t->nvars == t->var_cap) {
    int cap = t->var_cap ? 2 * t->var_cap : 64;
    tsr_var **p = realloc(t->vars, sizeof *p * (size_t)cap);
    if (!p) return TSR_ERROR(TSR_ENOMEM, "out of memory growing the tape");
    t->vars = p;
    t->var_cap = cap;
  }
  TSR_CHECK(tsr_var_new_leaf(value, false, NULL, out));
  t->vars[t->nvars++] = *out;
  return TSR_OK;
}

tsr_status tsr_tape_set_transient(tsr_tape_t *t, tsr_var *v, tsr_var *src) {
  if (t->npending == t->pending_cap) {
    int cap = t->pending_cap ? 2 * t->pending_cap : 8;
    transient *p = realloc(t->pending, sizeof *p * (size_t)cap);
    if (!p) return TSR_ERROR(TSR_ENOMEM, "out of memory growing the tape");
    t->pending = p;
    t->pending_cap = cap;
  }
  t->pending[t->npending++] = (transient){v, src};
  return TSR_OK;
}

void tsr_tape_drop_local(tsr_var *v) {
  tsr_tensor_free(v->value->local);
  v->value->local = NULL;
}

/* Rebuilds a transient input's local tensor from its source for the node's backward. */
tsr_status tsr_tape_rebuild_local(tsr_tape_t *t, tsr_var *v, const tsr_var *src) {
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(t->r, src->value, v->value->mesh, v->value->placements, &d));
  v->value->local = d->local;
  d->local = NULL;
  tsr_dtensor_free(d);
  return TSR_OK;
}

/* Takes the transient inputs of a node being recorded off the pending list: srcs[j] is the source
 * of input j, NULL for an ordinary input. */
static void claim_transients(tsr_tape_t *t, tsr_var *const *inputs, int ninputs, tsr_var **srcs) {
  for (int j = 0; j < ninputs; j++) {
    srcs[j] = NULL;
    for (int k = 0; k < t->npending; k++) {
      if (t->pending[k].v != inputs[j]) continue;
      srcs[j] = t->pending[k].src;
      t->pending[k] = t->pending[--t->npending];
      break;
    }
  }
}

tsr_status tsr_tape_record(tsr_tape_t *t, const char *op, tsr_var *const *inputs, int ninputs,
                           tsr_var *const *outputs, int noutputs, tsr_backward_fn backward,
                           void *saved, void (*free_saved)(void *)) {
  tsr_var *srcs[TAPE_MAX_IO] = {0};
  if (t->npending && ninputs <= TAPE_MAX_IO) claim_transients(t, inputs, ninputs, srcs);
  /* the op's forward has run: a transient input is not needed again before backward */
  for (int j = 0; j < ninputs && j < TAPE_MAX_IO; j++)
    if (srcs[j]) tsr_tape_drop_local(inputs[j]);
  bool needed = false;
  for (int i = 0; i < ninputs; i++) needed = needed || inputs[i]->requires_grad;
  if (!t->recording || !needed) {
    release_saved(saved, free_saved);
    return TSR_OK;
  }
  if (ninputs > TAPE_MAX_IO || noutputs > TAPE_MAX_IO) {
    release_saved(saved, free_saved);
    return TSR_ERROR(TSR_EINVAL, "op '%s' records %d inputs and %d outputs; at most %d each", op,
                     ninputs, noutputs, TAPE_MAX_IO);
  }
  if (t->nnodes == t->node_cap) {
    int cap = t->node_cap ? 2 * t->node_cap : 64;
    tape_node *p = realloc(t->nodes, sizeof *p * (size_t)cap);
    if (!p) {
      release_saved(saved, free_saved);
      return TSR_ERROR(TSR_ENOMEM, "out of memory growing the tape");
    }
    t->nodes = p;
    t->node_cap = cap;
  }
  tape_node *n = &t->nodes[t->nnodes];
  memset(n, 0, sizeof *n);
  n->op = op;
  n->ninputs = ninputs;
  n->noutputs = noutputs;
  memcpy(n->inputs, inputs, sizeof *inputs * (size_t)ninputs);
  memcpy(n->outputs, outputs, sizeof *outputs * (size_t)noutputs);
  n->backward = backward;
  n->saved = saved;
  n->free_saved = free_saved;
  memcpy(n->remat, srcs, sizeof srcs);
  for (int i = 0; i < noutputs; i++) {
    outputs[i]->requires_grad = true;
    outputs[i]->node = t->nnodes;
  }
  t->nnodes++;
  return TSR_OK;
}

static bool same_layout(const tsr_dtensor *a, const tsr_dtensor *b) {
  if (!tsr_mesh_equal(a->mesh, b->mesh)) return false;
  for (int i = 0; i < tsr_mesh_ndim(a->mesh); i++)
    if (!tsr_placement_equal(a->placements[i], b->placements[i])) return false;
  return true;
}

/* Turns v's gradient Partial(sum) on each mesh dim where it is Replicate and `grad` is
 * Partial(sum). Frees `grad` on failure. */
static tsr_status widen_to_partial(tsr_tape_t *t, tsr_var *v, tsr_dtensor *grad) {
  const tsr_mesh_t *m = v->grad->mesh;
  if (!tsr_mesh_equal(m, grad->mesh)) return TSR_OK;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  bool widen = false;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    p[i] = v->grad->placements[i];
    tsr_placement q = grad->placements[i];
    if (p[i].kind == TSR_REPLICATE && q.kind == TSR_PARTIAL && q.op == TSR_REDUCE_SUM &&
        tsr_mesh_dim_size(m, i) > 1) {
      p[i] = q;
      widen = true;
    }
  }
  if (!widen) return TSR_OK;
  tsr_dtensor *w = NULL;
  tsr_status st = tsr_dtensor_redistribute(t->r, v->grad, m, p, &w);
  if (st != TSR_OK) {
    tsr_dtensor_free(grad);
    return st;
  }
  tsr_dtensor_free(v->grad);
  v->grad = w;
  return TSR_OK;
}

tsr_status tsr_var_accumulate_grad(tsr_tape_t *t, tsr_var *v, tsr_dtensor *grad) {
  if (!v->requires_grad) {
    tsr_dtensor_free(grad);
    return TSR_OK;
  }
  if (!v->grad) {
    v->grad = grad;
    return TSR_OK;
  }
  /* Two uses of one value may leave gradients with different placements (e.g. a Partial one and
   * a Replicate one): bring the new one to the placements already there, then add locally. Where
   * the new one is a pending sum and the one there is Replicate, the sum stays pending instead:
   * making the replicated one Partial is free, while reducing the new one would be an all-reduce
   * that the consumer may not need in full (a reduce-scatter into a sequence shard). */
  TSR_CHECK(widen_to_partial(t, v, grad));
  tsr_dtensor *g = grad;
  if (!same_layout(v->grad, grad)) {
    tsr_status st = tsr_dtensor_redistribute(t->r, grad, v->grad->mesh, v->grad->placements, &g);
    tsr_dtensor_free(grad);
    TSR_CHECK(st);
  }
  tsr_status st = TSR_OK;
  if (v->grad->local) {
    tsr_tensor *a = v->grad->local, *b = g->local;
    if (a->dtype != TSR_F32 || tsr_tensor_numel(a) != tsr_tensor_numel(b)) {
      st = TSR_ERROR(TSR_EINTERNAL, "gradient of '%s' accumulates %lld elements into %lld",
                     v->name ? v->name : "(unnamed)", (long long)tsr_tensor_numel(b),
                     (long long)tsr_tensor_numel(a));
    } else if (tsr_tensor_is_shared(a)) {
      /* another gradient shares the buffer (an add's inputs, a view's): the sum goes to a new
       * one, leaving the other as it was */
      tsr_tensor *sum = NULL;
      st = tsr_tensor_new_uninit(tsr_rank_allocator(t->r), a->dtype, a->ndim, a->shape, &sum);
      if (st == TSR_OK) {
        tsr_kernel_table_of(a)->add(tsr_tensor_data(sum), tsr_tensor_data(a), tsr_tensor_data(b),
                                    tsr_tensor_numel(a));
        tsr_tensor_free(v->grad->local);
        v->grad->local = sum;
      }
    } else {
      tsr_kernel_table_of(a)->add(tsr_tensor_data(a), tsr_tensor_data(a), tsr_tensor_data(b),
                                  tsr_tensor_numel(a));
    }
  }
  tsr_dtensor_free(g);
  return st;
}

/* Gives v a gradient buffer of its own when it shares one (an add's or a view's backward): a
 * leaf's gradient is written in place once backward is past it (dp's buckets, clipping). */
static tsr_status unshare_grad(tsr_tape_t *t, tsr_var *v) {
  if (!v->grad || !v->grad->local || !tsr_tensor_is_shared(v->grad->local)) return TSR_OK;
  tsr_dtensor *own = NULL;
  TSR_CHECK(tsr_dtensor_clone(t->r, v->grad, &own));
  tsr_dtensor_free(v->grad);
  v->grad = own;
  return TSR_OK;
}

/* The node's backward function, with the op it differentiates in the breadcrumb. */
static tsr_status run_backward(tsr_tape_t *t, tape_node *node) {
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  const char *op = b->op, *pass = b->op_pass;
  b->op = node->op;
  b->op_pass = "backward";
  int64_t t0 = tsr_trace_clock();
  tsr_status st =
      node->backward(t, node->inputs, node->ninputs, node->outputs, node->noutputs, node->saved);
  tsr_trace_op(node->op, "backward", t0);
  b->op = op;
  b->op_pass = pass;
  return st;
}

tsr_status tsr_tape_rebuild_transients(tsr_tape_t *t, const tape_node *node) {
  for (int j = 0; j < node->ninputs; j++)
    if (node->remat[j] && !node->inputs[j]->value->local)
      TSR_CHECK(tsr_tape_rebuild_local(t, node->inputs[j], node->remat[j]));
  return TSR_OK;
}

void tsr_tape_drop_transients(const tape_node *node) {
  for (int j = 0; j < node->ninputs; j++)
    if (node->remat[j]) tsr_tape_drop_local(node->inputs[j]);
}

/* Runs the node's backward with every input it reads in place: its transient inputs gathered
 * again and the values selective checkpointing released made again for the call, and released
 * after it. */
static tsr_status run_node(tsr_tape_t *t, tape_node *node) {
  tsr_status st = tsr_tape_rebuild_transients(t, node);
  if (st == TSR_OK) st = tsr_tape_recompute_inputs(t, node);
  if (st == TSR_OK) st = run_backward(t, node);
  tsr_tape_drop_transients(node);
  tsr_tape_recompute_release(t, node);
  return st;
}

/* Runs one node's backward and frees its outputs' gradients. */
static tsr_status backward_node(tsr_tape_t *t, tape_node *node) {
  tsr_status st = run_node(t, node);
  if (st != TSR_OK) return tsr_error_prefix(st, "backward of '%s'", node->op);
  /* An intermediate's gradient is read only by the node that made it: free it now to keep
   * backward's memory at one layer's worth. */
  for (int k = 0; k < node->noutputs; k++) tsr_var_zero_grad(node->outputs[k]);
  return TSR_OK;
}

/* A leaf that requires grad and the node of its first use (slot: its input position there). */
typedef struct leaf_use {
  tsr_var *v;
  int node, slot;
} leaf_use;

static int by_var_then_node(const void *a, const void *b) {
  const leaf_use *x = a, *y = b;
  uintptr_t p = (uintptr_t)x->v, q = (uintptr_t)y->v;
  if (p != q) return p < q ? -1 : 1;
  return x->node != y->node ? (x->node < y->node ? -1 : 1) : x->slot - y->slot;
}

/* Whether backward reached the node: a gradient arrived at one of its outputs. */
static bool reached(const tape_node *node) {
  for (int k = 0; k < node->noutputs; k++)
    if (node->outputs[k]->grad) return true;
  return false;
}

/* Tells every gradient hook about the leaves first used at node i (their gradients are final:
 * no node before i reads them); `next` walks `uses`, which is sorted by node, downwards. */
static tsr_status hooks_ready(tsr_tape_t *t, const tsr_registry_t *reg, int nhooks,
                              const leaf_use *uses, int nuses, int i, int *next) {
  for (; *next < nuses && uses[*next].node == i; (*next)++) {
    TSR_CHECK(unshare_grad(t, uses[*next].v));
    for (int h = 0; h < nhooks; h++) {
      const tsr_grad_hook *hook = tsr_registry_grad_hook_at(reg, h);
      tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(tsr_registry_grad_hook_owner(reg, h),
                                                        "gradient hook", hook->name, "ready");
      tsr_status st = hook->ready(t->r, uses[*next].v, hook->ctx);
      tsr_breadcrumb_leave(&crumb);
      if (st != TSR_OK)
        return tsr_error_prefix(st, "gradient hook %s on %s", hook->name,
                                uses[*next].v->name ? uses[*next].v->name : "(unnamed)");
    }
  }
  return TSR_OK;
}

static tsr_status hooks_done(tsr_tape_t *t, const tsr_registry_t *reg, int nhooks) {
  for (int h = 0; h < nhooks; h++) {
    const tsr_grad_hook *hook = tsr_registry_grad_hook_at(reg, h);
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(tsr_registry_grad_hook_owner(reg, h),
                                                      "gradient hook", hook->name, "done");
    tsr_status st = hook->done ? hook->done(t->r, hook->ctx) : TSR_OK;
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK)
      return tsr_error_prefix(st, "gradient hook %s at the end of backward", hook->name);
  }
  return TSR_OK;
}

/* Latest first use first: the order backward finalises them in, the same on every rank. */
static int by_node_desc(const void *a, const void *b) {
  const leaf_use *x = a, *y = b;
  if (x->node != y->node) return x->node > y->node ? -1 : 1;
  return x->slot - y->slot;
}

static tsr_status leaf_first_uses(tsr_tape_t *t, leaf_use **out, int *n) {
  int cap = 0, k = 0;
  for (int i = 0; i < t->nnodes; i++) cap += t->nodes[i].ninputs;
  leaf_use *u = malloc(sizeof *u * (size_t)(cap ? cap : 1));
  if (!u) return TSR_ERROR(TSR_ENOMEM, "out of memory listing the tape's leaves");
  for (int i = 0; i < t->nnodes; i++)
    for (int j = 0; j < t->nodes[i].ninputs; j++) {
      tsr_var *v = t->nodes[i].inputs[j];
      if (v->node < 0 && v->requires_grad) u[k++] = (leaf_use){v, i, j};
    }
  qsort(u, (size_t)k, sizeof *u, by_var_then_node);
  int m = 0;
  for (int i = 0; i < k; i++)
    if (m == 0 || u[m - 1].v != u[i].v) u[m++] = u[i];
  qsort(u, (size_t)m, sizeof *u, by_node_desc);
  *out = u;
  *n = m;
  return TSR_OK;
}

tsr_status tsr_tape_backward(tsr_tape_t *t, tsr_var *loss) {
  int64_t n = 1;
  for (int d = 0; d < loss->value->ndim; d++) n *= loss->value->shape[d];
  if (n != 1)
    return TSR_ERROR(TSR_EINVAL, "backward from a var of %lld elements; it needs a scalar loss",
                     (long long)n);
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(loss->value->mesh); i++) rep[i] = tsr_replicate();
  tsr_dtensor *seed = NULL;
  TSR_CHECK(tsr_dtensor_zeros(t->r, loss->value->mesh, TSR_F32, loss->value->ndim,
                              loss->value->shape, rep, &seed));
  const float one = 1.0f;
  if (seed->local) tsr_memcpy_any(tsr_tensor_data(seed->local), &one, sizeof one);
  return tsr_tape_backward_with(t, loss, seed);
}

tsr_status tsr_tape_backward_with(tsr_tape_t *t, tsr_var *out, tsr_dtensor *grad) {
  bool same = grad->ndim == out->value->ndim;
  for (int d = 0; same && d < grad->ndim; d++) same = grad->shape[d] == out->value->shape[d];
  if (!same) {
    tsr_dtensor_free(grad);
    return TSR_ERROR(TSR_EINVAL, "backward: the output gradient's shape differs from the output's");
  }
  if (!out->requires_grad) {
    tsr_dtensor_free(grad);
    return TSR_ERROR(TSR_EINVAL, "backward from a value that depends on no parameter");
  }
  TSR_CHECK(tsr_var_accumulate_grad(t, out, grad));
  const tsr_registry_t *reg = tsr_rank_registry(t->r);
  int nhooks = t->no_hooks ? 0 : tsr_registry_grad_hook_count(reg), nuses = 0, next = 0;
  leaf_use *uses = NULL;
  if (nhooks) TSR_CHECK(leaf_first_uses(t, &uses, &nuses));
  tsr_status st = TSR_OK;
  for (int i = t->nnodes - 1; i >= 0 && st == TSR_OK; i--) {
    tape_node *node = &t->nodes[i];
    if (reached(node)) st = backward_node(t, node);
    /* no node before i reads the leaves first used at i: their gradients are final */
    if (st == TSR_OK) st = hooks_ready(t, reg, nhooks, uses, nuses, i, &next);
  }
  if (st == TSR_OK) st = hooks_done(t, reg, nhooks);
  free(uses);
  return st;
}

tsr_status tsr_var_resolve_grad(tsr_tape_t *t, tsr_var *v) {
  const tsr_dtensor *x = v->value;
  if (!v->grad)
    return tsr_dtensor_zeros(t->r, x->mesh, x->dtype, x->ndim, x->shape, x->placements, &v->grad);
  if (same_layout(v->grad, x)) return unshare_grad(t, v);
  tsr_dtensor *g = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(t->r, v->grad, x->mesh, x->placements, &g));
  tsr_dtensor_free(v->grad);
  v->grad = g;
  return TSR_OK;
}

/* ---- split backward (tessera/autograd.h) ---- */

int tsr_tape_deferred_count(const tsr_tape_t *t) {
  return t->split ? t->split->ndeferred : 0;
}

/* Whether v's gradient leads to one of the split's inputs. */
static bool split_is_act(const split_state *sp, const tsr_var *v) {
  if (v->node >= 0) return v->node < sp->nnodes && sp->act[v->node];
  for (int j = 0; j < sp->ninputs; j++)
    if (sp->inputs[j] == v) return true;
  return false;
}

/* Runs node's backward with the inputs on one side (act: those leading to an input, or the
 * others) made not to require grad for the call, so the op computes only the other side's
 * gradients. Output gradients are left in place. */
static tsr_status split_run(tsr_tape_t *t, tape_node *node, bool mask_act) {
  const split_state *sp = t->split;
  bool masked[TAPE_MAX_IO] = {0};
  for (int j = 0; j < node->ninputs; j++)
    if (node->inputs[j]->requires_grad && split_is_act(sp, node->inputs[j]) == mask_act) {
      node->inputs[j]->requires_grad = false;
      masked[j] = true;
    }
  tsr_status st = run_node(t, node);
  for (int j = 0; j < node->ninputs; j++)
    if (masked[j]) node->inputs[j]->requires_grad = true;
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s backward of '%s'", mask_act ? "weight" : "input", node->op);
  return TSR_OK;
}

/* A node whose weight-gradient half can wait: a linear (its backward computes each input's
 * gradient only when that input requires grad) with inputs on both sides. */
static bool splittable(const split_state *sp, const tape_node *node) {
  if (strcmp(node->op, "linear") != 0) return false;
  bool act = false, weight = false;
  for (int j = 0; j < node->ninputs; j++) {
    if (!node->inputs[j]->requires_grad) continue;
    if (split_is_act(sp, node->inputs[j]))
      act = true;
    else
      weight = true;
  }
  return act && weight;
}

tsr_status tsr_tape_backward_input(tsr_tape_t *t, tsr_var *out, tsr_dtensor *grad,
                                   tsr_var *const *inputs, int ninputs) {
  if (t->split) {
    tsr_dtensor_free(grad);
    return TSR_ERROR(TSR_EINVAL,
                     "backward_input: the tape's previous split backward still waits for "
                     "tsr_tape_backward_weight");
  }
  bool same = grad->ndim == out->value->ndim;
  for (int d = 0; same && d < grad->ndim; d++) same = grad->shape[d] == out->value->shape[d];
  if (!same || !out->requires_grad) {
    tsr_dtensor_free(grad);
    return TSR_ERROR(TSR_EINVAL, same ? "backward_input from a value that depends on no parameter"
                                      : "backward_input: the output gradient's shape differs "
                                        "from the output's");
  }
  split_state *sp = calloc(1, sizeof *sp);
  int n = t->nnodes;
  if (sp) {
    sp->nnodes = n;
    sp->act = calloc((size_t)n + 1, 1);
    sp->kind = calloc((size_t)n + 1, 1);
    sp->grads = calloc((size_t)n * TAPE_MAX_IO + 1, sizeof *sp->grads);
    sp->inputs = calloc((size_t)ninputs + 1, sizeof *sp->inputs);
  }
  t->split = sp;
  if (!sp || !sp->act || !sp->kind || !sp->grads || !sp->inputs) {
    split_free(t);
    tsr_dtensor_free(grad);
    return TSR_ERROR(TSR_ENOMEM, "out of memory splitting a backward of %d nodes", n);
  }
  if (ninputs) memcpy(sp->inputs, inputs, sizeof *inputs * (size_t)ninputs);
  sp->ninputs = ninputs;
  /* forward order: a node leads to an input when one of its inputs does */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < t->nodes[i].ninputs && !sp->act[i]; j++)
      sp->act[i] = split_is_act(sp, t->nodes[i].inputs[j]);
  tsr_status st = tsr_var_accumulate_grad(t, out, grad);
  for (int i = n - 1; i >= 0 && st == TSR_OK; i--) {
    tape_node *node = &t->nodes[i];
    bool has_grad = reached(node);
    if (!sp->act[i]) {
      sp->kind[i] = SPLIT_WHOLE_LATER; /* its gradients reach weights only */
      sp->ndeferred++;
    } else if (has_grad && splittable(sp, node)) {
      st = split_run(t, node, false);
      for (int k = 0; k < node->noutputs; k++) {
        sp->grads[i * TAPE_MAX_IO + k] = node->outputs[k]->grad;
        node->outputs[k]->grad = NULL;
      }
      sp->kind[i] = SPLIT_WEIGHT_LATER;
      sp->ndeferred++;
    } else if (has_grad) {
      st = backward_node(t, node);
    }
  }
  if (st != TSR_OK) split_free(t);
  return st;
}

tsr_status tsr_tape_backward_weight(tsr_tape_t *t) {
  split_state *sp = t->split;
  if (!sp)
    return TSR_ERROR(TSR_EINVAL, "backward_weight: no split backward is pending (call "
                                 "tsr_tape_backward_input first)");
  const tsr_registry_t *reg = tsr_rank_registry(t->r);
  int nhooks = t->no_hooks ? 0 : tsr_registry_grad_hook_count(reg), nuses = 0, next = 0;
  leaf_use *uses = NULL;
  tsr_status st = TSR_OK;
  if (nhooks) st = leaf_first_uses(t, &uses, &nuses);
  for (int i = sp->nnodes - 1; i >= 0 && st == TSR_OK; i--) {
    tape_node *node = &t->nodes[i];
    if (sp->kind[i] == SPLIT_WEIGHT_LATER) {
      for (int k = 0; k < node->noutputs; k++) {
        tsr_var_zero_grad(node->outputs[k]);
        node->outputs[k]->grad = sp->grads[i * TAPE_MAX_IO + k];
        sp->grads[i * TAPE_MAX_IO + k] = NULL;
      }
      st = split_run(t, node, true);
      for (int k = 0; k < node->noutputs; k++) tsr_var_zero_grad(node->outputs[k]);
    } else if (sp->kind[i] == SPLIT_WHOLE_LATER) {
      if (reached(node)) st = backward_node(t, node);
    }
    if (st == TSR_OK) st = hooks_ready(t, reg, nhooks, uses, nuses, i, &next);
  }
  if (st == TSR_OK) st = hooks_done(t, reg, nhooks);
  free(uses);
  split_free(t);
  return st;
}
