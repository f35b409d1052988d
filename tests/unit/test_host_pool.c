/* The host buffer pool (core/host_pool.c): a steady-state training step asks the system for no
 * buffer, and what the pool keeps stays within its bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "harness.h"
#include "llama.h"
#include "tessera/ops.h"
#include "tessera/optim.h"

/* Under AddressSanitizer the pool is off (a use after free must stay one), as in host_pool.c. */
#if defined(__SANITIZE_ADDRESS__)
#define POOL_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ON 0
#endif
#endif
#ifndef POOL_ON
#define POOL_ON 1
#endif

static void expect_within_bound(void) {
  tsr_host_pool_stats s;
  tsr_host_pool_read(&s);
  assert_true(s.kept_bytes + s.live_bytes <= s.bound_bytes);
}

/* Rounds of tensors made and freed in a changing order, as a step's activations are: the first
 * round asks the system, the later ones reuse. */
static void test_rounds_reuse(void **state) {
  (void)state;
  tsr_allocator a;
  tsr_allocator_init_cpu(&a);
  const int64_t sizes[] = {1 << 20, 3000, 1 << 20, 77777, 512, 1 << 18, 3000, 5};
  enum { N = sizeof sizes / sizeof sizes[0] };
  int64_t before = 0;
  for (int round = 0; round < 4; round++) {
    tsr_host_pool_stats s;
    tsr_host_pool_read(&s);
    if (round == 2) before = s.system_allocations;
    tsr_tensor *t[N];
    for (int i = 0; i < N; i++)
      assert_int_equal(tsr_tensor_new(&a, TSR_F32, 1, &sizes[i], &t[i]), TSR_OK);
    /* a new tensor reads as zeros, whatever buffer it got */
    for (int i = 0; i < N; i++) {
      const float *d = tsr_tensor_data(t[i]);
      for (int64_t k = 0; k < sizes[i]; k += 97) assert_true(d[k] == 0.0f);
      ((float *)tsr_tensor_data(t[i]))[sizes[i] - 1] = 1.0f + (float)round;
    }
    for (int i = 0; i < N; i++) tsr_tensor_free(t[(i * 3 + round) % N]);
    expect_within_bound();
  }
  tsr_host_pool_stats s;
  tsr_host_pool_read(&s);
  if (POOL_ON) assert_int_equal(s.system_allocations, before);
  assert_int_equal(a.bytes_in_use, 0);
}

typedef struct steps_case {
  int64_t system[5]; /* system allocations during each step */
} steps_case;

static tsr_status batch(tsr_rank_t *r, const tsr_mesh_t *m, bool labels, tsr_var **out) {
  int32_t p[8 * 16];
  for (int i = 0; i < 8 * 16; i++) p[i] = (i * 5 + (labels ? 1 : 0)) % tsr_test_llama.vocab_size;
  return tsr_llama_batch(r, m, 8, 16, p, out);
}

/* Five training steps of the test model on one rank: forward, backward, AdamW. */
static tsr_status run_steps(tsr_comm_t *comm, void *arg) {
  steps_case *c = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_var *params[64];
  tsr_status st = TSR_OK;
  int shape[1] = {1};
  const char *names[1] = {"dp"};
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), 1, shape, names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &tsr_test_llama, 7, &model), st);
  int n = tsr_llama_param_count(model);
  TSR_INVARIANT(n <= 64);
  for (int i = 0; i < n; i++) params[i] = tsr_llama_param(model, i);
  tsr_adamw_config oc = {0.9, 0.95, 1e-8, 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, n, params, &oc, &opt), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  for (int k = 0; k < 5; k++) {
    tsr_host_pool_stats s0, s1;
    tsr_host_pool_read(&s0);
    tsr_var *ids = NULL, *labels = NULL, *logits, *loss;
    TSR_CHECK_GOTO(batch(r, m, false, &ids), st);
    TSR_CHECK_GOTO(batch(r, m, true, &labels), st);
    st = tsr_llama_forward(model, t, ids, labels, &logits, &loss);
    if (st == TSR_OK) st = tsr_tape_backward(t, loss);
    for (int i = 0; st == TSR_OK && i < n; i++) st = tsr_var_resolve_grad(t, params[i]);
    if (st == TSR_OK) st = tsr_adamw_step(opt, 1e-3);
    for (int i = 0; i < n; i++) tsr_var_zero_grad(params[i]);
    tsr_tape_reset(t);
    tsr_var_free(ids);
    tsr_var_free(labels);
    if (st != TSR_OK) goto cleanup;
    tsr_host_pool_read(&s1);
    c->system[k] = s1.system_allocations - s0.system_allocations;
  }
cleanup:
  tsr_tape_free(t);
  tsr_adamw_free(opt);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static void test_training_steps_allocate_nothing(void **state) {
  (void)state;
  steps_case c = {{0}};
  assert_int_equal(tsr_local_launch(1, 60, run_steps, &c), TSR_OK);
  /* the first step makes the activations and AdamW's moments; from the third on, nothing */
  assert_true(c.system[0] > 0);
  if (POOL_ON) {
    assert_int_equal(c.system[2], 0);
    assert_int_equal(c.system[3], 0);
    assert_int_equal(c.system[4], 0);
  }
  expect_within_bound();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounds_reuse),
      cmocka_unit_test(test_training_steps_allocate_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
