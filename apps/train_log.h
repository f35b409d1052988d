/* The training log: the start-up header, one line per step on rank 0 and the run's summary. */
#ifndef TESSERA_APP_TRAIN_LOG_H
#define TESSERA_APP_TRAIN_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app.h"
#include "llama.h"

typedef struct tsr_train_log {
  FILE *out;
  bool progress; /* a terminal: one line rewritten in place, with an ETA */
  bool json;
  double peak_gflops; /* measured sgemm peak; <= 0 when not measured */
  int peak_threads;
  int64_t nparams;
  double flops_per_token; /* training: forward + backward */
  int64_t tokens_per_step;
  int64_t first_step, end_step;
  double t_begin;
  char comm[512]; /* "dp 1.2 MiB, tp 3.4 MiB" for the step being logged */
  double loss_first, loss_last, secs_total;
  int64_t steps_done;
  /* [output] metrics (train_metrics.c): the JSON Lines file, NULL without one; the lines a
   * resumed run kept; whether a write failed (said at the end) */
  FILE *metrics;
  int64_t metrics_kept;
  bool metrics_failed;
  /* [output] tensorboard (train_tboard.c): the event file, NULL without one */
  struct tsr_train_tboard *tboard;
} tsr_train_log;

/* What one step measured. */
typedef struct tsr_train_step_stats {
  int64_t step;
  double loss, lr, grad_norm;
  double secs;
  int64_t peak_bytes;     /* allocator peak, max over ranks */
  int64_t peak_bytes_min; /* allocator peak, min over ranks */
  bool train;
  const char *skipped; /* [job] on_nonfinite = skip_step: why the update was skipped; or NULL */
} tsr_train_step_stats;

/* FLOPs of training on one token, as docs/design.md §8 counts them: 6·N + 6·L·h·s, with N the
 * parameters that take part in matrix products (the input embedding is a lookup, so it counts
 * only when tied to the output projection). */
double tsr_train_flops_per_token(const tsr_llama_config *m, int64_t seq_len);

void tsr_train_log_header(tsr_train_log *l, const tsr_app_job *job, int threads);
/* resumed_at < 0: a fresh start (or a weights-only load). */
void tsr_train_log_resume(tsr_train_log *l, const tsr_config *c, int64_t resumed_at);
void tsr_train_log_begin(tsr_train_log *l, int64_t start_step, int64_t end_step);
/* Records this step's bytes per mesh-dim label from rank 0's counters. */
void tsr_train_log_comm(tsr_train_log *l, const tsr_comm_t *comm);
void tsr_train_log_step(tsr_train_log *l, const tsr_train_step_stats *s);
void tsr_train_log_end(tsr_train_log *l);
/* [output] metrics: makes the file (a resumed run, at `start_step` > 0, keeps the lines of the
 * steps up to it) and keeps it open in l->metrics; tsr_train_log_step and tsr_train_log_eval
 * append a line each. Close syncs it and reports a write that failed. Rank 0 only. */
tsr_status tsr_train_metrics_open(tsr_train_log *l, const tsr_config *c, int64_t start_step);
tsr_status tsr_train_metrics_close(tsr_train_log *l, const tsr_config *c);

/* [output] tensorboard (train_tboard.c). Check: the folder is one, or absent with its parent
 * there (TSR_EINVAL naming the key and the fix; part of the job's file checks). Open makes the
 * folder when absent and a new events.out.tfevents.TIME.HOST in it, and keeps it in l->tboard;
 * tsr_train_log_step and tsr_train_log_eval add an event each. Close syncs it and reports a
 * write that failed. Rank 0 only. */
typedef struct tsr_train_tboard tsr_train_tboard;
tsr_status tsr_train_tboard_check(const tsr_config *c);
tsr_status tsr_train_tboard_open(tsr_train_log *l, const tsr_config *c);
tsr_status tsr_train_tboard_close(tsr_train_log *l, const tsr_config *c);
/* One event of step `step` at `wall_time` (seconds since the epoch) with the `n` scalars; a value
 * that is not finite is left out, as the metrics write it null. */
void tsr_train_tboard_scalars(tsr_train_log *l, int64_t step, double wall_time, int n,
                              const char *const *tags, const double *values);

/* One line (or JSON object) for an evaluation on held-out data. */
struct tsr_train_eval_result;
void tsr_train_log_eval(tsr_train_log *l, const struct tsr_train_eval_result *e);

#endif
