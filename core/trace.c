/* Traces (tessera/trace.h): a thread-local pointer to the trace a thread records into, and the
 * core's own events (ops, communication) through trace_impl.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace_impl.h"

struct tsr_trace {
  int64_t n, alloc, cap, dropped;
  tsr_trace_event *events;
};

static _Thread_local tsr_trace *current;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

tsr_status tsr_trace_new(int64_t capacity, tsr_trace **out) {
  *out = NULL;
  if (capacity < 1) return TSR_ERROR(TSR_EINVAL, "trace: capacity %lld < 1", (long long)capacity);
  tsr_trace *t = calloc(1, sizeof *t);
  if (!t) return TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
  t->cap = capacity;
  *out = t;
  return TSR_OK;
}

void tsr_trace_free(tsr_trace *t) {
  if (!t) return;
  if (current == t) current = NULL;
  free(t->events);
  free(t);
}

void tsr_trace_attach(tsr_trace *t) {
  current = t;
}

int64_t tsr_trace_clock(void) {
  return current ? now_ns() : -1;
}

/* The next slot of the calling thread's trace, or NULL when it keeps no more. */
static tsr_trace_event *next_slot(void) {
  tsr_trace *t = current;
  if (t->n == t->cap) {
    t->dropped++;
    return NULL;
  }
  if (t->n == t->alloc) {
    /* grow by doubling up to the capacity; a failed growth drops the event */
    int64_t want = t->alloc ? 2 * t->alloc : 256;
    if (want > t->cap) want = t->cap;
    tsr_trace_event *e = realloc(t->events, (size_t)want * sizeof *e);
    if (!e) {
      t->dropped++;
      return NULL;
    }
    t->events = e;
    t->alloc = want;
  }
  tsr_trace_event *e = &t->events[t->n++];
  memset(e, 0, sizeof *e);
  e->a = e->b = -1;
  return e;
}

void tsr_trace_add_span(const char *cat, const char *name, int64_t t0_ns, int64_t t1_ns, int64_t a,
                        int64_t b) {
  if (!current || t0_ns < 0) return;
  tsr_trace_event *e = next_slot();
  if (!e) return;
  e->t0_ns = t0_ns;
  e->t1_ns = t1_ns;
  e->cat = cat;
  e->name = name;
  e->a = a;
  e->b = b;
}

void tsr_trace_add(const char *cat, const char *name, int64_t t0_ns, int64_t a, int64_t b) {
  if (!current || t0_ns < 0) return;
  tsr_trace_add_span(cat, name, t0_ns, now_ns(), a, b);
}

void tsr_trace_op(const char *op, const char *pass, int64_t t0_ns) {
  if (!current || t0_ns < 0) return;
  int64_t t1 = now_ns();
  tsr_trace_event *e = next_slot();
  if (!e) return;
  e->t0_ns = t0_ns;
  e->t1_ns = t1;
  e->cat = "op";
  e->name = op ? op : "?";
  e->pass = pass;
}

void tsr_trace_comm(const char *call, const char *group, int64_t t0_ns, uint64_t bytes) {
  if (!current || t0_ns < 0) return;
  int64_t t1 = now_ns();
  tsr_trace_event *e = next_slot();
  if (!e) return;
  e->t0_ns = t0_ns;
  e->t1_ns = t1;
  e->cat = "comm";
  e->name = call;
  snprintf(e->group, sizeof e->group, "%s", group ? group : "");
  e->bytes = (int64_t)bytes;
}

int64_t tsr_trace_count(const tsr_trace *t) {
  return t ? t->n : 0;
}

const tsr_trace_event *tsr_trace_event_at(const tsr_trace *t, int64_t i) {
  return t && i >= 0 && i < t->n ? &t->events[i] : NULL;
}

int64_t tsr_trace_dropped(const tsr_trace *t) {
  return t ? t->dropped : 0;
}
