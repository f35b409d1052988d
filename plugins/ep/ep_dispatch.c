/* Expert parallelism for moe_experts: each ep rank holds E / ep consecutive experts (w13 and w2
 * Shard(0)) and its own tokens (x and combine Shard(0)).
 *
 * Forward, on every rank of the ep group at once:
 *   home    routes its tokens over all E experts (tsr_kernel_moe_route: rows by expert, then
 *           token), so the rows for member j's experts j*El ..< (j+1)*El are one contiguous run;
 *           tells every member how many rows each of its experts gets (an all-to-all of El
 *           counts per member) and sends it the rows themselves (an all-to-all of C floats per
 *           row, counts per member);
 *   expert  regroups what arrived from "member 0's rows for each local expert, then member
 *           1's, ..." into "expert 0's rows from member 0, 1, ..., then expert 1's, ...", which
 *           is the order of the global batch, runs the expert FFNs (tsr_kernel_moe_ffn_forward)
 *           on its weight shards, and sends the results back in the order they came;
 *   home    receives them in its routed order and combines them (tsr_kernel_moe_combine), each
 *           token's experts in ascending order.
 * Every expert's GEMMs therefore see the rows of the 1-rank op in the same order, and every
 * token sums its experts in the same order: the result is the 1-rank result.
 *
 * Backward retraces the rows: home turns the output gradient into one gradient per routed row
 * and the combine gradient (tsr_kernel_moe_combine_backward), sends the rows to the experts,
 * which run the FFN backward with the rows and activations kept from forward (their weight
 * gradients stay Shard(0): nothing is reduced over ep) and send the input gradients back, which
 * home scatters into dx in routed order.
 *
 * The rows move through host memory and the host kernels of tessera/kernels.h, so the rule runs
 * with device = cpu (ep.c's validate refuses other devices).
 */
#include <stdlib.h>
#include <string.h>

#include "ep_impl.h"
#include "tessera/kernels.h"

typedef struct ep_saved {
  int P, me;        /* ep group size and this rank's index */
  int E, El, C, I;  /* experts, local experts, hidden and intermediate size of the local shards */
  int64_t N, M, R;  /* local tokens; routed rows at home; rows held as an expert rank */
  int64_t *offsets; /* (E + 1) home's routed rows per global expert */
  int32_t *token;   /* (M) token of each routed row */
  int32_t *counts;  /* (P * El) rows member j sends local expert l, at j * El + l */
  int64_t *at;      /* (P * El) where those rows start among the expert-major rows */
  int64_t *local;   /* (El + 1) the local experts' offsets among the expert-major rows */
  size_t *send;     /* (P) floats home sends member j (rows * C) */
  size_t *recv;     /* (P) floats this expert rank receives from member j */
  tsr_tensor *y;    /* (M, C) home: each routed row's expert output */
  tsr_tensor *xs;   /* (R, C) the rows this rank's experts ran, expert-major */
  tsr_tensor *h;    /* (R, 2I) their gate and up projections */
  /* the placements of the output and of each input's gradient on every mesh dim */
  tsr_placement out_p[TSR_MAX_MESH_DIMS];
  tsr_placement grad_p[4][TSR_MAX_MESH_DIMS];
} ep_saved;

void ep_experts_saved_free(void *p) {
  ep_saved *s = p;
  if (!s) return;
  free(s->offsets);
  free(s->token);
  free(s->counts);
  free(s->at);
  free(s->local);
  free(s->send);
  free(s->recv);
  tsr_tensor_free(s->y);
  tsr_tensor_free(s->xs);
  tsr_tensor_free(s->h);
  free(s);
}

static float *fdata(const tsr_tensor *t) {
  return tsr_tensor_data(t);
}

/* A zeroed (rows, width) f32 buffer from the rank's allocator, so that it counts in the rank's
 * memory as the 1-rank op's activations do. */
static tsr_status rows_new(tsr_rank_t *r, int64_t rows, int64_t width, const char *what,
                           tsr_tensor **out) {
  int64_t shape[2] = {rows, width};
  tsr_status st = tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 2, shape, out);
  return st == TSR_OK ? st : tsr_error_prefix(st, "ep: %s (%lld rows)", what, (long long)rows);
}

static const char *pstr(tsr_placement p, char *buf, size_t len) {
  return tsr_placement_str(p, buf, len);
}

