/* Device-resident tensors, checked on the emulated device (tensor.h, TSR_DEVICE_EMU): memory the
 * host cannot dereference behind the CPU kernels. A run there must equal the same run on the CPU
 * bit for bit, so these tests compare exactly; a host touch of device memory anywhere on the path
 * crashes the test instead of passing unnoticed. What they prove for CUDA is the core's side:
 * every byte moves through the kernel table, and every collective moves device buffers without
 * a host touch. The CUDA kernels themselves are checked by tests/cuda on a GPU. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "llama.h"
#include "tessera/rank.h"

static const tsr_device emu = {TSR_DEVICE_EMU, 0};

static bool tagged(const void *p) {
  return ((uintptr_t)p >> 62) & 1u;
}

static tsr_status mismatch(const char *what, int i, double got, double want) {
  return TSR_ERROR(TSR_EINTERNAL, "%s[%d]: got %g, want %g", what, i, got, want);
}

/* ---- tensors ---- */

/* Round trips and copies between host and device, contiguous and strided, checked on the host. */
static tsr_status tensor_body(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_tensor *h = NULL, *d = NULL, *dp = NULL, *dc = NULL, *back = NULL, *hp = NULL, *cast = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_rank_set_device(r, emu), st);
  tsr_allocator *a = tsr_rank_allocator(r);
  int64_t shape[3] = {2, 3, 4};
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 3, shape, &h), st);
  tsr_tensor_fill_arange(h, 0.5, -3.0);
  TSR_CHECK_GOTO(tsr_tensor_to(h, a, &d), st);
  if (tsr_tensor_device(d).kind != TSR_DEVICE_EMU || !tagged(tsr_tensor_data(d))) {
    st = TSR_ERROR(TSR_EINTERNAL, "tsr_tensor_to did not land on the emulated device");
    goto cleanup;
  }
  if (!tsr_tensor_equal(d, h)) {
    st = TSR_ERROR(TSR_EINTERNAL, "host -> device round trip differs");
    goto cleanup;
  }
  int64_t idx[3] = {1, 2, 3};
  if (tsr_tensor_get(d, idx) != tsr_tensor_get(h, idx)) {
    st = mismatch("get", 23, tsr_tensor_get(d, idx), tsr_tensor_get(h, idx));
    goto cleanup;
  }
  tsr_tensor_set(d, idx, 42.0);
  tsr_tensor_set(h, idx, 42.0);
  /* a permuted view copied within the device, and to and from the host */
  int perm[3] = {2, 0, 1};
  TSR_CHECK_GOTO(tsr_tensor_permute(d, perm, &dp), st);
  TSR_CHECK_GOTO(tsr_tensor_permute(h, perm, &hp), st);
  TSR_CHECK_GOTO(tsr_tensor_clone(dp, &dc), st);
  if (!tagged(tsr_tensor_data(dc)) || !tsr_tensor_is_contiguous(dc) || !tsr_tensor_equal(dc, hp)) {
    st = TSR_ERROR(TSR_EINTERNAL, "clone of a permuted device view differs from the host's");
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_tensor_to(dp, NULL, &back), st);
  if (!tsr_tensor_equal(back, hp)) {
    st = TSR_ERROR(TSR_EINTERNAL, "device view -> host differs");
    goto cleanup;
  }
  tsr_tensor_zero(back);
  TSR_CHECK_GOTO(tsr_tensor_copy(dp, back), st); /* host contiguous into a strided device view */
  for (int i = 0; i < 24; i++) {
    int64_t j[3] = {i / 12, (i / 4) % 3, i % 4};
    if (tsr_tensor_get(d, j) != 0.0) {
      st = mismatch("zeroed through a view", i, tsr_tensor_get(d, j), 0.0);
      goto cleanup;
    }
  }
  TSR_CHECK_GOTO(tsr_tensor_cast(dc, TSR_BF16, &cast), st);
  if (tsr_tensor_device(cast).kind != TSR_DEVICE_CPU) {
    st = TSR_ERROR(TSR_EINTERNAL, "cast of a device tensor is documented as a host copy");
    goto cleanup;
  }
