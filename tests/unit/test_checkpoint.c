/* Checkpoints: bitwise round trips, strict loading that never loads part of a file, crash safety.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "tessera/io.h"
#include "test_io_util.h"

#define NP 3

typedef struct fixture {
  char dir[64];
  char model[128], optim[160];
  const char *names[NP];
  tsr_tensor *p[NP], *m[NP], *v[NP];
} fixture;

static const int64_t shapes[NP][2] = {{4, 3}, {3, 1}, {5, 0}};

static tsr_tensor *tensor_like(int i, tsr_dtype dt) {
  tsr_tensor *t;
  assert_int_equal(tsr_tensor_new(NULL, dt, 2, shapes[i], &t), TSR_OK);
  return t;
}

/* Arbitrary bit patterns, subnormals and negative zero included: only bitwise copies survive. */
static void fill_bits(tsr_tensor *t, uint32_t seed) {
  uint32_t *p = tsr_tensor_data(t);
  for (int64_t i = 0; i < tsr_tensor_numel(t); i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (seed & 0x807fffffu) | ((seed % 7 == 0 ? 0u : 0x3f000000u));
  }
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  io_tmpdir(f->dir, sizeof f->dir);
  snprintf(f->model, sizeof f->model, "%s/ckpt.safetensors", f->dir);
  snprintf(f->optim, sizeof f->optim, "%s/ckpt.optim.safetensors", f->dir);
  f->names[0] = "model.embed_tokens.weight";
  f->names[1] = "model.layers.0.mlp.up_proj.weight";
  f->names[2] = "model.norm.weight";
  for (int i = 0; i < NP; i++) {
    f->p[i] = tensor_like(i, TSR_F32);
    f->m[i] = tensor_like(i, TSR_F32);
    f->v[i] = tensor_like(i, TSR_F32);
    fill_bits(f->p[i], 1u + (uint32_t)i);
    fill_bits(f->m[i], 100u + (uint32_t)i);
    fill_bits(f->v[i], 200u + (uint32_t)i);
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  for (int i = 0; i < NP; i++) {
    tsr_tensor_free(f->p[i]);
    tsr_tensor_free(f->m[i]);
    tsr_tensor_free(f->v[i]);
  }
  io_rmtree(f->dir);
  free(f);
  return 0;
}

#define assert_error_has(text)                                                                     \
  do {                                                                                             \
    if (!strstr(tsr_last_error(), (text)))                                                         \
      fail_msg("error \"%s\" lacks \"%s\"", tsr_last_error(), (text));                             \
  } while (0)

static void save_fixture(fixture *f, int64_t step) {
  assert_int_equal(
      tsr_checkpoint_save(f->model, NULL, NP, f->names, (const tsr_tensor *const *)f->p,
                          (const tsr_tensor *const *)f->m, (const tsr_tensor *const *)f->v, step),
      TSR_OK);
}

static bool bitwise_equal(const tsr_tensor *a, const tsr_tensor *b) {
  return tsr_tensor_nbytes(a) == tsr_tensor_nbytes(b) &&
         memcmp(tsr_tensor_data(a), tsr_tensor_data(b), tsr_tensor_nbytes(a)) == 0;
}

/* Fresh destinations filled with a sentinel, to see whether a failed load wrote anything. */
static void fresh(tsr_tensor **t) {
  for (int i = 0; i < NP; i++) {
    t[i] = tensor_like(i, TSR_F32);
    float *p = tsr_tensor_data(t[i]);
    for (int64_t k = 0; k < tsr_tensor_numel(t[i]); k++) p[k] = -7.0f;
  }
}

static bool untouched(tsr_tensor *const *t) {
  for (int i = 0; i < NP; i++) {
    const float *p = tsr_tensor_data(t[i]);
    for (int64_t k = 0; k < tsr_tensor_numel(t[i]); k++)
      if (p[k] != -7.0f) return false;
  }
  return true;
}

static void free_all(tsr_tensor **t) {
  for (int i = 0; i < NP; i++) tsr_tensor_free(t[i]);
}

static void test_optim_path(void **state) {
  char buf[64];
  assert_int_equal(tsr_checkpoint_optim_path("out/a.safetensors", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "out/a.optim.safetensors");
  assert_int_equal(tsr_checkpoint_optim_path("ckpt", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "ckpt.optim.safetensors");
  assert_int_equal(tsr_checkpoint_optim_path("a.safetensors", buf, 10), TSR_EINVAL);
}

static void test_round_trip_bitwise(void **state) {
  fixture *f = *state;
  save_fixture(f, 1234567890123ll);
  assert_int_equal(io_count_entries(f->dir), 2);
  tsr_tensor *p[NP], *m[NP], *v[NP];
  fresh(p);
  fresh(m);
  fresh(v);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_OK);
  int64_t step = -1;
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, NP, f->names, m, v, &step), TSR_OK);
  assert_int_equal(step, 1234567890123ll);
  for (int i = 0; i < NP; i++) {
    assert_true(bitwise_equal(p[i], f->p[i]));
    assert_true(bitwise_equal(m[i], f->m[i]));
    assert_true(bitwise_equal(v[i], f->v[i]));
  }
  /* The model file is what transformers loads: HF names only, format "pt". */
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->model, &st), TSR_OK);
  assert_int_equal(tsr_safetensors_count(st), NP);
  assert_string_equal(tsr_safetensors_meta(st, "format"), "pt");
  tsr_safetensors_close(st);
  assert_int_equal(tsr_safetensors_open(f->optim, &st), TSR_OK);
  assert_true(tsr_safetensors_has(st, "model.norm.weight.exp_avg_sq"));
  assert_string_equal(tsr_safetensors_meta(st, "format"), TSR_CHECKPOINT_OPTIM_FORMAT);
  tsr_safetensors_close(st);
  /* The optimizer file is not a model file, nor the other way round. */
  assert_int_equal(tsr_checkpoint_load_model(f->optim, NP, f->names, p, NULL), TSR_EINVAL);
  assert_int_equal(tsr_checkpoint_load_optim(f->model, NP, f->names, m, v, &step), TSR_EINVAL);
  assert_error_has("not a Tessera optimizer file");
  free_all(p);
  free_all(m);
  free_all(v);
}

