/* The tp and sp plugins, loaded from the build tree as a job loads them, against the 1-rank run:
 * logits, loss, every gradient and every parameter after one AdamW step (rtol = atol = 1e-4) for
 * tp = 2, 3, 4 and tp+sp = 2, 4, with grouped-query attention (kv heads split, and replicated
 * when tp has more ranks than kv heads), uneven vocabulary / intermediate / sequence splits, a
 * tied lm_head, the gathered loss, and dp beside tp. Each run also checks, on every rank, the
 * bytes the step moved on the tp dim against the formula in expected_tp_bytes. Last, the job
 * errors the plugins report at plan time. */
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

#define MAX_RANKS 8

typedef struct tp_case {
  int dp, tp;
  bool sp, loss_parallel;
  tsr_llama_config cfg;
  int batch, seq;
  /* filled by the run */
  tsr_registry_t *reg;
  tsr_test_step_result res;
  uint64_t tp_bytes[MAX_RANKS]; /* per rank: forward, backward and gradient resolution */
} tp_case;

static tsr_llama_config model(int V, int C, int I, int H, int kv, bool tied) {
  return (tsr_llama_config){.vocab_size = V,
                            .hidden_size = C,
                            .intermediate_size = I,
                            .num_hidden_layers = 2,
                            .num_attention_heads = H,
                            .num_key_value_heads = kv,
                            .rms_norm_eps = 1e-5f,
                            .rope_theta = 10000.0f,
                            .tie_word_embeddings = tied};
}

/* ---- the analytic bytes of one step on the tp dim ----
 * Counted as include/tessera/comm.h defines them, per rank i of n along tp, f32:
 *   all-reduce of c elements      (c - own) + own (n - 1), own = chunk(c, n, i)
 *   all-gather contributing own   own (n - 1)
 *   reduce-scatter of c to own    c - own
 *   all-to-all                    what goes to the other members
 * With N = B L tokens of this rank's batch, X = N C (one activation), Lyr layers:
 *   tp      fwd  embedding S(2)->R all-gather                               ag(N C_i)
 *                2 all-reduces per layer (after o_proj and down_proj)       2 Lyr ar(X)
 *           bwd  2 all-reduces per layer (the column inputs' gradients)     2 Lyr ar(X)
 *                lm_head input's gradient                                   ar(X)
 *   tp+sp   fwd  embedding S(2)->S(1) all-to-all                            B (L - L_i) C_i
 *                per layer 2 x (all-gather before, reduce-scatter after)    2 Lyr (ag + rs)
 *                all-gather before lm_head                                  ag(B L_i C)
 *           bwd  their adjoints: the same counts, and the inverse all-to-all B L_i (C - C_i)
 *                norm weights' Partial gradients, 2 Lyr + 1 all-reduces     (2 Lyr + 1) ar(C)
 *   tied lm_head (input replicated, weight S(1)): the logits' partial sums are reduce-scattered
 *                to the vocabulary shards, rs(N V), all-gathered back in backward, ag(N V_i), and
 *                the input gradient (split by hidden) is all-gathered / all-to-all'ed instead
 *   kv heads replicated: the key and value gradients, 2 Lyr ar(N Hkv D)
 *   loss parallel: ar(N) of the row max and ar(2N) of sum-exp and target logit; without it the
 *                logits are all-gathered, ag(N V_i).
 */
static int64_t ch(int64_t total, int n, int i) {
  return tsr_chunk_size(total, n, i);
}
static int64_t ar(int64_t c, int n, int i) {
  return (c - ch(c, n, i)) + ch(c, n, i) * (n - 1);
}

