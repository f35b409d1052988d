/* Document masking ([data] mask = document, docs/data.md): RoPE at per-token positions and
 * attention that stays inside each document of a packed sequence.
 *
 * Both ops take the per-token data as an extra i32 input (B, L), laid out like the activation's
 * rows: the op first moves it to the activation's batch and sequence shards (and keeps it whole
 * over a heads shard), through the redistribute planner and so through any transition a plugin
 * registered (zigzag on the ring). Every local shard of x then holds the ids of its own rows, so
 * the kernels need no offsets, and the generic rules hold on any batch, sequence or heads split.
 * Rules for plain `sdpa` are never asked for `sdpa_doc`: a plugin that predates it (ABI < 1.3)
 * cannot compute causal attention on a document-masked job by mistake; the op refuses, naming it.
 */
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"
#include "registry_impl.h"

/* Where the per-token data of an activation placed `xp` goes: its batch and sequence shards,
 * Replicate for anything else (heads, hidden, Partial). */
static void rows_placements(const tsr_mesh_t *m, const tsr_placement *xp, tsr_placement *p) {
  for (int i = 0; i < tsr_mesh_ndim(m); i++)
    p[i] = xp[i].kind == TSR_SHARD && xp[i].dim <= 1 ? xp[i] : tsr_replicate();
}

/* `ids` (B, L) i32, checked against x's batch and sequence, moved to x's rows. */
static tsr_status place_rows(tsr_tape_t *t, const char *op, const char *role, tsr_var *ids,
                             const tsr_var *x, tsr_var **out) {
  TSR_CHECK(tsr_op_check(op, role, ids, TSR_I32, 2));
  const int64_t *is = ids->value->shape, *xs = x->value->shape;
  if (is[0] != xs[0] || is[1] != xs[1])
    return TSR_ERROR(TSR_EINVAL,
                     "%s: %s is (%lld, %lld) but the activation's rows are (%lld, %lld)", op, role,
                     (long long)is[0], (long long)is[1], (long long)xs[0], (long long)xs[1]);
  const tsr_mesh_t *m = x->value->mesh;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  rows_placements(m, x->value->placements, p);
  bool same = tsr_mesh_equal(ids->value->mesh, m);
  for (int i = 0; same && i < tsr_mesh_ndim(m); i++)
    same = tsr_placement_equal(p[i], ids->value->placements[i]);
  if (same) {
    *out = ids;
    return TSR_OK;
  }
  return tsr_op_redistribute(t, ids, m, p, out);
}

static float *fdata(const tsr_dtensor *x) {
  return tsr_tensor_data(x->local);
}

static void *data(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* ---- rope_doc ---- */

static tsr_status rope_doc_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                    int nout, void *saved) {
  (void)nin, (void)nout;
  tsr_op_saved_plan *s = saved;
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(out[0]->value->mesh, out[0]->value->placements, want);
  const tsr_dtensor *g;
  tsr_dtensor *owned, *dx = NULL;
  TSR_CHECK(tsr_op_grad_of(t, out[0], want, &g, &owned));
  tsr_status st = tsr_op_new_grad(t, in[0], s->plan.grads[0], &dx);
  if (st == TSR_OK && dx->local) {
    /* one table row per token: (B, L) rows are (1, B * L) */
    const int64_t *ls = in[0]->value->local->shape;
    tsr_op_kernels(g)->rope_backward(fdata(dx), fdata(g), data(s->aux), data(s->aux2), 1,
                                     (int)(ls[0] * ls[1]), (int)ls[2], (int)ls[3]);
  }
  tsr_dtensor_free(owned);
  if (st != TSR_OK) {
    tsr_dtensor_free(dx);
    return st;
  }
  return tsr_var_accumulate_grad(t, in[0], dx);
}

static tsr_status rope_doc_recompute(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *out,
                                     void *saved) {
  (void)t, (void)nin;
  tsr_op_saved_plan *s = saved;
  const tsr_dtensor *xv = in[0]->value;
  if (!xv->local) return TSR_OK;
  const int64_t *ls = xv->local->shape;
  tsr_op_kernels(xv)->rope_forward(fdata(out->value), fdata(xv), data(s->aux), data(s->aux2), 1,
                                   (int)(ls[0] * ls[1]), (int)ls[2], (int)ls[3]);
  return TSR_OK;
}

