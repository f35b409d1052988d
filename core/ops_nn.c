/* Neural-network ops: embedding, rmsnorm, linear, rope, swiglu, cross-entropy. Each runs its
 * kernel (tessera/kernels.h) on the local tensors with the placements tsr_op_plan chose. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

static float *fdata(const tsr_dtensor *x) {
  return tsr_tensor_data(x->local);
}

/* Gradient of out[0] as the backward needs it: out's placements with Partial read as Replicate. */
static tsr_status out_grad(tsr_tape_t *t, tsr_var *const *out, const tsr_dtensor **g,
                           tsr_dtensor **owned) {
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(out[0]->value->mesh, out[0]->value->placements, want);
  return tsr_op_grad_of(t, out[0], want, g, owned);
}

/* ---- embedding ---- */

static tsr_status embedding_backward(tsr_tape_t *t, tsr_var *const *in, int nin,
                                     tsr_var *const *out, int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  tsr_var *ids = in[0], *w = in[1];
  if (!w->requires_grad) return TSR_OK;
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dw = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, w, s->plan.grads[1], &dw);
  if (st == TSR_OK && dw->local) {
    const tsr_tensor *wl = w->value->local;
    st = tsr_op_kernels(dw)->embedding_backward(
        fdata(dw), fdata(g), tsr_tensor_data(ids->value->local),
        (int)tsr_tensor_numel(ids->value->local), (int)wl->shape[0], (int)wl->shape[1]);
  }
  tsr_dtensor_free(owned);
  if (st != TSR_OK) {
    tsr_dtensor_free(dw);
    return st;
  }
  return tsr_var_accumulate_grad(t, w, dw);
}

static tsr_status embedding_forward(tsr_tape_t *t, tsr_var *ids, tsr_var *weight, tsr_var **out) {
  TSR_CHECK(tsr_op_check("embedding", "ids", ids, TSR_I32, 2));
  TSR_CHECK(tsr_op_check("embedding", "weight", weight, TSR_F32, 2));
  tsr_var *in[2] = {ids, weight};
  TSR_CHECK(tsr_op_prepare_inputs(t, "embedding", in, 2));
  ids = in[0], weight = in[1];
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "embedding", in, 2, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "embedding", in, 2, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  int64_t shape[3] = {ids->value->shape[0], ids->value->shape[1], weight->value->shape[1]};
  TSR_CHECK(tsr_op_new_output(t, weight, 3, shape, plan.outputs[0], out));
  if ((*out)->value->local) {
    const tsr_tensor *wl = weight->value->local;
    TSR_CHECK(tsr_op_kernels((*out)->value)
                  ->embedding_forward(fdata((*out)->value), tsr_tensor_data(ids->value->local),
                                      fdata(weight->value),
                                      (int)tsr_tensor_numel(ids->value->local), (int)wl->shape[0],
                                      (int)wl->shape[1]));
  }
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  return tsr_tape_record(t, "embedding", in, 2, out, 1, embedding_backward, s, tsr_op_saved_free);
}

tsr_status tsr_op_embedding(tsr_tape_t *t, tsr_var *ids, tsr_var *weight, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("embedding");
  return tsr_op_crumb_leave(crumb, embedding_forward(t, ids, weight, out));
}

/* ---- rmsnorm ---- */

static tsr_status rmsnorm_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                   int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  tsr_var *x = in[0], *w = in[1];
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dx = NULL, *dw = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, x, s->plan.grads[0], &dx);
  if (st == TSR_OK) st = tsr_op_new_grad(t, w, s->plan.grads[1], &dw);
  if (st == TSR_OK && dx->local) {
    const tsr_tensor *xl = x->value->local;
    int C = (int)xl->shape[xl->ndim - 1];
    tsr_op_kernels(g)->rmsnorm_backward(fdata(dx), fdata(dw), fdata(g), fdata(x->value),
                                        fdata(w->value), tsr_tensor_data(s->aux),
                                        (int)tsr_op_rows(xl), C);
  }
  tsr_dtensor_free(owned);
  if (st == TSR_OK) {
    st = tsr_var_accumulate_grad(t, x, dx);
    dx = NULL;
  }
  if (st == TSR_OK) {
    st = tsr_var_accumulate_grad(t, w, dw);
    dw = NULL;
  }
  tsr_dtensor_free(dx);
  tsr_dtensor_free(dw);
  return st;
}

