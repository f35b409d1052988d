/* The tokenizer against golden ids from an independent implementation (the JavaScript port of
 * Hugging Face tokenizers, tests/data/tokenizer/make_golden.mjs) for both families, then the
 * components the golden corpus does not reach, the Rust library's semantics where the two ports
 * differ, and every load error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cJSON.h>
#include <cmocka.h>

#include "tessera/tokenizer.h"
#include "test_io_util.h"

#ifndef TSR_TEST_SOURCE_DIR
#error "TSR_TEST_SOURCE_DIR must point at the source tree (tests/CMakeLists.txt sets it)"
#endif
#define DATA TSR_TEST_SOURCE_DIR "/tests/data/tokenizer/"

#define assert_error_has(text)                                                                     \
  do {                                                                                             \
    if (!strstr(tsr_last_error(), (text)))                                                         \
      fail_msg("error \"%s\" lacks \"%s\"", tsr_last_error(), (text));                             \
  } while (0)

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = malloc((size_t)n + 1);
  assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
  p[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return p;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
  fprintf(stderr, "  %s (%zu):", what, n);
  for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
  fputc('\n', stderr);
}

/* Compares ids with a JSON array; prints both on a difference. */
static bool same_ids(const int32_t *ids, size_t n, const cJSON *want, const char *what,
                     const char *text) {
  bool same = (size_t)cJSON_GetArraySize(want) == n;
  for (size_t i = 0; same && i < n; i++)
    same = (int32_t)cJSON_GetArrayItem(want, (int)i)->valuedouble == ids[i];
  if (!same) {
    fprintf(stderr, "%s differs for \"%s\"\n", what, text);
    print_ids("got", ids, n);
    int32_t w[4096];
    size_t k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, want) if (k < 4096) w[k++] = (int32_t)v->valuedouble;
    print_ids("want", w, k);
  }
  return same;
}

/* Every document of NAME.golden.jsonl: ids with and without special tokens, and the decoding
 * (no clean-up, special tokens kept), against the reference; for byte-level files also
 * decode(encode(text)) == text. */
static void golden(const char *name, bool round_trip) {
  char path[512];
  snprintf(path, sizeof path, DATA "%s.json", name);
  tsr_tokenizer_t *tok;
  assert_int_equal(tsr_tokenizer_load(path, &tok), TSR_OK);
  tsr_tok_encoder_t *enc;
  assert_int_equal(tsr_tok_encoder_new(tok, &enc), TSR_OK);
  snprintf(path, sizeof path, DATA "%s.golden.jsonl", name);
  char *all = slurp(path, NULL);
  int docs = 0, bad = 0;
  for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
    cJSON *g = cJSON_Parse(line);
    assert_non_null(g);
    const char *text = cJSON_GetObjectItem(g, "text")->valuestring;
    const char *want_text = cJSON_GetObjectItem(g, "decoded")->valuestring;
    const int32_t *ids;
    size_t n;
    bool ok = true;
    assert_int_equal(tsr_tok_encode(enc, text, strlen(text), TSR_TOK_ADD_SPECIAL, &ids, &n),
                     TSR_OK);
    ok &= same_ids(ids, n, cJSON_GetObjectItem(g, "ids"), "ids", text);
    assert_int_equal(tsr_tok_encode(enc, text, strlen(text), 0, &ids, &n), TSR_OK);
    ok &= same_ids(ids, n, cJSON_GetObjectItem(g, "ids_plain"), "ids_plain", text);
    char *back;
    assert_int_equal(tsr_tokenizer_decode(tok, ids, n, 0, &back, NULL), TSR_OK);
    if (strcmp(back, want_text)) {
      fprintf(stderr, "decode differs for \"%s\":\n  got  \"%s\"\n  want \"%s\"\n", text, back,
              want_text);
      ok = false;
    }
    if (round_trip && strcmp(back, text)) {
      fprintf(stderr, "no round trip: \"%s\" -> \"%s\"\n", text, back);
      ok = false;
    }
    free(back);
    cJSON_Delete(g);
    docs++;
    bad += !ok;
  }
  print_message("%s: %d of %d documents equal the reference\n", name, docs - bad, docs);
  assert_true(docs >= 30);
  assert_int_equal(bad, 0);
  free(all);
  tsr_tok_encoder_free(enc);
  tsr_tokenizer_free(tok);
}

