/* Status codes, the per-rank last-error message and the check macros.
 *
 * Every library function that can fail returns a tsr_status and, on failure, leaves a message for
 * tsr_last_error(). Ranks of the `local` backend are threads, and each rank's work runs on its own
 * thread, so the message buffer is thread-local: one rank's error never overwrites another's.
 *
 * Library code never calls exit(). A broken internal invariant (a bug, not bad input) goes through
 * TSR_INVARIANT, whose handler can be replaced (tests replace it to observe the failure).
 */
#ifndef TESSERA_STATUS_H
#define TESSERA_STATUS_H

#include <stdarg.h>

#include "tessera/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsr_status {
  TSR_OK = 0,
  TSR_EINVAL = 1,    /* bad argument or bad input (file, shape, placement, key) */
  TSR_ENOTSUP = 2,   /* valid request that nothing implements (no sharding rule, no backend) */
  TSR_ENOMEM = 3,    /* an allocation failed */
  TSR_EIO = 4,       /* a file could not be read or written */
  TSR_ECOMM = 5,     /* a collective failed: mismatch between ranks, peer failure */
  TSR_ETIMEDOUT = 6, /* a collective or receive waited longer than the job's timeout */
  TSR_EPLUGIN = 7,   /* a plugin failed to load, validate or initialise */
  TSR_EINTERNAL = 8, /* a broken invariant reported instead of aborting */
  TSR_ENUMERIC = 9,  /* a value that must be finite is NaN or Inf (a diverged run) */
} tsr_status;

/* Short name of a status, e.g. "EINVAL". Never NULL. */
TSR_API const char *tsr_status_name(tsr_status s);

/* The message left by the last failing call on this thread (this rank), or "" if none. */
TSR_API const char *tsr_last_error(void);

/* Clears this thread's last-error message. */
TSR_API void tsr_clear_error(void);

/* Records a formatted message as this thread's last error and returns `s`, so that error paths
 * read `return tsr_error(TSR_EINVAL, "...", ...)`. The message is prefixed with file:line when
 * called through TSR_ERROR. */
TSR_API tsr_status tsr_error(tsr_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
TSR_API tsr_status tsr_error_at(tsr_status s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prepends "prefix: " to this thread's last error (used when a lower layer's message needs the
 * caller's context, e.g. the rank id or the tensor name). Returns `s`. */
TSR_API tsr_status tsr_error_prefix(tsr_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Invariant handler: called with the failing expression and location. The default prints to
 * stderr and aborts; a replacement may longjmp or record and return (the macro then returns
 * TSR_EINTERNAL from the enclosing function). */
typedef void (*tsr_invariant_handler)(const char *expr, const char *file, int line);
TSR_API tsr_invariant_handler tsr_set_invariant_handler(tsr_invariant_handler h);
TSR_API void tsr_invariant_failed(const char *expr, const char *file, int line);

#define TSR_ERROR(s, ...) tsr_error_at((s), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a failing status to the caller. */
#define TSR_CHECK(call)                                                                            \
  do {                                                                                             \
    tsr_status tsr_check_s_ = (call);                                                              \
    if (tsr_check_s_ != TSR_OK) return tsr_check_s_;                                               \
  } while (0)

/* Record a failing status in `st` and jump to the enclosing function's `cleanup:` label. */
#define TSR_CHECK_GOTO(call, st)                                                                   \
  do {                                                                                             \
    (st) = (call);                                                                                 \
    if ((st) != TSR_OK) goto cleanup;                                                              \
  } while (0)

/* A broken invariant: a bug in Tessera or a plugin, never a user error. */
#define TSR_INVARIANT(cond)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      tsr_invariant_failed(#cond, __FILE__, __LINE__);                                             \
      return TSR_ERROR(TSR_EINTERNAL, "invariant violated: %s", #cond);                            \
    }                                                                                              \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
