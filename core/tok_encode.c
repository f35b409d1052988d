/* Encoding, in the order of the Rust library's Tokenizer::encode:
 *
 *   1. added tokens that are matched in the raw text (normalized = false) are split out;
 *   2. each other section goes through the normalizers, then the added tokens matched in
 *      normalized text are split out of it;
 *   3. the rest goes through the pre-tokenizers, each splitting its input into pieces
 *      (recursively, so no list of pieces is built: a stage hands each piece to the next);
 *   4. the BPE model turns each piece into ids (tok_bpe.c);
 *   5. the post-processor's template adds its tokens around the whole.
 *
 * Empty sections and pieces are dropped at every step, as the Rust library drops them. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

typedef struct tok_seg {
  size_t a, b; /* [a, b) */
  int32_t tag; /* split: 1 for a match; added: the added token's index, or -1 */
} tok_seg;

typedef struct tok_segs {
  tok_seg *p;
  size_t n, cap;
} tok_segs;

struct tsr_tok_encoder_t {
  const tsr_tokenizer_t *tok;
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *jit;
  tok_bpe_state *bpe;
  tok_ids ids;
  tok_buf norm, tmp;
  tok_segs raw, normd;
  tok_buf buf[TOK_MAX_STAGES];
  tok_segs segs[TOK_MAX_STAGES];
  /* tsr_tok_pieces: the model's input pieces and added tokens instead of ids */
  bool collect;
  tok_buf pieces;
  size_t *ends;
  size_t nends, cap_ends;
};

static bool seg_grow(tok_segs *v) {
  size_t cap = v->cap ? v->cap * 2 : 32;
  tok_seg *p = realloc(v->p, cap * sizeof *p);
  if (!p) return false;
  v->p = p;
  v->cap = cap;
  return true;
}

static inline bool seg_push(tok_segs *v, size_t a, size_t b, int32_t tag) {
  if (v->n == v->cap && !seg_grow(v)) return false;
  v->p[v->n++] = (tok_seg){a, b, tag};
  return true;
}

tsr_status tsr_tok_encoder_new(const tsr_tokenizer_t *tok, tsr_tok_encoder_t **out) {
  *out = NULL;
  tsr_tok_encoder_t *e = calloc(1, sizeof *e);
  if (!e) return TSR_ERROR(TSR_ENOMEM, "tokenizer encoder: out of memory");
  e->tok = tok;
  e->md = pcre2_match_data_create(1, NULL);
  e->mctx = pcre2_match_context_create(NULL);
  /* Long runs of whitespace backtrack deeply in `\s+(?!\S)`; 8 MB of JIT stack covers runs far
   * longer than text has. */
  e->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
  e->bpe = tok_bpe_new();
  if (!e->md || !e->mctx || !e->jit || !e->bpe) {
    tsr_tok_encoder_free(e);
    return TSR_ERROR(TSR_ENOMEM, "tokenizer encoder: out of memory");
  }
  pcre2_jit_stack_assign(e->mctx, NULL, e->jit);
  *out = e;
  return TSR_OK;
}

void tsr_tok_encoder_free(tsr_tok_encoder_t *e) {
  if (!e) return;
  pcre2_match_data_free(e->md);
  pcre2_match_context_free(e->mctx);
  pcre2_jit_stack_free(e->jit);
  tok_bpe_free(e->bpe);
  free(e->ids.p);
  tok_buf_free(&e->norm);
  tok_buf_free(&e->tmp);
  free(e->raw.p);
  free(e->normd.p);
  tok_buf_free(&e->pieces);
  free(e->ends);
  for (int i = 0; i < TOK_MAX_STAGES; i++) {
    tok_buf_free(&e->buf[i]);
    free(e->segs[i].p);
  }
  free(e);
}

/* Every match of re in (s, n), with the stretches between them: (a, b, 1) for a match, (a, b, 0)
 * between. Empty matches are skipped. `fast`: a hand-written matcher decides where it can
 * (tok_fastsplit.c); `jit`: re is JIT-compiled. <0 from PCRE2 for an error other than no
 * match. */
