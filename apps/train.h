/* The training loop of `tessera run`: model, data, optimizer, checkpoints, dumps and the log. */
#ifndef TESSERA_APP_TRAIN_H
#define TESSERA_APP_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app.h"
#include "llama.h"
#include "llama_pipe.h"
#include "tessera/autograd.h"
#include "tessera/io.h"
#include "tessera/optim.h"
#include "tessera/rank.h"
#include "tessera/trace.h"

/* How `tessera run` drives the loop beyond what the job file says. */
typedef struct tsr_train_opts {
  int64_t stop_at;   /* stop after this optimizer step (the schedule still spans [job] steps);
                        0: run to [job] steps */
  bool progress;     /* one updating line with an ETA (a terminal) instead of plain lines */
  bool json;         /* one JSON object per step instead of the human line */
  double peak_secs;  /* length of the sgemm peak measurement; <= 0 skips it (MFU not shown) */
  FILE *out;         /* where rank 0 writes the log; NULL: stdout */
  int64_t dump_step; /* the optimizer step the dump is of; 0: the run's first */
} tsr_train_opts;

/* Cross-checks of the loop's keys that the parser cannot make alone (grad_accum_steps against
 * batch_size and dumps, the model's shape); TSR_EINVAL naming the key and the fix. Part of the
 * job's validation (tsr_app_job_open), so `plan` refuses what `run` would. */
tsr_status tsr_train_check_config(const tsr_config *c);

/* Runs the job (train or forward) on the local backend: measures the sgemm peak, sets the kernel
 * thread budget, starts the ranks and runs the loop on each. Errors inside a rank come back as
 * that rank's status with "rank R: ..." in the last error. */
tsr_status tsr_train_run(const tsr_app_job *job, const tsr_train_opts *opts);

/* The check `tessera plan` makes: the job's first step as `run` would take it (checkpoint load,
 * data, forward, backward, optimizer) on every rank, as threads of this process on the CPU
 * whatever the backend and device, writing no log, dump, trace or checkpoint. Fails as run's
 * first step would, with its message. */
tsr_status tsr_train_check_first_step(const tsr_app_job *job);

/* ---- Shared between the loop's files ---- */

/* The job's state on one rank. */
typedef struct tsr_train_rank {
  const tsr_app_job *job;
  const tsr_train_opts *opts;
  tsr_rank_t *r;
  tsr_llama_t *model;
  tsr_adamw_t *opt;
  int nparams;
  int nopt;           /* nparams, + 1 with the tied embedding's last-stage replica (pp > 1) */
  tsr_var **params;   /* (nopt) borrowed from the model; params[nparams] is that replica */
  const char **names; /* (nparams) borrowed from the model */
  int64_t start_step; /* optimizer steps already taken (from a resumed checkpoint) */
  /* Pipeline (mesh dim pp > 1): the schedule and microbatches its owner's section names; NULL
   * runs the model's ops in order instead. */
  const tsr_schedule *pipe;
  int microbatches;
  int peak_in_flight; /* most microbatches this rank held at once, over the run */
  tsr_trace *trace;   /* [output] trace: this rank's events (train_trace.c); NULL without */
  /* [job] on_nonfinite (train_guard.c): the step's microbatches whose loss was not finite (how
   * many, and the first), and the message of a skipped step, "" when none was */
  int64_t bad_parts, bad_part;
  char skipped[1024];
  /* [checkpoint] async (train_ckpt.c): the snapshot and writer of this rank's save; NULL until
   * the first */
  struct tsr_train_ckpt_async *ckpt_async;
  /* [data] mask = document (train_docs.c): the step's segment ids and positions; NULL without */
  struct tsr_train_docs *docs;
} tsr_train_rank;

/* The parameters as Hugging Face files name them (train_hf.c): n tensors, each a view of part of
 * one parameter's full tensor. */