static tsr_status rope_doc_forward(tsr_tape_t *t, tsr_var *x, tsr_var *pos, float theta,
                                   tsr_var **out) {
  TSR_CHECK(tsr_op_check(TSR_OP_ROPE_DOC, "x", x, TSR_F32, 4));
  if (x->value->shape[3] % 2)
    return TSR_ERROR(TSR_EINVAL, "rope_doc: head dim %lld is odd; rotary embedding needs it even",
                     (long long)x->value->shape[3]);
  tsr_var *in[2] = {x, NULL};
  TSR_CHECK(place_rows(t, TSR_OP_ROPE_DOC, "positions", pos, x, &in[1]));
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, TSR_OP_ROPE_DOC, in, 2, 1, &plan));
  tsr_rope_attrs attrs = {theta};
  bool handled;
  TSR_CHECK(
      tsr_op_run_rule(t, TSR_OP_ROPE_DOC, in, 2, &attrs, sizeof attrs, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  TSR_CHECK(tsr_op_new_output(t, x, 4, x->value->shape, plan.outputs[0], out));
  tsr_op_saved_plan *s;
  TSR_CHECK(tsr_op_saved_new(&plan, &s));
  s->theta = theta;
  tsr_status st = TSR_OK;
  if (x->value->local) {
    const int64_t *ls = x->value->local->shape;
    int N = (int)(ls[0] * ls[1]), D = (int)ls[3];
    int64_t tshape[2] = {N, D};
    tsr_allocator *alloc = tsr_tensor_scratch_allocator(x->value->local);
    st = tsr_tensor_new(alloc, TSR_F32, 2, tshape, &s->aux);
    if (st == TSR_OK) st = tsr_tensor_new(alloc, TSR_F32, 2, tshape, &s->aux2);
    if (st == TSR_OK)
      st = tsr_op_kernels(x->value)->rope_tables(data(s->aux), data(s->aux2),
                                                 data(in[1]->value->local), N, D, theta);
    if (st == TSR_OK)
      tsr_op_kernels(x->value)->rope_forward(fdata((*out)->value), fdata(x->value), data(s->aux),
                                             data(s->aux2), 1, N, (int)ls[2], D);
  }
  if (st != TSR_OK) {
    tsr_op_saved_free(s);
    return st;
  }
  TSR_CHECK(
      tsr_tape_record(t, TSR_OP_ROPE_DOC, in, 2, out, 1, rope_doc_backward, s, tsr_op_saved_free));
  tsr_tape_mark_recomputable(t, *out, rope_doc_recompute);
  return TSR_OK;
}

tsr_status tsr_op_rope_doc(tsr_tape_t *t, tsr_var *x, tsr_var *pos, float theta, tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter(TSR_OP_ROPE_DOC);
  return tsr_op_crumb_leave(crumb, rope_doc_forward(t, x, pos, theta, out));
}

/* ---- sdpa_doc ---- */

/* Why no rule serves sdpa_doc on some dim, when a plugin's rule serves plain sdpa there: the
 * plugin predates document masking (or has not taken it up), and says so by name. */
static tsr_status refuse_plugin(tsr_tape_t *t, tsr_var *const *in, tsr_status st) {
  const tsr_registry_t *reg = tsr_rank_registry(tsr_tape_rank(t));
  const tsr_mesh_t *m = in[0]->value->mesh;
  if (!reg) return st;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    if (tsr_mesh_dim_size(m, i) == 1) continue;
    const char *dim = tsr_mesh_dim_name(m, i);
    tsr_placement p[4];
    for (int j = 0; j < 4; j++) p[j] = in[j]->value->placements[i];
    tsr_placement outs[TSR_MAX_OP_OUTPUTS], grads[TSR_MAX_OP_INPUTS];
    if (tsr_registry_find_op_rule(reg, TSR_OP_SDPA_DOC, dim, 4, p) ||
        tsr_op_generic_rule(TSR_OP_SDPA_DOC, in, 4, i, outs, grads))
      continue;
    const tsr_op_rule *plain = tsr_registry_find_op_rule(reg, TSR_OP_SDPA, dim, 3, p);
    if (!plain) continue;
    const char *owner = tsr_registry_op_rule_owner(reg, plain);
    return TSR_ERROR(TSR_ENOTSUP,
                     "[data] mask = document: plugin '%s' runs attention on mesh dim '%s' (rule "
                     "'%s') but has no rule for document-masked attention ('%s', plugin ABI 1.3); "
                     "it would mask causally across documents, so the job is refused: use "
                     "[data] mask = causal, or a mesh without '%s'",
                     owner ? owner : "?", dim, plain->name, TSR_OP_SDPA_DOC, dim);
  }
  return st;
}

static tsr_status sdpa_doc_forward(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, tsr_var *seg,
                                   tsr_var **out) {
  TSR_CHECK(tsr_op_check(TSR_OP_SDPA_DOC, "q", q, TSR_F32, 4));
  TSR_CHECK(tsr_op_check(TSR_OP_SDPA_DOC, "k", k, TSR_F32, 4));
  TSR_CHECK(tsr_op_check(TSR_OP_SDPA_DOC, "v", v, TSR_F32, 4));
  const int64_t *qs = q->value->shape, *ks = k->value->shape, *vs = v->value->shape;
  bool ok = qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3] && ks[2] > 0 && qs[2] % ks[2] == 0;
  for (int d = 0; d < 4; d++) ok = ok && ks[d] == vs[d];
  if (!ok) {
    char a[128], b[128], c[128];
    return TSR_ERROR(TSR_EINVAL,
                     "sdpa_doc: q %s, k %s, v %s (B, L, H, D): one sequence for all three, k and "
                     "v alike, and q's heads a multiple of k's",
                     tsr_shape_str(4, qs, a, sizeof a), tsr_shape_str(4, ks, b, sizeof b),
                     tsr_shape_str(4, vs, c, sizeof c));
  }
  tsr_var *in[4] = {q, k, v, NULL};
  TSR_CHECK(place_rows(t, TSR_OP_SDPA_DOC, "segment ids", seg, q, &in[3]));
  tsr_op_placements plan;
  tsr_status st = tsr_op_plan(t, TSR_OP_SDPA_DOC, in, 4, 1, &plan);
  if (st != TSR_OK) return refuse_plugin(t, in, st);
  tsr_sdpa_attrs attrs = {true};
  bool handled;
  TSR_CHECK(
      tsr_op_run_rule(t, TSR_OP_SDPA_DOC, in, 4, &attrs, sizeof attrs, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  return tsr_op_sdpa_local(t, TSR_OP_SDPA_DOC, in, 4, true, &plan, out);
}

tsr_status tsr_op_sdpa_doc(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, tsr_var *seg,
                           tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter(TSR_OP_SDPA_DOC);
  return tsr_op_crumb_leave(crumb, sdpa_doc_forward(t, q, k, v, seg, out));
}