/* The placements of the output and of the input gradients on every mesh dim: Shard(0) on ep;
 * on another dim, those of the rule registered there, or of the core's generic rules (every
 * input replicated: replicated; tokens split along the batch or the sequence with whole weights:
 * the output split alike, the weights' gradients Partial(sum)). The compute replaces the op on
 * every dim, so it makes the outputs with the placements the plan would give them. */
static tsr_status place(tsr_rank_t *r, int dim, const tsr_dtensor *const *in, ep_saved *s) {
  const tsr_mesh_t *m = in[0]->mesh;
  const tsr_registry_t *reg = tsr_rank_registry(r);
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    tsr_placement p[4];
    bool all_r = true;
    for (int j = 0; j < 4; j++) {
      p[j] = in[j]->placements[i];
      all_r = all_r && p[j].kind == TSR_REPLICATE;
    }
    s->out_p[i] = tsr_replicate();
    for (int j = 0; j < 4; j++) s->grad_p[j][i] = tsr_replicate();
    if (i == dim) {
      s->out_p[i] = tsr_shard(0);
      for (int j = 0; j < 4; j++) s->grad_p[j][i] = tsr_shard(0);
      continue;
    }
    if (tsr_mesh_dim_size(m, i) == 1 || all_r) continue;
    const char *name = tsr_mesh_dim_name(m, i);
    const tsr_op_rule *rule =
        reg ? tsr_registry_find_op_rule(reg, TSR_OP_MOE_EXPERTS, name, 4, p) : NULL;
    if (rule) {
      s->out_p[i] = rule->outputs[0];
      for (int j = 0; j < 4; j++) s->grad_p[j][i] = rule->grads[j];
      continue;
    }
    if (p[0].kind == TSR_SHARD && p[0].dim < in[0]->ndim - 1 && tsr_placement_equal(p[1], p[0]) &&
        p[2].kind == TSR_REPLICATE && p[3].kind == TSR_REPLICATE) {
      s->out_p[i] = p[0];
      s->grad_p[0][i] = p[0];
      s->grad_p[1][i] = p[1];
      s->grad_p[2][i] = s->grad_p[3][i] = tsr_partial(TSR_REDUCE_SUM);
      continue;
    }
    char a[4][32];
    return TSR_ERROR(TSR_ENOTSUP,
                     "ep: moe_experts has inputs (%s, %s, %s, %s) on mesh dim '%s', which no rule "
                     "registered there covers and ep cannot place its output by; split the "
                     "tokens there along the batch or the sequence with the expert weights "
                     "replicated, or register a rule for moe_experts on '%s'",
                     pstr(p[0], a[0], 32), pstr(p[1], a[1], 32), pstr(p[2], a[2], 32),
                     pstr(p[3], a[3], 32), name, name);
  }
  return TSR_OK;
}

/* Shapes of the local shards, checked against each other and against the ep split of the
 * experts: this rank's experts must be me * El ..< (me + 1) * El. */
