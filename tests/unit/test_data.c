/* Data sources: batch contents, determinism in (seed, step), and every error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tessera/io.h"
#include "test_io_util.h"

#define B 4
#define L 8

typedef struct fixture {
  char dir[64];
  char path[128];
  char source[160];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  io_tmpdir(f->dir, sizeof f->dir);
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

/* Names a file in the fixture's directory and the source string for it. */
static const char *source_for(fixture *f, const char *kind, const char *file) {
  snprintf(f->path, sizeof f->path, "%s/%s", f->dir, file);
  snprintf(f->source, sizeof f->source, "%s:%s", kind, f->path);
  return f->source;
}

static void expect_open_fails(const char *source, int vocab, int seq, const char *text) {
  tsr_data_t *d = (tsr_data_t *)1;
  assert_int_not_equal(tsr_data_open(source, vocab, B, seq, 1, &d), TSR_OK);
  assert_null(d);
  assert_error_has(text);
}

/* Steps [0, n) of a source, B*L ids then B*L labels per step. */
static int32_t *batches(const char *source, int vocab, uint64_t seed, int n) {
  tsr_data_t *d;
  assert_int_equal(tsr_data_open(source, vocab, B, L, seed, &d), TSR_OK);
  int32_t *out = malloc((size_t)n * 2 * B * L * sizeof *out);
  for (int s = 0; s < n; s++) {
    assert_int_equal(tsr_data_step(d), s);
    assert_int_equal(
        tsr_data_next(d, out + (size_t)s * 2 * B * L, out + ((size_t)s * 2 + 1) * B * L), TSR_OK);
  }
  tsr_data_close(d);
  return out;
}

/* Same seed, same batches; another seed, other batches; set_step replays a step. */
static void check_determinism(const char *source, int vocab) {
  enum { N = 6 };
  size_t n = (size_t)N * 2 * B * L * sizeof(int32_t);
  int32_t *a = batches(source, vocab, 42, N), *b = batches(source, vocab, 42, N);
  int32_t *c = batches(source, vocab, 43, N);
  assert_memory_equal(a, b, n);
  assert_memory_not_equal(a, c, n);
  /* Consecutive steps differ. */
  assert_memory_not_equal(a, a + 2 * B * L, 2 * B * L * sizeof(int32_t));
  tsr_data_t *d;
  int32_t ids[B * L], labels[B * L];
  assert_int_equal(tsr_data_open(source, vocab, B, L, 42, &d), TSR_OK);
  tsr_data_set_step(d, 4);
  assert_int_equal(tsr_data_next(d, ids, labels), TSR_OK);
  assert_int_equal(tsr_data_step(d), 5);
  assert_memory_equal(ids, a + 4 * 2 * B * L, sizeof ids);
  assert_memory_equal(labels, a + (4 * 2 + 1) * B * L, sizeof labels);
  tsr_data_close(d);
  free(a);
  free(b);
  free(c);
}

static void test_synthetic(void **state) {
  enum { V = 16, N = 200 };
  check_determinism("synthetic", V);
  int32_t *a = batches("synthetic", V, 7, N);
  /* Labels are the inputs shifted by one; every id is in range. */
  int count[V][V] = {{0}};
  for (int s = 0; s < N; s++) {
    const int32_t *ids = a + (size_t)s * 2 * B * L, *lab = ids + B * L;
    for (int b = 0; b < B; b++)
      for (int i = 0; i < L; i++) {
        int32_t x = ids[b * L + i], y = lab[b * L + i];
        assert_true(x >= 0 && x < V && y >= 0 && y < V);
        if (i + 1 < L) assert_int_equal(ids[b * L + i + 1], y);
        count[x][y]++;
      }
  }
  /* Learnable: each token has one usual successor, about 7/8 of the time, and the successors
   * are a permutation. */
  int followed = 0, total = 0, seen[V] = {0};
  for (int x = 0; x < V; x++) {
    int best = 0;
    for (int y = 0; y < V; y++) {
      total += count[x][y];
      if (count[x][y] > count[x][best]) best = y;
    }
    followed += count[x][best];
    seen[best]++;
  }
  double frac = (double)followed / total;
  if (frac < 0.8 || frac > 0.95) fail_msg("rule followed %.3f of the time", frac);
  for (int y = 0; y < V; y++) assert_int_equal(seen[y], 1);
  free(a);

  int32_t ids[B * L], labels[B * L];
  tsr_data_t *d;
  assert_int_equal(tsr_data_open("synthetic", 1, B, L, 3, &d), TSR_OK);
  assert_int_equal(tsr_data_next(d, ids, labels), TSR_OK);
  for (int i = 0; i < B * L; i++) assert_true(ids[i] == 0 && labels[i] == 0);
  assert_int_equal(tsr_data_next(d, NULL, labels), TSR_EINVAL);
  tsr_data_close(d);
}

