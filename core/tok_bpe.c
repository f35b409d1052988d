/* The BPE model: one pre-token ("word") to ids, as the Rust library's BPE::merge_word and
 * Word::merge_all do. The word starts as one symbol per character (per byte through the
 * ByteLevel map), characters missing from the vocabulary fall back to <0xXX> byte tokens or to
 * <unk>; then the pair of neighbours with the lowest merge rank is merged, the leftmost first
 * among equal ranks, until no neighbouring pair has a merge. A min-heap of candidate pairs makes
 * that O(n log n) in the word's length, which matters for SentencePiece-style files, whose
 * "word" is a whole section of text.
 *
 * Results of short words are kept in a per-encoder cache: natural text repeats its words, and
 * a hit replaces all of the above with one hash lookup. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* Words longer than this are not cached: rare, and costly to keep. */
#define CACHE_MAX_WORD 256
/* The cache is dropped and restarted past this many entries or ids, so it stays a few MB. */
#define CACHE_MAX_ENTRIES (1u << 17)
#define CACHE_MAX_IDS     (1u << 21)

typedef struct bpe_sym {
  int32_t id, prev, next; /* prev/next: neighbouring live symbols, -1 at the ends */
  bool dead;
} bpe_sym;

typedef struct bpe_cand {
  int32_t rank, pos, new_id;
} bpe_cand;

struct tok_bpe_state {
  bpe_sym *syms;
  size_t nsyms, cap_syms;
  bpe_cand *heap;
  size_t nheap, cap_heap;
  tok_buf word;
  tok_strmap cache; /* word -> offset into cache_ids: [count, ids...] */
  tok_ids cache_ids;
};

tok_bpe_state *tok_bpe_new(void) {
  return calloc(1, sizeof(tok_bpe_state));
}

void tok_bpe_free(tok_bpe_state *st) {
  if (!st) return;
  free(st->syms);
  free(st->heap);
  tok_buf_free(&st->word);
  tok_strmap_free(&st->cache);
  free(st->cache_ids.p);
  free(st);
}

static bool add_sym(tok_bpe_state *st, int32_t id) {
  if (st->nsyms == st->cap_syms) {
    size_t cap = st->cap_syms ? st->cap_syms * 2 : 64;
    bpe_sym *p = realloc(st->syms, cap * sizeof *p);
    if (!p) return false;
    st->syms = p;
    st->cap_syms = cap;
  }
  int32_t i = (int32_t)st->nsyms++;
  st->syms[i] = (bpe_sym){id, i - 1, -1, false};
  if (i > 0) st->syms[i - 1].next = i;
  return true;
}

static inline bool cand_less(const bpe_cand *a, const bpe_cand *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static bool heap_push(tok_bpe_state *st, bpe_cand c) {
  if (st->nheap == st->cap_heap) {
    size_t cap = st->cap_heap ? st->cap_heap * 2 : 64;
    bpe_cand *p = realloc(st->heap, cap * sizeof *p);
    if (!p) return false;
    st->heap = p;
    st->cap_heap = cap;
  }
  size_t i = st->nheap++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!cand_less(&c, &st->heap[parent])) break;
    st->heap[i] = st->heap[parent];
    i = parent;
  }
  st->heap[i] = c;
  return true;
}

static bpe_cand heap_pop(tok_bpe_state *st) {
  bpe_cand top = st->heap[0];
  bpe_cand last = st->heap[--st->nheap];
  size_t i = 0, n = st->nheap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const bpe_cand *best = &last;
    if (l < n && cand_less(&st->heap[l], best)) m = l, best = &st->heap[l];
    if (r < n && cand_less(&st->heap[r], best)) m = r;
    if (m == i) break;
    st->heap[i] = st->heap[m];
    i = m;
  }
  if (n) st->heap[i] = last;
  return top;
}

static bool push_pair(const tsr_tokenizer_t *tok, tok_bpe_state *st, int32_t pos) {
  int32_t next = st->syms[pos].next;
  if (next < 0) return true;
  const tok_merge_slot *m = tok_merge_get(&tok->merges, st->syms[pos].id, st->syms[next].id);
  if (!m) return true;
  return heap_push(st, (bpe_cand){m->rank, pos, m->new_id});
}

static bool merge_all(const tsr_tokenizer_t *tok, tok_bpe_state *st) {
  st->nheap = 0;
  for (int32_t i = 0; i + 1 < (int32_t)st->nsyms; i++)
    if (!push_pair(tok, st, i)) return false;
  while (st->nheap) {
    bpe_cand c = heap_pop(st);
    bpe_sym *s = &st->syms[c.pos];
    if (s->dead || s->next < 0) continue;
    bpe_sym *r = &st->syms[s->next];
    /* a stale candidate: one of the two symbols has changed since it was pushed */
    const tok_merge_slot *m = tok_merge_get(&tok->merges, s->id, r->id);
    if (!m || m->new_id != c.new_id) continue;
    s->id = c.new_id;
    r->dead = true;
    s->next = r->next;
    if (r->next >= 0) st->syms[r->next].prev = c.pos;
    if (s->prev >= 0 && !push_pair(tok, st, s->prev)) return false;
    if (!push_pair(tok, st, c.pos)) return false;
  }
  return true;
}

