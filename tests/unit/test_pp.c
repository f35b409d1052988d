/* Pipeline schedules run by tsr_llama_pipe_step against the 1-rank step on the whole batch:
 * logits, loss and every gradient for pp 2, 3 and 4, dp x pp and pp beside a replicated tp, under
 * gpipe, 1f1b, interleaved_1f1b (virtual stages) and zero_bubble (split backward) with several
 * microbatch counts, even, uneven and explicit layer splits; 1F1B's peak of microbatches in
 * flight per stage; per-rank parameter bytes about 1/pp; the schedules' analytic bubble; the
 * tape's split backward (input part, then the deferred weight part) against the whole one; tied
 * embeddings' last-stage replica bit-identical to the embedding after steps. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../plugins/pp/pp_schedule.c"
#include "harness.h"
#include "llama_pipe.h"
#include "tessera/ops.h"
#include "tessera/optim.h"

#define MAX_PARAMS 96
#define B          6
#define L          5

static const tsr_llama_config base_cfg = {.vocab_size = 19,
                                          .hidden_size = 16,
                                          .intermediate_size = 20,
                                          .num_hidden_layers = 4,
                                          .num_attention_heads = 4,
                                          .num_key_value_heads = 2,
                                          .rms_norm_eps = 1e-5f,
                                          .rope_theta = 10000.0f};

typedef struct pp_case {
  int ndim, shape[3];
  const char *names[3];
  const tsr_schedule *sched; /* NULL: the plain forward on one rank */
  int microbatches;
  int layers; /* num_hidden_layers; 0: base_cfg's */
  tsr_llama_layout layout;
  tsr_tensor *logits, *grads[MAX_PARAMS];
  float loss;
  int nparams, peak[8];
  size_t param_bytes[8];
} pp_case;

static void fill(int32_t *ids, int32_t *labels) {
  for (int i = 0; i < B * L; i++) {
    ids[i] = (i * 5) % base_cfg.vocab_size;
    labels[i] = i % 7 == 3 || i >= B * L - 3 ? -100 : (i * 5 + 1) % base_cfg.vocab_size;
  }
}

static tsr_status run(tsr_comm_t *comm, void *arg) {
  pp_case *pc = arg;
  int me = tsr_comm_rank(comm);
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  int32_t hid[B * L], hlab[B * L];
  tsr_status st = TSR_OK;
  fill(hid, hlab);
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), pc->ndim, pc->shape, pc->names, &m), st);
  tsr_llama_config cfg = base_cfg;
  if (pc->layers) cfg.num_hidden_layers = pc->layers;
  TSR_CHECK_GOTO(tsr_llama_new_staged(r, m, &cfg, 7, &pc->layout, &model), st);
  pc->param_bytes[me] = tsr_rank_allocator(r)->bytes_in_use;
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_tensor *logits = NULL;
  if (pc->sched) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(tsr_llama_pipe_step(model, m, pc->sched, pc->microbatches, hid, hlab, B, L, true,
                                       true, &res),
                   st);
    pc->peak[me] = res.peak_in_flight;
    if (me == 0) pc->loss = (float)res.loss;
    logits = res.logits;
    res.logits = NULL;
    tsr_pipe_result_free(&res);
  } else {
    tsr_var *lg, *loss;
    TSR_CHECK_GOTO(tsr_llama_batch(r, m, B, L, hid, &ids), st);
    TSR_CHECK_GOTO(tsr_llama_batch(r, m, B, L, hlab, &labels), st);
    TSR_CHECK_GOTO(tsr_llama_forward(model, t, ids, labels, &lg, &loss), st);
    TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, lg->value, true, &logits), st);
    if (me == 0) pc->loss = *(const float *)tsr_tensor_data(loss->value->local);
  }
  if (me == 0)
    pc->logits = logits;
  else
    tsr_tensor_free(logits);
  int np = tsr_llama_param_count(model);
  if (np > MAX_PARAMS) {
    st = TSR_ERROR(TSR_EINVAL, "%d parameters; raise MAX_PARAMS", np);
    goto cleanup;
  }
  if (me == 0) pc->nparams = np; /* one writer: the ranks are threads sharing pc */
  for (int i = 0; i < np; i++) {
    tsr_var *p = tsr_llama_param(model, i);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, p), st);
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, p->grad, me == 0, &pc->grads[i]), st);
  }
