/* `tessera conform`, level L2: the numerics of op rules, module styles and redistribute
 * transitions, each against a dense reference.
 *
 * For every op rule, redistribute transition and module style the plugin registers, and every
 * mesh of 1-4 ranks along the dim it registered on, the test loads each job variant of
 * cf_variant that registers it (cf_over_variants) and runs ranks of the local backend on it:
 *   op rule     inputs placed as the rule says, the op through the registry, against the op on
 *               replicated inputs in a rank without any plugin (the dense reference): output,
 *               output placement, and the gradient of every float input for a random output
 *               gradient, with the placements the rule gives them;
 *   transition  each (src, dst) pair its match() accepts: Replicate -> src -> dst -> Replicate
 *               gives the tensor back exactly, and so does the adjoint of src -> dst;
 *   style       the module of the style (linear for column_linear, row_linear and kv_linear;
 *               embedding; rmsnorm; moe_experts for experts, both its stacked weights placed as
 *               the style's weight) with its weight, input and output placed by the style,
 *               against the dense module, forward and backward.
 * Op and style names are the registry's vocabulary (tsr_op_names, tsr_module_style_names): the
 * registry refuses any other at registration, so a name here without a generator is a gap in the
 * suite (NOTSUP), never the plugin's fault.
 * Shapes come in an uneven variant (7, 11, 13: torch.chunk leaves no rank empty) and even ones;
 * the moe ops' are l2_shapes' (inputs and references in conform_moe.c).
 * A rule may refuse a shape with EINVAL or ENOTSUP; one that refuses every shape tried is
 * NOTSUP, a wrong number or any other failure is FAILED. Schedules, the other L2 registration,
 * are conform_schedules.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"
#include "tessera/ops.h"

#define L2_TIMEOUT_S 10.0

typedef struct l2_shape {
  int64_t B, L, C, OC, V, H, HKV, D;
  bool causal;
  cf_moe_shape moe; /* the moe ops' sizes (B, L and C as above) */
} l2_shape;

/* Variant sv of the shapes for a mesh of n ranks; false past the last one for this op. The moe
 * ops: 11 experts (a rule that splits the experts over 2-4 ranks refuses them); 7 x 5 tokens,
 * which a batch split leaves uneven, over 12 experts, which it does not; then the even shape
 * (4n experts), and it again with top_k = 1 and the last rank's n experts (on 1 rank the last
 * expert) chosen by no token. */
static bool l2_shapes(const char *op, int n, int sv, l2_shape *s) {
  bool attn = !strcmp(op, TSR_OP_SDPA), doc = !strcmp(op, TSR_OP_SDPA_DOC);
  if (cf_moe_op(op)) {
    if (sv > 3) return false;
    cf_moe_shape m = {7, 7, 7, 11, 13, 2, 0};
    if (sv == 1) m = (cf_moe_shape){7, 5, 8, 12, 6, 2, 0};
    if (sv >= 2) m = (cf_moe_shape){2 * n, 4 * n, 4 * n, 4 * n, 3 * n, 2, 0};
    if (sv == 3) m.top_k = 1, m.starved = n > 1 ? m.E / n : 1;
    *s = (l2_shape){.B = m.B, .L = m.L, .C = m.C, .causal = true, .moe = m};
    return true;
  }
  if (sv == 0) {
    *s = (l2_shape){7, 7, 7, 11, 13, 7, 7, 4, true, {0}};
    return true;
  }
  /* sdpa_doc is causal always: no non-causal variant */
  if (sv > (attn ? 3 : doc ? 2 : 1)) return false;
  *s = (l2_shape){2 * n, 4 * n, 4 * n, 4 * n, 4 * n, 2 * n, n, 4, true, {0}};
  if (sv == 2) s->HKV = 1;
  if (sv == 3) s->causal = false;
  return true;
}

/* Deterministic values in [-1, 1), the same on every rank (conform.h). */
tsr_status cf_rand_tensor(int ndim, const int64_t *shape, uint32_t seed, tsr_tensor **out) {
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, ndim, shape, out));
  float *p = tsr_tensor_data(*out);
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < tsr_tensor_numel(*out); i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (float)((x >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return TSR_OK;
}

static tsr_status ids_tensor(int64_t B, int64_t L, int64_t V, bool labels, tsr_tensor **out) {
  int64_t shape[2] = {B, L};
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, out));
  int32_t *p = tsr_tensor_data(*out);
  for (int64_t i = 0; i < B * L; i++)
    p[i] = labels && i % 5 == 2 ? -100 : (int32_t)((i * 7 + (labels ? 3 : 1)) % V);
  return TSR_OK;
}

/* Packed documents of 1 to 4 tokens, shifted per row: each token's position in its document
 * (`positions`) or its document's number in the row. */
static tsr_status doc_tensor(int64_t B, int64_t L, bool positions, tsr_tensor **out) {
  int64_t shape[2] = {B, L};
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, out));
  int32_t *p = tsr_tensor_data(*out);
  for (int64_t b = 0; b < B; b++)
    for (int64_t l = 0, doc = 0, at = 0, len = 1 + b % 4; l < L; l++, at++) {
      if (at == len) doc++, at = 0, len = 1 + (b + doc) % 4;
      p[b * L + l] = (int32_t)(positions ? at : doc);
    }
  return TSR_OK;
}

