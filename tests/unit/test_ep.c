/* Expert parallelism: the ep plugin, loaded through the loader, against the 1-rank run of the
 * same router and experts ops on random data: the experts' output and the gradients of x, of the
 * router logits and of both expert weights, on ep = 2 and 4, with routings where some ep ranks
 * receive no tokens or hold none, at sizes where the GEMMs block, and beside dp, tp and ring_cp,
 * whose placements the rule keeps. On ep alone the dispatch adds in the 1-rank order, so the
 * results are bit for bit the 1-rank results. The bytes each rank counts under "ep" equal the
 * all-to-all volume computed here from the routing. Also the job checks (experts that ep does not
 * divide, a device other than the CPU), check_registry against what another plugin registers,
 * and a dense model, which ep splits by batch only. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "tessera/ops.h"
#include "tessera/plugin.h"

#define MAX_DIMS  3
#define MAX_RANKS 8
#define NLEAVES   4 /* x, logits, w13, w2 */

typedef struct ep_case {
  int ndim, shape[MAX_DIMS];
  const char *names[MAX_DIMS];
  int B, L, C, I, E, top_k;
  int avoid; /* > 0: no token picks the last `avoid` experts */
  const tsr_registry_t *reg;
  /* rank 0 keeps these full tensors */
  tsr_tensor *out, *combine, *grads[NLEAVES];
  uint64_t bytes[MAX_RANKS]; /* each rank's, under "ep", for the forward and backward */
} ep_case;

static const char *const leaf_names[NLEAVES] = {"x", "logits", "w13", "w2"};

static const char *plugin_of(const char *dim) {
  if (!strcmp(dim, "ep")) return "ep";
  if (!strcmp(dim, "tp")) return "tp";
  if (!strcmp(dim, "dp")) return "dp";
  if (!strcmp(dim, "ring_cp")) return "cp_ring";
  return NULL;
}

static int world_of(const ep_case *c) {
  int w = 1;
  for (int i = 0; i < c->ndim; i++) w *= c->shape[i];
  return w;
}

/* A value in [-1, 1) from (seed, index), the same on every rank. */
static float noise(uint32_t seed, int64_t i) {
  uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)seed * 0xD1B54A32D192ED03ull;
  z ^= z >> 31;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return (float)((double)(z >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* The full tensor of leaf `k` (x, logits, w13, w2) or of the output gradient (k = 4). */
static tsr_status full_tensor(const ep_case *c, int k, tsr_tensor **out) {
  int64_t shapes[5][3] = {{c->B, c->L, c->C},
                          {c->B, c->L, c->E},
                          {c->E, 2 * c->I, c->C},
                          {c->E, c->C, c->I},
                          {c->B, c->L, c->C}};
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 3, shapes[k], out));
  float *p = tsr_tensor_data(*out);
  float scale = k >= 2 && k < 4 ? 0.5f : 1.0f;
  for (int64_t i = 0; i < tsr_tensor_numel(*out); i++) p[i] = scale * noise(11 + (uint32_t)k, i);
  if (k == 1 && c->avoid > 0)
    for (int64_t n = 0; n < (int64_t)c->B * c->L; n++)
      for (int e = c->E - c->avoid; e < c->E; e++) p[n * c->E + e] = -30.0f;
  return TSR_OK;
}

/* Activations split along the batch on ep and dp, along the sequence on ring_cp, whole on tp;
 * the expert weights split by expert on ep, whole elsewhere. */
static void placements_of(const ep_case *c, bool weight, tsr_placement *p) {
  for (int i = 0; i < c->ndim; i++) {
    p[i] = tsr_replicate();
    if (!strcmp(c->names[i], "ep") || (!weight && !strcmp(c->names[i], "dp")))
      p[i] = tsr_shard(0);
    else if (!weight && !strcmp(c->names[i], "ring_cp"))
      p[i] = tsr_shard(1);
  }
}