static void test_text(void **state) {
  fixture *f = *state;
  enum { SIZE = 200, N = 400 };
  unsigned char bytes[SIZE];
  for (int i = 0; i < SIZE; i++) bytes[i] = (unsigned char)i;
  const char *src = source_for(f, "text", "corpus.txt");
  io_write_file(f->path, bytes, SIZE);
  check_determinism(src, 256);
  /* Byte j holds j, so a row's first id is its position: windows are consecutive bytes drawn
   * over every start from 0 to SIZE - (L + 1). */
  int32_t *a = batches(src, 300, 1, N);
  int lo = SIZE, hi = -1;
  for (int s = 0; s < N; s++)
    for (int b = 0; b < B; b++) {
      const int32_t *ids = a + (size_t)s * 2 * B * L + b * L, *lab = ids + B * L;
      for (int i = 0; i < L; i++) {
        assert_int_equal(ids[i], ids[0] + i);
        assert_int_equal(lab[i], ids[0] + i + 1);
      }
      if (ids[0] < lo) lo = ids[0];
      if (ids[0] > hi) hi = ids[0];
    }
  assert_int_equal(lo, 0);
  assert_int_equal(hi, SIZE - (L + 1));
  free(a);

  expect_open_fails(src, 255, L, "vocab_size >= 256");
  io_write_file(f->path, bytes, L);
  expect_open_fails(src, 256, L, "8 tokens, but a row needs seq_len + 1 = 9");
  assert_error_has(f->path);
  /* Exactly L + 1 bytes: one window. */
  io_write_file(f->path, bytes, L + 1);
  int32_t *one = batches(src, 256, 9, 2);
  assert_int_equal(one[0], 0);
  assert_int_equal(one[B * L + L - 1], L);
  free(one);
  const char *missing = source_for(f, "text", "none.txt");
  expect_open_fails(missing, 256, L, "none.txt: cannot open");
}

static void test_tokens(void **state) {
  fixture *f = *state;
  enum { NTOK = 100 };
  unsigned char b16[2 * NTOK], b32[4 * NTOK];
  for (int i = 0; i < NTOK; i++) {
    uint32_t v16 = 1000u + (uint32_t)i, v32 = 70000u + (uint32_t)i;
    b16[2 * i] = (unsigned char)v16;
    b16[2 * i + 1] = (unsigned char)(v16 >> 8);
    for (int k = 0; k < 4; k++) b32[4 * i + k] = (unsigned char)(v32 >> (8 * k));
  }
  const char *src = source_for(f, "tokens", "t.u16");
  io_write_file(f->path, b16, sizeof b16);
  check_determinism(src, 2000);
  int32_t *a = batches(src, 1100, 5, 20);
  for (int s = 0; s < 20; s++)
    for (int b = 0; b < B; b++) {
      const int32_t *ids = a + (size_t)s * 2 * B * L + b * L, *lab = ids + B * L;
      assert_true(ids[0] >= 1000 && ids[0] + L < 1000 + NTOK);
      for (int i = 0; i < L; i++) {
        assert_int_equal(ids[i], ids[0] + i);
        assert_int_equal(lab[i], ids[0] + i + 1);
      }
    }
  free(a);
  /* The largest id is 1099 at token 99, byte 198. */
  expect_open_fails(src, 1099, L, "token 99 (byte offset 198) is 1099, not below vocab_size 1099");
  assert_error_has(f->path);
  io_write_file(f->path, b16, 2 * NTOK - 1);
  expect_open_fails(src, 2000, L, "199 bytes is not a whole number of 2-byte tokens");

  src = source_for(f, "tokens32", "t.u32");
  io_write_file(f->path, b32, sizeof b32);
  int32_t *c = batches(src, 70100, 5, 3);
  assert_true(c[0] >= 70000 && c[B * L] == c[0] + 1);
  free(c);
  expect_open_fails(src, 70050, L, "is 70050, not below vocab_size 70050");
  /* Read as uint16, the same bytes are other ids: halves 0x1170 + i and 0x0001. */
  snprintf(f->source, sizeof f->source, "tokens:%s", f->path);
  c = batches(f->source, 70100, 5, 3);
  for (int i = 0; i < 2 * B * L; i++) assert_true(c[i] == 1 || (c[i] >= 0x1170 && c[i] < 0x1200));
  free(c);
}