/* The op's inputs as full tensors; *nin set. Float inputs first; ids and labels are i32. */
static tsr_status op_inputs(const char *op, const l2_shape *s, tsr_tensor **in, int *nin) {
  int64_t x3[3] = {s->B, s->L, s->C}, w[2] = {s->OC, s->C}, q[4] = {s->B, s->L, s->H, s->D};
  int64_t kv[4] = {s->B, s->L, s->HKV, s->D}, lg[3] = {s->B, s->L, s->V}, e[2] = {s->V, s->C};
  *nin = 0;
  if (!strcmp(op, TSR_OP_LINEAR)) {
    *nin = 2;
    TSR_CHECK(cf_rand_tensor(3, x3, 1, &in[0]));
    return cf_rand_tensor(2, w, 2, &in[1]);
  }
  if (!strcmp(op, TSR_OP_EMBEDDING)) {
    *nin = 2;
    TSR_CHECK(ids_tensor(s->B, s->L, s->V, false, &in[0]));
    return cf_rand_tensor(2, e, 3, &in[1]);
  }
  if (!strcmp(op, TSR_OP_RMSNORM)) {
    *nin = 2;
    TSR_CHECK(cf_rand_tensor(3, x3, 4, &in[0]));
    return cf_rand_tensor(1, &s->C, 5, &in[1]);
  }
  if (!strcmp(op, TSR_OP_ROPE)) {
    *nin = 1;
    return cf_rand_tensor(4, q, 6, &in[0]);
  }
  if (!strcmp(op, TSR_OP_SDPA)) {
    *nin = 3;
    TSR_CHECK(cf_rand_tensor(4, q, 7, &in[0]));
    TSR_CHECK(cf_rand_tensor(4, kv, 8, &in[1]));
    return cf_rand_tensor(4, kv, 9, &in[2]);
  }
  if (!strcmp(op, TSR_OP_ROPE_DOC)) {
    *nin = 2;
    TSR_CHECK(cf_rand_tensor(4, q, 6, &in[0]));
    return doc_tensor(s->B, s->L, true, &in[1]);
  }
  if (!strcmp(op, TSR_OP_SDPA_DOC)) {
    *nin = 4;
    TSR_CHECK(cf_rand_tensor(4, q, 7, &in[0]));
    TSR_CHECK(cf_rand_tensor(4, kv, 8, &in[1]));
    TSR_CHECK(cf_rand_tensor(4, kv, 9, &in[2]));
    return doc_tensor(s->B, s->L, false, &in[3]);
  }
  if (!strcmp(op, TSR_OP_ADD) || !strcmp(op, TSR_OP_SWIGLU)) {
    *nin = 2;
    TSR_CHECK(cf_rand_tensor(3, x3, 10, &in[0]));
    return cf_rand_tensor(3, x3, 11, &in[1]);
  }
  if (!strcmp(op, TSR_OP_CROSS_ENTROPY)) {
    *nin = 2;
    TSR_CHECK(cf_rand_tensor(3, lg, 12, &in[0]));
    return ids_tensor(s->B, s->L, s->V, true, &in[1]);
  }
  if (cf_moe_op(op)) return cf_moe_inputs(op, &s->moe, in, nin);
  return TSR_ENOTSUP;
}

/* The ops of the vocabulary the suite makes inputs for and runs (op_inputs, run_op). */
static const char *const generated_ops[] = {
    TSR_OP_EMBEDDING,  TSR_OP_RMSNORM,     TSR_OP_LINEAR,       TSR_OP_ROPE,
    TSR_OP_SDPA,       TSR_OP_ADD,         TSR_OP_SWIGLU,       TSR_OP_CROSS_ENTROPY,
    TSR_OP_MOE_ROUTER, TSR_OP_MOE_EXPERTS, TSR_OP_MOE_AUX_LOSS, TSR_OP_ROPE_DOC,
    TSR_OP_SDPA_DOC,
};

/* True for an op of the vocabulary that the suite has a generator for. */
static bool op_known(const char *op) {
  bool in_vocabulary = false;
  for (const char *const *v = tsr_op_names(); *v && !in_vocabulary; v++)
    in_vocabulary = !strcmp(op, *v);
  for (size_t i = 0; in_vocabulary && i < sizeof generated_ops / sizeof generated_ops[0]; i++)
    if (!strcmp(op, generated_ops[i])) return true;
  return false;
}

static cf_op_attrs op_attrs(const l2_shape *s) {
  return (cf_op_attrs){s->causal, s->moe.top_k, cf_moe_aux_scale(s->moe.E)};
}

/* Runs op; *out2 gets the second output of an op that has one (moe_router's stats), else NULL. */
static tsr_status run_op(tsr_tape_t *t, const char *op, const l2_shape *s, tsr_var **v,
                         tsr_var **out, tsr_var **out2) {
  *out2 = NULL;
  if (!strcmp(op, TSR_OP_MOE_ROUTER)) return tsr_op_moe_router(t, v[0], s->moe.top_k, out, out2);
  if (!strcmp(op, TSR_OP_MOE_EXPERTS)) return tsr_op_moe_experts(t, v[0], v[1], v[2], v[3], out);
  if (!strcmp(op, TSR_OP_MOE_AUX_LOSS))
    return tsr_op_moe_aux_loss(t, v[0], op_attrs(s).aux_scale, out);
  if (!strcmp(op, TSR_OP_LINEAR)) return tsr_op_linear(t, v[0], v[1], out);
  if (!strcmp(op, TSR_OP_EMBEDDING)) return tsr_op_embedding(t, v[0], v[1], out);
  if (!strcmp(op, TSR_OP_RMSNORM)) return tsr_op_rmsnorm(t, v[0], v[1], 1e-5f, out);
  if (!strcmp(op, TSR_OP_ROPE)) return tsr_op_rope(t, v[0], 10000.0f, out);
  if (!strcmp(op, TSR_OP_SDPA)) return tsr_op_sdpa(t, v[0], v[1], v[2], s->causal, out);
  if (!strcmp(op, TSR_OP_ROPE_DOC)) return tsr_op_rope_doc(t, v[0], v[1], 10000.0f, out);
  if (!strcmp(op, TSR_OP_SDPA_DOC)) return tsr_op_sdpa_doc(t, v[0], v[1], v[2], v[3], out);
  if (!strcmp(op, TSR_OP_ADD)) return tsr_op_add(t, v[0], v[1], out);
  if (!strcmp(op, TSR_OP_SWIGLU)) return tsr_op_swiglu(t, v[0], v[1], out);
  if (!strcmp(op, TSR_OP_CROSS_ENTROPY)) return tsr_op_cross_entropy(t, v[0], v[1], out);
  return TSR_ERROR(TSR_ENOTSUP, "the suite has no generator for op '%s'", op);
}

