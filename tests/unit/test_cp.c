/* Context parallelism: the cp_ring and cp_ulysses plugins, loaded through the loader, against
 * the 1-rank run of the same Llama step (logits, loss, every gradient and every parameter after
 * one AdamW step, rtol/atol 1e-4): ring attention over 2 and 4 ranks with both load balancers,
 * Ulysses over 2 and 4 (kv heads replicated when there are fewer than ranks), both at once in
 * either mesh order, each beside tp (the tp plugin) and dp (no plugin: its rules are the core's).
 * Also the bytes one attention moves on each cp dim against the formula, and the errors for
 * heads and sequence lengths the mesh cannot split. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "llama.h"
#include "tessera/ops.h"
#include "tessera/plugin.h"

#define MAX_DIMS 4

typedef struct cp_case {
  int ndim, shape[MAX_DIMS];
  const char *names[MAX_DIMS];
  const char *balance; /* cp_ring's load_balance; NULL: none */
  int heads, kv_heads; /* 0: 4 and 2 */
  int batch, seq;      /* 0: 2 and 8 */
  /* what the job file declares instead (0: the same), to reach the rules' own checks */
  int job_seq, job_kv_heads;
  const tsr_registry_t *reg;
  tsr_test_step_result res; /* filled by rank 0 */
  tsr_status st0;
  char msg0[1024];
} cp_case;

static tsr_llama_config model_cfg(const cp_case *c) {
  tsr_llama_config m = {.vocab_size = 19,
                        .hidden_size = 4 * (c->heads ? c->heads : 4), /* head dim 4 */
                        .intermediate_size = 20,
                        .num_hidden_layers = 2,
                        .num_attention_heads = c->heads ? c->heads : 4,
                        .num_key_value_heads = c->kv_heads ? c->kv_heads : 2,
                        .rms_norm_eps = 1e-5f,
                        .rope_theta = 10000.0f};
  return m;
}

static const char *plugin_of(const char *dim) {
  if (!strcmp(dim, "ring_cp")) return "cp_ring";
  if (!strcmp(dim, "ulysses_cp") || !strcmp(dim, "ulysess_cp")) return "cp_ulysses";
  if (!strcmp(dim, "tp")) return "tp";
  if (!strcmp(dim, "dp")) return "dp";
  return NULL;
}

/* The job file the plugins see: the case's mesh, the model and the data shape. */
static void job_text(const cp_case *c, char *buf, size_t len) {
  char dims[128] = "", shape[64] = "", load[128] = "";
  for (int i = 0; i < c->ndim; i++) {
    const char *p = plugin_of(c->names[i]);
    if (!p) continue;
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s", *dims ? ", " : "",
             c->names[i]);
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%d", *shape ? ", " : "",
             c->shape[i]);
    snprintf(load + strlen(load), sizeof load - strlen(load), "%s%s", *load ? ", " : "", p);
  }
  tsr_llama_config m = model_cfg(c);
  if (c->job_kv_heads) m.num_key_value_heads = c->job_kv_heads;
  snprintf(buf, len,
           "[mesh]\ndims = %s\nshape = %s\n[plugins]\nload = %s\n%s%s%s"
           "[model]\nvocab_size = %d\nhidden_size = %d\nintermediate_size = %d\n"
           "num_hidden_layers = %d\nnum_attention_heads = %d\nnum_key_value_heads = %d\n"
           "[data]\nbatch_size = %d\nseq_len = %d\n",
           dims, shape, load, strstr(load, "cp_ring") ? "[strategy.cp_ring]\nload_balance = " : "",
           strstr(load, "cp_ring") ? (c->balance ? c->balance : "none") : "",
           strstr(load, "cp_ring") ? "\n" : "", m.vocab_size, m.hidden_size, m.intermediate_size,
           m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, c->batch,
           c->job_seq ? c->job_seq : c->seq);
}