/* A safetensors data file with N rows whose ids encode (row, column). */
static void write_rows(const char *path, int rows, int seq, tsr_dtype dt, int64_t bad_label) {
  const int64_t shape[2] = {rows, seq};
  tsr_tensor *ids, *lab, *i64, *l64;
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, shape, &ids), TSR_OK);
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, shape, &lab), TSR_OK);
  int32_t *pi = tsr_tensor_data(ids), *pl = tsr_tensor_data(lab);
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < seq; i++) {
      pi[r * seq + i] = 10 * r + i;
      pl[r * seq + i] = i == seq - 1 ? -100 : 10 * r + i + 1;
    }
  const char *names[2] = {"input_ids", "labels"};
  assert_int_equal(tsr_tensor_cast(ids, dt, &i64), TSR_OK);
  assert_int_equal(tsr_tensor_cast(lab, dt, &l64), TSR_OK);
  const int64_t first[2] = {0, 0};
  if (bad_label) tsr_tensor_set(l64, first, (double)bad_label);
  const tsr_tensor *ts[2] = {i64, l64};
  assert_int_equal(tsr_safetensors_save(path, 2, names, ts, 0, NULL, NULL), TSR_OK);
  tsr_tensor_free(ids);
  tsr_tensor_free(lab);
  tsr_tensor_free(i64);
  tsr_tensor_free(l64);
}

static void test_safetensors_rows(void **state) {
  fixture *f = *state;
  const char *src = source_for(f, "safetensors", "rows.safetensors");
  const tsr_dtype dts[2] = {TSR_I32, TSR_I64};
  for (int k = 0; k < 2; k++) {
    write_rows(f->path, 5, L, dts[k], 0);
    /* Four rows a step from five: step 0 takes rows 0..3, step 1 rows 4, 0, 1, 2. */
    int32_t *a = batches(src, 100, 1, 3);
    const int want[3][B] = {{0, 1, 2, 3}, {4, 0, 1, 2}, {3, 4, 0, 1}};
    for (int s = 0; s < 3; s++)
      for (int b = 0; b < B; b++) {
        const int32_t *ids = a + (size_t)s * 2 * B * L + b * L, *lab = ids + B * L;
        assert_int_equal(ids[0], 10 * want[s][b]);
        assert_int_equal(ids[L - 1], 10 * want[s][b] + L - 1);
        assert_int_equal(lab[0], 10 * want[s][b] + 1);
        assert_int_equal(lab[L - 1], -100);
      }
    free(a);
  }
  /* The file fixes the order: the seed changes nothing. */
  int32_t *a = batches(src, 100, 1, 2), *b = batches(src, 100, 2, 2);
  assert_memory_equal(a, b, 2 * 2 * B * L * sizeof(int32_t));
  free(a);
  free(b);

  expect_open_fails(src, 100, L + 1, "has rows of 8 tokens but [data] seq_len is 9");
  expect_open_fails(src, 45, L, "input_ids[4, 5] is 45; expected 0 .. 44");
  write_rows(f->path, 5, L, TSR_I32, -5);
  expect_open_fails(src, 100, L, "labels[0, 0] is -5; expected 0 .. 99 or -100");
  write_rows(f->path, 5, L, TSR_F32, 0);
  expect_open_fails(src, 100, L, "'input_ids' is F32; expected I32");
  write_rows(f->path, 1, L, TSR_I64, 3000000000);
  expect_open_fails(src, 100, L, "does not fit in i32");

  /* Missing labels, mismatched rows, 1-D ids, a corrupt file. */
  const int64_t s2[2] = {3, L}, s1[1] = {L}, s4[2] = {4, L};
  tsr_tensor *t3, *t1, *t4;
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, s2, &t3), TSR_OK);
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 1, s1, &t1), TSR_OK);
  assert_int_equal(tsr_tensor_new(NULL, TSR_I32, 2, s4, &t4), TSR_OK);
  const char *n1[1] = {"input_ids"}, *n2[2] = {"input_ids", "labels"};
  const tsr_tensor *only[1] = {t3}, *mismatch[2] = {t3, t4}, *flat[2] = {t1, t1};
  assert_int_equal(tsr_safetensors_save(f->path, 1, n1, only, 0, NULL, NULL), TSR_OK);
  expect_open_fails(src, 100, L, "no tensor 'labels'");
  assert_int_equal(tsr_safetensors_save(f->path, 2, n2, mismatch, 0, NULL, NULL), TSR_OK);
  expect_open_fails(src, 100, L, "input_ids has 3 rows and labels 4");
  assert_int_equal(tsr_safetensors_save(f->path, 2, n2, flat, 0, NULL, NULL), TSR_OK);
  expect_open_fails(src, 100, L, "must be [N, seq_len]");
  io_write_file(f->path, "garbage", 7);
  expect_open_fails(src, 100, L, "truncated");
  assert_error_has("safetensors:");
  tsr_tensor_free(t1);
  tsr_tensor_free(t3);
  tsr_tensor_free(t4);
}