static void test_missing_extra_and_wrong_shape(void **state) {
  fixture *f = *state;
  save_fixture(f, 3);
  tsr_tensor *p[NP];
  fresh(p);
  /* Missing: the last name is not in the file; nothing before it may have been loaded. */
  const char *names[NP] = {f->names[0], f->names[1], "model.layers.1.mlp.up_proj.weight"};
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.layers.1.mlp.up_proj.weight'");
  assert_error_has(f->model);
  assert_true(untouched(p));
  /* Extra: the model asks for two of three tensors. */
  assert_int_equal(tsr_checkpoint_load_model(f->model, 2, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("1 tensor the model does not have: 'model.norm.weight'");
  assert_true(untouched(p));
  /* Wrong shape of the last tensor. */
  tsr_tensor *saved = p[2];
  const int64_t s[2] = {0, 5};
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, s, &p[2]), TSR_OK);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.norm.weight'");
  assert_error_has("[5, 0]");
  assert_error_has("[0, 5]");
  tsr_tensor_free(p[2]);
  p[2] = saved;
  assert_true(untouched(p));
  /* Wrong dtype: an integer destination. */
  saved = p[1];
  p[1] = tensor_like(1, TSR_I32);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.layers.0.mlp.up_proj.weight'");
  tsr_tensor_free(p[1]);
  p[1] = saved;
  assert_true(untouched(p));
  /* Asking for one name twice. */
  const char *twice[NP] = {f->names[0], f->names[0], f->names[2]};
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, twice, p, NULL), TSR_EINVAL);
  assert_error_has("asked for twice");
  /* Optimizer state is as strict. */
  tsr_tensor *m[NP], *v[NP];
  fresh(m);
  fresh(v);
  int64_t step = -1;
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, NP, names, m, v, &step), TSR_EINVAL);
  assert_error_has("'model.layers.1.mlp.up_proj.weight.exp_avg'");
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, 2, f->names, m, v, &step), TSR_EINVAL);
  assert_error_has("2 tensors the model does not have");
  assert_true(untouched(m) && untouched(v));
  assert_int_equal(step, -1);
  free_all(p);
  free_all(m);
  free_all(v);
}

