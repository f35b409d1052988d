/* The sparse mixture-of-experts ops: router, experts and the load-balancing loss. Each runs the
 * moe kernels (tessera/kernels.h) on the local tensors with the placements tsr_op_plan chose; an
 * expert-parallel plugin replaces the experts op's computation on its dim with a rule that moves
 * the routed rows to the experts' ranks and runs the same kernels there. */
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

static float *fdata(const tsr_dtensor *x) {
  return tsr_tensor_data(x->local);
}

/* What the experts op keeps for its backward: the routed rows and the FFNs' inputs, hidden
 * activations and outputs. */
typedef struct moe_saved {
  tsr_op_placements plan;
  tsr_tensor *offsets; /* (E + 1) i64 as raw bytes: each expert's first routed row */
  tsr_tensor *token;   /* (M) i32: the token of each routed row */
  tsr_tensor *xs;      /* (M, C) the rows' inputs */
  tsr_tensor *h;       /* (M, 2I) x w13^T */
  tsr_tensor *ys;      /* (M, C) the FFN outputs, before the combine weights */
  tsr_tensor *probs;   /* router: (N, E) softmax */
  tsr_moe_router_attrs router;
  float aux_scale;
} moe_saved;

static void moe_saved_free(void *p) {
  moe_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->offsets);
  tsr_tensor_free(s->token);
  tsr_tensor_free(s->xs);
  tsr_tensor_free(s->h);
  tsr_tensor_free(s->ys);
  tsr_tensor_free(s->probs);
  free(s);
}

static tsr_status saved_new(const tsr_op_placements *plan, moe_saved **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return TSR_ERROR(TSR_ENOMEM, "out of memory saving a moe op for backward");
  (*out)->plan = *plan;
  return TSR_OK;
}

static tsr_status scratch(tsr_tape_t *t, tsr_dtype dt, int64_t a, int64_t b, tsr_tensor **out) {
  int64_t shape[2] = {a, b};
  return tsr_tensor_new(tsr_rank_allocator(tsr_tape_rank(t)), dt, b > 0 ? 2 : 1, shape, out);
}

/* The gradient of out[k] as its backward reads it, or NULL when nothing reached that output. */
static tsr_status grad_of(tsr_tape_t *t, tsr_var *out, const tsr_dtensor **g, tsr_dtensor **owned) {
  *g = NULL;
  *owned = NULL;
  if (!out->grad) return TSR_OK;
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(out->value->mesh, out->value->placements, want);
  return tsr_op_grad_of(t, out, want, g, owned);
}

/* Accumulates a new gradient for input `v` (placements p) filled by `fill` into v's gradient. */
static tsr_status take_grad(tsr_tape_t *t, tsr_var *v, tsr_dtensor **d) {
  tsr_status st = tsr_var_accumulate_grad(t, v, *d);
  *d = NULL;
  return st;
}

static tsr_status check_cpu(const char *op, const tsr_var *v) {
  if (v->value->local && tsr_tensor_device(v->value->local).kind != TSR_DEVICE_CPU)
    return TSR_ERROR(TSR_ENOTSUP,
                     "%s: '%s' is on a GPU; the mixture-of-experts kernels run on the CPU only so "
                     "far (set [job] device = cpu)",
                     op, v->name ? v->name : "input");
  return TSR_OK;
}

/* ---- router ---- */

static tsr_status router_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                  int nout, void *saved) {
  moe_saved *s = saved;
  tsr_var *x = in[0];
  const tsr_dtensor *gc, *gs;
  tsr_dtensor *oc = NULL, *os = NULL, *dx = NULL;
  tsr_status st = grad_of(t, out[0], &gc, &oc);
  if (st == TSR_OK) st = grad_of(t, out[1], &gs, &os);
  if (st == TSR_OK && (gc || gs)) st = tsr_op_new_grad(t, x, s->plan.grads[0], &dx);
  if (st == TSR_OK && dx && dx->local) {
    const tsr_tensor *xl = x->value->local;
    int E = (int)xl->shape[xl->ndim - 1];
    tsr_kernel_moe_router_backward(fdata(dx), gc ? fdata(gc) : NULL, gs ? fdata(gs) : NULL,
                                   tsr_tensor_data(s->probs), fdata(out[0]->value),
                                   (int)tsr_op_rows(xl), E, s->router.scale);
  }
  tsr_dtensor_free(oc);
  tsr_dtensor_free(os);
  if (st == TSR_OK && dx) st = take_grad(t, x, &dx);
  tsr_dtensor_free(dx);
  return st;
}