/* [data] mask = document: each row's segment ids and positions from the document index, an
 * independent recount from the document lengths, and the labels that would cross a document end
 * ignored. Token i of the file is id i, so a row's first id is where it starts. */
static void test_documents(void **state) {
  fixture *f = *state;
  enum { NTOK = 40, NDOC = 7 };
  static const int len[NDOC] = {3, 9, 1, 5, 8, 2, 12};
  unsigned char tok[2 * NTOK], idx[64 + 8 * (NDOC + 1)] = {0};
  for (int i = 0; i < NTOK; i++) tok[2 * i] = (unsigned char)i, tok[2 * i + 1] = 0;
  memcpy(idx, "TSRDOCS1", 8);
  idx[8] = 1, idx[12] = 2, idx[16] = NDOC, idx[24] = NTOK;
  memset(idx + 40, 0xff, 4); /* eos -1 */
  int doc_of[NTOK], start_of[NTOK];
  for (int d = 0, at = 0; d < NDOC; at += len[d], d++) {
    for (int i = at; i < at + len[d]; i++) doc_of[i] = d, start_of[i] = at;
    idx[64 + 8 * (d + 1)] = (unsigned char)(at + len[d]);
  }
  const char *src = source_for(f, "tokens", "docs.bin");
  io_write_file(f->path, tok, sizeof tok);
  char index[160];
  snprintf(index, sizeof index, "%s.idx", f->path);
  io_write_file(index, idx, sizeof idx);
  tsr_data_t *d;
  assert_int_equal(tsr_data_open(src, 64, B, L, 3, &d), TSR_OK);
  int32_t ids[B * L], lab[B * L], seg[B * L], pos[B * L];
  assert_int_equal(tsr_data_documents(d, seg, pos), TSR_EINVAL); /* no index read yet */
  assert_int_equal(tsr_data_use_documents(d, index), TSR_OK);
  assert_int_equal(tsr_data_documents(d, seg, pos), TSR_EINVAL); /* no batch yet */
  int crossings = 0;
  for (int step = 0; step < 25; step++) {
    assert_int_equal(tsr_data_next(d, ids, lab), TSR_OK);
    assert_int_equal(tsr_data_documents(d, seg, pos), TSR_OK);
    for (int b = 0; b < B; b++) {
      int p0 = ids[b * L];
      for (int i = 0; i < L; i++) {
        int t = p0 + i, k = b * L + i;
        assert_int_equal(ids[k], t);
        assert_int_equal(seg[k], doc_of[t] - doc_of[p0]);
        assert_int_equal(pos[k], t - (start_of[t] > p0 ? start_of[t] : p0));
        bool ends = t + 1 < NTOK && doc_of[t + 1] != doc_of[t];
        assert_int_equal(lab[k], ends ? -100 : t + 1);
        crossings += ends;
      }
    }
  }
  assert_true(crossings > 10);
  tsr_data_close(d);
  /* the wrong width, another kind of source, a missing index */
  /* as u32 the same bytes are 20 ids up to 40 * 65536 */
  assert_int_equal(tsr_data_open(source_for(f, "tokens32", "docs.bin"), 1 << 24, B, 4, 3, &d),
                   TSR_OK);
  assert_int_equal(tsr_data_use_documents(d, index), TSR_EINVAL);
  assert_error_has("2-byte tokens but the source");
  tsr_data_close(d);
  assert_int_equal(tsr_data_open("synthetic", 64, B, L, 3, &d), TSR_OK);
  assert_int_equal(tsr_data_use_documents(d, index), TSR_EINVAL);
  assert_error_has("synthetic has no documents");
  tsr_data_close(d);
  assert_int_equal(tsr_data_open(source_for(f, "tokens", "docs.bin"), 64, B, L, 3, &d), TSR_OK);
  assert_int_equal(tsr_data_use_documents(d, "/nonexistent/x.idx"), TSR_EIO);
  assert_error_has("x.idx: cannot open");
  tsr_data_close(d);
}

static void test_bad_sources(void **state) {
  expect_open_fails("random", 100, L, "unknown data source 'random'");
  expect_open_fails("text:", 300, L, "no path");
  expect_open_fails("Synthetic", 100, L, "expected synthetic, text:PATH");
  expect_open_fails("synthetic", 0, L, "must be at least 1");
  expect_open_fails("synthetic", 100, 0, "must be at least 1");
  tsr_data_t *d = (tsr_data_t *)1;
  assert_int_equal(tsr_data_open("synthetic", 100, 0, L, 1, &d), TSR_EINVAL);
  assert_null(d);
  tsr_data_close(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_synthetic),
      cmocka_unit_test_setup_teardown(test_text, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tokens, setup, teardown),
      cmocka_unit_test_setup_teardown(test_safetensors_rows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_documents, setup, teardown),
      cmocka_unit_test(test_bad_sources),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