cleanup:
  tsr_tensor_free(cast);
  tsr_tensor_free(hp);
  tsr_tensor_free(back);
  tsr_tensor_free(dc);
  tsr_tensor_free(dp);
  tsr_tensor_free(d);
  tsr_tensor_free(h);
  tsr_rank_free(r);
  return st;
}

static void test_tensors_on_device(void **state) {
  (void)state;
  if (tsr_local_launch(1, 10.0, tensor_body, NULL) != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* The emulation is only worth something if a host touch really faults: read device memory in a
 * child and expect it to die of a memory fault. */
static tsr_status touch_body(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_tensor *d = NULL;
  int64_t n = 16;
  TSR_CHECK(tsr_rank_new(comm, tsr_test_layout(), &r));
  if (tsr_rank_set_device(r, emu) == TSR_OK &&
      tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &n, &d) == TSR_OK) {
    volatile float *p = tsr_tensor_data(d);
    printf("read %g\n", (double)p[0]); /* must not return */
  }
  tsr_tensor_free(d);
  tsr_rank_free(r);
  return TSR_OK;
}

static void test_host_touch_faults(void **state) {
  (void)state;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* cmocka catches memory faults to report them; the child must die of this one */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    if (tsr_local_launch(1, 10.0, touch_body, NULL) != TSR_OK)
      fprintf(stderr, "child: %s\n", tsr_last_error());
    _exit(3); /* the read returned: the device memory was host-readable */
  }
  int ws = 0;
  assert_int_equal(waitpid(pid, &ws, 0), pid);
  /* a plain build dies of the fault; AddressSanitizer reports it and aborts or exits 1 */
  if (WIFSIGNALED(ws))
    assert_true(WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS || WTERMSIG(ws) == SIGABRT);
  else
    assert_int_equal(WEXITSTATUS(ws), 1);
}

/* ---- collectives on device buffers (staged by the local backend) ---- */

#define WORLD 3

static tsr_status expect_values(const char *what, const float *host, int n, float (*want)(int, int),
                                int me) {
  for (int i = 0; i < n; i++)
    if (host[i] != want(i, me)) return mismatch(what, i, host[i], want(i, me));
  return TSR_OK;
}

/* Member m's i-th input value. */
static float input(int i, int m) {
  return (float)(100 * m + i);
}
static float sum3(int i, int me) {
  (void)me;
  return input(i, 0) + input(i, 1) + input(i, 2);
}
/* all_gather with member m contributing m + 1 elements: the concatenation. */
static float gathered(int i, int me) {
  (void)me;
  int m = i < 1 ? 0 : i < 3 ? 1 : 2;
  int off = m == 0 ? 0 : m == 1 ? 1 : 3;
  return input(i - off, m);
}
/* reduce_scatter of 6 elements with counts 1, 2, 3: member me's chunk of the sum. */
static float scattered(int i, int me) {
  int off = me == 0 ? 0 : me == 1 ? 1 : 3;
  return sum3(off + i, me);
}
/* all_to_all with 2 elements to each member: from member j, its block for me. */
static float exchanged(int i, int me) {
  int from = i / 2;
  return input(2 * me + i % 2, from);
}
static float from_root(int i, int me) {
  (void)me;
  return input(i, 1);
}
static float from_left(int i, int me) {
  return input(i, (me + WORLD - 1) % WORLD);
}

