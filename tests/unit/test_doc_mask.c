/* Document masking ([data] mask = document): the attention kernels with segment ids against a
 * full-softmax reference in double and against finite differences, and the model on a packed
 * row against the same documents run one by one (an independent check of rope_doc and
 * sdpa_doc: the separate runs use the plain causal ops, positions from 0). */
#include <string.h>

#include "harness.h"
#include "llama.h"
#include "test_kernels_util.h"
#include "tessera/comm.h"
#include "tessera/kernels.h"
#include "tessera/ops.h"

/* ---- kernels ---- */

typedef struct seg_case {
  int B, Hq, Hkv, Lq, Lk, D;
  const int32_t *q_pos, *k_pos; /* (Lq), (Lk) or NULL: 0, 1, 2, ... */
  const int32_t *q_seg, *k_seg; /* (B, Lq), (B, Lk) */
  bool blhd;
  float *q, *k, *v, *out, *lse, *w; /* w: the weights of the loss sum(out * w) */
} seg_case;

static int32_t pos_at(const int32_t *p, int i) {
  return p ? p[i] : i;
}

/* Offset of row i of head h of batch b in a (B, H, L, D) or (B, L, H, D) tensor. */
static int64_t at(const seg_case *c, int b, int h, int i, int H, int L) {
  return c->blhd ? (((int64_t)b * L + i) * H + h) * c->D : (((int64_t)b * H + h) * L + i) * c->D;
}

static bool visible(const seg_case *c, int b, int i, int j) {
  return pos_at(c->k_pos, j) <= pos_at(c->q_pos, i) &&
         c->q_seg[b * c->Lq + i] == c->k_seg[b * c->Lk + j];
}

/* Softmax over the visible keys in double; a row that sees none: out 0, lse -inf. */
static void reference(const seg_case *c, double *out, double *lse) {
  int group = c->Hq / c->Hkv;
  double *p = calloc((size_t)c->Lk, sizeof(double));
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->Hq; h++)
      for (int i = 0; i < c->Lq; i++) {
        double m = -INFINITY;
        for (int j = 0; j < c->Lk; j++) {
          double s = 0;
          for (int d = 0; d < c->D; d++)
            s += (double)c->q[at(c, b, h, i, c->Hq, c->Lq) + d] *
                 c->k[at(c, b, h / group, j, c->Hkv, c->Lk) + d];
          p[j] = visible(c, b, i, j) ? s / sqrt((double)c->D) : -INFINITY;
          m = fmax(m, p[j]);
        }
        double *o = out + at(c, b, h, i, c->Hq, c->Lq), z = 0;
        for (int d = 0; d < c->D; d++) o[d] = 0;
        lse[((int64_t)b * c->Hq + h) * c->Lq + i] = -INFINITY;
        if (m == -INFINITY) continue;
        for (int j = 0; j < c->Lk; j++) z += exp(p[j] - m);
        for (int j = 0; j < c->Lk; j++)
          for (int d = 0; d < c->D; d++)
            o[d] += exp(p[j] - m) / z * c->v[at(c, b, h / group, j, c->Hkv, c->Lk) + d];
        lse[((int64_t)b * c->Hq + h) * c->Lq + i] = m + log(z);
      }
  free(p);
}

static tsr_status forward(seg_case *c) {
  return (c->blhd ? tsr_kernel_attention_forward_seg_blhd : tsr_kernel_attention_forward_seg)(
      c->out, c->lse, c->q, c->k, c->v, c->q_pos, c->k_pos, c->q_seg, c->k_seg, c->B, c->Hq, c->Hkv,
      c->Lq, c->Lk, c->D, true);
}

static double loss(void *ctx) {
  seg_case *c = ctx;
  assert_int_equal(forward(c), TSR_OK);
  return test_weighted_sum(c->out, c->w, (int64_t)c->B * c->Hq * c->Lq * c->D);
}