static uint64_t expected_tp_bytes(const tp_case *c, int i, int64_t B) {
  const tsr_llama_config *m = &c->cfg;
  int n = c->tp, Lyr = m->num_hidden_layers;
  int64_t L = c->seq, C = m->hidden_size, V = m->vocab_size, N = B * L, X = N * C;
  int64_t Ci = ch(C, n, i), Vi = ch(V, n, i), Li = ch(L, n, i), own = B * Li * C;
  int64_t kv = (int64_t)m->num_key_value_heads * (C / m->num_attention_heads);
  int64_t e = 0;
  if (!c->sp) {
    e += Ci * N * (n - 1);
    e += 4 * Lyr * ar(X, n, i);
    e += m->tie_word_embeddings ? (N * V - N * Vi) + N * Vi * (n - 1) + N * Ci * (n - 1)
                                : ar(X, n, i);
  } else {
    e += B * (L - Li) * Ci + B * Li * (C - Ci);
    e += 4 * Lyr * (own * (n - 1) + (X - own));
    e += (2 * Lyr + 1) * ar(C, n, i);
    e += own * (n - 1);
    e += m->tie_word_embeddings ? (N * V - N * Vi) + N * Vi * (n - 1) + B * (L - Li) * Ci : X - own;
  }
  if (n > m->num_key_value_heads) e += 2 * Lyr * ar(N * kv, n, i);
  e += c->loss_parallel ? ar(N, n, i) + ar(2 * N, n, i) : N * Vi * (n - 1);
  return 4 * (uint64_t)e;
}

/* ---- running one step ---- */

static tsr_status batch_var(tsr_rank_t *r, const tsr_mesh_t *m, const tp_case *c, bool labels,
                            tsr_var **out) {
  int32_t p[512];
  int V = c->cfg.vocab_size, n = c->batch * c->seq;
  TSR_INVARIANT(n <= 512);
  /* ids spread over the whole vocabulary, so every vocabulary shard sees targets */
  for (int i = 0; i < n; i++)
    p[i] =
        labels && (i % 5 == 2 || i == n - 1) ? -100 : (int32_t)((i * 37 + (labels ? 11 : 3)) % V);
  return tsr_llama_batch(r, m, c->batch, c->seq, p, out);
}

static void record_tp_bytes(tsr_rank_t *r, void *arg) {
  tp_case *c = arg;
  c->tp_bytes[tsr_rank_id(r)] = tsr_comm_bytes(tsr_rank_comm(r), "tp");
}

static tsr_status run_step(tsr_comm_t *comm, void *arg) {
  tp_case *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *lm = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  tsr_status st = TSR_OK;
  int shape[2] = {c->dp, c->tp};
  const char *names[2] = {"dp", "tp"};
  bool in_model;
  TSR_CHECK_GOTO(tsr_rank_new(comm, c->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), 2, shape, names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &c->cfg, 7, &lm), st);
  TSR_CHECK_GOTO(batch_var(r, m, c, false, &ids), st);
  TSR_CHECK_GOTO(batch_var(r, m, c, true, &labels), st);
  tsr_comm_bytes_reset(comm);
  st = tsr_test_step(r, m, lm, ids, labels, 1e-3, record_tp_bytes, c, &c->res, &in_model);
cleanup:
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(lm);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

/* The job file a run of `c` corresponds to; `extra` is appended. No dp plugin is loaded: the
 * test declares the batch split over dp and the core's generic rules do the rest (as in
 * test_model_mesh.c), so the job the loader checks keeps dp at 1 and the run's mesh adds it. */
static void job_text(const tp_case *c, const char *extra, char *buf, size_t len) {
  const tsr_llama_config *m = &c->cfg;
  snprintf(buf, len,
           "[job]\nsteps = 1\n[mesh]\ndims = dp, tp\nshape = %d, %d\n"
           "[plugins]\nload = %s\n[strategy.tp]\nloss_parallel = %s\n"
           "[model]\nvocab_size = %d\nhidden_size = %d\nintermediate_size = %d\n"
           "num_hidden_layers = %d\nnum_attention_heads = %d\nnum_key_value_heads = %d\n"
           "tie_word_embeddings = %s\n[data]\nbatch_size = %d\nseq_len = %d\n%s",
           1, c->tp, c->sp ? "tp, sp" : "tp", c->loss_parallel ? "true" : "false", m->vocab_size,
           m->hidden_size, m->intermediate_size, m->num_hidden_layers, m->num_attention_heads,
           m->num_key_value_heads, m->tie_word_embeddings ? "true" : "false", c->batch, c->seq,
           extra ? extra : "");
}