static tsr_status coll_body(tsr_comm_t *comm, void *arg) {
  (void)arg;
  int me = tsr_comm_rank(comm);
  tsr_rank_t *r = NULL;
  tsr_tensor *d = NULL, *o = NULL;
  float host[8];
  tsr_status st = TSR_OK;
  tsr_group_t *g;
  int ranks[WORLD] = {0, 1, 2};
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_rank_set_device(r, emu), st);
  TSR_CHECK_GOTO(tsr_comm_group(comm, WORLD, ranks, "dp", &g), st);
  int64_t n = 6;
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &n, &d), st);
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &n, &o), st);
  float *dd = tsr_tensor_data(d), *od = tsr_tensor_data(o);
  /* inputs enter through tsr_tensor_set: nothing on this path may touch dd from the host */
  for (int i = 0; i < 6; i++) tsr_tensor_set(d, (int64_t[]){i}, input(i, me));
  TSR_CHECK_GOTO(tsr_comm_all_reduce(g, dd, dd, 6, TSR_F32, TSR_REDUCE_SUM), st);
  for (int i = 0; i < 6; i++) host[i] = (float)tsr_tensor_get(d, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("all_reduce in place", host, 6, sum3, me), st);

  for (int i = 0; i < 6; i++) tsr_tensor_set(d, (int64_t[]){i}, input(i, me));
  size_t counts[WORLD] = {1, 2, 3};
  TSR_CHECK_GOTO(tsr_comm_all_gather(g, dd, counts[me], od, counts, TSR_F32), st);
  for (int i = 0; i < 6; i++) host[i] = (float)tsr_tensor_get(o, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("all_gather uneven", host, 6, gathered, me), st);

  TSR_CHECK_GOTO(tsr_comm_reduce_scatter(g, dd, od, counts[me], counts, TSR_F32, TSR_REDUCE_SUM),
                 st);
  for (int i = 0; i < (int)counts[me]; i++) host[i] = (float)tsr_tensor_get(o, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("reduce_scatter uneven", host, (int)counts[me], scattered, me), st);

  size_t two[WORLD] = {2, 2, 2};
  TSR_CHECK_GOTO(tsr_comm_all_to_all(g, dd, two, od, two, TSR_F32), st);
  for (int i = 0; i < 6; i++) host[i] = (float)tsr_tensor_get(o, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("all_to_all", host, 6, exchanged, me), st);

  TSR_CHECK_GOTO(tsr_tensor_copy(o, d), st);
  TSR_CHECK_GOTO(tsr_comm_broadcast(g, od, 6, TSR_F32, 1), st);
  for (int i = 0; i < 6; i++) host[i] = (float)tsr_tensor_get(o, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("broadcast", host, 6, from_root, me), st);

  TSR_CHECK_GOTO(
      tsr_comm_sendrecv(g, (me + 1) % WORLD, dd, 6, (me + WORLD - 1) % WORLD, od, 6, TSR_F32), st);
  for (int i = 0; i < 6; i++) host[i] = (float)tsr_tensor_get(o, (int64_t[]){i});
  TSR_CHECK_GOTO(expect_values("sendrecv ring", host, 6, from_left, me), st);
cleanup:
  tsr_tensor_free(o);
  tsr_tensor_free(d);
  tsr_rank_free(r);
  return st;
}

