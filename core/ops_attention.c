/* Scaled dot-product attention on (B, L, H, D) vars, with the kernels that read that layout in
 * place. It saves the output and the log-sum-exp for backward (q, k, v are the inputs, which the
 * tape keeps), so that backward recomputes nothing but the probabilities. */
#include <stdlib.h>
#include <string.h>

#include "ops_impl.h"

typedef struct sdpa_saved {
  tsr_op_placements plan;
  bool causal;
  int B, L, Lk, Hq, Hkv, D;
  /* On q's device; host ones are untracked, as the kernels' other scratch. */
  tsr_tensor *q_pos, *k_pos; /* (L), (Lk) i32 global positions of the local rows */
  tsr_tensor *out, *lse;     /* (B, L, Hq, D), (B, Hq, L) */
} sdpa_saved;

static void sdpa_saved_free(void *p) {
  sdpa_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->q_pos);
  tsr_tensor_free(s->k_pos);
  tsr_tensor_free(s->out);
  tsr_tensor_free(s->lse);
  free(s);
}

static float *fdata(const tsr_dtensor *x) {
  return tsr_tensor_data(x->local);
}

static void *data(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* The kernel `name` of x's device, reached by name, or an error naming the device. */
static tsr_status seg_kernel(const tsr_dtensor *x, const char *name, tsr_kernel_fn *out) {
  const tsr_kernel_table *k = tsr_op_kernels(x);
  *out = tsr_kernel_lookup(k, name);
  if (!*out)
    return TSR_ERROR(TSR_ENOTSUP,
                     "sdpa_doc: the %s device has no kernel '%s'; [data] mask = document needs a "
                     "library that serves it",
                     k->name, name);
  return TSR_OK;
}

/* sdpa's and sdpa_doc's backward: a fourth input holds sdpa_doc's segment ids. */
static tsr_status sdpa_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                int nout, void *saved) {
  (void)nout;
  sdpa_saved *s = saved;
  tsr_placement want[TSR_MAX_MESH_DIMS];
  tsr_op_grad_placements(out[0]->value->mesh, out[0]->value->placements, want);
  const tsr_dtensor *g;
  tsr_dtensor *owned, *grads[3] = {NULL, NULL, NULL};
  TSR_CHECK(tsr_op_grad_of(t, out[0], want, &g, &owned));
  tsr_status st = TSR_OK;
  for (int i = 0; i < 3 && st == TSR_OK; i++)
    st = tsr_op_new_grad(t, in[i], s->plan.grads[i], &grads[i]);
  tsr_kernel_fn fn = NULL;
  if (st == TSR_OK && g->local && nin == 4) st = seg_kernel(g, "attention_backward_seg_blhd", &fn);
  if (st == TSR_OK && g->local && fn) {
    const int32_t *seg = data(in[3]->value->local);
    st = ((tsr_kernel_attention_backward_seg_fn)fn)(
        fdata(grads[0]), fdata(grads[1]), fdata(grads[2]), fdata(g), fdata(in[0]->value),
        fdata(in[1]->value), fdata(in[2]->value), data(s->out), data(s->lse), data(s->q_pos),
        data(s->k_pos), seg, seg, s->B, s->Hq, s->Hkv, s->L, s->Lk, s->D, s->causal);
  } else if (st == TSR_OK && g->local) {
    st = tsr_op_kernels(g)->attention_backward_blhd(
        fdata(grads[0]), fdata(grads[1]), fdata(grads[2]), fdata(g), fdata(in[0]->value),
        fdata(in[1]->value), fdata(in[2]->value), data(s->out), data(s->lse), data(s->q_pos),
        data(s->k_pos), s->B, s->Hq, s->Hkv, s->L, s->Lk, s->D, s->causal);
  }
  tsr_dtensor_free(owned);
  for (int i = 0; i < 3; i++) {
    if (st == TSR_OK) {
      st = tsr_var_accumulate_grad(t, in[i], grads[i]);
    } else {
      tsr_dtensor_free(grads[i]);
    }
  }
  return st;
}