cleanup:
  tsr_tape_free(t);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void expect_close(const tsr_tensor *a, const tsr_tensor *b, const char *what, int i) {
  tsr_test_expect_close(a, b, 1e-4f, 1e-5f, what, i);
}

static void case_free(pp_case *c) {
  tsr_tensor_free(c->logits);
  for (int i = 0; i < c->nparams; i++) tsr_tensor_free(c->grads[i]);
}

static const tsr_schedule gpipe = {"gpipe", "test", tsr_pp_gpipe, NULL};
static const tsr_schedule onef1b = {"1f1b", "test", tsr_pp_1f1b, NULL};
static const tsr_schedule inter2 = {"interleaved_1f1b", "test", tsr_pp_interleaved,
                                    (void *)(intptr_t)2};
static const tsr_schedule inter3 = {"interleaved_1f1b", "test", tsr_pp_interleaved,
                                    (void *)(intptr_t)3};
static const tsr_schedule zb = {"zero_bubble", "test", tsr_pp_zero_bubble, NULL};

/* One rank's reference for a layer count. */
static void reference(int layers, pp_case *one) {
  *one = (pp_case){.ndim = 1, .shape = {1}, .names = {"dp"}, .layers = layers};
  if (tsr_local_launch(1, 30.0, run, one) != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* Runs c (mesh, schedule, layout filled in) and compares it with the reference. */
static void expect_case(pp_case *c, const pp_case *one, int pp) {
  int world = 1;
  for (int i = 0; i < c->ndim; i++) world *= c->shape[i];
  c->layers = one->layers;
  if (tsr_local_launch(world, 30.0, run, c) != TSR_OK)
    fail_msg("%s, %d microbatches: %s", c->sched->name, c->microbatches, tsr_last_error());
  expect_close(c->logits, one->logits, "logits", 0);
  if (!(fabsf(c->loss - one->loss) <= 1e-5f + 1e-4f * fabsf(one->loss)))
    fail_msg("%s: loss %.8g in the pipeline, %.8g on one rank", c->sched->name, c->loss, one->loss);
  for (int i = 0; i < one->nparams; i++) expect_close(c->grads[i], one->grads[i], "grad", i);
  /* layers per pp rank, from the layout */
  int v = c->layout.stages_per_rank > 1 ? c->layout.stages_per_rank : 1, stage_of[64];
  int held[8] = {0};
  if (c->layout.nlayers_per_stage)
    for (int st = 0, l = 0; st < c->layout.nlayers_per_stage; st++)
      for (int i = 0; i < c->layout.layers_per_stage[st]; i++) stage_of[l++] = st;
  else
    tsr_llama_assign_layers(one->layers ? one->layers : base_cfg.num_hidden_layers, pp * v,
                            stage_of);
  int layers = one->layers ? one->layers : base_cfg.num_hidden_layers;
  for (int l = 0; l < layers; l++) held[stage_of[l] % pp]++;
  for (int rk = 0; rk < world; rk++) {
    /* a rank holds its stages' parameters only: about its share of the layers (the embedding
     * and lm_head make the end stages a little heavier) */
    double share = (double)held[rk / (world / pp)] / layers;
    if (share < 1.0 / pp) share = 1.0 / pp;
    if ((double)c->param_bytes[rk] > 1.35 * (double)one->param_bytes[0] * share)
      fail_msg("%s: rank %d holds %zu parameter bytes of %zu", c->sched->name, rk,
               c->param_bytes[rk], one->param_bytes[0]);
  }
}

static pp_case mesh_case(int ndim, const int *shape, const char *const *names,
                         const tsr_schedule *sched, int mb, int chunks) {
  pp_case c = {.ndim = ndim, .sched = sched, .microbatches = mb};
  for (int i = 0; i < ndim; i++) c.shape[i] = shape[i], c.names[i] = names[i];
  c.layout.stages_per_rank = chunks;
  return c;
}

/* Runs every schedule and microbatch count on the mesh against the 1-rank step. */
static void against_one_rank(int ndim, const int *shape, const char *const *names, int pp) {
  pp_case one;
  reference(0, &one);
  int world = 1;
  for (int i = 0; i < ndim; i++) world *= shape[i];
  const tsr_schedule *scheds[3] = {&gpipe, &onef1b, &zb};
  const int mbs[] = {1, 2, 3, 6};
  for (int s = 0; s < 3; s++)
    for (size_t k = 0; k < sizeof mbs / sizeof mbs[0]; k++) {
      pp_case c = mesh_case(ndim, shape, names, scheds[s], mbs[k], 1);
      expect_case(&c, &one, pp);
      /* ranks are row-major with pp outermost here: rank r is on stage r / (world / pp) */
      for (int rk = 0; rk < world; rk++) {
        int stage = rk / (world / pp), want = mbs[k];
        if (scheds[s] == &onef1b && pp - stage < want) want = pp - stage;
        if (scheds[s] == &zb && pp < want) want = pp; /* until W: at most pp on every stage */
        if (c.peak[rk] != want)
          fail_msg("%s, %d microbatches: rank %d (stage %d) held %d at once, want %d",
                   scheds[s]->name, mbs[k], rk, stage, c.peak[rk], want);
      }
      case_free(&c);
    }
  /* interleaved: 2 chunks per rank over the 4 layers when pp = 2 */
  if (pp * 2 <= base_cfg.num_hidden_layers)
    for (int mb = pp; mb <= B; mb += pp) {
      pp_case c = mesh_case(ndim, shape, names, &inter2, mb, 2);
      expect_case(&c, &one, pp);
      case_free(&c);
    }
  case_free(&one);
}

/* Tied embeddings over pp 2 (zero_bubble, 2 microbatches): the last stage's replica starts equal
 * to the first stage's embedding and, with the gradients summed over the pair and both stepped by
 * AdamW, is still bit-identical to it after 3 steps that moved it. */
typedef struct tied_case {
  tsr_tensor *embed[2], *replica[2]; /* [0] at build, [1] after the steps; rank 0's */
  bool exposed_once;                 /* no parameter besides embed_tokens is (V, C) */
} tied_case;

static tsr_status run_tied(tsr_comm_t *comm, void *arg) {
  tied_case *tc = arg;
  bool me0 = tsr_comm_rank(comm) == 0;
  int shape[1] = {2};
  const char *names[1] = {"pp"};
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_var *params[MAX_PARAMS + 1];
  int32_t hid[B * L], hlab[B * L];
  tsr_status st = TSR_OK;
  fill(hid, hlab);
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), 1, shape, names, &m), st);
  tsr_llama_config cfg = base_cfg;
  cfg.tie_word_embeddings = true;
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &cfg, 7, &model), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  int n = tsr_llama_param_count(model);
  TSR_INVARIANT(n < MAX_PARAMS && tsr_llama_tied_replica(model));
  bool once = true;
  for (int i = 0; i < n; i++) {
    params[i] = tsr_llama_param(model, i);
    if (i > 0 && params[i]->value->ndim == 2 && params[i]->value->shape[0] == cfg.vocab_size)
      once = false;
  }
  if (me0) tc->exposed_once = once; /* one writer: the ranks are threads sharing tc */
  tsr_var *embed = params[0], *replica = tsr_llama_tied_replica(model);
  params[n] = replica;
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, embed->value, me0, &tc->embed[0]), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, replica->value, me0, &tc->replica[0]), st);
  tsr_adamw_config oc = {0.9f, 0.95f, 1e-8f, 0.1f};
  TSR_CHECK_GOTO(tsr_adamw_new(r, n + 1, params, &oc, &opt), st);
  for (int step = 0; step < 3; step++) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(tsr_llama_pipe_step(model, m, &zb, 2, hid, hlab, B, L, true, false, &res), st);
    tsr_pipe_result_free(&res);
    for (int i = 0; i <= n; i++) TSR_CHECK_GOTO(tsr_var_resolve_grad(t, params[i]), st);
    TSR_CHECK_GOTO(tsr_llama_tied_grad_sync(model), st);
    TSR_CHECK_GOTO(tsr_adamw_step(opt, 1e-2), st);
    for (int i = 0; i <= n; i++) tsr_var_zero_grad(params[i]);
  }
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, embed->value, me0, &tc->embed[1]), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, replica->value, me0, &tc->replica[1]), st);
cleanup:
  tsr_adamw_free(opt);
  tsr_tape_free(t);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_tied_replica_stays_identical(void **s) {
  (void)s;
  tied_case tc = {0};
  if (tsr_local_launch(2, 30.0, run_tied, &tc) != TSR_OK) fail_msg("%s", tsr_last_error());
  assert_true(tc.exposed_once);
  size_t bytes = (size_t)tsr_tensor_numel(tc.embed[0]) * sizeof(float);
  assert_int_equal(tsr_tensor_numel(tc.replica[1]), tsr_tensor_numel(tc.embed[1]));
  assert_memory_equal(tsr_tensor_data(tc.embed[0]), tsr_tensor_data(tc.replica[0]), bytes);
  assert_memory_equal(tsr_tensor_data(tc.embed[1]), tsr_tensor_data(tc.replica[1]), bytes);
  /* the steps moved the weight (so equality is not just the initial copy) */
  assert_memory_not_equal(tsr_tensor_data(tc.embed[0]), tsr_tensor_data(tc.embed[1]), bytes);
  for (int i = 0; i < 2; i++) {
    tsr_tensor_free(tc.embed[i]);
    tsr_tensor_free(tc.replica[i]);
  }
}

