/* Op placement planning and the structural ops: view, add, redistribute. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "registry_impl.h"
#include "tensor_impl.h"
#include "tessera/breadcrumb.h"

static const tsr_mesh_t *mesh_of(const tsr_var *v) {
  return v->value->mesh;
}

tsr_status tsr_op_check(const char *op, const char *role, const tsr_var *v, tsr_dtype dt,
                        int ndim) {
  const tsr_dtensor *x = v->value;
  if (x->dtype != dt)
    return TSR_ERROR(TSR_EINVAL, "%s: %s '%s' is %s; the op takes %s", op, role,
                     v->name ? v->name : "", tsr_dtype_name(x->dtype), tsr_dtype_name(dt));
  if (ndim >= 0 && x->ndim != ndim) {
    char b[128];
    return TSR_ERROR(TSR_EINVAL, "%s: %s '%s' has shape %s; the op takes %d dims", op, role,
                     v->name ? v->name : "", tsr_shape_str(x->ndim, x->shape, b, sizeof b), ndim);
  }
  return TSR_OK;
}

tsr_status tsr_op_plan(tsr_tape_t *t, const char *op, tsr_var *const *inputs, int ninputs,
                       int noutputs, tsr_op_placements *plan) {
  memset(plan, 0, sizeof *plan);
  TSR_CHECK(tsr_tape_materialize(t, inputs, ninputs));
  const tsr_mesh_t *m = mesh_of(inputs[0]);
  for (int j = 1; j < ninputs; j++)
    if (!tsr_mesh_equal(mesh_of(inputs[j]), m)) {
      char a[128], b[128];
      return TSR_ERROR(TSR_EINVAL,
                       "%s: input %d is on mesh %s but input 0 on %s; redistribute it first", op, j,
                       tsr_mesh_str(mesh_of(inputs[j]), a, sizeof a), tsr_mesh_str(m, b, sizeof b));
    }
  const tsr_registry_t *reg = tsr_rank_registry(tsr_tape_rank(t));
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    for (int k = 0; k < noutputs; k++) plan->outputs[k][i] = tsr_replicate();
    for (int j = 0; j < ninputs; j++) plan->grads[j][i] = tsr_replicate();
    if (tsr_mesh_dim_size(m, i) == 1) continue;
    tsr_placement in[TSR_MAX_OP_INPUTS];
    for (int j = 0; j < ninputs; j++) in[j] = inputs[j]->value->placements[i];
    const tsr_op_rule *rule =
        reg ? tsr_registry_find_op_rule(reg, op, tsr_mesh_dim_name(m, i), ninputs, in) : NULL;
    if (rule) {
      plan->rules[i] = rule;
      tsr_registry_note_op_rule(reg, rule);
      for (int k = 0; k < noutputs && k < rule->noutputs; k++)
        plan->outputs[k][i] = rule->outputs[k];
      for (int j = 0; j < ninputs; j++) plan->grads[j][i] = rule->grads[j];
      continue;
    }
    tsr_placement outs[TSR_MAX_OP_OUTPUTS], grads[TSR_MAX_OP_INPUTS];
    if (tsr_op_generic_rule(op, inputs, ninputs, i, outs, grads)) {
      for (int k = 0; k < noutputs; k++) plan->outputs[k][i] = outs[k];
      for (int j = 0; j < ninputs; j++) plan->grads[j][i] = grads[j];
      continue;
    }
    char desc[256] = "";
    size_t at = 0;
    for (int j = 0; j < ninputs && at < sizeof desc; j++) {
      char b[32];
      at += (size_t)snprintf(desc + at, sizeof desc - at, "%s%s", j ? ", " : "",
                             tsr_placement_str(in[j], b, sizeof b));
    }
    return TSR_ERROR(TSR_ENOTSUP,
                     "no sharding rule for op '%s' on mesh dim '%s' (size %d) with inputs (%s): "
                     "load the strategy that owns '%s', or redistribute the inputs",
                     op, tsr_mesh_dim_name(m, i), tsr_mesh_dim_size(m, i), desc,
                     tsr_mesh_dim_name(m, i));
  }
  return TSR_OK;
}

tsr_status tsr_op_new_output(tsr_tape_t *t, const tsr_var *like, int ndim, const int64_t *shape,
                             const tsr_placement *p, tsr_var **out) {
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_dtensor_zeros(tsr_tape_rank(t), mesh_of(like), TSR_F32, ndim, shape, p, &d));
  tsr_status st = tsr_tape_new_var(t, d, out);
  if (st != TSR_OK) tsr_dtensor_free(d);
  return st;
}

tsr_status tsr_op_new_output_whole(tsr_tape_t *t, const tsr_var *like, int ndim,
                                   const int64_t *shape, const tsr_placement *p, tsr_var **out) {
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_dtensor_uninit(tsr_tape_rank(t), mesh_of(like), TSR_F32, ndim, shape, p, &d));
  tsr_status st = tsr_tape_new_var(t, d, out);
  if (st != TSR_OK) tsr_dtensor_free(d);
  return st;
}

tsr_status tsr_op_new_grad(tsr_tape_t *t, const tsr_var *v, const tsr_placement *p,
                           tsr_dtensor **out) {
  const tsr_dtensor *x = v->value;
  return tsr_dtensor_zeros(tsr_tape_rank(t), x->mesh, TSR_F32, x->ndim, x->shape, p, out);
}

void tsr_op_grad_placements(const tsr_mesh_t *m, const tsr_placement *p, tsr_placement *out) {
  for (int i = 0; i < tsr_mesh_ndim(m); i++)
    out[i] = p[i].kind == TSR_PARTIAL ? tsr_replicate() : p[i];
}

tsr_status tsr_op_grad_of(tsr_tape_t *t, const tsr_var *out, const tsr_placement *want,
                          const tsr_dtensor **g, tsr_dtensor **owned) {
  *owned = NULL;
  *g = out->grad;
  bool same = tsr_mesh_equal(out->grad->mesh, mesh_of(out));
  for (int i = 0; same && i < tsr_mesh_ndim(mesh_of(out)); i++)
    same = tsr_placement_equal(out->grad->placements[i], want[i]);
  if (same) return TSR_OK;
  TSR_CHECK(tsr_dtensor_redistribute(tsr_tape_rank(t), out->grad, mesh_of(out), want, owned));
  *g = *owned;
  return TSR_OK;
}

int64_t tsr_op_rows(const tsr_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim - 1; d++) n *= t->shape[d];
  return n;
}

tsr_status tsr_op_saved_new(const tsr_op_placements *plan, tsr_op_saved_plan **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return TSR_ERROR(TSR_ENOMEM, "out of memory saving an op for backward");
  if (plan) (*out)->plan = *plan;
  return TSR_OK;
}

void tsr_op_saved_free(void *p) {
  tsr_op_saved_plan *s = p;
  if (!s) return;
  tsr_tensor_free(s->aux);
  tsr_tensor_free(s->aux2);
  free(s);
}

/* Accumulates `g` into v's gradient, sharing its storage: the sum into it is copy-on-write
 * (tsr_var_accumulate_grad), so both inputs of an add take its output's gradient as it is. */