/* Loads the case's plugins; the status of the load, its message in msg. */
static tsr_status load_plugins(cp_case *c, tsr_plugin_job *out, char *msg, size_t len) {
  if (!c->batch) c->batch = 2;
  if (!c->seq) c->seq = 8;
  char text[2048];
  job_text(c, text, sizeof text);
  tsr_status st = tsr_plugin_job_load_string(text, "cp.ini", out);
  snprintf(msg, len, "%s", st ? tsr_last_error() : "");
  return st;
}

static tsr_status batch_var(tsr_rank_t *r, const tsr_mesh_t *m, int V, int B, int L, bool labels,
                            tsr_var **out) {
  int32_t p[512];
  TSR_INVARIANT(B * L <= 512);
  for (int i = 0; i < B * L; i++)
    p[i] = labels && (i % 7 == 3 || i >= B * L - 3) ? -100 : (i * 5 + (labels ? 1 : 0) + i / 3) % V;
  return tsr_llama_batch(r, m, B, L, p, out);
}

static tsr_status run_step(tsr_comm_t *comm, void *arg) {
  cp_case *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  bool me0 = tsr_comm_rank(comm) == 0, in_model = false;
  tsr_status st = TSR_OK;
  tsr_llama_config mc = model_cfg(c);
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), c->ndim, c->shape, c->names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &mc, 7, &model), st);
  TSR_CHECK_GOTO(batch_var(r, m, mc.vocab_size, c->batch, c->seq, false, &ids), st);
  TSR_CHECK_GOTO(batch_var(r, m, mc.vocab_size, c->batch, c->seq, true, &labels), st);
  st = tsr_test_step(r, m, model, ids, labels, 1e-2, NULL, NULL, &c->res, &in_model);
  if (me0) {
    c->st0 = in_model ? st : TSR_OK;
    snprintf(c->msg0, sizeof c->msg0, "%s", in_model ? tsr_last_error() : "");
  }
  if (in_model) st = TSR_OK; /* an expected failure is inspected by the test */
cleanup:
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static int world_of(const cp_case *c) {
  int w = 1;
  for (int i = 0; i < c->ndim; i++) w *= c->shape[i];
  return w;
}

/* Runs the case on its mesh with its plugins and on one rank without; compares everything. */
static void compare_with_one_rank(cp_case *c) {
  tsr_plugin_job plugins;
  char msg[1024];
  if (load_plugins(c, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  cp_case one = *c;
  one.ndim = 1;
  one.shape[0] = 1;
  one.names[0] = "dp";
  one.reg = NULL;
  c->reg = plugins.reg;
  /* the run's mesh takes the dim names the loader settled (an owner's alias renamed) */
  for (int i = 0; i < c->ndim; i++)
    for (int k = 0; k < plugins.cfg->mesh.ndim; k++)
      if (!strcmp(plugin_of(c->names[i]), plugin_of(plugins.cfg->mesh.names[k])))
        c->names[i] = plugins.cfg->mesh.names[k];
  if (tsr_local_launch(1, 60.0, run_step, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (tsr_local_launch(world_of(c), 60.0, run_step, c) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (c->st0 != TSR_OK) fail_msg("%s", c->msg0);
  tsr_test_step_expect_close(&c->res, &one.res, 1e-4f, 1e-4f);
  tsr_test_step_result_free(&one.res);
  tsr_test_step_result_free(&c->res);
  tsr_plugin_job_free(&plugins);
}

#define CASE(...) ((cp_case){__VA_ARGS__})

static void test_ring2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {2}, .names = {"ring_cp"}));
}
static void test_ring2_zigzag(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {2}, .names = {"ring_cp"}, .balance = "zigzag"));
}
static void test_ring4(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {4}, .names = {"ring_cp"}));
}
static void test_ring4_zigzag(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {4}, .names = {"ring_cp"}, .balance = "zigzag"));
}
static void test_ulysses2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {2}, .names = {"ulysses_cp"}));
}
static void test_ulysses4_replicated_kv(void **s) {
  /* 2 kv heads over 4 ranks: each kv head is repeated for the two ranks whose queries read it */
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {4}, .names = {"ulysses_cp"}));
}
static void test_ulysses2_seed_spelling(void **s) {
  compare_with_one_rank(&CASE(.ndim = 1, .shape = {2}, .names = {"ulysess_cp"}));
}
static void test_ring2_ulysses2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 2, .shape = {2, 2}, .names = {"ring_cp", "ulysses_cp"}));
}
static void test_ulysses2_ring2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 2, .shape = {2, 2}, .names = {"ulysses_cp", "ring_cp"}));
}
static void test_ring2_ulysses2_zigzag(void **s) {
  compare_with_one_rank(
      &CASE(.ndim = 2, .shape = {2, 2}, .names = {"ring_cp", "ulysses_cp"}, .balance = "zigzag"));
}
static void test_dp2_ring2_zigzag(void **s) {
  compare_with_one_rank(
      &CASE(.ndim = 2, .shape = {2, 2}, .names = {"dp", "ring_cp"}, .balance = "zigzag"));
}
static void test_tp2_ring2_zigzag(void **s) {
  compare_with_one_rank(
      &CASE(.ndim = 2, .shape = {2, 2}, .names = {"tp", "ring_cp"}, .balance = "zigzag"));
}
static void test_ring2_tp2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 2, .shape = {2, 2}, .names = {"ring_cp", "tp"}));
}
static void test_dp2_ulysses2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 2, .shape = {2, 2}, .names = {"dp", "ulysses_cp"}));
}
static void test_tp2_ulysses2(void **s) {
  /* one kv head per tp rank, replicated over the two Ulysses ranks */
  compare_with_one_rank(&CASE(.ndim = 2, .shape = {2, 2}, .names = {"tp", "ulysses_cp"}));
}
static void test_dp2_ring2_ulysses2(void **s) {
  compare_with_one_rank(&CASE(.ndim = 3, .shape = {2, 2, 2},
                              .names = {"dp", "ring_cp", "ulysses_cp"}, .balance = "zigzag"));
}
static void test_tp2_ulysses2_ring2(void **s) {
  compare_with_one_rank(
      &CASE(.ndim = 3, .shape = {2, 2, 2}, .names = {"tp", "ulysses_cp", "ring_cp"}));
}