static void test_golden_bytelevel_llama3(void **state) {
  golden("bytelevel-llama3", true);
}
static void test_golden_bytelevel_gpt2(void **state) {
  golden("bytelevel-gpt2", false); /* <mask> swallows the spaces before it */
}
static void test_golden_spm_llama2(void **state) {
  golden("spm-llama2", false); /* Prepend puts a ▁ after every added token */
}
static void test_golden_spm_metaspace(void **state) {
  golden("spm-metaspace", false);
}

/* ---- small hand-made tokenizers ---- */

typedef struct fixture {
  char dir[64];
  char path[128];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  io_tmpdir(f->dir, sizeof f->dir);
  snprintf(f->path, sizeof f->path, "%s/tokenizer.json", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  io_rmtree(f->dir);
  free(f);
  return 0;
}

/* A tokenizer whose model maps whole pieces to ids (ignore_merges, no merges), so the ids show
 * where the pre-tokenizers cut. `vocab` and the components are JSON fragments. */
static tsr_status load_json(fixture *f, const char *json, tsr_tokenizer_t **tok) {
  io_write_file(f->path, json, strlen(json));
  return tsr_tokenizer_load(f->path, tok);
}

static tsr_tokenizer_t *pieces_tok(fixture *f, const char *vocab, const char *added,
                                   const char *pre, const char *decoder) {
  char json[4096];
  snprintf(json, sizeof json,
           "{\"added_tokens\": [%s], \"normalizer\": null, \"pre_tokenizer\": %s,"
           " \"post_processor\": null, \"decoder\": %s, \"model\": {\"type\": \"BPE\","
           " \"ignore_merges\": true, \"vocab\": {%s}, \"merges\": []}}",
           added, pre, decoder, vocab);
  tsr_tokenizer_t *tok = NULL;
  if (load_json(f, json, &tok) != TSR_OK) fail_msg("%s", tsr_last_error());
  return tok;
}

static void expect_ids(tsr_tokenizer_t *tok, const char *text, unsigned flags, int n,
                       const int32_t *want) {
  tsr_tok_encoder_t *enc;
  assert_int_equal(tsr_tok_encoder_new(tok, &enc), TSR_OK);
  const int32_t *ids;
  size_t got;
  assert_int_equal(tsr_tok_encode(enc, text, strlen(text), flags, &ids, &got), TSR_OK);
  if (got != (size_t)n || memcmp(ids, want, (size_t)n * sizeof *ids)) {
    fprintf(stderr, "for \"%s\":\n", text);
    print_ids("got", ids, got);
    print_ids("want", want, (size_t)n);
    fail();
  }
  tsr_tok_encoder_free(enc);
}

#define IDS(...)                                                                                   \
  (int)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t)), (int32_t[]) {                         \
    __VA_ARGS__                                                                                    \
  }