static int find_matches(pcre2_code *re, int fast, bool jit, pcre2_match_data *md,
                        pcre2_match_context *mctx, const char *s, size_t n, tok_segs *out) {
  size_t pos = 0, prev = 0;
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  while (pos < n) {
    long e = fast ? tok_fast_match(fast, s, n, pos) : -1;
    if (e > 0) {
      if ((pos > prev && !seg_push(out, prev, pos, 0)) || !seg_push(out, pos, (size_t)e, 1))
        return PCRE2_ERROR_NOMEMORY;
      prev = pos = (size_t)e;
      continue;
    }
    int rc = jit ? pcre2_jit_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mctx)
                 : pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return rc;
    size_t a = ov[0], b = ov[1];
    if (a == b) {
      pos = a + tok_utf8_len((unsigned char)s[a]);
      continue;
    }
    if ((a > prev && !seg_push(out, prev, a, 0)) || !seg_push(out, a, b, 1))
      return PCRE2_ERROR_NOMEMORY;
    prev = pos = b;
  }
  if (prev < n && !seg_push(out, prev, n, 0)) return PCRE2_ERROR_NOMEMORY;
  return 0;
}

/* Rust's SplitDelimiterBehavior on segments from find_matches, in place; tags become 0 for
 * pieces to keep and 1 for pieces to drop. */
static void apply_behavior(tok_segs *v, tok_split_behavior behavior, bool invert) {
  if (invert)
    for (size_t i = 0; i < v->n; i++) v->p[i].tag = !v->p[i].tag;
  size_t k = 0;
  bool prev_match = false;
  switch (behavior) {
    case SPLIT_ISOLATED:
      for (size_t i = 0; i < v->n; i++) v->p[i].tag = 0;
      return;
    case SPLIT_REMOVED:
      return;
    case SPLIT_CONTIGUOUS:
    case SPLIT_MERGED_PREVIOUS:
      for (size_t i = 0; i < v->n; i++) {
        bool m = v->p[i].tag != 0;
        bool join = behavior == SPLIT_CONTIGUOUS ? m == prev_match : m && !prev_match;
        if (join && k > 0)
          v->p[k - 1].b = v->p[i].b;
        else
          v->p[k++] = (tok_seg){v->p[i].a, v->p[i].b, 0};
        prev_match = m;
      }
      v->n = k;
      return;
    case SPLIT_MERGED_NEXT:
      /* from the right: a match joins the piece after it */
      k = v->n;
      for (size_t i = v->n; i-- > 0;) {
        bool m = v->p[i].tag != 0;
        if (m && !prev_match && k < v->n)
          v->p[k].a = v->p[i].a;
        else
          v->p[--k] = (tok_seg){v->p[i].a, v->p[i].b, 0};
        prev_match = m;
      }
      memmove(v->p, v->p + k, (v->n - k) * sizeof *v->p);
      v->n -= k;
      return;
  }
}

static bool is_literal_at(const char *s, size_t n, size_t i, const char *pat, size_t np) {
  return i + np <= n && !memcmp(s + i, pat, np);
}

bool tok_replace_all(const char *s, size_t n, const char *pat, size_t np, pcre2_code *re,
                     const char *rep, size_t nrep, tok_buf *out, pcre2_match_data *md,
                     pcre2_match_context *mctx) {
  size_t prev = 0;
  if (!re) {
    /* count, make room once, then copy: no call per occurrence (a space per word) */
    size_t hits = 0;
    for (const char *p = s, *end = s + n; (p = memchr(p, pat[0], (size_t)(end - p)));)
      if (is_literal_at(s, n, (size_t)(p - s), pat, np))
        hits++, p += np;
      else
        p++;
    if (!tok_buf_reserve(out, n + hits * nrep)) return false;
    char *o = out->p + out->n;
    for (size_t i = 0; hits && i < n;) {
      i = (size_t)((const char *)memchr(s + i, pat[0], n - i) - s);
      if (!is_literal_at(s, n, i, pat, np)) {
        i++;
        continue;
      }
      memcpy(o, s + prev, i - prev);
      o += i - prev;
      memcpy(o, rep, nrep);
      o += nrep;
      prev = i += np;
      hits--;
    }
    memcpy(o, s + prev, n - prev);
    out->n = (size_t)(o + (n - prev) - out->p);
    return true;
  } else {
    tok_segs segs = {0};
    bool ok = find_matches(re, TOK_FAST_NONE, false, md, mctx, s, n, &segs) == 0;
    for (size_t i = 0; ok && i < segs.n; i++)
      ok = segs.p[i].tag ? tok_buf_put(out, rep, nrep)
                         : tok_buf_put(out, s + segs.p[i].a, segs.p[i].b - segs.p[i].a);
    free(segs.p);
    return ok;
  }
  return tok_buf_put(out, s + prev, n - prev);
}

