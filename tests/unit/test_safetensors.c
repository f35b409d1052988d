/* Safetensors: round trips, the byte format, every validation error, atomic saves, dumps. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "tessera/io.h"
#include "test_io_util.h"

typedef struct fixture {
  char dir[64];
  char path[128];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  io_tmpdir(f->dir, sizeof f->dir);
  snprintf(f->path, sizeof f->path, "%s/t.safetensors", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  io_rmtree(f->dir);
  free(f);
  return 0;
}

#define assert_error_has(text)                                                                     \
  do {                                                                                             \
    if (!strstr(tsr_last_error(), (text)))                                                         \
      fail_msg("error \"%s\" lacks \"%s\"", tsr_last_error(), (text));                             \
  } while (0)

static tsr_tensor *arange(tsr_dtype dt, int ndim, const int64_t *shape, double bias) {
  tsr_tensor *t;
  assert_int_equal(tsr_tensor_new(NULL, dt, ndim, shape, &t), TSR_OK);
  tsr_tensor_fill_arange(t, 1, bias);
  return t;
}

static void test_round_trip_every_dtype(void **state) {
  fixture *f = *state;
  enum { K = 3 * TSR_DTYPE_COUNT + 1 };
  tsr_tensor *ts[K];
  char names[K][32];
  const char *pn[K];
  const int64_t s23[2] = {2, 3}, s04[2] = {0, 4};
  int k = 0;
  for (int dt = 0; dt < TSR_DTYPE_COUNT; dt++) {
    ts[k] = arange((tsr_dtype)dt, 2, s23, -3);
    snprintf(names[k], 32, "%s.matrix", tsr_dtype_name((tsr_dtype)dt));
    k++;
    ts[k] = arange((tsr_dtype)dt, 0, NULL, 7);
    snprintf(names[k], 32, "%s.scalar", tsr_dtype_name((tsr_dtype)dt));
    k++;
    ts[k] = arange((tsr_dtype)dt, 2, s04, 0);
    snprintf(names[k], 32, "%s.empty", tsr_dtype_name((tsr_dtype)dt));
    k++;
  }
  /* A transposed view is written as its contiguous copy. */
  const int perm[2] = {1, 0};
  assert_int_equal(tsr_tensor_permute(ts[0], perm, &ts[k]), TSR_OK);
  snprintf(names[k], 32, "transposed");
  k++;
  for (int i = 0; i < k; i++) pn[i] = names[i];
  const char *mk[2] = {"format", "note"}, *mv[2] = {"pt", "a \"quoted\"\nline"};
  assert_int_equal(tsr_safetensors_save(f->path, k, pn, (const tsr_tensor *const *)ts, 2, mk, mv),
                   TSR_OK);

  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  assert_int_equal(tsr_safetensors_count(st), k);
  for (int i = 0; i < k; i++) {
    assert_string_equal(tsr_safetensors_name(st, i), pn[i]);
    tsr_tensor *r;
    assert_int_equal(tsr_safetensors_read(st, pn[i], &r), TSR_OK);
    assert_true(tsr_tensor_is_contiguous(r));
    assert_true(tsr_tensor_equal(r, ts[i]));
    tsr_tensor_free(r);
  }
  tsr_dtype dt;
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  assert_int_equal(tsr_safetensors_info(st, "transposed", &dt, &ndim, shape), TSR_OK);
  assert_int_equal(dt, TSR_F32);
  assert_int_equal(ndim, 2);
  assert_int_equal(shape[0], 3);
  assert_int_equal(shape[1], 2);
  assert_int_equal(tsr_safetensors_info(st, "i64.scalar", &dt, &ndim, shape), TSR_OK);
  assert_int_equal(ndim, 0);
  assert_int_equal(dt, TSR_I64);
  assert_string_equal(tsr_safetensors_dtype_str(st, "bf16.empty"), "BF16");
  assert_int_equal(tsr_safetensors_meta_count(st), 2);
  assert_string_equal(tsr_safetensors_meta_key(st, 1), "note");
  assert_string_equal(tsr_safetensors_meta(st, "note"), mv[1]);
  assert_string_equal(tsr_safetensors_meta(st, "format"), "pt");
  assert_null(tsr_safetensors_meta(st, "absent"));
  assert_true(tsr_safetensors_has(st, "f32.empty"));
  assert_false(tsr_safetensors_has(st, "f32"));
  assert_int_equal(tsr_safetensors_info(st, "zz", &dt, &ndim, shape), TSR_EINVAL);
  assert_error_has("no tensor 'zz' in ");
  assert_error_has(f->path);
  tsr_safetensors_close(st);
  for (int i = 0; i < k; i++) tsr_tensor_free(ts[i]);

  /* Nothing but the file itself is left in the directory. */
  assert_int_equal(io_count_entries(f->dir), 1);
}