/* A Hugging Face-style file: bf16 weights, rotary buffers, a tied lm_head, many extras. */
static void test_hf_file_bf16_and_ignore_patterns(void **state) {
  fixture *f = *state;
  enum { N = NP + 9 };
  const char *names[N];
  tsr_tensor *ts[N];
  char extra[6][64];
  for (int i = 0; i < NP; i++) {
    names[i] = f->names[i];
    assert_int_equal(tsr_tensor_cast(f->p[i], TSR_BF16, &ts[i]), TSR_OK);
  }
  const int64_t one[1] = {8};
  const char *buffers[3] = {"model.rotary_emb.inv_freq",
                            "model.layers.0.self_attn.rotary_emb.inv_freq", "lm_head.weight"};
  for (int i = 0; i < 3; i++) {
    names[NP + i] = buffers[i];
    assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 1, one, &ts[NP + i]), TSR_OK);
  }
  for (int i = 0; i < 6; i++) {
    snprintf(extra[i], sizeof extra[i], "model.layers.%d.unknown.weight", i);
    names[NP + 3 + i] = extra[i];
    assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 1, one, &ts[NP + 3 + i]), TSR_OK);
  }
  assert_int_equal(
      tsr_safetensors_save(f->model, NP + 3, names, (const tsr_tensor *const *)ts, 0, NULL, NULL),
      TSR_OK);
  tsr_tensor *p[NP];
  fresh(p);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("3 tensors the model does not have");
  assert_error_has("'lm_head.weight'");
  assert_true(untouched(p));
  const char *pats[3] = {tsr_checkpoint_hf_buffers[0], tsr_checkpoint_hf_buffers[1],
                         "lm_head.weight"};
  tsr_checkpoint_opts opts = {2, pats};
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, &opts), TSR_EINVAL);
  assert_error_has("1 tensor the model does not have: 'lm_head.weight'");
  opts.n_ignore = 3;
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, &opts), TSR_OK);
  for (int i = 0; i < NP; i++) {
    tsr_tensor *want;
    assert_int_equal(tsr_tensor_cast(ts[i], TSR_F32, &want), TSR_OK);
    assert_true(bitwise_equal(p[i], want));
    tsr_tensor_free(want);
  }
  /* More than five extras: five are listed, the rest counted. */
  assert_int_equal(
      tsr_safetensors_save(f->model, N, names, (const tsr_tensor *const *)ts, 0, NULL, NULL),
      TSR_OK);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, &opts), TSR_EINVAL);
  assert_error_has("6 tensors the model does not have");
  assert_error_has("'model.layers.4.unknown.weight' and 1 more");
  free_all(p);
  for (int i = 0; i < N; i++) tsr_tensor_free(ts[i]);
}

static unsigned char *slurp(const char *path, size_t *n) {
  unsigned char *b = io_read_file(path, n);
  assert_non_null(b);
  return b;
}

/* Failed saves, before and in the middle of writing, leave the previous checkpoint bitwise. */
static void test_failed_save_keeps_previous_checkpoint(void **state) {
  fixture *f = *state;
  save_fixture(f, 5);
  size_t nm, no;
  unsigned char *model = slurp(f->model, &nm), *optim = slurp(f->optim, &no);

  tsr_tensor *keep = f->p[1];
  f->p[1] = NULL;
  assert_int_equal(
      tsr_checkpoint_save(f->model, NULL, NP, f->names, (const tsr_tensor *const *)f->p,
                          (const tsr_tensor *const *)f->m, (const tsr_tensor *const *)f->v, 6),
      TSR_EINVAL);
  assert_error_has("'model.layers.0.mlp.up_proj.weight' is NULL");
  f->p[1] = keep;

  char bad_optim[200];
  snprintf(bad_optim, sizeof bad_optim, "%s/missing/o.safetensors", f->dir);
  assert_int_equal(
      tsr_checkpoint_save(f->model, bad_optim, NP, f->names, (const tsr_tensor *const *)f->p,
                          (const tsr_tensor *const *)f->m, (const tsr_tensor *const *)f->v, 6),
      TSR_EIO);

  /* A crash in the middle of the data: the file size limit cuts the write. */
  const int64_t big[2] = {256, 256};
  tsr_tensor *bigp;
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, big, &bigp), TSR_OK);
  const tsr_tensor *one[1] = {bigp};
  struct rlimit saved, lim;
  getrlimit(RLIMIT_FSIZE, &saved);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  lim = saved;
  lim.rlim_cur = 8192;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  tsr_status s = tsr_checkpoint_save(f->model, NULL, 1, f->names, one, one, one, 7);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old);
  assert_int_equal(s, TSR_EIO);
  tsr_tensor_free(bigp);

  assert_int_equal(io_count_entries(f->dir), 2);
  size_t nm2, no2;
  unsigned char *model2 = slurp(f->model, &nm2), *optim2 = slurp(f->optim, &no2);
  assert_int_equal(nm2, nm);
  assert_int_equal(no2, no);
  assert_memory_equal(model2, model, nm);
  assert_memory_equal(optim2, optim, no);
  free(model);
  free(optim);
  free(model2);
  free(optim2);
  int64_t step = 0;
  tsr_tensor *m[NP], *v[NP];
  fresh(m);
  fresh(v);
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, NP, f->names, m, v, &step), TSR_OK);
  assert_int_equal(step, 5);
  free_all(m);
  free_all(v);
}