/* ---- errors ---- */

static void load_fails(cp_case c, const char *want) {
  tsr_plugin_job plugins;
  char msg[1024];
  tsr_status st = load_plugins(&c, &plugins, msg, sizeof msg);
  if (st == TSR_OK) tsr_plugin_job_free(&plugins);
  if (st != TSR_EINVAL) fail_msg("status %s, expected EINVAL: %s", tsr_status_name(st), msg);
  if (!strstr(msg, want)) fail_msg("message\n  %s\nlacks\n  %s", msg, want);
}

static void test_plan_errors(void **s) {
  load_fails(CASE(.ndim = 1, .shape = {3}, .names = {"ulysses_cp"}, .seq = 6),
             "cp.ini:11: [model] num_attention_heads: 4 attention heads cannot be split over "
             "ulysses_cp = 3");
  load_fails(
      CASE(.ndim = 1, .shape = {2}, .names = {"ulysses_cp"}, .heads = 8, .kv_heads = 4, .seq = 7),
      "[data] seq_len: 7 tokens cannot be split over ulysses_cp = 2");
  load_fails(CASE(.ndim = 2, .shape = {2, 4}, .names = {"tp", "ulysses_cp"}, .kv_heads = 4),
             "[model] num_attention_heads: 2 attention heads per tp rank cannot be split over "
             "ulysses_cp = 4");
  /* 12 query heads split 6 ways, but 4 kv heads neither divide nor are divided by 6 */
  load_fails(
      CASE(.ndim = 1, .shape = {6}, .names = {"ulysses_cp"}, .heads = 12, .kv_heads = 4, .seq = 12),
      "[model] num_key_value_heads: 4 kv heads over ulysses_cp = 6: the degree must divide "
      "them");
  load_fails(CASE(.ndim = 1, .shape = {4}, .names = {"ring_cp"}, .seq = 6),
             "[data] seq_len: 6 tokens cannot be split into 4 equal ring blocks (ring_cp = 4)");
  load_fails(CASE(.ndim = 1, .shape = {2}, .names = {"ring_cp"}, .balance = "zigzag", .seq = 6),
             "6 tokens cannot be split into 4 equal ring blocks (ring_cp = 2, two chunks per rank "
             "with zigzag)");
  load_fails(
      CASE(.ndim = 2, .shape = {2, 2}, .names = {"ulysses_cp", "ring_cp"}, .balance = "zigzag"),
      "[mesh] dims: ulysses_cp comes before ring_cp, which load_balance = zigzag does not "
      "support");
  load_fails(CASE(.ndim = 1, .shape = {2}, .names = {"ring_cp"}, .balance = "diagonal"),
             "load_balance");
}