static tsr_status leaf(tsr_rank_t *r, const tsr_mesh_t *m, const ep_case *c, int k, tsr_var **out) {
  tsr_tensor *full = NULL;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  placements_of(c, k >= 2, p);
  TSR_CHECK(full_tensor(c, k, &full));
  tsr_dtensor *d = NULL;
  tsr_status st = tsr_dtensor_distribute(r, m, full, p, &d);
  tsr_tensor_free(full);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, true, leaf_names[k], out);
}

static tsr_status run_ops(tsr_comm_t *comm, void *arg) {
  ep_case *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tape_t *t = NULL;
  tsr_var *in[NLEAVES] = {0}, *combine, *stats, *out;
  tsr_tensor *gfull = NULL;
  tsr_dtensor *g = NULL;
  bool me0 = tsr_comm_rank(comm) == 0;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), c->ndim, c->shape, c->names, &m), st);
  for (int k = 0; k < NLEAVES; k++) TSR_CHECK_GOTO(leaf(r, m, c, k, &in[k]), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_comm_bytes_reset(comm);
  TSR_CHECK_GOTO(tsr_op_moe_router(t, in[1], c->top_k, &combine, &stats), st);
  TSR_CHECK_GOTO(tsr_op_moe_experts(t, in[0], combine, in[2], in[3], &out), st);
  TSR_CHECK_GOTO(full_tensor(c, 4, &gfull), st);
  TSR_CHECK_GOTO(tsr_dtensor_distribute(r, m, gfull, out->value->placements, &g), st);
  st = tsr_tape_backward_with(t, out, g);
  g = NULL;
  TSR_CHECK_GOTO(st, st);
  c->bytes[tsr_comm_rank(comm)] = tsr_comm_bytes(comm, "ep");
  for (int k = 0; k < NLEAVES; k++) {
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, in[k]), st);
    TSR_CHECK_GOTO(tsr_test_keep_full(r, m, in[k]->grad, me0, &c->grads[k]), st);
  }
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, out->value, me0, &c->out), st);
  TSR_CHECK_GOTO(tsr_test_keep_full(r, m, combine->value, me0, &c->combine), st);
cleanup:
  tsr_dtensor_free(g);
  tsr_tensor_free(gfull);
  tsr_tape_free(t);
  for (int k = 0; k < NLEAVES; k++) tsr_var_free(in[k]);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void results_free(ep_case *c) {
  tsr_tensor_free(c->out);
  tsr_tensor_free(c->combine);
  for (int k = 0; k < NLEAVES; k++) tsr_tensor_free(c->grads[k]);
}

/* The job the plugins see: the case's mesh and a model with the case's experts. */
static void job_text(const ep_case *c, const char *extra, int experts, char *buf, size_t len) {
  char dims[128] = "", shape[64] = "", load[128] = "";
  for (int i = 0; i < c->ndim; i++) {
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s", *dims ? ", " : "",
             c->names[i]);
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%d", *shape ? ", " : "",
             c->shape[i]);
    snprintf(load + strlen(load), sizeof load - strlen(load), "%s%s", *load ? ", " : "",
             plugin_of(c->names[i]));
  }
  snprintf(buf, len,
           "[mesh]\ndims = %s\nshape = %s\n[plugins]\nload = %s\n%s"
           "[model]\nvocab_size = 19\nhidden_size = 16\nintermediate_size = 8\n"
           "num_hidden_layers = 2\nnum_attention_heads = 4\nnum_key_value_heads = 2\n"
           "num_local_experts = %d\nnum_experts_per_tok = 2\n"
           "[data]\nbatch_size = 4\nseq_len = 8\n",
           dims, shape, load, extra ? extra : "", experts);
}

static tsr_status load(const ep_case *c, const char *extra, int experts, tsr_plugin_job *out,
                       char *msg, size_t len) {
  char text[2048];
  job_text(c, extra, experts, text, sizeof text);
  tsr_status st = tsr_plugin_job_load_string(text, "ep.ini", out);
  snprintf(msg, len, "%s", st ? tsr_last_error() : "");
  return st;
}