static void check_kernels(seg_case *c, uint64_t seed) {
  int64_t nq = (int64_t)c->B * c->Hq * c->Lq * c->D, nk = (int64_t)c->B * c->Hkv * c->Lk * c->D;
  int64_t nl = (int64_t)c->B * c->Hq * c->Lq;
  c->q = test_alloc(nq), c->out = test_alloc(nq), c->w = test_alloc(nq);
  c->k = test_alloc(nk), c->v = test_alloc(nk), c->lse = test_alloc(nl);
  test_fill(c->q, nq, &seed, -1.5f, 1.5f);
  test_fill(c->k, nk, &seed, -1.5f, 1.5f);
  test_fill(c->v, nk, &seed, -1, 1);
  test_fill(c->w, nq, &seed, -1, 1);
  assert_int_equal(forward(c), TSR_OK);
  double *want = calloc((size_t)nq, sizeof(double)), *want_lse = calloc((size_t)nl, sizeof(double));
  reference(c, want, want_lse);
  test_check_close("out with segment ids", c->out, want, nq, 1e-5, 1e-6);
  int unseen = 0;
  for (int64_t r = 0; r < nl; r++) {
    if (want_lse[r] == -INFINITY) {
      assert_true(c->lse[r] == -INFINITY);
      unseen++;
    } else {
      assert_true(fabs(c->lse[r] - want_lse[r]) <= 1e-5 * fabs(want_lse[r]) + 1e-6);
    }
  }
  float *dq = test_alloc(nq), *dk = test_alloc(nk), *dv = test_alloc(nk);
  assert_int_equal(
      (c->blhd ? tsr_kernel_attention_backward_seg_blhd : tsr_kernel_attention_backward_seg)(
          dq, dk, dv, c->w, c->q, c->k, c->v, c->out, c->lse, c->q_pos, c->k_pos, c->q_seg,
          c->k_seg, c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->D, true),
      TSR_OK);
  for (int64_t i = 0; i < nq; i++) assert_false(isnan(dq[i]) || isnan(c->out[i]));
  test_check_grad("dq with segment ids", c->q, nq, dq, loss, c);
  test_check_grad("dk with segment ids", c->k, nk, dk, loss, c);
  test_check_grad("dv with segment ids", c->v, nk, dv, loss, c);
  free(want), free(want_lse), free(dq), free(dk), free(dv);
  free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free(c->w);
}

/* Row 0: documents of 5, 4 and 4 tokens; row 1: one document, then one of a single token. */
static const int32_t seg13[26] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,
                                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

static void test_kernels_packed(void **state) {
  (void)state;
  seg_case c = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 13, .Lk = 13, .D = 4};
  c.q_seg = c.k_seg = seg13;
  check_kernels(&c, 11);
  c.blhd = true;
  check_kernels(&c, 12);
}

/* Ring attention's meeting of a query block with a later rank's key block, zigzag positions:
 * some query rows see no key of the block (other documents or the future): lse -inf, out 0, and
 * neither NaN nor a gradient from them. */
static void test_kernels_block(void **state) {
  (void)state;
  static const int32_t qp[6] = {0, 1, 2, 9, 10, 11}, kp[6] = {3, 4, 5, 6, 7, 8};
  static const int32_t qs[6] = {0, 0, 1, 3, 3, 4}, ks[6] = {1, 1, 2, 2, 3, 3};
  seg_case c = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 6, .Lk = 6, .D = 3, .q_pos = qp, .k_pos = kp};
  c.q_seg = qs, c.k_seg = ks;
  check_kernels(&c, 13);
}

/* Tiles of 64 keys and more: some whole tiles are skipped as other documents. */
static void test_kernels_tiles(void **state) {
  (void)state;
  int32_t seg[150];
  for (int i = 0; i < 150; i++) seg[i] = i < 70 ? 0 : i < 71 ? 1 : 2;
  seg_case c = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 150, .Lk = 150, .D = 2, .blhd = true};
  c.q_seg = c.k_seg = seg;
  check_kernels(&c, 14);
}

/* ---- the model: one packed row against its documents one by one ---- */

#define L_PACKED 12
static const int doc_len[3] = {5, 4, 3};

typedef struct model_run {
  char failure[512];
  int compared;
} model_run;

/* Forward and backward of rows [from, from + n) of the packed row, with segment ids and
 * positions when `docs`: the logits (n, V) into logits, the gradients (sum of every parameter's
 * numel) into grads, scaled by the loss's valid tokens so that documents add up. */
static tsr_status run_part(tsr_rank_t *r, const tsr_mesh_t *mesh, tsr_llama_t *m,
                           const int32_t *ids, const int32_t *labels, const int32_t *seg,
                           const int32_t *pos, int from, int n, float *logits, double *grads) {
  tsr_var *x = NULL, *y = NULL, *s = NULL, *p = NULL, *lg = NULL, *loss = NULL;
  tsr_tape_t *t = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_llama_batch(r, mesh, 1, n, ids + from, &x), st);
  TSR_CHECK_GOTO(tsr_llama_batch(r, mesh, 1, n, labels + from, &y), st);
  if (seg) {
    TSR_CHECK_GOTO(tsr_llama_batch(r, mesh, 1, n, seg + from, &s), st);
    TSR_CHECK_GOTO(tsr_llama_batch(r, mesh, 1, n, pos + from, &p), st);
  }
  TSR_CHECK_GOTO(tsr_llama_set_documents(m, s, p), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  TSR_CHECK_GOTO(tsr_llama_forward(m, t, x, y, &lg, &loss), st);
  int V = tsr_llama_get_config(m)->vocab_size;
  memcpy(logits, tsr_tensor_data(lg->value->local), sizeof(float) * (size_t)n * (size_t)V);
  int valid = 0;
  for (int i = from; i < from + n; i++) valid += labels[i] != -100;
  TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
  int64_t off = 0;
  for (int i = 0; i < tsr_llama_param_count(m); i++) {
    tsr_var *v = tsr_llama_param(m, i);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, v), st);
    const float *g = tsr_tensor_data(v->grad->local);
    int64_t ne = tsr_tensor_numel(v->value->local);
    for (int64_t e = 0; e < ne; e++) grads[off + e] += (double)g[e] * valid;
    off += ne;
    tsr_var_zero_grad(v);
  }
