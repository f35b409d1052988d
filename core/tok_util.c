/* The tokenizer's containers and UTF-8 helpers. The hash maps are open-addressed with linear
 * probing at most half full: vocabularies hold up to a few hundred thousand short keys, and a
 * lookup per character or per merge is the inner loop of encoding. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

bool tok_buf_reserve(tok_buf *b, size_t extra) {
  if (b->cap - b->n >= extra) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->n < extra) {
    if (cap > SIZE_MAX / 2) return false;
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (!p) return false;
  b->p = p;
  b->cap = cap;
  return true;
}

bool tok_buf_put(tok_buf *b, const void *p, size_t n) {
  if (!tok_buf_reserve(b, n)) return false;
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
  return true;
}

void tok_buf_free(tok_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

bool tok_ids_reserve(tok_ids *v, size_t extra) {
  if (v->cap - v->n >= extra) return true;
  size_t cap = v->cap ? v->cap : 64;
  while (cap - v->n < extra) {
    if (cap > SIZE_MAX / 8) return false;
    cap *= 2;
  }
  int32_t *p = realloc(v->p, cap * sizeof *p);
  if (!p) return false;
  v->p = p;
  v->cap = cap;
  return true;
}

static inline uint64_t read64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static inline uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

/* Eight bytes per step: tokens and words are short, and this is called for every lookup. */
uint64_t tok_hash(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  while (n >= 8) {
    h = mix((h ^ read64(s)) * 0xbf58476d1ce4e5b9ull);
    s += 8;
    n -= 8;
  }
  uint64_t t = 0;
  if (n) memcpy(&t, s, n);
  return mix((h ^ t) * 0x94d049bb133111ebull);
}

int32_t tok_strmap_get(const tok_strmap *m, const char *p, size_t n) {
  if (!m->cap) return -1;
  uint64_t h = tok_hash(p, n);
  size_t mask = m->cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const tok_strmap_slot *s = &m->slots[i];
    if (s->val < 0) return -1;
    if (s->hash == h && s->len == n && !memcmp(m->pool.p + s->off, p, n)) return s->val;
  }
}

static bool strmap_grow(tok_strmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  tok_strmap_slot *slots = malloc(cap * sizeof *slots);
  if (!slots) return false;
  for (size_t i = 0; i < cap; i++) slots[i].val = -1;
  for (size_t i = 0; i < m->cap; i++) {
    tok_strmap_slot *s = &m->slots[i];
    if (s->val < 0) continue;
    size_t j = s->hash & (cap - 1);
    while (slots[j].val >= 0) j = (j + 1) & (cap - 1);
    slots[j] = *s;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return true;
}

bool tok_strmap_put(tok_strmap *m, const char *p, size_t n, int32_t val, int32_t *old) {
  if (old) *old = -1;
  if ((m->n + 1) * 2 > m->cap && !strmap_grow(m)) return false;
  uint64_t h = tok_hash(p, n);
  size_t mask = m->cap - 1;
  size_t i = h & mask;
  for (;; i = (i + 1) & mask) {
    tok_strmap_slot *s = &m->slots[i];
    if (s->val < 0) break;
    if (s->hash == h && s->len == n && !memcmp(m->pool.p + s->off, p, n)) {
      if (old) *old = s->val;
      s->val = val;
      return true;
    }
  }
  if (m->pool.n + n > UINT32_MAX || !tok_buf_put(&m->pool, p, n)) return false;
  m->slots[i] = (tok_strmap_slot){h, (uint32_t)(m->pool.n - n), (uint32_t)n, val};
  m->n++;
  return true;
}

void tok_strmap_free(tok_strmap *m) {
  free(m->slots);
  tok_buf_free(&m->pool);
  memset(m, 0, sizeof *m);
}

static inline uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline size_t pair_slot(uint64_t key, size_t mask) {
  return (size_t)(mix(key * 0x9e3779b97f4a7c15ull)) & mask;
}

const tok_merge_slot *tok_merge_get(const tok_mergemap *m, int32_t a, int32_t b) {
  if (!m->cap) return NULL;
  uint64_t key = pair_key(a, b);
  size_t mask = m->cap - 1;
  for (size_t i = pair_slot(key, mask);; i = (i + 1) & mask) {
    const tok_merge_slot *s = &m->slots[i];
    if (s->key == key) return s;
    if (s->key == UINT64_MAX) return NULL;
  }
}

static bool merge_grow(tok_mergemap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  tok_merge_slot *slots = malloc(cap * sizeof *slots);
  if (!slots) return false;
  for (size_t i = 0; i < cap; i++) slots[i].key = UINT64_MAX;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->slots[i].key == UINT64_MAX) continue;
    size_t j = pair_slot(m->slots[i].key, cap - 1);
    while (slots[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
    slots[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return true;
}

bool tok_merge_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  if ((m->n + 1) * 2 > m->cap && !merge_grow(m)) return false;
  uint64_t key = pair_key(a, b);
  size_t mask = m->cap - 1;
  size_t i = pair_slot(key, mask);
  for (; m->slots[i].key != UINT64_MAX; i = (i + 1) & mask)
    if (m->slots[i].key == key) return true; /* a repeated merge keeps its first rank */
  m->slots[i] = (tok_merge_slot){key, rank, new_id};
  m->n++;
  return true;
}

void tok_mergemap_free(tok_mergemap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ---- */

uint32_t tok_utf8_decode(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  if (u[0] < 0x80) return u[0];
  if (u[0] < 0xE0) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
  if (u[0] < 0xF0)
    return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
  return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
         (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | cp >> 6);
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | cp >> 12);
    o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | cp >> 18);
  o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

bool tok_is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* The number of bytes of the well-formed character at s (Unicode table 3-7), or of its longest
 * well-formed prefix, negated (0 when s[0] cannot start a character). */
static int utf8_char(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F; /* no surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
  } else
    return 0;
  for (int i = 1; i < len; i++) {
    if ((size_t)i >= n) return -i;
    unsigned char b = s[i];
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return -i;
  }
  return len;
}

size_t tsr_utf8_valid_prefix(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    /* ASCII runs, eight bytes at a time */
    while (i + 8 <= n && !(read64(u + i) & 0x8080808080808080ull)) i += 8;
    if (i >= n) break;
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int l = utf8_char(u + i, n - i);
    if (l <= 0) return i;
    i += (size_t)l;
  }
  return n;
}

bool tok_buf_put_lossy(tok_buf *b, const char *s, size_t n) {
  static const char fffd[] = "\xEF\xBF\xBD";
  const unsigned char *u = (const unsigned char *)s;
  while (n) {
    size_t ok = tsr_utf8_valid_prefix(s, n);
    if (!tok_buf_put(b, s, ok)) return false;
    if (ok == n) return true;
    int l = utf8_char(u + ok, n - ok);
    size_t bad = l == 0 ? 1 : (size_t)-l;
    if (!tok_buf_put(b, fffd, 3)) return false;
    s += ok + bad;
    u += ok + bad;
    n -= ok + bad;
  }
  return true;
}
