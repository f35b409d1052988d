/* Running a pipeline schedule over the Llama model's stages.
 *
 * A schedule (tessera/registry.h) lists, for one stage, the order of its forwards, backwards and
 * transfers over the microbatches of one step. tsr_llama_pipe_step runs that list on this rank's
 * stage: each microbatch has its own tape, activations and their gradients travel between stages
 * by point-to-point messages, and parameter gradients accumulate over the microbatches, each
 * microbatch's loss weighted by its share of the step's valid tokens, so that the step equals the
 * step on the whole batch.
 */
#ifndef TESSERA_LLAMA_PIPE_H
#define TESSERA_LLAMA_PIPE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llama.h"
#include "tessera/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a rank did when, for traces: kind is a tsr_pipe_action_kind, times in seconds. */
typedef struct tsr_pipe_event {
  int kind;
  int microbatch;
  double t0, t1;
} tsr_pipe_event;

typedef struct tsr_pipe_result {
  double loss;        /* the batch's mean loss, on every rank (broadcast along pp) */
  tsr_tensor *logits; /* want_logits: (rows, seq, V), untracked, on every rank; else NULL */
  int stage;          /* this rank's stage */
  int peak_in_flight; /* most microbatches forwarded but not yet backwarded at once */
  int nevents;
  tsr_pipe_event *events; /* (nevents) this rank's actions; the caller frees it */
} tsr_pipe_result;

/* One step of `sched` with `microbatches` microbatches over the (rows, seq) i32 batch `ids` /
 * `labels` (host arrays every rank holds). `job_mesh` is the mesh the model was built on; the
 * microbatches take rows as evenly as possible, earlier ones the extra row. With train, parameter
 * gradients are accumulated (not reset). Collective over the job mesh. */
tsr_status tsr_llama_pipe_step(tsr_llama_t *m, const tsr_mesh_t *job_mesh,
                               const tsr_schedule *sched, int microbatches, const int32_t *ids,
                               const int32_t *labels, int64_t rows, int64_t seq, bool train,
                               bool want_logits, tsr_pipe_result *res);
void tsr_pipe_result_free(tsr_pipe_result *res);

/* The schedule's timeline with forward time tf and backward time tb per microbatch and free
 * transfers: each stage runs its actions in order, a forward waits for the previous stage's, a
 * backward for the next stage's. Writes, when the arrays are given, start[s * microbatches * 2 +
 * 2k + (0 forward, 1 backward)] and sets *span; returns the bubble fraction 1 - busy / (stages *
 * span), or a negative value when the schedule fails to build or would never finish. */
double tsr_pipe_simulate(const tsr_schedule *sched, int stages, int microbatches, double tf,
                         double tb, double *start, double *span);
/* Writes the simulated timeline (tf = 1, tb = 2) as text, one row per stage. */
void tsr_pipe_print_timeline(const tsr_schedule *sched, int stages, int microbatches, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