/* ---- One rank of an L2 case ---- */

typedef enum l2_kind { L2_OP = 0, L2_STYLE } l2_kind;

typedef struct l2_case {
  l2_kind kind;
  const char *dim;
  const char *op; /* the op run (a style's module maps to one) */
  const tsr_registry_t *reg;
  const tsr_op_rule *rule;       /* L2_OP */
  const tsr_module_style *style; /* L2_STYLE */
  l2_shape s;
  /* results, written by rank 0 */
  bool mismatch;
  char msg[CF_MSG];
} l2_case;

static char *pl_str(tsr_placement p, char *buf) {
  return (char *)tsr_placement_str(p, buf, 32);
}

/* The bounds an f32 result must meet against the float64 reference (docs/conformance.md): the
 * relative L2 error ||got - ref|| / ||ref|| and the largest error in units of the largest
 * reference value. On every case the suite runs for the in-tree plugins, the core's f32 ops and
 * the plugins' rules stay below 2.5e-7 and 5e-7 (TESSERA_CONFORM_ERRORS=1 prints each): a few
 * units of f32 rounding (2^-24 = 6e-8), as sums of up to 28 terms give. The bounds leave a factor
 * of 8 to other CPUs' summation orders; a systematic relative error of 1e-5 gives a relative L2
 * error of 1e-5 and fails by a factor of 5. */
#define L2_BOUND_REL_L2  2e-6
#define L2_BOUND_REL_MAX 4e-6

/* Holds `got` (the plugin's f32 result) and `dense` (the core's f32 op on replicated inputs)
 * against the float64 reference `ref` of n values. False with the reason in msg when the
 * plugin's misses a bound, or when the core's own does (then the suite is at fault, and says
 * so). */
static bool within_bounds(const tsr_tensor *got, const tsr_tensor *dense, const double *ref,
                          const unsigned char *defined, int64_t n, const char *what, char *msg,
                          size_t len) {
  if (tsr_tensor_numel(got) != n || tsr_tensor_numel(dense) != n || got->ndim != dense->ndim) {
    char sa[64], sb[64];
    snprintf(msg, len, "%s: shape %s, the dense reference's %s", what,
             tsr_shape_str(got->ndim, got->shape, sa, sizeof sa),
             tsr_shape_str(dense->ndim, dense->shape, sb, sizeof sb));
    return false;
  }
  cf_error eg, ed;
  cf_ref64_error(got, ref, defined, n, &eg);
  cf_ref64_error(dense, ref, defined, n, &ed);
  if (getenv("TESSERA_CONFORM_ERRORS")) /* for measuring the bounds (docs/conformance.md) */
    fprintf(stderr, "conform-error %s dense %.3g %.3g got %.3g %.3g n %lld skipped %lld\n", what,
            ed.rel_l2, ed.rel_max, eg.rel_l2, eg.rel_max, (long long)n, (long long)eg.skipped);
  if (!(ed.rel_l2 <= L2_BOUND_REL_L2 && ed.rel_max <= L2_BOUND_REL_MAX)) {
    snprintf(msg, len,
             "suite error: %s: the core's own f32 op is %.2g (relative L2) and %.2g (max) from "
             "the float64 reference, beyond the bounds %.0e and %.0e; element [%lld] = %.9g, "
             "float64 %.9g",
             what, ed.rel_l2, ed.rel_max, L2_BOUND_REL_L2, L2_BOUND_REL_MAX, (long long)ed.worst,
             ed.got, ed.want);
    return false;
  }
  if (eg.rel_l2 <= L2_BOUND_REL_L2 && eg.rel_max <= L2_BOUND_REL_MAX) return true;
  snprintf(msg, len,
           "%s: %s error %.2g against the float64 reference, beyond the bound %.0e that f32 "
           "rounding explains (relative L2 %.2g, max %.2g of the largest value; the core's f32 "
           "op: %.2g, %.2g); element [%lld] = %.9g, float64 %.9g",
           what, eg.rel_l2 > L2_BOUND_REL_L2 ? "relative L2" : "max",
           eg.rel_l2 > L2_BOUND_REL_L2 ? eg.rel_l2 : eg.rel_max,
           eg.rel_l2 > L2_BOUND_REL_L2 ? L2_BOUND_REL_L2 : L2_BOUND_REL_MAX, eg.rel_l2, eg.rel_max,
           ed.rel_l2, ed.rel_max, (long long)eg.worst, eg.got, eg.want);
  return false;
}

/* The forward and backward of one op on `mesh`, inputs placed by `pl` (one placement per input
 * on the mesh's single dim). Fills full output and full input gradients (NULL where none). */
typedef struct l2_run {
  tsr_tensor *out, *out2, *grads[TSR_MAX_OP_INPUTS]; /* out2: a second output, else NULL */
  tsr_placement out_pl, out2_pl, grad_pl[TSR_MAX_OP_INPUTS];
  bool has_grad[TSR_MAX_OP_INPUTS];
} l2_run;

