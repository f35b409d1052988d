/* Hand-written matchers for the two pre-tokenizer regexes most byte-level files use, Llama 3's
 * Split pattern and GPT-2's (the ByteLevel pre-tokenizer's own). Through PCRE2's JIT the regex
 * is half the encoding time; these do the same for ASCII text in a few instructions per byte.
 *
 * A matcher decides the match at one position as the regex would (its alternatives tried in
 * order, greedy quantifiers, backtracking worked out by hand below), looking only at ASCII
 * bytes. When the decision depends on a non-ASCII character (which may be a letter, a number or
 * white space), it gives up for that position and the caller runs PCRE2 there, so the result is
 * always the regex's. test_tokenizer compares both on random text. */
#include <pthread.h>
#include <string.h>

#include "tok_impl.h"

const char tok_llama3_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                  "\\s+(?!\\S)|\\s+";

/* ASCII classes: letter, number, white space (Unicode White_Space: \t \n \v \f \r and space),
 * anything else; X for a non-ASCII byte, whose class this table cannot tell. */
enum { C_L, C_N, C_S, C_P, C_X };

static unsigned char cls[256];
static pthread_once_t cls_once = PTHREAD_ONCE_INIT;

static void init_classes(void) {
  for (int c = 0; c < 256; c++)
    cls[c] = c >= 0x80                                          ? C_X
             : (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? C_L
             : c >= '0' && c <= '9'                             ? C_N
             : (c >= 0x09 && c <= 0x0D) || c == ' '             ? C_S
                                                                : C_P;
}

/* Ends the run of class k from i; -1 when the byte after it is non-ASCII (the run might go on). */
static long run(const unsigned char *s, size_t n, size_t i, int k) {
  while (i < n && cls[s[i]] == k) i++;
  return i < n && cls[s[i]] == C_X ? -1 : (long)i;
}

static inline int lower(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's 't 're 've 'm 'll 'd at i, `fold`: case-insensitively; the match's length, 0 for none, -1
 * when a non-ASCII character decides (under (?i), U+017F folds to 's'). */
static int contraction(const unsigned char *s, size_t n, size_t i, bool fold) {
  if (s[i] != '\'' || i + 1 >= n) return 0;
  int a = s[i + 1];
  if (a >= 0x80) return fold ? -1 : 0;
  if (fold) a = lower((unsigned char)a);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (a != 'r' && a != 'v' && a != 'l') return 0;
  if (i + 2 >= n) return 0;
  int b = s[i + 2];
  if (b >= 0x80) return fold ? -1 : 0;
  if (fold) b = lower((unsigned char)b);
  return b == (a == 'l' ? 'l' : 'e') ? 3 : 0;
}

/* \s+(?!\S)|\s+ on the white-space run [i, e): all of it at the end of the text, else all but
 * its last character (which the next piece begins with), else the one character. */
static size_t spaces(size_t i, size_t e, size_t n) {
  return e == n || e - i < 2 ? e : e - 1;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
static long llama3(const unsigned char *s, size_t n, size_t i) {
  int k = cls[s[i]];
  if (k == C_X) return -1;
  int c = contraction(s, n, i, true);
  if (c) return c < 0 ? -1 : (long)i + c;
  /* [^\r\n\p{L}\p{N}]?\p{L}+: a letter run, after at most one character that is none of those */
  size_t j = (k == C_P || (k == C_S && s[i] != '\r' && s[i] != '\n')) ? i + 1 : i;
  if (j < n && cls[s[j]] == C_X) return -1;
  if (j < n && cls[s[j]] == C_L) return run(s, n, j, C_L);
  if (k == C_N) {
    size_t e = i + 1;
    while (e < n && e < i + 3 && cls[s[e]] == C_N) e++;
    return e < n && e < i + 3 && cls[s[e]] == C_X ? -1 : (long)e;
  }
  /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
  j = s[i] == ' ' ? i + 1 : i;
  if (j < n && cls[s[j]] == C_P) {
    long e = run(s, n, j, C_P);
    if (e < 0) return -1;
    while ((size_t)e < n && (s[e] == '\r' || s[e] == '\n')) e++;
    return e;
  }
  if (k != C_S) return -1; /* cannot happen: every ASCII class is handled above */
  long e = run(s, n, i, C_S);
  if (e < 0) return -1;
  /* \s*[\r\n]+: the white space up to its last line break */
  for (long q = e - 1; q >= (long)i; q--)
    if (s[q] == '\r' || s[q] == '\n') return q + 1;
  return (long)spaces(i, (size_t)e, n);
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static long gpt2(const unsigned char *s, size_t n, size_t i) {
  int k = cls[s[i]];
  if (k == C_X) return -1;
  int c = contraction(s, n, i, false);
  if (c) return (long)i + c;
  size_t j = s[i] == ' ' ? i + 1 : i;
  if (j < n) {
    int kj = cls[s[j]];
    if (kj == C_X) return -1;
    if (kj != C_S) return run(s, n, j, kj);
  }
  long e = run(s, n, i, C_S);
  return e < 0 ? -1 : (long)spaces(i, (size_t)e, n);
}

int tok_fast_kind(const char *pattern, size_t n, bool gpt2_pattern) {
  pthread_once(&cls_once, init_classes);
  if (gpt2_pattern) return TOK_FAST_GPT2;
  if (n == strlen(tok_llama3_pattern) && !memcmp(pattern, tok_llama3_pattern, n))
    return TOK_FAST_LLAMA3;
  return TOK_FAST_NONE;
}

long tok_fast_match(int kind, const char *s, size_t n, size_t i) {
  const unsigned char *u = (const unsigned char *)s;
  return kind == TOK_FAST_LLAMA3 ? llama3(u, n, i) : gpt2(u, n, i);
}