static tsr_status accumulate_alias(tsr_tape_t *t, tsr_var *v, const tsr_dtensor *g) {
  if (!v->requires_grad) return TSR_OK;
  tsr_dtensor *c = NULL;
  TSR_CHECK(tsr_dtensor_alias(tsr_tape_rank(t), g, g->ndim, g->shape, g->placements, &c));
  return tsr_var_accumulate_grad(t, v, c);
}

/* ---- add ---- */

static tsr_status add_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                               int nout, void *saved) {
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(mesh_of(out[0]), out[0]->value->placements, want);
  const tsr_dtensor *g;
  tsr_dtensor *owned;
  TSR_CHECK(tsr_op_grad_of(t, out[0], want, &g, &owned));
  tsr_status st = accumulate_alias(t, in[0], g);
  if (st == TSR_OK) st = accumulate_alias(t, in[1], g);
  tsr_dtensor_free(owned);
  return st;
}

tsr_status tsr_op_add(tsr_tape_t *t, tsr_var *a, tsr_var *b, tsr_var **out) {
  TSR_CHECK(tsr_op_check("add", "a", a, TSR_F32, -1));
  TSR_CHECK(tsr_op_check("add", "b", b, TSR_F32, a->value->ndim));
  for (int d = 0; d < a->value->ndim; d++)
    if (a->value->shape[d] != b->value->shape[d])
      return TSR_ERROR(TSR_EINVAL, "add: dim %d is %lld in a and %lld in b", d,
                       (long long)a->value->shape[d], (long long)b->value->shape[d]);
  tsr_var *in[2] = {a, b};
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "add", in, 2, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "add", in, 2, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output_whole(t, a, a->value->ndim, a->value->shape, plan.outputs[0], out));
  if ((*out)->value->local) {
    const tsr_tensor *o = (*out)->value->local;
    tsr_kernel_table_of(o)->add(tsr_tensor_data(o), tsr_tensor_data(a->value->local),
                                tsr_tensor_data(b->value->local), tsr_tensor_numel(o));
  }
  return tsr_tape_record(t, "add", in, 2, out, 1, add_backward, NULL, NULL);
}