static void test_pp4(void **s) {
  (void)s;
  int shape[1] = {4};
  const char *names[1] = {"pp"};
  against_one_rank(1, shape, names, 4);
}

static void test_pp2_dp2(void **s) {
  (void)s;
  int shape[2] = {2, 2};
  const char *names[2] = {"pp", "dp"};
  against_one_rank(2, shape, names, 2);
}

static void test_pp2_replicated_tp2(void **s) {
  (void)s;
  int shape[2] = {2, 2};
  const char *names[2] = {"pp", "tp"};
  against_one_rank(2, shape, names, 2);
}

/* Virtual stages and explicit splits over 6 layers: interleaved at pp 2 (2 and 3 chunks, uneven
 * and explicit 2, 1, 2, 1) and pp 3 (even and explicit), zero_bubble at pp 3 with 2, 3, 1 layers
 * and at pp 2 with 1, 5, 1f1b with 1, 5; then interleaved at pp 4 over 8 layers. */
static void test_virtual_and_explicit_stages(void **s) {
  (void)s;
  pp_case one;
  reference(6, &one);
  const char *names[1] = {"pp"};
  static const int lps_3x2[6] = {1, 1, 1, 1, 1, 1};
  static const int lps_2x2[4] = {2, 1, 2, 1};
  static const int lps_zb[3] = {2, 3, 1};
  static const int lps_15[2] = {1, 5};
  struct {
    int pp;
    const tsr_schedule *sched;
    int chunks, mb;
    const int *lps;
    int nlps;
  } cases[] = {
      {2, &inter2, 2, 2, NULL, 0},    {2, &inter2, 2, 6, NULL, 0},   {2, &inter3, 3, 4, NULL, 0},
      {3, &inter2, 2, 3, lps_3x2, 6}, {3, &inter2, 2, 6, NULL, 0},   {2, &inter2, 2, 2, lps_2x2, 4},
      {3, &zb, 1, 5, lps_zb, 3},      {2, &onef1b, 1, 3, lps_15, 2}, {2, &zb, 1, 4, lps_15, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int shape[1] = {cases[i].pp};
    pp_case c = mesh_case(1, shape, names, cases[i].sched, cases[i].mb, cases[i].chunks);
    c.layout.layers_per_stage = cases[i].lps;
    c.layout.nlayers_per_stage = cases[i].nlps;
    expect_case(&c, &one, cases[i].pp);
    case_free(&c);
  }
  case_free(&one);
  /* pp 4 x 2 chunks: 8 layers, one per stage */
  reference(8, &one);
  int shape4[1] = {4};
  for (int mb = 4; mb <= B; mb += 4) {
    pp_case c = mesh_case(1, shape4, names, &inter2, mb, 2);
    expect_case(&c, &one, 4);
    case_free(&c);
  }
  case_free(&one);
}

/* Layouts that do not fit are refused with the reason. */
static tsr_status build_only(tsr_comm_t *comm, void *arg) {
  const tsr_llama_layout *layout = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  int shape[1] = {2};
  const char *names[1] = {"pp"};
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(2, 1, shape, names, &m), st);
  st = tsr_llama_new_staged(r, m, &base_cfg, 7, layout, &model);
cleanup:
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_bad_layouts(void **s) {
  (void)s;
  static const int zero[2] = {4, 0}, three[3] = {1, 1, 2}, five[2] = {2, 3};
  struct {
    tsr_llama_layout layout;
    const char *want;
  } cases[] = {
      {{1, zero, 2}, "stage 1 has 0 layers"},
      {{1, three, 3}, "layers_per_stage gives 3 stages but the pipeline has 2"},
      {{1, five, 2}, "layers_per_stage sums to 5 but the model has 4 layers"},
      {{3, NULL, 0}, "6 pipeline stages (pp = 2 x stages_per_rank = 3) but the model has 4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tsr_status st = tsr_local_launch(2, 30.0, build_only, &cases[i].layout);
    assert_int_equal(st, TSR_EINVAL);
    if (!strstr(tsr_last_error(), cases[i].want))
      fail_msg("layout %zu: '%s' lacks '%s'", i, tsr_last_error(), cases[i].want);
  }
}

/* The analytic bubbles: gpipe and 1f1b (pp - 1) / (m + pp - 1); interleaved over v chunks
 * (pp - 1) / (v m + pp - 1); zero_bubble with F = B = W = 1 unit (tb = 2) ZB-H1's
 * (pp - 1) / (3 m + pp - 1), a third of 1F1B's idle time, once m >= pp. */
static void test_bubble(void **s) {
  (void)s;
  const tsr_schedule *scheds[2] = {&gpipe, &onef1b};
  for (int k = 0; k < 2; k++)
    for (int pp = 1; pp <= 8; pp *= 2)
      for (int m = 1; m <= 16; m *= 2) {
        double want = (double)(pp - 1) / (m + pp - 1);
        double got = tsr_pipe_simulate(scheds[k], pp, 1, m, 1.0, 2.0, NULL);
        if (fabs(got - want) > 1e-12)
          fail_msg("%s pp %d, %d microbatches: bubble %g, want %g", scheds[k]->name, pp, m, got,
                   want);
      }
  const tsr_schedule *inter[2] = {&inter2, &inter3};
  for (int v = 2; v <= 3; v++)
    for (int pp = 2; pp <= 4; pp++)
      for (int m = pp; m <= 16; m += pp) {
        double want = (double)(pp - 1) / (v * m + pp - 1);
        double got = tsr_pipe_simulate(inter[v - 2], pp, v, m, 1.0, 2.0, NULL);
        if (fabs(got - want) > 1e-12)
          fail_msg("interleaved v %d pp %d, %d microbatches: bubble %g, want %g", v, pp, m, got,
                   want);
      }
  for (int pp = 2; pp <= 8; pp++)
    for (int m = pp; m <= 16; m++) {
      double want = (double)(pp - 1) / (3 * m + pp - 1);
      double got = tsr_pipe_simulate(&zb, pp, 1, m, 1.0, 2.0, NULL);
      if (fabs(got - want) > 1e-12)
        fail_msg("zero_bubble pp %d, %d microbatches: bubble %g, want %g", pp, m, got, want);
    }
  /* interleaved refuses a microbatch count that is not a multiple of pp, and one chunk */
  assert_true(tsr_pipe_simulate(&inter2, 2, 2, 3, 1.0, 2.0, NULL) < 0);
  assert_true(strstr(tsr_last_error(), "not a multiple of the 2 pipeline ranks") != NULL);
  static const tsr_schedule inter1 = {"interleaved_1f1b", "test", tsr_pp_interleaved,
                                      (void *)(intptr_t)1};
  assert_true(tsr_pipe_simulate(&inter1, 2, 1, 2, 1.0, 2.0, NULL) < 0);
  assert_true(strstr(tsr_last_error(), "it needs at least 2") != NULL);
}

/* A schedule whose lists wait on each other never finishes: the simulation says so. */
static tsr_status backward_first(int stages, int mb, int stage, tsr_pipe_action *a, int cap, int *n,
                                 void *ctx) {
  (void)stages, (void)stage, (void)cap, (void)ctx;
  int k = 0;
  for (int i = 0; i < mb; i++) a[k++] = (tsr_pipe_action){TSR_PIPE_BACKWARD, i, 0};
  for (int i = 0; i < mb; i++) a[k++] = (tsr_pipe_action){TSR_PIPE_FORWARD, i, 0};
  *n = k;
  return TSR_OK;
}

static void test_stuck_schedule(void **s) {
  (void)s;
  tsr_schedule bad = {"bad", "test", backward_first, NULL};
  assert_true(tsr_pipe_simulate(&bad, 2, 1, 2, 1.0, 2.0, NULL) < 0);
}

/* ---- the tape's split backward ---- */

typedef struct split_vars {
  tsr_var *x, *w1, *g, *w2;
} split_vars;

static tsr_status leaf_of(tsr_rank_t *r, const tsr_mesh_t *m, int ndim, const int64_t *shape,
                          int seed, const char *name, tsr_var **out) {
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, ndim, shape, &t));
  float *p = tsr_tensor_data(t);
  for (int64_t i = 0; i < tsr_tensor_numel(t); i++) p[i] = (float)((i * 7 + seed) % 11) / 8 - 0.6f;
  tsr_placement rep[1] = {tsr_replicate()};
  tsr_dtensor *d = NULL;
  tsr_status st = tsr_dtensor_distribute(r, m, t, rep, &d);
  tsr_tensor_free(t);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, true, name, out);
}

