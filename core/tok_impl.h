/* The tokenizer's parts, shared by tok_load.c (tokenizer.json), tok_encode.c (normalizers,
 * pre-tokenizers, added tokens, post-processor), tok_bpe.c (the model), tok_decode.c (decoders),
 * tok_regex.c (PCRE2) and tok_util.c (hash maps, UTF-8). Not part of the public API. */
#ifndef TESSERA_TOK_IMPL_H
#define TESSERA_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tessera/tokenizer.h"

/* ---- growable byte buffer ---- */

typedef struct tok_buf {
  char *p;
  size_t n, cap;
} tok_buf;

bool tok_buf_reserve(tok_buf *b, size_t extra);
bool tok_buf_put(tok_buf *b, const void *p, size_t n);
void tok_buf_free(tok_buf *b);

/* ---- growable id vector ---- */

typedef struct tok_ids {
  int32_t *p;
  size_t n, cap;
} tok_ids;

bool tok_ids_reserve(tok_ids *v, size_t extra);
static inline bool tok_ids_push(tok_ids *v, int32_t id) {
  if (v->n == v->cap && !tok_ids_reserve(v, 1)) return false;
  v->p[v->n++] = id;
  return true;
}

/* ---- string -> int32 hash map (keys copied into a pool) ---- */

typedef struct tok_strmap_slot {
  uint64_t hash;
  uint32_t off, len; /* key bytes in pool */
  int32_t val;       /* -1: empty slot */
} tok_strmap_slot;

typedef struct tok_strmap {
  tok_strmap_slot *slots;
  size_t cap, n; /* cap: a power of two */
  tok_buf pool;
} tok_strmap;

uint64_t tok_hash(const void *p, size_t n);
/* The value of key (p, n), or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *p, size_t n);
/* Inserts or replaces; false when out of memory or the pool passes 4 GiB. *old gets the value
 * replaced (-1 when the key was new); old may be NULL. */
bool tok_strmap_put(tok_strmap *m, const char *p, size_t n, int32_t val, int32_t *old);
void tok_strmap_free(tok_strmap *m);
/* The key bytes of a slot. */
static inline const char *tok_strmap_key(const tok_strmap *m, const tok_strmap_slot *s) {
  return m->pool.p + s->off;
}

/* ---- (id, id) -> merge ---- */

typedef struct tok_merge_slot {
  uint64_t key; /* (left << 32) | right; UINT64_MAX: empty */
  int32_t rank; /* lower merges first */
  int32_t new_id;
} tok_merge_slot;

typedef struct tok_mergemap {
  tok_merge_slot *slots;
  size_t cap, n;
} tok_mergemap;

/* The merge of (a, b), or NULL. */
const tok_merge_slot *tok_merge_get(const tok_mergemap *m, int32_t a, int32_t b);
/* false when out of memory; an existing pair keeps its first (lowest) rank. */
bool tok_merge_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
void tok_mergemap_free(tok_mergemap *m);

/* ---- UTF-8 ---- */

/* Length of the UTF-8 character starting at s[0] (1..4); the text is already valid. */
static inline size_t tok_utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
/* Decodes the valid character at s (of length tok_utf8_len). */
uint32_t tok_utf8_decode(const char *s);
/* Writes code point cp as UTF-8 into out (4 bytes of room); returns its length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* Unicode White_Space, what Rust's char::is_whitespace and Oniguruma's \s test. */
bool tok_is_white_space(uint32_t cp);
/* Appends s to b with every invalid sequence replaced by U+FFFD, one per maximal invalid
 * subpart, as Rust's String::from_utf8_lossy does. */
bool tok_buf_put_lossy(tok_buf *b, const char *s, size_t n);

/* ---- regexes (tok_regex.c) ---- */

/* Compiles a tokenizer.json pattern: `{"Regex": ...}` in Oniguruma syntax, translated to PCRE2
 * where the two differ (\s, \S, \h, \H, \w, \W), or a `{"String": ...}` literal. On failure
 * TSR_EINVAL naming `file` and `key` with PCRE2's message and offset. */
tsr_status tok_regex_compile(const char *pattern, size_t len, bool literal, const char *file,
                             const char *key, pcre2_code **out);

/* ---- components ---- */

typedef enum tok_norm_kind { NORM_PREPEND, NORM_REPLACE, NORM_STRIP } tok_norm_kind;

typedef struct tok_normalizer {
  tok_norm_kind kind;
  char *text; /* Prepend: the prefix; Replace: the replacement */
  size_t text_len;
  char *pat; /* Replace with a String pattern: the string (re is NULL) */
  size_t pat_len;
  pcre2_code *re;   /* Replace with a Regex pattern */
  bool left, right; /* Strip */
} tok_normalizer;

