/* [job] on_nonfinite: what a step whose loss or gradient norm is NaN or Inf does. Every rank
 * holds the same loss and norm, so every rank takes the same branch at the same step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/breadcrumb.h"
#include "tessera/device.h"
#include "train.h"

/* TESSERA_TEST_NONFINITE=STEP:loss:K: microbatch K's loss of step STEP, as the hook has it. */
static double test_loss(int64_t part, double loss) {
  const char *env = getenv("TESSERA_TEST_NONFINITE");
  if (!env || !*env) return loss;
  char *end = NULL;
  long long at = strtoll(env, &end, 10);
  if (at != tsr_breadcrumb_here()->step || strncmp(end, ":loss:", 6)) return loss;
  return strtoll(end + 6, NULL, 10) == part ? NAN : loss;
}

double tsr_train_part_loss(tsr_train_rank *t, int64_t part, double loss) {
  loss = test_loss(part, loss);
  if (!isfinite(loss) && t->bad_parts++ == 0) t->bad_part = part;
  return loss;
}

/* The index of the first parameter, in the model's order, whose gradient holds a NaN or an Inf
 * on any rank; -1 when none does. Collective over `all`. */
static tsr_status first_nonfinite(tsr_train_rank *t, tsr_group_t *all, int *first) {
  int32_t mine = 0, worst = 0; /* nparams - index: the reduction takes the maximum */
  for (int i = 0; i < t->nparams && !mine; i++) {
    const tsr_dtensor *g = t->params[i]->grad;
    if (!g || !g->local || !tsr_tensor_numel(g->local)) continue;
    double s = tsr_kernel_table_of(g->local)->sum_squares(tsr_tensor_data(g->local),
                                                          tsr_tensor_numel(g->local));
    if (!isfinite(s)) mine = t->nparams - i;
  }
  TSR_CHECK(tsr_comm_all_reduce(all, &mine, &worst, 1, TSR_I32, TSR_REDUCE_MAX));
  *first = worst ? t->nparams - worst : -1;
  return TSR_OK;
}

tsr_status tsr_train_nonfinite(tsr_train_rank *t, tsr_group_t *all, tsr_tape_t *tape, int64_t step,
                               const char *what, double value, bool *skip) {
  const tsr_config *c = t->job->cfg;
  bool train = c->job.mode == TSR_MODE_TRAIN;
  *skip = false;
  /* the loss went bad before the gradients were resolved: resolve them to find the first bad
   * one, as the update would have seen them */
  if (train && tape) {
    for (int i = 0; i < t->nopt; i++) {
      tsr_status st = tsr_var_resolve_grad(tape, t->params[i]);
      if (st != TSR_OK) return tsr_error_prefix(st, "gradient of %s", t->params[i]->name);
    }
    TSR_CHECK(tsr_train_tied_grad_sync(t));
  }
  int first = -1;
  if (train) TSR_CHECK(first_nonfinite(t, all, &first));
  /* the rows of the step's batch: those of the first microbatch whose loss went bad, or all of
   * them when the loss was finite and a gradient was not */
  int64_t accum = train ? c->optimizer.grad_accum_steps : 1, rows = c->data.batch_size / accum;
  char where[320];
  if (t->bad_parts && accum > 1)
    snprintf(where, sizeof where, "rows %lld-%lld of the step's batch (microbatch %lld of %lld%s)",
             (long long)(t->bad_part * rows), (long long)((t->bad_part + 1) * rows - 1),
             (long long)t->bad_part + 1, (long long)accum,
             t->bad_parts > 1 ? ", and others after it" : "");
  else
    snprintf(where, sizeof where, "rows 0-%lld of the step's batch",
             (long long)c->data.batch_size - 1);
  char tensor[600];
  if (first >= 0)
    snprintf(tensor, sizeof tensor, "; the first non-finite gradient is %s", t->names[first]);
  else if (train)
    snprintf(tensor, sizeof tensor, "; no gradient holds a NaN or an Inf%s",
             tape ? "" : " (their norm overflowed)");
  else
    tensor[0] = '\0';
  const char *val = isnan(value) ? "NaN" : value > 0 ? "Inf" : "-Inf";
  t->bad_parts = 0;
  if (!train || tsr_config_ext_of(c)->job.on_nonfinite == TSR_NONFINITE_STOP)
    return tsr_error(TSR_ENUMERIC,
                     "step %lld: the %s is %s on %s%s: the run diverged and stops; no checkpoint "
                     "is written. Lower [optimizer] lr, raise warmup_steps or set max_norm, check "
                     "[optimizer] eps and the checkpoint loaded, resume from the last checkpoint, "
                     "or set [job] on_nonfinite = skip_step to skip such steps",
                     (long long)step, what, val, where, tensor);
  /* skip_step: no update, no hooks; the step is taken all the same (the data, the schedule and
   * AdamW's step counter move on), so a checkpoint and a resume stay in step */
  snprintf(t->skipped, sizeof t->skipped, "step %lld: the %s is %s on %s%s: update skipped",
           (long long)step, what, val, where, tensor);
  for (int i = 0; i < t->nopt; i++) tsr_var_zero_grad(t->params[i]);
  tsr_adamw_set_step(t->opt, step);
  *skip = true;
  return TSR_OK;
}

tsr_status tsr_train_test_poison(tsr_train_rank *t, int64_t step) {
  const char *env = getenv("TESSERA_TEST_NONFINITE");
  if (!env || !*env) return TSR_OK;
  char *colon = NULL;
  long long at = strtoll(env, &colon, 10);
  if (at != step || !colon || *colon != ':') return TSR_OK;
  for (int i = 0; i < t->nparams; i++) {
    tsr_dtensor *g = t->params[i]->grad;
    if (strcmp(t->names[i], colon + 1) || !g || !g->local) continue;
    tsr_kernel_table_of(g->local)->scale(tsr_tensor_data(g->local), tsr_tensor_numel(g->local),
                                         NAN);
  }
  return TSR_OK;
}