/* o = linear(rmsnorm(linear(x, w1), g), w2) with output gradient `seed`. */
static tsr_status split_forward(tsr_tape_t *t, const split_vars *v, tsr_var **o) {
  tsr_var *y, *z;
  TSR_CHECK(tsr_op_linear(t, v->x, v->w1, &y));
  TSR_CHECK(tsr_op_rmsnorm(t, y, v->g, 1e-5f, &z));
  return tsr_op_linear(t, z, v->w2, o);
}

static tsr_status ones_like(tsr_rank_t *r, const tsr_var *o, tsr_dtensor **out) {
  tsr_placement rep[1] = {tsr_replicate()};
  TSR_CHECK(
      tsr_dtensor_zeros(r, o->value->mesh, TSR_F32, o->value->ndim, o->value->shape, rep, out));
  float *p = tsr_tensor_data((*out)->local);
  for (int64_t i = 0; i < tsr_tensor_numel((*out)->local); i++) p[i] = (float)(i % 5) - 2.0f;
  return TSR_OK;
}

static tsr_status split_run(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tape_t *t = NULL;
  split_vars v = {0};
  tsr_tensor *want[4] = {0};
  int shape1[1] = {1};
  const char *names[1] = {"dp"};
  int64_t xs[3] = {2, 3, 8}, w1s[2] = {6, 8}, gs[1] = {6}, w2s[2] = {5, 6};
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(1, 1, shape1, names, &m), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  TSR_CHECK_GOTO(leaf_of(r, m, 3, xs, 1, "x", &v.x), st);
  TSR_CHECK_GOTO(leaf_of(r, m, 2, w1s, 2, "w1", &v.w1), st);
  TSR_CHECK_GOTO(leaf_of(r, m, 1, gs, 3, "g", &v.g), st);
  TSR_CHECK_GOTO(leaf_of(r, m, 2, w2s, 4, "w2", &v.w2), st);
  tsr_var *all[4] = {v.x, v.w1, v.g, v.w2}, *o = NULL;
  /* the whole backward */
  tsr_dtensor *seed = NULL;
  TSR_CHECK_GOTO(split_forward(t, &v, &o), st);
  TSR_CHECK_GOTO(ones_like(r, o, &seed), st);
  TSR_CHECK_GOTO(tsr_tape_backward_with(t, o, seed), st);
  for (int i = 0; i < 4; i++) {
    TSR_CHECK_GOTO(tsr_tensor_cast(all[i]->grad->local, TSR_F32, &want[i]), st);
    tsr_var_zero_grad(all[i]);
  }
  tsr_tape_reset(t);
  /* nothing pending: the weight part has nothing to run */
  assert_int_equal(tsr_tape_backward_weight(t), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "no split backward is pending"));
  /* split: the input part leaves x's gradient and the rmsnorm weight's (a whole node on the
   * path), and defers both linears' weight halves */
  TSR_CHECK_GOTO(split_forward(t, &v, &o), st);
  TSR_CHECK_GOTO(ones_like(r, o, &seed), st);
  TSR_CHECK_GOTO(tsr_tape_backward_input(t, o, seed, &v.x, 1), st);
  assert_int_equal(tsr_tape_deferred_count(t), 2);
  assert_non_null(v.x->grad);
  assert_non_null(v.g->grad);
  assert_null(v.w1->grad);
  assert_null(v.w2->grad);
  expect_close(v.x->grad->local, want[0], "x grad after the input part", 0);
  expect_close(v.g->grad->local, want[2], "g grad after the input part", 0);
  /* a second split before the weight part is refused */
  TSR_CHECK_GOTO(ones_like(r, o, &seed), st);
  assert_int_equal(tsr_tape_backward_input(t, o, seed, &v.x, 1), TSR_EINVAL);
  TSR_CHECK_GOTO(tsr_tape_backward_weight(t), st);
  assert_int_equal(tsr_tape_deferred_count(t), 0);
  for (int i = 0; i < 4; i++) expect_close(all[i]->grad->local, want[i], "grad after split", i);
  /* with no inputs everything is deferred: the input part computes nothing */
  for (int i = 0; i < 4; i++) tsr_var_zero_grad(all[i]);
  tsr_tape_reset(t);
  TSR_CHECK_GOTO(split_forward(t, &v, &o), st);
  TSR_CHECK_GOTO(ones_like(r, o, &seed), st);
  TSR_CHECK_GOTO(tsr_tape_backward_input(t, o, seed, NULL, 0), st);
  assert_int_equal(tsr_tape_deferred_count(t), tsr_tape_node_count(t));
  for (int i = 0; i < 4; i++) assert_null(all[i]->grad);
  TSR_CHECK_GOTO(tsr_tape_backward_weight(t), st);
  for (int i = 0; i < 4; i++) expect_close(all[i]->grad->local, want[i], "grad, all deferred", i);