/* The exact bytes of a small file, as the reference implementation writes them. */
static void test_writer_bytes(void **state) {
  fixture *f = *state;
  const int64_t shape[1] = {2};
  tsr_tensor *t = arange(TSR_F32, 1, shape, 1); /* 1.0, 2.0 */
  const char *name = "x";
  assert_int_equal(
      tsr_safetensors_save(f->path, 1, &name, (const tsr_tensor *const *)&t, 0, NULL, NULL),
      TSR_OK);
  tsr_tensor_free(t);
  const char hdr[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  size_t hlen = strlen(hdr), padded = (hlen + 7) / 8 * 8, n;
  unsigned char *b = io_read_file(f->path, &n);
  assert_int_equal(n, 8 + padded + 8);
  assert_int_equal(b[0], padded);
  for (int i = 1; i < 8; i++) assert_int_equal(b[i], 0);
  assert_memory_equal(b + 8, hdr, hlen);
  for (size_t i = hlen; i < padded; i++) assert_int_equal(b[8 + i], ' ');
  const unsigned char data[8] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
  assert_memory_equal(b + 8 + padded, data, 8);
  free(b);
}

/* A file written byte by byte, with metadata last and unpadded: what another writer may do. */
static void test_read_hand_made_file(void **state) {
  fixture *f = *state;
  const char *hdr = "{\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[4,12]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[0,4]},"
                    "\"__metadata__\":{\"k\":\"v\"}}";
  const unsigned char data[12] = {0x80, 0x3f, 0x40, 0xc0, /* bf16 1.0, -3.0 */
                                  0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  io_write_st(f->path, hdr, data, sizeof data);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  assert_int_equal(tsr_safetensors_count(st), 2);
  assert_string_equal(tsr_safetensors_name(st, 0), "b");
  assert_string_equal(tsr_safetensors_meta(st, "k"), "v");
  tsr_tensor *a, *b, *a32;
  assert_int_equal(tsr_safetensors_read(st, "a", &a), TSR_OK);
  assert_int_equal(a->dtype, TSR_BF16);
  assert_int_equal(tsr_safetensors_read_as(st, "a", TSR_F32, &a32), TSR_OK);
  assert_true(((float *)tsr_tensor_data(a32))[0] == 1.0f);
  assert_true(((float *)tsr_tensor_data(a32))[1] == -3.0f);
  assert_int_equal(tsr_safetensors_read(st, "b", &b), TSR_OK);
  assert_int_equal(b->ndim, 0);
  assert_true(*(int64_t *)tsr_tensor_data(b) == INT64_MAX - 1);
  /* I64 -> I32 refuses a value that does not fit, naming the tensor. */
  tsr_tensor *b32 = NULL;
  assert_int_equal(tsr_safetensors_read_as(st, "b", TSR_I32, &b32), TSR_EINVAL);
  assert_null(b32);
  assert_error_has("'b'");
  assert_error_has("does not fit");
  /* Floats and integers do not convert into each other. */
  assert_int_equal(tsr_safetensors_read_as(st, "a", TSR_I32, &b32), TSR_EINVAL);
  assert_error_has("cannot be read as i32");
  tsr_tensor_free(a);
  tsr_tensor_free(a32);
  tsr_tensor_free(b);
  tsr_safetensors_close(st);
}

static void test_read_as_round_trips_halves(void **state) {
  fixture *f = *state;
  const int64_t shape[1] = {5};
  tsr_tensor *t = arange(TSR_F32, 1, shape, 0), *h, *r;
  float *p = tsr_tensor_data(t);
  p[1] = 0.1f; /* rounds in both half types */
  p[2] = 1e-6f;
  const char *name = "w";
  assert_int_equal(
      tsr_safetensors_save(f->path, 1, &name, (const tsr_tensor *const *)&t, 0, NULL, NULL),
      TSR_OK);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  const tsr_dtype halves[2] = {TSR_BF16, TSR_F16};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(tsr_safetensors_read_as(st, "w", halves[k], &h), TSR_OK);
    assert_int_equal(tsr_tensor_cast(t, halves[k], &r), TSR_OK);
    assert_true(tsr_tensor_equal(h, r));
    tsr_tensor_free(h);
    tsr_tensor_free(r);
  }
  tsr_safetensors_close(st);
  tsr_tensor_free(t);
}

static void test_read_into(void **state) {
  fixture *f = *state;
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s46[2] = {4, 6};
  tsr_tensor *t = arange(TSR_F32, 2, s23, 0), *wrong, *i32, *big, *slot;
  const char *name = "model.embed_tokens.weight";
  assert_int_equal(
      tsr_safetensors_save(f->path, 1, &name, (const tsr_tensor *const *)&t, 0, NULL, NULL),
      TSR_OK);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, s32, &wrong), TSR_OK);
  assert_int_equal(tsr_safetensors_read_into(st, name, wrong), TSR_EINVAL);
  assert_error_has(name);
  assert_error_has("[2, 3]");
  assert_error_has("[3, 2]");
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, s23, &i32), TSR_OK);
  assert_int_equal(tsr_safetensors_read_into(st, name, i32), TSR_EINVAL);
  assert_error_has("f32");
  assert_error_has("i32");
  /* Into a strided window of a larger tensor; the rest stays zero. */
  assert_int_equal(tsr_tensor_new(NULL, TSR_F32, 2, s46, &big), TSR_OK);
  tsr_tensor *rows;
  assert_int_equal(tsr_tensor_narrow(big, 0, 1, 2, &rows), TSR_OK);
  assert_int_equal(tsr_tensor_narrow(rows, 1, 2, 3, &slot), TSR_OK);
  assert_int_equal(tsr_safetensors_read_into(st, name, slot), TSR_OK);
  assert_true(tsr_tensor_equal(slot, t));
  const int64_t at[2] = {0, 0}, in[2] = {2, 4};
  assert_true(tsr_tensor_get(big, at) == 0.0);
  assert_true(tsr_tensor_get(big, in) == 5.0);
  tsr_tensor_free(slot);
  tsr_tensor_free(rows);
  tsr_tensor_free(big);
  tsr_tensor_free(i32);
  tsr_tensor_free(wrong);
  tsr_tensor_free(t);
  tsr_safetensors_close(st);
}