static tsr_status router_forward(tsr_tape_t *t, tsr_var *logits, int top_k, tsr_var **combine,
                                 tsr_var **stats) {
  TSR_CHECK(tsr_op_check(TSR_OP_MOE_ROUTER, "logits", logits, TSR_F32, 3));
  TSR_CHECK(check_cpu(TSR_OP_MOE_ROUTER, logits));
  const tsr_dtensor *xv = logits->value;
  int64_t E = xv->shape[2], tokens = xv->shape[0] * xv->shape[1];
  if (top_k < 1 || top_k > E)
    return TSR_ERROR(TSR_EINVAL,
                     "moe_router: top_k = %d for %lld experts; it must be in [1, %lld] "
                     "([model] num_experts_per_tok <= num_local_experts)",
                     top_k, (long long)E, (long long)E);
  tsr_var *in[1] = {logits}, *outs[2];
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, TSR_OP_MOE_ROUTER, in, 1, 2, &plan));
  tsr_moe_router_attrs attrs = {top_k, tokens ? 1.0f / (float)tokens : 0.0f};
  bool handled;
  TSR_CHECK(
      tsr_op_run_rule(t, TSR_OP_MOE_ROUTER, in, 1, &attrs, sizeof attrs, &plan, 2, outs, &handled));
  if (handled) {
    *combine = outs[0];
    *stats = outs[1];
    return TSR_OK;
  }
  int64_t sshape[2] = {2, E};
  TSR_CHECK(tsr_op_new_output(t, logits, 3, xv->shape, plan.outputs[0], &outs[0]));
  TSR_CHECK(tsr_op_new_output(t, logits, 2, sshape, plan.outputs[1], &outs[1]));
  moe_saved *s;
  TSR_CHECK(saved_new(&plan, &s));
  s->router = attrs;
  if (xv->local) {
    int64_t rows = tsr_op_rows(xv->local);
    tsr_status st = scratch(t, TSR_F32, rows, E, &s->probs);
    if (st != TSR_OK) {
      moe_saved_free(s);
      return st;
    }
    /* a Partial(sum) stats output holds this rank's tokens' share: its kernel adds to zeros */
    tsr_kernel_moe_router_forward(fdata(outs[0]->value), tsr_tensor_data(s->probs),
                                  fdata(outs[1]->value), fdata(xv), (int)rows, (int)E, top_k,
                                  attrs.scale);
  }
  *combine = outs[0];
  *stats = outs[1];
  return tsr_tape_record(t, TSR_OP_MOE_ROUTER, in, 1, outs, 2, router_backward, s, moe_saved_free);
}

tsr_status tsr_op_moe_router(tsr_tape_t *t, tsr_var *logits, int top_k, tsr_var **combine,
                             tsr_var **stats) {
  tsr_op_crumb crumb = tsr_op_crumb_enter(TSR_OP_MOE_ROUTER);
  return tsr_op_crumb_leave(crumb, router_forward(t, logits, top_k, combine, stats));
}

/* ---- experts ---- */

static tsr_status experts_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                   int nout, void *saved) {
  moe_saved *s = saved;
  tsr_var *x = in[0], *combine = in[1], *w13 = in[2], *w2 = in[3];
  const tsr_dtensor *g;
  tsr_dtensor *owned = NULL, *d[4] = {0};
  tsr_tensor *dy = NULL, *dxs = NULL;
  tsr_status st = grad_of(t, out[0], &g, &owned);
  for (int j = 0; j < 4 && st == TSR_OK && g; j++)
    if (in[j]->requires_grad) st = tsr_op_new_grad(t, in[j], s->plan.grads[j], &d[j]);
  if (st == TSR_OK && g && x->value->local) {
    const tsr_tensor *cl = combine->value->local, *wl = w13->value->local;
    int E = (int)cl->shape[cl->ndim - 1], C = (int)x->value->shape[2];
    int I = (int)(wl->shape[1] / 2);
    const int64_t *offsets = tsr_tensor_data(s->offsets);
    const int32_t *token = tsr_tensor_data(s->token);
    int64_t M = offsets[E];
    st = scratch(t, TSR_F32, M ? M : 1, C, &dy);
    if (st == TSR_OK) st = scratch(t, TSR_F32, M ? M : 1, C, &dxs);
    if (st == TSR_OK) {
      memset(tsr_tensor_data(dxs), 0, (size_t)(M ? M : 1) * (size_t)C * sizeof(float));
      tsr_kernel_moe_combine_backward(tsr_tensor_data(dy), d[1] ? fdata(d[1]) : NULL, fdata(g),
                                      tsr_tensor_data(s->ys), fdata(combine->value), token, offsets,
                                      E, C);
      st = tsr_kernel_moe_ffn_backward(tsr_tensor_data(dxs), d[2] ? fdata(d[2]) : NULL,
                                       d[3] ? fdata(d[3]) : NULL, tsr_tensor_data(dy),
                                       tsr_tensor_data(s->xs), tsr_tensor_data(s->h),
                                       fdata(w13->value), fdata(w2->value), offsets, E, C, I);
    }
    if (st == TSR_OK && d[0])
      tsr_kernel_moe_scatter_add(fdata(d[0]), tsr_tensor_data(dxs), token, M, C);
  }
  tsr_tensor_free(dy);
  tsr_tensor_free(dxs);
  tsr_dtensor_free(owned);
  for (int j = 0; j < 4; j++) {
    if (st == TSR_OK && d[j]) st = take_grad(t, in[j], &d[j]);
    tsr_dtensor_free(d[j]);
  }
  return st;
}