static tsr_status rmsnorm_recompute(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *out,
                                    void *saved) {
  tsr_op_saved_plan *s = saved;
  const tsr_dtensor *xv = in[0]->value;
  if (!xv->local) return TSR_OK;
  int64_t rows = tsr_op_rows(xv->local);
  tsr_op_kernels(out->value)
      ->rmsnorm_forward(fdata(out->value), tsr_tensor_data(s->aux), fdata(xv), fdata(in[1]->value),
                        (int)rows, (int)xv->local->shape[xv->ndim - 1], s->eps);
  return TSR_OK;
}

static tsr_status rmsnorm_forward(tsr_tape_t *t, tsr_var *x, tsr_var *weight, float eps,
                                  tsr_var **out) {
  TSR_CHECK(tsr_op_check("rmsnorm", "x", x, TSR_F32, -1));
  TSR_CHECK(tsr_op_check("rmsnorm", "weight", weight, TSR_F32, 1));
  const tsr_dtensor *xv = x->value;
  if (xv->ndim < 1 || xv->shape[xv->ndim - 1] != weight->value->shape[0])
    return TSR_ERROR(TSR_EINVAL, "rmsnorm: weight '%s' has %lld entries for a last dim of %lld",
                     weight->name ? weight->name : "", (long long)weight->value->shape[0],
                     (long long)(xv->ndim ? xv->shape[xv->ndim - 1] : 0));
  tsr_var *in[2] = {x, weight};
  TSR_CHECK(tsr_op_prepare_inputs(t, "rmsnorm", in, 2));
  x = in[0], weight = in[1], xv = x->value;
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "rmsnorm", in, 2, 1, &plan));
  tsr_rmsnorm_attrs attrs = {eps};
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "rmsnorm", in, 2, &attrs, sizeof attrs, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output_whole(t, x, xv->ndim, xv->shape, plan.outputs[0], out));
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  s->eps = eps;
  if (xv->local) {
    int64_t rows = tsr_op_rows(xv->local);
    tsr_status st =
        tsr_tensor_new(tsr_rank_allocator(tsr_tape_rank(t)), TSR_F32, 1, &rows, &s->aux);
    if (st != TSR_OK) {
      tsr_op_saved_free(s);
      return st;
    }
    tsr_op_kernels((*out)->value)
        ->rmsnorm_forward(fdata((*out)->value), tsr_tensor_data(s->aux), fdata(xv),
                          fdata(weight->value), (int)rows, (int)xv->local->shape[xv->ndim - 1],
                          eps);
  }
  TSR_CHECK(tsr_tape_record(t, "rmsnorm", in, 2, out, 1, rmsnorm_backward, s, tsr_op_saved_free));
  tsr_tape_mark_recomputable(t, *out, rmsnorm_recompute);
  return TSR_OK;
}

tsr_status tsr_op_rmsnorm(tsr_tape_t *t, tsr_var *x, tsr_var *weight, float eps, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("rmsnorm");
  return tsr_op_crumb_leave(crumb, rmsnorm_forward(t, x, weight, eps, out));
}

/* ---- linear ---- */

static tsr_status linear_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                  int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  tsr_var *x = in[0], *w = in[1];
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dx = NULL, *dw = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = TSR_OK;
  if (x->requires_grad) st = tsr_op_new_grad(t, x, s->plan.grads[0], &dx);
  if (st == TSR_OK && w->requires_grad) st = tsr_op_new_grad(t, w, s->plan.grads[1], &dw);
  if (st == TSR_OK && g->local) {
    const tsr_tensor *xl = x->value->local, *wl = w->value->local;
    st =
        tsr_linear_backward(tsr_tape_rank(t), tsr_op_kernels(g), dx ? fdata(dx) : NULL,
                            dw ? fdata(dw) : NULL, NULL, fdata(g), fdata(x->value), fdata(w->value),
                            (int)tsr_op_rows(xl), (int)wl->shape[1], (int)wl->shape[0]);
  }
  tsr_dtensor_free(owned);
  if (st == TSR_OK && dx) {
    st = tsr_var_accumulate_grad(t, x, dx);
    dx = NULL;
  }
  if (st == TSR_OK && dw) {
    st = tsr_var_accumulate_grad(t, w, dw);
    dw = NULL;
  }
  tsr_dtensor_free(dx);
  tsr_dtensor_free(dw);
  return st;
}