typedef enum tok_pre_kind { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE } tok_pre_kind;
typedef enum tok_split_behavior {
  SPLIT_ISOLATED,
  SPLIT_REMOVED,
  SPLIT_MERGED_PREVIOUS,
  SPLIT_MERGED_NEXT,
  SPLIT_CONTIGUOUS,
} tok_split_behavior;
typedef enum tok_prepend { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend;

/* Pre-tokenizer regexes with a hand-written matcher (tok_fastsplit.c). */
enum { TOK_FAST_NONE, TOK_FAST_LLAMA3, TOK_FAST_GPT2 };

typedef struct tok_pretok {
  tok_pre_kind kind;
  pcre2_code *re; /* Split; ByteLevel with use_regex (GPT-2's pattern) */
  bool jit;       /* re was JIT-compiled: matched with pcre2_jit_match */
  int fast;       /* TOK_FAST_*: the matcher that stands in for re on ASCII text */
  tok_split_behavior behavior;
  bool invert;           /* Split: the pieces between matches are the matches */
  bool add_prefix_space; /* ByteLevel */
  char repl[5];          /* Metaspace: the replacement character, UTF-8 */
  size_t repl_len;
  tok_prepend prepend;
  bool split;
} tok_pretok;

typedef enum tok_dec_kind {
  DEC_BYTELEVEL,
  DEC_METASPACE,
  DEC_REPLACE,
  DEC_BYTEFALLBACK,
  DEC_FUSE,
  DEC_STRIP,
} tok_dec_kind;

typedef struct tok_decoder {
  tok_dec_kind kind;
  pcre2_code *re; /* Replace with a Regex pattern */
  char *pat;      /* Replace with a String pattern */
  size_t pat_len;
  char *text; /* Replace: the replacement; Metaspace: the replacement character */
  size_t text_len;
  tok_prepend prepend; /* Metaspace */
  uint32_t strip_cp;   /* Strip: the character removed */
  int strip_start, strip_stop;
} tok_decoder;

typedef struct tok_added {
  int32_t id;
  char *content;
  size_t len;
  bool special, normalized, lstrip, rstrip, single_word;
} tok_added;

/* A byte trie of added-token contents, for the leftmost-longest split. */
typedef struct tok_trie_node {
  int32_t child, sibling; /* -1: none */
  int32_t token;          /* index into tok->added, or -1 */
  unsigned char byte;
} tok_trie_node;

typedef struct tok_trie {
  tok_trie_node *nodes;
  size_t n, cap;
  bool first[256]; /* bytes that start some content */
  int nfirst;      /* how many such bytes; with one (Llama's all start with '<'), memchr finds it */
  unsigned char only;
} tok_trie;

#define TOK_MAX_STAGES 16

struct tsr_tokenizer_t {
  char *path;
  /* model */
  tok_strmap vocab; /* the model's vocabulary */
  tok_mergemap merges;
  int32_t unk_id; /* -1 without an unk token */
  bool fuse_unk, byte_fallback, ignore_merges;
  int32_t byte_ids[256];    /* byte fallback: the id of <0xXX>, or -1 */
  int32_t level_ids[256];   /* byte level: the id of the character byte b maps to, or -1 */
  uint32_t level_char[256]; /* byte level: the character byte b maps to */
  int32_t ascii_ids[128];   /* the id of each ASCII character, or -1: the common lookup */
  /* every id's token (model and added); NULL where no token has the id */
  char **id_token;
  int32_t nids;
  bool *special; /* by id */
  /* added tokens: matched in the raw text (split_raw) and in normalized text (split_norm, whose
   * contents are the normalized contents norm_content) */
  tok_added *added;
  int nadded;
  tok_trie split_raw, split_norm;
  char **norm_content;
  size_t *norm_len;
  pcre2_code *word_re; /* single_word: a word character at the start */
  /* pipeline */
  tok_normalizer norm[TOK_MAX_STAGES];
  int nnorm;
  tok_pretok pre[TOK_MAX_STAGES];
  int npre;
  bool byte_level; /* the last pre-tokenizer is ByteLevel: the model sees bytes */
  int32_t *head, *tail;
  int nhead, ntail;
  tok_decoder dec[TOK_MAX_STAGES];
  int ndec;
  bool has_decoder;
  int32_t eos;
  char eos_source[64];
};

/* tok_load.c parts used elsewhere */
bool tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t token);
void tok_trie_free(tok_trie *t);
/* Sets out to (s, n) through the normalizers (tmp: scratch; md: match data for their regexes).
 * Used for added tokens' normalized contents too. false when out of memory or a regex fails. */
bool tok_normalize(const tsr_tokenizer_t *tok, const char *s, size_t n, tok_buf *out, tok_buf *tmp,
                   pcre2_match_data *md);
/* Appends (s, n) to out with every occurrence of the pattern (the literal pat when re is NULL,
 * else the regex re) replaced by rep. md and mctx serve the regex. */
bool tok_replace_all(const char *s, size_t n, const char *pat, size_t np, pcre2_code *re,
                     const char *rep, size_t nrep, tok_buf *out, pcre2_match_data *md,
                     pcre2_match_context *mctx);
/* The GPT-2 pattern ByteLevel uses when use_regex is true. */
extern const char tok_gpt2_pattern[];

/* ---- the hand-written matchers (tok_fastsplit.c) ---- */

/* Llama 3's Split pattern, as its tokenizer.json spells it. */
extern const char tok_llama3_pattern[];
/* The TOK_FAST_* matcher for a Split pattern (GPT-2's with gpt2_pattern), or TOK_FAST_NONE. */
int tok_fast_kind(const char *pattern, size_t n, bool gpt2_pattern);
/* The end of the regex's match at position i of (s, n) (> i), or -1 when a non-ASCII character
 * decides it: PCRE2 must match there. */
long tok_fast_match(int kind, const char *s, size_t n, size_t i);

/* ---- BPE (tok_bpe.c) ---- */

/* GPT-2's byte -> character map of the ByteLevel components. */
uint32_t tok_byte_char(unsigned b);

typedef struct tok_bpe_state tok_bpe_state;
tok_bpe_state *tok_bpe_new(void);
void tok_bpe_free(tok_bpe_state *st);
/* Appends the ids of one pre-token to out: `bytes` = the model sees bytes through the ByteLevel
 * map (level_ids); otherwise UTF-8 characters looked up in the vocabulary, with byte fallback
 * and unk. false when out of memory. */
bool tok_bpe_word(const tsr_tokenizer_t *tok, tok_bpe_state *st, const char *s, size_t n,
                  bool bytes, tok_ids *out);

#endif