static tsr_status experts_check(tsr_var *x, tsr_var *combine, tsr_var *w13, tsr_var *w2) {
  const char *op = TSR_OP_MOE_EXPERTS;
  TSR_CHECK(tsr_op_check(op, "x", x, TSR_F32, 3));
  TSR_CHECK(tsr_op_check(op, "combine", combine, TSR_F32, 3));
  TSR_CHECK(tsr_op_check(op, "w13", w13, TSR_F32, 3));
  TSR_CHECK(tsr_op_check(op, "w2", w2, TSR_F32, 3));
  TSR_CHECK(check_cpu(op, x));
  const int64_t *xs = x->value->shape, *cs = combine->value->shape;
  const int64_t *a = w13->value->shape, *b = w2->value->shape;
  int64_t E = cs[2], C = xs[2], I = a[1] / 2;
  if (cs[0] != xs[0] || cs[1] != xs[1] || a[0] != E || b[0] != E || a[2] != C || a[1] % 2 ||
      b[1] != C || b[2] != I)
    return TSR_ERROR(TSR_EINVAL,
                     "moe_experts: shapes x (%lld, %lld, %lld), combine (%lld, %lld, %lld), "
                     "w13 '%s' (%lld, %lld, %lld), w2 '%s' (%lld, %lld, %lld) do not fit "
                     "x (B, L, C), combine (B, L, E), w13 (E, 2I, C), w2 (E, C, I)",
                     (long long)xs[0], (long long)xs[1], (long long)C, (long long)cs[0],
                     (long long)cs[1], (long long)E, w13->name ? w13->name : "", (long long)a[0],
                     (long long)a[1], (long long)a[2], w2->name ? w2->name : "", (long long)b[0],
                     (long long)b[1], (long long)b[2]);
  return TSR_OK;
}

static tsr_status experts_forward(tsr_tape_t *t, tsr_var *x, tsr_var *combine, tsr_var *w13,
                                  tsr_var *w2, tsr_var **out) {
  TSR_CHECK(experts_check(x, combine, w13, w2));
  tsr_var *in[4] = {x, combine, w13, w2};
  TSR_CHECK(tsr_op_prepare_inputs(t, TSR_OP_MOE_EXPERTS, in, 4));
  x = in[0], combine = in[1], w13 = in[2], w2 = in[3];
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, TSR_OP_MOE_EXPERTS, in, 4, 1, &plan));
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, TSR_OP_MOE_EXPERTS, in, 4, NULL, 0, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output(t, x, 3, x->value->shape, plan.outputs[0], out));
  moe_saved *s;
  TSR_CHECK(saved_new(&plan, &s));
  tsr_status st = TSR_OK;
  if (x->value->local) {
    const tsr_tensor *cl = combine->value->local, *wl = w13->value->local;
    int64_t N = tsr_op_rows(x->value->local);
    int E = (int)cl->shape[cl->ndim - 1], C = (int)x->value->shape[2];
    int I = (int)(wl->shape[1] / 2);
    if (wl->shape[0] != E)
      st = TSR_ERROR(TSR_EINVAL,
                     "moe_experts: this rank holds %lld of %d experts of '%s' but no rule of its "
                     "mesh routes tokens to other ranks; load the plugin that shards the experts",
                     (long long)wl->shape[0], E, w13->name ? w13->name : "w13");
    if (st == TSR_OK) st = scratch(t, TSR_I64, E + 1, 0, &s->offsets);
    if (st == TSR_OK) st = scratch(t, TSR_I32, N * E > 0 ? N * E : 1, 0, &s->token);
    int64_t *offsets = st == TSR_OK ? tsr_tensor_data(s->offsets) : NULL;
    if (st == TSR_OK) {
      tsr_kernel_moe_route(offsets, tsr_tensor_data(s->token), fdata(combine->value), (int)N, E);
      int64_t M = offsets[E] ? offsets[E] : 1;
      st = scratch(t, TSR_F32, M, C, &s->xs);
      if (st == TSR_OK) st = scratch(t, TSR_F32, M, 2 * I, &s->h);
      if (st == TSR_OK) st = scratch(t, TSR_F32, M, C, &s->ys);
    }
    if (st == TSR_OK) {
      tsr_kernel_moe_gather(tsr_tensor_data(s->xs), fdata(x->value), tsr_tensor_data(s->token),
                            offsets[E], C);
      st = tsr_kernel_moe_ffn_forward(tsr_tensor_data(s->ys), tsr_tensor_data(s->h),
                                      tsr_tensor_data(s->xs), fdata(w13->value), fdata(w2->value),
                                      offsets, E, C, I);
    }
    if (st == TSR_OK)
      tsr_kernel_moe_combine(fdata((*out)->value), tsr_tensor_data(s->ys), fdata(combine->value),
                             tsr_tensor_data(s->token), offsets, E, C);
  }
  if (st != TSR_OK) {
    moe_saved_free(s);
    return st;
  }
  return tsr_tape_record(t, TSR_OP_MOE_EXPERTS, in, 4, out, 1, experts_backward, s, moe_saved_free);
}

