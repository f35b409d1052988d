/* DTensor ops through the tape: every op's backward against central finite differences of
 * <out, W> for random W, the whole Llama model's gradient the same way, tied embeddings, and the
 * errors of op planning. One rank: the parallel plans are the strategies' tests. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "llama.h"
#include "tessera/ops.h"

#define MAX_IN 4

/* Deterministic values in [-1, 1). */
static float rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

typedef struct op_case {
  const char *name;
  int nin;
  int ndim[MAX_IN];
  int64_t shape[MAX_IN][4];
  tsr_dtype dtype[MAX_IN];
  bool grad[MAX_IN];
  tsr_status (*forward)(tsr_tape_t *t, tsr_var **in, tsr_var **out);
  int vocab;   /* range of generated i32 inputs: ids as input 0, labels after */
  int checked; /* elements compared */
  char failure[512];
} op_case;

static tsr_mesh_t *one_rank_mesh(void) {
  int shape[2] = {1, 1};
  const char *names[2] = {"dp", "tp"};
  tsr_mesh_t *m = NULL;
  tsr_mesh_init(1, 2, shape, names, &m);
  return m;
}

/* f32 inputs get values in [-1, 1); i32 inputs ids in [0, vocab), and when `labels` every 5th
 * set to -100 to exercise the ignore index. */
static tsr_status make_var(tsr_rank_t *r, const tsr_mesh_t *m, int ndim, const int64_t *shape,
                           tsr_dtype dt, bool grad, uint64_t *seed, int vocab, bool labels,
                           tsr_var **out) {
  tsr_tensor *full;
  TSR_CHECK(tsr_tensor_new(NULL, dt, ndim, shape, &full));
  int64_t n = tsr_tensor_numel(full);
  for (int64_t i = 0; i < n; i++) {
    if (dt == TSR_I32) {
      int32_t v = (int32_t)((i * 7 + 3) % vocab);
      ((int32_t *)tsr_tensor_data(full))[i] = labels && i % 5 == 4 ? -100 : v;
    } else {
      ((float *)tsr_tensor_data(full))[i] = rnd(seed);
    }
  }
  tsr_placement rep[2] = {tsr_replicate(), tsr_replicate()};
  tsr_dtensor *d;
  tsr_status st = tsr_dtensor_distribute(r, m, full, rep, &d);
  tsr_tensor_free(full);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, grad, NULL, out);
}

/* <out, W> in double. */
static double weighted(const tsr_var *out, const float *w) {
  const float *o = tsr_tensor_data(out->value->local);
  double s = 0;
  for (int64_t i = 0, n = tsr_tensor_numel(out->value->local); i < n; i++) s += (double)o[i] * w[i];
  return s;
}

static tsr_status eval(tsr_rank_t *r, op_case *c, tsr_var **in, const float *w, double *value) {
  tsr_tape_t *t;
  TSR_CHECK(tsr_tape_new(r, &t));
  tsr_tape_set_recording(t, false);
  tsr_var *out;
  tsr_status st = c->forward(t, in, &out);
  if (st == TSR_OK) *value = weighted(out, w);
  tsr_tape_free(t);
  return st;
}

static tsr_status run_case(tsr_comm_t *comm, void *arg) {
  op_case *c = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_mesh_t *m = one_rank_mesh();
  uint64_t seed = 42;
  tsr_var *in[MAX_IN] = {0};
  tsr_tape_t *t = NULL;
  float *w = NULL;
  tsr_status st = TSR_OK;
  for (int i = 0; i < c->nin; i++)
    TSR_CHECK_GOTO(make_var(r, m, c->ndim[i], c->shape[i], c->dtype[i], c->grad[i], &seed, c->vocab,
                            i > 0, &in[i]),
                   st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_var *out;
  TSR_CHECK_GOTO(c->forward(t, in, &out), st);
  int64_t n = tsr_tensor_numel(out->value->local);
  w = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) w[i] = rnd(&seed);
  tsr_dtensor *g;
  TSR_CHECK_GOTO(tsr_dtensor_clone(r, out->value, &g), st);
  memcpy(tsr_tensor_data(g->local), w, sizeof(float) * (size_t)n);
  TSR_CHECK_GOTO(tsr_tape_backward_with(t, out, g), st);
  for (int i = 0; i < c->nin; i++) {
    if (!c->grad[i]) continue;
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, in[i]), st);
    float *x = tsr_tensor_data(in[i]->value->local);
    const float *ga = tsr_tensor_data(in[i]->grad->local);
    int64_t ne = tsr_tensor_numel(in[i]->value->local), stride = ne > 40 ? ne / 37 : 1;
    for (int64_t e = 0; e < ne; e += stride) {
      const float h = 1e-3f, keep = x[e];
      double up, down;
      x[e] = keep + h;
      TSR_CHECK_GOTO(eval(r, c, in, w, &up), st);
      x[e] = keep - h;
      TSR_CHECK_GOTO(eval(r, c, in, w, &down), st);
      x[e] = keep;
      double num = (up - down) / (2.0 * h), ana = ga[e];
      c->checked++;
      if (fabs(ana - num) > 1e-2 * fmax(fabs(ana), fabs(num)) + 1e-3 && !c->failure[0])
        snprintf(c->failure, sizeof c->failure,
                 "%s: input %d element %lld: analytic %.6g, numeric %.6g", c->name, i, (long long)e,
                 ana, num);
    }
  }