/* Start of the character before position i (> 0) of valid UTF-8 s. */
static size_t char_before(const char *s, size_t i) {
  do i--;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
  return i;
}

bool tok_normalize(const tsr_tokenizer_t *tok, const char *s, size_t n, tok_buf *out, tok_buf *tmp,
                   pcre2_match_data *md) {
  tok_buf *a = out, *b = tmp;
  a->n = 0;
  if (!tok_buf_put(a, s, n)) return false;
  for (int i = 0; i < tok->nnorm; i++) {
    const tok_normalizer *nm = &tok->norm[i];
    b->n = 0;
    if (nm->kind == NORM_PREPEND) {
      if (!a->n) continue; /* the Rust library prepends to non-empty text only */
      if (!tok_buf_put(b, nm->text, nm->text_len) || !tok_buf_put(b, a->p, a->n)) return false;
    } else if (nm->kind == NORM_REPLACE) {
      if (!tok_replace_all(a->p, a->n, nm->pat, nm->pat_len, nm->re, nm->text, nm->text_len, b, md,
                           NULL))
        return false;
    } else {
      size_t lo = 0, hi = a->n;
      while (nm->left && lo < hi && tok_is_white_space(tok_utf8_decode(a->p + lo)))
        lo += tok_utf8_len((unsigned char)a->p[lo]);
      while (nm->right && hi > lo &&
             tok_is_white_space(tok_utf8_decode(a->p + char_before(a->p, hi))))
        hi = char_before(a->p, hi);
      if (!tok_buf_put(b, a->p + lo, hi - lo)) return false;
    }
    tok_buf *t = a;
    a = b;
    b = t;
  }
  if (a != out) {
    out->n = 0;
    if (!tok_buf_put(out, a->p, a->n)) return false;
  }
  return true;
}

static tsr_status oom(void) {
  return TSR_ERROR(TSR_ENOMEM, "tokenizer: out of memory while encoding");
}

static tsr_status regex_failed(const tsr_tok_encoder_t *e, int rc, int stage) {
  if (rc == PCRE2_ERROR_NOMEMORY) return oom();
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof msg);
  return TSR_ERROR(TSR_EINVAL, "tokenizer %s: pre-tokenizer %d: the regex failed on this text: %s",
                   e->tok->path, stage, (const char *)msg);
}

/* What the model would see: a piece, or an added token (`id` >= 0). */
static tsr_status model(tsr_tok_encoder_t *e, const char *s, size_t n, int32_t id) {
  if (e->collect) {
    if (e->nends == e->cap_ends) {
      size_t cap = e->cap_ends ? 2 * e->cap_ends : 64;
      size_t *p = realloc(e->ends, cap * sizeof *p);
      if (!p) return oom();
      e->ends = p, e->cap_ends = cap;
    }
    if (!tok_buf_put(&e->pieces, s, n)) return oom();
    e->ends[e->nends++] = e->pieces.n;
    return TSR_OK;
  }
  if (id >= 0) return tok_ids_push(&e->ids, id) ? TSR_OK : oom();
  return tok_bpe_word(e->tok, e->bpe, s, n, e->tok->byte_level, &e->ids) ? TSR_OK : oom();
}