/* Whether expert e's rank on ep is j, for a mesh where ep is the only dim. */
static int owner_of(const ep_case *c, int e) {
  return e / (c->E / c->shape[0]);
}

/* The bytes ep member j sends in one forward and backward, from the 1-rank routing: El counts
 * to each other member, then C floats for every row that goes between j and another member:
 * forward sends j's rows out and the outputs of the rows j received back, backward the same
 * rows' gradients, so each such row counts twice. */
static uint64_t expected_bytes(const ep_case *c, int j) {
  int P = c->shape[0], El = c->E / P;
  const float *cb = tsr_tensor_data(c->combine);
  int64_t b0 = tsr_chunk_start(c->B, P, j), b1 = b0 + tsr_chunk_size(c->B, P, j);
  uint64_t rows = 0;
  for (int64_t n = 0; n < (int64_t)c->B * c->L; n++) {
    bool home = n / c->L >= b0 && n / c->L < b1;
    for (int e = 0; e < c->E; e++) {
      if (cb[n * c->E + e] == 0.0f) continue;
      bool mine = owner_of(c, e) == j;
      if (home != mine) rows++; /* sent from here to another member, or to here from one */
    }
  }
  return (uint64_t)(P - 1) * El * sizeof(int32_t) + 2 * rows * c->C * sizeof(float);
}

/* Runs the case with its plugins and on one rank without; compares everything. */
static void compare_with_one_rank(ep_case c, bool bit_equal) {
  tsr_plugin_job plugins;
  char msg[1024];
  if (load(&c, NULL, c.E, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  ep_case one = c;
  one.ndim = 1;
  one.shape[0] = 1;
  one.names[0] = "ep";
  one.reg = NULL;
  c.reg = plugins.reg;
  if (tsr_local_launch(1, 60.0, run_ops, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (tsr_local_launch(world_of(&c), 60.0, run_ops, &c) != TSR_OK) fail_msg("%s", tsr_last_error());
  float tol = bit_equal ? 0.0f : 1e-5f;
  tsr_test_expect_close(c.out, one.out, tol, tol, "out", 0);
  for (int k = 0; k < NLEAVES; k++)
    tsr_test_expect_close(c.grads[k], one.grads[k], tol, tol, leaf_names[k], k);
  if (c.avoid > 0) {
    /* the avoided experts got no token: their weights' gradients are zero */
    const float *cb = tsr_tensor_data(one.combine);
    for (int64_t n = 0; n < (int64_t)c.B * c.L; n++)
      for (int e = c.E - c.avoid; e < c.E; e++) assert_true(cb[n * c.E + e] == 0.0f);
  }
  if (c.ndim == 1)
    for (int j = 0; j < c.shape[0]; j++) {
      ep_case ref = c;
      ref.combine = one.combine;
      uint64_t want = expected_bytes(&ref, j);
      if (c.bytes[j] != want)
        fail_msg("ep member %d counted %llu bytes; the routing gives %llu", j,
                 (unsigned long long)c.bytes[j], (unsigned long long)want);
    }
  results_free(&one);
  results_free(&c);
  tsr_plugin_job_free(&plugins);
}

/* A case; sizes left 0 take B 4, L 8, C 16, I 8, E 8, top_k 2. */
#define CASE(...) defaults((ep_case){__VA_ARGS__})

static ep_case defaults(ep_case c) {
  c.B = c.B ? c.B : 4;
  c.L = c.L ? c.L : 8;
  c.C = c.C ? c.C : 16;
  c.I = c.I ? c.I : 8;
  c.E = c.E ? c.E : 8;
  c.top_k = c.top_k ? c.top_k : 2;
  return c;
}

static void test_ep2(void **s) {
  compare_with_one_rank(CASE(.ndim = 1, .shape = {2}, .names = {"ep"}), true);
}
static void test_ep4(void **s) {
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}), true);
}
static void test_ep4_top1(void **s) {
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .top_k = 1), true);
}
static void test_ep2_idle_rank(void **s) {
  /* nobody picks experts 4 ..< 8: ep member 1 receives no token */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {2}, .names = {"ep"}, .avoid = 4), true);
}
static void test_ep4_idle_rank(void **s) {
  /* nobody picks experts 6, 7: ep member 3 receives no token, yet sends its own */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .avoid = 2), true);
}
static void test_ep4_idle_ranks_top1(void **s) {
  /* one expert per token among 0 ..< 4: members 2 and 3 receive nothing */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .avoid = 4, .top_k = 1),
                        true);
}
static void test_ep4_uneven_batch(void **s) {
  /* a batch of 3 over 4 is 1, 1, 1, 0: member 3 holds no token but serves experts 6, 7 */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .B = 3), true);
}
static void test_ep4_all_experts(void **s) {
  /* every token picks every expert: each row goes to every rank */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .top_k = 8), true);
}
static void test_ep4_wide(void **s) {
  /* sizes where the GEMMs take their blocked paths: 128 tokens, C 64, I 48, 16 experts, top 4 */
  compare_with_one_rank(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}, .L = 32, .C = 64, .I = 48,
                             .E = 16, .top_k = 4),
                        true);
}
static void test_dp2_ep2(void **s) {
  compare_with_one_rank(CASE(.ndim = 2, .shape = {2, 2}, .names = {"dp", "ep"}), false);
}
static void test_ep2_dp2(void **s) {
  compare_with_one_rank(CASE(.ndim = 2, .shape = {2, 2}, .names = {"ep", "dp"}), false);
}
static void test_ep2_tp2(void **s) {
  compare_with_one_rank(CASE(.ndim = 2, .shape = {2, 2}, .names = {"ep", "tp"}), false);
}
static void test_ring2_ep2(void **s) {
  compare_with_one_rank(CASE(.ndim = 2, .shape = {2, 2}, .names = {"ring_cp", "ep"}), false);
}
static void test_dp2_ring2_ep2(void **s) {
  compare_with_one_rank(
      CASE(.ndim = 3, .shape = {2, 2, 2}, .names = {"dp", "ring_cp", "ep"}, .avoid = 2), false);
}

