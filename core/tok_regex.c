/* tokenizer.json patterns through PCRE2. The files are written for the Rust library, which
 * compiles them with Oniguruma (Ruby syntax); PCRE2 reads the same syntax, but a few escapes mean
 * other things there, so they are rewritten before compiling:
 *
 *   \s \S  Oniguruma: the Unicode White_Space property (U+0085 included); PCRE2's UCP \s lacks
 *          U+0085, so both become \p{White_Space} / \P{White_Space}
 *   \h \H  Oniguruma: a hexadecimal digit (PCRE2: horizontal space)
 *   \w \W  Oniguruma: Alphabetic, marks, decimal digits, connector punctuation (PCRE2's UCP \w is
 *          letters, numbers and '_')
 *
 * ^ and $ match at line ends in Ruby syntax (PCRE2_MULTILINE), and `.` excludes only \n. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define WORD_CHARS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"

static bool put_str(tok_buf *b, const char *s) {
  return tok_buf_put(b, s, strlen(s));
}

/* The PCRE2 form of Oniguruma pattern p; *bad gets the offset of an escape PCRE2 cannot express
 * inside a character class (a negated class there), else SIZE_MAX. */
static bool translate(const char *p, size_t n, tok_buf *out, size_t *bad) {
  int depth = 0; /* character-class nesting */
  *bad = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\\' && i + 1 < n) {
      char e = p[++i];
      bool in = depth > 0;
      const char *rep = NULL;
      switch (e) {
        case 's':
          rep = "\\p{White_Space}";
          break;
        case 'S':
          rep = "\\P{White_Space}";
          break;
        case 'h':
          rep = in ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
          break;
        case 'w':
          rep = in ? WORD_CHARS : "[" WORD_CHARS "]";
          break;
        case 'H':
        case 'W':
          if (in) {
            *bad = i - 1;
            return true;
          }
          rep = e == 'H' ? "[^0-9A-Fa-f]" : "[^" WORD_CHARS "]";
          break;
        default:
          break;
      }
      if (rep) {
        if (!put_str(out, rep)) return false;
      } else if (!tok_buf_put(out, p + i - 1, 2)) {
        return false;
      }
      continue;
    }
    if (c == '[') {
      if (depth > 0 && i + 1 < n && p[i + 1] == ':') {
        /* a POSIX class [:alpha:] inside a class: copy it whole */
        const char *end = NULL;
        for (size_t j = i + 2; j + 1 < n; j++)
          if (p[j] == ':' && p[j + 1] == ']') {
            end = p + j + 2;
            break;
          }
        if (end) {
          if (!tok_buf_put(out, p + i, (size_t)(end - (p + i)))) return false;
          i = (size_t)(end - p) - 1;
          continue;
        }
      }
      depth++;
      if (!tok_buf_put(out, p + i, 1)) return false;
      /* a ']' first in a class (after an optional '^') is a literal */
      if (i + 1 < n && p[i + 1] == '^') {
        if (!tok_buf_put(out, "^", 1)) return false;
        i++;
      }
      if (i + 1 < n && p[i + 1] == ']') {
        if (!tok_buf_put(out, "\\]", 2)) return false;
        i++;
      }
      continue;
    }
    if (c == ']' && depth > 0) depth--;
    if (!tok_buf_put(out, p + i, 1)) return false;
  }
  return true;
}

tsr_status tok_regex_compile(const char *pattern, size_t len, bool literal, const char *file,
                             const char *key, pcre2_code **out) {
  *out = NULL;
  tok_buf src = {0};
  tsr_status s = TSR_OK;
  pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
  if (!cc) return TSR_ERROR(TSR_ENOMEM, "tokenizer %s: %s: out of memory", file, key);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  if (literal) {
    opts = PCRE2_UTF | PCRE2_LITERAL; /* PCRE2 takes no other options with a literal */
    if (!tok_buf_put(&src, pattern, len)) s = TSR_ENOMEM;
  } else {
    size_t bad;
    if (!translate(pattern, len, &src, &bad))
      s = TSR_ENOMEM;
    else if (bad != SIZE_MAX)
      s = TSR_ERROR(TSR_EINVAL,
                    "tokenizer %s: %s: the regex has \\%c inside a character class (offset %zu), "
                    "which has no PCRE2 equivalent; write the class without it",
                    file, key, pattern[bad + 1], bad);
  }
  if (s == TSR_ENOMEM) s = TSR_ERROR(TSR_ENOMEM, "tokenizer %s: %s: out of memory", file, key);
  if (s != TSR_OK) goto cleanup;
  int err;
  PCRE2_SIZE off;
  *out = pcre2_compile((PCRE2_SPTR)(src.p ? src.p : ""), src.n, opts, &err, &off, cc);
  if (!*out) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    s = TSR_ERROR(TSR_EINVAL,
                  "tokenizer %s: %s: the regex does not compile: %s (at offset %zu of the "
                  "pattern as PCRE2 reads it: %.*s)",
                  file, key, (const char *)msg, (size_t)off, (int)(src.n > 200 ? 200 : src.n),
                  src.p ? src.p : "");
    goto cleanup;
  }
  /* The JIT makes matching several times faster; without it (an architecture PCRE2 has no JIT
   * for) the interpreter gives the same matches. */
  (void)pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
cleanup:
  pcre2_compile_context_free(cc);
  tok_buf_free(&src);
  return s;
}
