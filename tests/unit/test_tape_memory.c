/* The tape's memory contract on one rank: a view shares its input's buffer, an add's and a view's
 * backward pass the output gradient on without a copy and a sum into a shared gradient is
 * copy-on-write, and selective activation checkpointing (tsr_tape_set_selective) releases the
 * element-wise ops' outputs at the region's end, makes them again bit for bit where a backward
 * or a forward reads them, and leaves every gradient equal to the bit to the run without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "tessera/ops.h"

enum { B = 2, L = 6, H = 2, D = 4, C = H * D, I = 12 };

static float rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static tsr_status leaf(tsr_rank_t *r, const tsr_mesh_t *m, int ndim, const int64_t *shape,
                       uint64_t seed, bool grad, tsr_var **out) {
  tsr_placement rep = tsr_replicate();
  tsr_dtensor *d;
  TSR_CHECK(tsr_dtensor_zeros(r, m, TSR_F32, ndim, shape, &rep, &d));
  float *x = tsr_tensor_data(d->local);
  for (int64_t i = 0; i < tsr_tensor_numel(d->local); i++) x[i] = rnd(&seed);
  return tsr_var_new_leaf(d, grad, NULL, out);
}

/* A Llama-like block: the norm's output feeds two linears and a view, RoPE reads a view of a
 * linear's output, SwiGLU's output feeds a third linear, and the residual add closes it. */
typedef struct block {
  tsr_var *x, *w, *wq, *wg, *wu, *wd;  /* leaves */
  tsr_var *n, *q, *qr, *g, *u, *s, *y; /* made by the tape */
} block;

static tsr_status block_forward(tsr_tape_t *t, block *b, bool selective) {
  tsr_var *qh, *qm, *d, *o;
  tsr_tape_set_selective(t, selective);
  TSR_CHECK(tsr_op_rmsnorm(t, b->x, b->w, 1e-5f, &b->n));
  TSR_CHECK(tsr_op_linear(t, b->n, b->wq, &b->q));
  int64_t heads[4] = {B, L, H, D}, flat[3] = {B, L, C};
  TSR_CHECK(tsr_op_view(t, b->q, 4, heads, &qh));
  TSR_CHECK(tsr_op_rope(t, qh, 1e4f, &b->qr));
  TSR_CHECK(tsr_op_view(t, b->qr, 3, flat, &qm));
  TSR_CHECK(tsr_op_linear(t, b->n, b->wg, &b->g));
  TSR_CHECK(tsr_op_linear(t, b->n, b->wu, &b->u));
  TSR_CHECK(tsr_op_swiglu(t, b->g, b->u, &b->s));
  TSR_CHECK(tsr_op_linear(t, b->s, b->wd, &d));
  TSR_CHECK(tsr_op_add(t, qm, d, &o));
  TSR_CHECK(tsr_op_add(t, b->x, o, &b->y));
  tsr_tape_set_selective(t, false);
  return TSR_OK;
}

typedef struct run_case {
  int64_t grad_elems;
  float *grads[2]; /* (grad_elems) every leaf's gradient, without and with selective */
  bool released, kept, remade, again, view_shares;
} run_case;

static tsr_status run_block(tsr_rank_t *r, const tsr_mesh_t *m, bool selective, run_case *rc) {
  block b = {0};
  int64_t xs[3] = {B, L, C}, ws[1] = {C}, sq[2] = {C, C}, up[2] = {I, C}, dn[2] = {C, I};
  tsr_tape_t *t = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(leaf(r, m, 3, xs, 1, true, &b.x), st);
  TSR_CHECK_GOTO(leaf(r, m, 1, ws, 2, true, &b.w), st);
  TSR_CHECK_GOTO(leaf(r, m, 2, sq, 3, true, &b.wq), st);
  TSR_CHECK_GOTO(leaf(r, m, 2, up, 4, true, &b.wg), st);
  TSR_CHECK_GOTO(leaf(r, m, 2, up, 5, true, &b.wu), st);
  TSR_CHECK_GOTO(leaf(r, m, 2, dn, 6, true, &b.wd), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  TSR_CHECK_GOTO(block_forward(t, &b, selective), st);
  if (selective) {
    rc->released = !b.n->value->local && !b.qr->value->local && !b.s->value->local;
    rc->kept = b.q->value->local && b.g->value->local && b.u->value->local && b.y->value->local;
    /* a forward op reading a released value makes it again: the norm's output through a view */
    tsr_var *nv;
    int64_t rows[2] = {B * L, C};
    TSR_CHECK_GOTO(tsr_op_view(t, b.n, 2, rows, &nv), st);
    rc->remade = b.n->value->local && nv->value->local &&
                 tsr_tensor_data(nv->value->local) == tsr_tensor_data(b.n->value->local);
  } else {
    tsr_var *qh;
    int64_t heads[4] = {B, L, H, D};
    TSR_CHECK_GOTO(tsr_op_view(t, b.q, 4, heads, &qh), st);
    rc->view_shares = tsr_tensor_data(qh->value->local) == tsr_tensor_data(b.q->value->local);
  }
  /* backward from y with a fixed gradient */
  tsr_dtensor *g = NULL;
  tsr_placement rep = tsr_replicate();
  TSR_CHECK_GOTO(tsr_dtensor_zeros(r, m, TSR_F32, 3, xs, &rep, &g), st);
  uint64_t seed = 99;
  for (int64_t i = 0; i < B * L * C; i++) ((float *)tsr_tensor_data(g->local))[i] = rnd(&seed);
  TSR_CHECK_GOTO(tsr_tape_backward_with(t, b.y, g), st);
  if (selective) rc->again = !b.n->value->local && !b.qr->value->local && !b.s->value->local;
  tsr_var *leaves[6] = {b.x, b.w, b.wq, b.wg, b.wu, b.wd};
  int64_t k = 0;
  for (int i = 0; i < 6; i++) {
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, leaves[i]), st);
    int64_t n = tsr_tensor_numel(leaves[i]->grad->local);
    memcpy(rc->grads[selective] + k, tsr_tensor_data(leaves[i]->grad->local),
           sizeof(float) * (size_t)n);
    k += n;
  }
  rc->grad_elems = k;
