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
 * completes with the index and renames into place, then prunes to keep_last. A save still under
 * way in the background completes first. With [checkpoint] async and not `last` (the run's last
 * save), every rank copies its slices to host memory and a thread writes them while the run goes
 * on: tsr_train_ckpt_pending completes that save. Rank 0 logs the time and each rank's memory
 * during the save to `out`. Collective over `all`. */
tsr_status tsr_train_ckpt_save(tsr_train_rank *t, tsr_group_t *all, int64_t step, bool last,
                               FILE *out);
/* [checkpoint] async: when every rank's background write has ended (with `wait`, after waiting
 * for them), rank 0 writes the index and renames the folder into place; a write that failed on
 * any rank is this call's error on every rank, and its folder is removed. Nothing to do (and no
 * communication) without a save under way, which is the same on every rank. Collective. */
tsr_status tsr_train_ckpt_pending(tsr_train_rank *t, tsr_group_t *all, bool wait, FILE *out);
/* [checkpoint] async: makes this rank's host buffers for the snapshots before the first step, so
 * that no save pays for them (nothing to do without async). */
tsr_status tsr_train_ckpt_async_begin(tsr_train_rank *t);
/* Waits for a background write under way, dropping it, and frees the snapshot (any path out of
 * the run; the folder it was writing stays a temporary that no load takes). */
void tsr_train_ckpt_async_free(tsr_train_rank *t);

#endif