/* ---- the job checks ---- */

static void load_fails(ep_case c, const char *extra, int experts, tsr_status want_st,
                       const char *want) {
  tsr_plugin_job plugins;
  char msg[1024];
  tsr_status st = load(&c, extra, experts, &plugins, msg, sizeof msg);
  if (st == TSR_OK) tsr_plugin_job_free(&plugins);
  if (st != want_st)
    fail_msg("status %s, expected %s: %s", tsr_status_name(st), tsr_status_name(want_st), msg);
  if (!strstr(msg, want)) fail_msg("message\n  %s\nlacks\n  %s", msg, want);
}

static void test_job_checks(void **s) {
  load_fails(CASE(.ndim = 1, .shape = {4}, .names = {"ep"}), NULL, 6, TSR_EINVAL,
             "ep.ini:13: [model] num_local_experts: 6 experts cannot be split over ep = 4");
  load_fails(CASE(.ndim = 1, .shape = {3}, .names = {"ep"}), NULL, 8, TSR_EINVAL,
             "use a multiple of 3 experts, or an ep that divides 8");
  load_fails(CASE(.ndim = 1, .shape = {2}, .names = {"ep"}), "[job]\ndevice = emu\n", 8, TSR_EINVAL,
             "plugin ep moves the routed tokens with the host kernels");
  /* ep of 1 checks nothing; a dense model on ep > 1 is data parallelism, on any device */
  tsr_plugin_job plugins;
  char msg[1024];
  ep_case one = CASE(.ndim = 1, .shape = {1}, .names = {"ep"});
  if (load(&one, NULL, 6, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("ep = 1: %s", msg);
  tsr_plugin_job_free(&plugins);
  ep_case dense = CASE(.ndim = 1, .shape = {4}, .names = {"ep"});
  if (load(&dense, "[job]\ndevice = emu\n", 0, &plugins, msg, sizeof msg) != TSR_OK)
    fail_msg("dense: %s", msg);
  tsr_plugin_job_free(&plugins);
}

/* ---- what other plugins registered: check_registry ---- */

static tsr_status no_compute(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx) {
  return TSR_ENOTSUP;
}

static tsr_status no_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, const tsr_dtensor *const *outs,
                              const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                              void *ctx) {
  return TSR_ENOTSUP;
}

/* Runs ep's check_registry on a registry holding what another plugin, "other", registers on tp
 * (an experts style, or a communicating moe_experts rule); NULL want: it must pass. */
static void check_with(const tsr_module_style *style, const tsr_op_rule *rule, const char *want) {
  tsr_plugin_job job;
  char msg[1024];
  ep_case c = CASE(.ndim = 2, .shape = {2, 2}, .names = {"ep", "tp"});
  if (load(&c, NULL, 8, &job, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  const tsr_strategy *ep = NULL;
  for (int i = 0; i < tsr_plugin_set_count(job.set); i++) {
    const tsr_strategy *d = tsr_plugin_set_strategy(job.set, i);
    if (d && !strcmp(d->name, "ep")) ep = d;
  }
  assert_non_null(ep);
  assert_true(TSR_STRATEGY_HAS(ep, check_registry) && ep->check_registry);
  tsr_registry_t *reg = NULL;
  assert_int_equal(tsr_registry_new(&reg), TSR_OK);
  if (style) assert_int_equal(tsr_registry_add_module_style(reg, style), TSR_OK);
  if (rule) assert_int_equal(tsr_registry_add_op_rule(reg, rule), TSR_OK);
  tsr_plugin_args args = {job.cfg, "ep", "libtessera-ep.so", TSR_ABI_MAJOR, TSR_ABI_MINOR};
  tsr_status st = ep->check_registry(reg, &args, NULL);
  snprintf(msg, sizeof msg, "%s", st ? tsr_last_error() : "");
  tsr_registry_free(reg);
  tsr_plugin_job_free(&job);
  if (!want) {
    if (st != TSR_OK) fail_msg("refused: %s", msg);
    return;
  }
  if (st != TSR_EINVAL) fail_msg("status %s, expected EINVAL", tsr_status_name(st));
  if (!strstr(msg, want)) fail_msg("message\n  %s\nlacks\n  %s", msg, want);
}

static void test_check_registry(void **s) {
  tsr_module_style split = {.style = TSR_STYLE_EXPERTS,
                            .mesh_dim = "tp",
                            .owner = "other",
                            .nparams = 1,
                            .params = {{"weight", tsr_shard(0)}},
                            .input = tsr_replicate(),
                            .output = tsr_replicate()};
  check_with(&split, NULL,
             "[mesh] dims: plugin other splits the experts over tp = 2 and ep splits them over "
             "ep = 2");
  tsr_module_style by_width = split;
  by_width.params[0].placement = tsr_shard(1); /* splits each expert, not the experts */
  check_with(&by_width, NULL, NULL);
  tsr_placement R = tsr_replicate();
  tsr_op_rule moves = {.name = "other.moe_experts",
                       .op = TSR_OP_MOE_EXPERTS,
                       .mesh_dim = "tp",
                       .ninputs = 4,
                       .inputs = {R, R, R, R},
                       .noutputs = 1,
                       .outputs = {R},
                       .grads = {R, R, R, R},
                       .compute = no_compute,
                       .backward = no_backward};
  check_with(NULL, &moves,
             "rule 'other.moe_experts' communicates inside moe_experts on tp and so does ep's");
  moves.composes = true; /* it hands the op to ep's rule */
  check_with(NULL, &moves, NULL);
}

/* ---- a dense model: ep is data parallelism ---- */

typedef struct dense_case {
  int n;
  const tsr_registry_t *reg;
  tsr_test_step_result res;
  uint64_t bytes;
} dense_case;

static const tsr_llama_config dense_model = {.vocab_size = 19,
                                             .hidden_size = 16,
                                             .intermediate_size = 8,
                                             .num_hidden_layers = 2,
                                             .num_attention_heads = 4,
                                             .num_key_value_heads = 2,
                                             .rms_norm_eps = 1e-5f,
                                             .rope_theta = 10000.0f};

static void read_bytes(tsr_rank_t *r, void *arg) {
  dense_case *c = arg;
  if (tsr_rank_id(r) == 0) c->bytes = tsr_comm_bytes(tsr_rank_comm(r), "ep");
}

static tsr_status run_dense(tsr_comm_t *comm, void *arg) {
  dense_case *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  const char *names[1] = {"ep"};
  int32_t data[2][4 * 8];
  for (int i = 0; i < 4 * 8; i++) {
    data[0][i] = (i * 5 + i / 3) % 19;
    data[1][i] = i % 7 == 3 ? -100 : (i * 5 + 1 + i / 3) % 19;
  }
  bool in_model = false;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(c->n, 1, &c->n, names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &dense_model, 7, &model), st);
  TSR_CHECK_GOTO(tsr_llama_batch(r, m, 4, 8, data[0], &ids), st);
  TSR_CHECK_GOTO(tsr_llama_batch(r, m, 4, 8, data[1], &labels), st);
  tsr_comm_bytes_reset(comm);
  st = tsr_test_step(r, m, model, ids, labels, 1e-2, read_bytes, c, &c->res, &in_model);
cleanup:
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_dense_is_data_parallel(void **s) {
  tsr_plugin_job plugins;
  char msg[1024];
  ep_case jc = CASE(.ndim = 1, .shape = {2}, .names = {"ep"});
  if (load(&jc, NULL, 0, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  dense_case one = {.n = 1}, two = {.n = 2, .reg = plugins.reg};
  if (tsr_local_launch(1, 60.0, run_dense, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (tsr_local_launch(2, 60.0, run_dense, &two) != TSR_OK) fail_msg("%s", tsr_last_error());
  tsr_test_step_expect_close(&two.res, &one.res, 1e-4f, 1e-4f);
  /* the gradient all-reduce over ep (over 2 ranks it sends each gradient's bytes once) and the
   * loss's count of valid tokens (one i64), nothing else */
  uint64_t params = 0;
  for (int i = 0; i < one.res.nparams; i++) params += tsr_tensor_numel(one.res.grads[i]);
  assert_int_equal(two.bytes, params * sizeof(float) + sizeof(int64_t));
  tsr_test_step_result_free(&one.res);
  tsr_test_step_result_free(&two.res);
  tsr_plugin_job_free(&plugins);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ep2),
      cmocka_unit_test(test_ep4),
      cmocka_unit_test(test_ep4_top1),
      cmocka_unit_test(test_ep2_idle_rank),
      cmocka_unit_test(test_ep4_idle_rank),
      cmocka_unit_test(test_ep4_idle_ranks_top1),
      cmocka_unit_test(test_ep4_uneven_batch),
      cmocka_unit_test(test_ep4_all_experts),
      cmocka_unit_test(test_ep4_wide),
      cmocka_unit_test(test_dp2_ep2),
      cmocka_unit_test(test_ep2_dp2),
      cmocka_unit_test(test_ep2_tp2),
      cmocka_unit_test(test_ring2_ep2),
      cmocka_unit_test(test_dp2_ring2_ep2),
      cmocka_unit_test(test_job_checks),
      cmocka_unit_test(test_check_registry),
      cmocka_unit_test(test_dense_is_data_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