/* Saves a two-tensor file and returns its bytes. */
static unsigned char *two_tensor_file(const char *path, size_t *n) {
  const int64_t s1[1] = {4}, s2[2] = {2, 8};
  tsr_tensor *t[2] = {arange(TSR_F32, 1, s1, 0), arange(TSR_F32, 2, s2, 0)};
  const char *names[2] = {"first", "second"};
  assert_int_equal(
      tsr_safetensors_save(path, 2, names, (const tsr_tensor *const *)t, 0, NULL, NULL), TSR_OK);
  tsr_tensor_free(t[0]);
  tsr_tensor_free(t[1]);
  return io_read_file(path, n);
}

static void expect_open_fails(const char *path, tsr_status want, const char *text) {
  tsr_safetensors_t *st = (tsr_safetensors_t *)1;
  tsr_clear_error();
  assert_int_equal(tsr_safetensors_open(path, &st), want);
  assert_null(st);
  assert_error_has(path);
  if (text) assert_error_has(text);
}

static void test_truncated(void **state) {
  fixture *f = *state;
  size_t n;
  unsigned char *b = two_tensor_file(f->path, &n);
  size_t hlen = b[0] | (size_t)b[1] << 8;
  size_t data = 8 + hlen; /* first: 16 bytes, second: 64 */
  const struct {
    size_t cut;
    const char *text;
  } cuts[] = {
      {0, "truncated"},        {5, "truncated"},
      {8, "truncated"},        {8 + hlen / 2, "truncated"},
      {data, "'first'"},       {data + 10, "'first'"},
      {data + 16, "'second'"}, {data + 50, "'second'"},
      {n - 1, "'second'"},
  };
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    io_write_file(f->path, b, cuts[i].cut);
    expect_open_fails(f->path, TSR_EINVAL, cuts[i].text);
  }
  /* Nothing follows the full file; one extra byte belongs to no tensor. */
  unsigned char *longer = malloc(n + 1);
  memcpy(longer, b, n);
  longer[n] = 0;
  io_write_file(f->path, longer, n + 1);
  expect_open_fails(f->path, TSR_EINVAL, "belong to no tensor");
  io_write_file(f->path, b, n);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  tsr_safetensors_close(st);
  free(longer);
  free(b);
}