/* Pre-tokenizer `stage` on the piece (s, n); `at_start`: the piece begins the text. */
static tsr_status pre(tsr_tok_encoder_t *e, int stage, const char *s, size_t n, bool at_start) {
  const tsr_tokenizer_t *tok = e->tok;
  if (!n) return TSR_OK;
  if (stage == tok->npre) return model(e, s, n, -1);
  const tok_pretok *p = &tok->pre[stage];
  tok_buf *buf = &e->buf[stage];
  tok_segs *segs = &e->segs[stage];
  segs->n = 0;
  if (p->kind == PRE_BYTELEVEL && p->add_prefix_space && s[0] != ' ') {
    buf->n = 0;
    if (!tok_buf_put(buf, " ", 1) || !tok_buf_put(buf, s, n)) return oom();
    s = buf->p, n = buf->n;
  }
  if (p->kind == PRE_METASPACE) {
    /* spaces replaced first, so text that starts with one gets no second replacement */
    buf->n = 0;
    if (!tok_buf_reserve(buf, p->repl_len) || !tok_buf_put(buf, p->repl, p->repl_len) ||
        !tok_replace_all(s, n, " ", 1, NULL, p->repl, p->repl_len, buf, NULL, NULL))
      return oom();
    bool prepend = !is_literal_at(buf->p, buf->n, p->repl_len, p->repl, p->repl_len) &&
                   (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at_start));
    s = buf->p + (prepend ? 0 : p->repl_len), n = buf->n - (prepend ? 0 : p->repl_len);
    if (!p->split) return pre(e, stage + 1, s, n, at_start);
    /* every replacement character starts a piece (MergedWithNext) */
    size_t prev = 0;
    for (size_t i = 0; i < n; i += tok_utf8_len((unsigned char)s[i])) {
      if (!is_literal_at(s, n, i, p->repl, p->repl_len)) continue;
      if ((i > prev && !seg_push(segs, prev, i, 0)) || !seg_push(segs, i, i + p->repl_len, 1))
        return oom();
      prev = i + p->repl_len;
    }
    if (prev < n && !seg_push(segs, prev, n, 0)) return oom();
    apply_behavior(segs, SPLIT_MERGED_NEXT, false);
  } else if (p->re) {
    int rc = find_matches(p->re, p->fast, p->jit, e->md, e->mctx, s, n, segs);
    if (rc < 0) return regex_failed(e, rc, stage);
    apply_behavior(segs, p->kind == PRE_SPLIT ? p->behavior : SPLIT_ISOLATED,
                   p->kind == PRE_SPLIT && p->invert);
  } else {
    return pre(e, stage + 1, s, n, at_start);
  }
  for (size_t i = 0; i < segs->n; i++) {
    if (segs->p[i].tag) continue;
    TSR_CHECK(pre(e, stage + 1, s + segs->p[i].a, segs->p[i].b - segs->p[i].a,
                  at_start && segs->p[i].a == 0));
  }
  return TSR_OK;
}

/* Whether the character before position i (or after it, `after`) is a word character. */
static bool word_next_to(const tsr_tok_encoder_t *e, const char *s, size_t n, size_t i,
                         bool after) {
  if (after ? i >= n : i == 0) return false;
  size_t at = after ? i : char_before(s, i);
  return pcre2_match(e->tok->word_re, (PCRE2_SPTR)s, n, at, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                     e->md, e->mctx) >= 0;
}

/* The Rust library's AddedVocabulary::find_matches: leftmost-longest matches of the trie's
 * contents in (s, n), with the sections between them (tag -1). */
