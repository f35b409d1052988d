/* Decoding, as the Rust library's Tokenizer::decode: ids to token strings (special ones left
 * out on request), then the decoder chain, each decoder a function from a list of strings to a
 * list of strings, then the list joined. Without a decoder the tokens are joined with spaces. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* Strings s_i = buf[off[i], off[i+1]). */
typedef struct strlist {
  tok_buf buf;
  size_t *off;
  size_t n, cap;
} strlist;

static bool sl_reset(strlist *l) {
  l->buf.n = 0;
  l->n = 0;
  if (!l->cap) {
    if (!(l->off = malloc(64 * sizeof *l->off))) return false;
    l->cap = 63;
  }
  l->off[0] = 0;
  return true;
}

/* Ends the string being written at buf.n. */
static bool sl_close(strlist *l) {
  if (l->n == l->cap) {
    size_t *p = realloc(l->off, (2 * l->cap + 1) * sizeof *p);
    if (!p) return false;
    l->off = p;
    l->cap *= 2;
  }
  l->off[++l->n] = l->buf.n;
  return true;
}

static bool sl_push(strlist *l, const char *s, size_t n) {
  return tok_buf_put(&l->buf, s, n) && sl_close(l);
}

static const char *sl_str(const strlist *l, size_t i, size_t *n) {
  *n = l->off[i + 1] - l->off[i];
  return l->buf.p + l->off[i];
}

static void sl_free(strlist *l) {
  tok_buf_free(&l->buf);
  free(l->off);
}

static bool dec_bytelevel(const tsr_tokenizer_t *tok, const strlist *in, strlist *out) {
  int16_t rev[512];
  for (int i = 0; i < 512; i++) rev[i] = -1;
  for (int b = 0; b < 256; b++) rev[tok->level_char[b]] = (int16_t)b;
  tok_buf bytes = {0};
  bool ok = true;
  for (size_t i = 0; ok && i < in->n; i++) {
    size_t n;
    const char *s = sl_str(in, i, &n);
    /* a token with a character outside the map (an added token, say) is taken as it is */
    bool mapped = true;
    for (size_t j = 0; mapped && j < n; j += tok_utf8_len((unsigned char)s[j])) {
      uint32_t cp = tok_utf8_decode(s + j);
      mapped = cp < 512 && rev[cp] >= 0;
    }
    if (!mapped) {
      ok = tok_buf_put(&bytes, s, n);
      continue;
    }
    for (size_t j = 0; ok && j < n; j += tok_utf8_len((unsigned char)s[j])) {
      char b = (char)rev[tok_utf8_decode(s + j)];
      ok = tok_buf_put(&bytes, &b, 1);
    }
  }
  ok = ok && tok_buf_put_lossy(&out->buf, bytes.p, bytes.n) && sl_close(out);
  tok_buf_free(&bytes);
  return ok;
}

static int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* A run of <0xXX> tokens becomes its bytes when they are valid UTF-8, else one U+FFFD per
 * byte, as in Rust. */
static bool flush_bytes(tok_buf *run, strlist *out) {
  bool ok = true;
  if (!run->n) return true;
  if (tsr_utf8_valid_prefix(run->p, run->n) == run->n)
    ok = sl_push(out, run->p, run->n);
  else
    for (size_t i = 0; ok && i < run->n; i++) ok = sl_push(out, "\xEF\xBF\xBD", 3);
  run->n = 0;
  return ok;
}

static bool dec_bytefallback(const strlist *in, strlist *out) {
  tok_buf run = {0};
  bool ok = true;
  for (size_t i = 0; ok && i < in->n; i++) {
    size_t n;
    const char *s = sl_str(in, i, &n);
    int hi = n == 6 ? hex_digit(s[3]) : -1, lo = n == 6 ? hex_digit(s[4]) : -1;
    if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hi >= 0 && lo >= 0) {
      char b = (char)(hi << 4 | lo);
      ok = tok_buf_put(&run, &b, 1);
      continue;
    }
    ok = flush_bytes(&run, out) && sl_push(out, s, n);
  }
  ok = ok && flush_bytes(&run, out);
  tok_buf_free(&run);
  return ok;
}