static tsr_status check_shapes(tsr_rank_t *r, const tsr_dtensor *const *in, ep_saved *s) {
  const tsr_dtensor *x = in[0], *cb = in[1], *w13 = in[2], *w2 = in[3];
  const tsr_tensor *xl = x->local, *cl = cb->local, *al = w13->local, *bl = w2->local;
  for (int j = 0; j < 4; j++) {
    const tsr_tensor *t = in[j]->local;
    if (in[j]->dtype != TSR_F32 || !tsr_tensor_is_contiguous(t))
      return TSR_ERROR(
          TSR_EINVAL, "ep: moe_experts input %d is %s%s; the rule takes contiguous f32", j,
          tsr_dtype_name(in[j]->dtype), tsr_tensor_is_contiguous(t) ? "" : " and not contiguous");
    if (tsr_tensor_device(t).kind != TSR_DEVICE_CPU)
      return TSR_ERROR(TSR_ENOTSUP,
                       "ep: moe_experts input %d lives on device %s; the expert dispatch runs on "
                       "host memory with the CPU kernels: run with device = cpu",
                       j, tsr_device_name(tsr_tensor_device(t).kind));
  }
  if (w13->ndim != 3 || w2->ndim != 3 || cb->ndim != x->ndim || x->ndim < 1)
    return TSR_ERROR(TSR_EINVAL,
                     "ep: moe_experts takes w13 (E, 2I, C) and w2 (E, C, I), and combine with x's "
                     "dims; got %d, %d, %d and %d dims",
                     w13->ndim, w2->ndim, cb->ndim, x->ndim);
  s->E = (int)cb->shape[cb->ndim - 1];
  if (w13->shape[0] != s->E || w2->shape[0] != s->E || s->E % s->P)
    return TSR_ERROR(TSR_EINVAL,
                     "ep: combine names %d experts, w13 holds %lld and w2 %lld, over ep = %d; "
                     "the experts must be the same and a multiple of ep",
                     s->E, (long long)w13->shape[0], (long long)w2->shape[0], s->P);
  s->El = s->E / s->P;
  s->C = (int)xl->shape[xl->ndim - 1];
  s->I = (int)bl->shape[2];
  s->N = s->C ? tsr_tensor_numel(xl) / s->C : 0;
  if (cl->shape[cl->ndim - 1] != s->E || tsr_tensor_numel(cl) != s->N * s->E)
    return TSR_ERROR(TSR_EINVAL,
                     "ep: the local combine holds %lld weights, not %lld tokens x %d experts: "
                     "combine must be split like x and whole along the experts",
                     (long long)tsr_tensor_numel(cl), (long long)s->N, s->E);
  for (int k = 0; k < 2; k++) {
    const tsr_dtensor *w = k ? w2 : w13;
    int64_t ls[TSR_MAX_DIMS], start[TSR_MAX_DIMS];
    if (!tsr_dtensor_local_shape(w->mesh, w->placements, 3, w->shape, tsr_rank_id(r), ls, start) ||
        ls[0] != s->El || start[0] != (int64_t)s->me * s->El)
      return TSR_ERROR(TSR_ENOTSUP,
                       "ep: this rank (ep member %d) holds experts %lld ..< %lld of %s, not the "
                       "%d ..< %d the ep split gives it; ep must be the only mesh dim that splits "
                       "the experts",
                       s->me, (long long)start[0], (long long)(start[0] + ls[0]), k ? "w2" : "w13",
                       s->me * s->El, (s->me + 1) * s->El);
  }
  if (al->shape[0] != s->El || al->shape[1] != 2 * (int64_t)s->I || al->shape[2] != s->C ||
      bl->shape[0] != s->El || bl->shape[1] != s->C) {
    char a[64], b[64];
    return TSR_ERROR(TSR_EINVAL,
                     "ep: local w13 %s and w2 %s do not fit x's %d features: they must be "
                     "(E/ep, 2I, C) and (E/ep, C, I)",
                     tsr_shape_str(3, al->shape, a, sizeof a),
                     tsr_shape_str(3, bl->shape, b, sizeof b), s->C);
  }
  return TSR_OK;
}

/* Rows grouped by source member (member j's rows for local expert 0, 1, ... in turn) to rows
 * grouped by local expert (expert l's rows from member 0, 1, ... in turn), or back. */
static void regroup(float *dst, const float *src, const ep_saved *s, int64_t width,
                    bool to_experts) {
  int64_t src_at = 0;
  for (int j = 0; j < s->P; j++)
    for (int l = 0; l < s->El; l++) {
      int64_t n = s->counts[j * s->El + l], e_at = s->at[j * s->El + l];
      size_t bytes = (size_t)(n * width) * sizeof(float);
      if (bytes && to_experts)
        memcpy(dst + e_at * width, src + src_at * width, bytes);
      else if (bytes)
        memcpy(dst + src_at * width, src + e_at * width, bytes);
      src_at += n;
    }
}

/* Routes the home tokens and exchanges the per-expert row counts: fills everything in s but
 * the tensors. */