static tsr_status linear_forward(tsr_tape_t *t, tsr_var *x, tsr_var *weight, tsr_var **out) {
  TSR_CHECK(tsr_op_check("linear", "x", x, TSR_F32, -1));
  TSR_CHECK(tsr_op_check("linear", "weight", weight, TSR_F32, 2));
  const tsr_dtensor *xv = x->value, *wv = weight->value;
  if (xv->ndim < 1 || xv->shape[xv->ndim - 1] != wv->shape[1]) {
    char a[128], b[128];
    return TSR_ERROR(TSR_EINVAL, "linear: input %s does not match weight '%s' %s (out, in)",
                     tsr_shape_str(xv->ndim, xv->shape, a, sizeof a),
                     weight->name ? weight->name : "", tsr_shape_str(2, wv->shape, b, sizeof b));
  }
  tsr_var *in[2] = {x, weight};
  TSR_CHECK(tsr_op_prepare_inputs(t, "linear", in, 2));
  x = in[0], weight = in[1], xv = x->value, wv = weight->value;
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "linear", in, 2, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "linear", in, 2, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, xv->shape, sizeof shape);
  shape[xv->ndim - 1] = wv->shape[0];
  TSR_CHECK(tsr_op_new_output_whole(t, x, xv->ndim, shape, plan.outputs[0], out));
  const tsr_dtensor *ov = (*out)->value;
  if (ov->local) {
    const tsr_tensor *xl = xv->local, *wl = wv->local;
    if (xl->shape[xl->ndim - 1] != wl->shape[1] || ov->local->shape[xl->ndim - 1] != wl->shape[0])
      return TSR_ERROR(TSR_EINTERNAL,
                       "linear: the placements planned for '%s' give local shapes "
                       "that do not multiply",
                       weight->name ? weight->name : "");
    TSR_CHECK(tsr_linear_forward(tsr_tape_rank(t), tsr_op_kernels(ov), fdata(ov), fdata(xv),
                                 fdata(wv), NULL, (int)tsr_op_rows(xl), (int)wl->shape[1],
                                 (int)wl->shape[0]));
  }
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  return tsr_tape_record(t, "linear", in, 2, out, 1, linear_backward, s, tsr_op_saved_free);
}

tsr_status tsr_op_linear(tsr_tape_t *t, tsr_var *x, tsr_var *weight, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("linear");
  return tsr_op_crumb_leave(crumb, linear_forward(t, x, weight, out));
}

/* ---- rope ---- */

/* cos/sin tables for x's local rows: positions are the global offset of its sequence shard. */
static tsr_status rope_tables(tsr_tape_t *t, const tsr_dtensor *x, float theta, tsr_tensor **cs,
                              tsr_tensor **sn) {
  int L = 0, D = (int)x->local->shape[3];
  tsr_tensor *pos = NULL;
  TSR_CHECK(tsr_op_positions(t, x, &L, &pos));
  tsr_allocator *alloc = tsr_tensor_scratch_allocator(x->local);
  int64_t tshape[2] = {L, D};
  tsr_status st = tsr_tensor_new(alloc, TSR_F32, 2, tshape, cs);
  if (st == TSR_OK) st = tsr_tensor_new(alloc, TSR_F32, 2, tshape, sn);
  if (st == TSR_OK)
    st = tsr_op_kernels(x)->rope_tables(tsr_tensor_data(*cs), tsr_tensor_data(*sn),
                                        tsr_tensor_data(pos), L, D, theta);
  tsr_tensor_free(pos);
  return st;
}

static tsr_status rope_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  tsr_var *x = in[0];
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dx = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, x, s->plan.grads[0], &dx);
  if (st == TSR_OK && dx->local) {
    const int64_t *ls = x->value->local->shape;
    tsr_op_kernels(g)->rope_backward(fdata(dx), fdata(g), tsr_tensor_data(s->aux),
                                     tsr_tensor_data(s->aux2), (int)ls[0], (int)ls[1], (int)ls[2],
                                     (int)ls[3]);
  }
  tsr_dtensor_free(owned);
  if (st != TSR_OK) {
    tsr_dtensor_free(dx);
    return st;
  }
  return tsr_var_accumulate_grad(t, x, dx);
}

static tsr_status rope_recompute(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *out,
                                 void *saved) {
  tsr_op_saved_plan *s = saved;
  const tsr_dtensor *xv = in[0]->value;
  if (!xv->local) return TSR_OK;
  const int64_t *ls = xv->local->shape;
  tsr_op_kernels(out->value)
      ->rope_forward(fdata(out->value), fdata(xv), tsr_tensor_data(s->aux),
                     tsr_tensor_data(s->aux2), (int)ls[0], (int)ls[1], (int)ls[2], (int)ls[3]);
  return TSR_OK;
}