/* The output gradients forward_backward draws, the same on every rank. */
#define L2_GOUT_SEED  77
#define L2_GOUT2_SEED 78

/* True for the inputs of a style's module that are its parameters, placed by the style's
 * "weight": the last input of linear, embedding and rmsnorm; both stacked expert weights (w13,
 * w2) of moe_experts. */
static bool module_param(const char *op, int i, int nin) {
  return !strcmp(op, TSR_OP_MOE_EXPERTS) ? i >= 2 : i == nin - 1;
}

static void run_free(l2_run *r) {
  tsr_tensor_free(r->out);
  tsr_tensor_free(r->out2);
  for (int i = 0; i < TSR_MAX_OP_INPUTS; i++) tsr_tensor_free(r->grads[i]);
  memset(r, 0, sizeof *r);
}

/* Keeps a rank tensor past its rank (a copy outside the rank's allocator). */
static tsr_tensor *keep(tsr_tensor *t) {
  tsr_tensor *c = NULL;
  if (t) tsr_tensor_cast(t, t->dtype, &c);
  tsr_tensor_free(t);
  return c;
}

static tsr_status forward_backward(tsr_rank_t *r, const tsr_mesh_t *m, const l2_case *c,
                                   tsr_tensor **full, int nin, const tsr_placement *pl,
                                   const tsr_module_style *style, l2_run *res) {
  tsr_tape_t *t = NULL;
  tsr_var *leaf[TSR_MAX_OP_INPUTS] = {0}, *in[TSR_MAX_OP_INPUTS] = {0}, *out = NULL, *out2 = NULL;
  tsr_dtensor *g = NULL, *g2 = NULL;
  tsr_tensor *gfull = NULL;
  tsr_status st = TSR_OK;
  memset(res, 0, sizeof *res);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  for (int i = 0; i < nin; i++) {
    /* a style places its parameters (module_param) directly, and moves activations to its
     * input placement with a recorded redistribute */
    bool param = style && module_param(c->op, i, nin);
    tsr_placement here = style && !param ? tsr_replicate() : pl[i], rep = tsr_replicate();
    /* from Replicate through the registry, so that a plugin's own layout of a placement (a
     * zigzag sequence shard) is what the op sees */
    tsr_dtensor *d0, *d;
    TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, full[i], &rep, &d0), st);
    st = tsr_dtensor_redistribute(r, d0, m, &here, &d);
    tsr_dtensor_free(d0);
    TSR_CHECK_GOTO(st, st);
    TSR_CHECK_GOTO(tsr_var_new_leaf(d, full[i]->dtype == TSR_F32, NULL, &leaf[i]), st);
    in[i] = leaf[i];
    if (style && !param) TSR_CHECK_GOTO(tsr_op_redistribute(t, leaf[i], m, &pl[i], &in[i]), st);
  }
  TSR_CHECK_GOTO(run_op(t, c->op, &c->s, in, &out, &out2), st);
  if (style) TSR_CHECK_GOTO(tsr_op_redistribute(t, out, m, &style->output, &out), st);
  res->out_pl = out->value->placements[0];
  TSR_CHECK_GOTO(tsr_dtensor_full_tensor(r, out->value, &res->out), st);
  res->out = keep(res->out);
  tsr_placement rep = tsr_replicate();
  if (out2) {
    /* both outputs get a gradient, as the model's router has (combine, and stats through the
     * aux loss): the second one is seeded before backward runs from the first */
    res->out2_pl = out2->value->placements[0];
    TSR_CHECK_GOTO(tsr_dtensor_full_tensor(r, out2->value, &res->out2), st);
    res->out2 = keep(res->out2);
    TSR_CHECK_GOTO(cf_rand_tensor(out2->value->ndim, out2->value->shape, L2_GOUT2_SEED, &gfull),
                   st);
    TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, gfull, &rep, &g2), st);
    tsr_tensor_free(gfull);
    gfull = NULL;
    st = tsr_var_accumulate_grad(t, out2, g2);
    g2 = NULL;
    TSR_CHECK_GOTO(st, st);
  }
  TSR_CHECK_GOTO(cf_rand_tensor(out->value->ndim, out->value->shape, L2_GOUT_SEED, &gfull), st);
  TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, gfull, &rep, &g), st);
  st = tsr_tape_backward_with(t, out, g);
  g = NULL;
  TSR_CHECK_GOTO(st, st);
  for (int i = 0; i < nin; i++) {
    if (!leaf[i]->requires_grad || !leaf[i]->grad) continue;
    res->has_grad[i] = true;
    res->grad_pl[i] = leaf[i]->grad->placements[0];
    if (style) TSR_CHECK_GOTO(tsr_var_resolve_grad(t, leaf[i]), st);
    TSR_CHECK_GOTO(tsr_dtensor_full_tensor(r, leaf[i]->grad, &res->grads[i]), st);
    res->grads[i] = keep(res->grads[i]);
  }
cleanup:
  tsr_tensor_free(gfull);
  tsr_dtensor_free(g);
  tsr_dtensor_free(g2);
  tsr_tape_free(t);
  for (int i = 0; i < nin; i++) tsr_var_free(leaf[i]);
  if (st != TSR_OK) run_free(res);
  return st;
}

/* The plugin's transitions on the case's dim that take part in moving a tensor like `full`
 * between Replicate and `p`, both ways: their names and steps into buf. */