/* A run whose sequence the plugins were not told about still fails clearly, in the rules. */
static void run_fails(cp_case c, const char *want) {
  tsr_plugin_job plugins;
  char msg[1024];
  if (load_plugins(&c, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  c.reg = plugins.reg;
  if (tsr_local_launch(world_of(&c), 60.0, run_step, &c) != TSR_OK)
    fail_msg("%s", tsr_last_error());
  tsr_test_step_result_free(&c.res);
  tsr_plugin_job_free(&plugins);
  if (c.st0 == TSR_OK) fail_msg("the run succeeded; expected: %s", want);
  if (!strstr(c.msg0, want)) fail_msg("message\n  %s\nlacks\n  %s", c.msg0, want);
}

static void test_rule_errors(void **s) {
  run_fails(CASE(.ndim = 1, .shape = {4}, .names = {"ring_cp"}, .seq = 6, .job_seq = 8),
            "cp_ring: ring_cp member 0 holds 2 sequence rows and member 3 holds 0");
  run_fails(CASE(.ndim = 1, .shape = {2}, .names = {"ring_cp"}, .balance = "zigzag", .seq = 6,
                 .job_seq = 8),
            "which zigzag over ring_cp = 2 cannot split into 4 equal chunks");
  run_fails(CASE(.ndim = 1, .shape = {3}, .names = {"ulysses_cp"}, .heads = 6, .kv_heads = 2,
                 .job_kv_heads = 3, .seq = 6, .batch = 1),
            "ulysses_cp: 2 kv heads on this rank over ulysses_cp = 3");
}

/* ---- bytes of one attention, forward and backward ---- */

typedef struct bytes_case {
  const char *dim;
  int n, B, L, Hq, Hkv, D;
  uint64_t bytes; /* rank 0's, on the dim's label */
} bytes_case;

static tsr_status seq_var(tsr_rank_t *r, const tsr_mesh_t *m, const int64_t *shape, int seed,
                          tsr_var **out) {
  tsr_tensor *t;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 4, shape, &t));
  float *p = tsr_tensor_data(t);
  for (int64_t i = 0; i < tsr_tensor_numel(t); i++) p[i] = (float)((i * 37 + seed) % 17) / 17.0f;
  tsr_placement s1[1] = {tsr_shard(1)};
  tsr_dtensor *d = NULL;
  tsr_status st = tsr_dtensor_distribute(r, m, t, s1, &d);
  tsr_tensor_free(t);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, true, NULL, out);
}