tsr_status tsr_op_moe_experts(tsr_tape_t *t, tsr_var *x, tsr_var *combine, tsr_var *w13,
                              tsr_var *w2, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter(TSR_OP_MOE_EXPERTS);
  return tsr_op_crumb_leave(crumb, experts_forward(t, x, combine, w13, w2, out));
}

/* ---- load-balancing loss ---- */

static tsr_status aux_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                               int nout, void *saved) {
  moe_saved *s = saved;
  tsr_var *x = in[0];
  const tsr_dtensor *g;
  tsr_dtensor *owned = NULL, *dx = NULL;
  tsr_status st = grad_of(t, out[0], &g, &owned);
  if (st == TSR_OK && g) st = tsr_op_new_grad(t, x, s->plan.grads[0], &dx);
  if (st == TSR_OK && dx && dx->local) {
    /* row 0 counts selections: no gradient */
    int64_t E = x->value->shape[1];
    const float *sv = fdata(x->value);
    float gv = fdata(g)[0], *d = fdata(dx);
    for (int64_t e = 0; e < E; e++) d[E + e] += gv * s->aux_scale * sv[e];
  }
  tsr_dtensor_free(owned);
  if (st == TSR_OK && dx) st = take_grad(t, x, &dx);
  tsr_dtensor_free(dx);
  return st;
}

static tsr_status aux_forward(tsr_tape_t *t, tsr_var *stats, float scale, tsr_var **out) {
  TSR_CHECK(tsr_op_check(TSR_OP_MOE_AUX_LOSS, "stats", stats, TSR_F32, 2));
  if (stats->value->shape[0] != 2)
    return TSR_ERROR(TSR_EINVAL, "moe_aux_loss: stats has %lld rows; it takes (2, E)",
                     (long long)stats->value->shape[0]);
  tsr_var *in[1] = {stats};
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, TSR_OP_MOE_AUX_LOSS, in, 1, 1, &plan));
  tsr_moe_aux_attrs attrs = {scale};
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, TSR_OP_MOE_AUX_LOSS, in, 1, &attrs, sizeof attrs, &plan, 1, out,
                            &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output(t, stats, 0, NULL, plan.outputs[0], out));
  moe_saved *s;
  TSR_CHECK(saved_new(&plan, &s));
  s->aux_scale = scale;
  if (stats->value->local) {
    int64_t E = stats->value->shape[1];
    const float *sv = fdata(stats->value);
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) sum += (double)sv[e] * (double)sv[E + e];
    fdata((*out)->value)[0] = (float)(scale * sum);
  }
  return tsr_tape_record(t, TSR_OP_MOE_AUX_LOSS, in, 1, out, 1, aux_backward, s, moe_saved_free);
}

tsr_status tsr_op_moe_aux_loss(tsr_tape_t *t, tsr_var *stats, float scale, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter(TSR_OP_MOE_AUX_LOSS);
  return tsr_op_crumb_leave(crumb, aux_forward(t, stats, scale, out));
}