static bool split_added(tsr_tok_encoder_t *e, const tok_trie *t, const char *s, size_t n,
                        unsigned flags, tok_segs *out) {
  const tsr_tokenizer_t *tok = e->tok;
  out->n = 0;
  size_t start = 0;
  for (size_t i = 0; t->n && i < n;) {
    if (t->nfirst == 1) {
      const char *hit = memchr(s + i, t->only, n - i);
      if (!hit) break;
      i = (size_t)(hit - s);
    } else if (!t->first[(unsigned char)s[i]]) {
      i++;
      continue;
    }
    int32_t cur = 0, best = -1;
    size_t end = 0;
    for (size_t j = i; j < n; j++) {
      int32_t ch = t->nodes[cur].child;
      while (ch >= 0 && t->nodes[ch].byte != (unsigned char)s[j]) ch = t->nodes[ch].sibling;
      if (ch < 0) break;
      cur = ch;
      if (t->nodes[cur].token >= 0) best = t->nodes[cur].token, end = j + 1;
    }
    if (best < 0) {
      i++;
      continue;
    }
    const tok_added *a = &tok->added[best];
    size_t ms = i, me = end;
    i = end; /* the next match starts after this one, taken or not */
    if ((flags & TSR_TOK_SPLIT_SPECIAL) && a->special) continue;
    if (a->single_word && (word_next_to(e, s, n, ms, false) || word_next_to(e, s, n, me, true)))
      continue;
    if (a->lstrip)
      while (ms > start && tok_is_white_space(tok_utf8_decode(s + char_before(s, ms))))
        ms = char_before(s, ms);
    if (a->rstrip)
      while (me < n && tok_is_white_space(tok_utf8_decode(s + me)))
        me += tok_utf8_len((unsigned char)s[me]);
    if ((start < ms && !seg_push(out, start, ms, -1)) || !seg_push(out, ms, me, best)) return false;
    start = i = me;
  }
  return start >= n || seg_push(out, start, n, -1);
}

static tsr_status encode(tsr_tok_encoder_t *e, const char *text, size_t len, unsigned flags) {
  const tsr_tokenizer_t *tok = e->tok;
  size_t valid = tsr_utf8_valid_prefix(text, len);
  if (valid != len)
    return TSR_ERROR(TSR_EINVAL, "text is not valid UTF-8 at byte %zu (0x%02X)", valid,
                     (unsigned char)text[valid]);
  e->ids.n = 0;
  e->pieces.n = e->nends = 0;
  bool special = (flags & TSR_TOK_ADD_SPECIAL) && !e->collect;
  if (special && !tok_ids_reserve(&e->ids, (size_t)tok->nhead)) return oom();
  for (int i = 0; special && i < tok->nhead; i++) e->ids.p[e->ids.n++] = tok->head[i];
  if (!split_added(e, &tok->split_raw, text, len, flags, &e->raw)) return oom();
  for (size_t i = 0; i < e->raw.n; i++) {
    const tok_seg *r = &e->raw.p[i];
    if (r->tag >= 0) {
      TSR_CHECK(model(e, text + r->a, r->b - r->a, tok->added[r->tag].id));
      continue;
    }
    const char *s = text + r->a;
    size_t n = r->b - r->a;
    if (tok->nnorm) {
      if (!tok_normalize(tok, s, n, &e->norm, &e->tmp, e->md)) return oom();
      s = e->norm.p, n = e->norm.n;
    }
    if (!split_added(e, &tok->split_norm, s, n, flags, &e->normd)) return oom();
    for (size_t j = 0; j < e->normd.n; j++) {
      const tok_seg *q = &e->normd.p[j];
      if (q->tag >= 0) {
        TSR_CHECK(model(e, s + q->a, q->b - q->a, tok->added[q->tag].id));
        continue;
      }
      TSR_CHECK(pre(e, 0, s + q->a, q->b - q->a, r->a == 0 && q->a == 0));
    }
  }
  if (special && !tok_ids_reserve(&e->ids, (size_t)tok->ntail)) return oom();
  for (int i = 0; special && i < tok->ntail; i++) e->ids.p[e->ids.n++] = tok->tail[i];
  return TSR_OK;
}

tsr_status tsr_tok_encode(tsr_tok_encoder_t *e, const char *text, size_t len, unsigned flags,
                          const int32_t **ids, size_t *nids) {
  *ids = NULL;
  *nids = 0;
  e->collect = false;
  TSR_CHECK(encode(e, text, len, flags));
  *ids = e->ids.p;
  *nids = e->ids.n;
  return TSR_OK;
}

tsr_status tsr_tok_pieces(tsr_tok_encoder_t *e, const char *text, size_t len, unsigned flags,
                          const char **buf, const size_t **ends, size_t *n) {
  *buf = NULL;
  *ends = NULL;
  *n = 0;
  e->collect = true;
  tsr_status s = encode(e, text, len, flags);
  e->collect = false;
  TSR_CHECK(s);
  *buf = e->pieces.p;
  *ends = e->ends;
  *n = e->nends;
  return TSR_OK;
}