typedef struct tsr_train_hf {
  int n;
  char **names;       /* (n) e.g. model.layers.0.block_sparse_moe.experts.3.w1.weight */
  tsr_tensor **views; /* (n) into the `full` tensors given; NULL where full[param] was NULL */
  int *param;         /* (n) the parameter each belongs to */
} tsr_train_hf;

/* Splits `full` (t->nparams full tensors, entries may be NULL; `full` itself may be NULL for the
 * names only) into the Hugging Face tensors. The views borrow full's storage: free them first. */
tsr_status tsr_train_hf_split(const tsr_train_rank *t, tsr_tensor *const *full, tsr_train_hf *h);
/* Hugging Face tensor j of parameter i: its name (into `name`) and, when `full` (the parameter's
 * full, contiguous tensor) is given, a view of its part of it in *view (NULL otherwise). */
tsr_status tsr_train_hf_view(const tsr_train_rank *t, int i, int j, const tsr_tensor *full,
                             char *name, size_t len, tsr_tensor **view);
void tsr_train_hf_free(tsr_train_hf *h);

/* True when one of the `n` labels is not the ignore index (-100): a microbatch without one has
 * no loss (NaN) and no gradient, and adds nothing to the step's loss. */
bool tsr_train_any_label(const int32_t *labels, int64_t n);

/* The model section of the job file as the model's config. */
tsr_llama_config tsr_train_model_config(const tsr_config *c);

/* `value` resolved against the job file's directory unless absolute, into buf. A buffer of
 * TSR_TRAIN_PATH_LEN holds any directory the config keeps and any value, so nothing is cut. */
#define TSR_TRAIN_PATH_LEN (TSR_MAX_PATH + TSR_MAX_VALUE)
const char *tsr_train_path(const tsr_config *cfg, const char *value, char *buf, size_t len);

/* Loads [checkpoint] load into the parameters and, when the optimizer file exists beside it,
 * the optimizer state and step (a resume). Every rank reads the files and keeps its shards. */
tsr_status tsr_train_load_checkpoint(tsr_train_rank *t, bool *resumed);
/* Saves the parameters and optimizer state to [checkpoint] save, gathered to full tensors and
 * written by rank 0. Collective. */
tsr_status tsr_train_save_checkpoint(tsr_train_rank *t);

typedef struct tsr_train_ckpt_async tsr_train_ckpt_async;

/* Builds this rank's model as the job lays it out: [model], [job] seed and, when the mesh has
 * pp > 1, the pipeline owner's stages_per_rank and layers_per_stage. */
tsr_status tsr_train_model_new(const tsr_app_job *job, tsr_rank_t *r, tsr_llama_t **out);

/* Pipeline support (train_pipe.c). Sets t->pipe and t->microbatches when the mesh has pp > 1:
 * the schedule named by [strategy.OWNER] schedule, OWNER being the plugin that owns pp. */
tsr_status tsr_train_pipe_setup(tsr_train_rank *t);
/* Prints the schedule's text timeline and bubble fraction for `tessera plan` (nothing without
 * pp > 1). */
void tsr_train_pipe_print_plan(const tsr_app_job *job, FILE *f);
/* After the last step: rank 0 prints each rank's peak of microbatches in flight to `out`.
 * Collective over `all`; no-op without a pipe. */
tsr_status tsr_train_pipe_finish(tsr_train_rank *t, tsr_group_t *all, FILE *out);

/* Dump contents collected on the first step; every tensor is full (gathered) and owned. */
typedef struct tsr_train_dump {
  int n, cap;
  char **names;
  tsr_tensor **tensors;
} tsr_train_dump;

/* Gathers x to a full tensor and appends it under `name` (rank 0 keeps it; others drop it).
 * Collective over x's mesh, or over the job's mesh when x lives on one pipeline stage. */
tsr_status tsr_train_dump_add(tsr_train_rank *t, tsr_train_dump *d, const char *name,
                              const tsr_dtensor *x);
/* Adds parameter i's `x` (its value or gradient) as "<prefix><name>" for each of its Hugging Face
 * tensors (tsr_train_hf_split): the stacked experts as one tensor per expert and weight. */
