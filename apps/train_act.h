/* Activation memory of a training step, predicted from the model's shapes, the placements the
 * job's plugins give its tensors and the pipeline schedule (train_act.c; docs/training.md,
 * "Activation memory"). Nothing is run: the step's tape is replayed as a list of byte counts. */
#ifndef TESSERA_APP_TRAIN_ACT_H
#define TESSERA_APP_TRAIN_ACT_H

#include <stdint.h>
#include <stdio.h>

#include "train.h"
#include "train_mem.h"

/* What one rank holds beyond its parameters and AdamW moments at the peak of its step. */
typedef struct tsr_train_act {
  int64_t peak;     /* bytes at the step's peak: tapes, gradients made so far and workspace */
  int64_t tape;     /* bytes one microbatch's tape holds when its forward has ended */
  int64_t layer;    /* of which the largest decoder layer's share */
  int64_t logits;   /* of which the logits (and their gradient at the start of the backward) */
  int64_t grads;    /* gradients alive at the peak (parameters' and activations') */
  int in_flight;    /* microbatches whose tapes are held at once (pipeline schedules) */
  int microbatches; /* forward / backward passes per optimizer step on this rank */
} tsr_train_act;

/* Fills out[world]: each rank's activation figure for the job's checkpointing mode, microbatches
 * and schedule. TSR_EINVAL when a pipeline schedule cannot be built. */
tsr_status tsr_train_act_plan(const tsr_app_job *job, tsr_train_act *out);

/* The predicted peak of a rank: parameters + AdamW moments + act->peak, or the state with every
 * gradient, whichever is larger (the optimizer step holds all gradients at once). */
int64_t tsr_train_act_total(const tsr_train_mem *state, const tsr_train_act *act);

/* Prints the activation table under plan's state table: one line per group of ranks alike. */
void tsr_train_act_print(FILE *f, const tsr_app_job *job, const tsr_train_mem *state,
                         const tsr_train_act *act);

/* [job] memory_limit in bytes (0: none); TSR_EINVAL naming file:line and the fix when it is not
 * a size. */
tsr_status tsr_train_memory_limit(const tsr_config *c, int64_t *bytes);

/* The pipeline owner's schedule (NULL without pp > 1), microbatches, stages_per_rank and
 * layers_per_stage (*n counts; 0 for an even split), as train_pipe.c reads them. */
tsr_status tsr_train_pipe_info(const tsr_app_job *job, const tsr_schedule **sched, int *mb,
                               int *spr, int *counts, int cap, int *n);

/* [job] memory_limit: TSR_ENOMEM naming the rank whose predicted peak exceeds the limit and its
 * largest items, the same message in plan and run; TSR_OK when no limit is set or all fit. */
tsr_status tsr_train_act_limit_check(const tsr_app_job *job, const tsr_train_mem *state,
                                     const tsr_train_act *act);

/* The state of a model too large for tsr_train_mem_plan to lay out: parameters split evenly over
 * the dims that split them (tp, dp_shard, the pipeline stages), gradients alike, two moments. */
void tsr_train_act_state_estimate(const tsr_app_job *job, tsr_train_mem *state);

/* The whole check of [job] memory_limit that plan and run make before anything runs: each rank's
 * state (laid out as tsr_train_mem_plan does, or split evenly for models too large for that)
 * and activations against the limit. TSR_OK without a limit. */
tsr_status tsr_train_act_check(const tsr_app_job *job);

#endif