static void test_model_only_and_bad_step(void **state) {
  fixture *f = *state;
  assert_int_equal(tsr_checkpoint_save(f->model, NULL, NP, f->names,
                                       (const tsr_tensor *const *)f->p, NULL, NULL, 0),
                   TSR_OK);
  assert_int_equal(io_count_entries(f->dir), 1);
  assert_int_equal(tsr_checkpoint_save(f->model, NULL, NP, f->names,
                                       (const tsr_tensor *const *)f->p,
                                       (const tsr_tensor *const *)f->m, NULL, 0),
                   TSR_EINVAL);
  /* An optimizer file whose step is not a number. */
  const char *k[2] = {"format", "step"}, *val[2] = {TSR_CHECKPOINT_OPTIM_FORMAT, "12abc"};
  assert_int_equal(tsr_safetensors_save(f->optim, 0, NULL, NULL, 2, k, val), TSR_OK);
  tsr_tensor *m[NP], *v[NP];
  fresh(m);
  fresh(v);
  int64_t step = 0;
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, NP, f->names, m, v, &step), TSR_EINVAL);
  assert_error_has("'12abc'");
  free_all(m);
  free_all(v);
}

/* The pid of a process that has ended (a child reaped): temporaries named after it are stale. */
static long dead_pid(void) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(0);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return (long)pid;
}

static int64_t optim_step(fixture *f) {
  tsr_tensor *m[NP], *v[NP];
  fresh(m);
  fresh(v);
  int64_t step = -1;
  assert_int_equal(tsr_checkpoint_load_optim(f->optim, NP, f->names, m, v, &step), TSR_OK);
  free_all(m);
  free_all(v);
  return step;
}

/* A full disk while the model file is written (after the optimizer file): the old pair stays,
 * not the new optimizer state beside the old weights. */
static void test_failed_model_write_keeps_pair(void **state) {
  fixture *f = *state;
  save_fixture(f, 5);
  /* the model's first tensor is far larger than the optimizer file: only its write fails */
  const int64_t big[2] = {256, 256};
  tsr_tensor *bigp;
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, big, &bigp), TSR_OK);
  const tsr_tensor *p[NP] = {bigp, f->p[1], f->p[2]};
  struct rlimit saved, lim;
  getrlimit(RLIMIT_FSIZE, &saved);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  lim = saved;
  lim.rlim_cur = 16384;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  tsr_status s =
      tsr_checkpoint_save(f->model, NULL, NP, f->names, p, (const tsr_tensor *const *)f->m,
                          (const tsr_tensor *const *)f->v, 6);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old);
  tsr_tensor_free(bigp);
  assert_int_equal(s, TSR_EIO);
  assert_int_equal(io_count_entries(f->dir), 2);
  assert_int_equal(optim_step(f), 5);
  char *model = NULL;
  assert_int_equal(tsr_checkpoint_pair(f->model, f->optim, &model), TSR_OK);
  assert_string_equal(model, f->model);
  free(model);
}