/* ---- view ---- */

/* The first dim where the old and new shapes differ: dims before it keep their placements. */
static int first_diff(const tsr_dtensor *x, int ndim, const int64_t *shape) {
  int k = 0;
  while (k < x->ndim && k < ndim && x->shape[k] == shape[k]) k++;
  return k;
}

static tsr_status view_placements(const tsr_dtensor *x, int ndim, const int64_t *shape,
                                  tsr_placement *p) {
  int k = first_diff(x, ndim, shape), sharders = 0;
  int64_t new_k = k < ndim ? shape[k] : 1, inner = 1, old_inner = 1;
  for (int d = k + 1; d < ndim; d++) inner *= shape[d];
  for (int d = k + 1; d < x->ndim; d++) old_inner *= x->shape[d];
  for (int i = 0; i < tsr_mesh_ndim(x->mesh); i++) {
    p[i] = x->placements[i];
    int n = tsr_mesh_dim_size(x->mesh, i);
    if (p[i].kind != TSR_SHARD || p[i].dim < k || n == 1) continue;
    /* A shard of the first reshaped dim survives a split or merge of it when every rank's rows
     * are exactly its chunk of the new dim; anything else needs a gather first. */
    bool ok = p[i].dim == k && ++sharders == 1 && k < x->ndim;
    for (int c = 0; ok && c < n; c++)
      ok = tsr_chunk_size(x->shape[k], n, c) * old_inner == tsr_chunk_size(new_k, n, c) * inner;
    if (!ok) {
      char a[128], b[128], c[32];
      return TSR_ERROR(TSR_ENOTSUP,
                       "view of %s as %s: placement %s on mesh dim '%s' does not map to the new "
                       "shape; redistribute first",
                       tsr_shape_str(x->ndim, x->shape, a, sizeof a),
                       tsr_shape_str(ndim, shape, b, sizeof b),
                       tsr_placement_str(p[i], c, sizeof c), tsr_mesh_dim_name(x->mesh, i));
    }
  }
  return TSR_OK;
}

/* The view shares x's storage: a split or merge of heads moves no data. */
static tsr_status view_to(tsr_tape_t *t, const tsr_dtensor *x, int ndim, const int64_t *shape,
                          tsr_dtensor **out) {
  tsr_placement p[TSR_MAX_MESH_DIMS];
  TSR_CHECK(view_placements(x, ndim, shape, p));
  return tsr_dtensor_alias(tsr_tape_rank(t), x, ndim, shape, p, out);
}

static tsr_status view_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                int nout, void *saved) {
  tsr_dtensor *g = NULL;
  TSR_CHECK(view_to(t, out[0]->grad, in[0]->value->ndim, in[0]->value->shape, &g));
  return tsr_var_accumulate_grad(t, in[0], g);
}