static tsr_status rope_forward(tsr_tape_t *t, tsr_var *x, float theta, tsr_var **out) {
  TSR_CHECK(tsr_op_check("rope", "x", x, TSR_F32, 4));
  if (x->value->shape[3] % 2)
    return TSR_ERROR(TSR_EINVAL, "rope: head dim %lld is odd; rotary embedding needs it even",
                     (long long)x->value->shape[3]);
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "rope", &x, 1, 1, &plan));
  tsr_rope_attrs attrs = {theta};
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "rope", &x, 1, &attrs, sizeof attrs, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output_whole(t, x, 4, x->value->shape, plan.outputs[0], out));
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  s->theta = theta;
  if (x->value->local) {
    tsr_status st = rope_tables(t, x->value, theta, &s->aux, &s->aux2);
    if (st != TSR_OK) {
      tsr_op_saved_free(s);
      return st;
    }
    const int64_t *ls = x->value->local->shape;
    tsr_op_kernels((*out)->value)
        ->rope_forward(fdata((*out)->value), fdata(x->value), tsr_tensor_data(s->aux),
                       tsr_tensor_data(s->aux2), (int)ls[0], (int)ls[1], (int)ls[2], (int)ls[3]);
  }
  TSR_CHECK(tsr_tape_record(t, "rope", &x, 1, out, 1, rope_backward, s, tsr_op_saved_free));
  tsr_tape_mark_recomputable(t, *out, rope_recompute);
  return TSR_OK;
}

tsr_status tsr_op_rope(tsr_tape_t *t, tsr_var *x, float theta, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("rope");
  return tsr_op_crumb_leave(crumb, rope_forward(t, x, theta, out));
}

/* ---- swiglu ---- */

static tsr_status swiglu_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                  int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dg = NULL, *du = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, in[0], s->plan.grads[0], &dg);
  if (st == TSR_OK) st = tsr_op_new_grad(t, in[1], s->plan.grads[1], &du);
  if (st == TSR_OK && dg->local)
    tsr_op_kernels(g)->swiglu_backward(fdata(dg), fdata(du), fdata(g), fdata(in[0]->value),
                                       fdata(in[1]->value), tsr_tensor_numel(dg->local));
  tsr_dtensor_free(owned);
  if (st == TSR_OK) {
    st = tsr_var_accumulate_grad(t, in[0], dg);
    dg = NULL;
  }
  if (st == TSR_OK) {
    st = tsr_var_accumulate_grad(t, in[1], du);
    du = NULL;
  }
  tsr_dtensor_free(dg);
  tsr_dtensor_free(du);
  return st;
}

static tsr_status swiglu_recompute(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *out,
                                   void *saved) {
  if (out->value->local)
    tsr_op_kernels(out->value)
        ->swiglu_forward(fdata(out->value), fdata(in[0]->value), fdata(in[1]->value),
                         tsr_tensor_numel(out->value->local));
  return TSR_OK;
}

static tsr_status swiglu_forward(tsr_tape_t *t, tsr_var *gate, tsr_var *up, tsr_var **out) {
  TSR_CHECK(tsr_op_check("swiglu", "gate", gate, TSR_F32, -1));
  TSR_CHECK(tsr_op_check("swiglu", "up", up, TSR_F32, gate->value->ndim));
  for (int d = 0; d < gate->value->ndim; d++)
    if (gate->value->shape[d] != up->value->shape[d])
      return TSR_ERROR(TSR_EINVAL, "swiglu: dim %d is %lld in gate and %lld in up", d,
                       (long long)gate->value->shape[d], (long long)up->value->shape[d]);
  tsr_var *in[2] = {gate, up};
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "swiglu", in, 2, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "swiglu", in, 2, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output_whole(t, gate, gate->value->ndim, gate->value->shape, plan.outputs[0],
                                    out));
  if ((*out)->value->local)
    tsr_op_kernels((*out)->value)
        ->swiglu_forward(fdata((*out)->value), fdata(gate->value), fdata(up->value),
                         tsr_tensor_numel((*out)->value->local));
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  TSR_CHECK(tsr_tape_record(t, "swiglu", in, 2, out, 1, swiglu_backward, s, tsr_op_saved_free));
  tsr_tape_mark_recomputable(t, *out, swiglu_recompute);
  return TSR_OK;
}

tsr_status tsr_op_swiglu(tsr_tape_t *t, tsr_var *gate, tsr_var *up, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("swiglu");
  return tsr_op_crumb_leave(crumb, swiglu_forward(t, gate, up, out));
}

/* ---- cross-entropy ---- */

