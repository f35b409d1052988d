/* Per-thread last-error message and the invariant hook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "status_impl.h"

#define TSR_ERROR_LEN 2048

/* Thread-local because a rank is a thread: each rank reads back only its own failures. */
static _Thread_local char last_error[TSR_ERROR_LEN];
/* When last_error was written, for ordering the failures of several ranks (status_impl.h). */
static _Thread_local uint64_t last_error_ns;

static void stamp(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  /* never 0, which means "no error" */
  last_error_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + 1;
}

uint64_t tsr_last_error_ns(void) {
  return last_error_ns;
}

static void default_invariant_handler(const char *expr, const char *file, int line) {
  fprintf(stderr, "tessera: invariant violated at %s:%d: %s\n", file, line, expr);
  abort();
}

/* Process-wide by design: the handler is a debugging policy, not rank state. Written only by
 * tsr_set_invariant_handler before ranks start. */
static tsr_invariant_handler invariant_handler = default_invariant_handler;

const char *tsr_status_name(tsr_status s) {
  switch (s) {
    case TSR_OK:
      return "OK";
    case TSR_EINVAL:
      return "EINVAL";
    case TSR_ENOTSUP:
      return "ENOTSUP";
    case TSR_ENOMEM:
      return "ENOMEM";
    case TSR_EIO:
      return "EIO";
    case TSR_ECOMM:
      return "ECOMM";
    case TSR_ETIMEDOUT:
      return "ETIMEDOUT";
    case TSR_EPLUGIN:
      return "EPLUGIN";
    case TSR_EINTERNAL:
      return "EINTERNAL";
    case TSR_ENUMERIC:
      return "ENUMERIC";
  }
  return "E?";
}

const char *tsr_last_error(void) {
  return last_error;
}

void tsr_clear_error(void) {
  last_error[0] = '\0';
  last_error_ns = 0;
}

tsr_status tsr_error(tsr_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  stamp();
  return s;
}

tsr_status tsr_error_at(tsr_status s, const char *file, int line, const char *fmt, ...) {
  /* Only the basename: full build paths make messages unreadable. */
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(last_error, sizeof last_error, "%s:%d: ", base, line);
  if (n < 0 || (size_t)n >= sizeof last_error) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  stamp();
  return s;
}

tsr_status tsr_error_prefix(tsr_status s, const char *fmt, ...) {
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(prefix, sizeof prefix - 2, fmt, ap);
  va_end(ap);
  if (n < 0) return s;
  size_t plen = strlen(prefix), old = strlen(last_error);
  memcpy(prefix + plen, ": ", 3);
  plen += 2;
  /* When both do not fit, the old message is cut at its end: the prefix is the context. */
  if (plen + old >= TSR_ERROR_LEN) old = TSR_ERROR_LEN - 1 - plen;
  memmove(last_error + plen, last_error, old);
  memcpy(last_error, prefix, plen);
  last_error[plen + old] = '\0';
  return s;
}

tsr_invariant_handler tsr_set_invariant_handler(tsr_invariant_handler h) {
  tsr_invariant_handler old = invariant_handler;
  invariant_handler = h ? h : default_invariant_handler;
  return old;
}

void tsr_invariant_failed(const char *expr, const char *file, int line) {
  invariant_handler(expr, file, line);
}