tsr_status tsr_op_sdpa_local(tsr_tape_t *t, const char *op, tsr_var *const *in, int nin,
                             bool causal, const tsr_op_placements *plan, tsr_var **out) {
  tsr_var *q = in[0], *k = in[1], *v = in[2];
  TSR_CHECK(tsr_op_new_output(t, q, 4, q->value->shape, plan->outputs[0], out));
  sdpa_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving attention");
  s->plan = *plan;
  s->causal = causal;
  tsr_status st = TSR_OK;
  if (q->value->local) {
    const int64_t *ql = q->value->local->shape, *kl = k->value->local->shape;
    s->B = (int)ql[0];
    s->Hq = (int)ql[2];
    s->Hkv = (int)kl[2];
    s->D = (int)ql[3];
    tsr_allocator *alloc = tsr_tensor_scratch_allocator(q->value->local);
    tsr_kernel_fn fn = NULL;
    if (nin == 4) st = seg_kernel(q->value, "attention_forward_seg_blhd", &fn);
    if (st == TSR_OK) st = tsr_op_positions(t, q->value, &s->L, &s->q_pos);
    if (st == TSR_OK) st = tsr_op_positions(t, k->value, &s->Lk, &s->k_pos);
    int64_t lse_shape[3] = {s->B, s->Hq, s->L};
    if (st == TSR_OK) st = tsr_tensor_new(alloc, TSR_F32, 3, lse_shape, &s->lse);
    const tsr_tensor *o = (*out)->value->local;
    if (st == TSR_OK && fn) {
      const int32_t *seg = data(in[3]->value->local);
      st = ((tsr_kernel_attention_forward_seg_fn)fn)(
          data(o), data(s->lse), fdata(q->value), fdata(k->value), fdata(v->value), data(s->q_pos),
          data(s->k_pos), seg, seg, s->B, s->Hq, s->Hkv, s->L, s->Lk, s->D, causal);
    } else if (st == TSR_OK) {
      st = tsr_op_kernels(q->value)->attention_forward_blhd(
          data(o), data(s->lse), fdata(q->value), fdata(k->value), fdata(v->value), data(s->q_pos),
          data(s->k_pos), s->B, s->Hq, s->Hkv, s->L, s->Lk, s->D, causal);
    }
    /* a copy: the output var may be released before this node's backward runs */
    if (st == TSR_OK) st = tsr_tensor_to(o, alloc, &s->out);
  }
  if (st != TSR_OK) {
    sdpa_saved_free(s);
    return st;
  }
  return tsr_tape_record(t, op, in, nin, out, 1, sdpa_backward, s, sdpa_saved_free);
}

static tsr_status sdpa_forward(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, bool causal,
                               tsr_var **out) {
  TSR_CHECK(tsr_op_check("sdpa", "q", q, TSR_F32, 4));
  TSR_CHECK(tsr_op_check("sdpa", "k", k, TSR_F32, 4));
  TSR_CHECK(tsr_op_check("sdpa", "v", v, TSR_F32, 4));
  const int64_t *qs = q->value->shape, *ks = k->value->shape, *vs = v->value->shape;
  bool ok = qs[0] == ks[0] && qs[3] == ks[3] && ks[2] > 0 && qs[2] % ks[2] == 0;
  for (int d = 0; d < 4; d++) ok = ok && ks[d] == vs[d];
  if (!ok) {
    char a[128], b[128], c[128];
    return TSR_ERROR(TSR_EINVAL,
                     "sdpa: q %s, k %s, v %s (B, L, H, D): k and v must match, and q's heads "
                     "must be a multiple of k's",
                     tsr_shape_str(4, qs, a, sizeof a), tsr_shape_str(4, ks, b, sizeof b),
                     tsr_shape_str(4, vs, c, sizeof c));
  }
  tsr_var *in[3] = {q, k, v};
  tsr_op_placements plan;
  TSR_CHECK(tsr_op_plan(t, "sdpa", in, 3, 1, &plan));
  tsr_sdpa_attrs attrs = {causal};
  bool handled;
  TSR_CHECK(tsr_op_run_rule(t, "sdpa", in, 3, &attrs, sizeof attrs, &plan, 1, out, &handled));
  if (handled) return TSR_OK;
  return tsr_op_sdpa_local(t, "sdpa", in, 3, causal, &plan, out);
}

tsr_status tsr_op_sdpa(tsr_tape_t *t, tsr_var *q, tsr_var *k, tsr_var *v, bool causal,
                       tsr_var **out) {
  tsr_op_crumb crumb = tsr_op_crumb_enter("sdpa");
  return tsr_op_crumb_leave(crumb, sdpa_forward(t, q, k, v, causal, out));
}
