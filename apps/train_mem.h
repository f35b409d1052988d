/* Per-rank training state: parameters, gradients and AdamW moments, as `tessera plan` predicts
 * them (by building each rank's model) and as `tessera run` measures them (from the live
 * tensors after the first optimizer step). Activations and communication buffers are not state:
 * the run's per-step "peak" covers them. */
#ifndef TESSERA_APP_TRAIN_MEM_H
#define TESSERA_APP_TRAIN_MEM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "train.h"

/* Bytes one rank holds. */
typedef struct tsr_train_mem {
  int64_t params; /* local parameter shards */
  int64_t grads;  /* local gradient shards */
  int64_t optim;  /* AdamW exp_avg + exp_avg_sq */
} tsr_train_mem;

/* What this rank holds now (call after an optimizer step, when gradients and moments exist). */
tsr_train_mem tsr_train_mem_measure(tsr_train_rank *t);

/* Builds every rank's model, one rank at a time so only one rank's parameters exist at once, and
 * fills per_rank[world]: parameters as built, gradients placed like their parameters, AdamW two
 * moments each. When `params_text` is not NULL it receives rank 0's parameter table (name,
 * global and local shape, placement per mesh dim; malloc'd, NULL if it could not be made).
 * Models above TSR_TRAIN_MEM_PLAN_MAX_PARAMS are not built (TSR_ENOTSUP). */
#define TSR_TRAIN_MEM_PLAN_MAX_PARAMS (256LL * 1024 * 1024)
tsr_status tsr_train_mem_plan(const tsr_app_job *job, tsr_train_mem *per_rank, char **params_text);

/* For a per-rank table whose alike ranks share a line: prints "  rank R" and ",Q" for each later
 * rank Q not yet `done` that same(ctx, R, Q) finds alike (up to 15, then "(+N more)"), and marks
 * those done. The caller skips done ranks and ends the line. `done` may be NULL: R alone. */
void tsr_train_rank_group(FILE *f, int r, int world, bool *done,
                          bool (*same)(const void *ctx, int a, int b), const void *ctx);

/* Prints the table: one line per group of ranks holding the same bytes, each against the state
 * one rank would hold for the whole model. `what` says "planned" or "measured". */
void tsr_train_mem_print(FILE *f, const tsr_app_job *job, const tsr_train_mem *per_rank,
                         const char *what);

/* The up-front memory check (mem_check.c), before any rank's model is built for the run: the
 * state of the ranks this process will run (all of them under `local`, one under mpi) against
 * the least of the machine's physical memory, the cgroup limit (v2 memory.max up the hierarchy,
 * v1 limit_in_bytes) and ulimit -v / -d less what the process maps already. At least one copy
 * of the model's state, shared evenly by every rank, must fit: else TSR_ENOMEM at once, naming
 * the ranks, the limit and the model's largest items, with nothing allocated. When at most a
 * copy per rank fits it passes; between the two, the exact figures of tsr_train_mem_plan
 * (models up to TSR_TRAIN_MEM_PLAN_MAX_PARAMS) decide, naming the largest rank. Activations are
 * not counted. `force` turns a refusal into a line on `note`. Device (cuda) jobs pass. */
tsr_status tsr_train_mem_check(const tsr_app_job *job, bool force, FILE *note);

/* Gathers every rank's measurement to the members of `all` (collective) into per_rank[world]. */
tsr_status tsr_train_mem_gather(tsr_group_t *all, const tsr_train_mem *mine,
                                tsr_train_mem *per_rank);

#endif