/* Files of two saves are refused as a pair, naming both files, steps and ids. */
static void test_mixed_pair_refused(void **state) {
  fixture *f = *state;
  save_fixture(f, 5);
  char other[200], other_optim[200];
  snprintf(other, sizeof other, "%s/other.safetensors", f->dir);
  snprintf(other_optim, sizeof other_optim, "%s/other.optim.safetensors", f->dir);
  fill_bits(f->p[0], 77u);
  assert_int_equal(tsr_checkpoint_save(other, NULL, NP, f->names, (const tsr_tensor *const *)f->p,
                                       (const tsr_tensor *const *)f->m,
                                       (const tsr_tensor *const *)f->v, 6),
                   TSR_OK);
  assert_int_equal(rename(other_optim, f->optim), 0);
  char *model = NULL;
  assert_int_equal(tsr_checkpoint_pair(f->model, f->optim, &model), TSR_EINVAL);
  assert_null(model);
  assert_error_has(f->model);
  assert_error_has(f->optim);
  assert_error_has("step 5");
  assert_error_has("step 6");
  assert_error_has("not one checkpoint");
  /* the same step from another save is refused too: the ids differ */
  assert_int_equal(tsr_checkpoint_save(other, NULL, NP, f->names, (const tsr_tensor *const *)f->p,
                                       (const tsr_tensor *const *)f->m,
                                       (const tsr_tensor *const *)f->v, 5),
                   TSR_OK);
  assert_int_equal(rename(other_optim, f->optim), 0);
  assert_int_equal(tsr_checkpoint_pair(f->model, f->optim, &model), TSR_EINVAL);
  assert_error_has("checkpoint ");
  /* and each file of one save carries the same step and id */
  tsr_safetensors_t *a, *b;
  assert_int_equal(tsr_safetensors_open(other, &a), TSR_OK);
  assert_int_equal(tsr_safetensors_open(f->optim, &b), TSR_OK);
  assert_string_equal(tsr_safetensors_meta(a, "step"), "5");
  assert_non_null(tsr_safetensors_meta(a, "checkpoint"));
  assert_string_equal(tsr_safetensors_meta(a, "checkpoint"), tsr_safetensors_meta(b, "checkpoint"));
  tsr_safetensors_close(a);
  tsr_safetensors_close(b);
}

/* A save killed between its two renames: the new optimizer file is in place and the new model
 * file still under its temporary name. The pair resolves to that temporary, and the next save
 * removes it. */
static void test_interrupted_publish_recovered(void **state) {
  fixture *f = *state;
  save_fixture(f, 5);
  char other[200], other_optim[200], tmp[300];
  snprintf(other, sizeof other, "%s/other.safetensors", f->dir);
  snprintf(other_optim, sizeof other_optim, "%s/other.optim.safetensors", f->dir);
  fill_bits(f->p[0], 91u);
  assert_int_equal(tsr_checkpoint_save(other, NULL, NP, f->names, (const tsr_tensor *const *)f->p,
                                       (const tsr_tensor *const *)f->m,
                                       (const tsr_tensor *const *)f->v, 6),
                   TSR_OK);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.0badf00d", f->model, dead_pid());
  assert_int_equal(rename(other_optim, f->optim), 0);
  assert_int_equal(rename(other, tmp), 0);
  char *model = NULL;
  assert_int_equal(tsr_checkpoint_pair(f->model, f->optim, &model), TSR_OK);
  assert_string_equal(model, tmp);
  tsr_tensor *p[NP];
  fresh(p);
  assert_int_equal(tsr_checkpoint_load_model(model, NP, f->names, p, NULL), TSR_OK);
  for (int i = 0; i < NP; i++) assert_true(bitwise_equal(p[i], f->p[i]));
  free_all(p);
  free(model);
  /* the next save publishes a whole pair and removes the dead writer's temporary */
  save_fixture(f, 7);
  assert_int_equal(io_count_entries(f->dir), 2);
  assert_int_equal(tsr_checkpoint_pair(f->model, f->optim, &model), TSR_OK);
  assert_string_equal(model, f->model);
  free(model);
}