static void transitions_for(const l2_case *c, const tsr_mesh_t *m, const tsr_tensor *full,
                            tsr_placement p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  tsr_dtensor meta = {.mesh = m, .ndim = full->ndim, .dtype = full->dtype};
  memcpy(meta.shape, full->shape, sizeof meta.shape);
  tsr_placement rep = tsr_replicate();
  for (int k = 0; k < tsr_registry_redistribute_count(c->reg); k++) {
    const tsr_redistribute_rule *t = tsr_registry_redistribute_at(c->reg, k);
    if (t->mesh_dim && strcmp(tsr_mesh_canonical_name(t->mesh_dim), c->dim)) continue;
    for (int dir = 0; dir < 2 && o < len; dir++) {
      tsr_placement a = dir ? p : rep, b = dir ? rep : p;
      char sa[32], sb[32];
      meta.placements[0] = a;
      if (t->match(&meta, 0, a, b, t->ctx))
        o += (size_t)snprintf(buf + o, len - o, "%s'%s' (%s -> %s on %s)", o ? ", " : "", t->name,
                              pl_str(a, sa), pl_str(b, sb), c->dim);
    }
  }
}

/* Moves `full` Replicate -> p -> Replicate through the registry (collective) and sets *bad on
 * every rank when that changes the values; rank 0 reports the transitions that took part, before
 * any op runs on the moved tensor, so that the move is not taken for the op's mismatch. */
static tsr_status check_move(tsr_rank_t *r, const tsr_mesh_t *m, l2_case *c, const tsr_tensor *full,
                             tsr_placement p, const char *what, bool me0, bool *bad) {
  if (p.kind == TSR_REPLICATE || *bad) return TSR_OK;
  tsr_placement rep = tsr_replicate();
  tsr_dtensor *x0 = NULL, *x1 = NULL;
  tsr_tensor *back = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, full, &rep, &x0), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, x0, m, &p, &x1), st);
  TSR_CHECK_GOTO(tsr_dtensor_full_tensor(r, x1, &back), st);
  /* every rank holds the same `full` and gathered `back`, so every rank decides alike */
  *bad = !tsr_tensor_equal(back, full);
  if (me0 && *bad) {
    char names[512], sp[32], shape[64];
    transitions_for(c, m, full, p, names, sizeof names);
    c->mismatch = true;
    if (names[0])
      snprintf(c->msg, sizeof c->msg,
               "the transition that moves %s (shape %s) to %s is wrong, not the op: R -> %s -> R "
               "changes its values, and the plugin's transitions %s take part (see "
               "L2.redistribute); the op was not checked",
               what, tsr_shape_str(full->ndim, full->shape, shape, sizeof shape), pl_str(p, sp),
               pl_str(p, sp), names);
    else
      snprintf(c->msg, sizeof c->msg,
               "moving %s (shape %s) R -> %s -> R through the registry changes its values, with "
               "none of the plugin's transitions taking part; the op was not checked",
               what, tsr_shape_str(full->ndim, full->shape, shape, sizeof shape), pl_str(p, sp));
  }
cleanup:
  tsr_tensor_free(back);
  tsr_dtensor_free(x0);
  tsr_dtensor_free(x1);
  return st;
}