static void test_bad_headers(void **state) {
  fixture *f = *state;
  unsigned char data[64] = {0};
  const struct {
    const char *header;
    size_t dlen;
    const char *text;
  } cases[] = {
      {"{\"a\": {\"dtype\": \"F32\", ", 0, "not valid JSON"},
      {"[1, 2]", 0, "not an object"},
      {"{} x", 0, "unexpected bytes"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the end"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
       12, "overlaps"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
       16, "'a' appears twice"},
      {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "unknown dtype 'Q4'"},
      {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing \"dtype\""},
      {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing \"shape\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape entry 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "end before"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "belong to no"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
       "rank 9"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],"
       "\"data_offsets\":[0,8]}}",
       8, "needs more than"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
      {"{\"a\":[0]}", 0, "not a JSON object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    io_write_st(f->path, cases[i].header, data, cases[i].dlen);
    expect_open_fails(f->path, TSR_EINVAL, cases[i].text);
    /* Once the JSON parses, a message about one tensor names it. */
    if (i > 0 && strstr(cases[i].header, "\"a\"") && !strstr(cases[i].text, "belong"))
      assert_error_has("'a'");
  }
  /* A header length larger than the file, and a missing file. */
  unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
  io_write_file(f->path, big, sizeof big);
  expect_open_fails(f->path, TSR_EINVAL, "header length");
  char missing[160];
  snprintf(missing, sizeof missing, "%s/none.safetensors", f->dir);
  expect_open_fails(missing, TSR_EIO, "cannot open");
  expect_open_fails(f->dir, TSR_EIO, "not a regular file");
}

/* Dtypes of the format that Tessera has no tensor type for: listed, described, not loaded. */
static void test_unsupported_dtype(void **state) {
  fixture *f = *state;
  const char *hdr = "{\"ids\":{\"dtype\":\"U16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                    "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[6,8]}}";
  unsigned char data[8] = {1, 0, 2, 0, 3, 0, 1, 0};
  io_write_st(f->path, hdr, data, sizeof data);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  assert_string_equal(tsr_safetensors_dtype_str(st, "ids"), "U16");
  int ndim = -1;
  int64_t shape[TSR_MAX_DIMS];
  assert_int_equal(tsr_safetensors_info(st, "ids", NULL, &ndim, shape), TSR_OK);
  assert_int_equal(ndim, 1);
  assert_int_equal(shape[0], 3);
  tsr_dtype dt;
  assert_int_equal(tsr_safetensors_info(st, "mask", &dt, &ndim, shape), TSR_ENOTSUP);
  assert_error_has("BOOL");
  tsr_tensor *t = NULL;
  assert_int_equal(tsr_safetensors_read(st, "ids", &t), TSR_ENOTSUP);
  assert_null(t);
  assert_error_has("'ids'");
  assert_error_has("U16");
  tsr_safetensors_close(st);
}

