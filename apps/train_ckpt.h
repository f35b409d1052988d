/* Periodic sharded checkpoints of a training run ([checkpoint] dir, every, keep_last; load =
 * latest or a checkpoint folder): every rank writes the shards it holds, and loads onto any mesh
 * read only the slices each rank needs (docs/training.md, "Sharded checkpoints"). */
#ifndef TESSERA_APP_TRAIN_CKPT_H
#define TESSERA_APP_TRAIN_CKPT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "train.h"

/* The cross-checks of dir, every, keep_last and load = latest (TSR_EINVAL naming the key and
 * the fix): part of the job's file checks, so `plan` refuses what `run` would. */
tsr_status tsr_train_ckpt_check(const tsr_config *c);

/* True when [checkpoint] load is `latest` or a sharded checkpoint folder (one with index.json). */
bool tsr_train_ckpt_wants_load(const tsr_config *c);

/* Loads the sharded checkpoint [checkpoint] load names (with `latest`, the newest complete
 * folder of [checkpoint] dir; none there is a fresh start) into this rank's parameters, AdamW
 * moments and step, reading only the slices of the files that its shards intersect. */
tsr_status tsr_train_ckpt_load(tsr_train_rank *t, bool *resumed);

/* Whether a periodic save follows step `step` ([checkpoint] every; the last step is saved by
 * the caller after the loop). */
bool tsr_train_ckpt_due(const tsr_config *c, int64_t step);

/* Saves the state after optimizer step `step` to [checkpoint] dir/step-NNNNNN: every rank writes
 * the slices it is the lowest rank to hold, in parallel, into a temporary folder that rank 0
 * completes with the index and renames into place, then prunes to keep_last. Rank 0 logs the
 * time and each rank's memory during the save to `out`. Collective over `all`. */
tsr_status tsr_train_ckpt_save(tsr_train_rank *t, tsr_group_t *all, int64_t step, FILE *out);

#endif