cleanup:
  free(w);
  tsr_tape_free(t);
  for (int i = 0; i < c->nin; i++) tsr_var_free(in[i]);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void check_case(op_case *c) {
  if (tsr_local_launch(1, 30.0, run_case, c) != TSR_OK)
    fail_msg("%s: %s", c->name, tsr_last_error());
  if (c->failure[0]) fail_msg("%s", c->failure);
  assert_true(c->checked > 0);
}

/* ---- the ops ---- */

static tsr_status f_linear(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_linear(t, in[0], in[1], out);
}
static tsr_status f_rmsnorm(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_rmsnorm(t, in[0], in[1], 1e-5f, out);
}
static tsr_status f_embedding(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_embedding(t, in[0], in[1], out);
}
static tsr_status f_rope(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_rope(t, in[0], 10000.0f, out);
}
static tsr_status f_sdpa(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_sdpa(t, in[0], in[1], in[2], true, out);
}
static tsr_status f_swiglu(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_swiglu(t, in[0], in[1], out);
}
static tsr_status f_add_twice(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  /* a used twice: its gradient must be the sum of both paths */
  tsr_var *s;
  TSR_CHECK(tsr_op_add(t, in[0], in[1], &s));
  return tsr_op_add(t, s, in[0], out);
}
static tsr_status f_view(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  tsr_var *v, *y;
  int64_t shape[4] = {2, 3, 2, 4};
  TSR_CHECK(tsr_op_view(t, in[0], 4, shape, &v));
  TSR_CHECK(tsr_op_rope(t, v, 100.0f, &y)); /* so the view's backward sees a non-trivial grad */
  return tsr_op_view(t, y, 3, in[0]->value->shape, out);
}
static tsr_status f_cross_entropy(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  return tsr_op_cross_entropy(t, in[0], in[1], out);
}
/* router and experts as the model runs them: the routing follows from differentiable logits
 * (a combine weight that is 0 is "not routed", which has no derivative of its own) */
static tsr_status f_moe(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  tsr_var *logits, *combine, *stats;
  TSR_CHECK(tsr_op_linear(t, in[0], in[1], &logits));
  TSR_CHECK(tsr_op_moe_router(t, logits, 2, &combine, &stats));
  return tsr_op_moe_experts(t, in[0], combine, in[2], in[3], out);
}
/* the load-balancing loss of two blocks' stats: only router probabilities carry gradient */
static tsr_status f_moe_aux(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  tsr_var *l0, *l1, *c0, *c1, *s0, *s1, *s;
  TSR_CHECK(tsr_op_linear(t, in[0], in[1], &l0));
  TSR_CHECK(tsr_op_linear(t, in[0], in[2], &l1));
  TSR_CHECK(tsr_op_moe_router(t, l0, 2, &c0, &s0));
  TSR_CHECK(tsr_op_moe_router(t, l1, 1, &c1, &s1));
  TSR_CHECK(tsr_op_add(t, s0, s1, &s));
  return tsr_op_moe_aux_loss(t, s, 0.7f, out);
}
static tsr_status f_redistribute(tsr_tape_t *t, tsr_var **in, tsr_var **out) {
  tsr_placement p[2] = {tsr_replicate(), tsr_replicate()};
  tsr_var *y;
  TSR_CHECK(tsr_op_redistribute(t, in[0], in[0]->value->mesh, p, &y));
  return tsr_op_swiglu(t, y, y, out);
}