static tsr_status plan_rows(tsr_group_t *g, const float *combine, ep_saved *s) {
  int P = s->P, El = s->El, E = s->E;
  int64_t M = 0;
  for (int64_t i = 0; i < s->N * E; i++) M += combine[i] != 0.0f;
  s->M = M;
  s->offsets = malloc(sizeof(int64_t) * ((size_t)E + 1));
  s->token = malloc(sizeof(int32_t) * ((size_t)M + 1));
  s->counts = malloc(sizeof(int32_t) * (size_t)P * (size_t)El);
  s->at = malloc(sizeof(int64_t) * (size_t)P * (size_t)El);
  s->local = malloc(sizeof(int64_t) * ((size_t)El + 1));
  s->send = malloc(sizeof(size_t) * (size_t)P);
  s->recv = malloc(sizeof(size_t) * (size_t)P);
  int32_t *mine = malloc(sizeof(int32_t) * (size_t)E);
  size_t *each = malloc(sizeof(size_t) * (size_t)P);
  tsr_status st = TSR_OK;
  if (!s->offsets || !s->token || !s->counts || !s->at || !s->local || !s->send || !s->recv ||
      !mine || !each) {
    st = TSR_ERROR(TSR_ENOMEM, "ep: out of memory routing %lld rows over %d experts", (long long)M,
                   E);
    goto cleanup;
  }
  tsr_kernel_moe_route(s->offsets, s->token, combine, (int)s->N, E);
  if (s->offsets[E] != M) {
    st = TSR_ERROR(TSR_EINTERNAL, "ep: routed %lld rows, counted %lld", (long long)s->offsets[E],
                   (long long)M);
    goto cleanup;
  }
  /* the counts sent to member j are those of its experts, j * El ..< (j + 1) * El */
  for (int e = 0; e < E; e++) mine[e] = (int32_t)(s->offsets[e + 1] - s->offsets[e]);
  for (int j = 0; j < P; j++) each[j] = (size_t)El;
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, mine, each, s->counts, each, TSR_I32), st);
  for (int j = 0; j < P; j++) {
    s->send[j] = (size_t)(s->offsets[(j + 1) * El] - s->offsets[j * El]) * (size_t)s->C;
    s->recv[j] = 0;
    for (int l = 0; l < El; l++) s->recv[j] += (size_t)s->counts[j * El + l] * (size_t)s->C;
  }
  int64_t at = 0;
  for (int l = 0; l < El; l++) {
    s->local[l] = at;
    for (int j = 0; j < P; j++) {
      s->at[j * El + l] = at;
      at += s->counts[j * El + l];
    }
  }
  s->local[El] = at;
  s->R = at;
cleanup:
  free(mine);
  free(each);
  return st;
}

tsr_status ep_experts_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, tsr_dtensor **out, void **saved,
                              void *ctx) {
  (void)nin, (void)attrs, (void)nout, (void)ctx;
  const tsr_dtensor *x = in[0], *cb = in[1], *w13 = in[2], *w2 = in[3];
  ep_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "ep: out of memory saving the expert dispatch");
  *saved = s;
  TSR_CHECK(place(r, dim, in, s));
  TSR_CHECK(tsr_dtensor_zeros(r, x->mesh, TSR_F32, x->ndim, x->shape, s->out_p, out));
  if (!x->local) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(x->mesh, tsr_rank_comm(r), 1u << dim, &g));
  s->P = tsr_group_size(g);
  s->me = tsr_group_index(g);
  TSR_CHECK(check_shapes(r, in, s));
  const float *combine = fdata(cb->local);
  TSR_CHECK(plan_rows(g, combine, s));
  int64_t C = s->C, M = s->M, R = s->R;
  tsr_tensor *rows = NULL, *moved = NULL, *ys = NULL;
  tsr_status st = TSR_OK;
  /* home: the rows for every expert, to their ranks */
  TSR_CHECK_GOTO(rows_new(r, M, C, "routed rows", &rows), st);
  tsr_kernel_moe_gather(fdata(rows), fdata(x->local), s->token, M, s->C);
  TSR_CHECK_GOTO(rows_new(r, R, C, "rows received", &moved), st);
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, fdata(rows), s->send, fdata(moved), s->recv, TSR_F32), st);
  tsr_tensor_free(rows);
  rows = NULL;
  /* expert: the FFNs over the rows in the order of the global batch */
  TSR_CHECK_GOTO(rows_new(r, R, C, "expert inputs", &s->xs), st);
  regroup(fdata(s->xs), fdata(moved), s, C, true);
  TSR_CHECK_GOTO(rows_new(r, R, 2 * (int64_t)s->I, "expert activations", &s->h), st);
  TSR_CHECK_GOTO(rows_new(r, R, C, "expert outputs", &ys), st);
  TSR_CHECK_GOTO(tsr_kernel_moe_ffn_forward(fdata(ys), fdata(s->h), fdata(s->xs), fdata(w13->local),
                                            fdata(w2->local), s->local, s->El, s->C, s->I),
                 st);
  regroup(fdata(moved), fdata(ys), s, C, false);
  /* home: the outputs come back in routed order */
  TSR_CHECK_GOTO(rows_new(r, M, C, "expert outputs at home", &s->y), st);
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, fdata(moved), s->recv, fdata(s->y), s->send, TSR_F32), st);
#ifdef TSR_EP_FAULT_SKIP /* test builds only (tests/conformance): the last expert is dropped */
  memset(fdata(s->y) + s->offsets[s->E - 1] * s->C, 0,
         (size_t)((s->offsets[s->E] - s->offsets[s->E - 1]) * s->C) * sizeof(float));