static void run_and_compare(tp_case many) {
  tp_case one = {.dp = 1, .tp = 1, .cfg = many.cfg, .batch = many.batch, .seq = many.seq};
  if (tsr_local_launch(1, 60.0, run_step, &one) != TSR_OK) fail_msg("%s", tsr_last_error());
  char text[1024];
  job_text(&many, NULL, text, sizeof text);
  tsr_plugin_job plugins;
  if (tsr_plugin_job_load_string(text, "job.ini", &plugins) != TSR_OK)
    fail_msg("%s", tsr_last_error());
  /* the run's dp splits the batch by declaration alone, as test_model_mesh.c's dims do */
  if (tsr_registry_add_data_split(plugins.reg, "test", "dp", tsr_shard(0)) != TSR_OK)
    fail_msg("%s", tsr_last_error());
  many.reg = plugins.reg;
  int world = many.dp * many.tp;
  if (tsr_local_launch(world, 60.0, run_step, &many) != TSR_OK) fail_msg("%s", tsr_last_error());
  tsr_test_step_expect_close(&many.res, &one.res, 1e-4f, 1e-4f);
  for (int rank = 0; rank < world; rank++) {
    int d = rank / many.tp, i = rank % many.tp;
    uint64_t want = expected_tp_bytes(&many, i, ch(many.batch, many.dp, d));
    if (many.tp_bytes[rank] != want)
      fail_msg("rank %d (tp %d): %llu bytes on tp, the formula says %llu", rank, i,
               (unsigned long long)many.tp_bytes[rank], (unsigned long long)want);
  }
  tsr_test_step_result_free(&one.res);
  tsr_test_step_result_free(&many.res);
  tsr_plugin_job_free(&plugins);
}

/* ---- tp ---- */

static void test_tp2_gqa_kv_split(void **s) {
  /* 4 q heads, 2 kv heads: one kv head per rank; vocabulary 19 splits 10 / 9 */
  run_and_compare((tp_case){.dp = 1,
                            .tp = 2,
                            .loss_parallel = true,
                            .cfg = model(19, 16, 20, 4, 2, false),
                            .batch = 2,
                            .seq = 6});
}

static void test_tp3_uneven_vocab_and_mlp(void **s) {
  /* vocabulary 19 -> 7, 7, 5; intermediate 20 -> 7, 7, 6; hidden 24 -> 8 each; 6 q / 3 kv */
  run_and_compare((tp_case){.dp = 1,
                            .tp = 3,
                            .loss_parallel = true,
                            .cfg = model(19, 24, 20, 6, 3, false),
                            .batch = 2,
                            .seq = 5});
}

static void test_tp4_vocab_250_kv_replicated(void **s) {
  /* 8 q heads, 2 kv heads over 4 ranks: each kv head serves two ranks, which keep it whole;
   * vocabulary 250 -> 63, 63, 63, 61 */
  run_and_compare((tp_case){.dp = 1,
                            .tp = 4,
                            .loss_parallel = true,
                            .cfg = model(250, 32, 44, 8, 2, false),
                            .batch = 2,
                            .seq = 5});
}

static void test_tp4_gathered_loss(void **s) {
  run_and_compare((tp_case){.dp = 1,
                            .tp = 4,
                            .loss_parallel = false,
                            .cfg = model(250, 32, 44, 8, 4, false),
                            .batch = 2,
                            .seq = 5});
}

static void test_tp2_tied_embeddings(void **s) {
  run_and_compare((tp_case){.dp = 1,
                            .tp = 2,
                            .loss_parallel = true,
                            .cfg = model(19, 16, 20, 4, 2, true),
                            .batch = 2,
                            .seq = 6});
}

static void test_dp2_tp2_uneven_batch(void **s) {
  run_and_compare((tp_case){.dp = 2,
                            .tp = 2,
                            .loss_parallel = true,
                            .cfg = model(19, 16, 20, 4, 2, false),
                            .batch = 3,
                            .seq = 4});
}

/* ---- tp + sp ---- */

static void test_sp2_uneven_sequence(void **s) {
  /* 7 tokens over 2 ranks: 4 and 3 */
  run_and_compare((tp_case){.dp = 1,
                            .tp = 2,
                            .sp = true,
                            .loss_parallel = true,
                            .cfg = model(19, 16, 20, 4, 2, false),
                            .batch = 2,
                            .seq = 7});
}

static void test_sp4_kv_replicated(void **s) {
  /* 7 tokens over 4 ranks: 2, 2, 2, 1, with the kv heads replicated */
  run_and_compare((tp_case){.dp = 1,
                            .tp = 4,
                            .sp = true,
                            .loss_parallel = true,
                            .cfg = model(250, 32, 44, 8, 2, false),
                            .batch = 2,
                            .seq = 7});
}