static void test_save_argument_errors(void **state) {
  fixture *f = *state;
  const int64_t s[1] = {2};
  tsr_tensor *t = arange(TSR_F32, 1, s, 0);
  const tsr_tensor *ts[2] = {t, NULL};
  const char *names[2] = {"a", "b"}, *dup[2] = {"a", "a"}, *meta[1] = {"__metadata__"};
  assert_int_equal(tsr_safetensors_save(f->path, 2, names, ts, 0, NULL, NULL), TSR_EINVAL);
  assert_error_has("'b'");
  assert_error_has("NULL");
  ts[1] = t;
  assert_int_equal(tsr_safetensors_save(f->path, 2, dup, ts, 0, NULL, NULL), TSR_EINVAL);
  assert_error_has("'a' is given twice");
  assert_int_equal(tsr_safetensors_save(f->path, 1, meta, ts, 0, NULL, NULL), TSR_EINVAL);
  assert_error_has("reserved");
  assert_int_equal(tsr_safetensors_save(f->path, 1, names, ts, 2, dup, dup), TSR_EINVAL);
  assert_error_has("metadata key 'a'");
  assert_int_equal(io_count_entries(f->dir), 0);
  /* An empty file is valid: "{}" padded, no data. */
  assert_int_equal(tsr_safetensors_save(f->path, 0, NULL, NULL, 0, NULL, NULL), TSR_OK);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(f->path, &st), TSR_OK);
  assert_int_equal(tsr_safetensors_count(st), 0);
  tsr_safetensors_close(st);
  tsr_tensor_free(t);
}

