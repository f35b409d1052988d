/* Traces: timed events of one rank, for a Chrome trace / Perfetto timeline ([output] trace).
 *
 * A trace records the events of the threads attached to it (tsr_trace_attach; under the `local`
 * backend a rank is one thread). While a thread is attached, the core adds on its own:
 *   - "op"    every op's forward (tessera/ops.h) and every tape node's backward, named by the op
 *             ("linear", "sdpa", ...), with the pass;
 *   - "comm"  every collective and point-to-point call that moves data (a group of one moves
 *             none), named by the call ("all_reduce", "send", ...), with the group's label (its
 *             mesh dims, e.g. "dp" or "dp+tp") and the bytes this member sent.
 * The program adds its own (steps, phases of a step, pipeline actions) with tsr_trace_add. A
 * thread that is not attached pays one thread-local load per op and per call.
 *
 * Events are kept in memory up to the trace's capacity; later ones are counted, not kept.
 */
#ifndef TESSERA_TRACE_H
#define TESSERA_TRACE_H

#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_trace tsr_trace;

typedef struct tsr_trace_event {
  int64_t t0_ns, t1_ns; /* CLOCK_MONOTONIC */
  const char *cat;      /* "op", "comm", or the program's; a string that outlives the trace */
  const char *name;     /* the op or call, or the program's; outlives the trace, as cat */
  const char *pass;     /* op: "forward" or "backward"; else NULL */
  char group[48];       /* comm: the group's label, cut to fit; else "" */
  int64_t bytes;        /* comm: bytes this member sent; else 0 */
  int64_t a, b;         /* the program's two numbers (tsr_trace_add); -1 for the core's */
} tsr_trace_event;

/* A trace that keeps at most `capacity` events (>= 1). */
TSR_API tsr_status tsr_trace_new(int64_t capacity, tsr_trace **out);
/* NULL is a no-op. Detach every thread first. */
TSR_API void tsr_trace_free(tsr_trace *t);
/* From now on the calling thread's events go to `t`; NULL stops recording. */
TSR_API void tsr_trace_attach(tsr_trace *t);
/* The time in ns (CLOCK_MONOTONIC) when the calling thread is attached, -1 otherwise: take it
 * before the work, give it to tsr_trace_add after. */
TSR_API int64_t tsr_trace_clock(void);
/* Adds an event from t0_ns to now to the calling thread's trace: category `cat`, name `name`
 * (both must outlive the trace), the program's numbers `a` and `b`. No-op when the thread is
 * not attached or t0_ns < 0. */
TSR_API void tsr_trace_add(const char *cat, const char *name, int64_t t0_ns, int64_t a, int64_t b);
/* As tsr_trace_add, with both ends given (events measured elsewhere). */
TSR_API void tsr_trace_add_span(const char *cat, const char *name, int64_t t0_ns, int64_t t1_ns,
                                int64_t a, int64_t b);

/* The events kept, in the order they ended; and how many were not kept (past the capacity). */
TSR_API int64_t tsr_trace_count(const tsr_trace *t);
TSR_API const tsr_trace_event *tsr_trace_event_at(const tsr_trace *t, int64_t i);
TSR_API int64_t tsr_trace_dropped(const tsr_trace *t);

#ifdef __cplusplus
}
#endif
#endif