cleanup:
  for (int i = 0; i < 4; i++) tsr_tensor_free(want[i]);
  tsr_tape_free(t);
  tsr_var_free(v.x), tsr_var_free(v.w1), tsr_var_free(v.g), tsr_var_free(v.w2);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_split_backward(void **s) {
  (void)s;
  if (tsr_local_launch(1, 30.0, split_run, NULL) != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* In a zero_bubble step the weight parts run apart from their input parts, as measured by the
 * executed events: every rank runs one per microbatch, each after its own input part, and on the
 * last stage of pp 3 (which holds 2 back) the weight part of microbatch k starts after the input
 * part of k + 1 has ended. No whole backward runs. */
static tsr_status zb_events(tsr_comm_t *comm, void *arg) {
  pp_case *pc = arg;
  int me = tsr_comm_rank(comm);
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  int32_t hid[B * L], hlab[B * L];
  tsr_status st = TSR_OK;
  fill(hid, hlab);
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(3, 1, pc->shape, pc->names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &base_cfg, 7, &model), st);
  tsr_pipe_result res;
  TSR_CHECK_GOTO(tsr_llama_pipe_step(model, m, &zb, 6, hid, hlab, B, L, true, false, &res), st);
  double fwd_end[6] = {0}, in_end[6] = {0};
  int late = 0, weights = 0;
  for (int i = 0; i < res.nevents; i++) {
    const tsr_pipe_event *e = &res.events[i];
    if (e->kind == TSR_PIPE_FORWARD) fwd_end[e->microbatch] = e->t1;
    if (e->kind == TSR_PIPE_BACKWARD_INPUT) in_end[e->microbatch] = e->t1;
    if (e->kind == TSR_PIPE_BACKWARD) st = TSR_ERROR(TSR_EINVAL, "a whole backward in zero_bubble");
    if (e->kind != TSR_PIPE_BACKWARD_WEIGHT) continue;
    weights++;
    if (!(in_end[e->microbatch] > 0 && e->t0 >= in_end[e->microbatch]))
      st = TSR_ERROR(TSR_EINVAL, "weight part of %d before its input part", e->microbatch);
    if (e->microbatch + 1 < 6 && in_end[e->microbatch + 1] > 0 &&
        e->t0 >= in_end[e->microbatch + 1])
      late++;
  }
  (void)fwd_end;
  if (weights != 6) st = TSR_ERROR(TSR_EINVAL, "rank %d ran %d weight parts", me, weights);
  if (me == 2 && late < 4)
    st = TSR_ERROR(TSR_EINVAL, "the last stage deferred %d weight parts past the next input part",
                   late);
  tsr_pipe_result_free(&res);
cleanup:
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_zero_bubble_defers_weights(void **s) {
  (void)s;
  pp_case c = {.shape = {3}, .names = {"pp"}};
  if (tsr_local_launch(3, 30.0, zb_events, &c) != TSR_OK) fail_msg("%s", tsr_last_error());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bubble),
      cmocka_unit_test(test_stuck_schedule),
      cmocka_unit_test(test_pp4),
      cmocka_unit_test(test_pp2_dp2),
      cmocka_unit_test(test_pp2_replicated_tp2),
      cmocka_unit_test(test_virtual_and_explicit_stages),
      cmocka_unit_test(test_bad_layouts),
      cmocka_unit_test(test_split_backward),
      cmocka_unit_test(test_zero_bubble_defers_weights),
      cmocka_unit_test(test_tied_replica_stays_identical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