static tsr_status cross_entropy_backward(tsr_tape_t *t, tsr_var *const *in, int nin,
                                         tsr_var *const *out, int nout, void *saved) {
  tsr_op_saved_plan *s = saved;
  tsr_var *logits = in[0], *labels = in[1];
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dl = NULL;
  TSR_CHECK(out_grad(t, out, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, logits, s->plan.grads[0], &dl);
  if (st == TSR_OK && dl->local && s->scale > 0) {
    const tsr_tensor *ll = logits->value->local;
    float loss, dloss;
    tsr_memcpy_any(&dloss, fdata(g), sizeof dloss);
    st = tsr_op_kernels(dl)->cross_entropy(
        &loss, NULL, fdata(dl), fdata(logits->value), tsr_tensor_data(labels->value->local),
        (int)tsr_op_rows(ll), (int)ll->shape[2], dloss * s->scale);
  }
  tsr_dtensor_free(owned);
  if (st != TSR_OK) {
    tsr_dtensor_free(dl);
    return st;
  }
  return tsr_var_accumulate_grad(t, logits, dl);
}

/* Valid (not ignored) labels in this rank's shard and in the whole batch: the sum over the mesh
 * dims that shard the labels (those where the loss comes out Partial). */
static tsr_status count_valid(tsr_tape_t *t, const tsr_var *labels, const tsr_placement *loss_p,
                              int64_t *local, int64_t *global) {
  const tsr_dtensor *lv = labels->value;
  *local = 0;
  tsr_tensor *host = NULL;
  if (tsr_tensor_device(lv->local).kind != TSR_DEVICE_CPU)
    TSR_CHECK(tsr_tensor_to(lv->local, NULL, &host)); /* the labels are small; one transfer */
  const int32_t *lab = tsr_tensor_data(host ? host : lv->local);
  for (int64_t i = 0, n = tsr_tensor_numel(lv->local); i < n; i++) *local += lab[i] != -100;
  tsr_tensor_free(host);
  *global = *local;
  uint32_t mask = 0;
  for (int i = 0; i < tsr_mesh_ndim(lv->mesh); i++)
    if (loss_p[i].kind == TSR_PARTIAL) mask |= 1u << i;
  if (!mask) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(lv->mesh, tsr_rank_comm(tsr_tape_rank(t)), mask, &g));
  return tsr_comm_all_reduce(g, global, global, 1, TSR_I64, TSR_REDUCE_SUM);
}

static tsr_status cross_entropy_forward(tsr_tape_t *t, tsr_var *logits, tsr_var *labels,
                                        tsr_var **out) {
  TSR_CHECK(tsr_op_check("cross_entropy", "logits", logits, TSR_F32, 3));
  TSR_CHECK(tsr_op_check("cross_entropy", "labels", labels, TSR_I32, 2));
  const tsr_dtensor *lv = logits->value;
  if (labels->value->shape[0] != lv->shape[0] || labels->value->shape[1] != lv->shape[1])
    return TSR_ERROR(TSR_EINVAL, "cross_entropy: labels [%lld, %lld] for logits [%lld, %lld, V]",
                     (long long)labels->value->shape[0], (long long)labels->value->shape[1],
                     (long long)lv->shape[0], (long long)lv->shape[1]);
  tsr_var *in[2] = {logits, labels};
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "cross_entropy", in, 2, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "cross_entropy", in, 2, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output(t, logits, 0, NULL, plan.outputs[0], out));
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  if ((*out)->value->local) {
    int64_t local, global;
    tsr_status st = count_valid(t, labels, plan.outputs[0], &local, &global);
    /* The mean over the whole batch is the sum of each shard's mean weighted by its share of the
     * valid tokens: shards of uneven size or with many ignored labels weigh what they hold. */
    s->scale = global > 0 ? (float)local / (float)global : 0.0f;
    const tsr_tensor *ll = lv->local;
    float loss = 0.0f; /* a host value on every device; stored into the output below */
    if (st == TSR_OK && local > 0) {
      st = tsr_op_kernels(lv)->cross_entropy(&loss, NULL, NULL, fdata(lv),
                                             tsr_tensor_data(labels->value->local),
                                             (int)tsr_op_rows(ll), (int)ll->shape[2], 1.0f);
      loss *= s->scale;
    } else if (st == TSR_OK && global == 0) {
      loss = NAN; /* as F.cross_entropy when every label is ignored */
    }
    if (st == TSR_OK) tsr_memcpy_any(fdata((*out)->value), &loss, sizeof loss);
    if (st != TSR_OK) {
      tsr_op_saved_free(s);
      return st;
    }
  }
  return tsr_tape_record(t, "cross_entropy", in, 2, out, 1, cross_entropy_backward, s,
                         tsr_op_saved_free);
}

tsr_status tsr_op_cross_entropy(tsr_tape_t *t, tsr_var *logits, tsr_var *labels, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("cross_entropy");
  return tsr_op_crumb_leave(crumb, cross_entropy_forward(t, logits, labels, out));
}