static void test_collectives_on_device(void **state) {
  (void)state;
  if (tsr_local_launch(WORLD, 10.0, coll_body, NULL) != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* ---- reductions on device memory against the same reductions on host memory ---- */

typedef struct red_case {
  const char *what;
  bool scatter; /* reduce_scatter (counts 1, 2, rest) instead of all_reduce */
  tsr_dtype dt;
  tsr_reduce_op op;
  int64_t count;
  bool in_place;  /* recv is send (all_reduce) or the own chunk of send (reduce_scatter) */
  bool host_send; /* send on the host, recv on the device */
} red_case;

/* Member m's i-th value: not integers, so a different summation order would show. */
static double red_input(int64_t i, int m) {
  return 0.1 * (double)(i % 97 + 1) * (m + 1) + 1e-3 * m - (i % 5 == 2 ? 7.3 : 0.0);
}

/* Runs the case once on host tensors and once on device ones; the received bytes must be equal. */
static tsr_status red_run(tsr_rank_t *r, tsr_group_t *g, const red_case *c) {
  int me = tsr_comm_rank(tsr_rank_comm(r));
  size_t counts[WORLD] = {1, 2, (size_t)c->count - 3};
  size_t own = c->scatter ? counts[me] : (size_t)c->count, off = 0;
  for (int j = 0; c->scatter && j < me; j++) off += counts[j];
  tsr_tensor *t[2][2] = {{NULL, NULL}, {NULL, NULL}}, *got[2] = {NULL, NULL};
  tsr_status st = TSR_OK;
  for (int dev = 0; dev < 2; dev++) {
    tsr_allocator *send_a = dev && !c->host_send ? tsr_rank_allocator(r) : NULL;
    tsr_allocator *recv_a = dev ? tsr_rank_allocator(r) : NULL;
    TSR_CHECK_GOTO(tsr_tensor_new(NULL, c->dt, 1, &c->count, &t[dev][0]), st);
    for (int64_t i = 0; i < c->count; i++) tsr_tensor_set(t[dev][0], &i, red_input(i, me));
    if (send_a) {
      tsr_tensor *moved;
      TSR_CHECK_GOTO(tsr_tensor_to(t[dev][0], send_a, &moved), st);
      tsr_tensor_free(t[dev][0]);
      t[dev][0] = moved;
    }
    char *send = tsr_tensor_data(t[dev][0]), *recv;
    size_t es = tsr_dtype_size(c->dt);
    if (c->in_place) {
      recv = send + (c->scatter ? off * es : 0);
    } else {
      int64_t n = (int64_t)own;
      TSR_CHECK_GOTO(tsr_tensor_new(recv_a, c->dt, 1, &n, &t[dev][1]), st);
      recv = tsr_tensor_data(t[dev][1]);
    }
    if (c->scatter)
      TSR_CHECK_GOTO(tsr_comm_reduce_scatter(g, send, recv, own, counts, c->dt, c->op), st);
    else
      TSR_CHECK_GOTO(tsr_comm_all_reduce(g, send, recv, own, c->dt, c->op), st);
    tsr_tensor *whole = t[dev][c->in_place ? 0 : 1], *view;
    TSR_CHECK_GOTO(tsr_tensor_narrow(whole, 0, c->in_place ? (int64_t)off : 0, (int64_t)own, &view),
                   st);
    st = tsr_tensor_to(view, NULL, &got[dev]);
    tsr_tensor_free(view);
    if (st != TSR_OK) goto cleanup;
  }
  if (memcmp(tsr_tensor_data(got[0]), tsr_tensor_data(got[1]), tsr_tensor_nbytes(got[0])))
    st = TSR_ERROR(TSR_EINTERNAL, "%s: device result differs from host on rank %d", c->what, me);
cleanup:
  for (int i = 0; i < 2; i++) {
    tsr_tensor_free(t[i][0]);
    tsr_tensor_free(t[i][1]);
    tsr_tensor_free(got[i]);
  }
  return st;
}

static const red_case red_cases[] = {
    /* past the small-message size: the bandwidth algorithm, in place needs device scratch */
    {"all_reduce sum in place", false, TSR_F32, TSR_REDUCE_SUM, 20000, true, false},
    {"all_reduce sum", false, TSR_F32, TSR_REDUCE_SUM, 7, false, false},
    {"all_reduce sum from host", false, TSR_F32, TSR_REDUCE_SUM, 9, false, true},
    /* through host blocks: more than one block of 512 */
    {"all_reduce max in place", false, TSR_F32, TSR_REDUCE_MAX, 1100, true, false},
    {"all_reduce avg", false, TSR_F32, TSR_REDUCE_AVG, 5, false, false},
    {"all_reduce bf16 sum", false, TSR_BF16, TSR_REDUCE_SUM, 600, false, false},
    {"all_reduce i64 sum in place", false, TSR_I64, TSR_REDUCE_SUM, 3, true, false},
    {"reduce_scatter sum in place", true, TSR_F32, TSR_REDUCE_SUM, 10, true, false},
    {"reduce_scatter sum", true, TSR_F32, TSR_REDUCE_SUM, 700, false, false},
};

static tsr_status red_body(tsr_comm_t *comm, void *arg) {
  (void)arg;
  tsr_rank_t *r = NULL;
  tsr_group_t *g;
  int ranks[WORLD] = {0, 1, 2};
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  TSR_CHECK_GOTO(tsr_rank_set_device(r, emu), st);
  TSR_CHECK_GOTO(tsr_comm_group(comm, WORLD, ranks, "dp", &g), st);
  for (size_t i = 0; i < sizeof red_cases / sizeof red_cases[0]; i++)
    TSR_CHECK_GOTO(red_run(r, g, &red_cases[i]), st);
cleanup:
  tsr_rank_free(r);
  return st;
}

/* The local backend reduces device buffers itself (f32 sums with the device's add, the rest
 * through host blocks): every case equals the host backend's bytes. */
static void test_reductions_on_device(void **state) {
  (void)state;
  if (tsr_local_launch(WORLD, 10.0, red_body, NULL) != TSR_OK) fail_msg("%s", tsr_last_error());
}

/* ---- the model's training step ---- */

typedef struct step_case {
  int ndim, shape[2];
  const char *names[2];
  bool on_device;
  tsr_test_step_result res; /* rank 0's */
} step_case;

static tsr_status step_body(tsr_comm_t *comm, void *arg) {
  step_case *sc = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_var *ids = NULL, *labels = NULL;
  tsr_status st = TSR_OK;
  int B = 2, L = 6;
  int32_t tok[12], lab[12];
  for (int i = 0; i < B * L; i++) {
    tok[i] = (i * 5) % tsr_test_llama.vocab_size;
    lab[i] = i % 7 == 3 ? -100 : (i * 5 + 1) % tsr_test_llama.vocab_size;
  }
  TSR_CHECK_GOTO(tsr_rank_new(comm, tsr_test_layout(), &r), st);
  if (sc->on_device) TSR_CHECK_GOTO(tsr_rank_set_device(r, emu), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), sc->ndim, sc->shape, sc->names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &tsr_test_llama, 99, &model), st);
  TSR_CHECK_GOTO(tsr_llama_batch(r, m, B, L, tok, &ids), st);
  TSR_CHECK_GOTO(tsr_llama_batch(r, m, B, L, lab, &labels), st);
  bool in_model = false;
  st = tsr_test_step(r, m, model, ids, labels, 1e-2, NULL, NULL, &sc->res, &in_model);
cleanup:
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

/* The same step on the CPU and on the device, on one mesh: equal to the last bit. */
static void step_cpu_vs_device(int ndim, const int *shape, const char *const *names) {
  step_case c[2] = {0};
  int world = 1;
  for (int k = 0; k < ndim; k++) world *= shape[k];
  for (int v = 0; v < 2; v++) {
    c[v].ndim = ndim;
    c[v].on_device = v == 1;
    for (int k = 0; k < ndim; k++) {
      c[v].shape[k] = shape[k];
      c[v].names[k] = names[k];
    }
    if (tsr_local_launch(world, 30.0, step_body, &c[v]) != TSR_OK)
      fail_msg("%s run: %s", v ? "device" : "cpu", tsr_last_error());
  }
  tsr_test_step_expect_close(&c[1].res, &c[0].res, 0.0f, 0.0f);
  assert_true(c[0].res.nparams > 0);
  tsr_test_step_result_free(&c[0].res);
  tsr_test_step_result_free(&c[1].res);
}

static void test_step_one_rank(void **state) {
  (void)state;
  step_cpu_vs_device(1, (int[]){1}, (const char *[]){"dp"});
}

static void test_step_dp2(void **state) {
  (void)state;
  step_cpu_vs_device(1, (int[]){2}, (const char *[]){"dp"});
}

static void test_step_pp2_dp2(void **state) {
  (void)state;
  step_cpu_vs_device(2, (int[]){2, 2}, (const char *[]){"pp", "dp"});
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensors_on_device),     cmocka_unit_test(test_host_touch_faults),
      cmocka_unit_test(test_collectives_on_device), cmocka_unit_test(test_reductions_on_device),
      cmocka_unit_test(test_step_one_rank),         cmocka_unit_test(test_step_dp2),
      cmocka_unit_test(test_step_pp2_dp2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