/* Split's five behaviours on "a,b,,c" split at ",", as the Rust library defines them. */
static void test_split_behaviors(void **state) {
  fixture *f = *state;
  static const char vocab[] = "\"a\": 0, \"b\": 1, \"c\": 2, \",\": 3, \",,\": 4, \"a,\": 5,"
                              " \"b,\": 6, \",b\": 7, \",c\": 8";
  static const struct {
    const char *behavior;
    int n;
    int32_t ids[6];
  } cases[] = {
      {"Isolated", 6, {0, 3, 1, 3, 3, 2}},     {"Removed", 3, {0, 1, 2}},
      {"MergedWithPrevious", 4, {5, 6, 3, 2}}, {"MergedWithNext", 4, {0, 7, 3, 8}},
      {"Contiguous", 5, {0, 3, 1, 4, 2}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char pre[256];
    snprintf(pre, sizeof pre,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \",\"}, \"behavior\": \"%s\","
             " \"invert\": false}",
             cases[i].behavior);
    tsr_tokenizer_t *tok = pieces_tok(f, vocab, "", pre, "null");
    expect_ids(tok, "a,b,,c", 0, cases[i].n, cases[i].ids);
    tsr_tokenizer_free(tok);
  }
}

/* Metaspace with split: every ▁ starts a piece; prepend_scheme first only at the start. */
static void test_metaspace_split(void **state) {
  fixture *f = *state;
  tsr_tokenizer_t *tok = pieces_tok(
      f, "\"\\u2581Hey\": 0, \"\\u2581\": 1, \"\\u2581you\": 2, \"Hey\": 3, \"<s>\": 4", "",
      "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\"}",
      "null");
  expect_ids(tok, "Hey  you", 0, IDS(0, 1, 2));
  expect_ids(tok, " you", 0, IDS(2));
  tsr_tokenizer_free(tok);
  tok = pieces_tok(f, "\"\\u2581Hey\": 0, \"\\u2581\": 1, \"\\u2581you\": 2, \"Hey\": 3",
                   "{\"id\": 4, \"content\": \"<s>\", \"special\": true}",
                   "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
                   " \"prepend_scheme\": \"first\", \"split\": true}",
                   "null");
  /* "first": the section after <s> does not start the text, so gets no ▁ */
  expect_ids(tok, "Hey<s>Hey you", 0, IDS(0, 4, 3, 2));
  tsr_tokenizer_free(tok);
}

/* \s means White_Space, U+0085 included, as in Oniguruma (PCRE2's own \s lacks it). */
static void test_regex_white_space(void **state) {
  fixture *f = *state;
  tsr_tokenizer_t *tok = pieces_tok(
      f, "\"a\": 0, \"b\": 1, \"a\\u0085b\": 2, \"a\\u00a0b\": 3, \"a\\ufeffb\": 4", "",
      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": \"Removed\"}",
      "null");
  expect_ids(tok,
             "a\xc2\x85"
             "b",
             0, IDS(0, 1));
  expect_ids(tok,
             "a\xc2\xa0"
             "b",
             0, IDS(0, 1));
  expect_ids(tok,
             "a\xef\xbb\xbf"
             "b",
             0, IDS(4)); /* U+FEFF is not white space */
  tsr_tokenizer_free(tok);
}

/* single_word, lstrip, rstrip, and special tokens taken as text on request. */
static void test_added_token_flags(void **state) {
  fixture *f = *state;
  tsr_tokenizer_t *tok = pieces_tok(
      f,
      "\"con\": 0, \"cat\": 1, \" \": 2, \".\": 3, \"<x>\": 4, \"<\": 5, \"x\": 6, \">\": 7,"
      " \"concat\": 8",
      "{\"id\": 10, \"content\": \"cat\", \"single_word\": true, \"special\": false},"
      "{\"id\": 11, \"content\": \"<x>\", \"rstrip\": true, \"lstrip\": true, \"special\": true}",
      "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+|.\"}, \"behavior\": "
      "\"Isolated\"}",
      "null");
  /* "cat" inside "concat" is not a single word */
  expect_ids(tok, "cat concat cat.", 0, IDS(10, 2, 8, 2, 10, 3));
  expect_ids(tok, "cat  <x>  cat", 0, IDS(10, 11, 10));
  expect_ids(tok, "cat <x>", TSR_TOK_SPLIT_SPECIAL, IDS(10, 2, 5, 6, 7));
  tsr_tokenizer_free(tok);
}

/* Rust's Metaspace decoder drops every ▁ of the first token (the JavaScript port only one). */
static void test_metaspace_decoder(void **state) {
  fixture *f = *state;
  tsr_tokenizer_t *tok =
      pieces_tok(f, "\"\\u2581\\u2581Hey\": 0, \"\\u2581you\": 1", "", "null",
                 "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\":"
                 " \"always\", \"split\": true}");
  char *text;
  assert_int_equal(tsr_tokenizer_decode(tok, (int32_t[]){0, 1, 0}, 3, 0, &text, NULL), TSR_OK);
  assert_string_equal(text, "Hey you  Hey");
  free(text);
  tsr_tokenizer_free(tok);
}

/* Invalid UTF-8 out of the byte decoders: Rust's rules (ByteFallback: one U+FFFD per byte of a
 * run that is not UTF-8; ByteLevel: from_utf8_lossy, one per maximal invalid subpart). */
static void test_decode_invalid_bytes(void **state) {
  tsr_tokenizer_t *spm, *bl;
  assert_int_equal(tsr_tokenizer_load(DATA "spm-llama2.json", &spm), TSR_OK);
  assert_int_equal(tsr_tokenizer_load(DATA "bytelevel-gpt2.json", &bl), TSR_OK);
  int32_t e6 = tsr_tokenizer_token_to_id(spm, "<0xE6>"),
          x97 = tsr_tokenizer_token_to_id(spm, "<0x97>");
  char *text;
  assert_int_equal(tsr_tokenizer_decode(spm, (int32_t[]){e6, x97}, 2, 0, &text, NULL), TSR_OK);
  assert_string_equal(text, "\xEF\xBF\xBD\xEF\xBF\xBD");
  free(text);
  /* GPT-2's map sends byte 0xE6 to U+00E6 and 0x97 to U+0139 */
  int32_t a = tsr_tokenizer_token_to_id(bl, "\xC3\xA6"),
          b = tsr_tokenizer_token_to_id(bl, "\xC4\xB9");
  int32_t h = tsr_tokenizer_token_to_id(bl, "h");
  assert_true(a >= 0 && b >= 0 && h >= 0);
  assert_int_equal(tsr_tokenizer_decode(bl, (int32_t[]){a, b, h}, 3, 0, &text, NULL), TSR_OK);
  assert_string_equal(text, "\xEF\xBF\xBDh");
  free(text);
  /* an id no token has */
  assert_int_equal(tsr_tokenizer_decode(bl, (int32_t[]){h, 99999}, 2, 0, &text, NULL), TSR_EINVAL);
  assert_error_has("id 99999 (position 1)");
  assert_null(text);
  tsr_tokenizer_free(spm);
  tsr_tokenizer_free(bl);
}

static void test_utf8(void **state) {
  assert_int_equal(tsr_utf8_valid_prefix("abc", 3), 3);
  assert_int_equal(tsr_utf8_valid_prefix("\xF0\x9F\x98\x80", 4), 4);
  assert_int_equal(tsr_utf8_valid_prefix("\xC0\x80", 2), 0);             /* overlong */
  assert_int_equal(tsr_utf8_valid_prefix("a\xED\xA0\x80", 4), 1);        /* surrogate */
  assert_int_equal(tsr_utf8_valid_prefix("ab\xF4\x90\x80\x80", 6), 2);   /* > U+10FFFF */
  assert_int_equal(tsr_utf8_valid_prefix("abcdefghij\xE6\x97", 12), 10); /* cut short */
  tsr_tokenizer_t *tok;
  tsr_tok_encoder_t *enc;
  assert_int_equal(tsr_tokenizer_load(DATA "bytelevel-llama3.json", &tok), TSR_OK);
  assert_int_equal(tsr_tok_encoder_new(tok, &enc), TSR_OK);
  const int32_t *ids;
  size_t n;
  assert_int_equal(tsr_tok_encode(enc, "ok\xFFno", 5, 0, &ids, &n), TSR_EINVAL);
  assert_error_has("not valid UTF-8 at byte 2");
  /* NUL is a character like any other */
  assert_int_equal(tsr_tok_encode(enc, "a\0b", 3, 0, &ids, &n), TSR_OK);
  char *back;
  size_t len;
  assert_int_equal(tsr_tokenizer_decode(tok, ids, n, 0, &back, &len), TSR_OK);
  assert_int_equal(len, 3);
  assert_memory_equal(back, "a\0b", 3);
  free(back);
  tsr_tok_encoder_free(enc);
  tsr_tokenizer_free(tok);
}

/* The hand-written matchers of Llama 3's and GPT-2's regexes (core/tok_fastsplit.c) against
 * PCRE2 on random text: the same tokenizer with its pattern spelled so that no matcher knows it
 * ("(?:...)") must give the same ids. The pieces mix the cases the matchers work out by hand
 * (contractions in both cases, digit runs, white-space runs ending in letters, punctuation or
 * line breaks) with the non-ASCII characters that make them hand over to PCRE2. */
static void differential(fixture *f, const char *name) {
  char path[512];
  snprintf(path, sizeof path, DATA "%s.json", name);
  char *text = slurp(path, NULL);
  cJSON *root = cJSON_Parse(text);
  free(text);
  cJSON *pre = cJSON_GetObjectItem(root, "pre_tokenizer");
  char wrapped[512];
  if (!strcmp(cJSON_GetObjectItem(pre, "type")->valuestring, "Sequence")) {
    cJSON *pat = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0), "pattern");
    snprintf(wrapped, sizeof wrapped, "(?:%s)", cJSON_GetObjectItem(pat, "Regex")->valuestring);
    cJSON_ReplaceItemInObject(pat, "Regex", cJSON_CreateString(wrapped));
  } else {
    static const char gpt2[] = "(?:'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                               "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+)";
    char json[1024];
    snprintf(json, sizeof json,
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
             "{\"Regex\": \"%s\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false, \"use_regex\": false}]}",
             gpt2);
    cJSON_ReplaceItemInObject(root, "pre_tokenizer", cJSON_Parse(json));
  }
  char *json = cJSON_Print(root);
  cJSON_Delete(root);
  io_write_file(f->path, json, strlen(json));
  free(json);
  tsr_tokenizer_t *fast, *slow;
  tsr_tok_encoder_t *ef, *es;
  assert_int_equal(tsr_tokenizer_load(path, &fast), TSR_OK);
  assert_int_equal(tsr_tokenizer_load(f->path, &slow), TSR_OK);
  assert_int_equal(tsr_tok_encoder_new(fast, &ef), TSR_OK);
  assert_int_equal(tsr_tok_encoder_new(slow, &es), TSR_OK);
  static const char *const pieces[] = {"a",
                                       "Zq",
                                       "hello",
                                       "'",
                                       "s",
                                       "S",
                                       "'re",
                                       "'LL",
                                       "'d",
                                       "'ve",
                                       "'M",
                                       "'x",
                                       "0",
                                       "7",
                                       "12345",
                                       " ",
                                       "  ",
                                       "   ",
                                       "\t",
                                       "\n",
                                       "\r\n",
                                       "\r",
                                       "\n\n",
                                       ".",
                                       ",",
                                       "!?",
                                       "(",
                                       "-",
                                       "_",
                                       "\v",
                                       "\f",
                                       "\x1f",
                                       "\x01",
                                       "\xc3\xa9" /* é */,
                                       "\xc5\xbf" /* ſ */,
                                       "\xc2\xb2" /* ² */,
                                       "\xd9\xa3" /* Arabic 3 */,
                                       "\xc2\xa0" /* NBSP */,
                                       "\xc2\x85" /* NEL */,
                                       "\xe2\x80\xa8" /* U+2028 */,
                                       "\xe3\x80\x80" /* U+3000 */,
                                       "\xe4\xb8\xad" /* 中 */,
                                       "\xf0\x9f\x98\x80" /* emoji */,
                                       "\xe2\x84\xaa" /* Kelvin sign */,
                                       "\xef\xbb\xbf" /* BOM */};
  const int npieces = (int)(sizeof pieces / sizeof pieces[0]);
  uint64_t rng = 12345;
  char buf[1024];
  for (int t = 0; t < 5000; t++) {
    size_t len = 0;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    int count = 1 + (int)(rng >> 59);
    for (int k = 0; k < count; k++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const char *p = pieces[(rng >> 33) % (uint64_t)npieces];
      memcpy(buf + len, p, strlen(p));
      len += strlen(p);
    }
    /* the pieces first: ids alone would hide a boundary no merge crosses */
    const char *pa, *pb;
    const size_t *ea, *eb;
    size_t ka, kb;
    assert_int_equal(tsr_tok_pieces(ef, buf, len, 0, &pa, &ea, &ka), TSR_OK);
    assert_int_equal(tsr_tok_pieces(es, buf, len, 0, &pb, &eb, &kb), TSR_OK);
    if (ka != kb || memcmp(ea, eb, ka * sizeof *ea) || (ka && memcmp(pa, pb, ea[ka - 1]))) {
      fprintf(stderr, "%s: pieces differ for \"%.*s\"\n", name, (int)len, buf);
      for (size_t k = 0; k < ka; k++)
        fprintf(stderr, "  hand-written [%.*s]\n", (int)(ea[k] - (k ? ea[k - 1] : 0)),
                pa + (k ? ea[k - 1] : 0));
      for (size_t k = 0; k < kb; k++)
        fprintf(stderr, "  PCRE2        [%.*s]\n", (int)(eb[k] - (k ? eb[k - 1] : 0)),
                pb + (k ? eb[k - 1] : 0));
      fail();
    }
    const int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(tsr_tok_encode(ef, buf, len, 0, &a, &na), TSR_OK);
    int32_t copy[1024];
    memcpy(copy, a, na * sizeof *a);
    assert_int_equal(tsr_tok_encode(es, buf, len, 0, &b, &nb), TSR_OK);
    if (na != nb || memcmp(copy, b, na * sizeof *b)) {
      fprintf(stderr, "%s: \"%.*s\"\n", name, (int)len, buf);
      print_ids("hand-written", copy, na);
      print_ids("PCRE2", b, nb);
      fail();
    }
  }
  tsr_tok_encoder_free(ef);
  tsr_tok_encoder_free(es);
  tsr_tokenizer_free(fast);
  tsr_tokenizer_free(slow);
}