static bool dec_strip(const tok_decoder *d, const strlist *in, strlist *out) {
  bool ok = true;
  for (size_t i = 0; ok && i < in->n; i++) {
    size_t n;
    const char *s = sl_str(in, i, &n);
    size_t lo = 0, hi = n;
    for (int k = 0; k < d->strip_start && lo < hi && tok_utf8_decode(s + lo) == d->strip_cp; k++)
      lo += tok_utf8_len((unsigned char)s[lo]);
    for (int k = 0; k < d->strip_stop && hi > lo; k++) {
      size_t c = hi - 1;
      while (c > lo && ((unsigned char)s[c] & 0xC0) == 0x80) c--;
      if (tok_utf8_decode(s + c) != d->strip_cp) break;
      hi = c;
    }
    ok = sl_push(out, s + lo, hi - lo);
  }
  return ok;
}

static bool dec_one(const tsr_tokenizer_t *tok, const tok_decoder *d, const strlist *in,
                    strlist *out, pcre2_match_data *md) {
  bool ok = true;
  switch (d->kind) {
    case DEC_BYTELEVEL:
      return dec_bytelevel(tok, in, out);
    case DEC_BYTEFALLBACK:
      return dec_bytefallback(in, out);
    case DEC_STRIP:
      return dec_strip(d, in, out);
    case DEC_FUSE:
      return tok_buf_put(&out->buf, in->buf.p, in->buf.n) && sl_close(out);
    case DEC_REPLACE:
      for (size_t i = 0; ok && i < in->n; i++) {
        size_t n;
        const char *s = sl_str(in, i, &n);
        ok = tok_replace_all(s, n, d->pat, d->pat_len, d->re, d->text, d->text_len, &out->buf, md,
                             NULL) &&
             sl_close(out);
      }
      return ok;
    case DEC_METASPACE:
      /* Rust: every replacement character of the first token goes (unless the scheme never
       * prepends); elsewhere each becomes a space. */
      for (size_t i = 0; ok && i < in->n; i++) {
        size_t n;
        const char *s = sl_str(in, i, &n);
        bool drop = i == 0 && d->prepend != PREPEND_NEVER;
        ok = tok_replace_all(s, n, d->text, d->text_len, NULL, " ", drop ? 0 : 1, &out->buf, NULL,
                             NULL) &&
             sl_close(out);
      }
      return ok;
  }
  return false;
}

tsr_status tsr_tokenizer_decode(const tsr_tokenizer_t *tok, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len) {
  *text = NULL;
  if (len) *len = 0;
  strlist a = {0}, b = {0};
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  tsr_status s = TSR_OK;
  bool any = false;
  if (!md || !sl_reset(&a) || !sl_reset(&b)) goto oom;
  for (size_t i = 0; i < n; i++) {
    const char *t = tsr_tokenizer_id_to_token(tok, ids[i]);
    if (!t) {
      s = TSR_ERROR(TSR_EINVAL,
                    "decode: id %d (position %zu) is not a token of %s (ids 0 .. %d, with gaps "
                    "where no token has the id)",
                    (int)ids[i], i, tok->path, tok->nids - 1);
      goto cleanup;
    }
    if ((flags & TSR_TOK_SKIP_SPECIAL) && tok->special[ids[i]]) continue;
    /* without a decoder: tokens joined by spaces, as the Rust library does */
    if (!tok->has_decoder && any && !tok_buf_put(&a.buf, " ", 1)) goto oom;
    any = true;
    if (!tok_buf_put(&a.buf, t, strlen(t)) || (tok->has_decoder && !sl_close(&a))) goto oom;
  }
  if (!tok->has_decoder && !sl_close(&a)) goto oom;
  strlist *in = &a, *out = &b;
  for (int i = 0; i < tok->ndec; i++) {
    if (!sl_reset(out) || !dec_one(tok, &tok->dec[i], in, out, md)) goto oom;
    strlist *t = in;
    in = out;
    out = t;
  }
  /* the list joined */
  if (!(*text = malloc(in->buf.n + 1))) goto oom;
  memcpy(*text, in->buf.p ? in->buf.p : "", in->buf.n);
  (*text)[in->buf.n] = '\0';
  if (len) *len = in->buf.n;
  goto cleanup;
oom:
  s = TSR_ERROR(TSR_ENOMEM, "decode: out of memory");
cleanup:
  pcre2_match_data_free(md);
  sl_free(&a);
  sl_free(&b);
  return s;
}