static tsr_status l2_rank(tsr_comm_t *comm, void *arg) {
  l2_case *c = arg;
  tsr_rank_t *r = NULL, *dense = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tensor *full[TSR_MAX_OP_INPUTS] = {0};
  l2_run got = {0}, want = {0};
  cf_ref64 ref = {0};
  tsr_tensor *gout = NULL, *gout2 = NULL;
  int nin = 0;
  bool me0 = tsr_comm_rank(comm) == 0;
  tsr_status st = TSR_OK;
  int n = tsr_comm_world(comm);
  const char *names[1] = {c->dim};
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  cf_rank_watch(r); /* its allocator is checked when the rank is freed (cf_rank_leftover) */
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &dense), st);
  TSR_CHECK_GOTO(tsr_mesh_init(n, 1, &n, names, &m), st);
  TSR_CHECK_GOTO(op_inputs(c->op, &c->s, full, &nin), st);
  tsr_placement pl[TSR_MAX_OP_INPUTS], rep[TSR_MAX_OP_INPUTS];
  for (int i = 0; i < nin; i++) {
    rep[i] = tsr_replicate();
    if (c->kind == L2_OP)
      pl[i] = c->rule->any_input & (1u << i) ? tsr_replicate() : c->rule->inputs[i];
    else if (module_param(c->op, i, nin))
      pl[i] = tsr_module_style_param(c->style, "weight");
    else
      pl[i] = c->style->input;
  }
  if (c->kind == L2_OP && c->rule->ninputs != nin) {
    if (me0) {
      c->mismatch = true;
      snprintf(c->msg, sizeof c->msg, "rule declares %d inputs; op '%s' takes %d", c->rule->ninputs,
               c->op, nin);
    }
    goto cleanup;
  }
  /* the inputs' moves first: a wrong transition is named as such */
  bool moved_bad = false;
  for (int i = 0; i < nin; i++) {
    char what[32];
    snprintf(what, sizeof what, "input %d", i);
    TSR_CHECK_GOTO(check_move(r, m, c, full[i], pl[i], what, me0, &moved_bad), st);
  }
  if (moved_bad) goto cleanup;
  TSR_CHECK_GOTO(forward_backward(dense, m, c, full, nin, rep, NULL, &want), st);
  st = forward_backward(r, m, c, full, nin, pl, c->kind == L2_STYLE ? c->style : NULL, &got);
  if (st != TSR_OK) goto cleanup;
  if (!me0) goto cleanup;
  char a[32], b[32], what[64];
  bool checks_pl = c->kind == L2_OP && n > 1 && !c->rule->use_mask;
  if (checks_pl && !tsr_placement_equal(got.out_pl, c->rule->outputs[0])) {
    c->mismatch = true;
    snprintf(c->msg, sizeof c->msg, "output placed %s on '%s'; the rule says %s",
             pl_str(got.out_pl, a), c->dim, pl_str(c->rule->outputs[0], b));
    goto cleanup;
  }
  if (c->kind == L2_STYLE && n > 1 && !tsr_placement_equal(got.out_pl, c->style->output)) {
    c->mismatch = true;
    snprintf(c->msg, sizeof c->msg, "module output placed %s; the style says %s",
             pl_str(got.out_pl, a), pl_str(c->style->output, b));
    goto cleanup;
  }
  /* the float64 reference, for the output gradients forward_backward drew */
  TSR_CHECK_GOTO(cf_rand_tensor(want.out->ndim, want.out->shape, L2_GOUT_SEED, &gout), st);
  if (want.out2)
    TSR_CHECK_GOTO(cf_rand_tensor(want.out2->ndim, want.out2->shape, L2_GOUT2_SEED, &gout2), st);
  cf_op_attrs attrs = op_attrs(&c->s);
  TSR_CHECK_GOTO(cf_ref64_run(c->op, full, nin, &attrs, gout, gout2, &ref), st);
  if (!within_bounds(got.out, want.out, ref.out, NULL, ref.nout, "forward output", c->msg,
                     sizeof c->msg)) {
    c->mismatch = true;
    goto cleanup;
  }
  if (want.out2 && ref.out2) {
    /* a rule that declares one output leaves the second to the core, which replicates it */
    tsr_placement want2 =
        c->kind == L2_OP && c->rule->noutputs > 1 ? c->rule->outputs[1] : tsr_replicate();
    if (!got.out2) {
      c->mismatch = true;
      snprintf(c->msg, sizeof c->msg, "the op gave no second output");
      goto cleanup;
    }
    if (checks_pl && !tsr_placement_equal(got.out2_pl, want2)) {
      c->mismatch = true;
      snprintf(c->msg, sizeof c->msg, "output 1 placed %s on '%s'; the rule says %s",
               pl_str(got.out2_pl, a), c->dim, pl_str(want2, b));
      goto cleanup;
    }
    if (!within_bounds(got.out2, want.out2, ref.out2, NULL, ref.nout2, "forward output 1", c->msg,
                       sizeof c->msg)) {
      c->mismatch = true;
      goto cleanup;
    }
  }
  for (int i = 0; i < nin; i++) {
    if (!want.has_grad[i] || !ref.has_grad[i]) continue;
    snprintf(what, sizeof what, "gradient of input %d", i);
    if (!got.has_grad[i]) {
      c->mismatch = true;
      snprintf(c->msg, sizeof c->msg, "backward gave input %d no gradient", i);
      goto cleanup;
    }
    if (checks_pl && !tsr_placement_equal(got.grad_pl[i], c->rule->grads[i])) {
      c->mismatch = true;
      snprintf(c->msg, sizeof c->msg, "gradient of input %d placed %s; the rule says %s", i,
               pl_str(got.grad_pl[i], a), pl_str(c->rule->grads[i], b));
      goto cleanup;
    }
    if (!within_bounds(got.grads[i], want.grads[i], ref.grads[i], ref.defined[i], ref.ngrad[i],
                       what, c->msg, sizeof c->msg)) {
      c->mismatch = true;
      goto cleanup;
    }
  }
cleanup:
  cf_ref64_free(&ref);
  tsr_tensor_free(gout);
  tsr_tensor_free(gout2);
  run_free(&got);
  run_free(&want);
  for (int i = 0; i < TSR_MAX_OP_INPUTS; i++) tsr_tensor_free(full[i]);
  tsr_mesh_free(m);
  tsr_rank_free(dense);
  tsr_rank_free(r);
  return st;
}

/* A refusal is EINVAL or ENOTSUP with a message beyond the launcher's "rank R: " prefix. */
static bool refusal(tsr_status st) {
  const char *e = tsr_last_error();
  int skip = 0;
  if (sscanf(e, "rank %*d: %n", &skip) == 0 && skip > 0) e += skip;
  return (st == TSR_EINVAL || st == TSR_ENOTSUP) && e[0];
}

/* Runs the case over the shape variants and grades it. */
static cf_result run_shapes(l2_case *c, int n, char *msg, size_t len) {
  int computed = 0, refused = 0;
  char why[CF_MSG] = "";
  l2_shape s;
  for (int sv = 0; l2_shapes(c->op, n, sv, &s); sv++) {
    c->s = s;
    c->mismatch = false;
    c->msg[0] = '\0';
    tsr_status st = tsr_local_launch(n, L2_TIMEOUT_S, l2_rank, c);
    char shape[160];
    const cf_moe_shape *mo = &s.moe;
    if (cf_moe_op(c->op))
      snprintf(shape, sizeof shape, "B=%lld L=%lld C=%lld E=%lld I=%lld top_k=%d%s",
               (long long)mo->B, (long long)mo->L, (long long)mo->C, (long long)mo->E,
               (long long)mo->I, mo->top_k,
               mo->starved ? ", the last experts chosen by no token" : "");
    else
      snprintf(shape, sizeof shape, "B=%lld L=%lld C=%lld OC=%lld V=%lld H=%lld Hkv=%lld%s",
               (long long)s.B, (long long)s.L, (long long)s.C, (long long)s.OC, (long long)s.V,
               (long long)s.H, (long long)s.HKV, s.causal ? "" : " non-causal");
    if (st == TSR_OK && c->mismatch)
      return cf_say(msg, len, CF_FAIL, "%s=%d, %s: %s", c->dim, n, shape, c->msg);
    if (st == TSR_OK) {
      computed++;
      char what[400], why2[CF_MSG];
      snprintf(what, sizeof what, "%s %s, forward and backward on %s=%d, %s",
               c->kind == L2_OP ? "op rule" : "module style",
               c->kind == L2_OP ? c->rule->name : c->style->style, c->dim, n, shape);
      if (!cf_no_leak(l2_rank, c, n, L2_TIMEOUT_S, what, why2, sizeof why2))
        return cf_say(msg, len, CF_FAIL, "%s", why2);
    } else if (refusal(st)) {
      if (!refused++) snprintf(why, sizeof why, "%s: %s", shape, tsr_last_error());
    } else {
      return cf_say(msg, len, CF_FAIL, "%s=%d, %s: %s: %s", c->dim, n, shape, tsr_status_name(st),
                    tsr_last_error());
    }
  }
  if (!computed)
    return cf_say(msg, len, CF_NOTSUP, "refuses every shape tried on %s=%d; first: %s", c->dim, n,
                  why);
  if (refused)
    return cf_say(msg, len, CF_PASS, "%d shapes match, %d refused (%s)", computed, refused, why);
  return cf_say(msg, len, CF_PASS, "%d shapes match", computed);
}