static void test_fast_split_llama3(void **state) {
  differential(*state, "bytelevel-llama3");
}
static void test_fast_split_gpt2(void **state) {
  differential(*state, "bytelevel-gpt2");
}

/* What a trainer needs from the file: vocabulary size, BOS template, EOS, special flags. */
static void test_metadata(void **state) {
  fixture *f = *state;
  tsr_tokenizer_t *tok;
  assert_int_equal(tsr_tokenizer_load(DATA "bytelevel-llama3.json", &tok), TSR_OK);
  int32_t bos = tsr_tokenizer_token_to_id(tok, "<|begin_of_text|>");
  int32_t eot = tsr_tokenizer_token_to_id(tok, "<|eot_id|>");
  assert_int_equal(tsr_tokenizer_vocab_size(tok), eot + 1);
  const int32_t *head, *tail;
  int nhead, ntail;
  tsr_tokenizer_template(tok, &head, &nhead, &tail, &ntail);
  assert_int_equal(nhead, 1);
  assert_int_equal(head[0], bos);
  assert_int_equal(ntail, 0);
  const char *src;
  assert_int_equal(tsr_tokenizer_eos(tok, &src), tsr_tokenizer_token_to_id(tok, "<|end_of_text|>"));
  assert_non_null(strstr(src, "<|end_of_text|>"));
  assert_true(tsr_tokenizer_is_special(tok, bos));
  assert_false(tsr_tokenizer_is_special(tok, 0));
  assert_string_equal(tsr_tokenizer_id_to_token(tok, bos), "<|begin_of_text|>");
  assert_null(tsr_tokenizer_id_to_token(tok, 1 << 30));
  tsr_tokenizer_free(tok);
  /* tokenizer_config.json beside the file names the EOS */
  size_t len;
  char *json = slurp(DATA "bytelevel-llama3.json", &len);
  io_write_file(f->path, json, len);
  free(json);
  char cfg[160];
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", f->dir);
  const char cfg_json[] = "{\"eos_token\": {\"content\": \"<|eot_id|>\"}}";
  io_write_file(cfg, cfg_json, strlen(cfg_json));
  assert_int_equal(tsr_tokenizer_load(f->path, &tok), TSR_OK);
  assert_int_equal(tsr_tokenizer_eos(tok, &src), eot);
  assert_string_equal(src, "tokenizer_config.json eos_token");
  tsr_tokenizer_free(tok);
}