static void test_linear(void **s) {
  op_case c = {"linear", 2, {3, 2}, {{2, 3, 5}, {4, 5}}, {TSR_F32, TSR_F32}, {true, true}, f_linear,
               0,        0, {0}};
  check_case(&c);
}
static void test_rmsnorm(void **s) {
  op_case c = {"rmsnorm", 2, {3, 1}, {{2, 3, 8}, {8}}, {TSR_F32, TSR_F32}, {true, true}, f_rmsnorm,
               0,         0, {0}};
  check_case(&c);
}
static void test_embedding(void **s) {
  op_case c = {
      "embedding", 2, {2, 2}, {{2, 5}, {7, 4}}, {TSR_I32, TSR_F32}, {false, true}, f_embedding,
      7,           0, {0}};
  check_case(&c);
}
static void test_rope(void **s) {
  op_case c = {"rope", 1, {4}, {{2, 5, 3, 4}}, {TSR_F32}, {true}, f_rope, 0, 0, {0}};
  check_case(&c);
}
static void test_sdpa_gqa(void **s) {
  op_case c = {"sdpa",
               3,
               {4, 4, 4},
               {{2, 6, 4, 4}, {2, 6, 2, 4}, {2, 6, 2, 4}},
               {TSR_F32, TSR_F32, TSR_F32},
               {true, true, true},
               f_sdpa,
               0,
               0,
               {0}};
  check_case(&c);
}
static void test_swiglu(void **s) {
  op_case c = {"swiglu", 2, {2, 2}, {{3, 7}, {3, 7}}, {TSR_F32, TSR_F32}, {true, true}, f_swiglu,
               0,        0, {0}};
  check_case(&c);
}
static void test_add_accumulates(void **s) {
  op_case c = {"add", 2, {2, 2}, {{3, 4}, {3, 4}}, {TSR_F32, TSR_F32}, {true, true}, f_add_twice,
               0,     0, {0}};
  check_case(&c);
}
static void test_view(void **s) {
  op_case c = {"view", 1, {3}, {{2, 3, 8}}, {TSR_F32}, {true}, f_view, 0, 0, {0}};
  check_case(&c);
}
static void test_cross_entropy(void **s) {
  op_case c = {"cross_entropy",
               2,
               {3, 2},
               {{2, 5, 11}, {2, 5}},
               {TSR_F32, TSR_I32},
               {true, false},
               f_cross_entropy,
               11,
               0,
               {0}};
  check_case(&c);
}
static void test_redistribute_op(void **s) {
  op_case c = {"redistribute", 1, {2}, {{3, 5}}, {TSR_F32}, {true}, f_redistribute, 0, 0, {0}};
  check_case(&c);
}

static void test_moe_router_experts(void **s) {
  /* x (B, L, C), gate (E, C), w13 (E, 2F, C), w2 (E, C, F): E 4, top-2, C 5, F 3 */
  op_case c = {"moe",
               4,
               {3, 2, 3, 3},
               {{2, 3, 5}, {4, 5}, {4, 6, 5}, {4, 5, 3}},
               {TSR_F32, TSR_F32, TSR_F32, TSR_F32},
               {true, true, true, true},
               f_moe,
               0,
               0,
               {0}};
  check_case(&c);
}
static void test_moe_aux_loss(void **s) {
  op_case c = {"moe_aux_loss",
               3,
               {3, 2, 2},
               {{2, 4, 5}, {4, 5}, {4, 5}},
               {TSR_F32, TSR_F32, TSR_F32},
               {true, true, true},
               f_moe_aux,
               0,
               0,
               {0}};
  check_case(&c);
}

/* ---- the model ---- */

typedef struct model_case {
  tsr_llama_config cfg;
  int checked;
  char failure[512];
} model_case;

static tsr_status model_loss(tsr_llama_t *m, tsr_rank_t *r, tsr_var *ids, tsr_var *labels,
                             bool record, tsr_tape_t **tape, tsr_var **loss) {
  TSR_CHECK(tsr_tape_new(r, tape));
  tsr_tape_set_recording(*tape, record);
  tsr_var *logits;
  return tsr_llama_forward(m, *tape, ids, labels, &logits, loss);
}