static void test_sp4_gathered_loss_tied(void **s) {
  run_and_compare((tp_case){.dp = 1,
                            .tp = 4,
                            .sp = true,
                            .loss_parallel = false,
                            .cfg = model(250, 32, 44, 8, 4, true),
                            .batch = 2,
                            .seq = 8});
}

static void test_dp2_sp2(void **s) {
  run_and_compare((tp_case){.dp = 2,
                            .tp = 2,
                            .sp = true,
                            .loss_parallel = true,
                            .cfg = model(19, 16, 20, 4, 2, true),
                            .batch = 3,
                            .seq = 5});
}

/* ---- errors at plan time ---- */

/* The loader puts the plugin's path before the fix (after the first ';'), so `want` and `fix`
 * are looked for apart. */
static void load_fails(tp_case c, const char *want, const char *fix) {
  char text[1024];
  job_text(&c, NULL, text, sizeof text);
  tsr_plugin_job plugins;
  if (tsr_plugin_job_load_string(text, "job.ini", &plugins) == TSR_OK)
    fail_msg("the job loaded; expected: %s", want);
  if (!strstr(tsr_last_error(), want))
    fail_msg("message\n  %s\nlacks\n  %s", tsr_last_error(), want);
  if (!strstr(tsr_last_error(), fix)) fail_msg("message\n  %s\nlacks\n  %s", tsr_last_error(), fix);
}

static void test_plan_time_errors(void **s) {
  /* the line numbers are those of job_text's layout */
  load_fails(
      (tp_case){.dp = 1, .tp = 3, .cfg = model(19, 16, 20, 4, 2, false), .batch = 2, .seq = 4},
      "job.ini:15: [model] num_attention_heads: 4 attention heads cannot be split over "
      "tp = 3",
      "use a multiple of 3 heads or a tp that divides 4");
  load_fails(
      (tp_case){.dp = 1, .tp = 2, .cfg = model(19, 24, 20, 6, 3, false), .batch = 2, .seq = 4},
      "job.ini:16: [model] num_key_value_heads: 3 kv heads over tp = 2: tp must divide "
      "the kv heads (they are split) or be a multiple of them (they are replicated)",
      "use e.g. num_key_value_heads = 2");
  load_fails((tp_case){.dp = 1,
                       .tp = 4,
                       .sp = true,
                       .cfg = model(19, 16, 20, 4, 2, false),
                       .batch = 2,
                       .seq = 5},
             "job.ini:20: [data] seq_len: 5 tokens over tp = 4 split into chunks of 2, leaving "
             "the last rank without tokens for sequence parallelism",
             "use a multiple of 4 or drop sp from [plugins] load");
}

static void test_loss_parallel_key_is_checked(void **s) {
  tp_case c = {.dp = 1, .tp = 2, .cfg = model(19, 16, 20, 4, 2, false), .batch = 2, .seq = 4};
  char text[1024];
  job_text(&c, NULL, text, sizeof text);
  char *lp = strstr(text, "loss_parallel = false");
  assert_non_null(lp);
  memcpy(lp, "loss_parallel = maybe", strlen("loss_parallel = maybe"));
  tsr_plugin_job plugins;
  assert_int_not_equal(tsr_plugin_job_load_string(text, "job.ini", &plugins), TSR_OK);
  assert_non_null(strstr(tsr_last_error(), "loss_parallel"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp2_gqa_kv_split),
      cmocka_unit_test(test_tp3_uneven_vocab_and_mlp),
      cmocka_unit_test(test_tp4_vocab_250_kv_replicated),
      cmocka_unit_test(test_tp4_gathered_loss),
      cmocka_unit_test(test_tp2_tied_embeddings),
      cmocka_unit_test(test_dp2_tp2_uneven_batch),
      cmocka_unit_test(test_sp2_uneven_sequence),
      cmocka_unit_test(test_sp4_kv_replicated),
      cmocka_unit_test(test_sp4_gathered_loss_tied),
      cmocka_unit_test(test_dp2_sp2),
      cmocka_unit_test(test_plan_time_errors),
      cmocka_unit_test(test_loss_parallel_key_is_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