/* Each refusal names the file, the key and what would load. */
static void test_load_errors(void **state) {
  fixture *f = *state;
  static const char model[] =
      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
      "[\"a b\"]}";
  static const struct {
    const char *json, *want;
  } cases[] = {
      {"{\"model\": ", "line 1: not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
       "model.type: 'Unigram' is not supported"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}}",
       "model.merges[0]: \"a\" + \"z\": \"z\" is not in model.vocab"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}",
       "model.merges[0]: \"a\" is not two tokens"},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
       "model.vocab: id 0 is given to two tokens"},
      {"{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}",
       "model.dropout: BPE dropout makes tokenization random"},
      {"{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, "
       "\"merges\": []}}",
       "model.unk_token: \"<unk>\" is not in model.vocab"},
      {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
       "\"prepend\": \"x\"}, {\"type\": \"NFC\"}]}, %s}",
       "normalizer.normalizers[1]: type 'NFC' is not supported"},
      {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
       "\"ByteLevel\"}, {\"type\": \"Digits\"}]}, %s}",
       "pre_tokenizer.pretokenizers[1]: comes after the ByteLevel pre-tokenizer"},
      {"{\"pre_tokenizer\": {\"type\": \"Digits\"}, %s}",
       "pre_tokenizer: type 'Digits' is not supported"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
       "\"behavior\": \"Isolated\"}, %s}",
       "pre_tokenizer.pattern.Regex: the regex does not compile"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[^\\\\W]\"}, "
       "\"behavior\": \"Isolated\"}, %s}",
       "\\W inside a character class"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
       "\"behavior\": \"Sideways\"}, %s}",
       "'behavior' \"Sideways\" is not one of"},
      {"{\"decoder\": {\"type\": \"WordPiece\"}, %s}",
       "decoder: type 'WordPiece' is not supported"},
      {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
       "{\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}, %s}",
       "post_processor.single[0]: \"<s>\" has no ids in post_processor.special_tokens"},
      {"{\"added_tokens\": [{\"id\": 2, \"content\": \"zz\"}], %s}",
       "added_tokens[0]: id 2 is \"zz\" here but \"ab\" in model.vocab"},
      {"{\"added_tokens\": [{\"content\": \"zz\"}], %s}", "added_tokens[0]: 'id' is missing"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[2048];
    snprintf(json, sizeof json, cases[i].json, model);
    tsr_tokenizer_t *tok = NULL;
    assert_int_equal(load_json(f, json, &tok), TSR_EINVAL);
    assert_null(tok);
    assert_error_has(f->path);
    assert_error_has(cases[i].want);
  }
  tsr_tokenizer_t *tok = NULL;
  assert_int_equal(tsr_tokenizer_load("/nonexistent/tokenizer.json", &tok), TSR_EIO);
  assert_error_has("/nonexistent/tokenizer.json: cannot open");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_bytelevel_llama3),
      cmocka_unit_test(test_golden_bytelevel_gpt2),
      cmocka_unit_test(test_golden_spm_llama2),
      cmocka_unit_test(test_golden_spm_metaspace),
      cmocka_unit_test_setup_teardown(test_split_behaviors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_metaspace_split, setup, teardown),
      cmocka_unit_test_setup_teardown(test_regex_white_space, setup, teardown),
      cmocka_unit_test_setup_teardown(test_added_token_flags, setup, teardown),
      cmocka_unit_test_setup_teardown(test_metaspace_decoder, setup, teardown),
      cmocka_unit_test(test_decode_invalid_bytes),
      cmocka_unit_test_setup_teardown(test_fast_split_llama3, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fast_split_gpt2, setup, teardown),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test_setup_teardown(test_metadata, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_errors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