static tsr_status run_model(tsr_comm_t *comm, void *arg) {
  model_case *mc = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_mesh_t *mesh = one_rank_mesh();
  tsr_llama_t *m = NULL;
  tsr_var *ids = NULL, *labels = NULL, *loss;
  tsr_tape_t *t = NULL;
  uint64_t seed = 7;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_llama_new(r, mesh, &mc->cfg, 1234, &m), st);
  int64_t bl[2] = {2, 6};
  TSR_CHECK_GOTO(make_var(r, mesh, 2, bl, TSR_I32, false, &seed, mc->cfg.vocab_size, false, &ids),
                 st);
  TSR_CHECK_GOTO(make_var(r, mesh, 2, bl, TSR_I32, false, &seed, mc->cfg.vocab_size, true, &labels),
                 st);
  /* Larger weights than the init's, so that every path has gradients well above the noise. */
  for (int p = 0; p < tsr_llama_param_count(m); p++) {
    float *x = tsr_tensor_data(tsr_llama_param(m, p)->value->local);
    for (int64_t e = 0, n = tsr_tensor_numel(tsr_llama_param(m, p)->value->local); e < n; e++)
      x[e] += 0.3f * rnd(&seed);
  }
  TSR_CHECK_GOTO(model_loss(m, r, ids, labels, true, &t, &loss), st);
  TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
  for (int p = 0; p < tsr_llama_param_count(m); p++) {
    tsr_var *v = tsr_llama_param(m, p);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, v), st);
    float *x = tsr_tensor_data(v->value->local);
    const float *ga = tsr_tensor_data(v->grad->local);
    int64_t ne = tsr_tensor_numel(v->value->local);
    for (int64_t e = 0; e < ne; e += ne / 5 + 1) {
      const float h = 1e-3f, keep = x[e];
      tsr_tape_t *tt;
      double lv[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        x[e] = keep + (sgn ? -h : h);
        tsr_var *l;
        st = model_loss(m, r, ids, labels, false, &tt, &l);
        if (st == TSR_OK) lv[sgn] = *(float *)tsr_tensor_data(l->value->local);
        tsr_tape_free(tt);
        TSR_CHECK_GOTO(st, st);
      }
      x[e] = keep;
      double num = (lv[0] - lv[1]) / (2.0 * h), ana = ga[e];
      mc->checked++;
      if (fabs(ana - num) > 1e-2 * fmax(fabs(ana), fabs(num)) + 1e-3 && !mc->failure[0])
        snprintf(mc->failure, sizeof mc->failure, "%s[%lld]: analytic %.6g, numeric %.6g",
                 tsr_llama_param_name(m, p), (long long)e, ana, num);
    }
  }
cleanup:
  tsr_tape_free(t);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(m);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  return st;
}