cleanup:
  tsr_tape_free(t);
  tsr_var_free(b.x);
  tsr_var_free(b.w);
  tsr_var_free(b.wq);
  tsr_var_free(b.wg);
  tsr_var_free(b.wu);
  tsr_var_free(b.wd);
  return st;
}

static tsr_status run(tsr_comm_t *comm, void *arg) {
  run_case *rc = arg;
  tsr_rank_t *r = NULL;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_mesh_t *m = tsr_test_one_rank_mesh();
  tsr_status st = run_block(r, m, false, rc);
  if (st == TSR_OK) st = run_block(r, m, true, rc);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_selective_is_bit_identical(void **s) {
  (void)s;
  run_case rc = {0};
  size_t n = (size_t)(B * L * C + C + C * C + 3 * I * C);
  rc.grads[0] = calloc(n, sizeof(float));
  rc.grads[1] = calloc(n, sizeof(float));
  assert_int_equal(tsr_local_launch(1, 60.0, run, &rc), TSR_OK);
  assert_int_equal(rc.grad_elems, (int64_t)n);
  assert_true(rc.view_shares);
  assert_true(rc.released);
  assert_true(rc.kept);
  assert_true(rc.remade);
  assert_true(rc.again);
  assert_memory_equal(rc.grads[0], rc.grads[1], n * sizeof(float));
  free(rc.grads[0]);
  free(rc.grads[1]);
}

/* y = a + a + b: a's two gradients arrive as one shared buffer and must sum to twice it, leaving
 * b's (the same buffer) as it was. */
static tsr_status run_shared(tsr_comm_t *comm, void *arg) {
  float *out = arg;
  tsr_rank_t *r = NULL;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_mesh_t *m = tsr_test_one_rank_mesh();
  int64_t xs[1] = {5};
  tsr_var *a = NULL, *b = NULL, *aa, *y;
  tsr_tape_t *t = NULL;
  tsr_dtensor *g = NULL;
  tsr_placement rep = tsr_replicate();
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(leaf(r, m, 1, xs, 7, true, &a), st);
  TSR_CHECK_GOTO(leaf(r, m, 1, xs, 8, true, &b), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  TSR_CHECK_GOTO(tsr_op_add(t, a, a, &aa), st);
  TSR_CHECK_GOTO(tsr_op_add(t, aa, b, &y), st);
  TSR_CHECK_GOTO(tsr_dtensor_zeros(r, m, TSR_F32, 1, xs, &rep, &g), st);
  for (int i = 0; i < 5; i++) ((float *)tsr_tensor_data(g->local))[i] = (float)(i + 1);
  TSR_CHECK_GOTO(tsr_tape_backward_with(t, y, g), st);
  TSR_CHECK_GOTO(tsr_var_resolve_grad(t, a), st);
  TSR_CHECK_GOTO(tsr_var_resolve_grad(t, b), st);
  memcpy(out, tsr_tensor_data(a->grad->local), 5 * sizeof(float));
  memcpy(out + 5, tsr_tensor_data(b->grad->local), 5 * sizeof(float));
cleanup:
  tsr_tape_free(t);
  tsr_var_free(a);
  tsr_var_free(b);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_shared_gradient_is_copy_on_write(void **s) {
  (void)s;
  float out[10];
  assert_int_equal(tsr_local_launch(1, 60.0, run_shared, out), TSR_OK);
  for (int i = 0; i < 5; i++) {
    assert_true(out[i] == 2.0f * (float)(i + 1));
    assert_true(out[5 + i] == (float)(i + 1));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_selective_is_bit_identical),
      cmocka_unit_test(test_shared_gradient_is_copy_on_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