/* GPT-2's byte -> character map: printable Latin-1 bytes map to themselves, the others to
 * U+0100 onwards in byte order. */
uint32_t tok_byte_char(unsigned b) {
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
  unsigned n = 0;
  for (unsigned x = 0; x < b; x++)
    if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
  return 256 + n;
}

/* A character (s, n) of the word that is not in the vocabulary: its bytes as <0xXX> tokens when
 * all of them exist, else <unk> (one for a run of them with fuse_unk). Rust adds the byte tokens
 * without closing a pending <unk> run; so does this. */
static bool unknown_char(const tsr_tokenizer_t *tok, tok_bpe_state *st, const char *s, size_t n,
                         bool *unk_pending) {
  if (tok->byte_fallback) {
    bool all = true;
    for (size_t i = 0; i < n; i++) all = all && tok->byte_ids[(unsigned char)s[i]] >= 0;
    if (all) {
      for (size_t i = 0; i < n; i++)
        if (!add_sym(st, tok->byte_ids[(unsigned char)s[i]])) return false;
      return true;
    }
  }
  if (tok->unk_id < 0) return true; /* without an unk token the character is dropped, as in Rust */
  if (*unk_pending && tok->fuse_unk) return true;
  if (*unk_pending && !add_sym(st, tok->unk_id)) return false;
  *unk_pending = true;
  return true;
}

static bool build_word(const tsr_tokenizer_t *tok, tok_bpe_state *st, const char *s, size_t n,
                       bool bytes) {
  st->nsyms = 0;
  bool unk = false;
  for (size_t i = 0; i < n;) {
    int32_t id;
    size_t l;
    char mapped[4];
    const char *ch = s + i;
    if (bytes) {
      l = 1;
      id = tok->level_ids[(unsigned char)s[i]];
      if (id < 0) ch = mapped, l = tok_utf8_encode(tok->level_char[(unsigned char)s[i]], mapped);
    } else {
      l = tok_utf8_len((unsigned char)s[i]);
      id = l == 1 ? tok->ascii_ids[(unsigned char)s[i]] : tok_strmap_get(&tok->vocab, s + i, l);
    }
    i += bytes ? 1 : l;
    if (id >= 0) {
      if (unk && !add_sym(st, tok->unk_id)) return false;
      unk = false;
      if (!add_sym(st, id)) return false;
    } else if (!unknown_char(tok, st, ch, l, &unk)) {
      return false;
    }
  }
  if (unk && !add_sym(st, tok->unk_id)) return false;
  return true;
}

/* ignore_merges: a word that is itself in the vocabulary is one token, merges or not. */
static int32_t whole_word(const tsr_tokenizer_t *tok, tok_bpe_state *st, const char *s, size_t n,
                          bool bytes) {
  if (!bytes) return tok_strmap_get(&tok->vocab, s, n);
  st->word.n = 0;
  if (!tok_buf_reserve(&st->word, 2 * n)) return -1;
  for (size_t i = 0; i < n; i++)
    st->word.n += tok_utf8_encode(tok->level_char[(unsigned char)s[i]], st->word.p + st->word.n);
  return tok_strmap_get(&tok->vocab, st->word.p, st->word.n);
}

static void cache_put(tok_bpe_state *st, const char *s, size_t n, const int32_t *ids,
                      size_t count) {
  if (st->cache.n >= CACHE_MAX_ENTRIES || st->cache_ids.n + count + 1 > CACHE_MAX_IDS) {
    tok_strmap_free(&st->cache);
    st->cache_ids.n = 0;
  }
  size_t off = st->cache_ids.n;
  if (!tok_ids_reserve(&st->cache_ids, count + 1)) return; /* a cache miss costs time only */
  st->cache_ids.p[st->cache_ids.n++] = (int32_t)count;
  memcpy(st->cache_ids.p + st->cache_ids.n, ids, count * sizeof *ids);
  st->cache_ids.n += count;
  if (!tok_strmap_put(&st->cache, s, n, (int32_t)off, NULL)) st->cache_ids.n = off;
}

bool tok_bpe_word(const tsr_tokenizer_t *tok, tok_bpe_state *st, const char *s, size_t n,
                  bool bytes, tok_ids *out) {
  if (!n) return true;
  bool cacheable = n <= CACHE_MAX_WORD;
  if (cacheable) {
    int32_t off = tok_strmap_get(&st->cache, s, n);
    if (off >= 0) {
      size_t count = (size_t)st->cache_ids.p[off];
      if (!tok_ids_reserve(out, count)) return false;
      memcpy(out->p + out->n, st->cache_ids.p + off + 1, count * sizeof(int32_t));
      out->n += count;
      return true;
    }
  }
  size_t first = out->n;
  int32_t whole = tok->ignore_merges ? whole_word(tok, st, s, n, bytes) : -1;
  if (whole >= 0) {
    if (!tok_ids_push(out, whole)) return false;
  } else {
    if (!build_word(tok, st, s, n, bytes) || !merge_all(tok, st)) return false;
    for (int32_t i = st->nsyms ? 0 : -1; i >= 0; i = st->syms[i].next)
      if (!tok_ids_push(out, st->syms[i].id)) return false;
  }
  if (cacheable) cache_put(st, s, n, out->p + first, out->n - first);
  return true;
}