tsr_status tsr_op_view(tsr_tape_t *t, tsr_var *x, int ndim, const int64_t *shape, tsr_var **out) {
  int64_t a = 1, b = 1;
  for (int d = 0; d < x->value->ndim; d++) a *= x->value->shape[d];
  for (int d = 0; d < ndim; d++) b *= shape[d];
  if (a != b || ndim > TSR_MAX_DIMS) {
    char s1[128], s2[128];
    return TSR_ERROR(TSR_EINVAL, "view of %s (%lld elements) as %s (%lld elements)",
                     tsr_shape_str(x->value->ndim, x->value->shape, s1, sizeof s1), (long long)a,
                     tsr_shape_str(ndim, shape, s2, sizeof s2), (long long)b);
  }
  tsr_dtensor *y = NULL;
  TSR_CHECK(tsr_tape_materialize(t, &x, 1));
  TSR_CHECK(view_to(t, x->value, ndim, shape, &y));
  tsr_status st = tsr_tape_new_var(t, y, out);
  if (st != TSR_OK) {
    tsr_dtensor_free(y);
    return st;
  }
  return tsr_tape_record(t, "view", &x, 1, out, 1, view_backward, NULL, NULL);
}

/* ---- redistribute ---- */

typedef struct redist_saved {
  const tsr_mesh_t *mesh;
  tsr_placement placements[TSR_MAX_MESH_DIMS];
} redist_saved;

static tsr_status redistribute_backward(tsr_tape_t *t, tsr_var *const *in, int nin,
                                        tsr_var *const *out, int nout, void *saved) {
  redist_saved *s = saved;
  tsr_dtensor *g = NULL;
  TSR_CHECK(
      tsr_dtensor_redistribute_adjoint(tsr_tape_rank(t), out[0]->grad, s->mesh, s->placements, &g));
  return tsr_var_accumulate_grad(t, in[0], g);
}

tsr_status tsr_op_redistribute(tsr_tape_t *t, tsr_var *x, const tsr_mesh_t *mesh,
                               const tsr_placement *placements, tsr_var **out) {
  tsr_dtensor *y = NULL;
  TSR_CHECK(tsr_tape_materialize(t, &x, 1));
  TSR_CHECK(tsr_dtensor_redistribute(tsr_tape_rank(t), x->value, mesh, placements, &y));
  TSR_CHECK(tsr_tape_new_var(t, y, out));
  (*out)->name = x->name;
  redist_saved *s = malloc(sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving a redistribute");
  s->mesh = x->value->mesh;
  memcpy(s->placements, x->value->placements, sizeof s->placements);
  return tsr_tape_record(t, "redistribute", &x, 1, out, 1, redistribute_backward, s, NULL);
}

/* ---- communicating rules ---- */

typedef struct rule_saved {
  const tsr_op_rule *rule;
  const char *owner; /* the plugin that registered it, for the breadcrumb */
  int dim;
  void *saved; /* the rule's own */
  unsigned char attrs[64];
} rule_saved;

static void rule_saved_free(void *p) {
  rule_saved *s = p;
  if (!s) return;
  if (s->saved) {
    if (s->rule->free_saved) {
      tsr_breadcrumb_saved crumb =
          tsr_breadcrumb_enter(s->owner, "op rule", s->rule->name, "free_saved");
      s->rule->free_saved(s->saved);
      tsr_breadcrumb_leave(&crumb);
    } else {
      free(s->saved);
    }
  }
  free(s);
}

static tsr_status rule_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                int nout, void *saved) {
  rule_saved *s = saved;
  const tsr_dtensor *ins[TSR_MAX_OP_INPUTS], *outs[TSR_MAX_OP_OUTPUTS],
      *gouts[TSR_MAX_OP_OUTPUTS] = {0};
  tsr_dtensor *owned[TSR_MAX_OP_OUTPUTS] = {0}, *gins[TSR_MAX_OP_INPUTS] = {0};
  tsr_status st = TSR_OK;
  for (int j = 0; j < nin; j++) ins[j] = in[j]->value;
  for (int k = 0; k < nout && st == TSR_OK; k++) {
    outs[k] = out[k]->value;
    if (!out[k]->grad) continue;
    tsr_placement want[TSR_MAX_MESH_DIMS];
    tsr_op_grad_placements(mesh_of(out[k]), out[k]->value->placements, want);
    st = tsr_op_grad_of(t, out[k], want, &gouts[k], &owned[k]);
  }
  if (st == TSR_OK) {
    tsr_breadcrumb_saved crumb =
        tsr_breadcrumb_enter(s->owner, "op rule", s->rule->name, "backward");
    st = s->rule->backward(tsr_tape_rank(t), s->dim, nin, ins, s->attrs, nout, outs, gouts, gins,
                           s->saved, s->rule->ctx);
    tsr_breadcrumb_leave(&crumb);
  }
  if (st != TSR_OK) tsr_error_prefix(st, "rule '%s'", s->rule->name);
  for (int j = 0; j < nin; j++) {
    if (st == TSR_OK && gins[j])
      st = tsr_var_accumulate_grad(t, in[j], gins[j]);
    else
      tsr_dtensor_free(gins[j]);
  }
  for (int k = 0; k < nout; k++) tsr_dtensor_free(owned[k]);
  return st;
}

