/* [eval]: the loss on held-out data, after every `every` optimizer steps and after the last,
 * from a data source of its own, so the training batches are the same with or without it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

/* With `synthetic` the held-out batches are streams of the same synthetic language that no
 * training step reaches ([job] steps is at most 1e9). */
#define EVAL_SYNTHETIC_FIRST ((int64_t)1 << 40)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether the job file or a --set gave [section] key (tsr_config_where names no line for a
 * default). */
static bool given(const tsr_config *c, const char *section, const char *key) {
  char where[TSR_MAX_PATH + 160], dflt[TSR_MAX_PATH + 160];
  tsr_config_where(c, section, key, where, sizeof where);
  snprintf(dflt, sizeof dflt, "%s: [%s] %s", c->path, section, key);
  return strcmp(where, dflt) != 0;
}

tsr_status tsr_train_eval_check(const tsr_config *c) {
  const tsr_config_ext *x = tsr_config_ext_of(c);
  if (x->eval.source[0] && c->job.mode != TSR_MODE_TRAIN)
    return tsr_config_error(c, TSR_EINVAL, "eval", "source",
                            "evaluates during training only, but [job] mode = forward; a forward "
                            "run is itself an evaluation: run it on the held-out data instead");
  if (x->eval.source[0]) return TSR_OK;
  /* never ignored: a key that asks for evaluation needs the data to evaluate on */
  if (given(c, "eval", "every") || given(c, "eval", "batches")) {
    const char *key = given(c, "eval", "every") ? "every" : "batches";
    return tsr_config_error(c, TSR_EINVAL, "eval", key,
                            "is set but [eval] source is empty: nothing would be evaluated; set "
                            "[eval] source to the held-out data (as [data] source)");
  }
  return TSR_OK;
}

tsr_status tsr_train_eval_open(tsr_train_rank *t, tsr_train_eval *ev) {
  const tsr_config *c = t->job->cfg;
  const tsr_config_ext *x = tsr_config_ext_of(c);
  memset(ev, 0, sizeof *ev);
  if (!x->eval.source[0]) return TSR_OK;
  ev->every = x->eval.every;
  ev->batches = x->eval.batches;
  ev->first = strcmp(x->eval.source, "synthetic") ? 0 : EVAL_SYNTHETIC_FIRST;
  /* the kind (at most a value long), ':' and the resolved path: nothing is cut */
  char src[TSR_TRAIN_PATH_LEN + TSR_MAX_VALUE], path[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160];
  const char *colon = strchr(x->eval.source, ':');
  if (colon)
    snprintf(src, sizeof src, "%.*s:%s", (int)(colon - x->eval.source), x->eval.source,
             tsr_train_path(c, colon + 1, path, sizeof path));
  else
    snprintf(src, sizeof src, "%s", x->eval.source);
  tsr_status st = tsr_data_open(src, (int)c->model.vocab_size, (int)c->data.batch_size,
                                (int)c->data.seq_len, (uint64_t)c->job.seed, &ev->data);
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s", tsr_config_where(c, "eval", "source", where, sizeof where));
  TSR_CHECK(tsr_train_docs_open_eval(t, ev->data)); /* [data] mask = document */
  st = tsr_tape_new(t->r, &ev->tape);
  if (st != TSR_OK) return st;
  tsr_tape_set_recording(ev->tape, false);
  return TSR_OK;
}

void tsr_train_eval_close(tsr_train_eval *ev) {
  tsr_tape_free(ev->tape);
  tsr_data_close(ev->data);
  memset(ev, 0, sizeof *ev);
}

bool tsr_train_eval_due(const tsr_train_eval *ev, int64_t step, int64_t end) {
  return ev->data && (step == end || (ev->every > 0 && step % ev->every == 0));
}

/* The forward of one batch without a pipeline, in the microbatches of a training step (so it
 * needs no more memory than one): the mean of their losses, as a step's loss. */
static tsr_status forward_batch(tsr_train_rank *t, tsr_tape_t *tape, const int32_t *ids,
                                const int32_t *labels, double *loss) {
  const tsr_config *c = t->job->cfg;
  int64_t accum = c->optimizer.grad_accum_steps;
  int64_t rows = c->data.batch_size / accum, seq = c->data.seq_len;
  tsr_var *x = NULL, *y = NULL, *dseg = NULL, *dpos = NULL; /* dseg, dpos: mask = document */
  tsr_tensor *full = NULL;
  tsr_status st = TSR_OK;
  int counted = 0;
  *loss = 0.0;
  for (int64_t k = 0; k < accum; k++) {
    tsr_var *logits = NULL, *l = NULL;
    TSR_CHECK_GOTO(tsr_llama_batch(t->r, t->job->mesh, rows, seq, ids + k * rows * seq, &x), st);
    TSR_CHECK_GOTO(tsr_llama_batch(t->r, t->job->mesh, rows, seq, labels + k * rows * seq, &y), st);
    TSR_CHECK_GOTO(tsr_train_docs_begin(t, k, &dseg, &dpos), st);
    TSR_CHECK_GOTO(tsr_llama_forward(t->model, tape, x, y, &logits, &l), st);
    TSR_CHECK_GOTO(tsr_dtensor_full_tensor(t->r, l->value, &full), st);
    /* a microbatch whose labels are all ignored has no loss: it weighs nothing */
    if (tsr_train_any_label(labels + k * rows * seq, rows * seq)) {
      *loss += tsr_tensor_get(full, NULL);
      counted++;
    }
    tsr_tensor_free(full);
    full = NULL;
    tsr_tape_reset(tape);
    tsr_var_free(x);
    tsr_var_free(y);
    x = y = NULL;
    tsr_train_docs_end(t, dseg, dpos);
    dseg = dpos = NULL;
  }
  *loss = counted ? *loss / counted : NAN;
cleanup:
  tsr_tensor_free(full);
  tsr_tape_reset(tape);
  tsr_var_free(x);
  tsr_var_free(y);
  tsr_train_docs_end(t, dseg, dpos);
  return st;
}

tsr_status tsr_train_eval_run(tsr_train_rank *t, tsr_train_eval *ev, int64_t step, int32_t *ids,
                              int32_t *labels, tsr_train_eval_result *out) {
  const tsr_config *c = t->job->cfg;
  double t0 = now_s(), sum = 0;
  int64_t counted = 0;
  memset(out, 0, sizeof *out);
  for (int64_t b = 0; b < ev->batches; b++) {
    double loss = NAN;
    /* the same batches every time, so that evaluations compare */
    tsr_data_set_step(ev->data, ev->first + b);
    TSR_CHECK(tsr_data_next(ev->data, ids, labels));
    TSR_CHECK(tsr_train_docs_fetch(t, ev->data));
    if (!tsr_train_any_label(labels, c->data.batch_size * c->data.seq_len)) continue;
    if (t->pipe)
      TSR_CHECK(tsr_train_pipe_forward_backward(t, step, ids, labels, false, NULL, &loss));
    else
      TSR_CHECK(forward_batch(t, ev->tape, ids, labels, &loss));
    sum += loss;
    counted++;
  }
  out->step = step;
  out->batches = ev->batches;
  out->tokens = ev->batches * c->data.batch_size * c->data.seq_len;
  out->loss = counted ? sum / (double)counted : NAN;
  out->ppl = exp(out->loss);
  out->secs = now_s() - t0;
  return TSR_OK;
}