static cf_result op_body(const cf_plugin *p, const cf_test *t, const void *found,
                         const tsr_registry_t *reg, char *msg, size_t len) {
  const cf_item *it = &p->items[t->item];
  const tsr_op_rule *rule = found;
  l2_case c = {.kind = L2_OP, .dim = it->dim, .op = rule->op, .reg = reg, .rule = rule};
  if (!op_known(rule->op))
    return cf_say(msg, len, CF_NOTSUP, "the suite has no generator for op '%s'", rule->op);
  return run_shapes(&c, t->n, msg, len);
}

cf_result cf_op_rule_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  return cf_over_variants(p, t, t->n, op_body, msg, len);
}

/* The op that is a style's module, its parameters those of module_param; NULL for a style of
 * the vocabulary the suite has no module for (the test is then NOTSUP). */
static const char *style_op(const char *style) {
  static const char *const map[][2] = {
      {TSR_STYLE_COLUMN_LINEAR, TSR_OP_LINEAR}, {TSR_STYLE_ROW_LINEAR, TSR_OP_LINEAR},
      {TSR_STYLE_KV_LINEAR, TSR_OP_LINEAR},     {TSR_STYLE_EMBEDDING, TSR_OP_EMBEDDING},
      {TSR_STYLE_RMSNORM, TSR_OP_RMSNORM},      {TSR_STYLE_EXPERTS, TSR_OP_MOE_EXPERTS}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(map[i][0], style)) return map[i][1];
  return NULL;
}

static cf_result style_body(const cf_plugin *p, const cf_test *t, const void *found,
                            const tsr_registry_t *reg, char *msg, size_t len) {
  const cf_item *it = &p->items[t->item];
  const char *op = style_op(it->name);
  l2_case c = {.kind = L2_STYLE, .dim = it->dim, .op = op, .reg = reg, .style = found};
  return run_shapes(&c, t->n, msg, len);
}

cf_result cf_style_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  const cf_item *it = &p->items[t->item];
  if (!style_op(it->name))
    return cf_say(msg, len, CF_NOTSUP,
                  "style '%s' is not one op's module the suite runs alone (a block style); the "
                  "model applies it at L3",
                  it->name);
  return cf_over_variants(p, t, t->n, style_body, msg, len);
}

/* ---- Redistribute transitions ---- */

typedef struct l2_redist {
  const tsr_redistribute_rule *rule;
  const tsr_registry_t *reg;
  const char *dim;
  int64_t shape[3];
  int matched;
  bool bad;
  char msg[CF_MSG];
} l2_redist;

/* x's global values through R -> a -> b -> R (rules apply where they match). */
static tsr_status roundtrip(tsr_rank_t *r, const tsr_mesh_t *m, const tsr_tensor *full,
                            tsr_placement a, tsr_placement b, tsr_tensor **out,
                            tsr_placement *b_got) {
  tsr_placement rep = tsr_replicate();
  tsr_dtensor *x0 = NULL, *x1 = NULL, *x2 = NULL, *x3 = NULL;
  tsr_status st = TSR_OK;
  *out = NULL;
  TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, full, &rep, &x0), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, x0, m, &a, &x1), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, x1, m, &b, &x2), st);
  *b_got = x2->placements[0];
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, x2, m, &rep, &x3), st);
  *out = keep(x3->local);
  x3->local = NULL;
cleanup:
  tsr_dtensor_free(x0);
  tsr_dtensor_free(x1);
  tsr_dtensor_free(x2);
  tsr_dtensor_free(x3);
  return st;
}

/* The adjoint of a -> b applied to a gradient of global value `full` placed b (Partial read as
 * Replicate), brought back to Replicate. */
static tsr_status adjoint(tsr_rank_t *r, const tsr_mesh_t *m, const tsr_tensor *full,
                          tsr_placement a, tsr_placement b, tsr_tensor **out) {
  tsr_placement rep = tsr_replicate(), bg = b.kind == TSR_PARTIAL ? rep : b;
  tsr_dtensor *g0 = NULL, *g1 = NULL, *g2 = NULL, *g3 = NULL;
  tsr_status st = TSR_OK;
  *out = NULL;
  TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, full, &rep, &g0), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, g0, m, &bg, &g1), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute_adjoint(r, g1, m, &a, &g2), st);
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, g2, m, &rep, &g3), st);
  *out = keep(g3->local);
  g3->local = NULL;
cleanup:
  tsr_dtensor_free(g0);
  tsr_dtensor_free(g1);
  tsr_dtensor_free(g2);
  tsr_dtensor_free(g3);
  return st;
}