static tsr_status run_attention(tsr_comm_t *comm, void *arg) {
  bytes_case *c = arg;
  const tsr_registry_t *reg = *(const tsr_registry_t *const *)((char *)arg + sizeof *c);
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tape_t *t = NULL;
  tsr_var *q = NULL, *k = NULL, *v = NULL, *o;
  tsr_status st = TSR_OK;
  int64_t qs[4] = {c->B, c->L, c->Hq, c->D}, ks[4] = {c->B, c->L, c->Hkv, c->D};
  TSR_CHECK_GOTO(tsr_rank_new(comm, reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(c->n, 1, &c->n, &c->dim, &m), st);
  TSR_CHECK_GOTO(seq_var(r, m, qs, 1, &q), st);
  TSR_CHECK_GOTO(seq_var(r, m, ks, 2, &k), st);
  TSR_CHECK_GOTO(seq_var(r, m, ks, 3, &v), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_comm_bytes_reset(comm);
  TSR_CHECK_GOTO(tsr_op_sdpa(t, q, k, v, true, &o), st);
  tsr_dtensor *g = NULL;
  TSR_CHECK_GOTO(tsr_dtensor_clone(r, o->value, &g), st);
  TSR_CHECK_GOTO(tsr_tape_backward_with(t, o, g), st);
  if (tsr_comm_rank(comm) == 0) c->bytes = tsr_comm_bytes(comm, c->dim);
cleanup:
  tsr_tape_free(t);
  tsr_var_free(q);
  tsr_var_free(k);
  tsr_var_free(v);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static uint64_t attention_bytes(const char *dim, int n, int B, int L, int Hq, int Hkv, int D) {
  struct {
    bytes_case c;
    const tsr_registry_t *reg;
  } arg = {{dim, n, B, L, Hq, Hkv, D, 0}, NULL};
  cp_case jc = CASE(.ndim = 1, .shape = {n}, .names = {dim}, .heads = Hq, .kv_heads = Hkv, .seq = L,
                    .batch = B);
  tsr_plugin_job plugins;
  char msg[1024];
  if (load_plugins(&jc, &plugins, msg, sizeof msg) != TSR_OK) fail_msg("load: %s", msg);
  arg.reg = plugins.reg;
  if (tsr_local_launch(n, 60.0, run_attention, &arg) != TSR_OK) fail_msg("%s", tsr_last_error());
  tsr_plugin_job_free(&plugins);
  return arg.c.bytes;
}

static void test_attention_bytes(void **s) {
  /* ring: K and V go n-1 steps forward; backward K, V, dK, dV go n-1 steps and dK, dV one more */
  for (int n = 2; n <= 4; n += 2) {
    uint64_t kv = (uint64_t)2 * (16 / n) * 3 * 4 * sizeof(float); /* one of k, v on a rank */
    assert_int_equal(attention_bytes("ring_cp", n, 2, 16, 6, 3, 4),
                     (uint64_t)(n - 1) * 2 * kv + (uint64_t)(n - 1) * 4 * kv + 2 * kv);
  }
  /* Ulysses: q, k, v and the output move once each way, as do their gradients; each all-to-all
   * keeps 1/n of the tensor on its rank. With 2 kv heads over 4 ranks they move repeated to 4. */
  uint64_t q = 2 * (16 / 2) * 4 * 4 * sizeof(float), k = 2 * (16 / 2) * 2 * 4 * sizeof(float);
  assert_int_equal(attention_bytes("ulysses_cp", 2, 2, 16, 4, 2, 4), (4 * q + 4 * k) / 2);
  q = 2 * (16 / 4) * 4 * 4 * sizeof(float);
  k = 2 * (16 / 4) * 4 * 4 * sizeof(float);
  assert_int_equal(attention_bytes("ulysses_cp", 4, 2, 16, 4, 2, 4), (4 * q + 4 * k) * 3 / 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring2),
      cmocka_unit_test(test_ring2_zigzag),
      cmocka_unit_test(test_ring4),
      cmocka_unit_test(test_ring4_zigzag),
      cmocka_unit_test(test_ulysses2),
      cmocka_unit_test(test_ulysses4_replicated_kv),
      cmocka_unit_test(test_ulysses2_seed_spelling),
      cmocka_unit_test(test_ring2_ulysses2),
      cmocka_unit_test(test_ulysses2_ring2),
      cmocka_unit_test(test_ring2_ulysses2_zigzag),
      cmocka_unit_test(test_dp2_ring2_zigzag),
      cmocka_unit_test(test_tp2_ring2_zigzag),
      cmocka_unit_test(test_ring2_tp2),
      cmocka_unit_test(test_dp2_ulysses2),
      cmocka_unit_test(test_tp2_ulysses2),
      cmocka_unit_test(test_dp2_ring2_ulysses2),
      cmocka_unit_test(test_tp2_ulysses2_ring2),
      cmocka_unit_test(test_plan_errors),
      cmocka_unit_test(test_rule_errors),
      cmocka_unit_test(test_attention_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