#endif
  tsr_kernel_moe_combine(fdata((*out)->local), fdata(s->y), combine, s->token, s->offsets, s->E,
                         s->C);
#ifdef TSR_EP_FAULT_SCALE /* test builds only: every output off by a relative 5e-5 */
  for (int64_t i = 0; i < s->N * s->C; i++) fdata((*out)->local)[i] *= 1.0f + 5e-5f;
#endif
cleanup:
  tsr_tensor_free(rows);
  tsr_tensor_free(moved);
  tsr_tensor_free(ys);
  return st;
}

tsr_status ep_experts_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                               const void *attrs, int nout, const tsr_dtensor *const *outs,
                               const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                               void *ctx) {
  (void)dim, (void)nin, (void)attrs, (void)nout, (void)outs, (void)ctx;
  const ep_saved *s = saved;
  if (!gouts[0]) return TSR_OK;
  for (int j = 0; j < 4; j++)
    TSR_CHECK(tsr_dtensor_zeros(r, in[j]->mesh, TSR_F32, in[j]->ndim, in[j]->shape, s->grad_p[j],
                                &gins[j]));
  if (!in[0]->local) return TSR_OK;
  const tsr_tensor *gout = gouts[0]->local;
  if (!tsr_tensor_is_contiguous(gout) || tsr_tensor_numel(gout) != s->N * s->C)
    return TSR_ERROR(TSR_EINTERNAL, "ep: the output gradient holds %lld values, not %lld x %d",
                     (long long)tsr_tensor_numel(gout), (long long)s->N, s->C);
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(in[0]->mesh, tsr_rank_comm(r), 1u << dim, &g));
  int64_t C = s->C, M = s->M, R = s->R;
  tsr_tensor *dy = NULL, *moved = NULL, *dys = NULL, *dxs = NULL;
  tsr_status st = TSR_OK;
  /* home: each routed row's output gradient, and the combine gradient */
  TSR_CHECK_GOTO(rows_new(r, M, C, "routed row gradients", &dy), st);
  tsr_kernel_moe_combine_backward(fdata(dy), fdata(gins[1]->local), fdata(gout), fdata(s->y),
                                  fdata(in[1]->local), s->token, s->offsets, s->E, s->C);
  TSR_CHECK_GOTO(rows_new(r, R, C, "row gradients received", &moved), st);
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, fdata(dy), s->send, fdata(moved), s->recv, TSR_F32), st);
  /* expert: the FFN backward; the weight gradients stay with the experts' shards */
  TSR_CHECK_GOTO(rows_new(r, R, C, "expert output gradients", &dys), st);
  regroup(fdata(dys), fdata(moved), s, C, true);
  TSR_CHECK_GOTO(rows_new(r, R, C, "expert input gradients", &dxs), st);
  TSR_CHECK_GOTO(tsr_kernel_moe_ffn_backward(fdata(dxs), fdata(gins[2]->local),
                                             fdata(gins[3]->local), fdata(dys), fdata(s->xs),
                                             fdata(s->h), fdata(in[2]->local), fdata(in[3]->local),
                                             s->local, s->El, s->C, s->I),
                 st);
  regroup(fdata(moved), fdata(dxs), s, C, false);
  /* home: the input gradients come back in routed order and add into dx */
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, fdata(moved), s->recv, fdata(dy), s->send, TSR_F32), st);
  tsr_kernel_moe_scatter_add(fdata(gins[0]->local), fdata(dy), s->token, M, s->C);
cleanup:
  tsr_tensor_free(dy);
  tsr_tensor_free(moved);
  tsr_tensor_free(dys);
  tsr_tensor_free(dxs);
  return st;
}