static tsr_status redist_rank(tsr_comm_t *comm, void *arg) {
  l2_redist *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tensor *full = NULL, *back = NULL;
  int n = tsr_comm_world(comm);
  bool me0 = tsr_comm_rank(comm) == 0;
  const char *names[1] = {c->dim};
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  cf_rank_watch(r); /* its allocator is checked when the rank is freed (cf_rank_leftover) */
  TSR_CHECK_GOTO(tsr_mesh_init(n, 1, &n, names, &m), st);
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 3, c->shape, &full), st);
  tsr_tensor_fill_arange(full, 1.0, -20.0); /* integers: every path must be exact */
  tsr_placement all[5] = {tsr_replicate(), tsr_shard(0), tsr_shard(1), tsr_shard(2),
                          tsr_partial(TSR_REDUCE_SUM)};
  tsr_dtensor meta = {.mesh = m, .ndim = 3, .dtype = TSR_F32};
  memcpy(meta.shape, c->shape, sizeof c->shape);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 5; j++) {
      if (i == j) continue;
      meta.placements[0] = all[i];
      if (!c->rule->match(&meta, 0, all[i], all[j], c->rule->ctx)) continue;
      if (me0) c->matched++;
      char a[32], b[32];
      tsr_placement got;
      TSR_CHECK_GOTO(roundtrip(r, m, full, all[i], all[j], &back, &got), st);
      bool same = tsr_tensor_equal(back, full);
      tsr_tensor_free(back);
      back = NULL;
      if (!tsr_placement_equal(got, all[j]) && me0 && !c->bad) {
        c->bad = true;
        snprintf(c->msg, sizeof c->msg, "transition '%s' (%s -> %s on %s) gave placement %s",
                 c->rule->name, pl_str(all[i], a), pl_str(all[j], b), c->dim, pl_str(got, a));
      }
      if (!same && me0 && !c->bad) {
        c->bad = true;
        char path[96];
        if (all[i].kind == TSR_REPLICATE)
          snprintf(path, sizeof path, "R -> %s -> R", pl_str(all[j], b));
        else
          snprintf(path, sizeof path, "R -> %s -> %s -> R", pl_str(all[i], a), pl_str(all[j], b));
        snprintf(c->msg, sizeof c->msg,
                 "transition '%s' (%s -> %s on %s): %s does not give the tensor back (global "
                 "values changed)",
                 c->rule->name, pl_str(all[i], a), pl_str(all[j], b), c->dim, path);
      }
      TSR_CHECK_GOTO(adjoint(r, m, full, all[i], all[j], &back), st);
      same = tsr_tensor_equal(back, full);
      tsr_tensor_free(back);
      back = NULL;
      if (!same && me0 && !c->bad) {
        c->bad = true;
        snprintf(c->msg, sizeof c->msg,
                 "transition '%s' (%s -> %s on %s): its adjoint changes the gradient's global "
                 "values",
                 c->rule->name, pl_str(all[i], a), pl_str(all[j], b), c->dim);
      }
    }
cleanup:
  tsr_tensor_free(back);
  tsr_tensor_free(full);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static cf_result redist_body(const cf_plugin *p, const cf_test *t, const void *found,
                             const tsr_registry_t *reg, char *msg, size_t len) {
  const cf_item *it = &p->items[t->item];
  const tsr_redistribute_rule *rule = found;
  int n = t->n, computed = 0, matched = 0;
  const int64_t shapes[2][3] = {{7, 7, 11}, {2 * n, 4 * n, 2 * n}};
  char why[CF_MSG] = "";
  cf_result res = CF_PASS;
  for (int sv = 0; sv < 2 && res == CF_PASS; sv++) {
    l2_redist c = {.rule = rule, .reg = reg, .dim = it->dim};
    memcpy(c.shape, shapes[sv], sizeof c.shape);
    tsr_status st = tsr_local_launch(n, L2_TIMEOUT_S, redist_rank, &c);
    matched += c.matched;
    char what[400], why2[CF_MSG];
    snprintf(what, sizeof what, "transition %s, each placement pair both ways on %s=%d", rule->name,
             it->dim, n);
    if (st == TSR_OK && !c.bad && c.matched &&
        !cf_no_leak(redist_rank, &c, n, L2_TIMEOUT_S, what, why2, sizeof why2))
      return cf_say(msg, len, CF_FAIL, "%s", why2);
    if (st == TSR_OK && c.bad)
      res = cf_say(msg, len, CF_FAIL, "%s=%d, shape [%lld, %lld, %lld]: %s", it->dim, n,
                   (long long)c.shape[0], (long long)c.shape[1], (long long)c.shape[2], c.msg);
    else if (st == TSR_OK)
      computed++;
    else if (refusal(st) && !why[0])
      snprintf(why, sizeof why, "%s", tsr_last_error());
    else if (!refusal(st))
      res = cf_say(msg, len, CF_FAIL, "%s=%d: %s: %s", it->dim, n, tsr_status_name(st),
                   tsr_last_error());
  }
  if (res == CF_PASS && !matched)
    res = cf_say(msg, len, CF_NOTSUP, "match() accepts no placement pair of R, S(0..2), P(sum)");
  else if (res == CF_PASS && !computed)
    res = cf_say(msg, len, CF_NOTSUP, "refuses every shape tried: %s", why);
  else if (res == CF_PASS)
    res = cf_say(msg, len, CF_PASS, "%d placement pairs exact both ways%s%s", matched,
                 why[0] ? "; refused: " : "", why);
  return res;
}

cf_result cf_redistribute_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  return cf_over_variants(p, t, t->n, redist_body, msg, len);
}