cleanup:
  tsr_llama_set_documents(m, NULL, NULL);
  tsr_tape_free(t);
  tsr_var_free(x), tsr_var_free(y), tsr_var_free(s), tsr_var_free(p);
  return st;
}

static tsr_status run_model(tsr_comm_t *comm, void *arg) {
  model_run *mr = arg;
  tsr_llama_config cfg = {.vocab_size = 17,
                          .hidden_size = 16,
                          .intermediate_size = 24,
                          .num_hidden_layers = 2,
                          .num_attention_heads = 4,
                          .num_key_value_heads = 2,
                          .rms_norm_eps = 1e-5f,
                          .rope_theta = 100.0f};
  tsr_rank_t *r = NULL;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_mesh_t *mesh = tsr_test_one_rank_mesh();
  tsr_llama_t *m = NULL;
  int32_t ids[L_PACKED], labels[L_PACKED], seg[L_PACKED], pos[L_PACKED];
  float *lp = NULL, *ls = NULL;
  double *gp = NULL, *gs = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_llama_new(r, mesh, &cfg, 99, &m), st);
  for (int i = 0, d = 0, start = 0; i < L_PACKED; i++) {
    if (i - start == doc_len[d]) start = i, d++;
    ids[i] = (i * 5 + 3) % cfg.vocab_size;
    /* the last token of a document predicts nothing, as the data loader leaves it */
    labels[i] = i - start == doc_len[d] - 1 ? -100 : (i * 11 + 1) % cfg.vocab_size;
    seg[i] = d;
    pos[i] = i - start;
  }
  int64_t np = 0;
  for (int i = 0; i < tsr_llama_param_count(m); i++)
    np += tsr_tensor_numel(tsr_llama_param(m, i)->value->local);
  lp = calloc((size_t)L_PACKED * cfg.vocab_size, sizeof(float));
  ls = calloc((size_t)L_PACKED * cfg.vocab_size, sizeof(float));
  gp = calloc((size_t)np, sizeof(double));
  gs = calloc((size_t)np, sizeof(double));
  if (!lp || !ls || !gp || !gs) {
    st = TSR_ERROR(TSR_ENOMEM, "test: out of memory");
    goto cleanup;
  }
  TSR_CHECK_GOTO(run_part(r, mesh, m, ids, labels, seg, pos, 0, L_PACKED, lp, gp), st);
  for (int d = 0, from = 0; d < 3; from += doc_len[d], d++)
    TSR_CHECK_GOTO(run_part(r, mesh, m, ids, labels, NULL, NULL, from, doc_len[d],
                            ls + (size_t)from * cfg.vocab_size, gs),
                   st);
  for (int64_t i = 0; i < (int64_t)L_PACKED * cfg.vocab_size; i++, mr->compared++)
    if (fabsf(lp[i] - ls[i]) > 1e-5f + 1e-5f * fabsf(ls[i]) && !mr->failure[0])
      snprintf(mr->failure, sizeof mr->failure, "logit %lld: packed %.7g, separate %.7g",
               (long long)i, lp[i], ls[i]);
  double gmax = 0;
  for (int64_t i = 0; i < np; i++) gmax = fmax(gmax, fabs(gs[i]));
  for (int64_t i = 0; i < np; i++, mr->compared++)
    if (fabs(gp[i] - gs[i]) > 1e-4 * fabs(gs[i]) + 1e-5 * gmax && !mr->failure[0])
      snprintf(mr->failure, sizeof mr->failure, "gradient element %lld: packed %.7g, separate %.7g",
               (long long)i, gp[i], gs[i]);
  /* and the plain causal row is another function of the same tokens */
  memset(gp, 0, sizeof(double) * (size_t)np);
  TSR_CHECK_GOTO(run_part(r, mesh, m, ids, labels, NULL, NULL, 0, L_PACKED, lp, gp), st);
  bool differs = false;
  for (int64_t i = doc_len[0] * cfg.vocab_size; i < (int64_t)L_PACKED * cfg.vocab_size; i++)
    differs = differs || fabsf(lp[i] - ls[i]) > 1e-3f;
  if (!differs && !mr->failure[0])
    snprintf(mr->failure, sizeof mr->failure, "the causal row equals the documents");
cleanup:
  free(lp), free(ls), free(gp), free(gs);
  tsr_llama_free(m);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  return st;
}

static void test_model_packed_equals_separate(void **state) {
  (void)state;
  model_run mr = {{0}, 0};
  if (tsr_local_launch(1, 60.0, run_model, &mr) != TSR_OK) fail_msg("%s", tsr_last_error());
  if (mr.failure[0]) fail_msg("%s", mr.failure);
  assert_true(mr.compared > 1000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kernels_packed),
      cmocka_unit_test(test_kernels_block),
      cmocka_unit_test(test_kernels_tiles),
      cmocka_unit_test(test_model_packed_equals_separate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