/* Temporaries of writers that are gone are removed by the next save; a live writer's are kept. */
static void test_stale_temporaries_removed(void **state) {
  fixture *f = *state;
  char dead[300], dead_optim[300], live[300], other[300];
  long pid = dead_pid();
  snprintf(dead, sizeof dead, "%s.tmp.%ld.deadbeef", f->model, pid);
  snprintf(dead_optim, sizeof dead_optim, "%s.tmp.%ld.0000beef", f->optim, pid);
  snprintf(live, sizeof live, "%s.tmp.%ld.feedbeef", f->model, (long)getppid());
  snprintf(other, sizeof other, "%s/ckpt.safetensors.tmp.notapid", f->dir);
  io_write_file(dead, "x", 1);
  io_write_file(dead_optim, "x", 1);
  io_write_file(live, "x", 1);
  io_write_file(other, "x", 1);
  save_fixture(f, 1);
  struct stat sb;
  assert_int_equal(stat(dead, &sb), -1);
  assert_int_equal(stat(dead_optim, &sb), -1);
  assert_int_equal(stat(live, &sb), 0);
  assert_int_equal(stat(other, &sb), 0);
  assert_int_equal(io_count_entries(f->dir), 4);
}

/* Replacing a checkpoint keeps its files' permissions. */
static void test_replace_keeps_mode(void **state) {
  fixture *f = *state;
  save_fixture(f, 1);
  assert_int_equal(chmod(f->model, 0600), 0);
  assert_int_equal(chmod(f->optim, 0640), 0);
  save_fixture(f, 2);
  struct stat sb;
  assert_int_equal(stat(f->model, &sb), 0);
  assert_int_equal(sb.st_mode & 07777, 0600);
  assert_int_equal(stat(f->optim, &sb), 0);
  assert_int_equal(sb.st_mode & 07777, 0640);
}

/* NaN or Inf in a checkpoint is refused at load, naming the tensor; nothing is written. */
static void test_nonfinite_refused(void **state) {
  fixture *f = *state;
  float *x = tsr_tensor_data(f->p[1]);
  x[2] = NAN;
  assert_int_equal(tsr_checkpoint_save(f->model, NULL, NP, f->names,
                                       (const tsr_tensor *const *)f->p, NULL, NULL, 0),
                   TSR_OK);
  tsr_tensor *p[NP];
  fresh(p);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.layers.0.mlp.up_proj.weight'");
  assert_error_has("NaN at element 2");
  assert_true(untouched(p));
  /* Inf in a bf16 file (a Hugging Face checkpoint) */
  x[2] = 1.0f;
  tsr_tensor *bf[NP];
  for (int i = 0; i < NP; i++) assert_int_equal(tsr_tensor_cast(f->p[i], TSR_BF16, &bf[i]), TSR_OK);
  uint16_t inf = 0xff80u; /* -Inf */
  memcpy((uint16_t *)tsr_tensor_data(bf[0]) + 5, &inf, 2);
  assert_int_equal(
      tsr_safetensors_save(f->model, NP, f->names, (const tsr_tensor *const *)bf, 0, NULL, NULL),
      TSR_OK);
  assert_int_equal(tsr_checkpoint_load_model(f->model, NP, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.embed_tokens.weight' holds Inf at element 5");
  assert_true(untouched(p));
  free_all(bf);
  free_all(p);
}

/* A tensor in a dtype Tessera has no tensor for is a bad checkpoint (TSR_EINVAL, exit 2), not a
 * missing feature (exit 1). */
static void test_unloadable_dtype_is_bad_input(void **state) {
  fixture *f = *state;
  unsigned char data[12] = {0};
  io_write_st(f->model,
              "{\"model.embed_tokens.weight\":{\"dtype\":\"U8\",\"shape\":[4,3],"
              "\"data_offsets\":[0,12]}}",
              data, sizeof data);
  tsr_tensor *p[NP];
  fresh(p);
  assert_int_equal(tsr_checkpoint_load_model(f->model, 1, f->names, p, NULL), TSR_EINVAL);
  assert_error_has("'model.embed_tokens.weight' has dtype U8");
  assert_true(untouched(p));
  free_all(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optim_path),
      cmocka_unit_test_setup_teardown(test_round_trip_bitwise, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_extra_and_wrong_shape, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hf_file_bf16_and_ignore_patterns, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_save_keeps_previous_checkpoint, setup, teardown),
      cmocka_unit_test_setup_teardown(test_model_only_and_bad_step, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_model_write_keeps_pair, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mixed_pair_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_interrupted_publish_recovered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_temporaries_removed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replace_keeps_mode, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nonfinite_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unloadable_dtype_is_bad_input, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