tsr_status tsr_train_dump_add_param(tsr_train_rank *t, tsr_train_dump *d, const char *prefix, int i,
                                    const tsr_dtensor *x);
/* Appends a tensor that is already full (ownership moves). */
tsr_status tsr_train_dump_add_full(tsr_train_dump *d, const char *name, tsr_tensor *full);
/* The logits of a batch run in `n` parts (microbatches, accumulation steps), concatenated along
 * the batch, and the batch's mean loss, as "logits" and "loss". Rank 0 only; `parts` stay the
 * caller's. */
tsr_status tsr_train_dump_add_batch(tsr_train_dump *d, tsr_tensor *const *parts, int n,
                                    double loss);
/* Rank 0 writes the dump to [output] dump. */
tsr_status tsr_train_dump_write(tsr_train_rank *t, tsr_train_dump *d);
void tsr_train_dump_free(tsr_train_dump *d);

/* Tied embeddings over pipeline stages: sums the embedding's and its replica's gradients
 * (tsr_llama_tied_grad_sync); no-op otherwise. Call after resolving every gradient. */
tsr_status tsr_train_tied_grad_sync(tsr_train_rank *t);
/* Global grad-norm clipping of the parameters to max_norm (<= 0: the norm only), counting the
 * tied weight once (the replica, params[nparams], is scaled alike but not counted). */
tsr_status tsr_train_clip_grads(tsr_train_rank *t, double max_norm, double *gnorm);

/* One optimizer step's forward (and backward) through the pipeline schedule, per accumulation
 * step: fills *loss with the batch's mean loss on every rank and, with a dump, adds the whole
 * batch's logits and the loss. */
tsr_status tsr_train_pipe_forward_backward(tsr_train_rank *t, int64_t step, const int32_t *ids,
                                           const int32_t *labels, bool train, tsr_train_dump *dump,
                                           double *loss);

/* [job] on_nonfinite (train_guard.c). Records that part `part` (microbatch or accumulation
 * step) of the step's batch had `loss`, a non-finite one for the message, and returns the loss
 * (NaN when the test hook below asks for it). */
double tsr_train_part_loss(tsr_train_rank *t, int64_t part, double loss);
/* The step's `what` ("loss" or "gradient norm") is `value`, not finite. Finds the first
 * parameter whose gradient is not finite (resolving the gradients first when `tape` is given:
 * the loss is checked before they are), then with on_nonfinite = stop (and in forward mode)
 * returns TSR_ENUMERIC naming the step, the batch rows and that parameter; with skip_step drops
 * the gradients, moves AdamW's step counter to `step` without an update, fills t->skipped with
 * the same facts, sets *skip and returns TSR_OK. Collective over `all`. */
tsr_status tsr_train_nonfinite(tsr_train_rank *t, tsr_group_t *all, tsr_tape_t *tape, int64_t step,
                               const char *what, double value, bool *skip);
/* Test hooks, TESSERA_TEST_NONFINITE in the environment: STEP:NAME makes the gradient of
 * parameter NAME NaN on every rank holding a part of it after step STEP's backward (here);
 * STEP:loss:K makes the loss of microbatch K (from 0) of step STEP NaN (tsr_train_part_loss). */
tsr_status tsr_train_test_poison(tsr_train_rank *t, int64_t step);

/* [output] trace (train_trace.c), for any mesh. A rank keeps at most this many events. */
#define TSR_TRAIN_TRACE_EVENTS 100000
/* With [output] trace, a trace that records the calling thread (the rank's) from now on. */
tsr_status tsr_train_trace_begin(tsr_train_rank *t);
/* Stops recording and frees the trace (after tsr_train_trace_write, or on failure). */
void tsr_train_trace_end(tsr_train_rank *t);
/* Stops recording; rank 0 gathers every rank's events and writes [output] trace, and says on
 * `out` how many events did not fit. Collective over `all`; no-op without a trace. */