static void check_model(model_case *mc) {
  if (tsr_local_launch(1, 60.0, run_model, mc) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (mc->failure[0]) fail_msg("%s", mc->failure);
  assert_true(mc->checked > 20);
}

static void test_llama_gradients_gqa(void **s) {
  model_case mc = {.cfg = {.vocab_size = 13,
                           .hidden_size = 16,
                           .intermediate_size = 24,
                           .num_hidden_layers = 2,
                           .num_attention_heads = 4,
                           .num_key_value_heads = 2,
                           .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000.0f}};
  check_model(&mc);
}

static void test_llama_gradients_tied(void **s) {
  model_case mc = {.cfg = {.vocab_size = 11,
                           .hidden_size = 8,
                           .intermediate_size = 12,
                           .num_hidden_layers = 1,
                           .num_attention_heads = 2,
                           .num_key_value_heads = 2,
                           .rms_norm_eps = 1e-6f,
                           .rope_theta = 500.0f,
                           .tie_word_embeddings = true}};
  check_model(&mc);
}

static void test_llama_gradients_moe(void **s) {
  /* layer 1 of 2 is MoE (decoder_sparse_step 2) plus the load-balancing loss */
  model_case mc = {.cfg = {.vocab_size = 13,
                           .hidden_size = 16,
                           .intermediate_size = 12,
                           .num_hidden_layers = 2,
                           .num_attention_heads = 4,
                           .num_key_value_heads = 2,
                           .rms_norm_eps = 1e-5f,
                           .rope_theta = 10000.0f,
                           .num_local_experts = 4,
                           .num_experts_per_tok = 2,
                           .decoder_sparse_step = 2,
                           .router_aux_loss_coef = 0.5f}};
  check_model(&mc);
}

static void test_llama_names_and_count(void **s) {
  tsr_llama_config cfg = {.vocab_size = 10,
                          .hidden_size = 8,
                          .intermediate_size = 12,
                          .num_hidden_layers = 2,
                          .num_attention_heads = 2,
                          .num_key_value_heads = 1,
                          .rms_norm_eps = 1e-5f,
                          .rope_theta = 1e4f};
  /* V*C + L*(2*C*C + 2*kv*C + 3*I*C + 2*C) + C + V*C with kv = 4 */
  assert_int_equal(tsr_llama_num_params(&cfg), 80 + 2 * (128 + 64 + 288 + 16) + 8 + 80);
  cfg.num_attention_heads = 3;
  assert_int_equal(tsr_llama_config_check(&cfg), TSR_EINVAL);
  assert_non_null(
      strstr(tsr_last_error(), "hidden_size = 8 is not a multiple of num_attention_heads = 3"));
  cfg.num_attention_heads = 2;
  cfg.num_key_value_heads = 3;
  assert_int_equal(tsr_llama_config_check(&cfg), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "num_key_value_heads"));
}

/* An op on a sharded input with no rule for it is an error naming op, dim and placements. */
typedef struct plan_case {
  tsr_status st;
  char msg[512];
} plan_case;

static tsr_status run_no_rule(tsr_comm_t *comm, void *arg) {
  plan_case *pc = arg;
  tsr_rank_t *r;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  int shape[1] = {2};
  const char *names[1] = {"tp"};
  tsr_mesh_t *m;
  TSR_CHECK(tsr_mesh_init(2, 1, shape, names, &m));
  int64_t xs[2] = {4, 6}, ws[2] = {3, 6};
  tsr_tensor *fx, *fw;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 2, xs, &fx));
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 2, ws, &fw));
  tsr_placement s1 = tsr_shard(1), rep = tsr_replicate();
  tsr_dtensor *dx, *dw;
  TSR_CHECK(tsr_dtensor_distribute(r, m, fx, &s1, &dx));
  TSR_CHECK(tsr_dtensor_distribute(r, m, fw, &rep, &dw));
  tsr_var *x, *w, *y;
  TSR_CHECK(tsr_var_new_leaf(dx, true, "x", &x));
  TSR_CHECK(tsr_var_new_leaf(dw, true, "w", &w));
  tsr_tape_t *t;
  TSR_CHECK(tsr_tape_new(r, &t));
  tsr_status st = tsr_op_linear(t, x, w, &y);
  if (tsr_comm_rank(comm) == 0) {
    pc->st = st;
    snprintf(pc->msg, sizeof pc->msg, "%s", tsr_last_error());
  }
  tsr_tape_free(t);
  tsr_var_free(x);
  tsr_var_free(w);
  tsr_tensor_free(fx);
  tsr_tensor_free(fw);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return TSR_OK;
}

static void test_missing_rule_is_an_error(void **s) {
  plan_case pc = {0};
  assert_int_equal(tsr_local_launch(2, 10.0, run_no_rule, &pc), TSR_OK);
  assert_int_equal(pc.st, TSR_ENOTSUP);
  assert_non_null(strstr(pc.msg, "no sharding rule for op 'linear' on mesh dim 'tp'"));
  assert_non_null(strstr(pc.msg, "(S(1), R)"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_sdpa_gqa),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_add_accumulates),
      cmocka_unit_test(test_view),
      cmocka_unit_test(test_cross_entropy),
      cmocka_unit_test(test_redistribute_op),
      cmocka_unit_test(test_moe_router_experts),
      cmocka_unit_test(test_moe_aux_loss),
      cmocka_unit_test(test_llama_gradients_moe),
      cmocka_unit_test(test_llama_gradients_gqa),
      cmocka_unit_test(test_llama_gradients_tied),
      cmocka_unit_test(test_llama_names_and_count),
      cmocka_unit_test(test_missing_rule_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
