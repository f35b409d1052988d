/* The breadcrumb: what the calling thread is running, for crash reports.
 *
 * Every thread has one breadcrumb (thread-local, so under the `local` backend one per rank). The
 * core keeps it current, with no allocation and no lock:
 *   - `rank` is set when a rank starts (tsr_local_launch, tsr_rank_new);
 *   - `plugin`, `callback`, `name` and `phase` are set around every plugin callback the core
 *     invokes and put back afterwards (callbacks nest: a rule that redistributes runs a
 *     transition inside its own entry): op rule compute / backward / free_saved, redistribute
 *     transition match / apply, optimizer hooks, gradient hooks, pipeline schedule build, rank
 *     state setup / teardown, and the loader's validate / init / register_rules /
 *     check_registry / fini;
 *   - `op` and `op_pass` are set while an op's forward or a tape node's backward runs;
 *   - `step` and `microbatch` are set by the program's training loop (`tessera run` sets both,
 *     the pipeline executor sets the microbatch of each action it runs).
 * A fatal-signal handler reads the crashing thread's breadcrumb to say where it crashed:
 * tsr_breadcrumb_here is async-signal-safe (it returns the address of a thread-local struct) and
 * every string field is NULL or a string that lives as long as the loaded plugins. The library
 * installs no signal handler; `tessera run` does (docs/cli.md).
 */
#ifndef TESSERA_BREADCRUMB_H
#define TESSERA_BREADCRUMB_H

#include <stdint.h>

#include "tessera/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_breadcrumb {
  int rank;             /* global rank this thread runs; -1: none (before a launch, helpers) */
  int microbatch;       /* microbatch (accumulation step or pipeline microbatch); -1: none */
  int64_t step;         /* optimizer step being run, from 1; 0: before the first */
  const char *op;       /* op being run, e.g. "sdpa"; NULL: none */
  const char *op_pass;  /* "forward" or "backward" while `op` is set */
  const char *plugin;   /* plugin whose callback is running; NULL: none, or not known */
  const char *callback; /* its kind: "op rule", "redistribute transition", "optimizer hook",
                           "gradient hook", "schedule", "rank state", "init", ...; NULL: none */
  const char *name;     /* the callback's registered name, e.g. "cp_ring.sdpa"; may be NULL */
  const char *phase;    /* e.g. "forward", "backward", "match", "apply", "before step",
                           "ready", "build", "setup"; may be NULL */
} tsr_breadcrumb;

/* The calling thread's breadcrumb; never NULL. Async-signal-safe. */
TSR_API tsr_breadcrumb *tsr_breadcrumb_here(void);

/* Marks a plugin callback as running on this thread until tsr_breadcrumb_leave(&saved). */
typedef struct tsr_breadcrumb_saved {
  const char *plugin, *callback, *name, *phase;
} tsr_breadcrumb_saved;

static inline tsr_breadcrumb_saved tsr_breadcrumb_enter(const char *plugin, const char *callback,
                                                        const char *name, const char *phase) {
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  tsr_breadcrumb_saved s = {b->plugin, b->callback, b->name, b->phase};
  b->plugin = plugin;
  b->callback = callback;
  b->name = name;
  b->phase = phase;
  return s;
}

static inline void tsr_breadcrumb_leave(const tsr_breadcrumb_saved *s) {
  tsr_breadcrumb *b = tsr_breadcrumb_here();
  b->plugin = s->plugin;
  b->callback = s->callback;
  b->name = s->name;
  b->phase = s->phase;
}

#ifdef __cplusplus
}
#endif
#endif