tsr_status tsr_op_run_rule(tsr_tape_t *t, const char *op, tsr_var *const *in, int nin,
                           const void *attrs, size_t attrs_size, const tsr_op_placements *plan,
                           int nout, tsr_var **outs, bool *handled) {
  *handled = false;
  const tsr_mesh_t *m = mesh_of(in[0]);
  int dim = -1, other = -1, composer = -1, composers = 0;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    if (!plan->rules[i] || !plan->rules[i]->compute) continue;
    if (plan->rules[i]->composes) {
      composers++;
      composer = i;
    }
    if (dim < 0)
      dim = i;
    else
      other = i;
  }
  if (dim < 0) return TSR_OK;
  if (other >= 0) {
    if (composers != 1)
      return TSR_ERROR(TSR_ENOTSUP,
                       "op '%s': rules '%s' (mesh dim '%s') and '%s' (mesh dim '%s') both "
                       "communicate; one of the two must hand the op to the other",
                       op, plan->rules[dim]->name, tsr_mesh_dim_name(m, dim),
                       plan->rules[other]->name, tsr_mesh_dim_name(m, other));
    dim = composer;
  }
  *handled = true;
  const tsr_op_rule *rule = plan->rules[dim];
  rule_saved *s = calloc(1, sizeof *s);
  if (!s || attrs_size > sizeof s->attrs) {
    free(s);
    return TSR_ERROR(TSR_ENOMEM, "op '%s': cannot save the rule's attributes", op);
  }
  s->rule = rule;
  s->owner = tsr_registry_op_rule_owner(tsr_rank_registry(tsr_tape_rank(t)), rule);
  s->dim = dim;
  if (attrs) memcpy(s->attrs, attrs, attrs_size);
  const tsr_dtensor *ins[TSR_MAX_OP_INPUTS];
  tsr_dtensor *o[TSR_MAX_OP_OUTPUTS] = {0};
  for (int j = 0; j < nin; j++) ins[j] = in[j]->value;
  tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(s->owner, "op rule", rule->name, "forward");
  tsr_status st =
      rule->compute(tsr_tape_rank(t), dim, nin, ins, s->attrs, nout, o, &s->saved, rule->ctx);
  tsr_breadcrumb_leave(&crumb);
  if (st != TSR_OK) tsr_error_prefix(st, "rule '%s' for op '%s'", rule->name, op);
  for (int k = 0; k < nout; k++) {
    if (st == TSR_OK && !o[k])
      st = TSR_ERROR(TSR_EPLUGIN, "rule '%s' for op '%s' made no output %d", rule->name, op, k);
    if (st == TSR_OK) {
      st = tsr_tape_new_var(t, o[k], &outs[k]);
      if (st == TSR_OK) o[k] = NULL;
    }
    tsr_dtensor_free(o[k]);
  }
  if (st != TSR_OK) {
    rule_saved_free(s);
    return st;
  }
  return tsr_tape_record(t, op, in, nin, outs, nout, rule_backward, s, rule_saved_free);
}

/* ---- inputs moved for the op (use rules) ---- */

typedef struct use_saved {
  const tsr_mesh_t *mesh;
  tsr_placement placements[TSR_MAX_MESH_DIMS]; /* the source's */
  uint32_t moved;                              /* mesh dims the rules moved */
} use_saved;