/* A failed save leaves the old file byte for byte and no temporary file. */
static void test_failed_save_keeps_old_file(void **state) {
  fixture *f = *state;
  size_t n0;
  unsigned char *old = two_tensor_file(f->path, &n0);
  const int64_t sbig[1] = {1 << 16};
  tsr_tensor *big = arange(TSR_F32, 1, sbig, 0);
  const char *name = "big";
  const tsr_tensor *tp = big;

  /* Fail in the middle of the data: the file size limit stops the write after the header. */
  struct rlimit saved, lim;
  getrlimit(RLIMIT_FSIZE, &saved);
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  lim = saved;
  lim.rlim_cur = 4096;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  tsr_status s = tsr_safetensors_save(f->path, 1, &name, &tp, 0, NULL, NULL);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  assert_int_equal(s, TSR_EIO);
  assert_error_has(f->path);
  assert_int_equal(io_count_entries(f->dir), 1);
  size_t n1;
  unsigned char *now = io_read_file(f->path, &n1);
  assert_int_equal(n1, n0);
  assert_memory_equal(now, old, n0);
  free(now);

  /* The destination is a directory. */
  char sub[160];
  snprintf(sub, sizeof sub, "%s/sub", f->dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  assert_int_equal(tsr_safetensors_save(sub, 1, &name, &tp, 0, NULL, NULL), TSR_EINVAL);
  assert_error_has("directory");
  assert_int_equal(io_count_entries(f->dir), 2);
  assert_int_equal(io_count_entries(sub), 0);

  /* The directory does not exist. */
  char missing[200];
  snprintf(missing, sizeof missing, "%s/none/x.safetensors", f->dir);
  assert_int_equal(tsr_safetensors_save(missing, 1, &name, &tp, 0, NULL, NULL), TSR_EIO);
  assert_error_has("none/x.safetensors");

  /* The directory is not writable (root writes anyway, so only checked for other users). */
  if (geteuid() != 0) {
    char inner[200];
    snprintf(inner, sizeof inner, "%s/t.safetensors", sub);
    assert_int_equal(tsr_safetensors_save(inner, 1, &name, &tp, 0, NULL, NULL), TSR_OK);
    assert_int_equal(chmod(sub, 0500), 0);
    const int64_t s1[1] = {1};
    tsr_tensor *small = arange(TSR_F32, 1, s1, 0);
    const tsr_tensor *sp = small;
    assert_int_equal(tsr_safetensors_save(inner, 1, &name, &sp, 0, NULL, NULL), TSR_EIO);
    chmod(sub, 0700);
    tsr_safetensors_t *st;
    assert_int_equal(tsr_safetensors_open(inner, &st), TSR_OK);
    int64_t shape[TSR_MAX_DIMS];
    assert_int_equal(tsr_safetensors_info(st, "big", NULL, NULL, shape), TSR_OK);
    assert_int_equal(shape[0], 1 << 16);
    assert_int_equal(io_count_entries(sub), 1);
    tsr_safetensors_close(st);
    tsr_tensor_free(small);
  }
  free(old);
  tsr_tensor_free(big);
}

static void test_dump_save_and_compare(void **state) {
  fixture *f = *state;
  char a[160], b[160], c[160];
  snprintf(a, sizeof a, "%s/a.safetensors", f->dir);
  snprintf(b, sizeof b, "%s/b.safetensors", f->dir);
  snprintf(c, sizeof c, "%s/c.safetensors", f->dir);
  const int64_t sl[3] = {1, 2, 4}, sg[2] = {2, 2};
  tsr_tensor *logits = arange(TSR_F32, 3, sl, 0), *loss = arange(TSR_F32, 0, NULL, 2.5);
  tsr_tensor *grad = arange(TSR_BF16, 2, sg, 1), *after = arange(TSR_F32, 2, sg, 0);
  const char *names[4] = {"logits", "loss", "grad.w", "after.w"};
  const tsr_tensor *ts[4] = {logits, loss, grad, after};
  assert_int_equal(tsr_dump_save(a, 4, names, ts), TSR_OK);
  tsr_safetensors_t *st;
  assert_int_equal(tsr_safetensors_open(a, &st), TSR_OK);
  assert_string_equal(tsr_safetensors_meta(st, "format"), TSR_DUMP_FORMAT);
  assert_string_equal(tsr_safetensors_dtype_str(st, "grad.w"), "F32");
  tsr_safetensors_close(st);

  char report[512];
  int nbad = -1;
  assert_int_equal(tsr_dump_compare(a, a, 0, 0, report, sizeof report, &nbad), TSR_OK);
  assert_int_equal(nbad, 0);

  /* Within tolerance, then outside it. */
  float *p = tsr_tensor_data(logits);
  p[5] += 1e-5f;
  assert_int_equal(tsr_dump_save(b, 4, names, ts), TSR_OK);
  assert_int_equal(tsr_dump_compare(a, b, 1e-4, 1e-4, report, sizeof report, &nbad), TSR_OK);
  assert_int_equal(nbad, 0);
  p[5] += 1.0f;
  assert_int_equal(tsr_dump_save(b, 4, names, ts), TSR_OK);
  assert_int_equal(tsr_dump_compare(a, b, 1e-4, 1e-4, report, sizeof report, &nbad), TSR_OK);
  assert_int_equal(nbad, 1);
  if (!strstr(report, "logits") || !strstr(report, "[0, 1, 1]"))
    fail_msg("report \"%s\" does not name logits [0, 1, 1]", report);

  /* A missing tensor and a shape change are both named. */
  const int64_t s4[1] = {4};
  tsr_tensor *flat = arange(TSR_F32, 1, s4, 0);
  const tsr_tensor *ts2[3] = {logits, loss, flat};
  assert_int_equal(tsr_dump_save(c, 3, names, ts2), TSR_OK);
  assert_int_equal(tsr_dump_compare(a, c, 1e-4, 1e-4, report, sizeof report, &nbad), TSR_OK);
  assert_int_equal(nbad, 3);
  if (!strstr(report, "after.w") || !strstr(report, "[2, 2]") || !strstr(report, "[4]"))
    fail_msg("report \"%s\" does not name after.w and both grad.w shapes", report);
  /* A NaN agrees only with a NaN at the same place, whatever the tolerance. */
  p[0] = NAN;
  assert_int_equal(tsr_dump_save(b, 4, names, ts), TSR_OK);
  assert_int_equal(tsr_dump_compare(b, b, 1, 1, NULL, 0, &nbad), TSR_OK);
  assert_int_equal(nbad, 0);
  assert_int_equal(tsr_dump_compare(b, a, 1e6, 1e6, NULL, 0, &nbad), TSR_OK);
  assert_int_equal(nbad, 1);
  /* An unreadable file is an error, not a mismatch. */
  snprintf(c, sizeof c, "%s/none.safetensors", f->dir);
  assert_int_equal(tsr_dump_compare(a, c, 0, 0, report, sizeof report, &nbad), TSR_EIO);
  tsr_tensor_free(flat);
  tsr_tensor_free(logits);
  tsr_tensor_free(loss);
  tsr_tensor_free(grad);
  tsr_tensor_free(after);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip_every_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writer_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_hand_made_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_as_round_trips_halves, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_into, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unsupported_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_save_argument_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_save_keeps_old_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dump_save_and_compare, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