tsr_status tsr_train_trace_write(tsr_train_rank *t, tsr_group_t *all, FILE *out);

/* SIGINT and SIGTERM (run_signals.c). Install makes the first of them ask the run to stop
 * after the current step and a second exit the process at once (exit 128 + the signal); `quiet`
 * silences the line each writes on stderr (the processes of an mpi job other than rank 0); a
 * stop that has not ended `grace` seconds after the first signal exits at once (0: no limit). */
void tsr_app_stop_install(bool quiet, double grace);
/* The first SIGINT or SIGTERM received, 0 before one. */
int tsr_app_stop_signal(void);
/* Whether any rank has received one, as its signal number (0: none), the same on every rank.
 * Collective over `all`: the ranks stop after the same step. */
tsr_status tsr_train_stop_agree(tsr_group_t *all, int *sig);
/* Rank 0 records that the run stopped after `step` of `end` on `sig`; tsr_app_stopped reads it
 * back once the ranks have returned (false when the run was not stopped). */
void tsr_app_stop_note(int sig, int64_t step, int64_t end);
bool tsr_app_stopped(int *sig, int64_t *step, int64_t *end);

/* [eval] (train_eval.c): the loss on held-out data. */
typedef struct tsr_train_eval {
  tsr_data_t *data; /* NULL: no evaluation */
  tsr_tape_t *tape; /* records nothing */
  int64_t every, batches;
  int64_t first; /* data position of the first held-out batch */
} tsr_train_eval;

typedef struct tsr_train_eval_result {
  int64_t step;            /* the optimizer step after which it ran */
  double loss, ppl;        /* mean of the batches' losses, and exp of it */
  int64_t batches, tokens; /* evaluated */
  double secs;
} tsr_train_eval_result;

/* The cross-checks of [eval]: a key that asks for evaluation without a source, evaluation in
 * forward mode. TSR_EINVAL naming the key and the fix. */
tsr_status tsr_train_eval_check(const tsr_config *c);
/* Opens [eval] source (nothing to do without one: ev->data stays NULL). */
tsr_status tsr_train_eval_open(tsr_train_rank *t, tsr_train_eval *ev);
void tsr_train_eval_close(tsr_train_eval *ev);
/* Whether an evaluation follows optimizer step `step` of a run that ends at `end`. */
bool tsr_train_eval_due(const tsr_train_eval *ev, int64_t step, int64_t end);
/* Runs ev->batches held-out batches forward on every rank (collective), in `ids` and `labels`
 * (room for one batch). The training data position is not touched. */
tsr_status tsr_train_eval_run(tsr_train_rank *t, tsr_train_eval *ev, int64_t step, int32_t *ids,
                              int32_t *labels, tsr_train_eval_result *out);

/* [data] mask = document (train_docs.c). open: the source reads its document index, t->docs
 * gets room for a batch (a no-op with mask = causal). fetch: after each tsr_data_next. begin /
 * end: the leaves of microbatch k, set on the model, around its forward and backward. pipe: the
 * host arrays from element `offset` for the next tsr_llama_pipe_step. */
tsr_status tsr_train_docs_open(tsr_train_rank *t, tsr_data_t *data);
/* The same for [eval] source (its token file's path + ".idx"); its batches' documents go
 * through t->docs too, which open makes first. */
tsr_status tsr_train_docs_open_eval(tsr_train_rank *t, tsr_data_t *data);
tsr_status tsr_train_docs_fetch(tsr_train_rank *t, const tsr_data_t *data);
tsr_status tsr_train_docs_begin(tsr_train_rank *t, int64_t k, tsr_var **seg, tsr_var **pos);
void tsr_train_docs_end(tsr_train_rank *t, tsr_var *seg, tsr_var *pos);
tsr_status tsr_train_docs_pipe(tsr_train_rank *t, int64_t offset);
void tsr_train_docs_free(tsr_train_rank *t);

#endif