/* The adjoint of the move, with every reduction left to the parameter: on the dims the rules
 * moved the gradient stays a Partial sum (a gather's adjoint would reduce-scatter it at once),
 * and so does a Partial one over a dim where the source is replicated, so that the parameter's
 * own resolve, or a gradient hook that buckets, reduces it once and in the cheapest order
 * (HSDP: reduce-scatter over the shards first, then all-reduce only the shard). */
static tsr_status use_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                               int nout, void *saved) {
  const use_saved *s = saved;
  const tsr_dtensor *g0 = out[0]->grad;
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(s->mesh, s->placements, want);
  for (int i = 0; i < tsr_mesh_ndim(s->mesh); i++)
    if (s->moved & (1u << i))
      want[i] = tsr_partial(TSR_REDUCE_SUM);
    else if (s->placements[i].kind == TSR_REPLICATE && g0->placements[i].kind == TSR_PARTIAL)
      want[i] = g0->placements[i];
  tsr_dtensor *g = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(tsr_tape_rank(t), g0, s->mesh, want, &g));
  return tsr_var_accumulate_grad(t, in[0], g);
}

tsr_status tsr_op_prepare_inputs(tsr_tape_t *t, const char *op, tsr_var **in, int nin) {
  const tsr_registry_t *reg = tsr_rank_registry(tsr_tape_rank(t));
  if (!tsr_registry_op_rule_count(reg)) return TSR_OK;
  const tsr_mesh_t *m = mesh_of(in[0]);
  tsr_placement want[TSR_MAX_OP_INPUTS][TSR_MAX_MESH_DIMS];
  uint32_t moved[TSR_MAX_OP_INPUTS] = {0};
  for (int j = 0; j < nin; j++) memcpy(want[j], in[j]->value->placements, sizeof want[j]);
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    if (tsr_mesh_dim_size(m, i) == 1) continue;
    tsr_placement p[TSR_MAX_OP_INPUTS];
    for (int j = 0; j < nin; j++) p[j] = in[j]->value->placements[i];
    const tsr_op_rule *rule = tsr_registry_find_op_rule(reg, op, tsr_mesh_dim_name(m, i), nin, p);
    if (!rule || !rule->use_mask) continue;
    tsr_registry_note_op_rule(reg, rule);
    for (int j = 0; j < nin; j++)
      if ((rule->use_mask & (1u << j)) && !tsr_placement_equal(p[j], rule->use[j])) {
        want[j][i] = rule->use[j];
        moved[j] |= 1u << i;
      }
  }
  for (int j = 0; j < nin; j++) {
    if (!moved[j]) continue;
    tsr_var *src = in[j], *v = NULL;
    tsr_dtensor *y = NULL;
    TSR_CHECK(tsr_dtensor_redistribute(tsr_tape_rank(t), src->value, m, want[j], &y));
    tsr_status st = tsr_tape_new_var(t, y, &v);
    if (st != TSR_OK) {
      tsr_dtensor_free(y);
      return st;
    }
    v->name = src->name;
    use_saved *s = malloc(sizeof *s);
    if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving the inputs of '%s'", op);
    s->mesh = m;
    memcpy(s->placements, src->value->placements, sizeof s->placements);
    s->moved = moved[j];
    TSR_CHECK(tsr_tape_record(t, "use", &src, 1, &v, 1, use_backward, s, NULL));
    TSR_CHECK(tsr_tape_set_transient(t, v, src));
    in[j] = v;
  }
  return TSR_OK;
}

tsr_status tsr_op_positions(tsr_tape_t *t, const tsr_dtensor *x, int *L, tsr_tensor **out) {
  int64_t lshape[TSR_MAX_DIMS], lstart[TSR_MAX_DIMS];
  tsr_dtensor_local_shape(x->mesh, x->placements, x->ndim, x->shape, tsr_rank_id(tsr_tape_rank(t)),
                          lshape, lstart);
  *L = (int)lshape[1];
  int32_t *p = malloc(sizeof(int32_t) * (size_t)(*L ? *L : 1));
  if (!p) return TSR_ERROR(TSR_ENOMEM, "out of memory for sequence positions");
  for (int i = 0; i < *L; i++) p[i] = (int32_t)(lstart[1] + i);
  tsr_status st = tsr_tensor_from_i32(tsr_tensor_scratch_allocator(x->local), *L, p, out);
  free(p);
  return st;
}
