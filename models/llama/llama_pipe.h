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

/* What a rank did when, for traces: kind is a tsr_pipe_action_kind, chunk the model chunk on the
 * rank (stage chunk * pp + the rank's pp index), times in seconds. */
typedef struct tsr_pipe_event {
  int kind;
  int microbatch;
  int chunk;
  double t0, t1;
} tsr_pipe_event;

typedef struct tsr_pipe_result {
  double loss;        /* the batch's mean loss, on every rank (broadcast along pp) */
  tsr_tensor *logits; /* want_logits: (rows, seq, V), untracked, on every rank; else NULL */
  int stage;          /* this rank's pp index (its first stage) */
  int peak_in_flight; /* most (microbatch, chunk) activation sets held at once */
  int nevents;
  tsr_pipe_event *events; /* (nevents) this rank's actions; the caller frees it */
} tsr_pipe_result;

/* One step of `sched` with `microbatches` microbatches over the (rows, seq) i32 batch `ids` /
 * `labels` (host arrays every rank holds). `job_mesh` is the mesh the model was built on; the
 * microbatches take rows as evenly as possible, earlier ones the extra row. The schedule is
 * built for pp ranks with tsr_llama_stages_per_rank(m) chunks each; its forwards and backwards
 * run in its order, and the transfers between stages are derived from its simulated timeline
 * (see llama_pipe.c), so any schedule whose timeline finishes runs without deadlock. With train,
 * parameter gradients are accumulated (not reset). Collective over the job mesh. */
tsr_status tsr_llama_pipe_step(tsr_llama_t *m, const tsr_mesh_t *job_mesh,
                               const tsr_schedule *sched, int microbatches, const int32_t *ids,
                               const int32_t *labels, int64_t rows, int64_t seq, bool train,
                               bool want_logits, tsr_pipe_result *res);
void tsr_pipe_result_free(tsr_pipe_result *res);
/* Document masking under a pipeline: host segment ids and positions (rows, seq), aligned with
 * the ids of the following tsr_llama_pipe_step calls; each stage makes its microbatch's leaves
 * from them (tsr_llama_set_documents). NULL, NULL: causal. */
tsr_status tsr_llama_pipe_documents(tsr_llama_t *m, const int32_t *seg, const int32_t *pos);

/* A schedule's simulated timeline: each rank runs its compute actions in list order, a forward
 * waits for the previous stage's forward of the microbatch, a backward (or its input part) for
 * the next stage's, a weight part for its own input part; transfers are free. Durations: forward
 * tf, backward tb, each half of a split backward tb / 2. */
typedef struct tsr_pipe_timeline {
  int stages, chunks, microbatches; /* pp ranks, chunks per rank */
  int *nops;                        /* (stages) */
  tsr_pipe_event **ops;             /* (stages)(nops[s]) compute actions, simulated times */
  double span;                      /* end of the last action */
  double bubble;                    /* 1 - busy / (stages x span) */
} tsr_pipe_timeline;

/* Builds the schedule's lists for every rank, checks them (each microbatch and chunk forwarded
 * once and, with train, backwarded once, whole or as an input part followed by a weight part;
 * without train the backward actions are dropped) and simulates them. TSR_EINVAL with the reason
 * when a list is malformed or the lists wait on each other forever. */
tsr_status tsr_pipe_timeline_build(const tsr_schedule *sched, int stages, int chunks,
                                   int microbatches, bool train, double tf, double tb,
                                   tsr_pipe_timeline *out);
void tsr_pipe_timeline_free(tsr_pipe_timeline *tl);

/* The bubble fraction of the schedule's training timeline (and its span, when given), or a
 * negative value when it fails to build or would never finish. */
double tsr_pipe_simulate(const tsr_schedule *sched, int stages, int chunks, int microbatches,
                         double tf, double tb, double *span);
/* Writes the simulated training timeline (tf = 1, tb = 2) as text, one row per rank: F forward,
 * B backward, I and W the input and weight parts of a split backward, each followed by the
 * microbatch (mod 10) and, with several chunks, the chunk. */
void tsr_pipe_print_timeline(const tsr_schedule *sched, int stages, int chunks, int microbatches,
                             FILE *f);

#ifdef __cplusplus
}
#endif
#endif
